#!/usr/bin/env bash
# The build refuses an include that runs up the layers: each layer's object library compiles
# with its own headers and those below it only (CMakeLists.txt, AMPGRAD_<layer>_INCLUDES).
# For each layer, a file including one of its own public headers compiles with that layer's
# include path, and a file including a header of the layer above it, another layer's private
# folder, or the reference kernels (kernels/reference, built as ampgrad_reference and passed
# as the layer "reference", whose path reaches no header of the library) fails because the
# header is not found ("No such file" from GCC, "file not found" from Clang).
#
# Usage: check_layer_includes.sh <c++ compiler> <work-dir> <layer>=<include dirs, :-separated> ...
set -euo pipefail

cxx=$1 work=$2
shift 2
mkdir -p "$work"

# layer -> a header of its own, then the headers it must not reach
declare -A own=(
  [core]="ampgrad/tensor.h"
  [kernels]="cpu/cpu_backend.h"
  [autocast]="ampgrad/autocast/autocast.h"
  [nn]="ampgrad/optim/optimizer.h"
  [dist]="ampgrad/dist/distributed.h"
  [wrappers]="ampgrad/wrappers/precision.h"
  [reference]="ampgrad/reference/norm.h"
)
# (every layer refuses the reference kernels, which in turn reach nothing of the library)
declare -A refused=(
  [core]="ampgrad/autocast/autocast.h cpu/cpu_backend.h ampgrad/reference/norm.h"
  [kernels]="ampgrad/autocast/autocast.h internal.h ampgrad/reference/norm.h"
  [autocast]="ampgrad/optim/optimizer.h internal.h ampgrad/reference/norm.h"
  [nn]="ampgrad/dist/distributed.h ampgrad/wrappers/lite.h ampgrad/reference/norm.h"
  [dist]="ampgrad/nn/module.h ampgrad/wrappers/lite.h ampgrad/reference/norm.h"
  [wrappers]="internal.h cpu/cpu_backend.h ampgrad/reference/norm.h"
  [reference]="ampgrad/tensor.h cpu/cpu_backend.h"
)

compile() {  # compile <include flags...> -- <header>
  local flags=() h
  while [ "$1" != -- ]; do flags+=("$1"); shift; done
  h=$2
  printf '#include "%s"\n' "$h" >"$work/probe.cpp"
  "$cxx" -std=c++20 -fsyntax-only "${flags[@]}" "$work/probe.cpp" 2>"$work/probe.err"
}

checked=0
for arg in "$@"; do
  layer=${arg%%=*} dirs=${arg#*=}
  [ -n "${own[$layer]:-}" ] || { echo "check_layer_includes: unknown layer $layer"; exit 2; }
  flags=()
  IFS=':' read -ra list <<<"$dirs"
  for d in "${list[@]}"; do flags+=("-I$d"); done
  if ! compile "${flags[@]}" -- "${own[$layer]}"; then
    echo "check_layer_includes: $layer/ cannot include its own ${own[$layer]}:"
    cat "$work/probe.err"
    exit 1
  fi
  for h in ${refused[$layer]}; do
    if compile "${flags[@]}" -- "$h"; then
      echo "check_layer_includes: $layer/ compiles an include of $h, which its layer must not reach"
      exit 1
    fi
    grep -qE "No such file|file not found" "$work/probe.err" || { echo "check_layer_includes: $layer/ with $h failed otherwise:"; cat "$work/probe.err"; exit 1; }
    checked=$((checked + 1))
  done
done
[ "$checked" -gt 0 ] || { echo "check_layer_includes: no layer given"; exit 2; }
echo "check_layer_includes: each layer compiles its own headers and $checked includes that run up or sideways do not compile"
