// linear with an activation and feed_forward (ops/nn.h): values against float64 loops with
// the activations written out here, float64 gradchecks, the 16-bit dtypes against float32,
// autocast, the kept pre-activation against the fused post-op path, and nn::Sequential's
// fusion against running its modules one by one.
#include "support/testing.h"

#include <cmath>

using namespace ag;
using TL = std::vector<Tensor>;

namespace {

const Activation kActs[] = {Activation::Relu, Activation::GeluErf, Activation::GeluTanh};

double act_ref(Activation a, double v) {
  switch (a) {
    case Activation::Relu: return v > 0 ? v : 0;
    case Activation::GeluErf: return agt::ref_gelu(v);
    case Activation::GeluTanh: return agt::ref_gelu_tanh(v);
    case Activation::None: return v;
  }
  return v;
}

// act(x @ w^T + b) in float64 loops; x [..., K].
Tensor ref_linear_act(const Tensor& x, const Tensor& w, const Tensor& b, Activation a) {
  return agt::ref_linear(x, w, b, [a](double v) { return act_ref(a, v); });
}

using agt::fp32_tol;
using agt::randf;

// The unfused composition that linear(x, w, b, act) stands for.
Tensor composed(const Tensor& x, const Tensor& w, const Tensor& b, Activation a) {
  const Tensor h = linear(x, w, b);
  switch (a) {
    case Activation::Relu: return relu(h);
    case Activation::GeluErf: return gelu(h);
    case Activation::GeluTanh: return gelu(h, "tanh");
    case Activation::None: return h;
  }
  return h;
}

TEST(LinearAct, MatchesFloat64LoopsWithAndWithoutGradients) {
  manual_seed(31);
  Tensor w = randf({9, 12}), b = randf({9});
  for (Activation a : kActs)
    for (const auto& xs : std::vector<std::vector<int64_t>>{{7, 12}, {2, 3, 12}, {12}}) {
      SCOPED_TRACE(std::string(activation_name(a)) + " rank " + std::to_string(xs.size()));
      Tensor x = randf(xs);
      // No gradient wanted: the activation may run as a post-op of the product.
      Tensor y = linear(x, w, b, a);
      EXPECT_EQ(y.sizes(), ref_linear_act(x, w, b, a).sizes());
      EXPECT_TRUE(agt::allclose(y, ref_linear_act(x, w, b, a), fp32_tol(12)));
      EXPECT_TRUE(agt::allclose(linear(x, w, Tensor(), a), ref_linear_act(x, w, Tensor(), a), fp32_tol(12)));
      // A gradient wanted: GELU keeps its pre-activation, so another path computes it.
      Tensor xg = x.detach().requires_grad_();
      Tensor yg = linear(xg, w, b, a);
      EXPECT_TRUE(agt::allclose(yg, ref_linear_act(x, w, b, a), fp32_tol(12)));
      if (xs.size() == 2) EXPECT_EQ(yg.grad_fn()->name(), "LinearBackward");  // else a reshape follows
    }
  // Activation::None is plain linear.
  Tensor x = randf({4, 12});
  EXPECT_TRUE(agt::allclose(linear(x, w, b, Activation::None), linear(x, w, b), 0, 0));
}

TEST(LinearAct, Gradcheck) {
  manual_seed(32);
  for (Activation a : kActs) {
    SCOPED_TRACE(activation_name(a));
    Tensor x = agt::rand64({5, 4}), w = agt::rand64({3, 4}), b = agt::rand64({3});
    EXPECT_TRUE(agt::gradcheck([a](const TL& in) { return linear(in[0], in[1], in[2], a); }, {x, w, b}));
    EXPECT_TRUE(agt::gradcheck([a](const TL& in) { return linear(in[0], in[1], Tensor(), a); }, {x, w}));
    Tensor x3 = agt::rand64({2, 3, 4});
    EXPECT_TRUE(agt::gradcheck([a](const TL& in) { return linear(in[0], in[1], in[2], a); }, {x3, w, b}));
    // only the weight wanted, and a transposed input view
    Tensor xc = agt::rand64({4, 5}, -1, 1, false);
    EXPECT_TRUE(agt::gradcheck([a](const TL& in) { return linear(in[0].t(), in[1], in[2], a); }, {xc, w, b}));
  }
}

TEST(FeedForward, MatchesTheCompositionAndGradchecks) {
  manual_seed(33);
  for (Activation a : kActs) {
    SCOPED_TRACE(activation_name(a));
    Tensor x = agt::rand64({6, 5}), w1 = agt::rand64({7, 5}), b1 = agt::rand64({7}), w2 = agt::rand64({3, 7}),
           b2 = agt::rand64({3});
    EXPECT_TRUE(agt::gradcheck([a](const TL& in) { return feed_forward(in[0], in[1], in[2], a, in[3], in[4]); },
                               {x, w1, b1, w2, b2}));
    EXPECT_TRUE(agt::gradcheck([a](const TL& in) { return feed_forward(in[0], in[1], Tensor(), a, in[2]); },
                               {x, w1, w2}));
    Tensor x3 = agt::rand64({2, 2, 5});
    EXPECT_TRUE(agt::gradcheck([a](const TL& in) { return feed_forward(in[0], in[1], in[2], a, in[3], in[4]); },
                               {x3, w1, b1, w2, b2}));

    // float32 against the same ops run one by one, forward and every gradient
    Tensor xf = randf({2, 9, 16}), w1f = randf({24, 16}), b1f = randf({24}), w2f = randf({8, 24}), b2f = randf({8});
    TL fused_in, ref_in;
    for (const Tensor& t : {xf, w1f, b1f, w2f, b2f}) {
      fused_in.push_back(t.detach().requires_grad_());
      ref_in.push_back(t.detach().requires_grad_());
    }
    Tensor y = feed_forward(fused_in[0], fused_in[1], fused_in[2], a, fused_in[3], fused_in[4]);
    Tensor yr = linear(composed(ref_in[0], ref_in[1], ref_in[2], a), ref_in[3], ref_in[4]);
    EXPECT_EQ(y.sizes(), std::vector<int64_t>({2, 9, 8}));
    EXPECT_EQ(y.grad_fn()->next_edges[0].fn->name(), "FeedForwardBackward");  // under the reshape
    EXPECT_TRUE(agt::allclose(y, yr, fp32_tol(24)));
    Tensor g = randf({2, 9, 8});
    y.backward(g);
    yr.backward(g);
    for (size_t i = 0; i < fused_in.size(); ++i)
      EXPECT_TRUE(agt::allclose(fused_in[i].grad(), ref_in[i].grad(), fp32_tol(64))) << "gradient " << i;
  }
  // None is two linears.
  Tensor x = randf({3, 4}), w1 = randf({5, 4}), w2 = randf({2, 5});
  EXPECT_TRUE(agt::allclose(feed_forward(x, w1, Tensor(), Activation::None, w2), linear(linear(x, w1), w2), 0, 0));
}

// A GPT-sized feed-forward (2048 rows, weights of 128 x 512): its products take their
// weights in oneDNN's blocked layout, with the bias, the activation and GELU's slope as
// post-ops. The forward without gradients, the forward with them and every gradient against
// the same ops in float64 (another GEMM), and the forward against float64 loops.
TEST(FeedForward, LargeFloat32ProductsMatchFloat64) {
  manual_seed(38);
  const int64_t M = 2048, D = 128, H = 512;
  for (Activation a : {Activation::GeluErf, Activation::Relu}) {
    SCOPED_TRACE(activation_name(a));
    const TL init{randf({M, D}), randf({H, D}), randf({H}), randf({D, H}), randf({D})};
    TL in32, in64;
    for (const Tensor& t : init) {
      in32.push_back(t.detach().requires_grad_());
      in64.push_back(t.to(kFloat64).requires_grad_());
    }
    {
      NoGradGuard no_grad;
      EXPECT_TRUE(agt::allclose(linear(init[0], init[1], init[2], a), ref_linear_act(init[0], init[1], init[2], a),
                                fp32_tol(D)));
    }
    Tensor y = feed_forward(in32[0], in32[1], in32[2], a, in32[3], in32[4]);
    Tensor y64 = feed_forward(in64[0], in64[1], in64[2], a, in64[3], in64[4]);
    EXPECT_TRUE(agt::allclose(y, y64, fp32_tol(H)));
    Tensor g = randf({M, D});
    y.backward(g);
    y64.backward(g.to(kFloat64));
    const int64_t sums[] = {H, M, M, M, M};  // each gradient's inner dimension
    for (size_t i = 0; i < in32.size(); ++i)
      EXPECT_TRUE(agt::allclose(in32[i].grad(), in64[i].grad(), fp32_tol(4 * sums[i]))) << "gradient " << i;
  }
}

// 16-bit operands accumulate in float32 and round the product, the activation and the
// gradients: against float32 runs of the same rounded inputs within a few of the dtype's
// roundings.
TEST(FeedForward, HalfPrecisionMatchesFloat32) {
  manual_seed(34);
  for (DType dt : {kBFloat16, kFloat16})
    for (Activation a : kActs) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + activation_name(a));
      TL lo, hi;
      for (const auto& s : std::vector<std::vector<int64_t>>{{12, 32}, {48, 32}, {48}, {16, 48}, {16}}) {
        Tensor t = randf(s).to(dt);
        lo.push_back(t.detach().requires_grad_());
        hi.push_back(t.detach().to(kFloat32).requires_grad_());
      }
      Tensor y = feed_forward(lo[0], lo[1], lo[2], a, lo[3], lo[4]);
      Tensor yf = feed_forward(hi[0], hi[1], hi[2], a, hi[3], hi[4]);
      EXPECT_EQ(y.dtype(), dt);
      const agt::Tol t = agt::tol_for(dt);
      const agt::Tol loose{t.rtol * 4, t.atol * 8};
      EXPECT_TRUE(agt::allclose(y, yf, loose));
      Tensor g = randf({12, 16});
      y.backward(g.to(dt));
      yf.backward(g);
      for (size_t i = 0; i < lo.size(); ++i) {
        EXPECT_EQ(lo[i].grad().dtype(), dt);
        EXPECT_TRUE(agt::allclose(lo[i].grad(), hi[i].grad(), {t.rtol * 8, t.atol * 32})) << "gradient " << i;
      }
      Tensor z = linear(lo[0].detach(), lo[1].detach(), lo[2].detach(), a);
      EXPECT_TRUE(agt::allclose(z, linear(hi[0].detach(), hi[1].detach(), hi[2].detach(), a), loose));
    }
}

// Autocast casts feed_forward's operands like linear's: a bfloat16 result, float32
// gradients for float32 parameters.
TEST(FeedForward, AutocastRunsItInLowerPrecision) {
  manual_seed(35);
  Tensor x = randf({8, 16}), w1 = randf({32, 16}).requires_grad_(), b1 = randf({32}).requires_grad_(),
         w2 = randf({4, 32}).requires_grad_(), b2 = randf({4}).requires_grad_();
  Tensor y;
  {
    AutocastGuard guard(kCPU, kBFloat16);
    y = feed_forward(x, w1, b1, Activation::GeluTanh, w2, b2);
  }
  EXPECT_EQ(y.dtype(), kBFloat16);
  const Tensor ref = linear(gelu(linear(x, w1.detach(), b1.detach()), "tanh"), w2.detach(), b2.detach());
  EXPECT_TRUE(agt::allclose(y, ref, {0.05, 0.05}));
  y.to(kFloat32).sum().backward();
  for (const Tensor& p : {w1, b1, w2, b2}) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().dtype(), kFloat32);
  }
}

TEST(FeedForward, ErrorsNameTheOpAndShapes) {
  EXPECT_AG_ERROR(feed_forward(zeros({2, 3}), zeros({4, 5}), Tensor(), Activation::Relu, zeros({2, 4})),
                  "[feed_forward] cannot multiply shapes [2, 3] and [4, 5]^T: 3 != 5");
  EXPECT_AG_ERROR(feed_forward(zeros({2, 3}), zeros({4, 3}), Tensor(), Activation::Relu, zeros({2, 5})),
                  "[feed_forward] the second weight must have shape [out, 4] after a first weight of shape [4, 3], got [2, 5]");
  EXPECT_AG_ERROR(feed_forward(zeros({2, 3}), zeros({4, 3}), zeros({4}), Activation::Relu, zeros({2, 4}), zeros({3})),
                  "[feed_forward] the second bias must be a float32 tensor of shape [2], got float32 [3]");
  EXPECT_AG_ERROR(feed_forward(zeros({2, 3}), zeros({4, 3}), Tensor(), Activation::Relu, zeros({2, 4}, kFloat64)),
                  "[feed_forward] expected both weights to have the input's dtype float32, got float64");
  EXPECT_AG_ERROR(linear(zeros({2, 3}), zeros({4, 5}), Tensor(), Activation::GeluErf),
                  "[linear] cannot multiply shapes [2, 3] and [4, 5]^T: 3 != 5");
}

// ReLU's gradient reads the op's output: changing it in place before backward is caught.
TEST(LinearAct, OutputModifiedInPlaceIsCaught) {
  Tensor x = randf({3, 4}).requires_grad_(), w = randf({2, 4});
  Tensor y = linear(x, w, Tensor(), Activation::Relu);
  y.mul_(2.0);
  EXPECT_AG_ERROR(y.sum().backward(), "modified by an in-place operation");
}

// A module that is a ReLU by type but computes something else: Sequential must run it.
class DoubledRelu : public nn::ReLU {
 public:
  Tensor forward(const Tensor& x) override { return relu(x) * 2.0; }
};

TEST(SequentialFusion, MatchesModuleByModuleAndIsOnByDefault) {
  manual_seed(36);
  auto mlp = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(12, 16), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(16, 8),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(8, 3)});
  auto block = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(12, 24), std::make_shared<nn::GELU>("tanh"), std::make_shared<nn::Linear>(24, 12),
      std::make_shared<nn::Dropout>(0.0)});
  const Tensor x = randf({5, 12});
  for (auto& model : {mlp, block}) {
    EXPECT_TRUE(model->fusion());
    Tensor y = model->forward(x);
    // Linear, ReLU, Linear, ReLU, Linear: the first pair fuses, then the last three.
    EXPECT_EQ(y.grad_fn()->name(), "FeedForwardBackward");  // dropout with p = 0 records nothing
    y.sum().backward();
    std::vector<Tensor> fused_grads;
    for (const Tensor& p : model->parameters()) fused_grads.push_back(p.grad().clone());
    model->zero_grad();
    model->set_fusion(false);
    Tensor yr = model->forward(x);
    EXPECT_EQ(yr.grad_fn()->name(), "LinearBackward");
    EXPECT_TRUE(agt::allclose(y, yr, fp32_tol(64)));
    yr.sum().backward();
    const auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_TRUE(agt::allclose(fused_grads[i], params[i].grad(), fp32_tol(256))) << "parameter " << i;
  }
  // A subclass is run through its own forward.
  auto custom = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(12, 4), std::make_shared<DoubledRelu>()});
  const auto& l = static_cast<const nn::Linear&>(*(*custom)[0]);
  EXPECT_TRUE(agt::allclose(custom->forward(x), relu(linear(x, l.weight, l.bias)) * 2.0, 1e-6, 1e-6));
}

}  // namespace
