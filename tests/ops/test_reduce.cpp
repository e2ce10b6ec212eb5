// Reductions: values against the float64 reference (kernels/reference) over every dim set
// and layout (row, column, copied and strided paths of the CPU kernel), accuracy of the
// accumulation, NaN and tie rules, 16-bit dtypes against float32, gradients by finite
// differences, the error messages, and the column sums' instruction-set variants.
#include <omp.h>

#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "ampgrad/reference/reduce.h"
#include "support/testing.h"

namespace {

using ag::Tensor;
using Fn = std::function<double(const std::vector<double>&)>;

// The input's values grouped by output (row-major over the kept dims), each group in
// row-major order over the reduced dims; and the result's shape.
struct Groups {
  std::vector<std::vector<double>> g;
  std::vector<int64_t> shape;
};

Groups group_by_output(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  const auto v = x.to_vector<double>();
  const int64_t nd = x.dim();
  std::vector<bool> red(size_t(nd), dims.empty());
  for (int64_t d : dims) red[size_t((d + nd) % nd)] = true;
  std::vector<int64_t> ks;
  Groups G;
  for (int64_t d = 0; d < nd; ++d) {
    ks.push_back(red[size_t(d)] ? 1 : x.size(d));
    if (!red[size_t(d)] || keepdim) G.shape.push_back(ks.back());
  }
  const int64_t M = std::accumulate(ks.begin(), ks.end(), int64_t(1), std::multiplies<>());
  G.g.resize(size_t(M));
  for (int64_t i = 0; i < int64_t(v.size()); ++i) {
    int64_t rem = i, out = 0, mult = 1;
    for (int64_t d = nd - 1; d >= 0; --d) {
      const int64_t idx = rem % x.size(d);
      rem /= x.size(d);
      if (!red[size_t(d)]) out += idx * mult;
      mult *= ks[size_t(d)];
    }
    G.g[size_t(out)].push_back(v[size_t(i)]);
  }
  return G;
}

Tensor reference(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, const Fn& f) {
  const Groups G = group_by_output(x, dims, keepdim);
  std::vector<double> out;
  for (const auto& g : G.g) out.push_back(f(g));
  return ag::from_vector<double>(out, G.shape);
}

// The float64 reference of each reduction, applied to one group (kernels/reference).
namespace ref = ampgrad::reference;
double r_sum(const std::vector<double>& v) { return ref::sum(v); }
double r_mean(const std::vector<double>& v) { return ref::mean(v); }
Fn r_var(int64_t c) {
  return [c](const std::vector<double>& v) { return ref::var(v, double(c)); };
}
Fn r_ext(bool is_max) {
  return [is_max](const std::vector<double>& v) { return is_max ? ref::max(v) : ref::min(v); };
}
double r_lse(const std::vector<double>& v) { return ref::logsumexp(v); }
Fn r_norm(double p) {
  return [p](const std::vector<double>& v) { return ref::norm(v, p); };
}

// Every differentiable reduction by name, with its reference.
struct Case {
  const char* name;
  std::function<Tensor(const Tensor&, const std::vector<int64_t>&, bool)> op;
  Fn ref;
};

std::vector<Case> cases() {
  return {
      {"sum", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return ag::sum(x, d, k); }, r_sum},
      {"mean", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return ag::mean(x, d, k); }, r_mean},
      {"var", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return ag::var(x, d, 1, k); }, r_var(1)},
      {"var0", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return ag::var(x, d, 0, k); }, r_var(0)},
      {"std", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return ag::std(x, d, 1, k); },
       [](const std::vector<double>& v) { return std::sqrt(r_var(1)(v)); }},
      {"amax", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return ag::amax(x, d, k); }, r_ext(true)},
      {"amin", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return ag::amin(x, d, k); }, r_ext(false)},
      {"logsumexp", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return ag::logsumexp(x, d, k); }, r_lse},
      {"norm1", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return ag::norm(x, 1, d, k); }, r_norm(1)},
      {"norm2", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return ag::norm(x, 2, d, k); }, r_norm(2)},
      {"norm3", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return ag::norm(x, 3, d, k); }, r_norm(3)},
      {"norm_inf", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return ag::norm(x, INFINITY, d, k); },
       r_norm(INFINITY)},
  };
}

const std::vector<std::vector<int64_t>> kDimSets = {{}, {0}, {1}, {2}, {-1}, {0, 2}, {2, 0}, {1, 2}, {0, 1, 2}};

}  // namespace

TEST(ReduceTest, ValuesMatchReferenceForEveryDimSetAndKeepdim) {
  ag::manual_seed(1);
  for (ag::DType dt : {ag::kFloat64, ag::kFloat32}) {
    const Tensor x = ag::randn({3, 4, 5}, dt);
    const agt::Tol tol = dt == ag::kFloat64 ? agt::Tol{1e-12, 1e-12} : agt::Tol{2e-5, 2e-5};
    for (const Case& c : cases())
      for (const auto& dims : kDimSets)
        for (bool keepdim : {false, true}) {
          SCOPED_TRACE(std::string(c.name) + " " + ag::dtype_name(dt) + " dims " + std::to_string(dims.size()) +
                       (keepdim ? " keepdim" : ""));
          const Tensor got = c.op(x, dims, keepdim);
          EXPECT_EQ(got.dtype(), dt);
          EXPECT_TRUE(agt::allclose(got, reference(x, dims, keepdim, c.ref), tol));
        }
  }
}

TEST(ReduceTest, LayoutsMatchReference) {
  // Views chosen to reach each path of the CPU kernel: rows, columns (the bias gradient
  // [N, C] -> [C]), strided long runs, the copy fallback, stride-0 broadcast dims, and the
  // split of a long reduction into chunks.
  ag::manual_seed(2);
  struct L {
    const char* what;
    Tensor x;
    std::vector<int64_t> dims;
  };
  const Tensor base = ag::randn({40, 20, 50}, ag::kFloat64);
  const Tensor base2 = ag::randn({40, 100, 50}, ag::kFloat64);
  const std::vector<L> layouts = {
      {"rows, dim -1", ag::randn({30, 70}, ag::kFloat64), {1}},
      {"columns [N, C] -> [C]", ag::randn({300, 7}, ag::kFloat64), {0}},
      {"columns over 64 wide", ag::randn({50, 150}, ag::kFloat64), {0}},
      {"columns wider than a block, split", ag::randn({600, 2100}, ag::kFloat64), {0}},
      {"middle dim", ag::randn({6, 30, 9}, ag::kFloat64), {1}},
      {"NCHW per channel", ag::randn({4, 3, 6, 7}, ag::kFloat64), {0, 2, 3}},
      {"non-contiguous", agt::non_contiguous(ag::randn({9, 11, 5}, ag::kFloat64)), {1}},
      {"non-contiguous all", agt::non_contiguous(ag::randn({9, 11, 5}, ag::kFloat64)), {}},
      {"copy fallback", base.permute({2, 0, 1}), {2}},
      {"strided long runs", base2.permute({2, 0, 1}), {2}},
      {"narrowed", base.narrow(1, 3, 9), {1, 2}},
      {"broadcast stride 0", ag::randn({1, 5, 1}, ag::kFloat64).expand({4, 5, 6}), {0, 2}},
      {"long full sum (chunked)", ag::randn({300001}, ag::kFloat64), {}},
      {"long columns (chunked)", ag::randn({10000, 40}, ag::kFloat64), {0}},
  };
  for (const L& l : layouts) {
    for (const Case& c : cases()) {
      SCOPED_TRACE(std::string(l.what) + ": " + c.name);
      EXPECT_TRUE(agt::allclose(c.op(l.x, l.dims, false), reference(l.x, l.dims, false, c.ref), 1e-10, 1e-10));
    }
  }
}

TEST(ReduceTest, ArgAndDimExtremaOnLayouts) {
  ag::manual_seed(3);
  const Tensor base = ag::randn({40, 20, 50}, ag::kFloat64);
  for (const Tensor& x : {base, base.permute({2, 0, 1}), agt::non_contiguous(base), base.narrow(2, 5, 30)}) {
    for (int64_t dim = 0; dim < 3; ++dim) {
      auto [v, i] = ag::max(x, dim);
      auto [vn, in] = ag::min(x, dim);
      EXPECT_TRUE(agt::allclose(v, reference(x, {dim}, false, r_ext(true)), 0, 0));
      EXPECT_TRUE(agt::allclose(vn, reference(x, {dim}, false, r_ext(false)), 0, 0));
      EXPECT_TRUE(agt::allclose(ag::gather(x, dim, i.unsqueeze(dim)).squeeze(dim), v, 0, 0));
      EXPECT_TRUE(agt::allclose(ag::gather(x, dim, in.unsqueeze(dim)).squeeze(dim), vn, 0, 0));
      EXPECT_TRUE(agt::allclose(ag::argmax(x, dim), i, 0, 0));
      EXPECT_TRUE(agt::allclose(ag::argmin(x, dim), in, 0, 0));
      // the index itself: a group's elements lie in order along dim
      const auto arg = [](bool is_max) {
        return [is_max](const std::vector<double>& v) { return double(is_max ? ref::argmax(v) : ref::argmin(v)); };
      };
      EXPECT_TRUE(agt::allclose(i, reference(x, {dim}, false, arg(true)), 0, 0));
      EXPECT_TRUE(agt::allclose(in, reference(x, {dim}, false, arg(false)), 0, 0));
    }
  }
}

TEST(ReduceTest, SumIsAccurate) {
  // A bf16 (or fp16) running sum would stop at 256 (2048); accumulation is in float32.
  for (ag::DType dt : {ag::kBFloat16, ag::kFloat16}) {
    const Tensor s = ag::sum(ag::ones({4096}, dt));
    EXPECT_EQ(s.dtype(), dt);
    EXPECT_EQ(s.item<double>(), 4096.0);
    const Tensor cols = ag::sum(ag::ones({4096, 3}, dt), {0});
    EXPECT_EQ(cols.to_vector<double>(), std::vector<double>(3, 4096.0));
    EXPECT_EQ(ag::mean(ag::ones({4096}, dt)).item<double>(), 1.0);
  }
  // float32: a naive running sum of a million 0.1f is off by about 1000; pairwise and
  // compensated summation stays within a few ulps of the exact sum of the float values.
  const double exact = 1e6 * double(0.1f);
  EXPECT_NEAR(ag::sum(ag::full({1000000}, 0.1, ag::kFloat32)).item<double>(), exact, 0.02);
  EXPECT_NEAR(ag::sum(ag::full({1000, 1000}, 0.1, ag::kFloat32), {0, 1}).item<double>(), exact, 0.02);
  const auto cols = ag::sum(ag::full({200000, 3}, 0.1, ag::kFloat32), {0}).to_vector<double>();
  for (double c : cols) EXPECT_NEAR(c, 2e5 * double(0.1f), 0.03);
  // Variance of values with a large offset: the two-pass algorithm keeps it exact.
  const Tensor off = ag::add(ag::from_vector<float>({1, 2, 3, 4}, {4}), 1e4);
  EXPECT_NEAR(ag::var(off).item<double>(), 5.0 / 3.0, 1e-6);
}

TEST(ReduceTest, ResultDoesNotDependOnThreadCount) {
  ag::manual_seed(4);
  const Tensor x = ag::randn({300000}, ag::kFloat32);
  const Tensor c = ag::randn({20000, 10}, ag::kFloat32);
  const Tensor wide = ag::randn({2048, 1536}, ag::kFloat32);  // a bias gradient's shape: wide blocks, split
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const double s1 = ag::sum(x).item<double>(), v1 = ag::var(x).item<double>();
  const auto c1 = ag::sum(c, {0}).to_vector<double>();
  const auto w1 = ag::sum(wide, {0}).to_vector<double>();
  omp_set_num_threads(std::max(2, saved));
  EXPECT_EQ(ag::sum(x).item<double>(), s1);
  EXPECT_EQ(ag::var(x).item<double>(), v1);
  EXPECT_EQ(ag::sum(c, {0}).to_vector<double>(), c1);
  EXPECT_EQ(ag::sum(wide, {0}).to_vector<double>(), w1);
  omp_set_num_threads(saved);
}

TEST(ReduceTest, HalfDtypesWithinToleranceOfFloat32) {
  ag::manual_seed(5);
  for (ag::DType dt : {ag::kFloat16, ag::kBFloat16}) {
    const Tensor xh = ag::randn({6, 33, 10}, ag::kFloat32).to(dt);
    const Tensor x32 = xh.to(ag::kFloat32);  // the same values, computed in float32
    for (const Case& c : cases())
      for (const auto& dims : std::vector<std::vector<int64_t>>{{}, {1}, {0}, {0, 2}})
        for (bool keepdim : {false, true}) {
          SCOPED_TRACE(std::string(c.name) + " " + ag::dtype_name(dt));
          const Tensor got = c.op(xh, dims, keepdim);
          EXPECT_EQ(got.dtype(), dt);
          EXPECT_TRUE(agt::allclose(got, c.op(x32, dims, keepdim), agt::tol_for(dt)));
        }
    // the columns layout over more than one block of 256 columns (widened 4 rows at a time)
    const Tensor wide = ag::randn({37, 300}, ag::kFloat32).to(dt);
    EXPECT_TRUE(agt::allclose(ag::sum(wide, {0}), ag::sum(wide.to(ag::kFloat32), {0}), agt::tol_for(dt)));
    auto [v, i] = ag::max(xh, 1);
    auto [v32, i32] = ag::max(x32, 1);
    EXPECT_TRUE(agt::allclose(v, v32, 0, 0));
    EXPECT_TRUE(agt::allclose(i, i32, 0, 0));
  }
}

TEST(ReduceTest, IntegralAndBool) {
  const Tensor xi = ag::from_vector<int32_t>({1, -2, 3, 4, 5, 6}, {2, 3});
  const Tensor s = ag::sum(xi);
  EXPECT_EQ(s.dtype(), ag::kInt64);
  EXPECT_EQ(s.item<int64_t>(), 17);
  EXPECT_EQ(ag::sum(xi, {0}).to_vector<int64_t>(), (std::vector<int64_t>{5, 3, 9}));
  EXPECT_EQ(ag::sum(xi, {1}, true).sizes(), (ag::Shape{2, 1}));
  const Tensor big = ag::full({3}, 2000000000, ag::kInt32);  // the int64 sum does not overflow
  EXPECT_EQ(ag::sum(big).item<int64_t>(), 6000000000LL);
  const Tensor b = ag::from_vector<bool>({true, false, true, true}, {4});
  EXPECT_EQ(ag::sum(b).dtype(), ag::kInt64);
  EXPECT_EQ(ag::sum(b).item<int64_t>(), 3);
  EXPECT_EQ(ag::amax(xi).dtype(), ag::kInt32);
  EXPECT_EQ(ag::amax(xi).item<int64_t>(), 6);
  EXPECT_EQ(ag::amin(xi, {1}).to_vector<int64_t>(), (std::vector<int64_t>{-2, 4}));
  EXPECT_EQ(ag::argmax(xi, 1).to_vector<int64_t>(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(ag::amax(b).item<double>(), 1.0);
  EXPECT_EQ(ag::amin(b).item<double>(), 0.0);
  EXPECT_AG_ERROR(ag::mean(xi), "[mean] expected a floating dtype, got int32");
  EXPECT_AG_ERROR(ag::var(xi), "[var] expected a floating dtype");
  EXPECT_AG_ERROR(ag::norm(xi), "[norm] expected a floating dtype");
  // logsumexp of integers computes in the default floating dtype, like PyTorch
  const Tensor l = ag::logsumexp(ag::from_vector<int64_t>({0, 0}, {2}), {0});
  EXPECT_EQ(l.dtype(), ag::kFloat32);
  EXPECT_NEAR(l.item<double>(), std::log(2.0), 1e-6);
}

TEST(ReduceTest, NanPropagationAndFirstIndexTies) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor x = ag::from_vector<double>({1, nan, 5, nan, 0}, {5});
  EXPECT_TRUE(std::isnan(ag::max(x).item<double>()));
  EXPECT_TRUE(std::isnan(ag::amin(x).item<double>()));
  EXPECT_EQ(ag::argmax(x, 0).item<int64_t>(), 1);  // NaN is the extreme, its first index wins
  EXPECT_EQ(ag::argmin(x, 0).item<int64_t>(), 1);
  auto [v, i] = ag::max(x, 0);
  EXPECT_TRUE(std::isnan(v.item<double>()));
  EXPECT_EQ(i.item<int64_t>(), 1);
  for (ag::DType dt : {ag::kFloat32, ag::kBFloat16, ag::kFloat64}) {
    const Tensor t = ag::from_vector<double>({2, 7, 7, 1, 1, 7}, {6}, dt);
    EXPECT_EQ(ag::argmax(t, 0).item<int64_t>(), 1);
    EXPECT_EQ(ag::argmin(t, 0).item<int64_t>(), 3);
    EXPECT_EQ(ag::max(t, 0).second.item<int64_t>(), 1);
    EXPECT_EQ(ag::min(t, 0).second.item<int64_t>(), 3);
  }
  // ties across the chunks of a long column reduction still report the first index
  Tensor col = ag::zeros({100000, 3}, ag::kFloat32);
  EXPECT_EQ(ag::argmax(col, 0).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0}));
  Tensor longrow = ag::zeros({200000}, ag::kFloat32);
  EXPECT_EQ(ag::argmax(longrow, 0).item<int64_t>(), 0);
  EXPECT_EQ(ag::argmin(-ag::ones({200000}, ag::kFloat32), 0).item<int64_t>(), 0);
}

TEST(ReduceTest, SpecialValues) {
  const double inf = INFINITY;
  const Tensor x = ag::from_vector<double>({-inf, -inf, 1000, 1000, 0, inf}, {3, 2});
  const auto l = ag::logsumexp(x, {1}).to_vector<double>();
  EXPECT_EQ(l[0], -inf);                       // all -inf
  EXPECT_NEAR(l[1], 1000 + std::log(2.0), 1e-9);  // no overflow
  EXPECT_EQ(l[2], inf);
  EXPECT_EQ(ag::sum(ag::from_vector<float>({1, float(inf), 2}, {3})).item<double>(), inf);
  EXPECT_TRUE(std::isnan(ag::sum(ag::from_vector<float>({float(inf), -float(inf)}, {2})).item<double>()));
  EXPECT_TRUE(std::isnan(ag::var(ag::ones({1}, ag::kFloat64)).item<double>()));  // 0 / (1 - 1)
  EXPECT_EQ(ag::var(ag::ones({1}, ag::kFloat64), {}, 0).item<double>(), 0.0);
  EXPECT_EQ(ag::norm(ag::from_vector<double>({0, 3, 0, -4}, {4}), 0).item<double>(), 2.0);
  EXPECT_EQ(ag::norm(ag::from_vector<double>({1, -3, 2}, {3}), -inf).item<double>(), 1.0);
}

TEST(ReduceTest, EmptyTensors) {
  const Tensor e = ag::zeros({0, 3}, ag::kFloat32);
  EXPECT_EQ(ag::sum(e, {0}).to_vector<double>(), std::vector<double>(3, 0.0));
  EXPECT_EQ(ag::sum(e, {1}).sizes(), (ag::Shape{0}));
  EXPECT_EQ(ag::sum(e).item<double>(), 0.0);
  EXPECT_TRUE(std::isnan(ag::mean(e).item<double>()));
  EXPECT_EQ(ag::logsumexp(e, {0}).to_vector<double>(), std::vector<double>(3, -INFINITY));
  EXPECT_EQ(ag::amax(e, {1}).sizes(), (ag::Shape{0}));  // nothing to reduce per output
  EXPECT_AG_ERROR(ag::amax(e, {0}), "[amax] cannot reduce over dim 0 of size 0");
  EXPECT_AG_ERROR(ag::max(e), "[max] cannot reduce over dim 0 of size 0");
  EXPECT_AG_ERROR(ag::argmax(e, 0), "[argmax] cannot reduce over dim 0");
  EXPECT_AG_ERROR(ag::max(e, 0), "[max] cannot reduce over dim 0");
}

TEST(ReduceTest, ScalarsAndShapes) {
  const Tensor s = ag::scalar_tensor(3.5, ag::kFloat64);
  EXPECT_EQ(ag::sum(s).item<double>(), 3.5);
  EXPECT_EQ(ag::sum(s, {0}).item<double>(), 3.5);
  EXPECT_EQ(ag::amax(s, {-1}, true).dim(), 0);
  EXPECT_EQ(ag::argmax(s, 0).item<int64_t>(), 0);
  EXPECT_EQ(ag::max(s, 0).first.item<double>(), 3.5);
  const Tensor x = ag::ones({2, 3, 4});
  EXPECT_EQ(ag::sum(x, {0, 2}).sizes(), (ag::Shape{3}));
  EXPECT_EQ(ag::sum(x, {0, 2}, true).sizes(), (ag::Shape{1, 3, 1}));
  EXPECT_EQ(ag::mean(x, {-1}).sizes(), (ag::Shape{2, 3}));
  EXPECT_EQ(ag::max(x, 1, true).second.sizes(), (ag::Shape{2, 1, 4}));
  EXPECT_EQ(x.sum().item<double>(), 24.0);
  EXPECT_EQ(x.mean({1}, true).sizes(), (ag::Shape{2, 1, 4}));
}

TEST(ReduceTest, Errors) {
  const Tensor x = ag::ones({2, 3});
  EXPECT_AG_ERROR(ag::sum(x, {1, -1}), "[sum] dim 1 appears more than once");
  EXPECT_AG_ERROR(ag::mean(x, {0, 0}), "[mean] dim 0 appears more than once");
  EXPECT_AG_ERROR(ag::amax(x, {1, 1}), "[amax] dim 1 appears more than once");
  EXPECT_AG_ERROR(ag::sum(x, {2}), "[sum] dim 2 is out of range for a tensor of 2 dims");
  EXPECT_AG_ERROR(ag::argmax(x, -3), "[argmax] dim -3 is out of range");
  EXPECT_AG_ERROR(ag::var(x, {}, -1), "[var] correction must be non-negative, got -1");
  EXPECT_AG_ERROR(ag::norm(x, NAN), "[norm] p must not be NaN");
  EXPECT_AG_ERROR(ag::sum(Tensor()), "[sum] input is an undefined tensor");
}

// ---- gradients --------------------------------------------------------------------------

TEST(ReduceTest, GradcheckEveryOpDimSetAndKeepdim) {
  ag::manual_seed(6);
  for (const Case& c : cases())
    for (const auto& dims : std::vector<std::vector<int64_t>>{{}, {0}, {-1}, {0, 2}, {1, 2}})
      for (bool keepdim : {false, true}) {
        SCOPED_TRACE(std::string(c.name) + " dims " + std::to_string(dims.size()) + (keepdim ? " keepdim" : ""));
        const Tensor x = agt::rand64({3, 4, 5});
        EXPECT_TRUE(agt::gradcheck([&](const std::vector<Tensor>& in) { return c.op(in[0], dims, keepdim); }, {x}));
      }
}

TEST(ReduceTest, GradcheckNonContiguousAndBroadcastInputs) {
  ag::manual_seed(7);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Tensor nc = agt::non_contiguous(agt::rand64({4, 3, 5}));
    ASSERT_FALSE(nc.is_contiguous());
    EXPECT_TRUE(agt::gradcheck([&](const std::vector<Tensor>& in) { return c.op(in[0], {1}, false); }, {nc}));
    // a leaf broadcast inside the graph: its gradient sums over the expanded dims
    const Tensor small = agt::rand64({1, 4, 5});
    EXPECT_TRUE(agt::gradcheck(
        [&](const std::vector<Tensor>& in) { return c.op(ag::mul(in[0].expand({3, 4, 5}), in[1]), {0, 2}, false); },
        {small, agt::rand64({3, 1, 5})}));
  }
}

TEST(ReduceTest, GradcheckMaxMinAlongDim) {
  ag::manual_seed(8);
  for (int64_t dim : {0, 1, -1})
    for (bool keepdim : {false, true}) {
      const Tensor x = agt::rand64({3, 4, 5});
      EXPECT_TRUE(agt::gradcheck([&](const std::vector<Tensor>& in) { return ag::max(in[0], dim, keepdim).first; }, {x}));
      EXPECT_TRUE(agt::gradcheck([&](const std::vector<Tensor>& in) { return ag::min(in[0], dim, keepdim).first; }, {x}));
    }
  const Tensor x = agt::rand64({3, 4});
  EXPECT_TRUE(agt::gradcheck([](const std::vector<Tensor>& in) { return ag::max(in[0]); }, {x}));
  EXPECT_TRUE(agt::gradcheck([](const std::vector<Tensor>& in) { return ag::min(in[0]); }, {x}));
  EXPECT_TRUE(agt::gradcheck([](const std::vector<Tensor>& in) { return ag::norm(in[0], 0.5, {1}); }, {x}));
  EXPECT_TRUE(agt::gradcheck([](const std::vector<Tensor>& in) { return ag::norm(in[0], -INFINITY, {0}); }, {x}));
  EXPECT_TRUE(agt::gradcheck([](const std::vector<Tensor>& in) { return ag::max(in[0].t(), 0).first; },
                             {agt::rand64({4, 6})}));
  auto [v, i] = ag::max(x, 1);
  EXPECT_TRUE(v.requires_grad());
  EXPECT_FALSE(i.requires_grad());
  EXPECT_FALSE(ag::argmax(x, 1).requires_grad());
}

TEST(ReduceTest, GradientTiesAndSingularPoints) {
  // amax/max() split the gradient evenly among ties, like PyTorch; max(x, dim) sends it
  // to the reported (first) index.
  Tensor x = ag::from_vector<double>({1, 3, 3, 2}, {4}).requires_grad_();
  ag::amax(x).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0.5, 0.5, 0}));
  x.set_grad(Tensor());
  ag::max(x).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0.5, 0.5, 0}));
  x.set_grad(Tensor());
  ag::max(x, 0).first.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 1, 0, 0}));
  x.set_grad(Tensor());
  ag::norm(x, INFINITY).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0.5, 0.5, 0}));

  // The 2-norm and std at a constant / zero input: gradient 0, not NaN.
  Tensor z = ag::zeros({3}, ag::kFloat64).requires_grad_();
  ag::norm(z).backward();
  EXPECT_EQ(z.grad().to_vector<double>(), std::vector<double>(3, 0.0));
  Tensor c = ag::full({4}, 2.0, ag::kFloat64).requires_grad_();
  ag::std(c).backward();
  EXPECT_EQ(c.grad().to_vector<double>(), std::vector<double>(4, 0.0));
  // logsumexp of an all -inf slice: gradient 0, not NaN
  Tensor m = ag::full({2}, -INFINITY, ag::kFloat64).requires_grad_();
  ag::logsumexp(m, {0}).backward();
  EXPECT_EQ(m.grad().to_vector<double>(), std::vector<double>(2, 0.0));
}

TEST(ReduceTest, GradientDtypeFollowsInput) {
  for (ag::DType dt : {ag::kFloat32, ag::kBFloat16, ag::kFloat16}) {
    Tensor x = ag::randn({5, 6}, dt).requires_grad_();
    ag::sum(ag::mean(x, {1})).backward();
    EXPECT_EQ(x.grad().dtype(), dt);
    EXPECT_TRUE(agt::allclose(x.grad(), ag::full({5, 6}, 1.0 / 6, ag::kFloat32), agt::tol_for(dt)));
  }
}

// A float column sum ([N, W] -> [W], a bias gradient) steps over four rows at a time in an
// AVX-512 variant or the baseline loop (reduce.cpp); at each level this CPU runs, float32
// and bfloat16 against double loops and bit for bit against the baseline variant (each
// column is rounded alike). Row counts leave 0 to 3 rows after the four-row steps; 2100
// columns span two blocks.
class ReduceEachIsa : public agt::EachKernelIsa {};
TEST_P(ReduceEachIsa, FloatColumnSumsAgainstFloat64) {
  ag::manual_seed(86);
  for (ag::DType dt : {ag::kFloat32, ag::kBFloat16})
    for (int64_t n : {3, 5, 38, 603})
      for (int64_t w : {7, 150, 2100}) {
        SCOPED_TRACE(::testing::Message() << ag::dtype_name(dt) << " [" << n << ", " << w << "]");
        const Tensor x = ag::randn({n, w}, ag::kFloat64).to(dt);
        const auto v = x.to_vector<double>();
        std::vector<double> want(size_t(w), 0.0);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < w; ++j) want[size_t(j)] += v[size_t(i * w + j)];
        const Tensor got = ag::sum(x, {0});
        EXPECT_TRUE(agt::allclose(got, ag::from_vector<double>(want, {w}), dt == ag::kFloat32 ? agt::fp32_tol(n) : agt::tol_for(dt)));
        EXPECT_TRUE(agt::same_bits(got, agt::at_kernel_isa("baseline", [&] { return ag::sum(x, {0}); })));
      }
}
AGT_EACH_KERNEL_ISA(ReduceEachIsa);
