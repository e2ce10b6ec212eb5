// Overflow attribution under 16-mixed (LiteOptimizer::explain_overflow, LiteOptions::
// report_overflows): a skipped step names the parameters whose gradients held inf or NaN by
// module path, says whether the loss itself was finite, and carries the loss scale before
// and after; with the report off, a skipped iteration still makes no host sync.
#include "support/testing.h"

#include <cmath>
#include <limits>

using namespace ag;

namespace {

// A small 16-mixed run whose gradients can be poisoned: `poison` multiplies the gradient of
// the named parameters by `factor` (inf or NaN) during backward.
struct Mixed16Run {
  hw::HardwareProfile profile = hw::profiles::cpu_amx();  // 16-mixed native: no warning
  std::shared_ptr<nn::Sequential> net = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(6, 8), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(8, 3)});
  optim::SGD sgd{net->parameters(), {.lr = 0.1}};
  std::vector<std::string> warnings;
  Lite lite;
  LiteModule<nn::Sequential> model;
  LiteOptimizer opt;
  std::set<std::string> poisoned;
  float factor = std::numeric_limits<float>::infinity();

  explicit Mixed16Run(bool report)
      : lite({.accelerator = "cpu",
              .precision = "16-mixed",
              .scaler = {.init_scale = 1024.0, .growth_interval = 1000},
              .report_overflows = report,
              .profile = &profile,
              .warn = [this](const std::string& line) { warnings.push_back(line); }}) {
    for (const auto& [name, p] : net->named_parameters()) {
      const std::string n = name;
      p.register_hook([this, n](const Tensor& g) { return poisoned.count(n) ? g * factor : Tensor(); });
    }
    auto set = lite.setup(net, sgd);
    model = set.first;
    opt = set.second;
  }
  StepResult iteration(float logit_scale = 1) {
    manual_seed(3);
    opt.zero_grad();
    Tensor loss = cross_entropy(mul(model(randn({4, 6})), logit_scale), randint(0, 3, {4}));
    lite.backward(loss);
    return opt.step();
  }
};

}  // namespace

TEST(OverflowReport, NamesTheParameterWhoseGradientOverflowed) {
  Mixed16Run run(false);
  run.poisoned = {"2.weight"};
  const StepResult r = run.iteration();
  EXPECT_FALSE(bool(r));
  EXPECT_EQ(r.scale_before(), 1024.0);
  EXPECT_EQ(r.scale_after(), 512.0) << "a skipped step halves the scale";
  const OverflowReport rep = run.opt.explain_overflow();
  ASSERT_TRUE(rep.skipped);
  EXPECT_TRUE(rep.loss_finite) << rep.loss;
  ASSERT_EQ(rep.nonfinite_parameters, 1);
  ASSERT_EQ(rep.parameters.size(), 1u);
  EXPECT_EQ(rep.parameters[0].name, "2.weight");
  EXPECT_EQ(rep.parameters[0].shape, (std::vector<int64_t>{3, 8}));
  EXPECT_EQ(rep.parameters[0].nan + rep.parameters[0].inf, 24) << "every element of the poisoned gradient";
  EXPECT_EQ(rep.scale_before, 1024.0);
  EXPECT_EQ(rep.scale_after, 512.0);
  const std::string line = rep.describe();
  EXPECT_NE(line.find("step skipped: the loss was finite"), std::string::npos) << line;
  EXPECT_NE(line.find("1 parameter's gradient held inf/NaN: 2.weight [3, 8]"), std::string::npos) << line;
  EXPECT_NE(line.find("loss scale 1024 -> 512"), std::string::npos) << line;
}

TEST(OverflowReport, NaNAndTheLimitAreSaid) {
  Mixed16Run run(false);
  run.poisoned = {"0.weight", "0.bias", "2.bias"};
  run.factor = std::numeric_limits<float>::quiet_NaN();
  run.iteration();
  const OverflowReport rep = run.opt.explain_overflow(2);
  ASSERT_EQ(rep.nonfinite_parameters, 3);
  ASSERT_EQ(rep.parameters.size(), 2u);
  EXPECT_EQ(rep.parameters[0].name, "0.weight") << "in the optimizer's order";
  EXPECT_EQ(rep.parameters[1].name, "0.bias");
  EXPECT_EQ(rep.parameters[1].nan, 8);
  EXPECT_EQ(rep.parameters[1].inf, 0);
  EXPECT_NE(rep.describe().find("0.bias [8] (8 NaN), and 1 more"), std::string::npos) << rep.describe();
}

TEST(OverflowReport, SaysWhenTheLossItselfWasNotFinite) {
  Mixed16Run run(false);
  run.iteration(std::numeric_limits<float>::quiet_NaN());  // NaN logits: the loss itself is NaN
  const OverflowReport rep = run.opt.explain_overflow();
  ASSERT_TRUE(rep.skipped);
  EXPECT_FALSE(rep.loss_finite) << rep.loss;
  EXPECT_NE(rep.describe().find("the loss was not finite"), std::string::npos) << rep.describe();
}

TEST(OverflowReport, AStepThatWasNotSkippedHasNothingToExplain) {
  Mixed16Run run(false);
  const StepResult r = run.iteration();
  EXPECT_TRUE(bool(r));
  EXPECT_EQ(r.scale_before(), 1024.0);
  EXPECT_EQ(r.scale_after(), 1024.0);
  EXPECT_FALSE(run.opt.explain_overflow().skipped);
  EXPECT_EQ(run.opt.explain_overflow().describe(), "the last step was not skipped");
  // Without a scaler there are no scales and nothing is skipped.
  const hw::HardwareProfile amx = hw::profiles::cpu_amx();
  auto net = std::make_shared<nn::Linear>(2, 2);
  optim::SGD sgd(net->parameters(), {.lr = 0.1});
  Lite lite({.accelerator = "cpu", .precision = "32-true", .profile = &amx});
  auto [m, o] = lite.setup(net, sgd);
  lite.backward(sum(m(randn({3, 2}))));
  const StepResult plain = o.step();
  EXPECT_TRUE(std::isnan(plain.scale_before()));
  EXPECT_FALSE(o.explain_overflow().skipped);
}

TEST(OverflowReport, ReportOverflowsWarnsOncePerSkippedStepAndCostsNothingWhenOff) {
  Mixed16Run off(false);
  off.poisoned = {"2.weight"};
  EXPECT_EQ(agt::host_syncs_of([&] { off.iteration(); }), std::vector<std::string>{})
      << "with the report off, a skipped iteration reads nothing from the device";
  EXPECT_TRUE(off.warnings.empty());

  Mixed16Run on(true);
  on.iteration();
  EXPECT_TRUE(on.warnings.empty()) << "a clean step says nothing";
  on.poisoned = {"2.weight"};
  on.iteration();
  ASSERT_EQ(on.warnings.size(), 1u);
  EXPECT_NE(on.warnings[0].find("2.weight [3, 8]"), std::string::npos) << on.warnings[0];
}
