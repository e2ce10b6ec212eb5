// Elementwise math: the vector kernels (SLEEF, cpu/vmath.h) against the scalar functors,
// in the same run, and the per-op cost of the GPT's activation shapes.
//
// <op>/float32/<shape>/<impl>: one ag:: call with grad mode off, allocating its output as
// users call it. impl "ampgrad" runs the vector math at the widest instruction set this CPU
// has (hw::best_vector_math_isa()); "scalar" switches it off for that row
// (hw::set_vector_math_isa("none")), which is how every release before it ran; "copy" is
// the ceiling, x.clone(): one read and one write of the same bytes, no math. Each row's
// "GB/s" counter counts one read and one write per element.
// <op>_fwd_bwd/float32/16x128x256/<impl>: forward and backward of the op on a [16, 128, 256]
// input that requires grad (a GPT-sized activation: batch 16, context 128, width 256), the
// gradient dropped after each iteration: the per-op cost that issue 12 asks to report for
// GELU and softmax, ampgrad against scalar math.
// grain/<op>/1thread: a float32 add (bytes bound) or GELU (tens of cycles per element)
// over 65536 elements on one thread, grad mode off; grain/omp_region/<t>threads: an empty
// `#pragma omp parallel` region on t threads, the fixed cost of going parallel. Splitting n
// elements of per-element cost c over 2 threads saves n c / 2 and costs the region, so a
// loop should go parallel above n = 2 region / c: how kernels/cpu/parallel.h's grains were
// picked (docs/performance-history.md gives the figures).
// Wall-clock time (UseRealTime); threads from OMP_NUM_THREADS, but the grain rows set theirs.
// Any ag::Error becomes SkipWithError so the rest of the program still runs.
#include <benchmark/benchmark.h>

#include <ampgrad/ampgrad.h>

#include <omp.h>

#include <functional>
#include <string>

namespace {

const std::vector<int64_t> kActivation{16, 128, 256};

// Switches the vector math for one row and puts back what was active (AMPGRAD_VMATH's choice,
// if set) when the row ends, also when it ends with an error.
class MathFor {
 public:
  explicit MathFor(const std::string& impl) : before_(ag::hw::vector_math_isa()) {
    ag::hw::set_vector_math_isa(impl == "scalar" ? "none" : ag::hw::best_vector_math_isa());
  }
  ~MathFor() { ag::hw::set_vector_math_isa(before_); }
  MathFor(const MathFor&) = delete;
  MathFor& operator=(const MathFor&) = delete;

 private:
  std::string before_;
};

void set_bytes(benchmark::State& state, int64_t n) {
  state.counters["GB/s"] =
      benchmark::Counter(double(n) * 2 * sizeof(float) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_unary(benchmark::State& state, const std::function<ag::Tensor(const ag::Tensor&)>& op, std::string impl) {
  try {
    const MathFor math(impl);
    ag::NoGradGuard no_grad;
    ag::manual_seed(0);
    const ag::Tensor x = ag::randn(kActivation) * 2.0;
    for (auto _ : state) {
      ag::Tensor y = impl == "copy" ? x.clone() : op(x);
      benchmark::DoNotOptimize(y.unsafe_impl());
    }
    set_bytes(state, x.numel());
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

void BM_fwd_bwd(benchmark::State& state, const std::function<ag::Tensor(const ag::Tensor&)>& op, std::string impl) {
  try {
    const MathFor math(impl);
    ag::EnableGradGuard grad;
    ag::manual_seed(0);
    const ag::Tensor x = (ag::randn(kActivation) * 2.0).requires_grad_();
    const ag::Tensor g = ag::randn(kActivation);
    for (auto _ : state) {
      ag::Tensor y = op(x);
      y.backward(g);
      x.set_grad(ag::Tensor());
    }
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

ag::Tensor gelu(const ag::Tensor& x) { return ag::gelu(x); }
ag::Tensor gelu_tanh(const ag::Tensor& x) { return ag::gelu(x, "tanh"); }
ag::Tensor exp(const ag::Tensor& x) { return ag::exp(x); }
ag::Tensor tanh(const ag::Tensor& x) { return ag::tanh(x); }
ag::Tensor sigmoid(const ag::Tensor& x) { return ag::sigmoid(x); }
ag::Tensor silu(const ag::Tensor& x) { return ag::silu(x); }
ag::Tensor softmax(const ag::Tensor& x) { return ag::softmax(x, -1); }

#define AG_MATH_ROWS(OP)                                                                         \
  BENCHMARK_CAPTURE(BM_unary, OP##_ampgrad, OP, "ampgrad")                                        \
      ->Name(#OP "/float32/16x128x256/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2); \
  BENCHMARK_CAPTURE(BM_unary, OP##_scalar, OP, "scalar")                                          \
      ->Name(#OP "/float32/16x128x256/scalar")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2); \
  BENCHMARK_CAPTURE(BM_unary, OP##_copy, OP, "copy")                                              \
      ->Name(#OP "/float32/16x128x256/copy")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
AG_MATH_ROWS(gelu)
AG_MATH_ROWS(gelu_tanh)
AG_MATH_ROWS(exp)
AG_MATH_ROWS(tanh)
AG_MATH_ROWS(sigmoid)
AG_MATH_ROWS(silu)
#undef AG_MATH_ROWS

#define AG_FWD_BWD_ROWS(OP)                                                                      \
  BENCHMARK_CAPTURE(BM_fwd_bwd, OP##_ampgrad, OP, "ampgrad")                                      \
      ->Name(#OP "_fwd_bwd/float32/16x128x256/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2); \
  BENCHMARK_CAPTURE(BM_fwd_bwd, OP##_scalar, OP, "scalar")                                        \
      ->Name(#OP "_fwd_bwd/float32/16x128x256/scalar")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
AG_FWD_BWD_ROWS(gelu)
AG_FWD_BWD_ROWS(softmax)
#undef AG_FWD_BWD_ROWS

constexpr int64_t kGrainProbe = 65536;

void BM_grain(benchmark::State& state, bool gelu) {
  try {
    const int before = omp_get_max_threads();
    omp_set_num_threads(1);
    ag::NoGradGuard no_grad;
    const ag::Tensor a = ag::randn({kGrainProbe}), b = ag::randn({kGrainProbe});
    for (auto _ : state) {
      ag::Tensor y = gelu ? ag::gelu(a) : ag::add(a, b);
      benchmark::DoNotOptimize(y.unsafe_impl());
    }
    omp_set_num_threads(before);
    state.counters["ns/element"] = benchmark::Counter(double(kGrainProbe) * 1e-9,
                                                      benchmark::Counter::kIsIterationInvariantRate |
                                                          benchmark::Counter::kInvert);
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

void BM_omp_region(benchmark::State& state) {
  const int threads = int(state.range(0));
  int sink = 0;
  for (auto _ : state) {
#pragma omp parallel num_threads(threads)
    {
      benchmark::DoNotOptimize(sink);
    }
  }
}

BENCHMARK_CAPTURE(BM_grain, add, false)->Name("grain/add/1thread")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_grain, gelu, true)->Name("grain/gelu/1thread")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK(BM_omp_region)->Name("grain/omp_region")->Arg(2)->ArgName("threads")->UseRealTime()
    ->Unit(benchmark::kMicrosecond)->MinTime(0.2);

}  // namespace

BENCHMARK_MAIN();
