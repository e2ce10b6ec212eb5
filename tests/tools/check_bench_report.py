#!/usr/bin/env python3
"""scripts/bench-report's HTML report as a person sees it: built from synthetic result files
(tests/tools/bench_synthetic.py, no benchmark run), opened in headless Chromium.

Checks: every <img> is a data: URI that decodes as a PNG of some size (the trainer's loss
and accuracy per epoch among them, its table holding each epoch's numbers); the targets
table says met / not met for the figures chosen to meet or miss them, and skipped (with the
reason) for a quick preset's file without peers; beside a target not met, the profile's
entries in a small table, or why there is none; a file with GPU figures (on cuda:0) gets a
GPU section (each GEMM and memory-bound op as a fraction of its own ceiling, against its
target; the GPT-2-small step per precision) and leaves the CPU's sections as they were, a
file without gets none and says why in its Run table; in Chromium, every image decoded (the
page's script records the count on <body>, read back with --dump-dom), no console message
(an error or an uncaught exception), and a screenshot that is not blank.
Exits 77 (ctest's SKIP_RETURN_CODE) with the reason where Chromium or matplotlib is missing
(scripts/install-test-deps installs both), and fails for it under CI=true.
Usage: check_bench_report.py [work dir: emptied first; the pages and screenshot stay there]
"""
import base64
import html.parser
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_synthetic as syn  # noqa: E402
import benchlib as bl  # noqa: E402

SKIP = 77
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}", file=sys.stderr)
    return cond


class Row(list):
    """A table row's cell texts (a nested table's text left out of its cell), and in .tables
    the rows of each table nested in it."""

    def __init__(self):
        super().__init__()
        self.tables = []


class Page(html.parser.HTMLParser):
    """The <img> attributes and every table row (Row, nested tables' rows included) of a page."""

    def __init__(self):
        super().__init__()
        self.imgs, self.rows, self.body = [], [], {}
        self._frames = [{"row": None, "cell": None, "rows": []}]  # one per open table

    def handle_starttag(self, tag, attrs):
        top = self._frames[-1]
        if tag == "img":
            self.imgs.append(dict(attrs))
        elif tag == "body":
            self.body = dict(attrs)
        elif tag == "table":
            self._frames.append({"row": None, "cell": None, "rows": []})
        elif tag == "tr":
            top["row"] = Row()
        elif tag in ("td", "th") and top["row"] is not None:
            top["cell"] = ""

    def handle_endtag(self, tag):
        top = self._frames[-1]
        if tag in ("td", "th") and top["cell"] is not None:
            top["row"].append(top["cell"].strip())
            top["cell"] = None
        elif tag == "tr" and top["row"] is not None:
            self.rows.append(top["row"])
            top["rows"].append(top["row"])
            top["row"] = None
        elif tag == "table" and len(self._frames) > 1:
            done = self._frames.pop()
            parent = self._frames[-1]["row"]
            if parent is not None:
                parent.tables.append(done["rows"])

    def handle_data(self, data):
        top = self._frames[-1]
        if top["cell"] is not None:
            top["cell"] += data


def parse(path):
    p = Page()
    with open(path) as f:
        p.feed(f.read())
    return p


def png_size(data):
    """(width, height) of a complete, intact PNG, or None: the signature, every chunk's CRC,
    an IEND, and IDAT data that inflates to exactly the rows the header announces."""
    if len(data) < 24 or data[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    pos, idat, header, ended = 8, b"", None, False
    while pos + 12 <= len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if len(body) != length or struct.unpack(">I", data[pos + 8 + length:pos + 12 + length] or b"\0" * 4)[0] \
                != zlib.crc32(kind + body):
            return None
        if kind == b"IHDR":
            header = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            ended = True
            break
        pos += 12 + length
    if not header or not ended:
        return None
    width, height, depth, colour = header
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(colour)
    if channels is None or depth != 8:
        return None
    try:
        rows = zlib.decompress(idat)
    except zlib.error:
        return None
    return (width, height) if len(rows) == height * (1 + width * channels) else None


def target(page, start):
    """The targets table's row whose first cell starts with `start`."""
    rows = [r for r in page.rows if r and r[0].startswith(start)]
    return rows[0] if len(rows) == 1 else None


def render(name, figures, preset, work, epochs=None, **kw):
    path = syn.write(os.path.join(work, f"{name}.json"), syn.result(figures, preset=preset, epochs=epochs, **kw))
    out = os.path.join(work, f"{name}.html")
    p = subprocess.run([os.path.join(syn.SCRIPTS, "bench-report"), "html", path, "-o", out],
                       capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, f"bench-report html {name}: status {p.returncode}: {p.stderr[-500:]}")
    return out


def check_images(page, name, expected_alts):
    alts = [i.get("alt") for i in page.imgs]
    check(sorted(alts) == sorted(expected_alts), f"{name}: plots {alts}, expected {expected_alts}")
    for img in page.imgs:
        src = img.get("src", "")
        prefix = "data:image/png;base64,"
        if not check(src.startswith(prefix), f"{name}: <img alt={img.get('alt')!r}> is not an inlined PNG"):
            continue
        try:
            data = base64.b64decode(src[len(prefix):], validate=True)
        except ValueError as e:
            check(False, f"{name}: <img alt={img.get('alt')!r}>: base64 does not decode: {e}")
            continue
        size = png_size(data)
        check(size is not None and size[0] >= 200 and size[1] >= 100,
              f"{name}: <img alt={img.get('alt')!r}> decodes to {size} (not a PNG of a plot)")


def check_curves(page, name, runs, epochs):
    """The per-epoch table holds, per precision and epoch, the median over the runs of
    bench_synthetic's train loss and test accuracy, and every run's value."""
    for precision in ("32-true", "bf16-mixed"):
        curves = syn.curve_runs(precision, runs, epochs)
        got = [r for r in page.rows if len(r) == 9 and r[:3] == ["mlp", precision, bl.OURS]]
        check(len(got) == epochs, f"{name}: {len(got)} epoch rows of {precision}, expected {epochs}")
        for row in got:
            e = int(row[3])
            loss = [run[e - 1]["train_loss"] for run in curves]
            acc = [run[e - 1]["test_accuracy"] for run in curves]
            check(abs(float(row[4]) - statistics.median(loss)) < 1e-4,
                  f"{name}: {precision} epoch {e}: median loss {row[4]}, expected {statistics.median(loss)}")
            check([float(v) for v in row[5].split(", ")] == [round(v, 4) for v in loss],
                  f"{name}: {precision} epoch {e}: each run's loss {row[5]}, expected {loss}")
            check(abs(float(row[6].rstrip("%")) - 100 * statistics.median(acc)) < 1e-2,
                  f"{name}: {precision} epoch {e}: median accuracy {row[6]}, expected {statistics.median(acc)}")
            check(len(row[7].split(", ")) == runs, f"{name}: {precision} epoch {e}: accuracies {row[7]}")


def chromium_checks(chromium, page_path, work, n_images):
    url = "file://" + os.path.abspath(page_path)
    common = [chromium, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
              f"--user-data-dir={os.path.join(work, 'chromium-profile')}", "--enable-logging=stderr", "--v=0"]
    p = subprocess.run(common + ["--virtual-time-budget=5000", "--dump-dom", url], capture_output=True, text=True,
                       timeout=60)
    check(p.returncode == 0, f"chromium --dump-dom: status {p.returncode}: {p.stderr[-500:]}")
    dom = Page()
    dom.feed(p.stdout)
    decoded = dom.body.get("data-images-decoded")
    check(decoded == f"{n_images}/{n_images}",
          f"chromium: images decoded {decoded!r}, expected {n_images}/{n_images} (the page's load script)")
    console = [l for l in p.stderr.splitlines() if ":CONSOLE" in l]
    check(not console, "chromium: console messages: " + " | ".join(console))

    shot = os.path.join(work, "report.png")
    p = subprocess.run(common + ["--window-size=1280,2400", f"--screenshot={shot}", url], capture_output=True,
                       text=True, timeout=60)
    check(p.returncode == 0 and os.path.exists(shot), f"chromium --screenshot: status {p.returncode}: "
                                                      f"{p.stderr[-500:]}")
    console = [l for l in p.stderr.splitlines() if ":CONSOLE" in l]
    check(not console, "chromium (screenshot): console messages: " + " | ".join(console))
    if os.path.exists(shot):
        import matplotlib.image
        img = matplotlib.image.imread(shot)[:, :, :3]
        ink = (img.min(axis=2) < 0.9).mean()  # the share of pixels that are not (near) white
        colours = len({tuple(px) for px in (img[::7, ::7].reshape(-1, 3) * 255).astype(int).tolist()})
        check(ink > 0.02 and colours > 30,
              f"chromium: the screenshot looks blank ({100 * ink:.1f}% non-white pixels, {colours} colours)")


def skip(why):
    """Skips, except under CI=true, where a missed install step fails (as AGT_SKIP_UNLESS_CI)."""
    if os.environ.get("CI") == "true":
        print(f"FAIL (CI=true): {why}", file=sys.stderr)
        return 1
    print(f"skipped: {why}")
    return SKIP


def main():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        return skip("no chromium on PATH (scripts/install-test-deps installs Debian's chromium)")
    if not bl.ensure_system_python("matplotlib"):
        return skip("matplotlib does not import (scripts/install-test-deps installs python3-matplotlib)")
    work = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="bench-report-test.")
    if len(sys.argv) > 1:  # a fresh folder, whose pages stay for a look afterwards
        shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work, exist_ok=True)

    # A full preset's file: every plot, and targets met and missed.
    # ... and a step of ours that failed (its error kept, no values) next to a peer's figures
    failed = syn.step("gpt_w256", "32-true", bl.OURS, 1.0)
    failed.update(values=[], error="synthetic failure: out of memory")
    full = render("full", syn.full_figures() + [failed, syn.step("gpt_w256", "32-true", "torch", 5000)], "full", work,
                  epochs=5)
    if os.path.exists(full):
        page = parse(full)
        alts = ["Training steps", "Ours against each peer", "Against the GEMM ceiling", "Memory", "Thread scaling",
                "Trainer: loss and accuracy per epoch"]
        check_images(page, "full", alts)
        # (first cell, value, verdict), from bench_synthetic.full_figures' numbers
        for start, value, verdict in (("mlp 32-true: step >=", "2.50", "met"),
                                      ("gpt bf16-mixed: step >=", "1.25", "not met"),
                                      ("mlp 32-true: step against its GEMM ceiling", "0.30", "reported"),
                                      ("gpt 32-true: step against its GEMM ceiling", "0.16", "reported"),
                                      ("trainer mlp 32-true: rate", "0.90", "met"),
                                      ("trainer mlp bf16-mixed: rate", "0.60", "not met")):
            row = target(page, start)
            check(row is not None and row[2] == value and row[3] == verdict,
                  f"full: target row {start!r}: {row}, expected value {value} and {verdict!r}")
        row = target(page, "mlp 32-true: step >=")
        check(row is not None and "torch.compile" in row[1], f"full: mlp's faster peer is torch.compile: {row}")
        row = target(page, "gpt_w256 32-true: step >=")
        check(row is not None and row[3] == "skipped" and "synthetic failure: out of memory" in row[4],
              f"full: the failed step's target is skipped with its error: {row}")
        check_curves(page, "full", 4, 5)
        # The missed gpt bf16-mixed step: its profile's entries in a table beside it.
        row = target(page, "gpt bf16-mixed: step >=")
        nested = row.tables[0][1:] if row is not None and len(row.tables) == 1 else None
        want = [[f"{e['percent']:.2f}", e["object"], e["symbol"]] for e in syn.PROFILE["entries"]]
        check(nested == want, f"full: the gpt bf16-mixed step's profile {nested}, expected {want}")
        check(row is not None and syn.PROFILE["samples"] in row[5] and syn.PROFILE["event"] in row[5],
              f"full: the profile's note {row[5] if row else None!r}")
        # The missed trainer target whose profile perf refused says why, with no table.
        row = target(page, "trainer mlp bf16-mixed: rate")
        check(row is not None and not row.tables and syn.PROFILE_DENIED["error"] in row[5],
              f"full: the trainer's missing profile says why: {row}")
        # A target met has no profile.
        row = target(page, "mlp 32-true: step >=")
        check(row is not None and row[5] == "" and not row.tables, f"full: a met target shows a profile: {row}")
        chromium_checks(chromium, full, work, len(alts))

    # A quick preset's file: no peers, so those targets are skipped, saying why; a short trainer
    # run, whose accuracy target is skipped for its epochs; no profiles kept (as --no-profile).
    quick = render("quick", syn.quick_figures(), "quick", work, epochs=syn.QUICK_EPOCHS)
    if os.path.exists(quick):
        page = parse(quick)
        check_images(page, "quick", ["Training steps", "Against the GEMM ceiling", "Memory", "Thread scaling",
                                     "Trainer: loss and accuracy per epoch"])
        row = target(page, "cnn 32-true: step >=")
        check(row is not None and row[3] == "skipped" and "--preset full" in row[4], f"quick: peer target {row}")
        row = target(page, "trainer mlp 32-true: rate")
        check(row is not None and row[2] == "0.90" and row[3] == "met", f"quick: trainer target {row}")
        row = target(page, "trainer mlp 32-true: best test accuracy")
        check(row is not None and row[3] == "skipped" and f"trained {syn.QUICK_EPOCHS} epoch" in row[4],
              f"quick: accuracy target {row}")
        row = target(page, "trainer mlp bf16-mixed: rate")
        check(row is not None and row[3] == "not met" and "no profile in this file" in row[5] and not row.tables,
              f"quick: a missed target without a profile says why: {row}")
        check_curves(page, "quick", 2, syn.QUICK_EPOCHS)

    # A full preset's file with a GPU part: its GPU section (bench_synthetic.gpu_figures' numbers)
    # beside the CPU's, which its cuda:0 figures leave as they were.
    gpu = render("gpu", syn.full_figures() + syn.gpu_figures(), "full", work, epochs=5, gpu=syn.GPU_SETTING,
                 machine={"gpus": [syn.GPU]})
    if os.path.exists(gpu):
        page = parse(gpu)
        alts = ["Training steps", "Ours against each peer", "Against the GEMM ceiling", "Memory", "Thread scaling",
                "Trainer: loss and accuracy per epoch", f"GPU (cuda:0: {syn.GPU['name']})"]
        check_images(page, "gpu", alts)
        check_curves(page, "gpu", 4, 5)  # the CPU trainer's epochs only
        row = target(page, "GPU part")
        check(row is not None and row[1] == f"ran on cuda:0 ({syn.GPU['name']})", f"gpu: the Run table's GPU row {row}")
        # (case, of the ceiling, verdict): each against its own ceiling and target
        for (dtype, n), (_, frac) in syn.GPU_GEMM.items():
            want = "met" if frac >= 0.95 else "not met"
            row = target(page, f"gemm/{dtype}/{n}")
            check(row is not None and row[5] == "cublaslt" and row[6] == f"{frac:.2f}" and row[8] == want,
                  f"gpu: GEMM row gemm/{dtype}/{n}: {row}, expected {frac:.2f} of cublaslt, {want!r}")
        for op, frac in syn.GPU_MEMORY.items():
            bound = 0.8 if op in ("softmax", "layer_norm", "cross_entropy") else 0.85
            want = "met" if frac >= bound else "not met"
            row = target(page, f"bandwidth/{op}")
            check(row is not None and row[5] == "copy" and row[6] == f"{frac:.2f}" and row[7] == f">= {bound}"
                  and row[8] == want, f"gpu: memory row {op}: {row}, expected {frac:.2f} of copy, {want!r}")
        base = syn.GPU_STEP["32-true"]
        for precision, r in syn.GPU_STEP.items():
            rows = [x for x in page.rows if len(x) == 10 and x[0] == precision]
            row = rows[0] if len(rows) == 1 else None
            check(row is not None and row[1] == bl.fmt_num(r) and row[5] == f"{r / base:.2f}" and row[7] == "0",
                  f"gpu: GPT-2 step row {precision}: {rows}, expected {bl.fmt_num(r)} tokens/s, {r / base:.2f}x")
            if row is not None and precision == "bf16-mixed":
                check(row[6] == "3.0x: met", f"gpu: the bf16-mixed step's target {row[6]!r}")
        rows = [x for x in page.rows if len(x) == 6 and x[0].startswith("trainer/mlp/")]  # the CPU's table
        check(len(rows) == 2 and not any("90,000" in x for x in rows), f"gpu: the CPU's trainer rows: {rows}")
        rows = [x for x in page.rows if len(x) == 5 and x[0] == "trainer/mlp/32-true/ampgrad" and x[2] == "90,000"]
        check(len(rows) == 1, "gpu: the trainer on the GPU in the GPU section")
        chromium_checks(chromium, gpu, work, len(alts))
    # without GPU figures there is no GPU section, and the Run table says why
    for name in ("full", "quick"):
        path = os.path.join(work, f"{name}.html")
        if os.path.exists(path):
            with open(path) as f:
                check("<h2>GPU" not in f.read(), f"{name}: a GPU section without GPU figures")
            row = target(parse(path), "GPU part")
            check(row is not None and row[1].startswith("no CUDA device: GPU part not run"),
                  f"{name}: the Run table's GPU row {row}")

    if failures:
        print(f"{len(failures)} check(s) failed; pages kept in {work}", file=sys.stderr)
        return 1
    if len(sys.argv) <= 1:
        shutil.rmtree(work, ignore_errors=True)
    print("ok: the three reports render, every image decodes, targets as chosen, the GPU section where GPU figures are")
    return 0


if __name__ == "__main__":
    sys.exit(main())
