#!/usr/bin/env bash
# Usage: run.sh install <build-dir> <work-dir> | run.sh subdirectory <repo> <work-dir>
# Checks that a separate project builds against ampgrad and runs.
set -euo pipefail
mode=$1 src=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(cd "$here/../.." && pwd)} CCACHE_NOHASHDIR=true
if [ "$mode" = install ]; then
  cmake --install "$src" --prefix "$work/prefix" >/dev/null
  cmake -S "$here" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
else
  cmake -S "$here" -B "$work/build" -DAMPGRAD_SOURCE_DIR="$src" -DAMPGRAD_ONEDNN=OFF -DAMPGRAD_CUDA=OFF >/dev/null
fi
cmake --build "$work/build" -j 2 >/dev/null
"$work/build/consumer"
