// A random-graph gradient fuzzer for autograd: seeded random programs (DAGs of 3 to 30
// differentiable ops that reuse intermediate tensors and mix leaves that require grad with
// leaves that do not), checked in float64 against central finite differences, in float32
// against float64 and in bfloat16 under autocast against float32; a failing program is
// shrunk to the fewest ops that still fail and printed as a C++ test to paste.
//
// A program is a list of ops, each defining values v0, v1, ... (a leaf is an op without
// inputs that carries its data). Its text form, one op a line, is what the fuzzer prints
// and replays (ampgrad_graph_fuzz --replay FILE) and what scripts/graph-fuzz-vs-torch runs
// through PyTorch:
//
//   # ampgrad graph fuzz program, seed 7
//   v0 = leaf kind=float shape=2,3 grad=1 data=0.25,-1.5,1,0.5,2,-0.75
//   v1 = leaf kind=int shape=2,1 data=1,0
//   v2 = sum v0 dims=1 keepdim=1
//   v3 v4 = split v0 size=2 dim=1
//   v5 = gather v3 v1 dim=1        (an op's inputs, then its attributes)
//   out v2 v5 v4
//
// Inputs stay where the ops are smooth (tests/autograd/graph_fuzz.cpp says how), so that
// finite differences and lower precisions are meaningful.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include <ampgrad/ampgrad.h>

namespace agt::graph_fuzz {

struct Op {
  std::string name;  // "leaf", or a name of op_names()
  std::vector<int> in;
  std::vector<int> out;
  std::vector<std::pair<std::string, std::string>> attrs;  // in the order printed

  bool has(const std::string& key) const;
  const std::string& attr(const std::string& key) const;  // throws if missing
  int64_t i(const std::string& key) const;
  double d(const std::string& key) const;
  std::vector<int64_t> iv(const std::string& key) const;  // "" is the empty list
  std::vector<double> dv(const std::string& key) const;
  void set(const std::string& key, const std::string& value);
};

struct Program {
  std::vector<Op> ops;
  std::vector<int> outputs;  // may name a value twice
  uint64_t seed = 0;
};

/// Every op name the generator draws from (each is generated for some seed of the
/// in-suite range; the test checks that).
const std::vector<std::string>& op_names();

/// The program for a seed: the same on every machine.
Program generate(uint64_t seed);

/// Number of ops that are not leaves.
int op_count(const Program& p);

std::string to_text(const Program& p);
/// Parses to_text's form; throws std::runtime_error naming the line.
Program from_text(const std::string& text);
/// The program as a GoogleTest test to paste into a test file: its leaves, a lambda with
/// its ops, and the check of the stage that failed (Outcome::stage).
std::string to_cpp(const Program& p, const std::string& test_name, const std::string& stage);

/// The program's leaves (in the order they are defined) as tensors: floating ones in dtype
/// (requiring grad where the program says), int64 and bool ones as such.
std::vector<ag::Tensor> make_leaves(const Program& p, ag::DType dtype);
/// Runs the ops on the leaves; returns the outputs.
std::vector<ag::Tensor> run(const Program& p, const std::vector<ag::Tensor>& leaves);

/// The gradient fed to output k of a program (shape `shape`), the same in C++ and in the
/// torch script: 0.5 + (a hash of k and the element's index) / 2^32.
ag::Tensor output_gradient(int64_t k, const std::vector<int64_t>& shape, ag::DType dtype);

/// Applied by a program to each value it makes: the identity, or a rounding to a lower
/// precision (compare_dtypes).
using Round = std::function<ag::Tensor(const ag::Tensor&)>;

/// The leaves' gradients of f run in dt against those of a wider run, backward from every
/// output k with output_gradient(k) (a missing gradient counts as zero): dt = kFloat32
/// against float64, or (autocast) under an AutocastGuard to bfloat16 on the CPU with float32
/// leaves against float32. `ref`: the leaves in float64. Normwise per leaf, within
/// tol_for(dt) grown with the op count, plus what rounding every value to dt moves the wider
/// run's gradient (f applies the Round it is given to each value it makes; graph_fuzz.cpp:
/// compare_grads). A leaf whose float64 gradient is 0 is left out.
::testing::AssertionResult compare_dtypes(
    const std::function<std::vector<ag::Tensor>(const std::vector<ag::Tensor>&, const Round&)>& f,
    const std::vector<ag::Tensor>& ref, ag::DType dt, bool autocast, int ops);

struct Outcome {
  bool ok = true;
  // The failing stage: "forward" or "backward" (float64 threw), "float64" (against finite
  // differences), "float32", "bfloat16".
  std::string stage;
  std::string message;
  // Comparisons left out because a lower precision took another branch at a kink (relu,
  // max, ...) than float64 did, where its gradient may rightly differ, or (bfloat16) an op
  // would give rounding noise (a one-hot attention row).
  int skipped_float32 = 0, skipped_bfloat16 = 0;
};

struct CheckOptions {
  bool float32 = true;
  bool bfloat16 = true;  // under autocast; off where the CPU cannot run it
};

/// Every check on a program, in order; the first that fails is the outcome.
Outcome check(const Program& p, const CheckOptions& opts = {});

/// The smallest program reached by dropping outputs and ops (an op is replaced by leaves
/// holding the values it computed, or bypassed by one of its inputs), turning leaves' grad
/// off and rounding their data, while `fails` still says it fails.
Program shrink(const Program& p, const std::function<bool(const Program&)>& fails);

/// check(), and on failure shrink() to a program failing at the same stage, as a report:
/// the seed, the failure, the shrunk program in text and as C++. Empty when it passes.
std::string check_and_report(const Program& p, const CheckOptions& opts, Outcome* outcome = nullptr);

/// Whether the bfloat16 check can run here (autocast to bfloat16 on this CPU).
bool bfloat16_available();

}  // namespace agt::graph_fuzz
