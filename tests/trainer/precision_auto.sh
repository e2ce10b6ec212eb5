#!/usr/bin/env bash
# ampgrad-train with --precision auto against 32-true on the MLP: auto must pick what
# this CPU supports natively (bf16-mixed with AVX512-BF16 or AMX-BF16, else 32-true, with
# the reason printed at start), every run must reach an absolute accuracy floor, and the
# mixed run must end within 0.5 points of 32-true. Where auto picks 32-true, an explicit
# bf16-mixed run (emulated) stands in for it, so mixed precision is always compared. A
# 32-true run with --float32-matmul-precision medium (bfloat16 products where the CPU has
# them) must reach the floor and end within 0.5 points of 32-true as well.
# Usage: precision_auto.sh <ampgrad-train> <work dir> [epochs]
set -euo pipefail
exe=$1
dir=$2
epochs=${3:-5}
mkdir -p "$dir"
run() {  # run <precision> [<name> <more options>...]
  local p=$1 name=${2:-$1}
  shift $(( $# > 1 ? 2 : 1 ))
  "$exe" --model mlp --epochs "$epochs" --precision "$p" --json "$dir/$name.json" "$@" >"$dir/$name.log" 2>&1 || {
    echo "ampgrad-train --precision $p $* failed:"; tail -n 20 "$dir/$name.log"; exit 1; }
}
run auto
run 32-true
run 32-true medium --float32-matmul-precision medium
grep -q '^precision: ' "$dir/auto.log" || { echo "no precision line in the auto run's output"; exit 1; }
if grep -q '"precision": *"32-true"' "$dir/auto.json"; then run bf16-mixed; fi
python3 - "$dir" "$epochs" <<'PY'
import json, os, sys
d, epochs = sys.argv[1], int(sys.argv[2])
load = lambda n: json.load(open(f"{d}/{n}.json"))
auto, ref, medium = load("auto"), load("32-true"), load("medium")
flags = open("/proc/cpuinfo").read()
expect = "bf16-mixed" if (" avx512_bf16" in flags or " amx_bf16" in flags) else "32-true"
mixed = auto if auto["precision"] != "32-true" else load("bf16-mixed")
last = lambda r: r["epochs"][-1]["test_accuracy"]
# 5 epochs of the MLP reach 88.9-89.1% (seeds 0-2) in every precision; 87.5% is the
# trainer's published floor. Shorter runs (a smoke test) get a lower one.
floor = 0.875 if epochs >= 5 else 0.80
ok = True
for name, r in (("auto", auto), ("32-true", ref), (mixed["precision"], mixed), ("32-true, medium", medium)):
    print(f"{name}: {r['precision']} ({r['precision_reason']}), last epoch {100*last(r):.2f}%, "
          f"{r['mean_rate']:,.0f} samples/s")
    if len(r["epochs"]) != epochs:
        print(f"FAIL: {name} reported {len(r['epochs'])} epochs, expected {epochs}"); ok = False
    if last(r) < floor:
        print(f"FAIL: {name} ended at {100*last(r):.2f}%, under the floor of {100*floor:.1f}%"); ok = False
if auto["precision"] != expect:
    print(f"FAIL: auto picked {auto['precision']}, expected {expect} on this CPU"); ok = False
if ref["precision"] != "32-true":
    print(f"FAIL: the 32-true run reports {ref['precision']}"); ok = False
if abs(last(mixed) - last(ref)) > 0.005:
    print(f"FAIL: {mixed['precision']} and 32-true differ by {100*abs(last(mixed)-last(ref)):.2f} points (limit 0.5)"); ok = False
if (medium["float32_matmul_precision"], ref["float32_matmul_precision"]) != ("medium", "highest"):
    print(f"FAIL: the runs report float32 products {medium['float32_matmul_precision']} and "
          f"{ref['float32_matmul_precision']}, expected medium and highest"); ok = False
if abs(last(medium) - last(ref)) > 0.005:
    print(f"FAIL: medium float32 products and highest differ by {100*abs(last(medium)-last(ref)):.2f} points (limit 0.5)"); ok = False
sys.exit(0 if ok else 1)
PY
