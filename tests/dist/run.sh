#!/usr/bin/env bash
# The process group's tests under mpirun: the collectives and Lite's ddp with 2 ranks, then the two
# failure cases, each in its own job since it ends the job: a rank that hangs (rank 0's
# error must name it, and the job must end rather than hang) and a rank killed with
# SIGKILL (the job must end within a minute, naming rank 1).
# The first job must run at least one test (a filter that matches none fails), and what it
# skipped, with the reasons, goes to <summary file> for scripts/run-ctest's summary.
# Usage: tests/dist/run.sh <mpiexec> <ampgrad_dist_tests> [<summary file>]
set -uo pipefail
mpiexec=$1
exe=$2
summary=${3:-/dev/null}
# One OpenMP thread per rank (2 ranks share this machine's cores); root is allowed (CI runs
# as root); more ranks than cores is fine for correctness.
export OMP_NUM_THREADS=1
launch=("$mpiexec" -np 2 --oversubscribe --allow-run-as-root --mca btl self,vader --mca btl_vader_single_copy_mechanism none)
fail=0

echo "== collectives and Lite's ddp, 2 ranks"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
timeout 300 "${launch[@]}" "$exe" --gtest_color=no --gtest_filter='Dist.*:DistNccl.*:LiteDdp.*' 2>&1 | tee "$log"
if [ "${PIPESTATUS[0]}" -ne 0 ]; then
  echo "FAIL: the collectives' tests"
  fail=1
fi
# Each rank prints its own totals; every rank must have run tests.
ran=$(sed -n 's/^\[==========\] \([0-9]*\) tests\{0,1\} from .* ran\..*/\1/p' "$log")
if [ -z "$ran" ] || grep -qx 0 <<<"$ran"; then
  echo "FAIL: the filter matched no test (tests run per rank: ${ran:-none})"
  fail=1
fi
# A skipped test: the lines between its RUN and SKIPPED markers hold the reason (ranks print
# the same tests, so each appears once).
awk '/^\[ RUN      \] /{t=$4; why=""; next}
     /^\[  SKIPPED \] [^ ]+ \(/{if ($4==t) print t ": " (why == "" ? "(no reason printed)" : why); t=""; next}
     t!="" && !/: Skipped$/ && NF {why = why (why == "" ? "" : " ") $0}' "$log" | sort -u > "$log.skips"
{
  echo "dist.mpirun: tests run per rank: $(tr '\n' ' ' <<<"$ran")"
  sed 's/^/skipped: /' "$log.skips"
} > "$summary"
if [ -s "$log.skips" ]; then
  echo "Skipped under mpirun:"
  sed 's/^/  /' "$log.skips"
fi
rm -f "$log.skips"

echo "== a hung rank"
out=$(AMPGRAD_DIST_CASE=hang timeout 120 "${launch[@]}" -x AMPGRAD_DIST_CASE "$exe" --gtest_color=no --gtest_filter='DistFailure.HungRankIsNamed' 2>&1)
rc=$?
echo "$out" | tail -n 30
if [ $rc -eq 124 ]; then
  echo "FAIL: the job with a hung rank did not end within 120 s"
  fail=1
elif ! grep -q '\[       OK \] DistFailure.HungRankIsNamed' <<<"$out" || grep -q '\[  FAILED  \] DistFailure' <<<"$out"; then
  echo "FAIL: rank 0 did not name the hung rank"
  fail=1
fi

echo "== a dead rank"
start=$(date +%s)
out=$(AMPGRAD_DIST_CASE=dead timeout 120 "${launch[@]}" -x AMPGRAD_DIST_CASE "$exe" --gtest_color=no --gtest_filter='DistFailure.DeadRankEndsTheJob' 2>&1)
rc=$?
took=$(( $(date +%s) - start ))
echo "$out" | tail -n 30
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $took -gt 60 ]; then
  echo "FAIL: the job with a dead rank ended with status $rc after $took s (expected a failure within 60 s)"
  fail=1
elif ! grep -Eq 'rank 1' <<<"$out"; then
  echo "FAIL: nothing named rank 1 as the process that died"
  fail=1
fi
exit $fail
