// conv2d_block (conv2d, optional ReLU, max_pool2d as one op): values and gradients against
// the three ops it stands for (in float32 and bfloat16 the CPU's fused form keeps the
// activation in oneDNN's blocked layout, the composition reorders it to NCHW: the same
// convolution kernel, so the same values and the same argmax), forward values against
// float64, float64 gradchecks, the NaN and -inf rules of max pooling, autocast, errors,
// and Sequential's fusion of Conv2d, ReLU, MaxPool2d.
#include "support/testing.h"

#include <cmath>
#include <limits>

using namespace ag;
using TL = std::vector<Tensor>;

namespace {

using agt::randf;

struct BlockCase {
  std::vector<int64_t> x;  // N, C, H, W
  int64_t oc, k;
  Conv2dArgs conv;
  MaxPool2dArgs pool;
  bool bias;
  Activation act;
};

const std::vector<BlockCase>& block_cases() {
  static const std::vector<BlockCase> cases = {
      // the CNN's blocks: 3x3 convolutions with padding 1, 2x2 pooling
      {{4, 1, 12, 12}, 32, 3, {.padding = {1, 1}}, {}, true, Activation::Relu},
      {{3, 32, 8, 8}, 64, 3, {.padding = {1, 1}}, {}, true, Activation::Relu},
      // overlapping windows (the CPU composes the three ops for these)
      {{2, 5, 9, 9}, 20, 3, {.padding = {1, 1}}, {.kernel_size = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}, false,
       Activation::Relu},
      {{2, 8, 11, 10}, 16, 3, {.stride = {2, 1}, .groups = 2}, {.kernel_size = {2, 3}, .ceil_mode = true}, true,
       Activation::None},
      {{1, 3, 10, 10}, 4, 2, {.dilation = {2, 2}}, {.kernel_size = {2, 2}, .stride = {1, 1}, .dilation = {2, 1}},
       true, Activation::Relu},
      // 20 channels: blocked layouts pad them to 32, channels-last has a tail of 4
      {{2, 5, 9, 9}, 20, 3, {.padding = {1, 1}}, {.ceil_mode = true}, true, Activation::Relu},
  };
  return cases;
}

Tensor block_of(const BlockCase& c, const Tensor& x, const Tensor& w, const Tensor& b) {
  return conv2d_block(x, w, b, c.conv, c.act, c.pool);
}

// The three ops conv2d_block stands for.
Tensor composed_of(const BlockCase& c, const Tensor& x, const Tensor& w, const Tensor& b) {
  Tensor y = conv2d(x, w, b, c.conv.stride, c.conv.padding, c.conv.dilation, c.conv.groups);
  if (c.act == Activation::Relu) y = relu(y);
  return max_pool2d(y, c.pool.kernel_size, c.pool.stride, c.pool.padding, c.pool.dilation, c.pool.ceil_mode);
}

struct Result {
  Tensor y, dx, dw, db;
};

// Forward and backward from fresh leaves of dtype dt; `fused` picks the op or the three.
Result run(const BlockCase& c, bool fused, DType dt, const Tensor& x0, const Tensor& w0, const Tensor& b0,
           const Tensor& g0, bool x_grad = true) {
  Tensor x = x0.detach().to(dt).clone(), w = w0.detach().to(dt).clone().requires_grad_();
  if (x_grad) x.requires_grad_();
  Tensor b = c.bias ? b0.detach().to(dt).clone().requires_grad_() : Tensor();
  Tensor y = fused ? block_of(c, x, w, b) : composed_of(c, x, w, b);
  y.backward(g0.to(dt));
  return {y, x_grad ? x.grad() : Tensor(), w.grad(), c.bias ? b.grad() : Tensor()};
}

// t's element at idx (a float32 tensor's flat index), and t with it set to v.
int64_t flat(const Tensor& t, const std::vector<int64_t>& idx) {
  int64_t f = 0;
  for (size_t i = 0; i < idx.size(); ++i) f = f * t.size(int64_t(i)) + idx[i];
  return f;
}
double at(const Tensor& t, const std::vector<int64_t>& idx) { return t.to_vector<double>()[size_t(flat(t, idx))]; }
Tensor with(const Tensor& t, const std::vector<int64_t>& idx, double v) {
  auto vals = t.to_vector<double>();
  vals[size_t(flat(t, idx))] = v;
  return from_vector(vals, t.sizes().vec()).to(t.dtype());
}

std::string name_of(const BlockCase& c) {
  return "input " + ::testing::PrintToString(c.x) + " oc " + std::to_string(c.oc) + " " + activation_name(c.act);
}

}  // namespace

namespace {
void expect_matches_the_three_ops() {
  for (const auto& c : block_cases()) {
    SCOPED_TRACE(name_of(c));
    Tensor x = randf(c.x), w = randf({c.oc, c.x[1] / c.conv.groups, c.k, c.k}), b = c.bias ? randf({c.oc}) : Tensor();
    Tensor g = randf(composed_of(c, x, w, b).sizes().vec());
    for (DType dt : {kFloat32, kBFloat16}) {
      SCOPED_TRACE(dtype_name(dt));
      const Result f = run(c, true, dt, x, w, b, g), r = run(c, false, dt, x, w, b, g);
      const agt::Tol tol = dt == kFloat32 ? agt::Tol{1e-6, 1e-6} : agt::tol_for(dt);
      EXPECT_EQ(f.y.dtype(), dt);
      EXPECT_EQ(f.y.sizes(), r.y.sizes());
      EXPECT_TRUE(agt::allclose(f.y, r.y, tol)) << "forward";
      EXPECT_TRUE(agt::allclose(f.dx, r.dx, tol)) << "input gradient";
      EXPECT_TRUE(agt::allclose(f.dw, r.dw, tol)) << "weight gradient";
      if (c.bias) EXPECT_TRUE(agt::allclose(f.db, r.db, tol)) << "bias gradient";
      // the weight and bias alone (the first layer of a CNN)
      const Result fw = run(c, true, dt, x, w, b, g, false);
      EXPECT_TRUE(agt::allclose(fw.dw, r.dw, tol)) << "weight gradient without the input's";
    }
  }
}
}  // namespace

TEST(Conv2dBlock, MatchesTheThreeOpsInFloat32AndBFloat16) {
  manual_seed(61);
  expect_matches_the_three_ops();
}

// The pooling in each variant that this CPU runs (plain loops below the kernels' level
// avx512, what a CPU without AVX-512 runs) against the same.
class Conv2dBlockEachIsa : public agt::EachKernelIsa {};
TEST_P(Conv2dBlockEachIsa, MatchesTheThreeOps) {
  manual_seed(67);
  expect_matches_the_three_ops();
}
AGT_EACH_KERNEL_ISA(Conv2dBlockEachIsa);

// Forward values against float64 (the loops and Eigen): the max of a window is continuous,
// so float32 rounding moves it by about one rounding of the convolution.
TEST(Conv2dBlock, Float32ForwardMatchesFloat64) {
  manual_seed(62);
  for (const auto& c : block_cases()) {
    SCOPED_TRACE(name_of(c));
    Tensor x = randf(c.x), w = randf({c.oc, c.x[1] / c.conv.groups, c.k, c.k}), b = c.bias ? randf({c.oc}) : Tensor();
    const double K = double(c.x[1] / c.conv.groups * c.k * c.k);
    const Tensor y64 = block_of(c, x.to(kFloat64), w.to(kFloat64), c.bias ? b.to(kFloat64) : b);
    EXPECT_EQ(y64.dtype(), kFloat64);
    EXPECT_TRUE(agt::allclose(block_of(c, x, w, b), y64, 1e-5, 4e-6 * std::sqrt(K)));
    EXPECT_TRUE(agt::allclose(y64, composed_of(c, x.to(kFloat64), w.to(kFloat64), c.bias ? b.to(kFloat64) : b), 0, 0));
  }
}

TEST(Conv2dBlock, Gradcheck) {
  manual_seed(63);
  for (const auto& c : {block_cases()[2], block_cases()[3], block_cases()[4]}) {
    SCOPED_TRACE(name_of(c));
    std::vector<int64_t> xs = c.x;
    xs[0] = 1;
    Tensor x = agt::rand64(xs), w = agt::rand64({c.oc, c.x[1] / c.conv.groups, c.k, c.k});
    Tensor b = c.bias ? agt::rand64({c.oc}) : Tensor();
    EXPECT_TRUE(agt::gradcheck([&](const TL& in) { return block_of(c, in[0], in[1], in[2]); }, {x, w, b}));
  }
  // unbatched
  const BlockCase& c = block_cases()[0];
  Tensor x = agt::rand64({1, 6, 6}), w = agt::rand64({3, 1, 3, 3}), b = agt::rand64({3});
  EXPECT_TRUE(agt::gradcheck([&](const TL& in) { return block_of(c, in[0], in[1], in[2]); }, {x, w, b}));
}

// A NaN wins its pooling window (and survives the ReLU), as in max_pool2d; oneDNN's max
// would skip it, so the block must notice and take the loops.
TEST(Conv2dBlock, NaNWinsItsWindowAsInMaxPool) {
  manual_seed(64);
  const BlockCase& c = block_cases()[1];
  Tensor x = randf(c.x), w = randf({c.oc, c.x[1], 3, 3}), b = randf({c.oc});
  x = with(x, {1, 3, 2, 5}, std::numeric_limits<double>::quiet_NaN());
  Tensor g = randf({3, 64, 4, 4});
  for (DType dt : {kFloat32, kBFloat16}) {
    const Result f = run(c, true, dt, x, w, b, g), r = run(c, false, dt, x, w, b, g);
    EXPECT_TRUE(std::isnan(at(f.y, {1, 0, 1, 2}))) << dtype_name(dt);
    EXPECT_FALSE(std::isnan(at(f.y, {0, 0, 1, 2}))) << dtype_name(dt);
    EXPECT_TRUE(agt::allclose(f.y, r.y, agt::tol_for(dt))) << dtype_name(dt);
    EXPECT_TRUE(agt::allclose(f.dw, r.dw, agt::tol_for(dt))) << dtype_name(dt);
  }
}

// Without the ReLU a window of -inf pools to -inf (oneDNN's max starts at the lowest
// finite value).
TEST(Conv2dBlock, MinusInfinityPoolsToMinusInfinityWithoutRelu) {
  const BlockCase c{{1, 1, 4, 4}, 16, 1, {}, {}, false, Activation::None};
  Tensor x = randf({1, 1, 4, 4});
  for (int i : {0, 1})
    for (int j : {0, 1}) x = with(x, {0, 0, i, j}, -std::numeric_limits<double>::infinity());
  Tensor w = rand({16, 1, 1, 1}) + 0.5;  // positive: -inf stays -inf
  Tensor g = randf({1, 16, 2, 2});
  const Result f = run(c, true, kFloat32, x, w, Tensor(), g, false), r = run(c, false, kFloat32, x, w, Tensor(), g, false);
  EXPECT_EQ(at(f.y, {0, 5, 0, 0}), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(agt::allclose(f.y, r.y, 1e-6, 1e-6));
}

TEST(Conv2dBlock, AutocastRunsItInLowerPrecisionLikeConv2d) {
  manual_seed(65);
  const BlockCase& c = block_cases()[1];
  Tensor x = randf(c.x), w = randf({c.oc, c.x[1], 3, 3}).requires_grad_(), b = randf({c.oc}).requires_grad_();
  Tensor y;
  {
    AutocastGuard guard(kCPU, kBFloat16);
    y = block_of(c, x, w, b);
  }
  EXPECT_EQ(y.dtype(), kBFloat16);
  EXPECT_TRUE(agt::allclose(y, composed_of(c, x, w.detach(), b.detach()), {0.02, 0.1}));
  y.to(kFloat32).sum().backward();
  EXPECT_EQ(w.grad().dtype(), kFloat32);
  EXPECT_EQ(b.grad().dtype(), kFloat32);
}

TEST(Conv2dBlock, EmptyBatch) {
  Tensor x = zeros({0, 3, 6, 6}).requires_grad_(), w = randf({4, 3, 3, 3}).requires_grad_();
  Tensor y = conv2d_block(x, w, Tensor(), {.padding = {1, 1}}, Activation::Relu);
  EXPECT_EQ(y.sizes(), std::vector<int64_t>({0, 4, 3, 3}));
  y.sum().backward();
  EXPECT_EQ(x.grad().sizes(), std::vector<int64_t>({0, 3, 6, 6}));
  EXPECT_TRUE(agt::allclose(w.grad(), zeros({4, 3, 3, 3}), 0, 0));
}

TEST(Conv2dBlock, ErrorsNameTheOp) {
  EXPECT_AG_ERROR(conv2d_block(zeros({1, 4, 5, 5}), zeros({2, 3, 3, 3}), Tensor(), {}, Activation::Relu),
                  "[conv2d_block] input of shape [1, 4, 5, 5] has 4 channels, but weight of shape [2, 3, 3, 3] with groups=1 expects 3");
  EXPECT_AG_ERROR(conv2d_block(zeros({1, 1, 5, 5}), zeros({2, 1, 3, 3}), Tensor(), {}, Activation::GeluErf),
                  "[conv2d_block] the activation must be none or relu, got gelu");
  EXPECT_AG_ERROR(conv2d_block(zeros({1, 1, 4, 4}), zeros({2, 1, 3, 3}), Tensor(), {}, Activation::Relu,
                               {.kernel_size = {3, 3}}),
                  "[conv2d_block] input of shape [1, 2, 2, 2] is too small for kernel_size [3, 3]");
  EXPECT_AG_ERROR(conv2d_block(zeros({1, 1, 4, 4}), zeros({2, 1, 3, 3}), Tensor(), {.stride = {0, 1}}, Activation::Relu),
                  "[conv2d_block] stride and dilation must be positive");
  EXPECT_AG_ERROR(conv2d_block(zeros({1, 1, 8, 8}), zeros({2, 1, 3, 3}), Tensor(), {}, Activation::Relu,
                               {.kernel_size = {2, 2}, .padding = {2, 2}}),
                  "[conv2d_block] padding must be between 0 and half the kernel size");
}

// On oneDNN the block keeps its own primitives (the convolution's with a blocked
// destination): the three ops on the same shapes find none of them.
TEST(Conv2dBlock, RunsItsOwnBlockedPrimitivesOnOneDnn) {
  if (!built_with_onednn()) AGT_SKIP_BUILD() << "built without oneDNN: the block is the three ops";
  const BlockCase& c = block_cases()[1];
  Tensor x = randf({2, 32, 10, 6}), w = randf({64, 32, 3, 3}), b = randf({64});
  const size_t before = ampgrad::detail::cpu_primitive_cache_size();
  (void)block_of(c, x, w, b);
  const size_t after_block = ampgrad::detail::cpu_primitive_cache_size();
  EXPECT_GE(after_block, before + 1);  // the convolution's plan with a blocked destination
  (void)block_of(c, x, w, b);
  EXPECT_EQ(ampgrad::detail::cpu_primitive_cache_size(), after_block);
  (void)composed_of(c, x, w, b);
  EXPECT_GE(ampgrad::detail::cpu_primitive_cache_size(), after_block + 2);
}

TEST(SequentialFusion, ConvReluMaxPoolRunAsOneBlock) {
  manual_seed(66);
  auto cnn = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Conv2d>(1, 8, 3, nn::Conv2dOptions{.padding = 1}), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::MaxPool2d>(2), std::make_shared<nn::Conv2d>(8, 16, 3, nn::Conv2dOptions{.padding = 1}),
      std::make_shared<nn::MaxPool2d>(2), std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(16 * 3 * 3, 4)});
  auto tail = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Conv2d>(8, 16, 3, nn::Conv2dOptions{.padding = 1}), std::make_shared<nn::MaxPool2d>(2)});
  const Tensor x = randf({3, 1, 12, 12});
  Tensor y = cnn->forward(x);
  EXPECT_EQ(tail->forward(randf({1, 8, 6, 6})).grad_fn()->name(), "Conv2dBlockBackward");
  y.sum().backward();
  std::vector<Tensor> fused_grads;
  for (const Tensor& p : cnn->parameters()) fused_grads.push_back(p.grad().clone());
  cnn->zero_grad();
  cnn->set_fusion(false);
  EXPECT_EQ(tail->forward(randf({1, 8, 6, 6})).grad_fn()->name(), "Conv2dBlockBackward");  // its own switch
  tail->set_fusion(false);
  EXPECT_EQ(tail->forward(randf({1, 8, 6, 6})).grad_fn()->name(), "MaxPool2dBackward");
  Tensor yr = cnn->forward(x);
  EXPECT_TRUE(agt::allclose(y, yr, 1e-5, 1e-5));
  yr.sum().backward();
  const auto params = cnn->parameters();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(agt::allclose(fused_grads[i], params[i].grad(), 1e-5, 1e-5)) << "parameter " << i;
}
