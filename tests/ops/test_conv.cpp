// conv2d, max_pool2d and avg_pool2d: values against direct float64 loops written here
// (PyTorch's window rules), float64 gradchecks, the 16-bit dtypes against float32, error
// messages, and the oneDNN primitive cache.
#include "support/testing.h"

#include <cmath>
#include <limits>

using namespace ag;
using TL = std::vector<Tensor>;

namespace {

using agt::randf;

struct ConvCase {
  std::vector<int64_t> x;  // N, C, H, W
  int64_t oc, kh, kw;
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups;
  bool bias;
};

// Direct convolution in float64: out[n, o, y, x] = b[o] + sum over the group's input
// channels and the kernel of in[n, c, y*s - p + k*d, ...] * w[o, c, k...].
Tensor ref_conv(const Tensor& x, const Tensor& w, const Tensor& b, const std::vector<int64_t>& st,
                const std::vector<int64_t>& pad, const std::vector<int64_t>& dil, int64_t groups) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t OC = w.size(0), Cg = w.size(1), KH = w.size(2), KW = w.size(3), OCg = OC / groups;
  const int64_t OH = (H + 2 * pad[0] - dil[0] * (KH - 1) - 1) / st[0] + 1;
  const int64_t OW = (W + 2 * pad[1] - dil[1] * (KW - 1) - 1) / st[1] + 1;
  const auto xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const auto bv = b.defined() ? b.to_vector<double>() : std::vector<double>(size_t(OC), 0.0);
  std::vector<double> out(size_t(N * OC * OH * OW));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double s = bv[size_t(o)];
          const int64_t g = o / OCg;
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t kh = 0; kh < KH; ++kh)
              for (int64_t kw = 0; kw < KW; ++kw) {
                const int64_t ih = oh * st[0] - pad[0] + kh * dil[0], iw = ow * st[1] - pad[1] + kw * dil[1];
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                s += xv[size_t(((n * C + g * Cg + c) * H + ih) * W + iw)] * wv[size_t(((o * Cg + c) * KH + kh) * KW + kw)];
              }
          out[size_t(((n * OC + o) * OH + oh) * OW + ow)] = s;
        }
  (void)C;
  return from_vector(out, {N, OC, OH, OW});
}

// PyTorch's pooling output size: floor (or ceil) of the window count, where with ceil_mode
// the last window must start inside the input or its left padding.
int64_t ref_pool_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  const double span = double(in + 2 * p - d * (k - 1) - 1) / double(s);
  int64_t o = int64_t(ceil_mode ? std::ceil(span) : std::floor(span)) + 1;
  if (ceil_mode && (o - 1) * s >= in + p) --o;
  return o;
}

struct PoolCase {
  std::vector<int64_t> x, k, s, p, d;
  bool ceil_mode;
};

// Max pooling (padding never wins) or average pooling (the divisor counts the window
// positions inside the padded input with count_include_pad, else those inside the input).
Tensor ref_pool(const Tensor& x, const PoolCase& c, bool is_max, bool count_include_pad) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t OH = ref_pool_size(H, c.k[0], c.s[0], c.p[0], c.d[0], c.ceil_mode);
  const int64_t OW = ref_pool_size(W, c.k[1], c.s[1], c.p[1], c.d[1], c.ceil_mode);
  const auto xv = x.to_vector<double>();
  std::vector<double> out(size_t(N * C * OH * OW));
  for (int64_t nc = 0; nc < N * C; ++nc)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        double best = -std::numeric_limits<double>::infinity(), sum = 0;
        int64_t inside = 0, padded = 0;
        for (int64_t kh = 0; kh < c.k[0]; ++kh)
          for (int64_t kw = 0; kw < c.k[1]; ++kw) {
            const int64_t ih = oh * c.s[0] - c.p[0] + kh * c.d[0], iw = ow * c.s[1] - c.p[1] + kw * c.d[1];
            if (ih < H + c.p[0] && iw < W + c.p[1]) ++padded;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            const double v = xv[size_t((nc * H + ih) * W + iw)];
            best = std::max(best, v);
            sum += v;
            ++inside;
          }
        out[size_t((nc * OH + oh) * OW + ow)] = is_max ? best : sum / double(count_include_pad ? padded : inside);
      }
  return from_vector(out, {N, C, OH, OW});
}

const std::vector<PoolCase>& pool_cases() {
  static const std::vector<PoolCase> cases = {
      {{2, 3, 8, 8}, {2, 2}, {2, 2}, {0, 0}, {1, 1}, false},
      {{1, 2, 7, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, false},
      {{1, 2, 7, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true},   // ceil_mode adds a window
      {{2, 1, 6, 6}, {3, 2}, {1, 2}, {1, 1}, {1, 1}, true},
      {{1, 2, 10, 9}, {3, 3}, {3, 2}, {0, 1}, {2, 1}, false}, // dilation (max only)
      {{1, 1, 5, 5}, {2, 2}, {2, 2}, {1, 1}, {1, 1}, true},   // the ceil window would start in padding
      {{1, 3, 4, 4}, {4, 4}, {1, 1}, {2, 2}, {1, 1}, false},
  };
  return cases;
}

Tensor conv_of(const ConvCase& c, const Tensor& x, const Tensor& w, const Tensor& b) {
  return conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
}

const std::vector<ConvCase>& conv_cases() {
  static const std::vector<ConvCase> cases = {
      {{2, 3, 7, 6}, 4, 3, 3, {1, 1}, {0, 0}, {1, 1}, 1, true},
      {{1, 4, 9, 8}, 6, 3, 2, {2, 1}, {1, 0}, {1, 1}, 2, true},
      {{2, 4, 10, 10}, 4, 3, 3, {1, 2}, {2, 1}, {2, 1}, 4, false},  // depthwise, dilated
      {{3, 2, 5, 5}, 3, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, true},     // pointwise
      {{2, 6, 8, 7}, 6, 2, 2, {2, 2}, {1, 1}, {1, 2}, 3, true},
      {{1, 1, 4, 4}, 2, 4, 4, {1, 1}, {0, 0}, {1, 1}, 1, false},    // kernel covers the input
      {{2, 3, 6, 6}, 5, 3, 3, {3, 3}, {1, 1}, {1, 1}, 1, true},
      {{4, 8, 12, 12}, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
  };
  return cases;
}

}  // namespace

TEST(Conv, ForwardMatchesReference) {
  manual_seed(31);
  for (const auto& c : conv_cases()) {
    Tensor x = randf(c.x), w = randf({c.oc, c.x[1] / c.groups, c.kh, c.kw});
    Tensor b = c.bias ? randf({c.oc}) : Tensor();
    const double K = double(c.x[1] / c.groups * c.kh * c.kw);
    EXPECT_TRUE(agt::allclose(conv_of(c, x, w, b), ref_conv(x, w, b, c.stride, c.padding, c.dilation, c.groups),
                              1e-5, 4e-6 * std::sqrt(K)))
        << "input " << Shape(c.x) << " groups " << c.groups;
    // float64 runs outside oneDNN (Eigen im2col) in both builds
    Tensor x64 = x.to(kFloat64), w64 = w.to(kFloat64), b64 = c.bias ? b.to(kFloat64) : Tensor();
    EXPECT_TRUE(agt::allclose(conv_of(c, x64, w64, b64),
                              ref_conv(x64, w64, b64, c.stride, c.padding, c.dilation, c.groups), 1e-12, 1e-12));
  }
}

TEST(Conv, UnbatchedAndStridedInputs) {
  manual_seed(32);
  Tensor w = randf({5, 3, 3, 3}), b = randf({5});
  Tensor x3 = randf({3, 8, 7});
  Tensor y3 = conv2d(x3, w, b, {1, 1}, {1, 1});
  EXPECT_EQ(y3.sizes(), std::vector<int64_t>({5, 8, 7}));
  EXPECT_TRUE(agt::allclose(y3, conv2d(x3.unsqueeze(0), w, b, {1, 1}, {1, 1}).squeeze(0), 0, 0));
  // an NHWC tensor viewed as NCHW, and single-value stride/padding lists
  Tensor nhwc = randf({2, 8, 7, 3}).permute({0, 3, 1, 2});
  EXPECT_FALSE(nhwc.is_contiguous());
  EXPECT_TRUE(agt::allclose(conv2d(nhwc, w, b, {2}, {1}), ref_conv(nhwc, w, b, {2, 2}, {1, 1}, {1, 1}, 1), 1e-5, 3e-5));
}

TEST(Conv, Gradcheck) {
  manual_seed(33);
  const std::vector<ConvCase> cases = {
      {{2, 2, 5, 4}, 3, 3, 2, {1, 1}, {0, 0}, {1, 1}, 1, true},
      {{1, 4, 6, 6}, 4, 3, 3, {2, 1}, {1, 1}, {1, 1}, 2, true},
      {{1, 2, 7, 6}, 2, 2, 2, {1, 2}, {1, 0}, {2, 2}, 2, false},
      {{2, 2, 3, 3}, 2, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, true},
  };
  for (const auto& c : cases) {
    Tensor x = agt::rand64(c.x), w = agt::rand64({c.oc, c.x[1] / c.groups, c.kh, c.kw});
    Tensor b = c.bias ? agt::rand64({c.oc}) : Tensor();
    EXPECT_TRUE(agt::gradcheck([&](const TL& in) { return conv_of(c, in[0], in[1], in[2]); }, {x, w, b}))
        << "input " << Shape(c.x) << " groups " << c.groups;
  }
  // only the weight and bias, or only the input, requiring grad
  const ConvCase& c = cases[1];
  Tensor x = agt::rand64(c.x, -1, 1, false), w = agt::rand64({4, 2, 3, 3}), b = agt::rand64({4});
  EXPECT_TRUE(agt::gradcheck([&](const TL& in) { return conv_of(c, in[0], in[1], in[2]); }, {x, w, b}));
  Tensor x2 = agt::rand64(c.x), w2 = agt::rand64({4, 2, 3, 3}, -1, 1, false);
  EXPECT_TRUE(agt::gradcheck([&](const TL& in) { return conv_of(c, in[0], in[1], Tensor()); }, {x2, w2}));
  Tensor x3 = agt::rand64({2, 6, 5}), w3 = agt::rand64({3, 2, 2, 2});  // unbatched
  EXPECT_TRUE(agt::gradcheck([](const TL& in) { return conv2d(in[0], in[1]); }, {x3, w3}));
  // the input and bias, not the weight: the bias gradient alone from backward-weights
  Tensor x4 = agt::rand64(c.x), w4 = agt::rand64({4, 2, 3, 3}, -1, 1, false), b4 = agt::rand64({4});
  EXPECT_TRUE(agt::gradcheck([&](const TL& in) { return conv_of(c, in[0], in[1], in[2]); }, {x4, w4, b4}));
}

TEST(Conv, EmptyBatch) {
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor x = zeros({0, 3, 5, 5}, dt).requires_grad_(), w = randf({4, 3, 3, 3}, dt).requires_grad_();
    Tensor b = randf({4}, dt).requires_grad_();
    Tensor y = conv2d(x, w, b, {1, 1}, {1, 1});
    EXPECT_EQ(y.sizes(), std::vector<int64_t>({0, 4, 5, 5}));
    y.sum().backward();
    EXPECT_EQ(x.grad().sizes(), std::vector<int64_t>({0, 3, 5, 5}));
    EXPECT_TRUE(agt::allclose(w.grad(), zeros({4, 3, 3, 3}, dt), 0, 0));
    EXPECT_TRUE(agt::allclose(b.grad(), zeros({4}, dt), 0, 0));
  }
}

// 16-bit convolutions accumulate in float32 and round once; against the float32 result of
// the same rounded inputs they differ by about one rounding: tol_for(dtype) holds.
TEST(Conv, HalfPrecisionMatchesFloat32) {
  manual_seed(34);
  for (DType dt : {kBFloat16, kFloat16}) {
    for (const auto& c : {conv_cases()[0], conv_cases()[1], conv_cases()[3], conv_cases()[7]}) {
      Tensor x = randf(c.x).to(dt).requires_grad_(), w = randf({c.oc, c.x[1] / c.groups, c.kh, c.kw}).to(dt).requires_grad_();
      Tensor b = c.bias ? randf({c.oc}).to(dt).requires_grad_() : Tensor();
      Tensor xf = x.detach().to(kFloat32).requires_grad_(), wf = w.detach().to(kFloat32).requires_grad_();
      Tensor bf = c.bias ? b.detach().to(kFloat32).requires_grad_() : Tensor();
      Tensor y = conv_of(c, x, w, b), yf = conv_of(c, xf, wf, bf);
      EXPECT_EQ(y.dtype(), dt);
      EXPECT_TRUE(agt::allclose(y, yf, agt::tol_for(dt))) << dtype_name(dt) << " " << Shape(c.x);
      Tensor g = randf(y.sizes().vec()).to(dt);
      y.backward(g);
      yf.backward(g.to(kFloat32));
      EXPECT_EQ(w.grad().dtype(), dt);
      EXPECT_TRUE(agt::allclose(x.grad(), xf.grad(), agt::tol_for(dt))) << dtype_name(dt) << " " << Shape(c.x);
      EXPECT_TRUE(agt::allclose(w.grad(), wf.grad(), agt::tol_for(dt))) << dtype_name(dt) << " " << Shape(c.x);
      if (c.bias) EXPECT_TRUE(agt::allclose(b.grad(), bf.grad(), agt::tol_for(dt))) << dtype_name(dt);
    }
  }
}

// The production kernels against independent results. Float64 takes the loops and Eigen
// path that the gradchecks verify; float32 takes oneDNN (in the full build), and bfloat16
// takes oneDNN's bf16 primitives. So every case's float32 forward and gradients are
// compared with float64 from the same values, and bfloat16's with float32 from the same
// rounded values. Each result is a sum of `terms` products of values in [-1, 1]: float32
// rounding grows like sqrt(terms).
namespace {

struct Grads {
  Tensor y, dx, dw, db;
};

// Forward and backward of one conv case in dtype dt, from the given values.
Grads conv_grads(const ConvCase& c, DType dt, const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& g0) {
  // fresh leaves (detach: `to` returns its input itself when the dtype already matches)
  Tensor x = x0.detach().to(dt).requires_grad_(), w = w0.detach().to(dt).requires_grad_();
  Tensor b = c.bias ? b0.detach().to(dt).requires_grad_() : Tensor();
  Tensor y = conv_of(c, x, w, b);
  y.backward(g0.to(dt));
  return {y, x.grad(), w.grad(), c.bias ? b.grad() : Tensor()};
}

void expect_grads_close(const Grads& got, const Grads& ref, const ConvCase& c, bool half) {
  const Tensor& y = ref.y;
  const double fwd_terms = double(c.x[1] / c.groups * c.kh * c.kw);     // one output
  const double dx_terms = double(c.oc / c.groups * c.kh * c.kw);        // one input element
  const double dw_terms = double(y.size(0) * y.size(2) * y.size(3));    // one weight
  auto tol = [&](double terms) {
    return half ? agt::tol_for(kBFloat16) : agt::Tol{1e-5, 2e-6 * std::sqrt(terms)};
  };
  EXPECT_EQ(got.y.dtype(), half ? kBFloat16 : kFloat32);
  EXPECT_TRUE(agt::allclose(got.y, ref.y, tol(fwd_terms))) << "forward";
  EXPECT_TRUE(agt::allclose(got.dx, ref.dx, tol(dx_terms))) << "input gradient";
  EXPECT_TRUE(agt::allclose(got.dw, ref.dw, tol(dw_terms))) << "weight gradient";
  if (c.bias) EXPECT_TRUE(agt::allclose(got.db, ref.db, tol(dw_terms))) << "bias gradient";
}

}  // namespace

TEST(Conv, EveryCaseFloat32MatchesFloat64AndBFloat16MatchesFloat32) {
  manual_seed(39);
  for (const auto& c : conv_cases()) {
    SCOPED_TRACE("input " + ::testing::PrintToString(c.x) + " groups " + std::to_string(c.groups));
    Tensor x = randf(c.x), w = randf({c.oc, c.x[1] / c.groups, c.kh, c.kw});
    Tensor b = c.bias ? randf({c.oc}) : Tensor();
    Tensor g = randf(conv_of(c, x, w, b).sizes().vec());
    expect_grads_close(conv_grads(c, kFloat32, x, w, b, g), conv_grads(c, kFloat64, x, w, b, g), c, false);
    // bfloat16 against float32 of the same rounded inputs and output gradient
    auto r = [](const Tensor& t) { return t.defined() ? t.to(kBFloat16).to(kFloat32) : t; };
    expect_grads_close(conv_grads(c, kBFloat16, x, w, b, g), conv_grads(c, kFloat32, r(x), r(w), r(b), r(g)), c, true);
  }
}

TEST(Conv, ErrorsNameTheShapes) {
  EXPECT_AG_ERROR(conv2d(zeros({1, 4, 5, 5}), zeros({2, 3, 3, 3})),
                  "[conv2d] input of shape [1, 4, 5, 5] has 4 channels, but weight of shape [2, 3, 3, 3] with groups=1 expects 3");
  EXPECT_AG_ERROR(conv2d(zeros({1, 4, 5, 5}), zeros({3, 2, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 1}, 2),
                  "[conv2d] out_channels 3 of weight of shape [3, 2, 3, 3] is not divisible by groups=2");
  EXPECT_AG_ERROR(conv2d(zeros({1, 1, 4, 4}), zeros({1, 1, 5, 5})),
                  "[conv2d] kernel of shape [1, 1, 5, 5] (dilated size [5, 5]) is larger than the padded input of size [4, 4]");
  EXPECT_AG_ERROR(conv2d(zeros({1, 1, 4, 4}), zeros({1, 1, 3, 3}), Tensor(), {1, 1}, {0, 0}, {2, 2}),
                  "(dilated size [5, 5]) is larger than the padded input of size [4, 4] (input shape [1, 1, 4, 4], padding [0, 0])");
  EXPECT_AG_ERROR(conv2d(zeros({4, 4}), zeros({1, 1, 3, 3})),
                  "[conv2d] expected a 3-D (unbatched) or 4-D (batched) input, got shape [4, 4]");
  EXPECT_AG_ERROR(conv2d(zeros({1, 1, 4, 4}), zeros({1, 3, 3})), "[conv2d] weight must be 4-D");
  EXPECT_AG_ERROR(conv2d(zeros({1, 1, 4, 4}), zeros({2, 1, 3, 3}), zeros({3})), "[conv2d] bias must have shape [2], got [3]");
  EXPECT_AG_ERROR(conv2d(zeros({1, 1, 4, 4}), zeros({2, 1, 3, 3}, kBFloat16)),
                  "[conv2d] expected input, weight and bias to have one dtype, got float32, bfloat16 and no bias");
  EXPECT_AG_ERROR(conv2d(zeros({1, 1, 4, 4}), zeros({2, 1, 3, 3}), Tensor(), {0, 1}), "[conv2d] stride and dilation must be positive");
  EXPECT_AG_ERROR(conv2d(zeros({1, 1, 4, 4}), zeros({2, 1, 3, 3}), Tensor(), {1, 1, 1}), "[conv2d] stride must have 1 or 2 values");
  EXPECT_AG_ERROR(conv2d(zeros({1, 1, 4, 4}, kInt64), zeros({2, 1, 3, 3}, kInt64)), "[conv2d] expected a floating input, got int64");
}

TEST(Conv, RepeatedShapesCreateNoPrimitives) {
  if (!built_with_onednn()) AGT_SKIP_BUILD() << "built without oneDNN: no primitive cache";
  manual_seed(35);
  auto step = [] {
    // shapes no other test uses, so the first step must create primitives
    Tensor x = randf({3, 5, 11, 13}).requires_grad_(), w = randf({7, 5, 3, 3}).requires_grad_();
    Tensor b = randf({7}).requires_grad_();
    Tensor y = max_pool2d(relu(conv2d(x, w, b, {1, 1}, {1, 1})), {2, 2});
    y.sum().backward();
  };
  const size_t before = detail::cpu_primitive_cache_size();
  step();
  const size_t after_first = detail::cpu_primitive_cache_size();
  EXPECT_GT(after_first, before) << "the first step of new shapes must add primitives to the cache";
  for (int i = 0; i < 3; ++i) step();
  EXPECT_EQ(detail::cpu_primitive_cache_size(), after_first);
}

TEST(Pool, MaxAndAvgMatchReference) {
  manual_seed(36);
  const auto& cases = pool_cases();
  for (const auto& c : cases) {
    Tensor x = randf(c.x);
    Tensor m = max_pool2d(x, c.k, c.s, c.p, c.d, c.ceil_mode);
    EXPECT_TRUE(agt::allclose(m, ref_pool(x, c, true, true), 0, 0)) << "max " << Shape(c.x) << " ceil " << c.ceil_mode;
    if (c.d[0] != 1 || c.d[1] != 1) continue;
    for (bool include : {true, false}) {
      Tensor a = avg_pool2d(x, c.k, c.s, c.p, c.ceil_mode, include);
      EXPECT_TRUE(agt::allclose(a, ref_pool(x, c, false, include), 1e-6, 1e-6))
          << "avg " << Shape(c.x) << " ceil " << c.ceil_mode << " include_pad " << include;
    }
  }
  // stride defaults to the kernel size; a 3-D input is one image
  Tensor x = randf({2, 6, 6});
  EXPECT_EQ(max_pool2d(x, {3}).sizes(), std::vector<int64_t>({2, 2, 2}));
  EXPECT_TRUE(agt::allclose(avg_pool2d(x, {2}), avg_pool2d(x.unsqueeze(0), {2, 2}, {2, 2}).squeeze(0), 0, 0));
}

TEST(Pool, Gradcheck) {
  manual_seed(37);
  Tensor x = agt::rand64({2, 2, 7, 6});
  EXPECT_TRUE(agt::gradcheck([](const TL& in) { return max_pool2d(in[0], {3, 2}, {2, 1}, {1, 1}, {1, 2}, true); }, {x}));
  EXPECT_TRUE(agt::gradcheck([](const TL& in) { return max_pool2d(in[0], {2, 2}); }, {x}));
  EXPECT_TRUE(agt::gradcheck([](const TL& in) { return avg_pool2d(in[0], {3, 3}, {2, 2}, {1, 1}, true, true); }, {x}));
  EXPECT_TRUE(agt::gradcheck([](const TL& in) { return avg_pool2d(in[0], {3, 2}, {1, 2}, {1, 1}, true, false); }, {x}));
  Tensor x3 = agt::rand64({2, 5, 5});
  EXPECT_TRUE(agt::gradcheck([](const TL& in) { return avg_pool2d(in[0], {2, 2}, {1, 1}); }, {x3}));
}

TEST(Pool, MaxRoutesGradientToEachWindowsMaximum) {
  // overlapping windows share a maximum, which then receives both gradients
  Tensor x = from_vector<float>({1, 5, 2, 0, 3, 4, 7, 1, 2}, {1, 1, 3, 3}).requires_grad_();
  Tensor y = max_pool2d(x, {2, 2}, {1, 1});
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>({5, 5, 7, 4}));
  y.backward(from_vector<float>({1, 2, 3, 4}, {1, 1, 2, 2}));
  EXPECT_EQ(x.grad().to_vector<float>(), std::vector<float>({0, 3, 0, 0, 0, 4, 3, 0, 0}));
  // NaN wins the window, as in PyTorch
  Tensor n = from_vector<float>({1, NAN, 2, 3}, {1, 1, 2, 2});
  EXPECT_TRUE(std::isnan(max_pool2d(n, {2, 2}).item<double>()));
}

TEST(Pool, MaxWindowWithNoInputTapRoutesNoGradient) {
  // Width 1, kernel 2 with dilation 2 and padding 1: the one window per row taps columns -1
  // and 1, both outside the input. Its output is -inf and its gradient goes nowhere (an index
  // built from the first column tap would land on the next row's element).
  for (DType dt : {kFloat64, kFloat32}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = from_vector<double>({1, 2, 3}, {1, 1, 3, 1}).to(dt).detach().requires_grad_();
    Tensor y = max_pool2d(x, {1, 2}, {1, 1}, {0, 1}, {1, 2});
    ASSERT_EQ(y.sizes(), Shape({1, 1, 3, 1}));
    for (double v : y.to(kFloat64).to_vector<double>()) EXPECT_EQ(v, -INFINITY);
    y.backward(ones_like(y));
    EXPECT_EQ(x.grad().to(kFloat64).to_vector<double>(), std::vector<double>({0, 0, 0}));
  }
}

TEST(Pool, HalfPrecisionMatchesFloat32) {
  manual_seed(38);
  for (DType dt : {kBFloat16, kFloat16}) {
    Tensor x = randf({2, 3, 9, 9}).to(dt).requires_grad_();
    Tensor xf = x.detach().to(kFloat32).requires_grad_();
    Tensor m = max_pool2d(x, {3, 3}, {2, 2}, {1, 1}), mf = max_pool2d(xf, {3, 3}, {2, 2}, {1, 1});
    EXPECT_EQ(m.dtype(), dt);
    EXPECT_TRUE(agt::allclose(m, mf, 0, 0));  // a maximum is one of the inputs: exact
    Tensor a = avg_pool2d(x, {3, 3}, {1, 1}, {1, 1}), af = avg_pool2d(xf, {3, 3}, {1, 1}, {1, 1});
    EXPECT_TRUE(agt::allclose(a, af, agt::tol_for(dt)));
    Tensor g = randf(a.sizes().vec()).to(dt);
    (a * g).sum().backward();
    (af * g.to(kFloat32)).sum().backward();
    EXPECT_TRUE(agt::allclose(x.grad(), xf.grad(), agt::tol_for(dt)));
  }
}

// Every pooling case through the production kernels: float32 (oneDNN in the full build)
// forward and input gradient against float64 (the gradchecked loops), and bfloat16
// against float32 of the same rounded values. A maximum is one of its inputs, so max
// pooling's forward is exact; its gradient routes (and, where windows overlap, sums) the
// output gradient.
TEST(Pool, EveryCaseFloat32MatchesFloat64AndBFloat16MatchesFloat32) {
  manual_seed(40);
  for (const auto& c : pool_cases()) {
    for (int kind = 0; kind < 3; ++kind) {  // max, avg counting padding, avg not counting it
      const bool is_max = kind == 0, include_pad = kind == 1;
      if (!is_max && (c.d[0] != 1 || c.d[1] != 1)) continue;  // avg_pool2d has no dilation
      SCOPED_TRACE(std::string(is_max ? "max" : "avg") + " input " + ::testing::PrintToString(c.x) +
                   " ceil " + std::to_string(c.ceil_mode) + " include_pad " + std::to_string(include_pad));
      auto run = [&](const Tensor& x0, const Tensor& g0, DType dt) {
        Tensor x = x0.detach().to(dt).requires_grad_();
        Tensor y = is_max ? max_pool2d(x, c.k, c.s, c.p, c.d, c.ceil_mode)
                          : avg_pool2d(x, c.k, c.s, c.p, c.ceil_mode, include_pad);
        if (!g0.defined()) return std::pair<Tensor, Tensor>{y, Tensor()};
        y.backward(g0.to(dt));
        return std::pair<Tensor, Tensor>{y, x.grad()};
      };
      Tensor x = randf(c.x);
      Tensor g = randf(run(x, Tensor(), kFloat32).first.sizes().vec());
      const auto [y32, dx32] = run(x, g, kFloat32);
      const auto [y64, dx64] = run(x, g, kFloat64);
      EXPECT_EQ(y32.dtype(), kFloat32);
      EXPECT_TRUE(agt::allclose(y32, y64, is_max ? 0 : 1e-6, is_max ? 0 : 1e-6)) << "float32 forward";
      EXPECT_TRUE(agt::allclose(dx32, dx64, 1e-6, 1e-6)) << "float32 input gradient";
      auto r = [](const Tensor& t) { return t.to(kBFloat16).to(kFloat32); };
      const auto [yb, dxb] = run(x, g, kBFloat16);
      const auto [yr, dxr] = run(r(x), r(g), kFloat32);
      EXPECT_EQ(yb.dtype(), kBFloat16);
      EXPECT_TRUE(agt::allclose(yb, yr, agt::tol_for(kBFloat16))) << "bfloat16 forward";
      EXPECT_TRUE(agt::allclose(dxb, dxr, agt::tol_for(kBFloat16))) << "bfloat16 input gradient";
    }
  }
}

TEST(Pool, ErrorsNameTheShapes) {
  EXPECT_AG_ERROR(max_pool2d(zeros({1, 1, 4, 4}), {2, 2}, {2, 2}, {2, 2}),
                  "[max_pool2d] padding must be between 0 and half the kernel size, got padding [2, 2] for kernel_size [2, 2]");
  EXPECT_AG_ERROR(max_pool2d(zeros({1, 1, 2, 2}), {3, 3}),
                  "[max_pool2d] input of shape [1, 1, 2, 2] is too small for kernel_size [3, 3] with padding [0, 0] and dilation [1, 1]");
  EXPECT_AG_ERROR(avg_pool2d(zeros({4, 4}), {2, 2}), "[avg_pool2d] expected a 3-D (unbatched) or 4-D (batched) input, got shape [4, 4]");
  EXPECT_AG_ERROR(avg_pool2d(zeros({1, 1, 4, 4}), {0, 2}), "[avg_pool2d] kernel_size, stride and dilation must be positive");
  EXPECT_AG_ERROR(max_pool2d(zeros({1, 1, 4, 4}), {2, 2, 2}), "[max_pool2d] kernel_size must have 1 or 2 values");
  EXPECT_AG_ERROR(max_pool2d(zeros({1, 1, 4, 4}, kInt64), {2, 2}), "[max_pool2d] expected a floating input, got int64");
}
