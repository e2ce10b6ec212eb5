// The asynchronous contract, proven on the CPU: a 16-mixed training iteration through Lite
// (two optimizers, a scheduler, gradient clipping, a data loader) makes no host sync —
// the grad scaler, the optimizers' skip decision, the step counters and the learning rate
// all stay on the device — including an iteration whose gradients overflow, after which
// the parameters, the step counters and the learning rate are unchanged and the scale is
// halved. The CPU counts every host read a GPU would wait for (ampgrad/sync.h), so zero
// here means zero there.
#include "support/testing.h"

#include <cmath>
#include <limits>

using namespace ag;

namespace {

std::vector<Tensor> snapshot(const nn::Module& m) {
  std::vector<Tensor> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

bool same(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].to_vector<float>() != b[i].to_vector<float>()) return false;
  return true;
}

}  // namespace

TEST(NoHostSync, Mixed16LiteIterationWithTwoOptimizersSchedulerAndClipping) {
  manual_seed(11);
  const hw::HardwareProfile profile = hw::profiles::cpu_amx();  // 16-mixed native: no warning
  auto encoder = std::make_shared<nn::Sequential>(
      std::vector<nn::ModulePtr>{std::make_shared<nn::Linear>(6, 16), std::make_shared<nn::ReLU>()});
  auto head = std::make_shared<nn::Linear>(16, 3);
  optim::AdamW adamw(encoder->parameters(), {.lr = 1e-2});
  optim::SGD sgd(head->parameters(), {.lr = 0.1, .momentum = 0.9});
  Lite lite({.accelerator = "cpu", .precision = "16-mixed", .scaler = {.init_scale = 1024.0, .growth_interval = 3},
             .profile = &profile});
  // Named pairs, not structured bindings: the iteration lambda captures them.
  auto enc_set = lite.setup(encoder, adamw);
  auto head_set = lite.setup(head, sgd);
  auto& enc = enc_set.first;
  auto& hd = head_set.first;
  auto& oa = enc_set.second;
  auto& ob = head_set.second;
  LiteScheduler sched = lite.setup_scheduler(oa, optim::CosineAnnealing({.t_max = 50}));
  auto data = std::make_shared<data::TensorDataset>(randn({64, 6}), randint(0, 3, {64}));
  auto loader = lite.setup_dataloader(data::DataLoader(data, {.batch_size = 8, .shuffle = true}));

  bool poison = false;
  // One hook for the run: it poisons the encoder's first gradient when asked to.
  encoder->parameters()[0].register_hook([&poison](const Tensor& g) {
    return poison ? g * std::numeric_limits<float>::infinity() : Tensor();
  });
  auto iteration = [&](const data::Batch& b) {
    oa.zero_grad();
    ob.zero_grad();
    Tensor loss = cross_entropy(hd(enc(b.input)), b.target);
    lite.backward(loss);
    lite.clip_gradients(enc, oa, 1.0);  // the norm stays on the device
    oa.step();
    ob.step();
    sched.step();
  };

  int i = 0;
  for (const auto& batch : loader) {
    ++i;
    if (i < 4) {
      EXPECT_EQ(agt::host_syncs_of([&] { iteration(batch); }), std::vector<std::string>{}) << "iteration " << i;
      continue;
    }
    // Iteration 4 overflows in the encoder: everything of the skipped optimizer holds.
    const auto enc_before = snapshot(*encoder);
    const auto head_before = snapshot(*head);
    const double scale = lite.loss_scale();
    const int64_t enc_steps = adamw.steps(), head_steps = sgd.steps(), position = sched.last_step();
    const double lr = adamw.lr();
    ASSERT_EQ(enc_steps, 3);
    ASSERT_EQ(position, 3);
    poison = true;
    EXPECT_EQ(agt::host_syncs_of([&] { iteration(batch); }), std::vector<std::string>{}) << "the poisoned iteration";
    poison = false;
    EXPECT_TRUE(same(enc_before, snapshot(*encoder)));   // skipped on the device
    EXPECT_FALSE(same(head_before, snapshot(*head)));    // the head's gradients were finite
    EXPECT_EQ(adamw.steps(), enc_steps);                 // the step counter did not advance
    EXPECT_EQ(sgd.steps(), head_steps + 1);
    EXPECT_EQ(sched.last_step(), position);              // nor did the schedule
    EXPECT_EQ(adamw.lr(), lr);
    EXPECT_EQ(lite.loss_scale(), scale / 2);
    EXPECT_EQ(oa.steps_skipped(), 1);
    EXPECT_EQ(ob.steps_skipped(), 0);
    EXPECT_EQ(lite.skipped_steps(), 1);
    break;
  }
  ASSERT_EQ(i, 4);
  // The next clean iteration steps again, still without a sync, and the schedule moves on.
  const data::Batch b{randn({8, 6}), randint(0, 3, {8})};
  EXPECT_EQ(agt::host_syncs_of([&] { iteration(b); }), std::vector<std::string>{});
  EXPECT_EQ(adamw.steps(), 4);
  EXPECT_EQ(sched.last_step(), 4);
  EXPECT_DOUBLE_EQ(adamw.lr(), optim::CosineAnnealing({.t_max = 50})->lr(4, 1e-2));
}
