// The CUDA backend's contract with the runtime, read through the emulator's own view of it
// (what is still queued, how much device memory is held): a host wait on one stream leaves
// the other streams' work queued, a destroyed stream gives back its cuBLASLt workspace, and
// an error another call left in the runtime's last-error slot is not blamed on the next
// kernel.
#include <cuda_runtime.h>

#include "emu/control.h"
#include "support/testing.h"

namespace {

using namespace ag;

const Device kGpu(kCUDA, 0);

size_t device_bytes_free() {
  size_t free = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  return free;
}

// raise_device_errors, which every host wait calls, once read and cleared the device's error
// slot with synchronous calls on the legacy default stream (ag's default stream): waiting
// for a side stream then waited for all of the default stream's work too.
TEST(CudaBackendContract, WaitingForASideStreamLeavesTheDefaultStreamsWorkQueued) {
  ASSERT_TRUE(emu::strict());
  const Tensor x = ones({1000}).to(kGpu);
  // an index kernel gets the error slot, so that host waits read it
  (void)index_select(x, 0, from_vector<int64_t>({0, 3}, {2}).to(kGpu));
  synchronize(kGpu);
  const Stream side = create_stream(kGpu);
  {
    const Tensor y = x * 2;  // queued on the default stream; strict mode runs it when waited for
    ASSERT_GT(emu::queued(nullptr), 0);
    {
      StreamGuard guard(side);
      const Tensor z = x * 3;
      side.synchronize();
    }
    EXPECT_GT(emu::queued(nullptr), 0) << "waiting for a side stream ran the default stream's work";
    synchronize(kGpu);
  }
  destroy_stream(side);
  synchronize(kGpu);
}

// The cuBLASLt workspace (32 MiB) was kept per native stream handle and never freed: each
// stream that ran a product leaked it, and a new stream given a destroyed stream's handle
// shared the old one's workspace without waiting for its products.
TEST(CudaBackendContract, ADestroyedStreamGivesBackItsProductWorkspace) {
  const Tensor a = randn({32, 48}).to(kGpu), b = randn({48, 16}).to(kGpu);
  const Tensor expected = matmul(a, b).to(kCPU);  // the default stream's workspace, kept for good
  synchronize(kGpu);
  empty_cache(kGpu);
  const size_t before = device_bytes_free();
  for (int i = 0; i < 3; ++i) {
    const Stream s = create_stream(kGpu);
    {
      StreamGuard guard(s);
      const Tensor c = matmul(a, b);
      EXPECT_TRUE(agt::allclose(c.to(kCPU), expected, 0, 0));
    }
    destroy_stream(s);
  }
  synchronize(kGpu);
  empty_cache(kGpu);
  EXPECT_EQ(device_bytes_free(), before);
}

// cuBLASLt, cuDNN and NCCL can leave a (non-sticky) error in the runtime's last-error slot
// and report their own status; check_launch's cudaGetLastError must not then blame the next
// kernel for it.
TEST(CudaBackendContract, AnErrorLeftByAnotherCallIsNotBlamedOnTheNextKernel) {
  const Tensor x = ones({8}).to(kGpu);
  synchronize(kGpu);
  ASSERT_EQ(cudaSetDevice(12345), cudaErrorInvalidDevice);  // left in the slot
  Tensor y;
  ASSERT_NO_THROW(y = x * 2);
  EXPECT_EQ(y.to(kCPU).to_vector<float>(), std::vector<float>(8, 2.0f));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
