#!/usr/bin/env bash
# The process group's tests under mpirun: the collectives and Lite's ddp with 2 ranks, then the two
# failure cases, each in its own job since it ends the job: a rank that hangs (rank 0's
# error must name it, and the job must end rather than hang) and a rank killed with
# SIGKILL (the job must end within a minute, naming rank 1).
# Usage: tests/dist/run.sh <mpiexec> <ampgrad_dist_tests>
set -uo pipefail
mpiexec=$1
exe=$2
# One OpenMP thread per rank (2 ranks share this machine's cores); root is allowed (CI runs
# as root); more ranks than cores is fine for correctness.
export OMP_NUM_THREADS=1
launch=("$mpiexec" -np 2 --oversubscribe --allow-run-as-root --mca btl self,vader --mca btl_vader_single_copy_mechanism none)
fail=0

echo "== collectives and Lite's ddp, 2 ranks"
if ! timeout 300 "${launch[@]}" "$exe" --gtest_color=no --gtest_filter='Dist.*:DistNccl.*:LiteDdp.*'; then
  echo "FAIL: the collectives' tests"
  fail=1
fi

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
