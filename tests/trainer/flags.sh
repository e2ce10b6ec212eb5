#!/usr/bin/env bash
# ampgrad-train's recipe options each take effect, on a small dataset in Fashion-MNIST's
# format (256 training and 100 test images, small_data.py) and a short text for gpt, one
# thread a run (but for --threads), on the CPU, so that the whole script takes seconds:
#   --seed        the same seed gives the same run; another seed another run
#   --lr          the rate the optimizer runs at (the JSON's lr under --schedule constant); a
#                 rate too small to move a float32 weight leaves the loss flat, 1e-3 lowers it
#   --schedule    cosine ends epoch 1 of 2 at lr / 2 and epoch 2 at 0; constant stays at --lr
#   --batch-size  the optimizer steps of an epoch: ceil(256 / batch size)
#   --threads     the thread count reported at start
#   --output-conversion  under bf16-true, none leaves the logits in bfloat16, so the loss of a
#                 one-batch epoch is a bfloat16 value; to-default gives float32 logits, and so
#                 does to-input-dtype (the images are float32): the same run as to-default
#   --preset      gpt: nanogpt's context of 256 instead of small's 64 (the other sizes given
#                 here) adds 192 position embeddings of the width; --block-size overrides it
#   --val-fraction  gpt: a held-out validation loss each epoch (the same positions in every
#                 run: two runs of one seed agree); 0 holds nothing out and reports none
#   --val-batches gpt: how many held-out batches it averages (another count, another loss)
#   --update-rounding  bf16-true: nearest loses the small updates of a tiny --lr (the stalled
#                 fraction per epoch is high, one warning names the layer norms' weights),
#                 master keeps them (below 1% stall: in float32 only the tiniest); the JSON's bytes per parameter is 2
#                 (weights) + 8 (AdamW's moments) + 4 under master
#   --min-lr      the cosine schedule's last rate
# and a bad value of each is refused before training, naming the option and the value.
# Usage: flags.sh <ampgrad-train> <work dir>
set -euo pipefail
exe=$1
dir=$2
rm -rf "$dir"
mkdir -p "$dir/data"
fail() { echo "FAIL: $*"; exit 1; }

"$(dirname "$0")/small_data.py" "$dir/data"

run() {  # run <name> <options...>: an MLP run
  local name=$1
  shift
  "$exe" --model mlp --data "$dir/data" --accelerator cpu --json "$dir/$name.json" "$@" >"$dir/$name.log" 2>&1 ||
    { tail -n 20 "$dir/$name.log"; fail "run $name ($*) failed"; }
}
recipe=(--precision 32-true --epochs 2 --threads 1)  # and a batch size of 64 but where another is tried
run seed1 "${recipe[@]}" --batch-size 64 --seed 1
run seed1-again "${recipe[@]}" --batch-size 64 --seed 1 --quiet
run seed2 "${recipe[@]}" --batch-size 64 --seed 2 --quiet
run lr-tiny "${recipe[@]}" --batch-size 64 --seed 1 --lr 1e-12 --schedule constant --quiet
run constant "${recipe[@]}" --batch-size 64 --seed 1 --schedule constant --quiet
run batch100 "${recipe[@]}" --batch-size 100 --seed 1 --quiet
run threads2 --precision 32-true --epochs 1 --batch-size 256 --threads 2
for oc in to-default to-input-dtype none; do
  run "oc-$oc" --precision bf16-true --epochs 1 --batch-size 256 --threads 1 --output-conversion "$oc" --quiet
done
gpt() {  # gpt <name> <options...>: one step of a one-layer GPT of width 24
  local name=$1
  shift
  "$exe" --model gpt --data "$dir/data/text.txt" --accelerator cpu --precision 32-true --epochs 1 --steps-per-epoch 1 --batch-size 2 \
    --layers 1 --width 24 --sample-length 0 --threads 1 --json "$dir/$name.json" "$@" >"$dir/$name.log" 2>&1 ||
    { tail -n 20 "$dir/$name.log"; fail "run $name ($*) failed"; }
}
gpt preset-small --preset small
gpt preset-nanogpt --preset nanogpt
gpt preset-nanogpt-64 --preset nanogpt --block-size 64
gpt val-again --preset small
gpt val-none --preset small --val-fraction 0
gpt val-one --preset small --val-batches 1
rounding() {  # rounding <mode>: bf16-true at a rate whose updates a bfloat16 1.0 cannot take
  "$exe" --model gpt --data "$dir/data/text.txt" --accelerator cpu --precision bf16-true --update-rounding "$1" \
    --lr 1e-4 --min-lr 5e-5 --epochs 2 --steps-per-epoch 2 --batch-size 2 --layers 1 --width 24 --sample-length 0 \
    --threads 1 --json "$dir/round-$1.json" >"$dir/round-$1.log" 2>"$dir/round-$1.err" ||
    { tail -n 20 "$dir/round-$1.log" "$dir/round-$1.err"; fail "run --update-rounding $1 failed"; }
}
rounding nearest
rounding master
rounding stochastic
grep -q "^warning: .*% of the bf16-true weights' updates were lost to rounding this epoch (--update-rounding nearest); most: .*ln.*weight 100.0%" \
  "$dir/round-nearest.err" || { cat "$dir/round-nearest.err"; fail "the stalled-update warning"; }
[ "$(grep -c "lost to rounding" "$dir/round-nearest.err")" = 1 ] || fail "the stalled-update warning is not given once"
! grep -q "lost to rounding" "$dir/round-master.err" || fail "master warned of lost updates"
! grep -q "lost to rounding" "$dir/round-stochastic.err" || fail "stochastic rounding, which keeps the updates on average, warned"
grep -q "% of 16-bit updates stalled (kept on average by stochastic rounding)" "$dir/round-stochastic.log" ||
  { cat "$dir/round-stochastic.log"; fail "stochastic's epoch line"; }

grep -q '^threads  : 1$' "$dir/seed1.log" || { head -n 3 "$dir/seed1.log"; fail "--threads 1 is not in the report"; }
grep -q '^threads  : 2$' "$dir/threads2.log" || { head -n 3 "$dir/threads2.log"; fail "--threads 2 is not in the report"; }
grep -q 'AdamW lr 0.001 (cosine), batch 64, seed 1$' "$dir/seed1.log" || { grep model "$dir/seed1.log"; fail "the recipe line"; }

python3 - "$dir" <<'PY' || fail "an option did not take effect"
import json, re, struct, sys
d = sys.argv[1]
runs = lambda n: json.load(open(f"{d}/{n}.json"))["epochs"]
col = lambda n, k: [e[k] for e in runs(n)]
results = lambda n: [(e["train_loss"], e["test_accuracy"]) for e in runs(n)]
ok = True
def check(cond, what):
    global ok
    if not cond:
        print("FAIL:", what)
        ok = False

check(results("seed1") == results("seed1-again"), f"--seed 1 twice: {results('seed1')} vs {results('seed1-again')}")
check(results("seed1") != results("seed2"), f"--seed 1 and --seed 2 gave the same run: {results('seed1')}")

check(col("lr-tiny", "lr") == [1e-12, 1e-12], f"--lr 1e-12 --schedule constant ran at {col('lr-tiny', 'lr')}")
check(col("constant", "lr") == [1e-3, 1e-3], f"--schedule constant (--lr 1e-3) ran at {col('constant', 'lr')}")
tiny, moved = col("lr-tiny", "train_loss"), col("constant", "train_loss")
check(abs(tiny[1] - tiny[0]) <= 1e-5 * tiny[0], f"--lr 1e-12 moved the loss: {tiny}")
check(moved[1] < 0.8 * moved[0], f"--lr 1e-3 did not lower the loss: {moved}")

cos = col("seed1", "lr")
check(abs(cos[0] - 5e-4) <= 1e-12 and abs(cos[1]) <= 1e-12, f"--schedule cosine: {cos}, expected [0.0005, 0]")

check(col("seed1", "steps") == [4, 4] and col("batch100", "steps") == [3, 3],
      f"steps per epoch: batch 64 {col('seed1', 'steps')}, batch 100 {col('batch100', 'steps')}; expected 4 and 3")

is_bf16 = lambda x: struct.unpack("<I", struct.pack("<f", x))[0] & 0xFFFF == 0 and struct.unpack("<f", struct.pack("<f", x))[0] == x
none, default, to_input = (col(f"oc-{m}", "train_loss")[0] for m in ("none", "to-default", "to-input-dtype"))
check(is_bf16(none), f"--output-conversion none: the loss {none!r} is not a bfloat16 value")
check(not is_bf16(default), f"--output-conversion to-default: the loss {default!r} is a bfloat16 value")
check(results("oc-to-input-dtype") == results("oc-to-default"), f"to-input-dtype {to_input!r} and to-default {default!r} differ")

def params(name):
    m = re.search(r"^model    : gpt, ([\d,]+) parameters", open(f"{d}/{name}.log").read(), re.M)
    return int(m.group(1).replace(",", "")) if m else None
small, nano, nano64 = params("preset-small"), params("preset-nanogpt"), params("preset-nanogpt-64")
check(None not in (small, nano, nano64) and nano - small == (256 - 64) * 24 and nano64 == small,
      f"gpt parameters: small {small}, nanogpt {nano}, nanogpt with --block-size 64 {nano64}; "
      f"expected nanogpt = small + 192 * 24 and the override equal to small")

val = lambda n: [e.get("val_loss") for e in runs(n)]
check(all(v is not None and 0 < v < 10 for v in val("preset-small")), f"gpt's validation loss: {val('preset-small')}")
check(val("preset-small") == val("val-again"), f"one seed, two validation losses: {val('preset-small')} {val('val-again')}")
check(val("val-none") == [None], f"--val-fraction 0 reported a validation loss: {val('val-none')}")
check(val("val-one") != val("preset-small"), f"--val-batches 1 gave the same loss as 8: {val('val-one')}")

near, mast = json.load(open(f"{d}/round-nearest.json")), json.load(open(f"{d}/round-master.json"))
stalled = lambda r: [e.get("stalled_fraction") for e in r["epochs"]]
check(all(s is not None and s > 0.3 for s in stalled(near)), f"nearest's stalled fractions: {stalled(near)}")
check(all(s is not None and s < 0.01 for s in stalled(mast)), f"master's stalled fractions: {stalled(mast)}")
check(near["memory"]["bytes_per_parameter"] == 10 and mast["memory"]["bytes_per_parameter"] == 14,
      f"bytes per parameter: nearest {near['memory']}, master {mast['memory']}")
check(abs(near["epochs"][-1]["lr"] - 5e-5) < 1e-12, f"--min-lr 5e-5: the last rate is {near['epochs'][-1]['lr']}")
check("stalled_fraction" not in runs("preset-small")[0], "a 32-true run reports a stalled fraction")
sys.exit(0 if ok else 1)
PY

# One bad value per option: refused by name and value, before anything trains.
bad() {  # bad <option> <value>
  local out rc=0
  out=$("$exe" --model mlp --data "$dir/data" --epochs 1 "$1" "$2" 2>&1) || rc=$?
  [ $rc -ne 0 ] || fail "$1 $2 was accepted"
  grep -qF -- "$1" <<<"$out" && grep -qF -- "$2" <<<"$out" || { echo "$out"; fail "$1 $2: the error does not name the option and the value"; }
  ! grep -q "^threads  :" <<<"$out" || fail "$1 $2: refused only after the run started"
}
bad --seed -1
bad --lr -0.5
bad --schedule linear
bad --batch-size 0
bad --threads -2
bad --output-conversion float32
bad --preset large
bad --val-fraction 0.9
bad --val-batches 0
bad --update-rounding upward
bad --min-lr -1
echo "flags: --seed, --lr, --schedule, --batch-size, --threads, --output-conversion, --preset, --val-fraction, --val-batches, --update-rounding and --min-lr take effect; bad values are named"
