#!/usr/bin/env bash
# The layers include downwards only. From the bottom:
#   core/      tensors, autograd, the op frontend, the dispatch hook (ampgrad/*.h, ops/, hw/)
#   kernels/   the CPU and CUDA backends, on core
#   autocast/  the policy and the cast hook (ampgrad/autocast/), on core
#   nn/        modules, optimizers and the grad scaler, data (ampgrad/nn/, optim/, data/),
#              on core and autocast
#   dist/      the process group over MPI and NCCL, the gradient reducer (ampgrad/dist/),
#              on core
#   wrappers/  precision plugins, Lite (ampgrad/wrappers/), on all of them
# and the umbrella header include/ampgrad/ampgrad.h, which no part of the library includes.
# Beside them, kernels/reference/ (the float64 reference kernels, ampgrad/reference/): the
# tests' oracle and reading material, which no layer includes, and which includes nothing
# but the standard library and its own headers.
# Every file of each layer is scanned for a public header of a layer above it; each offending
# include is printed with its file and line, and the check fails. (The private folders,
# core/src and kernels/, are on the include path of their own layer's sources only: the
# build refuses a reach into them.)
#
# Usage: check_layers.sh <repo>         scan the repository
#        check_layers.sh --self-test <work-dir>
#                                       prove the scan catches a planted include in each
#                                       layer (and passes a clean tree), so that a green
#                                       check means something
set -euo pipefail

# layer folder -> the public header folders above it (ampgrad/<name>/), and the umbrella
layers=(core kernels autocast nn dist wrappers)
# (reference is in every list: no layer includes the reference kernels)
declare -A above=(
  [core]="autocast nn optim data dist wrappers reference"
  [kernels]="autocast nn optim data dist wrappers reference"
  [autocast]="nn optim data dist wrappers reference"
  [nn]="dist wrappers reference"
  [dist]="autocast nn optim data wrappers reference"
  [wrappers]="reference"
)
reference=kernels/reference

scan() {
  local root=$1 dir hits all="" n=0 alternatives pattern
  for dir in "${layers[@]}"; do
    [ -d "$root/$dir" ] || { echo "check_layers: $root/$dir is missing" >&2; return 2; }
    alternatives=$(tr ' ' '|' <<<"${above[$dir]}")
    if [ -n "$alternatives" ]; then
      pattern="^[[:space:]]*#[[:space:]]*include[[:space:]]*[<\"]ampgrad/((${alternatives})/|ampgrad\\.h)"
    else
      pattern="^[[:space:]]*#[[:space:]]*include[[:space:]]*[<\"]ampgrad/ampgrad\\.h"
    fi
    # ... and the reference's folder by its path (kernels/ is on the kernels' include path)
    pattern="$pattern|^[[:space:]]*#[[:space:]]*include[[:space:]]*[<\"]([^\">]*/)?reference/include/"
    hits=$(cd "$root" && grep -rnE "$pattern" "$dir" | grep -v "^$reference/" || true)
    if [ -n "$hits" ]; then
      all+="$dir/ may include nothing of: ${above[$dir]:-}${above[$dir]:+ or }the umbrella ampgrad/ampgrad.h"$'\n'"$hits"$'\n'
    fi
    n=$((n + $(find "$root/$dir" -type f | wc -l)))
  done
  # the reference: <header> of the standard library (no slash) or ampgrad/reference/, nothing else
  [ -d "$root/$reference" ] || { echo "check_layers: $root/$reference is missing" >&2; return 2; }
  hits=$(cd "$root" && grep -rnE '^[[:space:]]*#[[:space:]]*include' "$reference" |
    grep -vE '#[[:space:]]*include[[:space:]]*(<[^/>]+>|[<"]ampgrad/reference/[^/">]+[">])' || true)
  if [ -n "$hits" ]; then
    all+="$reference/ may include only the standard library and ampgrad/reference/"$'\n'"$hits"$'\n'
  fi
  if [ -n "$all" ]; then
    echo "check_layers: an include runs up the layers:"
    printf '%s' "$all"
    return 1
  fi
  echo "check_layers: $n files under ${layers[*]} include nothing above their layer, and $reference/ nothing of the library"
}

if [ "${1:-}" = --self-test ]; then
  work=$2
  rm -rf "$work"
  for dir in "${layers[@]}" "$reference"; do mkdir -p "$work/$dir/src"; done
  printf '#include <cmath>\n#include "ampgrad/reference/norm.h"\n' >"$work/$reference/src/clean.cpp"
  printf '#include "ampgrad/tensor.h"\n' >"$work/core/src/clean.cpp"
  printf '#include <cstdint>\n#include "ampgrad/backend.h"\n' >"$work/kernels/src/clean.h"
  printf '#include "ampgrad/autocast/autocast.h"\n' >"$work/nn/src/clean.cpp"
  printf '#include "ampgrad/dist/distributed.h"\n' >"$work/dist/src/clean.cpp"
  printf '#include "ampgrad/optim/grad_scaler.h"\n#include "ampgrad/dist/distributed.h"\n' >"$work/wrappers/src/clean.cpp"
  scan "$work" >/dev/null || { echo "self-test: a clean tree was rejected"; exit 1; }
  # one planted include per case: the layer, then the line
  cases=(
    'core|#include "ampgrad/autocast/autocast.h"'
    'kernels|#include <ampgrad/nn/module.h>'
    'kernels|  #  include "ampgrad/wrappers/lite.h"'
    'autocast|#include "ampgrad/optim/optimizer.h"'
    'autocast|#include "ampgrad/data/dataset.h"'
    'nn|#include "ampgrad/wrappers/precision.h"'
    'nn|#include "ampgrad/dist/distributed.h"'
    'dist|#include "ampgrad/nn/module.h"'
    'dist|#include "ampgrad/wrappers/lite.h"'
    'wrappers|#include <ampgrad/ampgrad.h>'
    'core|#include "ampgrad/reference/norm.h"'
    'kernels|#include "ampgrad/reference/softmax.h"'
    'kernels|#include "reference/include/ampgrad/reference/norm.h"'
    'dist|#include "../../kernels/reference/include/ampgrad/reference/norm.h"'
    'nn|#include <ampgrad/reference/optim.h>'
    'wrappers|#include "ampgrad/reference/loss.h"'
    "$reference|#include \"ampgrad/tensor.h\""
    "$reference|#include <ampgrad/optim/optimizer.h>"
    "$reference|#include \"cpu/vec.h\""
    "$reference|#include \"norm.h\""
  )
  for c in "${cases[@]}"; do
    dir=${c%%|*} line=${c#*|}
    printf '%s\n' "$line" >"$work/$dir/src/bad.cu"
    if out=$(scan "$work"); then echo "self-test: missed '$line' in $dir/"; exit 1; fi
    grep -q "^$dir/src/bad.cu:1:" <<<"$out" || { echo "self-test: the report does not name the file: $out"; exit 1; }
    rm "$work/$dir/src/bad.cu"
  done
  echo "self-test: every planted include was caught and named (${#cases[@]} cases)"
  exit 0
fi

scan "${1:?usage: check_layers.sh <repo> | --self-test <work-dir>}"
