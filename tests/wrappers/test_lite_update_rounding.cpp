// Lite's update rounding under 16-true / bf16-true (LiteOptions::update_rounding and
// count_stalled): the mode reaches every optimizer set up, each mode moves (or loses) a
// small update as documented, the stalled count says when updates are lost, and an
// iteration with counting on makes no host sync. Resume bit for bit under each mode:
// LiteCheckpoint.ResumedRunEqualsUninterruptedRunBitForBit (test_lite.cpp).
#include "support/testing.h"

using namespace ag;

namespace {

const hw::HardwareProfile& amx() {
  static const hw::HardwareProfile p = hw::profiles::cpu_amx();
  return p;
}

// A bf16-true linear layer whose weights are 1 and bias 0, stepped by SGD at a rate whose
// updates (about 1e-4) are far below half a bfloat16 ulp of 1 (2^-8).
struct SmallUpdates {
  std::shared_ptr<nn::Linear> net = std::make_shared<nn::Linear>(4, 4);
  optim::SGD sgd;
  Lite lite;
  LiteOptimizer opt;
  LiteModule<nn::Linear> model;
  explicit SmallUpdates(UpdateRounding r, const char* precision = "bf16-true")
      : sgd(init(net), {.lr = 1e-4}),
        lite({.accelerator = "cpu", .precision = precision, .update_rounding = r, .profile = &amx()}),
        opt(lite.setup_optimizer(sgd)),
        model(lite.setup_module(net)) {}
  static std::vector<Tensor> init(const std::shared_ptr<nn::Linear>& n) {
    NoGradGuard ng;
    n->weight.fill_(1.0);
    n->bias.fill_(0.0);
    return n->parameters();
  }
  void step() {
    opt.zero_grad();
    lite.backward(sum(model(ones({2, 4}))));  // every weight's gradient is 2
    opt.step();
  }
  std::vector<float> weights() const { return net->weight.to(kFloat32).to_vector<float>(); }
};

}  // namespace

TEST(LiteUpdateRounding, TheModeReachesTheOptimizerOnlyUnder16BitTrue) {
  SmallUpdates st(UpdateRounding::Stochastic);
  EXPECT_EQ(st.sgd.update_rounding(), UpdateRounding::Stochastic);
  EXPECT_TRUE(st.sgd.count_stalled());
  SmallUpdates master(UpdateRounding::Master);
  EXPECT_EQ(master.sgd.update_rounding(), UpdateRounding::Master);
  EXPECT_EQ(master.sgd.state_bytes(), size_t(4 * (16 + 4))) << "a float32 master per element";
  SmallUpdates f32(UpdateRounding::Stochastic, "32-true");
  EXPECT_EQ(f32.sgd.update_rounding(), UpdateRounding::Nearest) << "float32 parameters: the optimizer's own mode";
  EXPECT_FALSE(f32.sgd.count_stalled());
}

TEST(LiteUpdateRounding, NearestLosesSmallUpdatesAndSaysSoTheOthersKeepThem) {
  SmallUpdates nearest(UpdateRounding::Nearest), master(UpdateRounding::Master),
      compensated(UpdateRounding::Compensated), stochastic(UpdateRounding::Stochastic);
  for (int i = 0; i < 60; ++i)
    for (SmallUpdates* r : {&nearest, &master, &compensated, &stochastic}) r->step();
  // 60 steps of 2e-4 take a weight of 1 to 0.988: one bfloat16 ulp below 1 is 0.99609375.
  for (float w : nearest.weights()) EXPECT_EQ(w, 1.0f) << "nearest rounds every update away";
  EXPECT_EQ(nearest.opt.stalled_fraction(), 16.0 / 20.0) << "the 16 weights stalled; the bias (from 0) did not";
  EXPECT_EQ(nearest.opt.stalled_count().item<int64_t>(), 16);
  EXPECT_EQ(master.opt.stalled_fraction(), 0.0) << "the float32 master takes every update";
  for (SmallUpdates* r : {&master, &compensated})
    for (float w : r->weights()) EXPECT_NEAR(w, 1.0 - 60 * 2e-4, 2 * 0.00390625) << "within two ulps of the sum";
  double mean = 0;
  for (float w : stochastic.weights()) mean += w / 16.0;
  EXPECT_LT(mean, 1.0) << "stochastic rounding moves the weights down on average";
}

TEST(LiteUpdateRounding, AnIterationWithTheStalledCountMakesNoHostSync) {
  for (const char* precision : {"16-true", "bf16-true"})
    for (UpdateRounding r : {UpdateRounding::Nearest, UpdateRounding::Stochastic, UpdateRounding::Compensated}) {
      SCOPED_TRACE(std::string(precision) + " " + update_rounding_name(r));
      SmallUpdates run(r, precision);
      ASSERT_TRUE(run.sgd.count_stalled());
      run.step();
      EXPECT_EQ(agt::host_syncs_of([&] { run.step(); }), std::vector<std::string>{});
      EXPECT_EQ(run.opt.stalled_count().dim(), 0);
      EXPECT_EQ(run.opt.stalled_count().dtype(), kInt64);
    }
}
