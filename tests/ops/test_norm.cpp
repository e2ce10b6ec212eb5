// softmax, log_softmax and layer_norm: values against the float64 reference
// (kernels/reference) along every dim and layout the CPU kernel distinguishes (last dim,
// inner columns), stability for large inputs, 16-bit dtypes against float32, gradients by
// finite differences (including the fused weight/bias reduction over many rows), the error
// messages, and each instruction-set variant of the float rows (hw::set_kernel_isa) against
// the reference, forward and backward.
#include <cmath>
#include <limits>

#include "ampgrad/reference/norm.h"
#include "ampgrad/reference/softmax.h"
#include "support/testing.h"

namespace {

using ag::Tensor;

using agt::ref_softmax;

std::vector<double> values_or_empty(const Tensor& t) {
  return t.defined() ? t.to_vector<double>() : std::vector<double>{};
}

// Layer norm over the last `inner` elements, by the float64 reference.
Tensor ref_layer_norm(const Tensor& x, int64_t inner, const Tensor& w, const Tensor& b, double eps) {
  const auto v = x.to_vector<double>();
  const auto y =
      ampgrad::reference::layer_norm(v, int64_t(v.size()) / inner, inner, values_or_empty(w), values_or_empty(b), eps);
  return ag::from_vector<double>(y, x.sizes().vec());
}

// The gradient of softmax (or log-softmax) of x along dim for the incoming gradient g, by
// the float64 reference from its own output.
Tensor ref_softmax_grad(const Tensor& x, const Tensor& g, int64_t dim, bool log) {
  const auto y = ref_softmax(x, dim, log).to_vector<double>(), gv = g.to_vector<double>();
  const agt::Lines l = agt::lines_along(x, dim);
  const auto dx = log ? ampgrad::reference::log_softmax_backward(y, gv, l.outer, l.n, l.inner)
                      : ampgrad::reference::softmax_backward(y, gv, l.outer, l.n, l.inner);
  return ag::from_vector<double>(dx, x.sizes().vec());
}

// Layer norm's gradients {dx, dw, db} over the last `inner` elements for the incoming
// gradient g, by the float64 reference.
std::vector<Tensor> ref_layer_norm_grads(const Tensor& x, const Tensor& w, const Tensor& g, int64_t inner, double eps) {
  const auto v = x.to_vector<double>();
  const auto r = ampgrad::reference::layer_norm_backward(v, g.to_vector<double>(), int64_t(v.size()) / inner, inner,
                                                         w.to_vector<double>(), eps);
  return {ag::from_vector<double>(r.dx, x.sizes().vec()), ag::from_vector<double>(r.dw, {inner}),
          ag::from_vector<double>(r.db, {inner})};
}

}  // namespace

TEST(NormTest, SoftmaxMatchesReferenceAlongEveryDim) {
  ag::manual_seed(11);
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{3, 4, 5}, {2, 50, 37}, {2, 3000}, {7}}) {
    const Tensor x = ag::mul(ag::randn(shape, ag::kFloat64), 3.0);
    for (int64_t dim = -1; dim < int64_t(shape.size()); ++dim)
      for (bool log : {false, true}) {
        SCOPED_TRACE("dim " + std::to_string(dim) + (log ? " log" : ""));
        const Tensor got = log ? ag::log_softmax(x, dim) : ag::softmax(x, dim);
        EXPECT_TRUE(agt::allclose(got, ref_softmax(x, dim, log), 1e-12, 1e-14));
        const Tensor got32 = log ? ag::log_softmax(x.to(ag::kFloat32), dim) : ag::softmax(x.to(ag::kFloat32), dim);
        EXPECT_TRUE(agt::allclose(got32, ref_softmax(x, dim, log), 1e-5, 1e-6));
      }
  }
  // non-contiguous input, and the Tensor methods
  const Tensor nc = agt::non_contiguous(ag::randn({6, 9}, ag::kFloat64));
  EXPECT_TRUE(agt::allclose(nc.softmax(1), ref_softmax(nc, 1, false), 1e-12, 1e-14));
  EXPECT_TRUE(agt::allclose(nc.log_softmax(0), ref_softmax(nc, 0, true), 1e-12, 1e-14));
}

TEST(NormTest, SoftmaxIsStableAndHandlesEdgeCases) {
  const Tensor big = ag::from_vector<float>({1000, 1001, 1002}, {3});
  const auto p = ag::softmax(big, 0).to_vector<double>();
  const auto lp = ag::log_softmax(big, 0).to_vector<double>();
  const double z = 1 + std::exp(-1.0) + std::exp(-2.0);
  EXPECT_NEAR(p[2], 1 / z, 1e-6);
  EXPECT_NEAR(lp[0], -2 - std::log(z), 1e-5);
  const Tensor neg_inf = ag::from_vector<double>({-INFINITY, 0, -INFINITY}, {3});
  EXPECT_EQ(ag::softmax(neg_inf, 0).to_vector<double>(), (std::vector<double>{0, 1, 0}));
  EXPECT_EQ(ag::log_softmax(neg_inf, 0).to_vector<double>()[0], -INFINITY);
  EXPECT_EQ(ag::softmax(ag::scalar_tensor(2.0, ag::kFloat64), 0).item<double>(), 1.0);
  EXPECT_EQ(ag::softmax(ag::zeros({0, 4}), 1).sizes(), (ag::Shape{0, 4}));
  // float32 exponentials across their whole range (down to underflow), in rows and in
  // columns, against double: relative error near float precision, tiny absolute error
  std::vector<double> vals;
  for (double v = -110; v <= 0; v += 0.37) vals.push_back(v);
  vals.push_back(-INFINITY);
  const int64_t n = int64_t(vals.size());
  const Tensor wide = ag::from_vector<double>(vals, {n});
  const Tensor wide32 = wide.to(ag::kFloat32);
  const Tensor ref32 = wide32.to(ag::kFloat64);  // the float inputs, exactly
  EXPECT_TRUE(agt::allclose(ag::softmax(wide32, 0), ref_softmax(ref32, 0, false), 2e-6, 1e-37));
  EXPECT_TRUE(agt::allclose(ag::log_softmax(wide32, 0), ref_softmax(ref32, 0, true), 2e-6, 1e-5));
  const Tensor cols = ag::stack({wide32, ag::add(wide32, 50.0)}, 1);  // [n, 2], dim 0
  EXPECT_TRUE(agt::allclose(ag::softmax(cols, 0), ref_softmax(cols.to(ag::kFloat64), 0, false), 2e-6, 1e-37));
}

TEST(NormTest, SoftmaxHalfWithinToleranceOfFloat32) {
  ag::manual_seed(12);
  for (ag::DType dt : {ag::kFloat16, ag::kBFloat16}) {
    const Tensor xh = ag::randn({4, 40, 20}, ag::kFloat32).to(dt);
    const Tensor x32 = xh.to(ag::kFloat32);
    for (int64_t dim : {2, 1, 0})
      for (bool log : {false, true}) {
        const Tensor got = log ? ag::log_softmax(xh, dim) : ag::softmax(xh, dim);
        EXPECT_EQ(got.dtype(), dt);
        EXPECT_TRUE(agt::allclose(got, log ? ag::log_softmax(x32, dim) : ag::softmax(x32, dim), agt::tol_for(dt)));
      }
    // backward in the half dtype against the float32 gradient
    Tensor a = xh.detach().requires_grad_(), b = x32.detach().requires_grad_();
    const Tensor w = ag::randn({4, 40, 20}, ag::kFloat32);
    ag::sum(ag::mul(ag::softmax(a, 1), w.to(dt))).backward();
    ag::sum(ag::mul(ag::softmax(b, 1), w.to(dt).to(ag::kFloat32))).backward();
    EXPECT_EQ(a.grad().dtype(), dt);
    EXPECT_TRUE(agt::allclose(a.grad(), b.grad(), agt::tol_for(dt).rtol * 4, agt::tol_for(dt).atol));
  }
}

TEST(NormTest, SoftmaxGradcheck) {
  ag::manual_seed(13);
  for (int64_t dim : {0, 1, 2, -1})
    for (bool log : {false, true}) {
      SCOPED_TRACE("dim " + std::to_string(dim) + (log ? " log" : ""));
      auto f = [&](const std::vector<Tensor>& in) { return log ? ag::log_softmax(in[0], dim) : ag::softmax(in[0], dim); };
      EXPECT_TRUE(agt::gradcheck(f, {agt::rand64({3, 4, 5}, -2, 2)}));
      EXPECT_TRUE(agt::gradcheck(f, {agt::non_contiguous(agt::rand64({4, 3, 5}, -2, 2))}));
    }
  // broadcast input and a wide inner block
  EXPECT_TRUE(agt::gradcheck(
      [](const std::vector<Tensor>& in) { return ag::softmax(ag::add(in[0], in[1]), 1); },
      {agt::rand64({2, 6, 20}), agt::rand64({1, 6, 1})}));
}

TEST(NormTest, LayerNormMatchesReference) {
  ag::manual_seed(14);
  const Tensor x = ag::randn({4, 3, 10}, ag::kFloat64);
  const Tensor w = ag::randn({10}, ag::kFloat64), b = ag::randn({10}, ag::kFloat64);
  EXPECT_TRUE(agt::allclose(ag::layer_norm(x, {10}, w, b), ref_layer_norm(x, 10, w, b, 1e-5), 1e-12, 1e-12));
  EXPECT_TRUE(agt::allclose(ag::layer_norm(x, {10}), ref_layer_norm(x, 10, Tensor(), Tensor(), 1e-5), 1e-12, 1e-12));
  EXPECT_TRUE(agt::allclose(ag::layer_norm(x, {10}, w, Tensor(), 0.1), ref_layer_norm(x, 10, w, Tensor(), 0.1), 1e-12, 1e-12));
  const Tensor w2 = ag::randn({3, 10}, ag::kFloat64), b2 = ag::randn({3, 10}, ag::kFloat64);
  EXPECT_TRUE(agt::allclose(ag::layer_norm(x, {3, 10}, w2, b2), ref_layer_norm(x, 30, w2, b2, 1e-5), 1e-12, 1e-12));
  const Tensor nc = agt::non_contiguous(x);
  EXPECT_TRUE(agt::allclose(ag::layer_norm(nc, {10}, w, b), ref_layer_norm(x, 10, w, b, 1e-5), 1e-12, 1e-12));
  // float32, with a large mean: the two-pass variance keeps it accurate
  const Tensor shifted = ag::add(ag::randn({8, 64}, ag::kFloat32), 1000.0);
  EXPECT_TRUE(agt::allclose(ag::layer_norm(shifted, {64}), ref_layer_norm(shifted, 64, Tensor(), Tensor(), 1e-5), 2e-3, 2e-3));
}

TEST(NormTest, LayerNormHalfWithinToleranceOfFloat32) {
  ag::manual_seed(15);
  for (ag::DType dt : {ag::kFloat16, ag::kBFloat16}) {
    const Tensor xh = ag::randn({16, 96}, ag::kFloat32).to(dt);
    const Tensor wh = ag::randn({96}, ag::kFloat32).to(dt), bh = ag::randn({96}, ag::kFloat32).to(dt);
    const Tensor y = ag::layer_norm(xh, {96}, wh, bh);
    EXPECT_EQ(y.dtype(), dt);
    const agt::Tol t = agt::tol_for(dt);
    EXPECT_TRUE(agt::allclose(y, ag::layer_norm(xh.to(ag::kFloat32), {96}, wh.to(ag::kFloat32), bh.to(ag::kFloat32)),
                              t.rtol * 2, t.atol * 4));
    // gradients of all three in the half dtype against float32
    Tensor a = xh.detach().requires_grad_(), aw = wh.detach().requires_grad_(), ab = bh.detach().requires_grad_();
    Tensor c = a.to(ag::kFloat32).detach().requires_grad_(), cw = aw.to(ag::kFloat32).detach().requires_grad_(),
           cb = ab.to(ag::kFloat32).detach().requires_grad_();
    const Tensor g = ag::randn({16, 96}, ag::kFloat32).to(dt);
    ag::layer_norm(a, {96}, aw, ab).backward(g);
    ag::layer_norm(c, {96}, cw, cb).backward(g.to(ag::kFloat32));
    EXPECT_EQ(a.grad().dtype(), dt);
    EXPECT_EQ(aw.grad().dtype(), dt);
    EXPECT_TRUE(agt::allclose(a.grad(), c.grad(), t.rtol * 4, t.atol * 4));
    EXPECT_TRUE(agt::allclose(aw.grad(), cw.grad(), t.rtol * 2, t.atol * 4));
    EXPECT_TRUE(agt::allclose(ab.grad(), cb.grad(), t.rtol * 2, t.atol * 4));
  }
  // mixed dtypes promote together; each gradient comes back in its input's dtype
  Tensor xb = ag::randn({4, 8}, ag::kBFloat16).requires_grad_();
  Tensor wf = ag::ones({8}, ag::kFloat32).requires_grad_();
  const Tensor y = ag::layer_norm(xb, {8}, wf);
  EXPECT_EQ(y.dtype(), ag::kFloat32);
  ag::sum(y).backward();
  EXPECT_EQ(xb.grad().dtype(), ag::kBFloat16);
  EXPECT_EQ(wf.grad().dtype(), ag::kFloat32);
}

TEST(NormTest, LayerNormGradcheck) {
  ag::manual_seed(16);
  const Tensor x = agt::rand64({3, 4, 6}), w = agt::rand64({6}), b = agt::rand64({6});
  EXPECT_TRUE(agt::gradcheck([](const std::vector<Tensor>& in) { return ag::layer_norm(in[0], {6}, in[1], in[2]); },
                             {x, w, b}));
  EXPECT_TRUE(agt::gradcheck([](const std::vector<Tensor>& in) { return ag::layer_norm(in[0], {6}); }, {x}));
  EXPECT_TRUE(agt::gradcheck([](const std::vector<Tensor>& in) { return ag::layer_norm(in[0], {6}, in[1]); },
                             {agt::non_contiguous(agt::rand64({5, 6})), w}));
  EXPECT_TRUE(agt::gradcheck([](const std::vector<Tensor>& in) { return ag::layer_norm(in[0], {4, 6}, in[1], in[2]); },
                             {x, agt::rand64({4, 6}), agt::rand64({4, 6})}));
  // only the parameters need gradients
  const Tensor xc = agt::rand64({3, 6}, -1, 1, false);
  EXPECT_TRUE(agt::gradcheck([&](const std::vector<Tensor>& in) { return ag::layer_norm(xc, {6}, in[0], in[1]); },
                             {w, b}));
  // a broadcast input
  EXPECT_TRUE(agt::gradcheck(
      [](const std::vector<Tensor>& in) { return ag::layer_norm(ag::add(in[0], in[1]), {6}, in[2]); },
      {agt::rand64({2, 3, 6}), agt::rand64({3, 1}), w}));
}

TEST(NormTest, LayerNormParameterGradientsOverManyRows) {
  // Enough rows that the weight/bias gradients are summed in several chunks.
  ag::manual_seed(17);
  const int64_t rows = 20000, inner = 64;
  Tensor x = ag::randn({rows, inner}, ag::kFloat32);
  Tensor w = ag::randn({inner}, ag::kFloat32).requires_grad_();
  Tensor b = ag::randn({inner}, ag::kFloat32).requires_grad_();
  const Tensor g = ag::randn({rows, inner}, ag::kFloat32);
  ag::layer_norm(x, {inner}, w, b).backward(g);
  const auto xv = x.to_vector<double>(), gv = g.to_vector<double>();
  std::vector<double> gw(inner, 0), gb(inner, 0);
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < inner; ++i) m += xv[size_t(r * inner + i)];
    m /= inner;
    for (int64_t i = 0; i < inner; ++i) v += std::pow(xv[size_t(r * inner + i)] - m, 2);
    const double rs = 1 / std::sqrt(v / inner + 1e-5);
    for (int64_t i = 0; i < inner; ++i) {
      gw[size_t(i)] += gv[size_t(r * inner + i)] * (xv[size_t(r * inner + i)] - m) * rs;
      gb[size_t(i)] += gv[size_t(r * inner + i)];
    }
  }
  EXPECT_TRUE(agt::allclose(w.grad(), ag::from_vector<double>(gw, {inner}), 1e-4, 1e-3));
  EXPECT_TRUE(agt::allclose(b.grad(), ag::from_vector<double>(gb, {inner}), 1e-4, 1e-3));
}

TEST(NormTest, Errors) {
  const Tensor x = ag::ones({2, 3});
  EXPECT_AG_ERROR(ag::layer_norm(x, {4}), "[layer_norm] normalized_shape [4] does not match the trailing dims of the input shape [2, 3]");
  EXPECT_AG_ERROR(ag::layer_norm(x, {2, 2, 3}), "[layer_norm] normalized_shape [2, 2, 3] does not match");
  EXPECT_AG_ERROR(ag::layer_norm(x, {3}, ag::ones({4})), "[layer_norm] weight of shape [4] does not match normalized_shape [3]");
  EXPECT_AG_ERROR(ag::layer_norm(x, {3}, ag::ones({3}), ag::ones({1, 3})), "[layer_norm] bias of shape [1, 3] does not match normalized_shape [3]");
  EXPECT_AG_ERROR(ag::layer_norm(x, {}), "[layer_norm] normalized_shape must not be empty");
  EXPECT_AG_ERROR(ag::layer_norm(ag::ones({2, 3}, ag::kInt64), {3}), "[layer_norm] expected a floating dtype, got int64");
  EXPECT_AG_ERROR(ag::softmax(x, 2), "[softmax] dim 2 is out of range");
  EXPECT_AG_ERROR(ag::log_softmax(x, -3), "[log_softmax] dim -3 is out of range");
  EXPECT_AG_ERROR(ag::softmax(ag::ones({3}, ag::kInt64), 0), "[softmax] expected a floating dtype, got int64");
}

// layer_norm_to is the float32 norm and the cast after it, in one pass each way on the CPU:
// output and every gradient must be those of the two ops bit for bit, with and without the
// affine parameters, for both 16-bit dtypes, rows of several lengths (vector tails too).
TEST(NormTest, LayerNormToIsTheNormThenTheCastBitForBit) {
  ASSERT_TRUE(ag::backend(ag::kCPU, "test").layer_norm_narrows());
  for (ag::DType dt : {ag::kBFloat16, ag::kFloat16})
    for (int64_t inner : {int64_t(128), int64_t(37), int64_t(384)})
      for (int affine = 0; affine < 3; ++affine) {
        SCOPED_TRACE(std::string(ag::dtype_name(dt)) + " inner " + std::to_string(inner) + " affine " +
                     std::to_string(affine));
        ag::manual_seed(uint64_t(inner + affine));
        const Tensor x0 = ag::randn({3, 50, inner}) * 2.0f + 0.5f;
        const Tensor w0 = affine >= 1 ? ag::randn({inner}) : Tensor(), b0 = affine == 2 ? ag::randn({inner}) : Tensor();
        const Tensor g = ag::randn({3, 50, inner}).to(dt);
        auto run = [&](bool fused) {
          Tensor x = x0.clone().requires_grad_();
          Tensor w = w0.defined() ? w0.clone().requires_grad_() : Tensor();
          Tensor b = b0.defined() ? b0.clone().requires_grad_() : Tensor();
          Tensor y = fused ? ag::layer_norm_to(x, {inner}, w, b, 1e-5, dt) : ag::layer_norm(x, {inner}, w, b).to(dt);
          y.backward(g);
          return std::vector<Tensor>{y.detach(), x.grad(), w.defined() ? w.grad() : Tensor(), b.defined() ? b.grad() : Tensor()};
        };
        const auto fused = run(true), two_ops = run(false);
        for (size_t i = 0; i < fused.size(); ++i) {
          ASSERT_EQ(fused[i].defined(), two_ops[i].defined()) << i;
          if (fused[i].defined()) EXPECT_TRUE(agt::same_bits(fused[i], two_ops[i])) << "result " << i;
        }
        EXPECT_EQ(fused[0].dtype(), dt);
        EXPECT_EQ(fused[1].dtype(), ag::kFloat32);
      }
}

// 16-bit and float64 inputs: cast to float32 as autocast's row would (16-bit), or kept
// (float64, composed); and the out dtype must be a 16-bit one.
TEST(NormTest, LayerNormToOtherInputDtypesAndErrors) {
  ag::manual_seed(5);
  const Tensor x = ag::randn({4, 16});
  const Tensor w = ag::randn({16}, ag::kBFloat16);
  EXPECT_TRUE(agt::same_bits(ag::layer_norm_to(x.to(ag::kBFloat16), {16}, w, Tensor(), 1e-5, ag::kBFloat16),
                        ag::layer_norm(x.to(ag::kBFloat16).to(ag::kFloat32), {16}, w.to(ag::kFloat32)).to(ag::kBFloat16)));
  EXPECT_TRUE(agt::same_bits(ag::layer_norm_to(x.to(ag::kFloat64), {16}, Tensor(), Tensor(), 1e-5, ag::kFloat16),
                        ag::layer_norm(x.to(ag::kFloat64), {16}).to(ag::kFloat16)));
  EXPECT_AG_ERROR(ag::layer_norm_to(x, {16}, Tensor(), Tensor(), 1e-5, ag::kFloat32),
                  "[layer_norm_to] out_dtype must be float16 or bfloat16, got float32");
  EXPECT_AG_ERROR(ag::layer_norm_to(x, {8}, Tensor(), Tensor(), 1e-5, ag::kBFloat16),
                  "[layer_norm] normalized_shape [8] does not match");
}

// ---- each instruction-set variant -----------------------------------------------------
// The float rows (float32, and 16-bit inputs widened to float) have an AVX-512 variant and
// the baseline one (norm.cpp); each level this CPU runs is forced in turn. Inputs of each
// dtype are compared with float64 loops on the same rounded values, forward and backward,
// and with the baseline variant bit for bit: the variants do the same arithmetic (no
// contraction, fixed lanes), so any difference is a variant's own bug. Row lengths go
// around the 16-lane vectors (tails of 1, 15 and 17), and dims that are not the last take
// the column blocks (16 columns and a remainder).

namespace {

class NormEachIsa : public agt::EachKernelIsa {};

// Tolerances for a float32 result built from sums of n terms (fp32_tol), or a 16-bit one
// (the dtype's, four times the relative part for a gradient computed from a rounded output).
agt::Tol row_tol(ag::DType dt, int64_t n, bool gradient) {
  if (dt == ag::kFloat32) return agt::fp32_tol(n);
  const agt::Tol t = agt::tol_for(dt);
  return gradient ? agt::Tol{4 * t.rtol, t.atol} : t;
}

}  // namespace

TEST_P(NormEachIsa, SoftmaxAndLogSoftmaxForwardAndBackwardAgainstFloat64) {
  ag::manual_seed(81);
  struct S {
    std::vector<int64_t> shape;
    int64_t dim;
  };
  const std::vector<S> cases = {{{3, 1}, 1},   {{3, 15}, 1},    {{3, 16}, 1},       {{3, 17}, 1},
                                {{2, 100}, -1}, {{2, 1000}, 1}, {{4, 37, 19}, 1}, {{2, 33, 5}, 0}};
  for (ag::DType dt : {ag::kFloat32, ag::kBFloat16})
    for (const S& c : cases)
      for (bool log : {false, true}) {
        const Tensor x = ag::mul(ag::randn(c.shape, ag::kFloat64), 3.0).to(dt);
        SCOPED_TRACE(::testing::Message() << ag::dtype_name(dt) << " " << x.sizes() << " dim " << c.dim << (log ? " log" : ""));
        const Tensor g = ag::randn(c.shape, ag::kFloat64).to(dt);
        const auto run = [&] {
          Tensor xg = x.detach().requires_grad_();
          const Tensor y = log ? ag::log_softmax(xg, c.dim) : ag::softmax(xg, c.dim);
          y.backward(g);
          return std::vector<Tensor>{y.detach(), xg.grad()};
        };
        const std::vector<Tensor> got = run();
        const Tensor x64 = x.to(ag::kFloat64), g64 = g.to(ag::kFloat64);
        const int64_t n = x.size(c.dim);
        EXPECT_TRUE(agt::allclose(got[0], ref_softmax(x64, c.dim, log), row_tol(dt, n, false))) << "output";
        EXPECT_TRUE(agt::allclose(got[1], ref_softmax_grad(x64, g64, c.dim, log), row_tol(dt, n, true))) << "gradient";
        const std::vector<Tensor> base = agt::at_kernel_isa("baseline", run);
        EXPECT_TRUE(agt::same_bits(got[0], base[0])) << "output against the baseline variant";
        EXPECT_TRUE(agt::same_bits(got[1], base[1])) << "gradient against the baseline variant";
      }
}

TEST_P(NormEachIsa, LayerNormForwardAndBackwardAgainstFloat64) {
  ag::manual_seed(82);
  struct S {
    int64_t rows, inner;
  };
  for (ag::DType dt : {ag::kFloat32, ag::kBFloat16})
    for (const S& c : {S{5, 1}, S{5, 15}, S{5, 16}, S{5, 17}, S{3, 100}, S{2, 1000}, S{700, 33}}) {
      SCOPED_TRACE(std::string(ag::dtype_name(dt)) + " rows " + std::to_string(c.rows) + " inner " + std::to_string(c.inner));
      const Tensor x = ag::add(ag::randn({c.rows, c.inner}, ag::kFloat64), 0.5).to(dt);
      const Tensor w = ag::randn({c.inner}, ag::kFloat64).to(dt), b = ag::randn({c.inner}, ag::kFloat64).to(dt);
      const Tensor g = ag::randn({c.rows, c.inner}, ag::kFloat64).to(dt);
      const auto run = [&] {
        Tensor xg = x.detach().requires_grad_(), wg = w.detach().requires_grad_(), bg = b.detach().requires_grad_();
        const Tensor y = ag::layer_norm(xg, {c.inner}, wg, bg);
        y.backward(g);
        return std::vector<Tensor>{y.detach(), xg.grad(), wg.grad(), bg.grad()};
      };
      const std::vector<Tensor> got = run();
      const Tensor x64 = x.to(ag::kFloat64), w64 = w.to(ag::kFloat64);
      const std::vector<Tensor> grads = ref_layer_norm_grads(x64, w64, g.to(ag::kFloat64), c.inner, 1e-5);
      EXPECT_TRUE(agt::allclose(got[0], ref_layer_norm(x64, c.inner, w64, b.to(ag::kFloat64), 1e-5),
                                row_tol(dt, c.inner, false)))
          << "output";
      EXPECT_TRUE(agt::allclose(got[1], grads[0], row_tol(dt, c.inner, true))) << "input gradient";
      EXPECT_TRUE(agt::allclose(got[2], grads[1], row_tol(dt, c.rows, true))) << "weight gradient";
      EXPECT_TRUE(agt::allclose(got[3], grads[2], row_tol(dt, c.rows, true))) << "bias gradient";
      const std::vector<Tensor> base = agt::at_kernel_isa("baseline", run);
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_TRUE(agt::same_bits(got[i], base[i])) << "result " << i << " (output, dx, dw, db) against the baseline variant";
    }
}

AGT_EACH_KERNEL_ISA(NormEachIsa);
