// The elementwise ops that run the vector math kernels (cpu/vmath.h, reached through
// elementwise.cpp's vmath_map), and rsqrt, whose gradient reaches them through pow(y, 3):
// values and gradients in float32, bfloat16 and float16, dense and strided, against float64
// computed here with std:: math in textbook forms (not the library's float64 path, which
// runs the functors of kernels/functors.h, the forms the vector kernels follow). Each case
// runs under every vector math instruction set this CPU has and under "none" (the scalar
// functors, what a build without SLEEF runs). tests/ops/test_vmath.cpp checks the kernels
// themselves over a sweep of float32 inputs; this suite checks what the ops make of them.
#include <gtest/gtest.h>

#include <ampgrad/ampgrad.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "cpu/vmath.h"
#include "support/testing.h"

namespace {

namespace vm = ag::cpu::vmath;
using ag::DType;
using ag::Tensor;

// A float32 ulp relative to the value it is of: at most 2^-23.
constexpr double kUlp32 = 0x1p-23;

// The largest relative error of one rounding to dt (a normal result).
double unit_roundoff(DType dt) {
  switch (dt) {
    case ag::kBFloat16: return 0x1p-8;
    case ag::kFloat16: return 0x1p-11;
    default: return 0x1p-24;
  }
}

// What a result may be off by, relative to the result: `rel` roundings to the storage
// dtype (each of the op's intermediate results is stored; in float32 the count also covers
// the kernel's own rounding, which its ulps include already) and `rel_ulps` float32 ulps of
// the kernels, their stated accuracy (test_vmath.cpp); `abs` and `abs_ulps` the same units
// times the incoming gradient's magnitude (at most 1 here), for a gradient whose error does
// not shrink with the result: a formula that reads a rounded saved output next to a
// cancellation (1 - y^2), or a kernel whose bound is stated that way.
struct Budget {
  double rel, rel_ulps, abs = 0, abs_ulps = 0;
};

agt::Tol tolerance(DType dt, const Budget& b) {
  const double u = unit_roundoff(dt);
  // float16's subnormals (below 2^-14) are 2^-24 apart: a rounding there is off by up to
  // half of that, whatever the result's size.
  const double subnormal = dt == ag::kFloat16 ? b.rel * 0x1p-25 : 0;
  return {b.rel * u + b.rel_ulps * kUlp32, b.abs * u + b.abs_ulps * kUlp32 + subnormal};
}

enum class Layout { Dense, NonContiguous, Narrowed, Stepped };
constexpr Layout kLayouts[] = {Layout::Dense, Layout::NonContiguous, Layout::Narrowed, Layout::Stepped};

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::Dense: return "dense";
    case Layout::NonContiguous: return "non_contiguous";
    case Layout::Narrowed: return "narrowed";
    case Layout::Stepped: return "stepped";
  }
  return "?";
}

// 7 x 301 values of dtype dt, uniform in [lo, hi), in layout l: rows longer than the 16-bit
// dtypes' chunk (256) with tails for every vector width. Dense; column-major
// (agt::non_contiguous); narrowed columns of a wider tensor (rows apart, the first element
// off the vectors' alignment); every other element of a wider tensor (a stride of 2).
Tensor values_in(Layout l, DType dt, double lo, double hi) {
  const auto draw = [&](const std::vector<int64_t>& shape) { return agt::rand64(shape, lo, hi, false).to(dt); };
  switch (l) {
    case Layout::Dense: return draw({7, 301});
    case Layout::NonContiguous: return agt::non_contiguous(draw({7, 301}));
    case Layout::Narrowed: return draw({7, 305}).narrow(1, 3, 301);
    case Layout::Stepped: return draw({7, 301, 2}).narrow(2, 1, 1);
  }
  return {};
}

// f applied to each element of t's values (read in t's index order), as a float64 tensor of t's shape.
Tensor map64(const Tensor& t, const std::function<double(size_t, double)>& f) {
  std::vector<double> v = t.to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i) v[i] = f(i, v[i]);
  return ag::from_vector(v, t.sizes().vec());
}

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }
double gelu_tanh_slope(double x) {
  const double k = std::sqrt(2 / M_PI), c = 0.044715, sech = 1 / std::cosh(k * (x + c * x * x * x));
  return 0.5 * (1 + std::tanh(k * (x + c * x * x * x))) + 0.5 * x * sech * sech * k * (1 + 3 * c * x * x);
}

struct Case {
  std::string name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> f, slope;  // the op and its derivative, in float64
  double lo, hi;                            // the inputs: where the op is smooth and float16 holds the results
  Budget value, grad;
};

Case pow_case(const std::string& name, double e, double lo, Budget grad) {
  return {name, [e](const Tensor& x) { return ag::pow(x, e); }, [e](double x) { return std::pow(x, e); },
          [e](double x) { return e * std::pow(x, e - 1); }, lo, 3, {1, 1}, grad};
}

std::vector<Case> cases() {
  return {
      // gradient g y: y rounded, the product rounded
      {"exp", [](const Tensor& x) { return ag::exp(x); }, [](double x) { return std::exp(x); },
       [](double x) { return std::exp(x); }, -5, 5, {1, 1}, {2, 1}},
      // g / x
      {"log", [](const Tensor& x) { return ag::log(x); }, [](double x) { return std::log(x); },
       [](double x) { return 1 / x; }, 0.05, 20, {1, 1}, {1, 0}},
      // g / (x + 1): the sum rounded, the quotient rounded
      {"log1p", [](const Tensor& x) { return ag::log1p(x); }, [](double x) { return std::log1p(x); },
       [](double x) { return 1 / (1 + x); }, -0.9, 10, {1, 1}, {2, 0}},
      // g (1 - y^2) from the stored y: y's error (a rounding and the kernel's ulp) times 2 y^2 <= 2,
      // and the float32 products of the formula
      {"tanh", [](const Tensor& x) { return ag::tanh(x); }, [](double x) { return std::tanh(x); },
       [](double x) { return 1 / (std::cosh(x) * std::cosh(x)); }, -4, 4, {1, 1}, {1, 0, 2, 4}},
      // g y (1 - y) from the stored y: y's error times |1 - 2y| <= 1, and the formula's products
      {"sigmoid", [](const Tensor& x) { return ag::sigmoid(x); }, sigmoid,
       [](double x) { return sigmoid(x) * (1 - sigmoid(x)); }, -8, 8, {1, 2}, {1, 0, 1, 4}},
      // the gradient kernels are within 4 float32 ulps of the incoming gradient
      {"silu", [](const Tensor& x) { return ag::silu(x); }, [](double x) { return x * sigmoid(x); },
       [](double x) { return sigmoid(x) * (1 + x * (1 - sigmoid(x))); }, -8, 8, {1, 3}, {1, 0, 0, 4}},
      // GELU's tails amplify the rounding of erfc's and exp's argument: 32 ulps down to -4
      {"gelu", [](const Tensor& x) { return ag::gelu(x); }, agt::ref_gelu,
       [](double x) { return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI); },
       -4, 4, {1, 32}, {1, 0, 0, 4}},
      {"gelu_tanh", [](const Tensor& x) { return ag::gelu(x, "tanh"); }, agt::ref_gelu_tanh, gelu_tanh_slope, -4, 4,
       {1, 32}, {1, 0, 0, 4}},
      // g (3 x^2): x x (pow's exact form for 2), the two products, each rounded
      pow_case("pow_3", 3, -3, {3, 0}),
      // g (e x^(e - 1)): pow's ulp, its result and the two products rounded, and e itself
      // (a scalar operand is converted to the tensor's dtype, as its elements are: 0.3 is
      // not a bfloat16)
      pow_case("pow_m1p5", -1.5, 0.1, {4, 1}),
      pow_case("pow_0p3", 0.3, 0.1, {4, 1}),
      pow_case("pow_2p5", 2.5, 0.1, {4, 1}),
      // the value is the functor (a float32 sqrt and quotient); the gradient -g y^3 / 2 triples
      // the stored y's error (a rounding and an ulp), adds pow's ulp, rounds y^3 and the product
      {"rsqrt", [](const Tensor& x) { return ag::rsqrt(x); }, [](double x) { return 1 / std::sqrt(x); },
       [](double x) { return -0.5 / (x * std::sqrt(x)); }, 0.1, 4, {1, 1}, {5, 4}},
  };
}

constexpr DType kDtypes[] = {ag::kFloat32, ag::kBFloat16, ag::kFloat16};

// Each instruction set of the vector math kernels, and none; the set this process ran with
// is restored afterwards.
class VmathReference : public ::testing::TestWithParam<vm::Isa> {
 protected:
  void SetUp() override {
    const vm::Isa isa = GetParam();
    if (isa != vm::Isa::None && vm::best_isa() == vm::Isa::None)
      AGT_SKIP_BUILD() << "this build has no vector math kernels (AMPGRAD_SLEEF=OFF, or not x86-64)";
    if (!vm::supported(isa)) AGT_SKIP_HARDWARE() << "this CPU lacks " << vm::isa_name(isa);
    saved_ = ag::hw::vector_math_isa();
    ag::hw::set_vector_math_isa(vm::isa_name(isa));
    ASSERT_EQ(ag::hw::vector_math_isa(), vm::isa_name(isa));
  }
  void TearDown() override {
    if (!saved_.empty()) ag::hw::set_vector_math_isa(saved_);
  }

 private:
  std::string saved_;
};

TEST_P(VmathReference, UnaryOpsAndTheirGradients) {
  ag::manual_seed(41);
  for (const Case& c : cases())
    for (DType dt : kDtypes)
      for (Layout l : kLayouts) {
        SCOPED_TRACE(c.name + " " + ag::dtype_name(dt) + " " + layout_name(l));
        Tensor x = values_in(l, dt, c.lo, c.hi);
        ASSERT_EQ(x.is_contiguous(), l == Layout::Dense);
        x.requires_grad_(true);
        const Tensor g = values_in(l, dt, -1, 1);
        const Tensor y = c.op(x);
        y.backward(g);
        const std::vector<double> gs = g.to_vector<double>();
        ASSERT_EQ(y.dtype(), dt);
        ASSERT_EQ(x.grad().dtype(), dt);
        EXPECT_TRUE(agt::allclose(y, map64(x, [&](size_t, double v) { return c.f(v); }), tolerance(dt, c.value)));
        EXPECT_TRUE(agt::allclose(x.grad(), map64(x, [&](size_t i, double v) { return gs[i] * c.slope(v); }),
                                  tolerance(dt, c.grad)));
      }
}

// pow of two tensors (the binary kernel) and both its gradients.
TEST_P(VmathReference, PowOfTwoTensorsAndItsGradients) {
  ag::manual_seed(42);
  for (DType dt : kDtypes)
    for (Layout l : kLayouts) {
      SCOPED_TRACE(std::string(ag::dtype_name(dt)) + " " + layout_name(l));
      Tensor a = values_in(l, dt, 0.5, 2), b = values_in(l, dt, -2, 3);
      a.requires_grad_(true);
      b.requires_grad_(true);
      const Tensor g = values_in(l, dt, -1, 1);
      const Tensor y = ag::pow(a, b);
      y.backward(g);
      const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>(), gs = g.to_vector<double>();
      EXPECT_TRUE(agt::allclose(y, map64(a, [&](size_t i, double v) { return std::pow(v, bv[i]); }),
                                tolerance(dt, {1, 1})));
      // g b a^(b - 1): the stored b - 1 is off by a rounding of up to 3, which |ln a| <= ln 2
      // turns into 2.1 roundings of the power; pow's ulp, its result and the two products rounded
      EXPECT_TRUE(agt::allclose(a.grad(), map64(a, [&](size_t i, double v) { return gs[i] * bv[i] * std::pow(v, bv[i] - 1); }),
                                tolerance(dt, {6, 1})));
      // g a^b ln a: the stored a^b and ln a (a rounding and an ulp each), the two products rounded
      EXPECT_TRUE(agt::allclose(b.grad(), map64(b, [&](size_t i, double) { return gs[i] * std::pow(av[i], bv[i]) * std::log(av[i]); }),
                                tolerance(dt, {4, 2})));
    }
}

INSTANTIATE_TEST_SUITE_P(Isa, VmathReference,
                         ::testing::Values(vm::Isa::None, vm::Isa::Sse2, vm::Isa::Avx2, vm::Isa::Avx512),
                         [](const auto& info) { return std::string(vm::isa_name(info.param)); });

}  // namespace
