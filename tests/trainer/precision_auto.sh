#!/usr/bin/env bash
# ampgrad-train --precision auto on the MLP, end to end: auto must pick what this CPU
# supports natively (bf16-mixed with AVX512-BF16 or AMX-BF16, else 32-true) and print the
# reason at start, and its run must reach the trainer's published accuracy floor; a one-epoch
# auto run must equal, bit for bit, a one-epoch run that names the precision auto picked
# (auto decides, then trains exactly as the named precision does). A one-epoch 32-true run with
# --float32-matmul-precision medium must report medium products and reach a one-epoch floor.
# Whether each precision converges like 32-true is TrainE2E's question
# (tests/nn/test_train_e2e.cpp: every precision and medium, in process), not asked again here.
# Usage: precision_auto.sh <ampgrad-train> <work dir> [epochs]
set -euo pipefail
exe=$1
dir=$2
epochs=${3:-5}
mkdir -p "$dir"
run() {  # run <name> <epochs> <ampgrad-train options...>
  local name=$1 n=$2
  shift 2
  "$exe" --model mlp --epochs "$n" --json "$dir/$name.json" "$@" >"$dir/$name.log" 2>&1 || {
    echo "ampgrad-train $* failed:"; tail -n 20 "$dir/$name.log"; exit 1; }
}
run auto "$epochs" --precision auto
grep -q '^precision: ' "$dir/auto.log" || { echo "no precision line in the auto run's output"; exit 1; }
named=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["precision"])' "$dir/auto.json")
run auto1 1 --precision auto  # the schedule spans the run: one epoch against one epoch
run named 1 --precision "$named"
run medium 1 --precision 32-true --float32-matmul-precision medium
python3 - "$dir" "$epochs" <<'PY'
import json, sys
d, epochs = sys.argv[1], int(sys.argv[2])
load = lambda n: json.load(open(f"{d}/{n}.json"))
auto, auto1, named, medium = load("auto"), load("auto1"), load("named"), load("medium")
flags = open("/proc/cpuinfo").read()
expect = "bf16-mixed" if (" avx512_bf16" in flags or " amx_bf16" in flags) else "32-true"
last = lambda r: r["epochs"][-1]["test_accuracy"]
# 5 epochs of the MLP reach 88.9-89.1% (seeds 0-2) in every precision; 87.5% is the
# trainer's published floor. Shorter runs (a smoke test) get a lower one, as does one epoch.
floor = 0.875 if epochs >= 5 else 0.80
ok = True
for name, r, n, fl in (("auto", auto, epochs, floor), ("32-true, medium", medium, 1, 0.80)):
    print(f"{name}: {r['precision']} ({r['precision_reason']}), last epoch {100*last(r):.2f}%, "
          f"{r['mean_rate']:,.0f} samples/s")
    if len(r["epochs"]) != n:
        print(f"FAIL: {name} reported {len(r['epochs'])} epochs, expected {n}"); ok = False
    if last(r) < fl:
        print(f"FAIL: {name} ended at {100*last(r):.2f}%, under the floor of {100*fl:.1f}%"); ok = False
if auto["precision"] != expect:
    print(f"FAIL: auto picked {auto['precision']}, expected {expect} on this CPU"); ok = False
a, b = auto1["epochs"][0], named["epochs"][0]
for key in ("train_loss", "test_accuracy", "steps"):
    if a[key] != b[key]:
        print(f"FAIL: epoch 1 of auto ({auto['precision']}) and of --precision {named['precision']} differ in "
              f"{key}: {a[key]!r} vs {b[key]!r}"); ok = False
if (medium["precision"], medium["float32_matmul_precision"]) != ("32-true", "medium"):
    print(f"FAIL: the medium run reports {medium['precision']} with {medium['float32_matmul_precision']} float32 "
          f"products, expected 32-true with medium"); ok = False
sys.exit(0 if ok else 1)
PY
