#!/usr/bin/env bash
# Under CI=true, a configuration that finds no MPI or no CUDA toolkit fails (CMakeLists.txt,
# ampgrad_missing) instead of leaving their tests out of the run; a component turned off
# explicitly configures, and outside CI a missing one is a note.
# Usage: tests/ci/missing_components.sh <source dir> <work dir>
set -uo pipefail
src=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
export CCACHE_DISABLE=1
common=(-DAMPGRAD_ONEDNN=OFF -DAMPGRAD_BUILD_TESTS=OFF -DAMPGRAD_BUILD_BENCH=OFF -DAMPGRAD_BUILD_EXAMPLES=OFF)
fail=0

configure() {  # configure <CI value> <dir name> <cmake args...>: prints the output, returns cmake's status
  local ci=$1 name=$2
  shift 2
  env CI="$ci" cmake -S "$src" -B "$work/$name" "${common[@]}" "$@" 2>&1
}

refused() {  # refused <name> <expected text> <cmake args...>
  local name=$1 want=$2
  shift 2
  local out
  if out=$(configure true "$name" "$@"); then
    echo "FAIL: $name: configured under CI=true"
    fail=1
  elif ! tr -s '[:space:]' ' ' <<<"$out" | grep -qF "$want"; then  # CMake wraps its messages
    echo "FAIL: $name: the error does not say \"$want\":"
    tail -n 8 <<<"$out"
    fail=1
  else
    echo "ok: $name: refused under CI=true"
  fi
}

refused no-mpi "MPI not found (libopenmpi-dev): no distributed training, and its tests are not built (CI=true" \
  -DAMPGRAD_CUDA=OFF -DCMAKE_DISABLE_FIND_PACKAGE_MPI=TRUE
refused no-cuda "no CUDA toolkit found (nvcc and its libraries): the CUDA backend and its tests are not built (CI=true" \
  -DAMPGRAD_MPI=OFF -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=TRUE

if out=$(configure true explicit-off -DAMPGRAD_MPI=OFF -DAMPGRAD_CUDA=OFF); then
  echo "ok: explicit-off: configured under CI=true"
else
  echo "FAIL: explicit-off: components turned off explicitly were refused under CI=true:"
  tail -n 8 <<<"$out"
  fail=1
fi

if out=$(configure false outside-ci -DAMPGRAD_CUDA=OFF -DCMAKE_DISABLE_FIND_PACKAGE_MPI=TRUE) &&
   grep -qF "ampgrad: MPI not found" <<<"$out"; then
  echo "ok: outside-ci: a missing MPI is a note"
else
  echo "FAIL: outside-ci: without CI=true a missing MPI should configure with a note:"
  tail -n 8 <<<"$out"
  fail=1
fi
rm -rf "$work"
exit $fail
