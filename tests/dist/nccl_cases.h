// The process group's collectives and Lite "ddp" on CUDA tensors, through NCCL. Included
// by the 2-rank program (tests/dist/test_dist.cpp, under mpirun: a multi-GPU machine) and
// by ampgrad_tests (tests/wrappers/test_nccl.cpp: one process, a 1-rank communicator, what
// scripts/gpu-check runs on a single GPU). They skip without NCCL or a GPU for the rank,
// before touching the process group.
#pragma once

#include <cstdlib>
#include <memory>
#include <vector>

#include "support/testing.h"

namespace nccl_cases {

inline ag::dist::ProcessGroup& group() { return ag::dist::ProcessGroup::world(); }
inline ag::Device my_gpu() { return ag::Device(ag::kCUDA, group().local_rank()); }
inline std::shared_ptr<ag::nn::Sequential> mlp() {
  return std::make_shared<ag::nn::Sequential>(std::vector<ag::nn::ModulePtr>{
      std::make_shared<ag::nn::Linear>(8, 16), std::make_shared<ag::nn::ReLU>(), std::make_shared<ag::nn::Linear>(16, 4)});
}

}  // namespace nccl_cases

#define AGT_NEED_NCCL()                                                                          \
  if (std::getenv("AMPGRAD_DIST_CASE") != nullptr) GTEST_SKIP() << "a failure case runs alone"; \
  if (!ag::dist::built_with_nccl())                                                              \
    AGT_SKIP_BUILD() << (ag::hw::query().cuda_emulated ? "emulated CUDA build: NCCL is not emulated" \
                                                       : "built without NCCL");                     \
  if (ag::hw::query().cuda.empty()) AGT_SKIP_HARDWARE() << "no CUDA device";                    \
  if (int(ag::hw::query().cuda.size()) <= nccl_cases::group().local_rank())                      \
  AGT_SKIP_HARDWARE() << "no CUDA device for this rank"

TEST(DistNccl, CollectivesOnCudaTensors) {
  using namespace ag;
  namespace dist = ag::dist;
  AGT_NEED_NCCL();
  ag::dist::ProcessGroup& pg = nccl_cases::group();
  const Device gpu = nccl_cases::my_gpu();
  const int r = pg.rank(), n = pg.size();
  // Values that differ per element (integers small enough to stay exact in bfloat16 after
  // the sum over two ranks), so that a reduction or a 16-bit copy-back into the wrong
  // elements shows even with one rank; 16-bit types are reduced widened and in their own type.
  std::vector<double> base(1000), want_sum(1000), want_max(1000);
  for (size_t i = 0; i < base.size(); ++i) {
    base[i] = double(i % 61 + 1);
    want_sum[i] = base[i] * n * (n + 1) / 2.0;
    want_max[i] = base[i] * n;
  }
  for (DType dt : {kFloat32, kBFloat16, kFloat16, kInt64}) {
    for (bool in_half : {false, true}) {
      if (in_half && !is_reduced_floating(dt)) continue;
      SCOPED_TRACE(std::string(dtype_name(dt)) + (in_half ? ", reduced in its own type" : ""));
      Tensor s = (from_vector<double>(base, {1000}) * double(r + 1)).to(dt).to(gpu), mx = s.clone();
      const uint64_t version = s.version();
      pg.all_reduce(s, dist::ReduceOp::Sum, in_half);
      pg.all_reduce(mx, dist::ReduceOp::Max, in_half);
      EXPECT_EQ(s.device(), gpu);
      EXPECT_GT(s.version(), version);  // written in place, a copy-back included
      EXPECT_EQ(s.to(kCPU).to_vector<double>(), want_sum);
      EXPECT_EQ(mx.to(kCPU).to_vector<double>(), want_max);
    }
  }
  Tensor a = full({4}, 60000.0 - 10000.0 * r, kFloat16).to(gpu);  // in float32: no overflow
  pg.all_reduce(a, dist::ReduceOp::Avg);
  EXPECT_TRUE(agt::allclose(a.to(kCPU), full({4}, 60000.0 - 10000.0 * (n - 1) / 2.0), agt::tol_for(kFloat16)));
  Tensor b = full({2, 3}, 100.0 * r + 7).to(gpu);
  pg.broadcast(b, 0);
  EXPECT_EQ(b.to(kCPU).to_vector<double>(), std::vector<double>(6, 7.0));
  Tensor g = pg.all_gather(full({1, 2}, double(r)).to(gpu));
  ASSERT_EQ(g.sizes(), Shape({n, 2}));
  EXPECT_EQ(g.device(), gpu);
  EXPECT_EQ(g.to(kCPU).to_vector<double>()[size_t(2 * (n - 1))], double(n - 1));
}

// Lite "ddp" on the GPU: the same parameters as one process with the whole batch.
TEST(DistNccl, LiteDdpOnCudaMatchesOneProcess) {
  using namespace ag;
  AGT_NEED_NCCL();
  ag::dist::ProcessGroup& pg = nccl_cases::group();
  const Device gpu = nccl_cases::my_gpu();
  const int r = pg.rank(), n = pg.size();
  const int64_t B = 6;
  manual_seed(11);
  auto net = nccl_cases::mlp(), ref = nccl_cases::mlp();
  {
    NoGradGuard ng;
    for (size_t i = 0; i < net->parameters().size(); ++i) Tensor(ref->parameters()[i]).copy_(net->parameters()[i]);
  }
  optim::SGD sgd(net->parameters(), {.lr = 0.1}), ref_sgd(ref->parameters(), {.lr = 0.1});
  Lite lite({.accelerator = "cuda", .precision = "32-true", .strategy = "ddp"});
  EXPECT_EQ(lite.device(), gpu);
  auto [model, o] = lite.setup(net, sgd);
  Lite single({.accelerator = "cuda", .precision = "32-true"});
  auto [ref_model, ref_o] = single.setup(ref, ref_sgd);
  for (int step = 0; step < 5; ++step) {
    manual_seed(90 + uint64_t(step));
    const Tensor x = randn({n * B, 8}), y = randint(0, 4, {n * B});
    o.zero_grad();
    lite.backward(cross_entropy(model(narrow(x, 0, r * B, B).contiguous()), narrow(y, 0, r * B, B).contiguous()));
    o.step();
    ref_o.zero_grad();
    single.backward(cross_entropy(ref_model(x), y));
    ref_o.step();
  }
  for (size_t i = 0; i < net->parameters().size(); ++i)
    EXPECT_TRUE(agt::allclose(net->parameters()[i].to(kCPU), ref->parameters()[i].to(kCPU), 0, 1e-5)) << i;
}
