#!/usr/bin/env bash
# The directory graph has no cycles: core/ and kernels/ include nothing from the parts
# built on them (autocast/, nn/ with its optim and data headers, wrappers/) nor the
# umbrella header that includes all of those. Every file under core/ and kernels/ is
# scanned; each offending include is printed with its file and line, and the check fails.
#
# Usage: check_layers.sh <repo>         scan the repository
#        check_layers.sh --self-test <work-dir>
#                                       prove the scan catches a planted include (and
#                                       passes a clean tree), so that a green check means
#                                       something
set -euo pipefail

pattern='^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]ampgrad/((autocast|nn|optim|data|wrappers)/|ampgrad\.h)'

scan() {
  local root=$1 dir hits
  for dir in core kernels; do
    [ -d "$root/$dir" ] || { echo "check_layers: $root/$dir is missing" >&2; return 2; }
  done
  hits=$(cd "$root" && grep -rnE "$pattern" core kernels || true)
  if [ -n "$hits" ]; then
    echo "check_layers: core/ and kernels/ must not include autocast/, nn/, optim/, data/, wrappers/ or ampgrad/ampgrad.h:"
    echo "$hits"
    return 1
  fi
  echo "check_layers: $(find "$root/core" "$root/kernels" -type f | wc -l) files under core/ and kernels/ include nothing above them"
}

if [ "${1:-}" = --self-test ]; then
  work=$2
  rm -rf "$work" && mkdir -p "$work/core/src" "$work/kernels/cpu"
  printf '#include "ampgrad/tensor.h"\n' >"$work/core/src/clean.cpp"
  printf '#include <cstdint>\n' >"$work/kernels/cpu/clean.h"
  scan "$work" >/dev/null || { echo "self-test: a clean tree was rejected"; exit 1; }
  for inc in '"ampgrad/autocast/autocast.h"' '<ampgrad/nn/module.h>' '"ampgrad/optim/optimizer.h"' \
             '"ampgrad/data/dataset.h"' '  #  include "ampgrad/wrappers/lite.h"' '<ampgrad/ampgrad.h>'; do
    case $inc in *include*) line=$inc ;; *) line="#include $inc" ;; esac
    printf '%s\n' "$line" >"$work/kernels/cpu/bad.cu"
    if out=$(scan "$work"); then echo "self-test: missed $line"; exit 1; fi
    grep -q "kernels/cpu/bad.cu:1:" <<<"$out" || { echo "self-test: the report does not name the file: $out"; exit 1; }
  done
  echo "self-test: every planted include was caught and named"
  exit 0
fi

scan "${1:?usage: check_layers.sh <repo> | --self-test <work-dir>}"
