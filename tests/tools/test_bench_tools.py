#!/usr/bin/env python3
"""scripts/bench-compare, scripts/bench-history and the statistics behind them
(scripts/benchlib.py), on synthetic result files (tests/tools/bench_synthetic.py).

The exact U test is checked against a brute-force enumeration of every split of the pooled
repetitions, and against scipy where it imports; the tools through their command lines
(--json -); older result files still read; bench-report's profiles (Linux perf: a real
perf record where perf works here, skipping with the reason elsewhere). The HTML pages need
matplotlib: without it those tests skip, except under
CI=true, where they fail."""
import argparse
import base64
import contextlib
import functools
import importlib.machinery
import importlib.util
import io
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_synthetic as syn  # noqa: E402
import benchlib as bl  # noqa: E402
from check_bench_report import png_size  # noqa: E402


def brute_force_p(a, b):
    """Two-sided p of the U statistic by enumerating every way to split the pooled (distinct)
    values into groups of len(a) and len(b): the share of splits whose U is at least as far
    from its mean as the observed one."""
    pooled = a + b
    n, m = len(a), len(b)

    def u_of(xs, ys):
        return sum(1 for x in xs for y in ys if x > y)

    far = lambda u: abs(u - n * m / 2)  # noqa: E731
    observed = far(u_of(a, b))
    hits = total = 0
    for idx in itertools.combinations(range(n + m), n):
        xs = [pooled[i] for i in idx]
        ys = [pooled[i] for i in range(n + m) if i not in idx]
        total += 1
        hits += far(u_of(xs, ys)) >= observed - 1e-12
    return hits / total


def have_matplotlib():
    p = subprocess.run([bl.SYSTEM_PYTHON if os.path.exists(bl.SYSTEM_PYTHON) else sys.executable, "-c",
                        "import matplotlib"], capture_output=True)
    return p.returncode == 0 or importlib.util.find_spec("matplotlib") is not None


def need_matplotlib(test):
    if have_matplotlib():
        return
    if os.environ.get("CI") == "true":
        test.fail("matplotlib does not import (scripts/install-test-deps installs python3-matplotlib)")
    test.skipTest("matplotlib does not import (scripts/install-test-deps installs python3-matplotlib)")


def run(script, *args, expect=0):
    p = subprocess.run([os.path.join(syn.SCRIPTS, script), *args], capture_output=True, text=True, timeout=120)
    if p.returncode != expect:
        raise AssertionError(f"{script} {' '.join(args)}: status {p.returncode}, expected {expect}\n{p.stderr}")
    return p.stdout


def html_images(path):
    with open(path) as f:
        srcs = re.findall(r'<img alt="[^"]*" src="([^"]+)"', f.read())
    return [png_size(base64.b64decode(s.split(",", 1)[1])) if s.startswith("data:image/png;base64,") else None
            for s in srcs]


class ExactTest(unittest.TestCase):
    def setUp(self):
        self._env = os.environ.get("AMPGRAD_BENCH_NO_SCIPY")
        os.environ["AMPGRAD_BENCH_NO_SCIPY"] = "1"  # benchlib's own exact test

    def tearDown(self):
        if self._env is None:
            os.environ.pop("AMPGRAD_BENCH_NO_SCIPY", None)
        else:
            os.environ["AMPGRAD_BENCH_NO_SCIPY"] = self._env

    def test_exact_p_equals_enumeration(self):
        rng = random.Random(3)
        for n, m in ((2, 3), (3, 3), (4, 4), (3, 5), (5, 4), (1, 6)):
            for _ in range(4):
                vals = rng.sample(range(1000), n + m)
                a, b = vals[:n], vals[n:]
                self.assertAlmostEqual(bl.mann_whitney_p(a, b), brute_force_p(a, b), places=12, msg=(a, b))

    def test_smallest_p_and_minimum_repetitions(self):
        # Every repetition of one side above every one of the other: the most extreme split.
        for n, m in ((3, 3), (4, 4), (3, 4), (3, 5), (2, 8), (2, 7)):
            a, b = list(range(n)), list(range(100, 100 + m))
            self.assertAlmostEqual(bl.min_exact_p(n, m), brute_force_p(a, b), places=12)
        k = next(k for k in range(1, 10) if brute_force_p(list(range(k)), list(range(10, 10 + k))) <= bl.ALPHA)
        self.assertEqual(bl.min_repetitions(), k)

    def test_exact_test_agrees_with_scipy(self):
        os.environ.pop("AMPGRAD_BENCH_NO_SCIPY")
        st = bl._scipy_stats()
        if st is None:
            if os.environ.get("CI") == "true":
                self.fail("scipy does not import (scripts/install-test-deps installs python3-scipy)")
            self.skipTest("scipy does not import here (Debian's python3-scipy)")
        rng = random.Random(5)
        for n, m in ((4, 4), (5, 5), (9, 12), (4, 10)):
            for ties in (False, True):
                a = [rng.randint(0, 8 if ties else 10**6) for _ in range(n)]
                b = [rng.randint(0, 8 if ties else 10**6) for _ in range(m)]
                expected = float(st.mannwhitneyu(a, b, alternative="two-sided").pvalue)
                os.environ["AMPGRAD_BENCH_NO_SCIPY"] = "1"
                self.assertAlmostEqual(bl.mann_whitney_p(a, b), expected, places=9, msg=(a, b))
                os.environ.pop("AMPGRAD_BENCH_NO_SCIPY")


class AmpgradInfoTest(unittest.TestCase):
    """parse_ampgrad_info and precisions_to_run on ampgrad-info's own output, for its fake
    profiles (AMPGRAD_INFO_EXE: set by ctest where the examples are built)."""

    def info(self, *args):
        exe = os.environ.get("AMPGRAD_INFO_EXE")
        if not exe:
            self.skipTest("AMPGRAD_INFO_EXE not set (the build has no examples)")
        p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        return bl.parse_ampgrad_info(p.stdout)

    def test_cpu_profiles(self):
        # without AVX512 bfloat16 is emulated: measured only when asked, and marked so
        info = self.info("--profile", "cpu-without-avx512")
        self.assertEqual(info["verdicts"]["cpu"]["bfloat16"], "emulated")
        self.assertEqual(bl.precisions_to_run(info)["run"], ["32-true"])
        self.assertIn("emulated", bl.precisions_to_run(info)["left_out"][0][1])
        asked = bl.precisions_to_run(info, include_emulated=True)
        self.assertEqual((asked["run"], asked["emulated"]), (["32-true", "bf16-mixed"], ["bf16-mixed"]))
        for profile in ("cpu-avx512-bf16", "cpu-amx"):
            chosen = bl.precisions_to_run(self.info("--profile", profile))
            self.assertEqual((chosen["run"], chosen["emulated"]), (["32-true", "bf16-mixed"], []), profile)
        info = self.info("--profile", "cpu-amx")
        self.assertIn("amx_bf16", info["features"])
        self.assertEqual(info["auto"]["cpu"]["choice"], "bf16-mixed")

    def test_gpu_profiles(self):
        info = self.info("--profile", "t4")
        self.assertEqual(info["gpus"], [{"name": "Tesla T4", "compute_capability": "7.5"}])
        info = self.info("--profile", "h200")
        self.assertEqual(len(info["gpus"]), 8)
        self.assertTrue(all(g == {"name": "NVIDIA H200", "compute_capability": "9.0"} for g in info["gpus"]))

    def test_gpu_part_decision(self):
        """bench-report's gpu_part on ampgrad-info's own reports: a fake GPU with bench_cuda built
        runs the GPU part (the trainer in 32-true and "auto"'s choice there), this machine runs it
        only where it has a device."""
        br = bench_report_module()
        with tempfile.TemporaryDirectory() as build:
            os.makedirs(os.path.join(build, "bench"))
            exe = os.path.join(build, "bench", "bench_cuda")
            with open(exe, "w") as f:
                f.write("#!/bin/sh\n")
            os.chmod(exe, 0o755)
            t4 = br.gpu_part(build, self.info("--profile", "t4"))
            self.assertEqual((t4["run"], t4["name"], t4["trainer_precisions"]), (True, "Tesla T4", ["32-true", "16-mixed"]))
            h200 = br.gpu_part(build, self.info("--profile", "h200"))
            self.assertEqual(h200["trainer_precisions"], ["32-true", "bf16-mixed"])
            here = self.info()
            part = br.gpu_part(build, here)
            self.assertEqual(part["run"], bool(here.get("gpus")), part)
            if not part["run"]:
                self.assertTrue(part["why"].startswith(br.NO_GPU), part)

    def test_this_machine(self):
        info = self.info()
        self.assertEqual(info["logical_cores"], os.cpu_count())
        self.assertTrue(info["model"])
        self.assertIn(info["verdicts"]["cpu"]["float32"], ("native",))


def rate(id_, values, better="higher", unit="samples/s"):
    return bl.figure(id_, group="step", metric="rate", unit=unit, better=better, values=values)


class CompareTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def files(self, figs_a, figs_b, machine_b=None):
        a = syn.write(os.path.join(self.dir.name, "a.json"), syn.result(figs_a))
        b = syn.write(os.path.join(self.dir.name, "b.json"), syn.result(figs_b, machine=machine_b))
        return a, b

    def rows(self, a, b, *extra, expect=0):
        out = json.loads(run("bench-compare", a, b, "--json", "-", *extra, expect=expect))
        return {r["id"]: r for r in out["rows"]}, out

    def test_faster_slower_noise(self):
        noise_a, noise_b = [100, 102, 98, 101, 99], [101, 99, 100, 98, 102]
        a, b = self.files(
            [rate("up", syn.reps(100)), rate("down", syn.reps(100)), rate("same", noise_a),
             rate("time", syn.reps(200), "lower", "ns")],
            [rate("up", syn.reps(130)), rate("down", syn.reps(80)), rate("same", noise_b),
             rate("time", syn.reps(150), "lower", "ns")])
        rows, out = self.rows(a, b)
        self.assertEqual(rows["up"]["verdict"], "faster")
        self.assertAlmostEqual(rows["up"]["ratio"], 1.3, places=12)
        lo, hi = rows["up"]["ci"]
        self.assertTrue(1.0 < lo <= 1.3 <= hi, rows["up"]["ci"])
        self.assertEqual(rows["down"]["verdict"], "slower")
        self.assertAlmostEqual(rows["down"]["ratio"], 0.8, places=12)
        self.assertEqual(rows["same"]["verdict"], "within noise")
        lo, hi = rows["same"]["ci"]
        self.assertTrue(lo <= 1.0 <= hi, rows["same"]["ci"])
        self.assertGreaterEqual(rows["same"]["p"], bl.ALPHA)
        # a time going down is faster
        self.assertEqual(rows["time"]["verdict"], "faster")
        self.assertAlmostEqual(rows["time"]["ratio"], 0.75, places=12)
        self.assertIsNone(out["machines"])
        self.rows(a, b, "--fail-on-slower", expect=1)

    def test_too_few_repetitions(self):
        a, b = self.files([rate("three", syn.reps(100, n=3)), rate("three_five", syn.reps(100, n=3))],
                          [rate("three", syn.reps(200, n=3)), rate("three_five", syn.reps(200, n=5))])
        rows, _ = self.rows(a, b)
        self.assertEqual(rows["three"]["verdict"], "too few repetitions")
        self.assertIn(f"at least {bl.min_repetitions()} on each side", rows["three"]["why"])
        self.assertIsNone(rows["three"]["p"])
        # 3 against 5 can reach alpha (2 / C(8, 3) < 0.05): a doubling is called
        self.assertEqual(rows["three_five"]["verdict"], "faster")

    def test_two_machines(self):
        figs = [rate("up", syn.reps(100))]
        a, b = self.files(figs, figs, machine_b={"cpu_model": "Other CPU 1"})
        _, out = self.rows(a, b)
        self.assertIn("two different machines", out["machines"])
        self.assertIn("Other CPU 1", out["machines"])
        text = run("bench-compare", a, b)
        self.assertIn("two different machines are compared", text)
        self.assertIsNone(out["settings"])
        # the threads used are not the machine, but a setting that differs
        a, b = self.files(figs, figs, machine_b={"threads_used": 1})
        text = run("bench-compare", a, b)
        self.assertNotIn("two different machines", text)
        self.assertIn("the runs' settings differ: threads 2 vs 1", text)

    def test_only_in_one_file_and_html(self):
        a, b = self.files([rate("both", syn.reps(100)), rate("gone", syn.reps(1))],
                          [rate("both", syn.reps(100)), rate("new", syn.reps(1))])
        _, out = self.rows(a, b)
        self.assertEqual((out["only_a"], out["only_b"]), (["gone"], ["new"]))
        need_matplotlib(self)
        page = os.path.join(self.dir.name, "cmp.html")
        run("bench-compare", a, b, "--html", page)
        sizes = html_images(page)
        self.assertEqual(len(sizes), 1)
        self.assertIsNotNone(sizes[0])

    def test_not_a_result_file(self):
        bad = os.path.join(self.dir.name, "bad.json")
        with open(bad, "w") as f:
            f.write("{}")
        a, _ = self.files([], [])
        p = subprocess.run([os.path.join(syn.SCRIPTS, "bench-compare"), a, bad], capture_output=True, text=True)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("not an ampgrad benchmark result file", p.stderr)


class HistoryTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        # file names in the reverse of the commits' order, which is the one the tool must use
        for name, commit, date, med in (("1-c.json", "c" * 40, "2026-03-01T00:00:00+00:00", 99.0),
                                        ("2-b.json", "b" * 40, "2026-02-01T00:00:00+00:00", 110.0),
                                        ("3-a.json", "a" * 40, "2026-01-01T00:00:00+00:00", 100.0)):
            figs = [rate("step/mlp", syn.reps(med)), rate("fixed/add", syn.reps(med / 2), "lower", "ns")]
            syn.write(os.path.join(self.dir.name, name), syn.result(figs, commit=commit, commit_date=date))
        with open(os.path.join(self.dir.name, "notes.json"), "w") as f:
            f.write('{"not": "a result"}')

    def tearDown(self):
        self.dir.cleanup()

    def test_ordered_by_commit_date(self):
        out = json.loads(run("bench-history", self.dir.name, "--json", "-"))
        rows = out["figures"]["step/mlp"]
        self.assertEqual([r["commit"] for r in rows], ["a" * 10, "b" * 10, "c" * 10])
        self.assertEqual([r["median"] for r in rows], [100.0, 110.0, 99.0])
        self.assertIsNone(rows[0]["change"])
        self.assertAlmostEqual(rows[1]["change"], 1.1, places=12)
        self.assertAlmostEqual(rows[2]["change"], 0.9, places=12)
        self.assertEqual([os.path.basename(p) for p, _ in out["skipped"]], ["notes.json"])
        text = run("bench-history", self.dir.name, "--figure", "^step/")
        self.assertIn("step/mlp", text)
        self.assertNotIn("fixed/add", text)
        self.assertLess(text.index("a" * 10), text.index("b" * 10))
        self.assertLess(text.index("b" * 10), text.index("c" * 10))

    def test_html_plot_per_figure(self):
        need_matplotlib(self)
        page = os.path.join(self.dir.name, "history.html")
        run("bench-history", self.dir.name, "--html", page)
        sizes = html_images(page)
        self.assertEqual(len(sizes), 2)
        self.assertTrue(all(s is not None and s[0] > 200 for s in sizes), sizes)


def bench_report_module():
    """scripts/bench-report (a script without .py) as a module."""
    path = os.path.join(syn.SCRIPTS, "bench-report")
    loader = importlib.machinery.SourceFileLoader("bench_report", path)
    spec = importlib.util.spec_from_loader("bench_report", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


class PlotTest(unittest.TestCase):
    def test_one_plot_as_png(self):
        need_matplotlib(self)
        with tempfile.TemporaryDirectory() as tmp:
            quick = syn.write(os.path.join(tmp, "q.json"), syn.result(syn.quick_figures(), epochs=2))
            png = os.path.join(tmp, "curves.png")
            run("bench-report", "plot", quick, "curves", "-o", png)
            with open(png, "rb") as f:
                size = png_size(f.read())
            self.assertTrue(size is not None and size[0] > 300 and size[1] > 200, size)
            # a quick file has no peers: no ratios to plot, said so, nothing written
            p = subprocess.run([os.path.join(syn.SCRIPTS, "bench-report"), "plot", quick, "ratios", "-o",
                                os.path.join(tmp, "r.png")], capture_output=True, text=True, timeout=120)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("no figures for the ratios plot", p.stderr)
            self.assertFalse(os.path.exists(os.path.join(tmp, "r.png")))


@functools.lru_cache(maxsize=None)
def perf_works():
    """None where `perf record` samples a tiny command here, else why not (asked once)."""
    perf = shutil.which("perf")
    if not perf:
        return f"perf not found ({bl.PERF_INSTALL})"
    with tempfile.TemporaryDirectory() as tmp:
        p = subprocess.run([perf, "record", "-q", "-o", os.path.join(tmp, "d"), "--", "true"], capture_output=True,
                           text=True, timeout=30)
        if p.returncode != 0:
            return f"perf record does not work here: {p.stderr.strip()[-300:]}"
    return None


# A shell loop that keeps one core busy for a fraction of a second.
BUSY = "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done"


class ProfileTest(unittest.TestCase):
    """The profiles beside the targets not met: perf's output read, the reasons where there is
    none, and which figures bench-report profiles."""

    def test_schema_1_files_still_read(self):
        with tempfile.TemporaryDirectory() as tmp:
            old = syn.result([rate("step/mlp", syn.reps(100))])
            old["schema_version"] = 1
            for f in old["figures"]:
                del f["epochs"], f["profile"]
            a = syn.write(os.path.join(tmp, "a.json"), old)
            b = syn.write(os.path.join(tmp, "b.json"), syn.result([rate("step/mlp", syn.reps(130))]))
            self.assertEqual(bl.load_result(a)["schema_version"], 1)
            rows = {r["id"]: r for r in json.loads(run("bench-compare", a, b, "--json", "-"))["rows"]}
            self.assertEqual(rows["step/mlp"]["verdict"], "faster")
            newer = dict(old, schema_version=bl.SCHEMA_VERSION + 1)
            c = syn.write(os.path.join(tmp, "c.json"), newer)
            with self.assertRaisesRegex(ValueError, f"schema_version {bl.SCHEMA_VERSION + 1}"):
                bl.load_result(c)
            need_matplotlib(self)
            run("bench-report", "html", a, "-o", os.path.join(tmp, "a.html"))

    def test_perf_missing_says_so(self):
        out = bl.perf_profile(["true"], perf="/nonexistent/perf")
        self.assertIn("perf not found", out["error"])
        self.assertIn("linux-perf", out["error"])
        self.assertNotIn("entries", out)

    def test_perf_not_permitted_says_why(self):
        # A perf that refuses as the kernel does under perf_event_paranoid, without running anything.
        with tempfile.TemporaryDirectory() as tmp:
            fake = os.path.join(tmp, "perf")
            with open(fake, "w") as f:
                f.write("#!/bin/sh\necho 'Error: Access to performance monitoring and observability operations is "
                        "limited.' >&2\necho 'Consider adjusting /proc/sys/kernel/perf_event_paranoid setting' >&2\n"
                        "exit 255\n")
            os.chmod(fake, 0o755)
            out = bl.perf_profile(["true"], perf=fake)
        self.assertTrue(out["error"].startswith("perf is not permitted here: "), out)
        self.assertIn("perf_event_paranoid", out["error"])

    def test_failed_command_says_its_status(self):
        why = perf_works()
        if why:
            self.skipTest(why)
        out = bl.perf_profile(["/bin/sh", "-c", "exit 3"])
        self.assertIn("status 3", out["error"])

    def test_perf_record_smoke(self):
        """perf record on a busy shell loop: entries, largest first, of the shell's process."""
        why = perf_works()
        if why:
            self.skipTest(why)
        shell = os.path.basename(os.path.realpath("/bin/sh"))
        out = bl.perf_profile(["/bin/sh", "-c", BUSY], percent_limit=0.1)
        self.assertNotIn("error", out, out)
        entries = out["entries"]
        self.assertTrue(0 < len(entries) <= bl.PROFILE_TOP, entries)
        pcts = [e["percent"] for e in entries]
        self.assertEqual(pcts, sorted(pcts, reverse=True))
        self.assertTrue(all(0 < p <= 100 for p in pcts) and sum(pcts) <= 100.01, pcts)
        objects = {e["object"] for e in entries}
        # the loop runs in the shell and the C library it calls; nothing else was sampled
        self.assertTrue(objects & {shell, "libc.so.6"}, objects)
        self.assertTrue(out["samples"] and out["event"], out)

    def test_which_figures_are_profiled(self):
        br = bench_report_module()
        result = syn.result(syn.full_figures(), epochs=5)
        for f in result["figures"]:
            f["profile"] = None
        asked = []

        class Runner:
            def profile(self, f):
                asked.append(f["id"])
                return {"error": f"asked for {f['id']}"}

        with contextlib.redirect_stderr(io.StringIO()):  # its progress lines
            br.profile_missed(Runner(), result)
        # full_figures misses the gpt bf16-mixed step's target and the bf16-mixed trainer's
        self.assertEqual(asked, ["step/gpt/bf16-mixed/ampgrad", "trainer/mlp/bf16-mixed/ampgrad"])
        figs = bl.figures_by_id(result)
        self.assertEqual(figs["step/gpt/bf16-mixed/ampgrad"]["profile"]["error"],
                         "asked for step/gpt/bf16-mixed/ampgrad")
        self.assertIsNone(figs["step/mlp/32-true/ampgrad"]["profile"])

    def test_step_profile_runs_just_that_case(self):
        """Runner.profile on a stand-in bench_train that records how it was started."""
        why = perf_works()
        if why:
            self.skipTest(why)
        br = bench_report_module()
        with tempfile.TemporaryDirectory() as build:
            os.makedirs(os.path.join(build, "bench"))
            exe, seen = os.path.join(build, "bench", "bench_train"), os.path.join(build, "seen")
            with open(exe, "w") as f:
                f.write(f'#!/bin/sh\nprintf "%s\\n" "$OMP_NUM_THREADS" "$DNNL_JIT_PROFILE" "$@" > {seen}\n{BUSY}\n')
            os.chmod(exe, 0o755)
            args = argparse.Namespace(build=build, threads=3, timeout=60)
            runner = br.Runner(args, {"figures": [], "errors": []})
            out = runner.profile(syn.step("gpt", "bf16-mixed", bl.OURS, 1.0))
            with open(seen) as f:
                threads, jit, *argv = f.read().splitlines()
        self.assertNotIn("error", out, out)
        self.assertTrue(out["entries"])
        self.assertEqual((threads, jit, out["threads"]), ("3", "2", 3))
        filt = [a.split("=", 1)[1] for a in argv if a.startswith("--benchmark_filter=")]
        self.assertEqual(len(filt), 1, argv)
        # anchored on the case: its own rows, not a longer model's or another precision's
        self.assertTrue(re.search(filt[0], "amp_train_step/gpt/ampgrad/min_time:0.500/real_time"))
        for other in ("amp_train_step/gpt_w256/ampgrad/min_time:0.500/real_time", "train_step/gpt/ampgrad",
                      "amp_train_step/gpt/ampgrad2", "xamp_train_step/gpt/ampgrad"):
            self.assertIsNone(re.search(filt[0], other), other)
        self.assertTrue(any(a.startswith("--benchmark_min_time=") for a in argv), argv)


# ---------------------------------------------------------------- the GPU part of bench-report

# A stand-in for any Google Benchmark program of the build: prints the cases of its table
# (CASES[program]: run name -> {counter: value}; None: the case skips with an error) that match
# --benchmark_filter, --benchmark_repetitions times each plus the aggregates, to --benchmark_out,
# and appends its argv to $BENCH_STANDIN_LOG.
GBENCH_STANDIN = r"""#!/usr/bin/env python3
import json, os, re, sys
CASES = %s
prog = os.path.basename(sys.argv[0])
opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
with open(os.environ["BENCH_STANDIN_LOG"], "a") as f:
    f.write(json.dumps([prog] + sys.argv[1:]) + "\n")
reps = int(opts.get("benchmark_repetitions", "1"))
out = []
for name, counters in CASES.get(prog, {}).items():
    if not re.search(opts.get("benchmark_filter", "."), name):
        continue
    if counters is None:
        out.append({"name": name, "run_name": name, "run_type": "iteration", "error_occurred": True,
                    "error_message": "cuBLASLt has no algorithm for this product"})
        continue
    for k in range(reps):
        out.append(dict({"name": name, "run_name": name, "run_type": "iteration", "repetition_index": k,
                         "real_time": 1.0, "time_unit": "ms"}, **{c: v * (1 + 0.01 * k) for c, v in counters.items()}))
    for agg in ("mean", "median", "stddev"):  # a report keeps only the repetitions
        out.append(dict({"name": name + "_" + agg, "run_name": name, "run_type": "aggregate", "aggregate_name": agg,
                         "real_time": 1.0, "time_unit": "ms"}, **{c: 1e9 for c in counters}))
with open(opts["benchmark_out"], "w") as f:
    json.dump({"context": {}, "benchmarks": out}, f)
"""

# bench_cuda's case names (bench/cuda/bench_cuda.cpp): ampgrad at 0.9 of each GEMM's cuBLASLt
# and at 0.8 of each memory op's copy; the f16 8192 cuBLASLt case skips with its error.
CUDA_CASES = {}
for _dt in ("bf16", "f16"):
    for _n in (4096, 8192):
        CUDA_CASES[f"gemm/{_dt}/{_n}/ampgrad/manual_time"] = {"TFLOP/s": 450.0}
        CUDA_CASES[f"gemm/{_dt}/{_n}/cublaslt/manual_time"] = (None if (_dt, _n) == ("f16", 8192)
                                                               else {"TFLOP/s": 500.0})
for _op in ("add", "cast", "gelu", "softmax", "layer_norm", "cross_entropy"):
    CUDA_CASES[f"memory/{_op}/ampgrad/manual_time"] = {"GB/s": 2000.0}
    CUDA_CASES[f"memory/{_op}/copy/manual_time"] = {"GB/s": 2500.0}
for _p, _r in (("32-true", 40000.0), ("16-mixed", 110000.0), ("bf16-mixed", 120000.0)):
    CUDA_CASES[f"gpt2_step/{_p}/ampgrad/iterations:5/manual_time"] = {"tokens/s": _r, "host_syncs/step": 0.0}
STANDIN_CASES = {
    "bench_cuda": CUDA_CASES,
    "bench_train": {f"{g}/mlp/ampgrad/real_time": {"samples/s": 1000.0, "flops_per_item": 1e6}
                    for g in ("train_step", "amp_train_step")} | {"train_step/gpt/ampgrad/real_time": {"tokens/s": 9e3}},
    "bench_matmul": {f"matmul/{d}/1024/{i}/real_time": {"GFLOP/s": 100.0} for d in ("float32", "bfloat16")
                     for i in ("ampgrad", "onednn")},
    "bench_ops": {"tiny_add/grad_off/ampgrad": {}},
}

# ampgrad-train: writes its --json and logs its argv.
TRAIN_STANDIN = r"""#!/usr/bin/env python3
import json, os, sys
with open(os.environ["BENCH_STANDIN_LOG"], "a") as f:
    f.write(json.dumps(["ampgrad-train"] + sys.argv[1:]) + "\n")
cuda = "--accelerator" in sys.argv and sys.argv[sys.argv.index("--accelerator") + 1] == "cuda"
rate = 90000.0 if cuda else 30000.0
with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
    json.dump({"mean_rate": rate, "best_test_accuracy": 0.88,
               "epochs": [{"epoch": 1, "train_loss": 0.5, "test_accuracy": 0.88, "samples_per_s": rate}]}, f)
"""

# ampgrad-info's report, in its format (AmpgradInfoTest reads the real one), with and without a GPU.
INFO_HEAD = """ampgrad 0.1.0 hardware report: this machine

build   oneDNN on, CUDA built

cpu     Test CPU
        vendor GenuineIntel, 2 logical cores
        flags  sse4.2 avx avx2 fma avx512f avx512_bf16
        oneDNN ISA avx512_core_bf16

"""
INFO_GPU = """cuda:0  NVIDIA H100 80GB HBM3
        compute capability 9.0, 79.1 GiB, 132 SMs

verdict  float32      float16      bfloat16     float64
cpu      native       emulated     native       native
cuda:0   native       native       native       native

precision "auto"
  cpu     bf16-mixed  auto: the CPU has AVX512-BF16
  cuda    bf16-mixed  auto: cuda:0 has native bfloat16
"""
INFO_NO_GPU = """cuda    no CUDA device (the CUDA runtime found no GPU or no driver)

verdict  float32      float16      bfloat16     float64
cpu      native       emulated     native       native
cuda:0   unsupported  unsupported  unsupported  unsupported

precision "auto"
  cpu     bf16-mixed  auto: the CPU has AVX512-BF16
  cuda    -           no CUDA device was found
"""


class GpuPartTest(unittest.TestCase):
    """bench-report's suite on a stand-in build (every program a small script) with and without a
    (fake) GPU: ampgrad-info's report decides, bench_cuda's rows become figures on cuda:0."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.build = os.path.join(self.dir.name, "build")
        self.log = os.path.join(self.dir.name, "argv.log")
        os.makedirs(os.path.join(self.build, "bench"))
        os.makedirs(os.path.join(self.build, "examples"))
        for prog in STANDIN_CASES:
            self.script(f"bench/{prog}", GBENCH_STANDIN % repr(STANDIN_CASES))
        self.script("examples/ampgrad-train", TRAIN_STANDIN)

    def tearDown(self):
        self.dir.cleanup()

    def script(self, rel, text):
        path = os.path.join(self.build, rel)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)

    def suite(self, info, preset="full"):
        """Runs the suite (models mlp, one 1-epoch trainer run, no peers, no profiles) with the
        given ampgrad-info report; returns the result and the programs' argv in order."""
        self.script("examples/ampgrad-info", "#!/bin/sh\ncat <<'EOF'\n" + info + "EOF\n")
        out = os.path.join(self.dir.name, "result.json")
        env = dict(os.environ, BENCH_STANDIN_LOG=self.log)
        p = subprocess.run([os.path.join(syn.SCRIPTS, "bench-report"), "--preset", preset, "--build", self.build,
                            "--out", out, "--models", "mlp", "--repetitions", "3", "--epochs", "1",
                            "--e2e-repetitions", "1", "--no-profile", "--torch-python", "/bin/false", "--threads", "1"],
                           capture_output=True, text=True, timeout=120, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(self.log) as f:
            argvs = [json.loads(l) for l in f]
        return bl.load_result(out), argvs, p.stderr

    def test_gpu_figures_recorded_with_device_and_roles(self):
        result, argvs, _ = self.suite(INFO_HEAD + INFO_GPU)
        self.assertEqual(result["settings"]["gpu"]["run"], True)
        self.assertEqual(result["settings"]["gpu"]["device"], "cuda:0")
        cuda_runs = [a for a in argvs if a[0] == "bench_cuda"]
        self.assertEqual(len(cuda_runs), 1)
        self.assertIn("--benchmark_repetitions=3", cuda_runs[0])
        self.assertFalse(any("aggregates_only" in a for a in cuda_runs[0]), cuda_runs[0])
        figs = bl.figures_by_id(result)
        gpu = {k: f for k, f in figs.items() if bl.device_of(f) == "cuda:0"}
        # every bench_cuda row a figure: 8 GEMMs, 12 memory rows, 3 steps and their 3 sync counts; the trainer
        self.assertEqual(len([f for f in gpu.values() if f["group"] == "gpu_gemm"]), 8)
        self.assertEqual(len([f for f in gpu.values() if f["group"] == "gpu_memory"]), 12)
        for key, f in gpu.items():
            self.assertTrue(key.endswith("@cuda:0"), key)
        ceil = figs["gemm/bfloat16/4096/cublaslt@cuda:0"]
        ours = figs["gemm/bfloat16/4096/ampgrad@cuda:0"]
        self.assertEqual((ceil["role"], ceil["impl"], ceil["unit"]), ("ceiling", "cublaslt", "TFLOP/s"))
        self.assertEqual((ours["role"], ours["impl"]), ("ours", bl.OURS))
        # each repetition kept, the aggregates left out
        self.assertEqual(ours["values"], [450.0, 454.5, 459.0])
        self.assertEqual(ceil["values"], [500.0, 505.0, 510.0])
        copy = figs["bandwidth/softmax/copy@cuda:0"]
        self.assertEqual((copy["role"], copy["impl"], copy["unit"]), ("ceiling", "copy", "GB/s"))
        self.assertEqual(figs["bandwidth/softmax/ampgrad@cuda:0"]["role"], "ours")
        # the skipped cuBLASLt case: its error kept, no values
        failed = figs["gemm/float16/8192/cublaslt@cuda:0"]
        self.assertEqual(failed["values"], [])
        self.assertIn("no algorithm", failed["error"])
        # the report's fractions: ours over the ceiling, never 1.0 for a ceiling read as ours
        br = bench_report_module()
        pairs = {p["case"]: p for p in br.gpu_pairs(result)}
        self.assertAlmostEqual(pairs["gemm/bfloat16/4096"]["fraction"], 0.9, places=12)
        self.assertEqual(pairs["gemm/bfloat16/4096"]["verdict"], "not met")
        self.assertAlmostEqual(pairs["bandwidth/layer_norm"]["fraction"], 0.8, places=12)
        self.assertEqual(pairs["bandwidth/layer_norm"]["verdict"], "met")  # row ops: >= 0.8
        self.assertEqual(pairs["bandwidth/add"]["verdict"], "not met")  # elementwise: >= 0.85
        self.assertEqual(pairs["gemm/float16/8192"]["verdict"], "skipped")
        self.assertIn("no algorithm", pairs["gemm/float16/8192"]["why"])
        steps = {f["precision"]: f for f in br.gpu_steps(result)}
        self.assertEqual(list(steps), ["32-true", "16-mixed", "bf16-mixed"])
        self.assertEqual(steps["bf16-mixed"]["values"], [120000.0, 121200.0, 122400.0])
        self.assertEqual(figs["host_syncs/gpt2/bf16-mixed/ampgrad@cuda:0"]["values"], [0.0, 0.0, 0.0])
        # the trainer on the GPU beside the CPU's: two figures of one id
        cpu_t, gpu_t = figs["trainer/mlp/32-true/ampgrad"], figs["trainer/mlp/32-true/ampgrad@cuda:0"]
        self.assertEqual((bl.device_of(cpu_t), cpu_t["values"]), ("cpu", [30000.0]))
        self.assertEqual(gpu_t["values"], [90000.0])
        self.assertIn("trainer/mlp/bf16-mixed/ampgrad@cuda:0", figs)  # "auto"'s choice on the GPU
        trains = [a for a in argvs if a[0] == "ampgrad-train"]
        on_gpu = [a for a in trains if "--accelerator" in a]
        self.assertEqual([a[a.index("--accelerator") + 1] for a in on_gpu], ["cuda", "cuda"])
        self.assertEqual(len(trains) - len(on_gpu), 2)  # the CPU's 32-true and bf16-mixed
        # every CPU figure says so
        self.assertTrue(all(bl.device_of(f) == "cpu" for k, f in figs.items() if "@" not in k))
        self.assertTrue(all(f["device"] == "cpu" for f in result["figures"] if f["group"] in ("step", "gemm")))

    def test_quick_preset_runs_bench_cuda_but_no_gpu_trainer(self):
        result, argvs, _ = self.suite(INFO_HEAD + INFO_GPU, preset="quick")
        self.assertEqual([a[0] for a in argvs].count("bench_cuda"), 1)
        self.assertFalse(any("--accelerator" in a for a in argvs if a[0] == "ampgrad-train"))

    def test_cpu_only_records_none_and_says_why(self):
        result, argvs, stderr = self.suite(INFO_HEAD + INFO_NO_GPU)
        self.assertNotIn("bench_cuda", [a[0] for a in argvs])
        self.assertFalse([f["id"] for f in result["figures"] if bl.device_of(f) != "cpu"])
        gpu = result["settings"]["gpu"]
        self.assertFalse(gpu["run"])
        self.assertTrue(gpu["why"].startswith("no CUDA device: GPU part not run"), gpu)
        self.assertIn("the CUDA runtime found no GPU", gpu["why"])
        self.assertIn("no CUDA device: GPU part not run", stderr)
        self.assertFalse(any("--accelerator" in a for a in argvs if a[0] == "ampgrad-train"))
        self.assertTrue(result["figures"])  # the CPU part ran as before

    def test_gpu_without_bench_cuda_says_why(self):
        os.remove(os.path.join(self.build, "bench", "bench_cuda"))
        result, argvs, _ = self.suite(INFO_HEAD + INFO_GPU, preset="quick")
        self.assertFalse(result["settings"]["gpu"]["run"])
        self.assertIn("bench/bench_cuda", result["settings"]["gpu"]["why"])
        self.assertFalse([f for f in result["figures"] if bl.device_of(f) != "cpu"])


class DeviceIdentityTest(unittest.TestCase):
    """The device is part of a figure's identity in bench-compare and bench-history; a file
    without the field reads as the CPU's."""

    def test_compare_and_history(self):
        with tempfile.TemporaryDirectory() as tmp:
            def files(cpu_b, gpu_b):
                return [rate("trainer/mlp", syn.reps(100)), dict(rate("trainer/mlp", syn.reps(1000)), device="cuda:0")], \
                       [rate("trainer/mlp", syn.reps(cpu_b)), dict(rate("trainer/mlp", syn.reps(gpu_b)), device="cuda:0")]
            fa, fb = files(130, 800)
            del fa[0]["device"]  # a CPU figure from before the field
            a = syn.write(os.path.join(tmp, "a.json"), syn.result(fa, commit="a" * 40))
            b = syn.write(os.path.join(tmp, "b.json"), syn.result(fb, commit="b" * 40,
                                                                  commit_date="2026-02-01T00:00:00+00:00"))
            rows = {r["id"]: r for r in json.loads(run("bench-compare", a, b, "--json", "-"))["rows"]}
            self.assertEqual(set(rows), {"trainer/mlp", "trainer/mlp@cuda:0"})
            self.assertAlmostEqual(rows["trainer/mlp"]["ratio"], 1.3, places=12)
            self.assertEqual(rows["trainer/mlp"]["verdict"], "faster")
            self.assertAlmostEqual(rows["trainer/mlp@cuda:0"]["ratio"], 0.8, places=12)
            self.assertEqual(rows["trainer/mlp@cuda:0"]["verdict"], "slower")
            hist = json.loads(run("bench-history", tmp, "--json", "-"))["figures"]
            self.assertEqual([r["median"] for r in hist["trainer/mlp"]], [100.0, 130.0])
            self.assertEqual([r["median"] for r in hist["trainer/mlp@cuda:0"]], [1000.0, 800.0])


if __name__ == "__main__":
    bl.ensure_system_python("scipy")  # Debian's python, where scipy and matplotlib are
    unittest.main()
