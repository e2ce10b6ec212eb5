// CUDA beyond single ops: a mixed-precision iteration with no host sync, index errors found
// on the device and reported at the next sync (or at the op with debug sync), autocast's
// CUDA rows, and a steady-state step whose memory pool does not grow. Without a GPU each
// test skips saying so, except where the answer without one is itself the contract.
#include "support/testing.h"

namespace {

using namespace ag;

const Device kGpu(kCUDA, 0);
bool have_cuda() { return !hw::query().cuda.empty(); }

#define AGT_NEED_CUDA()                                               \
  if (!built_with_cuda()) AGT_SKIP_BUILD() << "built without CUDA"; \
  if (!have_cuda()) AGT_SKIP_HARDWARE() << "no CUDA device"

TEST(CudaMemory, StatsWithoutADeviceAreZero) {
  if (have_cuda()) GTEST_SKIP() << "a CUDA device is present: CudaMemory.SteadyStateStepKeepsThePool checks it";
  const cuda::MemoryStats m = cuda::memory_stats(0);
  EXPECT_EQ(m.allocated, 0u);
  EXPECT_EQ(m.reserved, 0u);
  EXPECT_EQ(m.peak, 0u);
}

// A Lite 16-mixed iteration on the GPU: autocast, the grad scaler (device scale and flag),
// the fused AdamW step, clipping and the scheduler read nothing back to the host.
TEST(CudaTraining, Mixed16IterationMakesNoHostSync) {
  AGT_NEED_CUDA();
  manual_seed(0);
  auto net = nn::make_mlp();
  optim::AdamW adamw(net->parameters(), {.lr = 1e-3});
  Lite lite({.accelerator = "cuda", .precision = "16-mixed"});
  auto set_up = lite.setup(net, adamw);  // named members, not a structured binding: the lambda captures them
  auto& model = set_up.first;
  auto& opt = set_up.second;
  const Tensor x = randn({64, 1, 28, 28}).to(kGpu), y = randint(0, 10, {64}).to(kGpu);
  auto iteration = [&] {
    opt.zero_grad();
    Tensor loss = cross_entropy(model(x), y);
    lite.backward(loss);
    lite.clip_gradients(model, opt, 1.0);
    opt.step();
  };
  iteration();
  iteration();
  EXPECT_EQ(agt::host_syncs_of(iteration), std::vector<std::string>{});
  // and it trained: the scale is finite and the loss is a number
  EXPECT_TRUE(std::isfinite(cross_entropy(model(x), y).item<float>()));
}

TEST(CudaErrors, IndexOutOfRangeIsReportedAtTheNextSync) {
  AGT_NEED_CUDA();
  const Tensor w = randn({10, 4}).to(kGpu);
  const Tensor bad = from_vector<int64_t>({1, 12, 3}, {3}).to(kGpu);
  Tensor out;
  // The op is queued; the device finds the index and the next host wait reports it.
  out = index_select(w, 0, bad);
  EXPECT_AG_ERROR(out.to(kCPU), "[index_select] index 12 is out of range for a dimension of size 10");
  // A negative index is refused too (as on the CPU and in PyTorch), also through embedding.
  out = embedding(from_vector<int64_t>({0, -1}, {2}).to(kGpu), w);
  EXPECT_AG_ERROR(out.to(kCPU), "index -1 is out of range for a dimension of size 10");
  // Reported once: the slot is clear again and the device works on.
  EXPECT_TRUE(agt::allclose(index_select(w, 0, from_vector<int64_t>({2}, {1}).to(kGpu)).to(kCPU),
                            index_select(w.to(kCPU), 0, from_vector<int64_t>({2}, {1})), 0, 0));
  const Tensor logits = randn({4, 5}).to(kGpu);
  const Tensor target = from_vector<int64_t>({0, 1, 7, 2}, {4}).to(kGpu);
  Tensor loss = cross_entropy(logits, target);
  EXPECT_AG_ERROR(loss.item<float>(), "[cross_entropy] target 7 is out of range for 5 classes");
  // the kernel for positions with inner > 1, and a negative target
  loss = cross_entropy(randn({2, 5, 3}).to(kGpu), from_vector<int64_t>({0, 1, 2, 3, -2, 4}, {2, 3}).to(kGpu));
  EXPECT_AG_ERROR(loss.item<float>(), "[cross_entropy] target -2 is out of range for 5 classes");
  // With debug sync, the op that caused it throws.
  set_debug_sync(true);
  EXPECT_AG_ERROR(index_select(w, 0, bad), "[index_select] index 12 is out of range");
  set_debug_sync(false);
}

TEST(CudaAutocast, FollowsTheCudaRows) {
  AGT_NEED_CUDA();
  const Tensor a = randn({8, 8}).to(kGpu), b = randn({8, 8}).to(kGpu);
  AutocastGuard guard(kCUDA, kFloat16);
  EXPECT_EQ(matmul(a, b).dtype(), kFloat16);                     // lower precision
  EXPECT_EQ(softmax(matmul(a, b), -1).dtype(), kFloat32);        // float32 row on CUDA
  EXPECT_EQ(add(matmul(a, b), a).dtype(), kFloat32);             // promote
  EXPECT_EQ(exp(matmul(a, b)).dtype(), kFloat32);                // a CUDA-only float32 row
}

TEST(CudaMemory, SteadyStateStepKeepsThePool) {
  AGT_NEED_CUDA();
  manual_seed(0);
  auto net = nn::make_mlp();
  net->to(kGpu);
  optim::AdamW opt(net->parameters(), {.lr = 1e-3});
  const Tensor x = randn({128, 1, 28, 28}).to(kGpu), y = randint(0, 10, {128}).to(kGpu);
  auto step = [&] {
    opt.zero_grad();
    cross_entropy(net->forward(x), y).backward();
    opt.step();
  };
  for (int i = 0; i < 3; ++i) step();
  synchronize(kGpu);
  const cuda::MemoryStats before = cuda::memory_stats(0);
  EXPECT_GT(before.allocated, 0u);
  EXPECT_GE(before.reserved, before.allocated);
  for (int i = 0; i < 3; ++i) step();
  synchronize(kGpu);
  const cuda::MemoryStats after = cuda::memory_stats(0);
  EXPECT_EQ(after.reserved, before.reserved) << "the pool grew in the steady state";
  EXPECT_GE(after.peak, after.allocated);
  cuda::reset_peak_memory_stats(0);
  EXPECT_EQ(cuda::memory_stats(0).peak, cuda::memory_stats(0).allocated);
}

}  // namespace
