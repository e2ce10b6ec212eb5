#!/usr/bin/env bash
# ampgrad-train's checkpoints and stops, end to end on the MLP (on small_data.py's 256
# training images, in batches of 32: eight steps an epoch):
#   --save/--keep keeps the newest K epochs; a fresh run refuses a folder that holds a run;
#   --resume FOLDER skips (and names) a checkpoint that does not load and continues from the
#   newest that does; a checkpoint of another model is refused by name;
#   a NaN loss stops 32-true at the step it happened, naming it, and 16-mixed after the run of
#   skipped steps --max-skip-run allows; either way the saved checkpoints stay as they were.
# Usage: checkpoints.sh <ampgrad-train> <work dir>
set -euo pipefail
exe=$1
dir=$2
rm -rf "$dir"
mkdir -p "$dir"
run_dir="$dir/run"
fail() { echo "FAIL: $*"; exit 1; }
listing() { (cd "$run_dir" && ls | tr '\n' ' '); }
"$(dirname "$0")/small_data.py" "$dir/data"
exe=("$exe" --data "$dir/data" --batch-size 32)

# 1. Three epochs, keep 2.
"${exe[@]}" --model mlp --epochs 3 --save "$run_dir" --keep 2 --quiet --json "$dir/a.json" >"$dir/a.log" 2>&1 ||
  { tail -n 20 "$dir/a.log"; fail "the first run failed"; }
[ "$(listing)" = "epoch-0002.safetensors epoch-0003.safetensors " ] || fail "after 3 epochs with --keep 2: $(listing)"

# 2. A fresh run does not write over them.
if "${exe[@]}" --model mlp --epochs 1 --save "$run_dir" --quiet >"$dir/fresh.log" 2>&1; then
  fail "a fresh run saved into a folder that holds checkpoints"
fi
grep -q "already holds checkpoints .*--resume $run_dir" "$dir/fresh.log" || { cat "$dir/fresh.log"; fail "refusal message"; }

# 3. The newest checkpoint cut short: resume skips it, says why, and continues from epoch 2.
truncate -s 1000 "$run_dir/epoch-0003.safetensors"
"${exe[@]}" --model mlp --epochs 4 --resume "$run_dir" --save "$run_dir" --keep 2 --json "$dir/b.json" \
  >"$dir/b.log" 2>"$dir/b.err" || { tail -n 20 "$dir/b.log" "$dir/b.err"; fail "the resumed run failed"; }
grep -q "warning: skipped the checkpoint $run_dir/epoch-0003.safetensors: .*exceeds the file size" "$dir/b.err" ||
  { cat "$dir/b.err"; fail "the skipped checkpoint was not named with its reason"; }
grep -q "^resumed  : $run_dir/epoch-0002.safetensors after epoch 2" "$dir/b.log" || { cat "$dir/b.log"; fail "resume point"; }
[ "$(listing)" = "epoch-0003.safetensors epoch-0004.safetensors " ] || fail "after resuming to epoch 4: $(listing)"
python3 - "$dir/b.json" <<'PY' || fail "the resumed run's epochs"
import json, sys
r = json.load(open(sys.argv[1]))
epochs = [e["epoch"] for e in r["epochs"]]
assert epochs == [3, 4], epochs
assert r["epochs"][-1]["test_accuracy"] > 0.8, r["epochs"][-1]
PY

# 4. Another model's checkpoints are refused by name.
if "${exe[@]}" --model cnn --epochs 1 --resume "$run_dir" --quiet >"$dir/cnn.log" 2>&1; then fail "cnn resumed from mlp checkpoints"; fi
grep -q "no checkpoint loads" "$dir/cnn.log" && grep -q "holds a mlp checkpoint, not cnn" "$dir/cnn.log" ||
  { cat "$dir/cnn.log"; fail "the refusal of another model's checkpoints"; }

# 5. A NaN in the output layer's bias (a copy of epoch 4): every loss from then on is NaN.
python3 - "$run_dir/epoch-0004.safetensors" "$dir/nan.safetensors" <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
name = [k for k, v in h.items() if k.startswith("model.") and k.endswith("bias") and v["shape"] == [10]][-1]
assert h[name]["dtype"] == "F32", h[name]
off = 8 + n + h[name]["data_offsets"][0]
b[off:off + 4] = struct.pack("<f", float("nan"))
open(sys.argv[2], "wb").write(b)
PY
before=$(cd "$run_dir" && sha256sum *)
# Eight steps an epoch (256 / 32): epoch 5's first step is the run's step 33.
if "${exe[@]}" --model mlp --epochs 6 --precision 32-true --resume "$dir/nan.safetensors" --save "$run_dir" --quiet \
  >"$dir/nan32.log" 2>&1; then fail "a NaN loss did not stop 32-true"; fi
grep -q "the loss is NaN at step 33 (epoch 5, batch 1) under 32-true; training stopped; the last checkpoint, $dir/nan.safetensors, is kept" \
  "$dir/nan32.log" || { cat "$dir/nan32.log"; fail "32-true's stop message"; }
if "${exe[@]}" --model mlp --epochs 6 --precision 16-mixed --max-skip-run 5 --resume "$dir/nan.safetensors" --save "$run_dir" \
  --quiet >"$dir/nan16.log" 2>&1; then fail "a run of skipped steps did not stop 16-mixed"; fi
grep -q "5 optimizer steps in a row were skipped for inf/NaN gradients (steps 33 to 37, epoch 5; --max-skip-run 5" \
  "$dir/nan16.log" || { cat "$dir/nan16.log"; fail "16-mixed's stop message"; }
# The stop names what overflowed: the NaN bias makes the loss NaN, and every gradient with it.
grep -q "; the last step skipped: the loss was not finite (nan); [0-9]* parameters' gradients held inf/NaN: [a-z0-9_.]*weight \[" \
  "$dir/nan16.log" || { cat "$dir/nan16.log"; fail "16-mixed's overflow report"; }
[ "$(cd "$run_dir" && sha256sum *)" = "$before" ] || fail "a stopped run changed the saved checkpoints"
echo "checkpoints: keep, refuse, skip-and-resume, model check, NaN stops: all as expected"
