#!/usr/bin/env bash
# ampgrad-train --strategy ddp under mpirun with 2 ranks, end to end on the MLP and the GPT:
#   rank 0 alone prints (one summary, naming the 2 processes), writes the JSON and the
#   checkpoints (and prunes them to --keep); the figures are the job's (every training
#   sample counted once per epoch); a resumed job continues from rank 0's checkpoint on
#   every rank; the GPT path draws one batch per rank. On the trainer's small dataset
#   (tests/trainer/small_data.py, in batches of 16 per rank: 8 steps an epoch).
# Usage: train.sh <mpiexec> <ampgrad-train> <work dir>
set -euo pipefail
mpiexec=$1
exe=$2
dir=$3
rm -rf "$dir"
mkdir -p "$dir"
export OMP_NUM_THREADS=1
launch=("$mpiexec" -np 2 --oversubscribe --allow-run-as-root --mca btl self,vader --mca btl_vader_single_copy_mechanism none)
fail() { echo "FAIL: $*"; exit 1; }
run_dir="$dir/run"
"$(dirname "$0")/../trainer/small_data.py" "$dir/data"
exe=("$exe" --data "$dir/data" --batch-size 16 --accelerator cpu)  # MPI over CPU tensors, whatever the build has

# 1. Two epochs, keep 1.
timeout 600 "${launch[@]}" "${exe[@]}" --strategy ddp --model mlp --epochs 2 --save "$run_dir" --keep 1 \
  --json "$dir/a.json" >"$dir/a.log" 2>&1 || { tail -n 30 "$dir/a.log"; fail "the ddp run failed"; }
[ "$(grep -c '^summary: ' "$dir/a.log")" = 1 ] || { cat "$dir/a.log"; fail "not exactly one summary"; }
grep -q "ddp over 2 processes" "$dir/a.log" || { cat "$dir/a.log"; fail "the summary does not name the 2 processes"; }
[ "$(grep -c '^epoch 2: train loss' "$dir/a.log")" = 1 ] || { cat "$dir/a.log"; fail "not exactly one line for epoch 2"; }
[ "$(cd "$run_dir" && ls | tr '\n' ' ')" = "epoch-0002.safetensors " ] || fail "checkpoints: $(ls "$run_dir")"
python3 - "$dir/a.json" <<'PY' || fail "the ddp run's JSON"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["strategy"] == "ddp" and r["world_size"] == 2, r
assert [e["epoch"] for e in r["epochs"]] == [1, 2], r["epochs"]
assert r["epochs"][-1]["test_accuracy"] > 0.8, r["epochs"][-1]
PY

# 2. Resumed on both ranks from rank 0's checkpoint.
timeout 600 "${launch[@]}" "${exe[@]}" --strategy ddp --model mlp --epochs 3 --resume "$run_dir" --save "$run_dir" --keep 1 \
  --json "$dir/b.json" >"$dir/b.log" 2>&1 || { tail -n 30 "$dir/b.log"; fail "the resumed ddp run failed"; }
[ "$(grep -c "^resumed  : $run_dir/epoch-0002.safetensors after epoch 2" "$dir/b.log")" = 1 ] ||
  { cat "$dir/b.log"; fail "resume point"; }
python3 - "$dir/b.json" <<'PY' || fail "the resumed run's JSON"
import json, sys
r = json.load(open(sys.argv[1]))
assert [e["epoch"] for e in r["epochs"]] == [3], r["epochs"]
assert r["epochs"][-1]["test_accuracy"] > 0.8, r["epochs"][-1]
PY

# 3. The GPT, briefly.
timeout 600 "${launch[@]}" "${exe[@]}" --strategy ddp --model gpt --epochs 1 --steps-per-epoch 20 --sample-length 20 \
  --json "$dir/g.json" >"$dir/g.log" 2>&1 || { tail -n 30 "$dir/g.log"; fail "the ddp GPT run failed"; }
[ "$(grep -c '^summary: gpt' "$dir/g.log")" = 1 ] || { cat "$dir/g.log"; fail "GPT: not exactly one summary"; }
echo "ddp trainer: rank-0 output and checkpoints, resume, GPT: all as expected"
