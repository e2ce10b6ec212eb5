// Test helpers shared by the suites: dtype-aware closeness, a finite-difference gradient
// check, non-contiguous inputs, and error-message assertions.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <ampgrad/ampgrad.h>

namespace agt {

/// Tolerances by dtype: |got - ref| <= atol + rtol * |ref|, with rtol near the dtype's
/// unit roundoff (2^-8 for bfloat16, 2^-11 for float16).
struct Tol {
  double rtol;
  double atol;
};
Tol tol_for(ag::DType dt);

/// Elementwise closeness of two tensors of one shape (any dtypes, compared in float64);
/// NaNs must match NaNs. The failure message names the worst element.
::testing::AssertionResult allclose(const ag::Tensor& got, const ag::Tensor& ref, double rtol,
                                    double atol);
inline ::testing::AssertionResult allclose(const ag::Tensor& got, const ag::Tensor& ref, Tol t) {
  return allclose(got, ref, t.rtol, t.atol);
}
/// The same dtype, shape and bytes (for results that must match bit for bit; -0 and +0
/// or two NaNs with different payloads differ here, unlike allclose(..., 0, 0)).
::testing::AssertionResult same_bits(const ag::Tensor& a, const ag::Tensor& b);

/// Compares the analytical gradient of f (through backward with a random output
/// gradient) with central finite differences, for every input that requires grad.
/// Inputs should be float64.
::testing::AssertionResult gradcheck(
    const std::function<ag::Tensor(const std::vector<ag::Tensor>&)>& f,
    const std::vector<ag::Tensor>& inputs, double eps = 1e-6, double atol = 1e-5,
    double rtol = 1e-4);

/// gradcheck of a function with several outputs: one backward pass from all of them at
/// once (ag::run_backward, a random gradient per output; outputs that do not require grad
/// are left out of it), against finite differences of the same weighted sum. An input that
/// requires grad but receives none counts as a zero gradient, which is what it is when no
/// output depends on it through a differentiable path.
::testing::AssertionResult gradcheck_outputs(
    const std::function<std::vector<ag::Tensor>(const std::vector<ag::Tensor>&)>& f,
    const std::vector<ag::Tensor>& inputs, double eps = 1e-6, double atol = 1e-5,
    double rtol = 1e-4);

/// A tensor with t's values whose strides are not contiguous (a transposed copy viewed
/// back), for testing that ops handle any layout. t must have at least 2 dims.
ag::Tensor non_contiguous(const ag::Tensor& t);

/// The source checkout the tests were built from (for files such as docs/ and scripts/).
std::string source_dir();

using Bytes = std::vector<unsigned char>;

/// Puts the float32 product precision back when the test ends (it is process-wide).
struct Float32MatmulPrecisionGuard {
  std::string before = ag::get_float32_matmul_precision();
  ~Float32MatmulPrecisionGuard() { ag::set_float32_matmul_precision(before); }
};

/// A fresh directory under GoogleTest's temp dir, named after the running test, removed
/// with everything in it when the object goes.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const;
  const std::filesystem::path& path() const { return path_; }
  /// File names in the directory, sorted.
  std::vector<std::string> listing() const;

 private:
  std::filesystem::path path_;
};

void write_bytes(const std::string& path, const Bytes& b);
Bytes read_bytes(const std::string& path);
/// The message of the ag::Error that f throws, or "<no error>".
std::string error_of(const std::function<void()>& f);
/// error_of(f) run in a child process, which the parent kills after `seconds`: then
/// "<timed out>" (f blocked), or "<crashed>". With `unprivileged`, a child running as root
/// first becomes user and group 65534 (nobody), so that file permissions apply to it.
std::string error_in_child(const std::function<void()>& f, int seconds = 20, bool unprivileged = false);
inline bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

/// What made each host sync that f counted (ag::host_sync_count), in order; empty: none.
std::vector<std::string> host_syncs_of(const std::function<void()>& f);

/// float64 tensor of the given shape, uniform in [lo, hi), requiring grad.
ag::Tensor rand64(const std::vector<int64_t>& shape, double lo = -1, double hi = 1,
                  bool requires_grad = true);

/// Tensor of the given shape and dtype, uniform in [-1, 1), not requiring grad.
ag::Tensor randf(const std::vector<int64_t>& shape, ag::DType dt = ag::kFloat32);

/// act(x @ w^T + b) in float64 loops, the independent reference for linear and its fused
/// forms: x [..., K], w [N, K], b [N] or undefined; act maps each sum (empty: none). The
/// result is float64 of shape [..., N].
ag::Tensor ref_linear(const ag::Tensor& x, const ag::Tensor& w, const ag::Tensor& b,
                      const std::function<double(double)>& act = {});

/// GELU in float64, in its textbook forms 0.5 x (1 + erf(x / sqrt2)) and
/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): the reference wherever GELU is checked
/// (the library's kernels compute other forms of the same functions).
double ref_gelu(double x);
double ref_gelu_tanh(double x);

/// x viewed as [outer, n, inner] around dim (n = x.size(dim)): the layout the reference
/// kernels (kernels/reference, ampgrad/reference/*.h) take for an op along one dim. A
/// 0-dim x is one line of one value.
struct Lines {
  int64_t outer, n, inner;
};
Lines lines_along(const ag::Tensor& x, int64_t dim);

/// Softmax (or log-softmax) of x along dim by the float64 reference
/// (ampgrad/reference/softmax.h); the result is float64.
ag::Tensor ref_softmax(const ag::Tensor& x, int64_t dim, bool log);

/// Pearson's statistic: the sum over cells of (observed - expected)^2 / expected.
double chi_square(const std::vector<double>& observed, const std::vector<double>& expected);
/// The value that a chi-square variable with `df` degrees of freedom exceeds with
/// probability `alpha`: the critical value of a test at significance alpha.
double chi_square_critical(int df, double alpha);

/// A TensorDataset of n examples, row i of the inputs (i, -i) and target i: a batch shows
/// which examples it holds.
std::shared_ptr<ag::data::TensorDataset> numbered(int64_t n);
/// Every batch's target ids in one epoch of `loader` (a dataset from numbered), checking
/// each input row against its target.
std::vector<std::vector<int64_t>> epoch(const ag::data::DataLoader& loader);
/// The batches' ids one after another.
std::vector<int64_t> flat(const std::vector<std::vector<int64_t>>& batches);

/// float32 products against a float64 reference: a K-term dot product's rounding error
/// grows like sqrt(K) times the unit roundoff for random data, and cancellation can make
/// the result much smaller than its terms, so the absolute tolerance grows with sqrt(K).
Tol fp32_tol(int64_t K);

/// x rounded to TF32 (11 significant bits: 10 stored mantissa bits), to nearest with ties
/// away from zero, as cvt.rna.tf32.f32 and the emulated cuBLASLt round; by frexp and
/// std::round, independent of the library.
double tf32(double x);

/// Whether the CPU kernels' instruction-set level in force (ag::hw::kernel_isa()) is `name`
/// or wider (the order of ag::hw::kernel_isas()).
bool kernel_isa_at_least(const std::string& name);

/// f() run at the CPU kernels' level `name` (one this CPU runs), the level in force put
/// back afterwards: a variant's result next to another's.
template <class F>
auto at_kernel_isa(const std::string& name, F&& f) {
  struct Back {
    std::string isa;
    ~Back() { ag::hw::set_kernel_isa(isa); }
  } back{ag::hw::kernel_isa()};
  ag::hw::set_kernel_isa(name);
  return f();
}

/// A test run once per level of the CPU kernels' own variants (ag::hw::kernel_isas():
/// baseline, avx2, avx512, avx512_bf16, amx), instantiated by AGT_EACH_KERNEL_ISA(Fixture):
/// SetUp switches the process to GetParam() with ag::hw::set_kernel_isa, or skips (hardware)
/// with what this CPU lacks where the level is wider than it runs; TearDown switches back.
class EachKernelIsa : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override;
  void TearDown() override;

 private:
  std::string before_;
};

}  // namespace agt

#define AGT_EACH_KERNEL_ISA(Fixture)                                                  \
  INSTANTIATE_TEST_SUITE_P(Isa, Fixture, ::testing::ValuesIn(::ag::hw::kernel_isas()), \
                           [](const ::testing::TestParamInfo<std::string>& i) { return i.param; })

namespace ampgrad::detail {
/// How many CPU primitives (oneDNN) are cached: core/src/internal.h, which is not on the
/// tests' include path.
size_t cpu_primitive_cache_size();
}  // namespace ampgrad::detail

/// Skips, and why a test may skip. Every skip says its reason; `scripts/ctest-summary`
/// prints the reasons after ctest's summary, so nothing skips unseen.
///
///   AGT_SKIP_HARDWARE() << "CPU lacks AVX512-BF16";   // this machine can't: always a skip
///   AGT_SKIP_BUILD() << "built without oneDNN";        // this configuration can't: always a skip
///   AGT_SKIP_UNLESS_CI() << "safetensors missing";     // an install step was missed: a skip
///                                                      // on a developer's machine, a failure
///                                                      // in CI (CI=true), which installs it
namespace agt {
/// True when the environment says CI=true (as .ci/run's caller sets it).
bool in_ci();
}  // namespace agt

#define AGT_SKIP_AS_(kind, label) \
  return ::testing::internal::AssertHelper(kind, __FILE__, __LINE__, label) = ::testing::Message()
#define AGT_SKIP_HARDWARE() AGT_SKIP_AS_(::testing::TestPartResult::kSkip, "Skipped (hardware)")
#define AGT_SKIP_BUILD() AGT_SKIP_AS_(::testing::TestPartResult::kSkip, "Skipped (build configuration)")
#define AGT_SKIP_UNLESS_CI()                                                                           \
  AGT_SKIP_AS_(::agt::in_ci() ? ::testing::TestPartResult::kFatalFailure : ::testing::TestPartResult::kSkip, \
               ::agt::in_ci() ? "CI=true, where this test must run, but it would skip" : "Skipped (not installed)")

/// Expects `stmt` to throw ag::Error whose message contains `substr`.
#define EXPECT_AG_ERROR(stmt, substr)                                                   \
  do {                                                                                 \
    try {                                                                              \
      stmt;                                                                            \
      ADD_FAILURE() << "expected ag::Error containing \"" << (substr) << "\" from " #stmt; \
    } catch (const ag::Error& e_) {                                                    \
      EXPECT_NE(std::string(e_.what()).find(substr), std::string::npos)                \
          << "message: " << e_.what() << "\nexpected to contain: " << (substr);        \
    }                                                                                  \
  } while (0)
