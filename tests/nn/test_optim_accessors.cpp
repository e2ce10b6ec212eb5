// The optimizer's counters (step_count on the device, step_calls on the host) and
// set_master_weights, which turns float32 master weights on and off in every group.
#include "support/testing.h"

#include <functional>
#include <memory>

using namespace ag;

// step_count: the steps that updated the parameters, a 0-dim int64 tensor advanced on the
// device (a step skipped for found_inf is not counted, and nothing is read back);
// step_calls: every step() call, skipped ones included, counted on the host.
TEST(OptimAccessors, StepCountSkipsWhatFoundInfSkippedAndStepCallsCountsEveryCall) {
  Tensor p = from_vector<double>({1, 2}, {2}).requires_grad_();
  optim::SGD sgd({p}, {.lr = 0.5});
  EXPECT_EQ(sgd.step_count().dim(), 0);
  EXPECT_EQ(sgd.step_count().dtype(), kInt64);
  EXPECT_EQ(sgd.step_count().device(), p.device());
  EXPECT_EQ(sgd.step_count().item<int64_t>(), 0);
  EXPECT_EQ(sgd.step_calls(), 0);

  // clean, clean with a flag, raised, clean: the parameters move three times of four
  const bool overflow[] = {false, false, true, false};
  std::vector<double> want = {1, 2};
  int64_t updates = 0;
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    p.set_grad(from_vector<double>({1, -1}, {2}));
    const Tensor flag = full({1}, overflow[i] ? 1.0 : 0.0, kFloat32);
    EXPECT_EQ(agt::host_syncs_of([&] {
                if (i == 0) sgd.step();
                else sgd.step(flag);
                (void)sgd.step_count();
                (void)sgd.step_calls();
              }),
              std::vector<std::string>{});
    if (!overflow[i]) {
      ++updates;
      want = {want[0] - 0.5, want[1] + 0.5};
    }
    EXPECT_EQ(p.to_vector<double>(), want);
    EXPECT_EQ(sgd.step_count().item<int64_t>(), updates);
    EXPECT_EQ(sgd.steps(), updates);
    EXPECT_EQ(sgd.step_calls(), i + 1);
  }
  // The count is part of the state: a new optimizer loaded from it goes on from there, and
  // its own calls start at 0 (host bookkeeping of this object).
  Tensor q = p.detach().clone().requires_grad_();
  optim::SGD resumed({q}, {.lr = 0.5});
  resumed.load_state_dict(sgd.state_dict());
  EXPECT_EQ(resumed.step_count().item<int64_t>(), 3);
  EXPECT_EQ(resumed.step_calls(), 0);
}

// set_master_weights(on) applies to every group of SGD, Adam and AdamW: off, a bfloat16
// parameter of 1 cannot take a step of 1e-4 (it rounds back); on, a float32 copy made from
// the parameter accumulates the steps and the parameter gets its rounding; a second
// set_master_weights(true) keeps the copy (it is not remade from the rounded parameter); off
// again, the parameter is updated itself and holds still.
TEST(OptimAccessors, SetMasterWeightsTurnsMastersOnAndOffInEveryGroup) {
  constexpr double kLr = 1e-4;
  using Make = std::function<std::unique_ptr<optim::Optimizer>(Tensor, Tensor)>;
  const std::vector<std::pair<const char*, Make>> kinds = {
      {"SGD",
       [](Tensor a, Tensor b) {
         return std::make_unique<optim::SGD>(std::vector<optim::SGD::ParamGroup>{{{a}, {.lr = kLr}}, {{b}, {.lr = kLr}}});
       }},
      {"Adam",
       [](Tensor a, Tensor b) {
         return std::make_unique<optim::Adam>(
             std::vector<optim::Adam::ParamGroup>{{{a}, {.lr = kLr}}, {{b}, {.lr = kLr}}});
       }},
      {"AdamW",
       [](Tensor a, Tensor b) {
         return std::make_unique<optim::AdamW>(std::vector<optim::AdamW::ParamGroup>{
             {{a}, {.lr = kLr, .weight_decay = 0}}, {{b}, {.lr = kLr, .weight_decay = 0}}});
       }},
  };
  for (const auto& [name, make] : kinds) {
    SCOPED_TRACE(name);
    const Tensor a = ones({4}, kBFloat16).requires_grad_(), b = ones({4}, kBFloat16).requires_grad_();
    auto opt = make(a, b);
    // A constant gradient of 1: SGD and Adam alike move by lr a step (Adam's m / sqrt(v) is 1).
    auto steps = [&](int n) {
      for (int i = 0; i < n; ++i) {
        a.set_grad(ones({4}, kBFloat16));
        b.set_grad(ones({4}, kBFloat16));
        opt->step();
      }
    };
    auto masters = [&](const char* when, double value) {
      const auto sd = opt->state_dict();
      for (const char* key : {"state.0.0.master", "state.1.0.master"}) {
        SCOPED_TRACE(std::string(when) + ", " + key);
        ASSERT_TRUE(sd.count(key));
        EXPECT_EQ(sd.at(key).dtype(), kFloat32);
        EXPECT_TRUE(agt::allclose(sd.at(key), full({4}, value), 1e-6, 1e-6));
      }
    };
    auto params_are = [&](const char* when, double value) {
      for (const Tensor& p : {a, b}) EXPECT_EQ(p.to_vector<double>(), std::vector<double>(4, value)) << when;
    };

    steps(10);
    params_are("off", 1.0);
    EXPECT_FALSE(opt->state_dict().count("state.0.0.master"));
    EXPECT_FALSE(opt->state_dict().count("state.1.0.master"));

    opt->set_master_weights(true);
    steps(40);
    masters("on", 1 - 40 * kLr);              // 0.996
    params_are("on", 0.99609375);             // its bfloat16 rounding
    opt->set_master_weights(true);            // already on: the masters stay
    steps(1);
    masters("on again", 1 - 41 * kLr);        // remade from 0.99609375 it would be 0.99599375
    opt->set_master_weights(false);
    steps(40);                                // with masters: 0.9919, rounded to 0.9921875
    params_are("off again", 0.99609375);      // spacing 2^-9 here: a step of 1e-4 rounds back
  }
}
