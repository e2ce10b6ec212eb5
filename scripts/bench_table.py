#!/usr/bin/env python3
"""Turns the Google Benchmark JSON files written by scripts/bench into one table.

Benchmark names follow "<case>/<impl>[/min_time:...][/real_time]": impl "ampgrad" is ours,
any other impl (onednn, omp_loop, ...) is a peer, the ceiling for that case. For each case
the table shows the median time and rate (any counter whose name ends in "/s") of ours and
of its peer, the ratio ours/peer in throughput (= peer time / our time, so higher is better)
and the target from TARGETS below (a ratio, a time, or, for cases without a peer such as
bench_train's training steps, an absolute rate). An errored, crashed or timed-out case keeps
its row, with the reason in the note column. Standard library only (and scripts/benchlib.py).
"""
import argparse
import glob
import json
import os
import re
import sys

from benchlib import OURS, UNIT_NS, cmake_cache, cpu_model, split_name

# (case regex, kind, bound): "ratio" is ours/peer throughput >= bound; "max_ns" is our
# median time per iteration <= bound nanoseconds; "min_rate" is our median rate counter
# (samples/s, ...) >= bound.
TARGETS = [
    (r"^matmul/", "ratio", 0.9),
    (r"^add/", "ratio", 0.8),
    (r"^tiny_add/grad_off", "max_ns", 300),
    (r"^tiny_add/recording", "max_ns", 1000),
    # bench_ops: t * 2.0 no slower than t * t (time ratio scalar/tensor <= 1.0, which is a
    # throughput ratio ours/peer >= 1.0 here): the scalar reaches the kernel by value.
    (r"^tiny_scalar_mul/", "ratio", 1.0),
    # bench_train: absolute fp32 training-step throughput (no peer here; scripts/bench-vs-torch
    # puts PyTorch next to these).
    (r"^train_step/mlp$", "min_rate", 40000),
    (r"^train_step/cnn$", "min_rate", 3500),
    # bench_autocast: autocast at most 10% slower than casting the weights by hand.
    (r"^autocast_overhead/", "ratio", 1 / 1.1),
    # bench_train: the Lite wrappers at most 3% slower than the same loop by hand, and the
    # bf16-mixed step through Lite (ampgrad-train --precision auto's targets: MLP 60,000,
    # CNN 5,000 samples/s end to end; scripts/bench-vs-torch has the peers).
    (r"^lite_overhead/", "ratio", 0.97),
    (r"^amp_train_step/mlp$", "min_rate", 60000),
    (r"^amp_train_step/cnn$", "min_rate", 5000),
    # bench_optim: AdamW on the MLP within 1.25x of one pass over the same bytes (its square
    # root and division per element are the rest), and the fused multi-tensor step no slower
    # than the per-parameter loop.
    (r"^optim_step/mlp_adamw$", "ratio", 0.8),
    (r"^optim_step/", "ratio", 1.0),
    # bench_ops: the fused cross entropy (forward + backward) no slower than the
    # log_softmax + nll_loss composition it replaced.
    (r"^cross_entropy/", "ratio", 1.0),
    # bench_io: loading a safetensors file of many tiny tensors, every check included, within
    # 5x of parsing the header text alone (throughput ratio ours/floor >= 0.2).
    (r"^safetensors_header/", "ratio", 0.2),
    # bench/dist: the process group's all-reduce within 10% of MPI_Iallreduce polled by hand
    # (from 256 KB; a 4 KB one is dominated by the hand-off to the driver thread).
    (r"^allreduce/f32/(256KB|4MB|64MB)$", "ratio", 0.9),
    # bench_cuda (on a GPU): a GEMM within 5% of one bare cuBLASLt call; memory-bound ops
    # at 0.85 (elementwise) and 0.8 (row ops) of cudaMemcpy's bytes per second.
    (r"^gemm/", "ratio", 0.95),
    (r"^memory/(add|cast|gelu)$", "ratio", 0.85),
    (r"^memory/(softmax|layer_norm|cross_entropy)$", "ratio", 0.8),
]
# Counters that must stay at or under a bound in every case that reports them (shown in
# the note column; a case over its bound is a MISS whatever its other target says).
COUNTER_BOUNDS = {"host_syncs/step": 0.0}
NOISY_CV = 0.10  # flag a median whose repetitions vary more than this (coefficient of variation)


class Result:
    def __init__(self, case, impl):
        self.case, self.impl = case, impl
        self.time_ns = None  # median
        self.rate = None  # (value, counter name)
        self.cv = None
        self.error = None
        self.order = None  # (file, registration index): the order rows are printed in
        self.counters = {}  # COUNTER_BOUNDS counters reported by the median


def load(outdir):
    results = {}  # (case, impl) -> Result, in run order
    context = {}
    ids = sorted({os.path.basename(p).split(".")[0] for p in glob.glob(os.path.join(outdir, "*.json"))}
                 | {os.path.basename(p).split(".")[0] for p in glob.glob(os.path.join(outdir, "*.fail"))})
    for id_ in ids:
        jpath, fpath = os.path.join(outdir, id_ + ".json"), os.path.join(outdir, id_ + ".fail")
        data = None
        if os.path.exists(jpath):
            try:
                with open(jpath) as f:
                    data = json.load(f)
            except (OSError, ValueError):
                data = None
        if data:
            context = context or data.get("context", {})
            for b in data.get("benchmarks", []):
                case, impl = split_name(b.get("run_name", b["name"]))
                r = results.setdefault((case, impl), Result(case, impl))
                r.order = r.order or (id_, b.get("family_index", 0), b.get("per_family_instance_index", 0))
                if b.get("error_occurred"):
                    r.error = r.error or b.get("error_message", "error")
                    continue
                agg = b.get("aggregate_name")
                if agg == "cv":
                    r.cv = b.get("real_time")
                    continue
                if agg not in (None, "median"):
                    continue
                if agg is None and r.time_ns is not None:
                    continue  # a single run without aggregates: keep the first
                r.time_ns = b["real_time"] * UNIT_NS.get(b.get("time_unit", "ns"), 1.0)
                for key, value in b.items():
                    if key.endswith("/s") and isinstance(value, (int, float)):
                        r.rate = (value, key)
                    if key in COUNTER_BOUNDS and isinstance(value, (int, float)):
                        r.counters[key] = value
        if os.path.exists(fpath):
            with open(fpath) as f:
                lines = f.read().splitlines()
            name, _, why = (lines[0] if lines else "?\tfailed").partition("\t")
            detail = next((l.strip() for l in reversed(lines[1:]) if l.strip()), "")
            case, impl = split_name(name)
            r = results.setdefault((case, impl), Result(case, impl))
            r.order = r.order or (id_, 0, 0)
            if r.time_ns is None and not r.error:
                r.error = why + (f": {detail}" if detail else "")
    return results, context


def is_skip(r):
    """A deliberate skip (e.g. the oneDNN peer in a build without oneDNN), not a failure."""
    return bool(r.error) and "skipped" in r.error


def fmt_time(ns):
    if ns is None:
        return "-"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def fmt_rate(rate):
    if rate is None:
        return "-"
    value, name = rate
    return f"{value:.1f} {name}"


def target_for(case):
    for pattern, kind, bound in TARGETS:
        if re.search(pattern, case):
            return kind, bound
    return None, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", help="folder of <id>.json / <id>.fail files written by scripts/bench")
    ap.add_argument("--build", default="build/release")
    ap.add_argument("--repetitions", default="5")
    args = ap.parse_args()

    results, ctx = load(args.outdir)
    cache = cmake_cache(args.build)
    model = cpu_model() or ctx.get("cpu_model") or "unknown CPU"
    print(f"ampgrad benchmarks  build: {args.build} ({cache.get('CMAKE_BUILD_TYPE', '?')}, "
          f"oneDNN {ctx.get('onednn', cache.get('AMPGRAD_ONEDNN', '?'))})")
    print(f"CPU: {model}, {os.cpu_count()} hardware threads, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    load_avg = ctx.get("load_avg")
    if load_avg:
        busy = " (busy: other work skews absolute times; ratios compare within this run)" \
            if load_avg[0] > 0.5 * (os.cpu_count() or 1) else ""
        print(f"load average at start: {load_avg[0]:.2f}{busy}")
    print(f"median of {args.repetitions} repetitions, wall-clock time, repetitions interleaved; "
          f"ratio = ours/peer throughput (peer time / our time)")
    print()

    cases = []
    for (case, _impl) in sorted(results, key=lambda k: results[k].order):
        if case not in cases:
            cases.append(case)
    rows = []
    for case in cases:
        ours = results.get((case, OURS))
        peers = [r for (c, i), r in results.items() if c == case and i != OURS] or [None]
        for peer in peers:
            rows.append((case, ours, peer))

    footnotes = {}  # error text -> number; errors repeat across rows, so they go below the table

    def footnote(r):
        text = r.error if r.error.startswith(f"[{r.impl}]") else f"{r.impl}: {r.error}"
        return f"[{footnotes.setdefault(text, len(footnotes) + 1)}]"

    def cell(r, ok, value):
        if ok:
            return value
        if r is None or not r.error:
            return "-"
        return "skipped" if is_skip(r) else "ERROR"

    header = ("case", "ampgrad", "rate", "peer", "peer time", "peer rate", "ours/peer", "target", "verdict", "note")
    table = []
    for case, ours, peer in rows:
        kind, bound = target_for(case)
        notes, ratio, verdict = [], None, "n/a"
        for r in (ours, peer):
            if r is None:
                continue
            if r.error:
                notes.append(footnote(r))
            elif r.cv is not None and r.cv > NOISY_CV:
                notes.append(f"{r.impl}: noisy (cv {r.cv * 100:.0f}%)")
        ok_ours = ours is not None and ours.time_ns is not None and not ours.error
        ok_peer = peer is not None and peer.time_ns is not None and not peer.error
        if ok_ours and ok_peer:
            if ours.rate and peer.rate and ours.rate[1] == peer.rate[1] and peer.rate[0] > 0:
                ratio = ours.rate[0] / peer.rate[0]
            elif ours.time_ns > 0:
                ratio = peer.time_ns / ours.time_ns
        target = "-"
        if kind == "ratio":
            target = f">= {bound:g}"
            if ratio is not None:
                verdict = "ok" if ratio >= bound else "MISS"
        elif kind == "max_ns":
            target = f"<= {bound:g} ns"
            if ok_ours:
                verdict = "ok" if ours.time_ns <= bound else "MISS"
        elif kind == "min_rate":
            target = f">= {bound:,.0f}" + (f" {ours.rate[1]}" if ok_ours and ours.rate else "/s")
            if ok_ours and ours.rate:
                verdict = "ok" if ours.rate[0] >= bound else "MISS"
        for key, value in (ours.counters.items() if ok_ours else []):
            notes.append(f"{key} {value:g} (<= {COUNTER_BOUNDS[key]:g})")
            if value > COUNTER_BOUNDS[key]:
                verdict = "MISS"
        if ours is None:
            notes.append("no ampgrad case")
        table.append((
            case,
            cell(ours, ok_ours, fmt_time(ours.time_ns) if ok_ours else ""),
            fmt_rate(ours.rate) if ok_ours else "-",
            peer.impl if peer else "-",
            cell(peer, ok_peer, fmt_time(peer.time_ns) if ok_peer else ""),
            fmt_rate(peer.rate) if ok_peer else "-",
            f"{ratio:.2f}" if ratio is not None else "-",
            target,
            verdict,
            "; ".join(notes),
        ))

    widths = [max(len(str(row[i])) for row in [header] + table) for i in range(len(header) - 1)]
    for row in [header] + table:
        cells = [str(c).ljust(w) for c, w in zip(row[:-1], widths)]
        print(("  ".join(cells) + "  " + row[-1]).rstrip())
    if footnotes:
        print()
        for text, number in footnotes.items():
            print(f"[{number}] {text}")
    missed = sum(1 for row in table if row[8] == "MISS")
    failed = sum(1 for row in table if "ERROR" in (row[1], row[4]))
    skipped = sum(1 for row in table if "skipped" in (row[1], row[4]))
    print()
    print(f"{len(table)} rows: {missed} below target, {failed} with errors, {skipped} with a side skipped")
    if not table:
        print("no results (did every benchmark program fail to start?)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
