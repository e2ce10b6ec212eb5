#!/usr/bin/env bash
# ampgrad-train with --precision auto against 32-true on the MLP: auto must pick what
# resolve_precision says for this machine (bf16-mixed on a CPU with AVX512-BF16 or
# AMX-BF16, with the reason printed at start), and end within 0.5 points of 32-true.
# Usage: precision_auto.sh <ampgrad-train> <work dir> [epochs]
set -euo pipefail
exe=$1
dir=$2
epochs=${3:-5}
mkdir -p "$dir"
for p in auto 32-true; do
  "$exe" --model mlp --epochs "$epochs" --precision "$p" --json "$dir/$p.json" >"$dir/$p.log" 2>&1 || {
    echo "ampgrad-train --precision $p failed:"; tail -n 20 "$dir/$p.log"; exit 1; }
done
grep -q '^precision: ' "$dir/auto.log" || { echo "no precision line in the auto run's output"; exit 1; }
python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
auto, ref = (json.load(open(f"{d}/{n}.json")) for n in ("auto", "32-true"))
flags = open("/proc/cpuinfo").read()
expect = "bf16-mixed" if (" avx512_bf16" in flags or " amx_bf16" in flags) else "32-true"
a, r = auto["epochs"][-1]["test_accuracy"], ref["epochs"][-1]["test_accuracy"]
print(f"auto: {auto['precision']} ({auto['precision_reason']}), last epoch {100*a:.2f}%, "
      f"{auto['mean_rate']:,.0f} samples/s; 32-true: {100*r:.2f}%, {ref['mean_rate']:,.0f} samples/s")
ok = auto["precision"] == expect and ref["precision"] == "32-true" and abs(a - r) <= 0.005
if auto["precision"] != expect:
    print(f"FAIL: auto picked {auto['precision']}, expected {expect} on this CPU")
if abs(a - r) > 0.005:
    print(f"FAIL: accuracies differ by {100*abs(a-r):.2f} points (limit 0.5)")
sys.exit(0 if ok else 1)
PY
