// GradScaler::scale_tensor: the scale itself, a 0-dim float64 tensor on the parameters'
// device, which follows the update rule and which nothing reads back to the host.
#include <limits>

#include "support/testing.h"

using namespace ag;

TEST(GradScalerScaleTensor, IsTheLiveScaleAndReadsNothingBack) {
  Tensor p = zeros({3}).requires_grad_();
  optim::SGD sgd({p}, {.lr = 1.0});
  GradScaler scaler({.init_scale = 1024, .growth_factor = 4, .backoff_factor = 0.25, .growth_interval = 1});
  EXPECT_EQ(scaler.scale_tensor().dim(), 0);
  EXPECT_EQ(scaler.scale_tensor().dtype(), kFloat64);
  EXPECT_EQ(scaler.scale_tensor().device(), p.device());
  EXPECT_EQ(scaler.scale_tensor().item<double>(), 1024.0);

  // Used on the device, e.g. to scale a loss by hand: no host sync (get_scale() is one).
  Tensor by_hand;
  EXPECT_EQ(agt::host_syncs_of([&] { by_hand = full({}, 3.0, kFloat64) * scaler.scale_tensor(); }),
            std::vector<std::string>{});
  EXPECT_EQ(by_hand.item<double>(), 3.0 * 1024);
  EXPECT_EQ(agt::host_syncs_of([&] { (void)scaler.get_scale(); }).size(), 1u);

  // It follows the rule: an overflow backs off (x 0.25), a clean iteration grows (x 4 with
  // growth_interval 1).
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<double, double>> iterations = {{inf, 256.0}, {1.0, 1024.0}, {1.0, 4096.0}};
  for (const auto& [g, want] : iterations) {
    SCOPED_TRACE("gradient " + std::to_string(g));
    p.set_grad(full({3}, g));
    scaler.step(sgd);
    scaler.update();
    EXPECT_EQ(scaler.scale_tensor().item<double>(), want);
    EXPECT_EQ(scaler.get_scale(), want);
  }
  // The scale itself, not a copy: a value written into it is the one scale() multiplies by.
  Tensor(scaler.scale_tensor()).fill_(8.0);
  EXPECT_EQ(scaler.get_scale(), 8.0);
  EXPECT_EQ(scaler.scale(full({}, 3.0)).item<double>(), 24.0);
}
