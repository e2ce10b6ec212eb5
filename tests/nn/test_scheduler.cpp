// Learning-rate schedules against their formulas, composition, and the LRScheduler that
// applies a schedule to every parameter group relative to the group's own base rate.
#include "support/testing.h"

#include <cmath>

using namespace ag;

namespace {

double cosine(int64_t t, double base, int64_t t_max, double eta_min) {
  const double x = double(std::min(t, t_max)) / double(t_max);
  return eta_min + (base - eta_min) * (1 + std::cos(M_PI * x)) / 2;
}

double warmup(int64_t t, double base, int64_t steps, double start) {
  return base * (start + (1 - start) * double(std::min(t, steps)) / double(steps));
}

}  // namespace

TEST(SchedStepDecay, Formula) {
  auto s = optim::StepDecay({.step_size = 3, .gamma = 0.5});
  const double expected[] = {0.2, 0.2, 0.2, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025};
  for (int64_t t = 0; t < 10; ++t) EXPECT_NEAR(s->lr(t, 0.2), expected[t], 1e-15) << "t = " << t;
  EXPECT_NEAR(s->lr(30, 1.0), std::pow(0.5, 10), 1e-15);
  auto every = optim::StepDecay({.step_size = 1, .gamma = 0.1});
  EXPECT_NEAR(every->lr(2, 1.0), 0.01, 1e-15);
  EXPECT_AG_ERROR(optim::StepDecay({.step_size = 0}), "[StepDecay] step_size must be positive, got 0");
}

TEST(SchedCosine, FormulaAndFloor) {
  auto s = optim::CosineAnnealing({.t_max = 10, .eta_min = 0.01});
  EXPECT_DOUBLE_EQ(s->lr(0, 0.1), 0.1);
  EXPECT_NEAR(s->lr(5, 0.1), 0.055, 1e-15);  // halfway: the mean of base and eta_min
  EXPECT_NEAR(s->lr(10, 0.1), 0.01, 1e-15);
  for (int64_t t : {1, 2, 3, 7, 9})
    EXPECT_NEAR(s->lr(t, 0.1), cosine(t, 0.1, 10, 0.01), 1e-15) << "t = " << t;
  EXPECT_NEAR(s->lr(2, 0.1), 0.01 + 0.09 * (1 + std::cos(M_PI * 0.2)) / 2, 1e-15);
  // constant at eta_min after t_max
  EXPECT_NEAR(s->lr(11, 0.1), 0.01, 1e-15);
  EXPECT_NEAR(s->lr(100, 0.1), 0.01, 1e-15);
  // decreasing over [0, t_max]
  for (int64_t t = 0; t < 10; ++t) EXPECT_GT(s->lr(t, 0.1), s->lr(t + 1, 0.1));
  auto zero_floor = optim::CosineAnnealing({.t_max = 4});
  EXPECT_NEAR(zero_floor->lr(1, 1.0), (1 + std::sqrt(0.5)) / 2, 1e-15);
  EXPECT_NEAR(zero_floor->lr(4, 1.0), 0.0, 1e-15);
  EXPECT_AG_ERROR(optim::CosineAnnealing({.t_max = 0}), "t_max must be positive");
}

TEST(SchedWarmup, Formula) {
  auto s = optim::LinearWarmup({.steps = 4});
  const double expected[] = {0, 0.25, 0.5, 0.75, 1, 1, 1};
  for (int64_t t = 0; t < 7; ++t) EXPECT_NEAR(s->lr(t, 2.0), 2.0 * expected[t], 1e-15) << "t = " << t;
  auto st = optim::LinearWarmup({.steps = 5, .start_factor = 0.2});
  for (int64_t t : {0, 1, 3, 5, 8}) EXPECT_NEAR(st->lr(t, 0.5), warmup(t, 0.5, 5, 0.2), 1e-15) << "t = " << t;
  EXPECT_NEAR(st->lr(0, 0.5), 0.1, 1e-15);
  EXPECT_NEAR(st->lr(1, 0.5), 0.5 * (0.2 + 0.8 / 5), 1e-15);
  EXPECT_AG_ERROR(optim::LinearWarmup({.steps = 0}), "steps must be positive");
  EXPECT_AG_ERROR(optim::LinearWarmup({.steps = 2, .start_factor = 1.5}), "start_factor must be in [0, 1]");
}

TEST(SchedSequence, WarmupThenCosine) {
  auto s = optim::Sequence({optim::LinearWarmup({.steps = 5}), optim::CosineAnnealing({.t_max = 10, .eta_min = 0.0})},
                           {5});
  const double base = 0.4;
  for (int64_t t = 0; t < 5; ++t) EXPECT_NEAR(s->lr(t, base), base * double(t) / 5, 1e-15) << "t = " << t;
  // the cosine counts its own steps from the milestone
  for (int64_t t = 5; t <= 20; ++t) EXPECT_NEAR(s->lr(t, base), cosine(t - 5, base, 10, 0), 1e-15) << "t = " << t;
  EXPECT_NEAR(s->lr(5, base), base, 1e-15);
  EXPECT_NEAR(s->lr(10, base), base / 2, 1e-15);
  EXPECT_NEAR(s->lr(15, base), 0, 1e-15);

  // three parts: constant (a warmup already done), step decay, then cosine
  auto three = optim::Sequence({optim::LinearWarmup({.steps = 1, .start_factor = 1}),
                                optim::StepDecay({.step_size = 2, .gamma = 0.5}), optim::CosineAnnealing({.t_max = 4})},
                               {3, 7});
  EXPECT_NEAR(three->lr(0, 1.0), 1.0, 1e-15);
  EXPECT_NEAR(three->lr(2, 1.0), 1.0, 1e-15);
  EXPECT_NEAR(three->lr(3, 1.0), 1.0, 1e-15);    // step decay at its t = 0
  EXPECT_NEAR(three->lr(5, 1.0), 0.5, 1e-15);    // its t = 2
  EXPECT_NEAR(three->lr(6, 1.0), 0.5, 1e-15);
  EXPECT_NEAR(three->lr(7, 1.0), 1.0, 1e-15);    // cosine at its t = 0, from the base
  EXPECT_NEAR(three->lr(9, 1.0), 0.5, 1e-15);
  EXPECT_NEAR(three->lr(20, 1.0), 0.0, 1e-15);

  EXPECT_AG_ERROR(optim::Sequence({optim::LinearWarmup({})}, {3}), "expected 0 milestones for 1 schedules, got 1");
  EXPECT_AG_ERROR(optim::Sequence({optim::LinearWarmup({}), optim::LinearWarmup({}), optim::LinearWarmup({})}, {5, 5}),
                  "milestones must be positive and increasing");
  EXPECT_AG_ERROR(optim::Sequence({}, {}), "[Sequence]");
}

TEST(SchedChain, MultipliesFactors) {
  auto s = optim::Chain({optim::LinearWarmup({.steps = 4}), optim::StepDecay({.step_size = 3, .gamma = 0.1})});
  for (int64_t t = 0; t < 10; ++t) {
    const double expect = 2.0 * std::min(double(t), 4.0) / 4 * std::pow(0.1, double(t / 3));
    EXPECT_NEAR(s->lr(t, 2.0), expect, 1e-14) << "t = " << t;
  }
  // order does not matter for factor schedules
  auto r = optim::Chain({optim::StepDecay({.step_size = 3, .gamma = 0.1}), optim::LinearWarmup({.steps = 4})});
  for (int64_t t = 0; t < 10; ++t) EXPECT_NEAR(r->lr(t, 2.0), s->lr(t, 2.0), 1e-14);
  auto one = optim::Chain({optim::CosineAnnealing({.t_max = 8})});
  EXPECT_NEAR(one->lr(4, 3.0), 1.5, 1e-14);
  EXPECT_AG_ERROR(optim::Chain({}), "expected at least one schedule");
}

TEST(SchedLRScheduler, SetsEveryGroupRelativeToItsBase) {
  Tensor a = zeros({2}).requires_grad_(), b = zeros({2}).requires_grad_();
  optim::SGD opt(std::vector<optim::SGD::ParamGroup>{{{a}, {.lr = 0.1}}, {{b}, {.lr = 0.02}}});
  optim::LRScheduler sched(opt, optim::StepDecay({.step_size = 2, .gamma = 0.5}));
  EXPECT_EQ(sched.last_step(), 0);
  EXPECT_NEAR(opt.lr(0), 0.1, 1e-15);
  EXPECT_NEAR(opt.lr(1), 0.02, 1e-15);
  const double f[] = {1, 1, 0.5, 0.5, 0.25, 0.25, 0.125};
  for (int64_t t = 1; t < 7; ++t) {
    sched.step();
    EXPECT_EQ(sched.last_step(), t);
    EXPECT_NEAR(opt.lr(0), 0.1 * f[t], 1e-15) << "t = " << t;
    EXPECT_NEAR(opt.lr(1), 0.02 * f[t], 1e-15) << "t = " << t;
    EXPECT_NEAR(sched.last_lr(1), 0.02 * f[t], 1e-15);
  }
  // the schedule acts on the rate the optimizer steps with
  Tensor p = zeros({1}).requires_grad_();
  optim::SGD o2({p}, {.lr = 1.0});
  optim::LRScheduler warm(o2, optim::LinearWarmup({.steps = 2}));
  EXPECT_NEAR(o2.lr(), 0.0, 1e-15);  // step 0 applied at construction
  p.set_grad(ones({1}));
  o2.step();
  EXPECT_EQ(p.to_vector<double>(), std::vector<double>{0.0});
  warm.step();
  o2.step();
  EXPECT_NEAR(p.to_vector<double>()[0], -0.5, 1e-7);
  warm.step();
  o2.step();
  EXPECT_NEAR(p.to_vector<double>()[0], -1.5, 1e-7);
  warm.step();
  EXPECT_NEAR(o2.lr(), 1.0, 1e-15);

  // warmup then cosine over a run, every group following its own base
  Tensor c = zeros({1}).requires_grad_(), d = zeros({1}).requires_grad_();
  optim::AdamW aw(std::vector<optim::AdamW::ParamGroup>{{{c}, {.lr = 3e-3}}, {{d}, {.lr = 1e-3}}});
  auto seq = optim::Sequence({optim::LinearWarmup({.steps = 10}), optim::CosineAnnealing({.t_max = 90, .eta_min = 1e-5})},
                             {10});
  optim::LRScheduler s2(aw, seq);
  for (int64_t t = 1; t <= 100; ++t) {
    s2.step();
    const double e0 = t < 10 ? 3e-3 * double(t) / 10 : cosine(t - 10, 3e-3, 90, 1e-5);
    const double e1 = t < 10 ? 1e-3 * double(t) / 10 : cosine(t - 10, 1e-3, 90, 1e-5);
    ASSERT_NEAR(aw.lr(0), e0, 1e-15) << "t = " << t;
    ASSERT_NEAR(aw.lr(1), e1, 1e-15) << "t = " << t;
  }
  EXPECT_NEAR(aw.lr(0), 1e-5, 1e-15);
  EXPECT_AG_ERROR(optim::LRScheduler(aw, nullptr), "schedule is null");
}
