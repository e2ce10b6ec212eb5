#!/usr/bin/env bash
# The precision decision is recorded in ampgrad-train's checkpoints and replayed on resume,
# end to end on the MLP (small_data.py's 256 training images, one epoch of one batch a run):
#   a run with an explicit precision P that "auto" would not pick here records P;
#   --resume keeps P without --precision, and says so in one line (and in --json);
#   --resume --redecide-precision decides again ("auto") and says the result differs from P;
#   the checkpoint a kept run writes still records P as first decided (explicit);
#   ampgrad-info --checkpoint prints the record, and refuses a file that is not a checkpoint;
#   --precision auto:measure runs a trial, prints its table, records it ("auto (trial)") and
#   writes its rows into --json;
#   float32 products at "medium" are part of the record, and a resumed run gets them back.
# Usage: precision_record.sh <ampgrad-train> <ampgrad-info> <work dir>
set -euo pipefail
exe=$1
info=$2
dir=$3
rm -rf "$dir"
mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
"$(dirname "$0")/small_data.py" "$dir/data"
train() {  # train <name> <options...>
  local name=$1
  shift
  "$exe" --model mlp --data "$dir/data" --accelerator cpu --batch-size 256 --threads 1 --json "$dir/$name.json" "$@" \
    >"$dir/$name.log" 2>"$dir/$name.err" || { tail -n 20 "$dir/$name.log" "$dir/$name.err"; fail "run $name ($*) failed"; }
}
field() { python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$@"; }

# What "auto" picks on this machine, and a precision it does not pick.
train auto --epochs 1 --precision auto --quiet
auto=$(field "$dir/auto.json" 'r["precision"]')
[ "$(field "$dir/auto.json" 'r["precision_record"]["how"]')" = "auto (table)" ] || fail "auto's record: $(cat "$dir/auto.json")"
if [ "$auto" = 32-true ]; then other=64-true; else other=32-true; fi

# 1. Epoch 1 under the other precision, saved.
train first --epochs 1 --precision "$other" --save "$dir/run"
ckpt1="$dir/run/epoch-0001.safetensors"
[ -f "$ckpt1" ] || fail "no checkpoint after epoch 1"

# 2. Resumed without --precision: the recorded one runs, said in one line and in the JSON.
train kept --epochs 2 --resume "$dir/run" --save "$dir/run"
[ "$(field "$dir/kept.json" 'r["precision"]')" = "$other" ] || fail "the resumed run did not keep $other: $(cat "$dir/kept.json")"
grep -q "^precision: $other, recorded in $ckpt1 (explicit on .*); --redecide-precision decides again$" "$dir/kept.log" ||
  { cat "$dir/kept.log"; fail "the line that says the recorded precision is kept"; }
[ "$(field "$dir/kept.json" 'r["precision_on_resume"]["choice"]')" = kept ] || fail "kept.json: precision_on_resume"
! grep -q "was saved under" "$dir/kept.err" || { cat "$dir/kept.err"; fail "a kept precision warned of a mismatch"; }
# The checkpoint of the resumed run records the first decision, not a new explicit one.
[ "$(field "$dir/kept.json" 'r["precision_record"]["how"]')" = explicit ] || fail "kept.json: precision_record"

# 3. --redecide-precision: "auto" decides again, and the line says it differs from the record.
train redecided --epochs 3 --resume "$dir/run/epoch-0001.safetensors" --redecide-precision
[ "$(field "$dir/redecided.json" 'r["precision"]')" = "$auto" ] || fail "--redecide-precision did not decide again: $(cat "$dir/redecided.json")"
grep -q "^precision: $auto, decided again (--redecide-precision); differs from $other, recorded in $ckpt1 (explicit on " \
  "$dir/redecided.log" || { cat "$dir/redecided.log"; fail "the line that says the decision differs"; }
grep -q "was saved under $other .*this Lite runs $auto" "$dir/redecided.err" || { cat "$dir/redecided.err"; fail "Lite::load's mismatch line"; }

# 4. An explicit --precision wins over the record too.
train given --epochs 3 --resume "$ckpt1" --precision "$auto"
grep -q "^precision: $auto, as requested; differs from $other, recorded in $ckpt1" "$dir/given.log" ||
  { cat "$dir/given.log"; fail "the line of an explicit --precision"; }

# 5. ampgrad-info --checkpoint prints the record; a file that is not a checkpoint is refused.
"$info" --checkpoint "$dir/run/epoch-0002.safetensors" >"$dir/info.log" 2>&1 || { cat "$dir/info.log"; fail "ampgrad-info --checkpoint"; }
grep -q "^precision $other, chosen explicit on " "$dir/info.log" || { cat "$dir/info.log"; fail "ampgrad-info's record"; }
grep -q "^  cpu features: " "$dir/info.log" || { cat "$dir/info.log"; fail "ampgrad-info's hardware"; }
if "$info" --checkpoint "$dir/data/text.txt" >"$dir/info-bad.log" 2>&1; then fail "ampgrad-info read a text file as a checkpoint"; fi
grep -q "\[load\] $dir/data/text.txt" "$dir/info-bad.log" || { cat "$dir/info-bad.log"; fail "ampgrad-info's error"; }
# 6. --precision auto:measure: a trial decides, prints its table, and the record carries it.
train measured --epochs 1 --precision auto:measure --save "$dir/measured"
grep -q "^precision trial (auto:measure):" "$dir/measured.log" || { cat "$dir/measured.log"; fail "the trial's table"; }
grep -q "^  decision: " "$dir/measured.log" || { cat "$dir/measured.log"; fail "the trial's decision"; }
[ "$(field "$dir/measured.json" 'r["precision_record"]["how"]')" = "auto (trial)" ] || fail "measured.json: $(cat "$dir/measured.json")"
"$info" --checkpoint "$dir/measured/epoch-0001.safetensors" >"$dir/info-measured.log" 2>&1 || fail "ampgrad-info on the measured run"
grep -q "32-true  *native" "$dir/info-measured.log" || { cat "$dir/info-measured.log"; fail "the trial's table in the checkpoint"; }
chosen=$(field "$dir/measured.json" '[t["candidate"] for t in r["precision_trial"]["rows"] if t["chosen"]]')
[ "$(field "$dir/measured.json" 'r["precision_trial"]["chosen"]')" = "$(field "$dir/measured.json" 'r["precision_record"]["precision"] + ("" if r["precision_record"]["float32_matmul_precision"] == "highest" else "+" + r["precision_record"]["float32_matmul_precision"])')" ] ||
  fail "the trial's choice is not the recorded precision: $(cat "$dir/measured.json")"
[ "$chosen" = "['$(field "$dir/measured.json" 'r["precision_trial"]["chosen"]')']" ] || fail "not one chosen row: $chosen"
[ "$(field "$dir/measured.json" '[t["measured"] and t["median_step_seconds"] > 0 and t["final_loss"] > 0 for t in r["precision_trial"]["rows"] if t["candidate"] == "32-true"]')" = "[True]" ] ||
  fail "the JSON's 32-true row: $(cat "$dir/measured.json")"
grep -q "^precision: $(field "$dir/measured.json" 'r["precision_trial"]["chosen"]'), chosen by the trial$" "$dir/measured.log" ||
  { cat "$dir/measured.log"; fail "the line after the trial"; }
# 7. float32 products at "medium" are recorded, and come back on resume without the flag.
train medium --epochs 1 --precision 32-true --float32-matmul-precision medium --save "$dir/medium"
train medium-kept --epochs 2 --resume "$dir/medium"
[ "$(field "$dir/medium-kept.json" 'r["float32_matmul_precision"]')" = medium ] || fail "medium-kept.json: $(cat "$dir/medium-kept.json")"
grep -q "^precision: 32-true+medium, recorded in $dir/medium/epoch-0001.safetensors (explicit on " "$dir/medium-kept.log" ||
  { cat "$dir/medium-kept.log"; fail "the line of a kept 32-true+medium"; }
echo "precision record: recorded, kept on resume, decided again when asked, printed by ampgrad-info, measured: all as expected"
