#include "support/testing.h"

#include <cmath>

using namespace ag;
using TL = std::vector<Tensor>;

TEST(Autograd, ChainRuleAndAccumulation) {
  Tensor x = from_vector<double>({1, 2, 3}, {3}).requires_grad_();
  Tensor y = x * x * 3.0;  // dy/dx = 6x
  y.backward(ones({3}, kFloat64));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{6, 12, 18}));
  // gradients accumulate into leaves across calls
  (x * 2.0).backward(ones({3}, kFloat64));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{8, 14, 20}));
  // a tensor used twice gets both contributions
  Tensor z = from_vector<double>({2}, {1}).requires_grad_();
  Tensor w = z * z + z;
  w.backward();
  EXPECT_EQ(z.grad().item<double>(), 5.0);
  EXPECT_TRUE(x.is_leaf());
  EXPECT_FALSE(y.is_leaf());
  EXPECT_TRUE(y.requires_grad());
  EXPECT_EQ(y.grad_fn()->name(), "MulBackward");
  EXPECT_FALSE(Tensor(zeros({1})).grad().defined());
}

TEST(Autograd, DiamondGraphAndNonLeafInputs) {
  Tensor a = from_vector<double>({0.5, -1.5}, {2}).requires_grad_();
  Tensor b = exp(a);
  Tensor c = b * a;
  Tensor d = b + c;  // d = e^a (1 + a); dd/da = e^a (2 + a)
  d.backward(ones({2}, kFloat64));
  const auto g = a.grad().to_vector<double>();
  EXPECT_NEAR(g[0], std::exp(0.5) * 2.5, 1e-12);
  EXPECT_NEAR(g[1], std::exp(-1.5) * 0.5, 1e-12);
}

TEST(Autograd, RetainGraphAndFreedGraph) {
  Tensor x = from_vector<double>({3}, {1}).requires_grad_();
  Tensor y = exp(x);
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  EXPECT_NEAR(x.grad().item<double>(), 2 * std::exp(3.0), 1e-9);
  EXPECT_AG_ERROR(y.backward(), "trying to backward through the graph a second time");
}

TEST(Autograd, SavedTensorModifiedInPlaceThrows) {
  Tensor w = from_vector<double>({1, 2}, {2}).requires_grad_();
  Tensor x = from_vector<double>({3, 4}, {2});
  Tensor y = w * x;  // saves x for w's gradient
  x.add_(1.0);
  EXPECT_AG_ERROR(y.backward(ones({2}, kFloat64)),
                  "[MulBackward] a tensor saved for backward (shape [2], float64) was modified by an in-place operation: saved at version 0, now at version 1");
  // modifying an unsaved tensor is fine
  Tensor w2 = from_vector<double>({1, 2}, {2}).requires_grad_();
  Tensor x2 = from_vector<double>({3, 4}, {2});
  Tensor y2 = w2 + x2;
  x2.add_(1.0);
  y2.backward(ones({2}, kFloat64));
  EXPECT_EQ(w2.grad().to_vector<double>(), (std::vector<double>{1, 1}));
}

TEST(Autograd, InPlaceOnLeafAndThroughGraph) {
  Tensor w = ones({2}, kFloat64).requires_grad_();
  EXPECT_AG_ERROR(w.add_(1.0), "[add_] a leaf tensor that requires grad (shape [2]) cannot be modified in place in grad mode");
  {
    NoGradGuard ng;
    w.add_(1.0);  // how optimizers update parameters
  }
  EXPECT_EQ(w.to_vector<double>(), (std::vector<double>{2, 2}));
  // an in-place op on a non-leaf takes over its history
  Tensor h = w * 3.0;
  h.mul_(2.0);
  EXPECT_EQ(h.grad_fn()->name(), "MulBackward");
  h.backward(ones({2}, kFloat64));
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{6, 6}));
}

// In-place ops whose backward reads the tensor they modify (mul_ by a tensor that requires
// grad reads it for that tensor's gradient; clamp_ reads it for its mask) keep the value it
// had, as PyTorch's do; they used to save the tensor itself, and backward then threw that
// it had been modified in place.
TEST(Autograd, InPlaceOpsWhoseBackwardReadsTheModifiedTensor) {
  const Tensor x = agt::rand64({2, 3}), w = agt::rand64({3}, 0.5, 2);
  EXPECT_TRUE(agt::gradcheck([](const TL& t) {
    Tensor a = t[0] * 1.0;
    a.mul_(t[1]);
    return a;
  }, {x, w}));
  EXPECT_TRUE(agt::gradcheck([](const TL& t) {
    Tensor a = t[0] * 2.0;
    a.clamp_(-0.5, 0.75);
    return a * t[0];
  }, {x}));
  // a constant modified in place by a tensor that requires grad
  EXPECT_TRUE(agt::gradcheck([&](const TL& t) {
    Tensor a = x.detach() + 0.0;
    a.mul_(t[0]);
    return a;
  }, {w}));
}

// expand to a tensor's own shape is a new view, as every view op's output: it used to be the
// tensor itself, on which the op then recorded its node, so a leaf became a non-leaf (that
// in-place ops no longer refused) whose node held it: a reference cycle, never freed.
// copy_ expands its source so, and took a leaf source that way.
TEST(Autograd, ExpandToTheSameShapeLeavesALeafALeaf) {
  const Tensor x = agt::rand64({2, 3});
  const Tensor e = x.expand({2, 3});
  EXPECT_NE(e.unsafe_impl(), x.unsafe_impl());
  EXPECT_TRUE(x.is_leaf());
  EXPECT_FALSE(e.is_leaf());
  Tensor a = zeros({2, 3}, kFloat64) * 1.0;
  a.copy_(x);
  EXPECT_TRUE(x.is_leaf());
  EXPECT_AG_ERROR(Tensor(x).add_(1.0), "a leaf tensor that requires grad");
  EXPECT_TRUE(agt::gradcheck([](const TL& t) { return t[0].expand({2, 3}) * t[0]; }, {agt::rand64({2, 3})}));
}

TEST(Autograd, NoGradGuardDetachAndRequiresGrad) {
  Tensor x = ones({2}).requires_grad_();
  {
    NoGradGuard ng;
    EXPECT_FALSE(GradMode::is_enabled());
    Tensor y = x * 2.0f;
    EXPECT_FALSE(y.requires_grad());
    {
      EnableGradGuard eg;
      EXPECT_TRUE((x * 2.0f).requires_grad());
    }
    EXPECT_FALSE(GradMode::is_enabled());
  }
  EXPECT_TRUE(GradMode::is_enabled());
  Tensor d = (x * 2.0f).detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
  EXPECT_AG_ERROR(arange(3).requires_grad_(), "[requires_grad_] only floating tensors can require gradients, got int64");
  EXPECT_AG_ERROR((x * 2.0f).requires_grad_(false), "cannot turn off requires_grad on a non-leaf tensor");
  EXPECT_AG_ERROR(ones({2}).backward(), "[backward] tensor 0 (shape [2]) does not require grad and has no grad_fn");
  EXPECT_AG_ERROR((x * 2.0f).backward(), "a gradient can be created implicitly only for single-element tensors, got shape [2]");
  EXPECT_AG_ERROR((x * 2.0f).backward(ones({3})), "gradient of shape [3] does not match the tensor's shape [2]");
}

TEST(Autograd, HooksOnLeavesAndIntermediates) {
  Tensor x = from_vector<double>({1, 2}, {2}).requires_grad_();
  std::vector<double> seen;
  x.register_hook([&](const Tensor& g) {
    seen = g.to_vector<double>();
    return g * 10.0;  // replaces the gradient that accumulates
  });
  Tensor m = x * 3.0;
  m.register_hook([](const Tensor& g) { return g + 1.0; });
  m.backward(ones({2}, kFloat64));
  EXPECT_EQ(seen, (std::vector<double>{6, 6}));  // (1 + 1) * 3
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{60, 60}));
  Tensor c = ones({1});
  EXPECT_AG_ERROR(c.register_hook([](const Tensor& g) { return g; }), "[register_hook] cannot register a hook on a tensor that does not require grad");
}

// A post-accumulate hook runs once per backward, after every use's gradient has been
// summed into grad(), in registration order.
TEST(Autograd, PostAccumulateHooksSeeTheWholeGradient) {
  Tensor x = from_vector<double>({1, 2}, {2}).requires_grad_();
  std::vector<std::vector<double>> seen;
  x.register_post_accumulate_grad_hook([&](const Tensor& leaf) { seen.push_back(leaf.grad().to_vector<double>()); });
  x.register_post_accumulate_grad_hook([&](const Tensor& leaf) { Tensor(leaf.grad()).mul_(10.0); });
  (x * 3.0 + x * x).sum().backward();  // two uses: 3 + 2x
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], (std::vector<double>{5, 7}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{50, 70}));
  (x * 1.0).sum().backward();  // accumulates onto the held gradient, then the hooks again
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1], (std::vector<double>{51, 71}));
  Tensor m = x * 2.0;
  EXPECT_AG_ERROR(m.register_post_accumulate_grad_hook([](const Tensor&) {}),
                  "[register_post_accumulate_grad_hook] expected a leaf tensor that requires grad, got a non-leaf");
  EXPECT_AG_ERROR(ones({1}).register_post_accumulate_grad_hook([](const Tensor&) {}),
                  "got a tensor that does not require grad");
}

// Gradients reaching one tensor from several uses are summed, in place where nothing else
// holds the running sum; a tensor that the caller or a hook holds is never written into.
TEST(Autograd, AccumulationNeverWritesIntoHeldTensors) {
  Tensor x = from_vector<double>({1, 2, 3}, {3}).requires_grad_();
  Tensor y = x * 1.0;
  Tensor z = y + y;  // add's backward hands the same gradient tensor to both uses of y
  const Tensor g = from_vector<double>({1, 10, 100}, {3});
  z.backward(g);
  EXPECT_EQ(g.to_vector<double>(), (std::vector<double>{1, 10, 100}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 20, 200}));

  // b's gradient from c = b + b (the newer node, so it lands first) is the tensor a hook on c
  // returned and keeps: the sums with the second use and with d's gradient go elsewhere.
  Tensor a = from_vector<double>({1, 2}, {2}).requires_grad_();
  Tensor b = a * 2.0;
  Tensor d = b * 3.0;
  Tensor c = b + b;
  Tensor kept;
  c.register_hook([&](const Tensor& gr) {
    kept = gr * 1.0;
    return kept;
  });
  (c + d).sum().backward();
  EXPECT_EQ(kept.to_vector<double>(), (std::vector<double>{1, 1}));
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{10, 10}));  // 2 * (1 + 1 + 3)
}

TEST(Autograd, GradientsKeepTheLeafDtype) {
  // a float32 leaf used in a bfloat16 computation gets a float32 gradient
  Tensor w = ones({4}).requires_grad_();
  Tensor y = w.to(kBFloat16) * from_vector<float>({1, 2, 3, 4}, {4}, kBFloat16);
  EXPECT_EQ(y.dtype(), kBFloat16);
  y.backward(ones({4}, kBFloat16));
  EXPECT_EQ(w.grad().dtype(), kFloat32);
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
  // promotion in a mixed op: the half input's gradient comes back half
  Tensor h = ones({2}, kFloat16).requires_grad_();
  Tensor f = full({2}, 3.0).requires_grad_();
  (h * f).backward(ones({2}));
  EXPECT_EQ(h.grad().dtype(), kFloat16);
  EXPECT_EQ(h.grad().to_vector<float>(), (std::vector<float>{3, 3}));
  EXPECT_EQ(f.grad().dtype(), kFloat32);
}

TEST(Autograd, ViewGradients) {
  Tensor a = agt::rand64({3, 4});
  EXPECT_TRUE(agt::gradcheck([](const TL& t) { return t[0].transpose(0, 1).reshape({2, 6}) * 2.0; }, {a}));
  EXPECT_TRUE(agt::gradcheck([](const TL& t) { return t[0].narrow(1, 1, 2).select(0, 2); }, {a}));
  EXPECT_TRUE(agt::gradcheck([](const TL& t) { return t[0].permute({1, 0}).unsqueeze(0).expand({2, 4, 3}); }, {a}));
  EXPECT_TRUE(agt::gradcheck([](const TL& t) { return t[0].flatten().view({6, 2}).squeeze(); }, {a}));
  EXPECT_TRUE(agt::gradcheck([](const TL& t) { return cat({t[0], t[0] * 2.0}, 1); }, {a}));
  EXPECT_TRUE(agt::gradcheck([](const TL& t) { return stack({t[0], t[0].exp()}, 0); }, {a}));
  EXPECT_TRUE(agt::gradcheck([](const TL& t) { return t[0].split(3, 1)[1] * 5.0; }, {a}));
  EXPECT_TRUE(agt::gradcheck([](const TL& t) { return t[0].chunk(2, 1)[0].contiguous().clone(); }, {agt::non_contiguous(a)}));
  // split is one node for all its pieces (its backward writes one cat), also when a piece
  // is modified in place afterwards
  EXPECT_TRUE(agt::gradcheck([](const TL& t) {
    auto p = t[0].split(2, 1);
    return p[0] * 2.0 + p[1].exp();
  }, {a}));
  EXPECT_TRUE(agt::gradcheck([](const TL& t) {
    auto p = (t[0] * 1.0).split(2, 1);
    p[1].mul_(3.0);
    return p[0] * p[1];
  }, {a}));
  {
    Tensor x = agt::rand64({3, 4}).requires_grad_();
    auto p = x.split(3, 1);
    EXPECT_EQ(p[0].grad_fn(), p[1].grad_fn());
    EXPECT_EQ(p[1].output_nr(), 1u);
    EXPECT_EQ(p[0].grad_fn()->name(), "SplitBackward");
  }
  Tensor idx = from_vector<int64_t>({2, 0, 2}, {3});
  EXPECT_TRUE(agt::gradcheck([&](const TL& t) { return t[0].index_select(0, idx); }, {a}));
  Tensor gi = from_vector<int64_t>({3, 3, 0, 1, 2, 2}, {3, 2});
  EXPECT_TRUE(agt::gradcheck([&](const TL& t) { return t[0].gather(1, gi); }, {a}));
}
