#!/usr/bin/env python3
"""The table of scripts/bench-vs-torch: ampgrad, PyTorch and Fabric from the files of one run.

Reads the folder that bench-vs-torch filled, round by round (R = 1..rounds, P = a precision):
  ours.steps.R.json      bench_train (Google Benchmark JSON): train_step/<model>/ampgrad
                         (32-true), amp_train_step/<model>/ampgrad (bf16-mixed) and, with
                         bf16 hardware, train_step_medium/<model>/ampgrad (32-true with
                         "medium" float32 products), each with its rate counter (samples/s
                         or tokens/s) and flops_per_item
  ours.matmul.R.json     bench_matmul: matmul/<dtype>/1024/{ampgrad,onednn}, counter GFLOP/s
  ours.tiny.R.json       bench_ops: tiny_add/grad_off/ampgrad
  {torch,fabric}.steps.P.R.out   bench/torch_train.py's JSON {model: rate}; .err names torch
                         (P = medium: torch's 32-true under --matmul-precision medium)
  {ours,torch,fabric}.e2e.P.R.json   ampgrad-train's / bench/torch_trainer.py's --json
  ours.e2e-step-{before,after}.P.R.json   bench_train's MLP row of precision P, run right
                         before and right after ours.e2e.P.R
Every figure is the median over the rounds that produced it, except the trainer's rate as a
fraction of the bench step's: the median over the rounds of the trainer's rate over the
geometric mean of the two step runs around it (seconds apart; without them, over the round's
ours.steps rate, a minute or two away). On a machine whose speed drifts, rates minutes apart,
let alone medians from different rounds, differed by more than the 10% the target allows.
Standard library only (and scripts/benchlib.py); exits 1 when no ampgrad step row came back.
"""
import argparse
import glob
import os
import statistics
import sys

from benchlib import load_json, rate_counter, step_row

# (model, rate unit, target ours/PyTorch, what one step takes: bench_train's and torch_train.py's shapes)
MODELS = [("mlp", "samples/s", 2.5, "batch 128"), ("cnn", "samples/s", 2.0, "batch 128"),
          ("gpt", "tokens/s", 1.4, "32 x 64 tokens"), ("gpt_w256", "tokens/s", 1.4, "16 x 128 tokens"),
          ("gpt_nanogpt", "tokens/s", 1.4, "8 x 256 tokens")]
E2E_ACCURACY = 0.875      # ampgrad-train's MLP after 5 epochs
E2E_OF_STEP = 0.9         # the trainer's rate at least 90% of the bench step's
TINY_ADD_NS = 300
MATMUL_OF_ONEDNN = 0.95
MEDIUM = "medium"         # the step table of float32 models with "medium" float32 products
STEP_TITLES = {
    "32-true": "training step, 32-true",
    "bf16-mixed": "training step, bf16-mixed (PyTorch: torch.autocast cpu bfloat16)",
    MEDIUM: "training step, 32-true with float32 products in bfloat16 (set_float32_matmul_precision(\"medium\")"
            " on both sides; no target)",
}


def round_of(path):  # R of a file name <...>.R.json / .R.out
    return os.path.basename(path).rsplit(".", 2)[-2]


def med(vs):
    return statistics.median(vs) if vs else None


def spread(vs):  # max/min - 1 over rounds, as a percentage
    return (max(vs) / min(vs) - 1) * 100 if len(vs) > 1 and min(vs) > 0 else 0.0


def fmt(v, digits=0):
    return "-" if v is None else f"{v:,.{digits}f}"


def ratio(a, b):
    return a / b if a and b else None


def print_table(header, rows):
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header) - 1)]
    for r in [header] + rows:
        print(("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1]).rstrip())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--build", default="build/release")
    ap.add_argument("--threads", default="?")
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=0)
    ap.add_argument("--bf16", type=int, default=0)
    ap.add_argument("--torch", type=int, default=0)
    ap.add_argument("--fabric", type=int, default=0)
    ap.add_argument("--torch-python", default="")
    a = ap.parse_args()
    d = a.dir
    precisions = ["32-true"] + (["bf16-mixed"] if a.bf16 else [])

    # ---- ampgrad's Google Benchmark rows ----
    ours, flops, errors, ctx = {}, {}, {}, {}
    ours_by_round = {}  # (precision, model, round) -> rate
    around_e2e = {}     # (precision, round) -> [the MLP step's rate before and after the trainer]
    gemm = {}        # (dtype, impl) -> [GFLOP/s]
    tiny = []        # ns
    for path in sorted(glob.glob(os.path.join(d, "ours.*.json"))):
        if ".e2e." in path:
            continue
        data = load_json(path) or {}
        rnd = round_of(path)
        if ".e2e-step-" in path:
            p = os.path.basename(path).split(".")[2]
            around_e2e.setdefault((p, rnd), []).extend(
                rate_counter(b)[1] for b in data.get("benchmarks", [])
                if not b.get("error_occurred") and rate_counter(b))
            continue
        ctx = ctx or data.get("context", {})
        for b in data.get("benchmarks", []):
            if b.get("run_type") == "aggregate":
                continue
            parts = b["name"].split("/")
            row = step_row(b["name"])
            if row:
                key = (MEDIUM if row[0] == "32-true-medium" else row[0], row[1])
                if b.get("error_occurred"):
                    errors[key] = b.get("error_message", "error")
                    continue
                rate = rate_counter(b)
                if rate:
                    ours.setdefault(key, []).append(rate[1])
                    ours_by_round[key + (rnd,)] = rate[1]
                if "flops_per_item" in b:
                    flops[parts[1]] = b["flops_per_item"]
            elif parts[0] == "matmul" and not b.get("error_occurred") and "GFLOP/s" in b:
                gemm.setdefault((parts[1], parts[3]), []).append(b["GFLOP/s"])
            elif parts[0] == "tiny_add" and not b.get("error_occurred"):
                scale = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[b.get("time_unit", "ns")]
                tiny.append(b["real_time"] * scale)

    # ---- the peers' step rates ----
    peer, torch_info = {}, ""
    for side in ("torch", "fabric"):
        for p in precisions + [MEDIUM]:
            for path in sorted(glob.glob(os.path.join(d, f"{side}.steps.{p}.*.out"))):
                for model, v in (load_json(path) or {}).items():
                    peer.setdefault((side, p, model), []).append(v)
                err = path[:-4] + ".err"
                if not torch_info and os.path.exists(err):
                    lines = [l for l in open(err).read().splitlines() if l.startswith("torch ")]
                    torch_info = lines[0] if lines else ""

    # ---- end to end ----
    e2e = {}  # (side, p) -> {"rate": [...], "acc": [...]}
    for side in ("ours", "torch", "fabric"):
        for p in precisions:
            for path in sorted(glob.glob(os.path.join(d, f"{side}.e2e.{p}.*.json"))):
                j = load_json(path)
                if not j:
                    continue
                e = e2e.setdefault((side, p), {"rate": [], "acc": [], "by_round": {}})
                e["rate"].append(j.get("mean_rate", 0))
                e["acc"].append(j.get("best_test_accuracy", 0))
                e["by_round"][round_of(path)] = j.get("mean_rate", 0)

    def step_around(p, r):  # the bench step's rate to set the trainer's of round r against
        vs = [v for v in around_e2e.get((p, r), []) if v > 0]
        return statistics.geometric_mean(vs) if vs else ours_by_round.get((p, "mlp", r))

    gemm32 = med(gemm.get(("float32", "onednn"), []))
    gemm16 = med(gemm.get(("bfloat16", "onednn"), []))

    def load(name):
        try:
            return open(os.path.join(d, name)).read().split()
        except OSError:
            return ["?"]
    ls, le = load("load.start"), load("load.end")
    ncpu = os.cpu_count() or 1
    print("ampgrad vs PyTorch and Fabric: training steps, the trainer end to end, fixed costs")
    print(f"build: {a.build}; CPU: {ctx.get('cpu_model', '?')}, {ncpu} hardware threads; threads: {a.threads} "
          f"(every side); bf16 hardware: {'yes' if a.bf16 else 'no (bf16-mixed rows left out)'}")
    busy = ls[0] != "?" and float(ls[0]) > 0.5 * ncpu
    print(f"load average: {' '.join(ls)} at start, {' '.join(le)} at end"
          + ("  (busy: absolute rates are skewed; compare the ratios)" if busy else ""))
    print(f"median of {a.rounds} rounds, the sides in reversed order every other round")
    if a.torch:
        fallback = "" if "peers-venv" in a.torch_python else \
            "  [fallback: not build/peers-venv; run scripts/install-bench-peers for a current torch]"
        print(f"PyTorch: {torch_info or 'torch (version unknown)'}{fallback}")
        print(f"Fabric: {'yes' if a.fabric else 'not available (scripts/install-bench-peers installs Lightning)'}")
    else:
        print("PyTorch: not available (no python that imports torch); ampgrad's numbers only")
    print(f"raw oneDNN GEMM, 1024 x 1024 x 1024, this run: float32 {fmt(gemm32, 1)} GFLOP/s"
          + (f", bfloat16 {fmt(gemm16, 1)} GFLOP/s" if gemm16 else ""))
    print("model FLOPs per sample/token: bench_train's flops_per_item (3x the forward's matmul and conv FLOPs;"
          " GPT: nanoGPT's 6N + 12*L*width*T)")
    print("at 1.0 (32-true): the ratio ours/PyTorch would read with our whole step at raw oneDNN's float32 GEMM"
          " rate (1 / PyTorch's share); a target above it asks for more than oneDNN's products give")

    # ---- the step tables ----
    ok_all = True
    medium_rows = any(k[0] == MEDIUM for k in ours)
    for p in precisions + ([MEDIUM] if medium_rows else []):
        print()
        print(STEP_TITLES[p] + ": " + ", ".join(f"{shape} ({model})" for model, _, _, shape in MODELS))
        header = ("model", "unit", "ampgrad", "PyTorch", "Fabric", "ours/PyTorch", "target", "",
                  "GFLOP/s", "of fp32 GEMM", "PyTorch's", "at 1.0", "note")
        rows = []
        for model, unit, target, _ in MODELS:
            if p == MEDIUM:
                if (p, model) not in ours and (p, model) not in errors:
                    continue
                target = None
            o = med(ours.get((p, model), []))
            t = med(peer.get(("torch", p, model), []))
            f = med(peer.get(("fabric", p, model), []))
            r = ratio(o, t)
            notes = []
            if (p, model) in errors:
                notes.append(f"ampgrad: {errors[(p, model)]}")
            for side, vs in (("ampgrad", ours.get((p, model), [])), ("PyTorch", peer.get(("torch", p, model), []))):
                if spread(vs) > 20:
                    notes.append(f"{side} noisy (rounds differ by {spread(vs):.0f}%)")
            verdict = "-" if r is None or target is None else ("ok" if r >= target else "MISS")
            ok_all &= verdict != "MISS"
            fl = flops.get(model)
            gf = o * fl / 1e9 if o and fl else None
            tgf = t * fl / 1e9 if t and fl else None
            rows.append((model, unit, fmt(o) if o else ("ERROR" if (p, model) in errors else "-"),
                         fmt(t) if a.torch else "n/a", fmt(f) if a.fabric else "n/a",
                         fmt(r, 2), f">= {target}" if target else "(none)", verdict, fmt(gf, 1),
                         fmt(ratio(gf, gemm32), 2), fmt(ratio(tgf, gemm32), 2),
                         fmt(ratio(gemm32, tgf), 2) if p == "32-true" else "-", "; ".join(notes)))
        print_table(header, rows)

    # ---- end to end ----
    if a.epochs > 0:
        print()
        print(f"ampgrad-train --model mlp end to end, Fashion-MNIST, {a.epochs} epochs, batch 128, AdamW, cosine "
              "(PyTorch and Fabric: bench/torch_trainer.py, the same loop); rate = samples / training time; "
              "of bench step: the median over the rounds of ours / the bench step's run right before and after it")
        header = ("precision", "ampgrad", "accuracy", "PyTorch", "accuracy", "Fabric", "accuracy",
                  "ours/PyTorch", "ours/Fabric", "of bench step", "targets", "note")
        rows = []
        for p in precisions:
            o, t, f = (e2e.get((s, p), {"rate": [], "acc": []}) for s in ("ours", "torch", "fabric"))
            orate, trate, frate = med(o["rate"]), med(t["rate"]), med(f["rate"])
            oacc = med(o["acc"])
            per_round = [ratio(rate, step_around(p, r)) for r, rate in o.get("by_round", {}).items()]
            of_step = med([x for x in per_round if x is not None])
            checks = []
            if a.epochs >= 5 and oacc is not None:
                checks.append("ok" if oacc >= E2E_ACCURACY else "MISS")
            if of_step is not None:
                checks.append("ok" if of_step >= E2E_OF_STEP else "MISS")
            ok_all &= "MISS" not in checks
            acc = lambda v: "-" if v is None else f"{100 * v:.2f}%"
            notes = [f"{s} noisy (rounds differ by {spread(vs):.0f}%)"
                     for s, vs in (("ampgrad", o["rate"]), ("PyTorch", t["rate"])) if spread(vs) > 20]
            rows.append((p, fmt(orate), acc(oacc), fmt(trate), acc(med(t["acc"])), fmt(frate), acc(med(f["acc"])),
                         fmt(ratio(orate, trate), 2), fmt(ratio(orate, frate), 2), fmt(of_step, 2),
                         f">= {100 * E2E_ACCURACY:.1f}%, >= {E2E_OF_STEP}: {' '.join(checks) or '-'}",
                         "; ".join(notes)))
        print_table(header, rows)

    # ---- fixed costs ----
    print()
    print("fixed costs")
    header = ("case", "ampgrad", "ceiling", "ratio", "target", "", "note")
    rows = []
    t_ns = med(tiny)
    rows.append(("1-element add, no grad", f"{fmt(t_ns)} ns" if t_ns else "-", "-", "-", f"<= {TINY_ADD_NS} ns",
                 "-" if t_ns is None else ("ok" if t_ns <= TINY_ADD_NS else "MISS"), ""))
    for dt, target in (("float32", MATMUL_OF_ONEDNN), ("bfloat16", None)):
        og, rg = med(gemm.get((dt, "ampgrad"), [])), med(gemm.get((dt, "onednn"), []))
        if og is None and rg is None:
            continue
        r = ratio(og, rg)
        verdict = "-" if target is None or r is None else ("ok" if r >= target else "MISS")
        rows.append((f"{dt} matmul 1024^3 (GFLOP/s)", fmt(og, 1), f"{fmt(rg, 1)} (raw oneDNN)", fmt(r, 3),
                     f">= {target}" if target else "(none)", verdict, ""))
    for r in rows:
        ok_all &= r[5] != "MISS"
    print_table(header, rows)
    if a.torch and "reference BLAS" in torch_info:
        print()
        print("note: this torch calls the reference (netlib) BLAS for its Linear layers, far slower than a")
        print("      pip wheel with MKL or a Debian install with OpenBLAS; ratios against it overstate ampgrad.")
    print()
    print("all targets met" if ok_all else "some targets missed (MISS above)")
    return 0 if ours else 1


if __name__ == "__main__":
    sys.exit(main())
