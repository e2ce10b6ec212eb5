// Cast shadows (ampgrad/cast_shadow.h): the optimizer step writes each float32 parameter's
// 16-bit rounding with its update, and autocast's next cast reads it. Training must come
// out bit for bit as with a fresh cast every time (autocast's cache off: no shadows), and a
// shadow must never be used once the parameter changed, nor be written while someone
// still holds the cast it backs.
#include "support/testing.h"

#include "ampgrad/cast_shadow.h"

using namespace ag;

namespace {

struct Net {
  Tensor w1, b1, w2, b2;
  explicit Net(uint64_t seed) {
    manual_seed(seed);
    w1 = (randn({48, 32}) * 0.2f).requires_grad_();
    b1 = zeros({48}).requires_grad_();
    w2 = (randn({10, 48}) * 0.2f).requires_grad_();
    b2 = zeros({10}).requires_grad_();
  }
  std::vector<Tensor> params() const { return {w1, b1, w2, b2}; }
  Tensor loss(const Tensor& x, const Tensor& y) const {
    return cross_entropy(linear(relu(linear(x, w1, b1)), w2, b2), y);
  }
};

enum class Opt { AdamW, SgdMomentum };

std::unique_ptr<optim::Optimizer> make_opt(Opt o, const Net& n) {
  if (o == Opt::AdamW) return std::make_unique<optim::AdamW>(n.params(), optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
  return std::make_unique<optim::SGD>(n.params(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
}

// One training step in the user's loop: forward under autocast, backward and step outside.
void train_step(const Net& n, optim::Optimizer& opt, DType dt, bool cache, const Tensor& x, const Tensor& y) {
  Tensor loss;
  {
    AutocastGuard g(kCPU, dt, true, cache);
    loss = n.loss(x, y);
  }
  opt.zero_grad();
  loss.backward();
  opt.step();
}

}  // namespace

TEST(CastShadow, TrainingMatchesAFreshCastEveryStepBitForBit) {
  for (DType dt : {kBFloat16, kFloat16})
    for (Opt o : {Opt::AdamW, Opt::SgdMomentum}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (o == Opt::AdamW ? " AdamW" : " SGD"));
      Net shadowed(7), fresh(7);
      auto opt_s = make_opt(o, shadowed), opt_f = make_opt(o, fresh);
      manual_seed(11);
      const Tensor x = randn({64, 32}), y = randint(0, 10, {64});
      for (int step = 0; step < 5; ++step) {
        train_step(shadowed, *opt_s, dt, true, x, y);
        train_step(fresh, *opt_f, dt, false, x, y);
        // From the first step on the shadow is the written rounding of the new value...
        const Tensor sh = detail::shadow_cast(shadowed.w1, dt);
        ASSERT_TRUE(sh.defined()) << "step " << step;
        EXPECT_TRUE(agt::same_bits(sh, shadowed.w1.detach().to(dt)));
        // ...and what autocast's next cast gives out: the same memory, with the autograd
        // edge to the parameter.
        AutocastGuard g(kCPU, dt);
        const Tensor c = autocast::cast_inputs(op::linear, {x, shadowed.w1})[1];
        EXPECT_TRUE(c.is_alias_of(sh));
        EXPECT_NE(c.grad_fn(), nullptr);
      }
      for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(agt::same_bits(shadowed.params()[i], fresh.params()[i])) << "param " << i;
    }
}

// Forwards with no step between them (gradient accumulation's micro-batches) share the
// first one's cast, until the parameter changes.
TEST(CastShadow, ForwardsBeforeTheNextStepShareOneCast) {
  Net n(12);
  const Tensor x = randn({16, 32});
  Tensor first;
  {
    AutocastGuard g(kCPU, kBFloat16);
    first = autocast::cast_inputs(op::linear, {x, n.w1})[1];
  }
  const Tensor sh = detail::shadow_cast(n.w1, kBFloat16);
  ASSERT_TRUE(sh.defined());
  EXPECT_TRUE(sh.is_alias_of(first));
  EXPECT_TRUE(agt::same_bits(sh, n.w1.detach().to(kBFloat16)));
  {
    AutocastGuard g(kCPU, kBFloat16);  // a new region: its own cache, the same cast
    const Tensor second = autocast::cast_inputs(op::linear, {x, n.w1})[1];
    EXPECT_TRUE(second.is_alias_of(first));
    EXPECT_NE(second.grad_fn(), nullptr);
  }
  {
    NoGradGuard ng;
    n.w1.add_(1.0f);
  }
  EXPECT_FALSE(detail::shadow_cast(n.w1, kBFloat16).defined());
  AutocastGuard g(kCPU, kBFloat16);
  const Tensor third = autocast::cast_inputs(op::linear, {x, n.w1})[1];
  EXPECT_FALSE(third.is_alias_of(first));
  EXPECT_TRUE(agt::same_bits(third, n.w1.detach().to(kBFloat16)));
  EXPECT_FALSE(agt::same_bits(first, third));
}

// Gradient accumulation over micro-batches, then a step: the same bits as with a fresh cast
// in every forward (autocast's cache off: no shadows).
TEST(CastShadow, GradientAccumulationMatchesFreshCastsBitForBit) {
  for (DType dt : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    Net shadowed(13), fresh(13);
    optim::AdamW opt_s(shadowed.params(), {.lr = 1e-2}), opt_f(fresh.params(), {.lr = 1e-2});
    manual_seed(14);
    std::vector<Tensor> xs, ys;
    for (int m = 0; m < 3; ++m) xs.push_back(randn({16, 32})), ys.push_back(randint(0, 10, {16}));
    for (int step = 0; step < 3; ++step) {
      for (auto [net, opt, cache] : {std::tuple{&shadowed, &opt_s, true}, std::tuple{&fresh, &opt_f, false}}) {
        opt->zero_grad();
        for (int m = 0; m < 3; ++m) {
          Tensor loss;
          {
            AutocastGuard g(kCPU, dt, true, cache);
            loss = net->loss(xs[size_t(m)], ys[size_t(m)]);
          }
          loss.backward();
        }
      }
      for (size_t i = 0; i < 4; ++i)
        EXPECT_TRUE(agt::same_bits(shadowed.params()[i].grad(), fresh.params()[i].grad())) << "step " << step << " grad " << i;
      opt_s.step();
      opt_f.step();
    }
    for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(agt::same_bits(shadowed.params()[i], fresh.params()[i])) << "param " << i;
  }
}

TEST(CastShadow, AnInPlaceWriteAfterTheStepMakesAutocastCastAgain) {
  Net n(3);
  optim::AdamW opt(n.params(), {.lr = 1e-2});
  const Tensor x = randn({16, 32}), y = randint(0, 10, {16});
  train_step(n, opt, kBFloat16, true, x, y);
  ASSERT_TRUE(detail::shadow_cast(n.w1, kBFloat16).defined());
  EXPECT_FALSE(detail::shadow_cast(n.w1, kFloat16).defined());  // another dtype: none
  {
    NoGradGuard ng;
    n.w1.mul_(2.0f);
  }
  EXPECT_FALSE(detail::shadow_cast(n.w1, kBFloat16).defined());
  AutocastGuard g(kCPU, kBFloat16);
  const Tensor c = autocast::cast_inputs(op::linear, {x, n.w1})[1];
  EXPECT_TRUE(agt::same_bits(c, n.w1.detach().to(kBFloat16)));
}

// New storage restarts the version count: a parameter given new values whose version has
// caught up with the shadow's must still not get the old shadow.
TEST(CastShadow, NewStorageWithTheSameVersionIsNotFooledByTheOldShadow) {
  Net n(6);
  optim::SGD opt(n.params(), {.lr = 0.1});
  const Tensor x = randn({16, 32}), y = randint(0, 10, {16});
  train_step(n, opt, kBFloat16, true, x, y);
  const uint64_t v = n.w1.version();
  ASSERT_TRUE(detail::shadow_cast(n.w1, kBFloat16).defined());
  const Tensor fresh = randn({48, 32});
  while (fresh.version() < v) detail::bump_version(fresh);
  nn::set_data(n.w1, fresh);
  ASSERT_EQ(n.w1.version(), v);
  EXPECT_FALSE(detail::shadow_cast(n.w1, kBFloat16).defined());
  AutocastGuard g(kCPU, kBFloat16);
  EXPECT_TRUE(agt::same_bits(autocast::cast_inputs(op::linear, {x, n.w1})[1], fresh.to(kBFloat16)));
}

TEST(CastShadow, ACastStillHeldKeepsItsValuesAndTheStepWritesANewBuffer) {
  Net n(5);
  optim::AdamW opt(n.params(), {.lr = 1e-2});
  const Tensor x = randn({16, 32}), y = randint(0, 10, {16});
  train_step(n, opt, kBFloat16, true, x, y);  // the shadow now exists and is valid
  Tensor held, loss;
  {
    AutocastGuard g(kCPU, kBFloat16);
    held = autocast::cast_inputs(op::linear, {x, n.w1})[1];
    loss = n.loss(x, y);
  }
  const Tensor before = held.detach().clone();
  opt.zero_grad();
  loss.backward();
  opt.step();
  EXPECT_TRUE(agt::same_bits(held, before));
  const Tensor sh = detail::shadow_cast(n.w1, kBFloat16);
  ASSERT_TRUE(sh.defined());
  EXPECT_FALSE(sh.is_alias_of(held));
  EXPECT_TRUE(agt::same_bits(sh, n.w1.detach().to(kBFloat16)));
}

TEST(CastShadow, ASkippedStepLeavesTheRoundingOfTheUnchangedParameter) {
  Net n(9);
  optim::SGD opt(n.params(), {.lr = 0.1});
  const Tensor x = randn({16, 32}), y = randint(0, 10, {16});
  train_step(n, opt, kBFloat16, true, x, y);
  // Hold the cast so that the skipped step gets a new, never written buffer.
  Tensor held, loss;
  {
    AutocastGuard g(kCPU, kBFloat16);
    held = autocast::cast_inputs(op::linear, {x, n.w1})[1];
    loss = n.loss(x, y);
  }
  opt.zero_grad();
  loss.backward();
  const Tensor w_before = n.w1.detach().clone();
  opt.step(full({}, 1.0, kFloat32));  // found_inf: the update is skipped
  EXPECT_TRUE(agt::same_bits(n.w1, w_before));
  const Tensor sh = detail::shadow_cast(n.w1, kBFloat16);
  ASSERT_TRUE(sh.defined());
  EXPECT_FALSE(sh.is_alias_of(held));
  EXPECT_TRUE(agt::same_bits(sh, w_before.to(kBFloat16)));
}

TEST(CastShadow, TheStepBumpsTheVersionAndInferenceKeepsNoShadow) {
  Net n(4);
  const Tensor x = randn({8, 32});
  {
    NoGradGuard ng;
    AutocastGuard g(kCPU, kBFloat16);
    n.loss(x, randint(0, 10, {8}));
  }
  EXPECT_FALSE(detail::shadow_buffer(n.w1).defined());  // nothing kept without grad mode
  optim::SGD opt(n.params(), {.lr = 0.1});
  train_step(n, opt, kBFloat16, true, x, randint(0, 10, {8}));
  const uint64_t v = n.w1.version();
  n.w1.set_grad(ones({48, 32}));
  opt.step();
  EXPECT_GT(n.w1.version(), v);  // written in place: what was derived from the old value is stale
}

// A class derived from SGD may update its parameters its own way: it gets no casts unless
// it says it writes them, so autocast casts afresh after its steps.
namespace {
class HalvingSgd : public optim::SGD {
 public:
  using SGD::SGD;

 protected:
  void step_lists(size_t, const OptimizerLists& l) override {
    EXPECT_TRUE(l.casts.empty());
    for (Tensor p : l.params) p.mul_(0.5f);
  }
};
}  // namespace

TEST(CastShadow, ADerivedOptimizerGetsNoCastsUnlessItSaysSo) {
  Net n(8);
  HalvingSgd opt(n.params(), {.lr = 0.1});
  const Tensor x = randn({16, 32}), y = randint(0, 10, {16});
  train_step(n, opt, kBFloat16, true, x, y);
  train_step(n, opt, kBFloat16, true, x, y);
  EXPECT_FALSE(detail::shadow_cast(n.w1, kBFloat16).defined());
  AutocastGuard g(kCPU, kBFloat16);
  EXPECT_TRUE(agt::same_bits(autocast::cast_inputs(op::linear, {x, n.w1})[1], n.w1.detach().to(kBFloat16)));
}

TEST(CastShadow, BadCastListsAreRefusedByName) {
  Tensor p = randn({4, 4}), g = randn({4, 4});
  OptimizerLists l;
  l.params = {p};
  l.grads = {g};
  l.buf1 = {zeros({4, 4})};
  l.buf2 = {zeros({4, 4})};
  l.masters = {Tensor()};
  l.steps = {zeros({}, kInt64)};
  l.lr = {0.1, Tensor()};
  Backend& be = backend(kCPU, "test");
  ASSERT_TRUE(be.optimizer_writes_casts());
  const auto expect = [](const std::function<void()>& f, const std::vector<std::string>& parts) {
    const std::string msg = agt::error_of(f);
    for (const std::string& part : parts) EXPECT_TRUE(agt::contains(msg, part)) << msg << " lacks " << part;
  };
  l.casts = {empty({4, 3}, kBFloat16)};
  expect([&] { be.adam_step(l, {.decoupled = true}); }, {"AdamW", "cast of parameter 0", "[4, 3]"});
  l.casts = {empty({4, 4}, kFloat32)};
  expect([&] { be.adam_step(l, {}); }, {"[Adam]", "float16 or bfloat16", "float32"});
  l.casts = {Tensor(), Tensor()};
  expect([&] { be.sgd_step(l, {}); }, {"SGD", "2 entries for 1 parameters"});
  EXPECT_TRUE(agt::same_bits(p, l.params[0]));  // nothing was written
}
