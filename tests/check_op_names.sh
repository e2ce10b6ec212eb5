#!/usr/bin/env bash
# Ops are named by the registry's constants (ampgrad/op_ids.h), so a misspelled op name in an
# op, an error or an autocast policy row does not compile: a file that names op::matmul
# compiles with core's headers, one that names op::matmull fails, and the compiler's message
# names the misspelling.
#
# Usage: check_op_names.sh <c++ compiler> <work-dir> <core include dir>
set -euo pipefail

cxx=$1 work=$2 inc=$3
mkdir -p "$work"

probe() {  # probe <op name>: compiles a policy-style row naming it
  cat >"$work/probe.cpp" <<CPP
#include <utility>
#include "ampgrad/op_ids.h"
enum class Policy { Lower };
const std::pair<ampgrad::OpName, Policy> row{ampgrad::op::$1, Policy::Lower};
CPP
  "$cxx" -std=c++20 -fsyntax-only "-I$inc" "$work/probe.cpp" 2>"$work/probe.err"
}

if ! probe matmul; then
  echo "check_op_names: a row naming op::matmul does not compile:"
  cat "$work/probe.err"
  exit 1
fi
if probe matmull; then
  echo "check_op_names: a row naming op::matmull compiles; misspelled op names would go unnoticed"
  exit 1
fi
grep -q "matmull" "$work/probe.err" || { echo "check_op_names: op::matmull failed otherwise:"; cat "$work/probe.err"; exit 1; }
echo "check_op_names: op::matmul compiles and the misspelled op::matmull does not"
