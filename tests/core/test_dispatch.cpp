// The dispatch hook (ampgrad/dispatch.h): core's ops call it only while the thread's flag
// is up, autocast installs itself there whenever it enables, and backward excludes it.
#include "support/testing.h"

using namespace ag;

namespace {

// A hook that records what it saw and changes nothing.
std::vector<std::pair<std::string, size_t>> g_seen;
std::optional<std::vector<Tensor>> recording_hook(OpId op, const std::vector<Tensor>& inputs) {
  g_seen.emplace_back(op_name(op), inputs.size());
  return std::nullopt;
}

// Installs recording_hook and raises the flag for its scope; autocast's own hook is back
// afterwards (as every AutocastGuard would install it again anyway).
struct RecordingHook {
  RecordingHook() {
    g_seen.clear();
    dispatch::set_autocast_hook(&recording_hook);
    dispatch::set_autocast_enabled(true);
  }
  ~RecordingHook() {
    dispatch::set_autocast_enabled(false);
    dispatch::set_autocast_hook(&autocast::cast_if_needed);
  }
};

}  // namespace

TEST(Dispatch, OpsCallTheHookOnlyWhileTheFlagIsUp) {
  const Tensor a = randn({2, 3}), b = randn({2, 3});
  EXPECT_FALSE(dispatch::autocast_active());
  {
    RecordingHook hook;
    EXPECT_TRUE(dispatch::autocast_active());
    (void)add(a, b);
    (void)mul(a, 2.0);  // a scalar is not an input of the hook: only tensors are cast
    (void)where(gt(a, 0.0), a, 0.0);
    (void)cat({a, b, a}, 0);
    (void)sum(a);
    const std::vector<std::pair<std::string, size_t>> expected = {
        {"add", 2}, {"mul", 1}, {"where", 1}, {"cat", 3}, {"sum", 1}};
    EXPECT_EQ(g_seen, expected);
  }
  EXPECT_FALSE(dispatch::autocast_active());
  g_seen.clear();
  (void)add(a, b);
  EXPECT_TRUE(g_seen.empty());
}

TEST(Dispatch, AutocastInstallsItsHookWhenItEnables) {
  dispatch::set_autocast_hook(nullptr);  // as if nothing had registered it
  const Tensor x = randn({2, 4}), w = randn({3, 4});
  {
    AutocastGuard off(kCPU, false);  // a disabled region raises nothing
    EXPECT_FALSE(dispatch::autocast_active());
  }
  AutocastGuard on(kCPU, kBFloat16);
  EXPECT_TRUE(dispatch::autocast_active());
  EXPECT_EQ(linear(x, w).dtype(), kBFloat16);
}

TEST(Dispatch, BackwardRunsWithAutocastExcluded) {
  Tensor w = randn({4, 4}).requires_grad_();
  const Tensor x = randn({2, 4});
  DType inside_hook = kInt32;
  bool enabled_in_hook = true, excluded_in_hook = false;
  Tensor y;
  {
    AutocastGuard g(kCPU, kBFloat16);
    y = matmul(x, w);
    EXPECT_EQ(y.dtype(), kBFloat16);
    y.register_hook([&](const Tensor& grad) {
      // Even a region the hook opens itself does not cast inside backward.
      AutocastGuard again(kCPU, kBFloat16);
      enabled_in_hook = autocast::is_enabled(kCPU) || autocast::any_enabled();
      excluded_in_hook = dispatch::autocast_excluded();
      inside_hook = matmul(grad.to(kFloat32), w.detach()).dtype();
      return Tensor();
    });
    y.sum().backward();  // backward inside an enabled region
    EXPECT_TRUE(autocast::is_enabled(kCPU));  // and the region is intact afterwards
    EXPECT_FALSE(dispatch::autocast_excluded());
  }
  EXPECT_FALSE(enabled_in_hook);
  EXPECT_TRUE(excluded_in_hook);
  EXPECT_EQ(inside_hook, kFloat32);
  EXPECT_EQ(w.grad().dtype(), kFloat32);
}

TEST(Dispatch, ExcludeGuardsNest) {
  AutocastGuard g(kCPU, kBFloat16);
  EXPECT_TRUE(dispatch::autocast_active());
  {
    dispatch::ExcludeAutocastGuard outer;
    {
      dispatch::ExcludeAutocastGuard inner;
      EXPECT_FALSE(dispatch::autocast_active());
    }
    EXPECT_TRUE(dispatch::autocast_excluded());  // the inner guard restored, not cleared
    EXPECT_FALSE(dispatch::autocast_active());
  }
  EXPECT_TRUE(dispatch::autocast_active());
}
