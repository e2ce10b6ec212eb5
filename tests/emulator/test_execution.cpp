// The CUDA emulator's execution model: blocks of threads that meet at barriers, warps whose
// lanes exchange values, atomics across blocks that run on several OS threads, each block's
// own shared memory, and the errors a GPU would answer with a hang or garbage.
#include <cuda_fp16.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <random>
#include <vector>

#include "emulator/emulator_test.h"
#include "support/testing.h"

namespace {

using emutest::DeviceBuffer;
using emutest::launch;
using emutest::sync_and_clear;
namespace emu = ampgrad::emu;

/// Sets the schedule for a scope (the environment may have chosen another).
class ScheduleGuard {
 public:
  explicit ScheduleGuard(emu::Schedule s) : saved_(emu::schedule()) { emu::set_schedule(s); }
  ~ScheduleGuard() { emu::set_schedule(saved_); }

 private:
  emu::Schedule saved_;
};

/// "test_execution.cpp:N", N the line of this file that ends with the comment `// site: <name>`
/// (a fault names its barrier or collective by file and line).
std::string fault_site(const std::string& name) {
  std::ifstream src(agt::source_dir() + "/tests/emulator/test_execution.cpp");
  std::string line;
  for (int n = 1; std::getline(src, line); ++n)
    if (line.size() >= name.size() + 9 && line.compare(line.size() - name.size() - 9, std::string::npos,
                                                        "// site: " + name) == 0)
      return "test_execution.cpp:" + std::to_string(n);
  ADD_FAILURE() << "no line of test_execution.cpp ends with // site: " << name;
  return "?";
}

// ---- a block reduction ----------------------------------------------------------------------------

// The tree sum of each block's blockDim.x inputs in its dynamic shared memory (poisoned for
// every block), with or without the barriers between the tree's levels.
__global__ void block_sum(const float* x, float* out, bool barriers) {
  float* s = ampgrad::cuda::dynamic_shared<float>();
  const int t = int(threadIdx.x), n = int(blockDim.x);
  s[t] = x[int(blockIdx.x) * n + t];
  if (barriers) __syncthreads();
  for (int w = n / 2; w > 0; w /= 2) {
    if (t < w) s[t] += s[t + w];
    if (barriers) __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

// The same tree on the host, in the same order (so the sums agree to the bit).
float tree_sum(std::vector<float> v) {
  for (size_t w = v.size() / 2; w > 0; w /= 2)
    for (size_t t = 0; t < w; ++t) v[t] += v[t + w];
  return v[0];
}

std::vector<float> random_floats(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

TEST(CudaEmulatorBlock, ReductionWithBarriersMatchesTheTree) {
  constexpr int kBlocks = 8, kThreads = 256;
  const std::vector<float> x = random_floats(kBlocks * kThreads, 1);
  DeviceBuffer<float> dx(x), dout(kBlocks);
  launch(block_sum, kBlocks, kThreads, kThreads * sizeof(float), nullptr, dx.get(), dout.get(), true);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> got = dout.download();
  for (int b = 0; b < kBlocks; ++b)
    EXPECT_EQ(got[b], tree_sum(std::vector<float>(x.begin() + b * kThreads, x.begin() + (b + 1) * kThreads)))
        << "block " << b;
}

// Thread 0 runs first and reads slots the others have not written yet: the poison of fresh
// shared memory, every time.
TEST(CudaEmulatorBlock, ReductionWithoutBarriersIsWrongEveryTime) {
  ScheduleGuard order(emu::Schedule::Forward);
  constexpr int kThreads = 256;
  const std::vector<float> x = random_floats(kThreads, 2);
  DeviceBuffer<float> dx(x), dout(1);
  for (int run = 0; run < 3; ++run) {
    launch(block_sum, 1, kThreads, kThreads * sizeof(float), nullptr, dx.get(), dout.get(), false);
    EXPECT_TRUE(std::isnan(dout.download()[0])) << "run " << run << ": a missing barrier went unnoticed";
  }
}

// Thread 0 writes a value the others read: without the barrier, the forward order (block 0
// under the default schedule) passes by luck and the reverse one (block 1) reads poison.
__global__ void broadcast(float* out, bool barrier) {
  float* s = ampgrad::cuda::dynamic_shared<float>();
  if (threadIdx.x == 0) s[0] = float(blockIdx.x) + 1;
  if (barrier) __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = s[0];
}

TEST(CudaEmulatorBlock, AlternateScheduleCatchesAMissingBarrierEitherWay) {
  ScheduleGuard order(emu::Schedule::Alternate);
  constexpr int kThreads = 64;
  DeviceBuffer<float> out(2 * kThreads);
  launch(broadcast, 2, kThreads, sizeof(float), nullptr, out.get(), true);
  std::vector<float> got = out.download();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(got[size_t(t)], 1.0f) << "thread " << t;
    EXPECT_EQ(got[size_t(kThreads + t)], 2.0f) << "thread " << t;
  }

  launch(broadcast, 2, kThreads, sizeof(float), nullptr, out.get(), false);
  got = out.download();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(got[size_t(t)], 1.0f) << "block 0 (forward) thread " << t;
  int poisoned = 0;
  for (int t = 0; t < kThreads; ++t) poisoned += std::isnan(got[size_t(kThreads + t)]);
  EXPECT_EQ(poisoned, kThreads - 1) << "block 1 runs its threads last to first: all but thread 0 read before the write";
}

// __syncthreads_count / _and / _or: the predicate's reduction over the block, for every thread.
__global__ void barrier_votes(int* out) {
  const int t = int(threadIdx.x);
  out[4 * t + 0] = __syncthreads_count(t % 3 == 0);
  out[4 * t + 1] = __syncthreads_and(t >= 0);
  out[4 * t + 2] = __syncthreads_and(t != 17);
  out[4 * t + 3] = __syncthreads_or(t == 17);
}

TEST(CudaEmulatorBlock, BarrierVariantsReduceThePredicate) {
  constexpr int kThreads = 96;
  DeviceBuffer<int> out(4 * kThreads);
  launch(barrier_votes, 1, kThreads, 0, nullptr, out.get());
  const std::vector<int> got = out.download();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(got[size_t(4 * t + 0)], 32) << t;  // 0, 3, ..., 93
    EXPECT_EQ(got[size_t(4 * t + 1)], 1) << t;
    EXPECT_EQ(got[size_t(4 * t + 2)], 0) << t;
    EXPECT_EQ(got[size_t(4 * t + 3)], 1) << t;
  }
}

// A 3-D block and a 3-D grid: each thread writes its linear index where its coordinates say.
__global__ void coordinates(unsigned* out) {
  const unsigned bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  out[bx * threads + tx] = bx * 1000 + tx;
}

TEST(CudaEmulatorBlock, IndicesCoverTheGridAndTheBlock) {
  const dim3 grid(3, 2, 2), block(4, 3, 5);
  const unsigned blocks = 12, threads = 60;
  DeviceBuffer<unsigned> out(blocks * threads);
  launch(coordinates, grid, block, 0, nullptr, out.get());
  const std::vector<unsigned> got = out.download();
  for (unsigned b = 0; b < blocks; ++b)
    for (unsigned t = 0; t < threads; ++t) ASSERT_EQ(got[b * threads + t], b * 1000 + t) << b << " " << t;
}

// ---- warps ----------------------------------------------------------------------------------------

// The full-mask collectives, eight results per thread.
__global__ void full_mask(const int* in, int* out) {
  const int t = int(threadIdx.x), v = in[t];
  int* o = out + 8 * t;
  o[0] = __shfl_sync(0xffffffffu, v, 3);
  o[1] = __shfl_sync(0xffffffffu, v, t + 1, 8);  // the source wraps within segments of 8
  o[2] = __shfl_down_sync(0xffffffffu, v, 5);
  o[3] = __shfl_up_sync(0xffffffffu, v, 2, 16);
  o[4] = __shfl_xor_sync(0xffffffffu, v, 6);
  o[5] = int(__ballot_sync(0xffffffffu, v % 3 == 0));
  o[6] = __any_sync(0xffffffffu, v == 778);
  o[7] = __all_sync(0xffffffffu, v % 2 == 0);
}

TEST(CudaEmulatorWarp, FullMaskShufflesAndVotes) {
  constexpr int kThreads = 64;
  std::vector<int> in(kThreads);
  for (int t = 0; t < kThreads; ++t) in[size_t(t)] = (t * 37) % 101;
  for (int t = 32; t < 64; ++t) in[size_t(t)] &= ~1;  // warp 1 all even, warp 0 not
  in[40] = 778;                                       // warp 1 has it, warp 0 not
  DeviceBuffer<int> din(in), out(8 * kThreads);
  launch(full_mask, 1, kThreads, 0, nullptr, din.get(), out.get());
  const std::vector<int> got = out.download();
  for (int t = 0; t < kThreads; ++t) {
    const int l = t % 32, base = t - l;
    auto at = [&](int lane) { return in[size_t(base + lane)]; };
    unsigned ballot = 0;
    bool any = false, all = true;
    for (int j = 0; j < 32; ++j) {
      if (at(j) % 3 == 0) ballot |= 1u << j;
      any = any || at(j) == 778;
      all = all && at(j) % 2 == 0;
    }
    const int* o = &got[size_t(8 * t)];
    EXPECT_EQ(o[0], at(3)) << t;
    EXPECT_EQ(o[1], at((l + 1) % 8 + l / 8 * 8)) << t;
    EXPECT_EQ(o[2], l + 5 < 32 ? at(l + 5) : at(l)) << t;
    EXPECT_EQ(o[3], l - 2 >= l / 16 * 16 ? at(l - 2) : at(l)) << t;
    EXPECT_EQ(o[4], at(l ^ 6)) << t;
    EXPECT_EQ(unsigned(o[5]), ballot) << t;
    EXPECT_EQ(o[6], any ? 1 : 0) << t;
    EXPECT_EQ(o[7], all ? 1 : 0) << t;
  }
}

// 8- and 2-byte values move whole through a shuffle.
__global__ void shuffle_types(const double* d, double* od, const __half* h, __half* oh) {
  const int t = int(threadIdx.x);
  od[t] = __shfl_xor_sync(0xffffffffu, d[t], 1);
  oh[t] = __shfl_down_sync(0xffffffffu, h[t], 1);
}

TEST(CudaEmulatorWarp, ShufflesMoveEightAndTwoByteValues) {
  std::vector<double> d(32);
  std::vector<__half> h(32);
  for (int t = 0; t < 32; ++t) {
    d[size_t(t)] = 1.0 + std::ldexp(double(t), -50);  // needs all 53 bits
    h[size_t(t)] = __ushort_as_half(uint16_t(0x3C00 + t));
  }
  DeviceBuffer<double> dd(d), od(32);
  DeviceBuffer<__half> dh(h), oh(32);
  launch(shuffle_types, 1, 32, 0, nullptr, dd.get(), od.get(), dh.get(), oh.get());
  const std::vector<double> gd = od.download();
  const std::vector<__half> gh = oh.download();
  for (int t = 0; t < 32; ++t) {
    EXPECT_EQ(gd[size_t(t)], d[size_t(t ^ 1)]) << t;
    EXPECT_EQ(__half_as_ushort(gh[size_t(t)]), uint16_t(0x3C00 + (t < 31 ? t + 1 : t))) << t;
  }
}

// Two halves of a warp in separate collectives, and a ballot of the even lanes alone.
__global__ void partial_masks(const int* in, int* out) {
  const int l = int(threadIdx.x), v = in[l];
  if (l < 16)
    out[l] = __shfl_sync(0x0000ffffu, v, 15);
  else
    out[l] = __shfl_down_sync(0xffff0000u, v, 1);
  if (l % 2 == 0) out[32 + l] = int(__ballot_sync(0x55555555u, v > 50));
  __syncwarp();
  if (l >= 8) out[64 + l] = __reduce_add_sync(0xffffff00u, v);
}

TEST(CudaEmulatorWarp, PartialMasks) {
  std::vector<int> in(32);
  for (int l = 0; l < 32; ++l) in[size_t(l)] = (l * 29) % 97;
  DeviceBuffer<int> din(in), out(96);
  launch(partial_masks, 1, 32, 0, nullptr, din.get(), out.get());
  const std::vector<int> got = out.download();
  unsigned even_ballot = 0;
  int high_sum = 0;
  for (int l = 0; l < 32; l += 2)
    if (in[size_t(l)] > 50) even_ballot |= 1u << l;
  for (int l = 8; l < 32; ++l) high_sum += in[size_t(l)];
  for (int l = 0; l < 32; ++l) {
    EXPECT_EQ(got[size_t(l)], l < 16 ? in[15] : in[size_t(l < 31 ? l + 1 : l)]) << l;
    if (l % 2 == 0) EXPECT_EQ(unsigned(got[size_t(32 + l)]), even_ballot) << l;
    if (l >= 8) EXPECT_EQ(got[size_t(64 + l)], high_sum) << l;
  }
}

// ---- misuse: errors, not hangs ----------------------------------------------------------------------
__global__ void exit_before_barrier(int* out) {
  if (threadIdx.x >= 16) return;
  __syncthreads();  // site: exit
  out[threadIdx.x] = 1;
}

TEST(CudaEmulatorErrors, BarrierAfterAThreadExitedIsAnError) {
  ScheduleGuard order(emu::Schedule::Forward);
  DeviceBuffer<int> out(32);
  launch(exit_before_barrier, 1, 32, 0, nullptr, out.get());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the configuration is fine: the error comes when it runs";
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  // sticky: every later call reports it, and cudaGetLastError does not clear it
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaMemset(out.get(), 0, 4), cudaErrorLaunchFailure);
  const std::string f = emu::last_fault();
  EXPECT_TRUE(agt::contains(f, "divergent __syncthreads")) << f;
  EXPECT_TRUE(agt::contains(f, "thread 16 exited while threads 0-15 wait")) << f;
  EXPECT_TRUE(agt::contains(f, fault_site("exit"))) << f;
  EXPECT_TRUE(
      agt::contains(f, "kernel (anonymous namespace)::exit_before_barrier(int*), block (0,0,0), thread (16,0,0)"))
      << f;
  sync_and_clear();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

__global__ void two_barriers(int*) {
  if (threadIdx.x < 16) {
    __syncthreads();  // site: first
  } else {
    __syncthreads();  // site: second
  }
}

TEST(CudaEmulatorErrors, BarriersAtDifferentLinesAreAnError) {
  ScheduleGuard order(emu::Schedule::Forward);
  launch(two_barriers, 1, 32, 0, nullptr, nullptr);
  EXPECT_EQ(sync_and_clear(), cudaErrorLaunchFailure);
  const std::string f = emu::last_fault();
  EXPECT_TRUE(agt::contains(f, "divergent __syncthreads: thread 16 is at " + fault_site("second") +
                                   " while threads 0-15 wait at " + fault_site("first")))
      << f;
}

__global__ void lane_outside_mask(const int* in, int* out) {
  out[threadIdx.x] = __shfl_sync(0x1u, in[threadIdx.x], 0);  // site: own mask
}

TEST(CudaEmulatorErrors, LaneOutsideItsMaskIsAnError) {
  ScheduleGuard order(emu::Schedule::Forward);
  DeviceBuffer<int> in(std::vector<int>(32, 5)), out(32);
  launch(lane_outside_mask, 1, 32, 0, nullptr, in.get(), out.get());
  EXPECT_EQ(sync_and_clear(), cudaErrorLaunchFailure);
  const std::string f = emu::last_fault();
  EXPECT_TRUE(agt::contains(f, "lane 1 of warp 0 calls __shfl_sync (" + fault_site("own mask") +
                                   ") with mask 0x00000001, which does not include it"))
      << f;
}

__global__ void exit_before_shuffle(const int* in, int* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_sync(0xffffffffu, in[threadIdx.x], 0);
}

TEST(CudaEmulatorErrors, LaneOfTheMaskThatExitedIsAnError) {
  DeviceBuffer<int> in(std::vector<int>(32, 5)), out(32);
  for (emu::Schedule s : {emu::Schedule::Forward, emu::Schedule::Reverse}) {
    ScheduleGuard order(s);
    launch(exit_before_shuffle, 1, 32, 0, nullptr, in.get(), out.get());
    EXPECT_EQ(sync_and_clear(), cudaErrorLaunchFailure);
    const std::string f = emu::last_fault();
    EXPECT_TRUE(agt::contains(f, "lane 16") && agt::contains(f, "exited")) << f;
  }
}

__global__ void shuffle_then_barrier(const int* in, int* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0xffffffffu, in[threadIdx.x], 0);
  __syncthreads();
}

TEST(CudaEmulatorErrors, LaneOfTheMaskWaitingAtABarrierIsAnError) {
  ScheduleGuard order(emu::Schedule::Forward);
  DeviceBuffer<int> in(std::vector<int>(32, 5)), out(32);
  launch(shuffle_then_barrier, 1, 32, 0, nullptr, in.get(), out.get());
  EXPECT_EQ(sync_and_clear(), cudaErrorLaunchFailure);
  const std::string f = emu::last_fault();
  EXPECT_TRUE(agt::contains(f, "thread 16 reached __syncthreads") && agt::contains(f, "wait for it at __shfl_sync"))
      << f;
}

__global__ void source_outside_mask(const int* in, int* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0x0000ffffu, in[threadIdx.x], 20);
}

TEST(CudaEmulatorErrors, ReadingALaneOutsideTheMaskIsAnError) {
  DeviceBuffer<int> in(std::vector<int>(32, 5)), out(32);
  launch(source_outside_mask, 1, 32, 0, nullptr, in.get(), out.get());
  EXPECT_EQ(sync_and_clear(), cudaErrorLaunchFailure);
  const std::string f = emu::last_fault();
  EXPECT_TRUE(agt::contains(f, "lane 0 reads lane 20, which is not in the mask 0x0000ffff")) << f;
}

// ---- several OS threads -----------------------------------------------------------------------------

// Thread 0 of blocks 0 and 1 waits (two seconds at most) until both blocks have started:
// only blocks on different OS threads can.
__device__ bool wait_for_partner(int* arrived) {
  atomicAdd(arrived, 1);
  const long long start = clock64();
  while (atomicAdd(arrived, 0) < 2 && clock64() - start < 2000000000LL) {
  }
  return atomicAdd(arrived, 0) >= 2;
}

__global__ void counters(unsigned* count, float* sum, int* largest, unsigned long long* bits, int* arrived, int* met) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (blockIdx.x < 2 && threadIdx.x == 0) met[blockIdx.x] = wait_for_partner(arrived);
  atomicAdd(count, 1u);
  atomicAdd(sum, 1.0f);
  atomicMax(largest, i);
  atomicOr(bits, 1ull << (i % 64));
}

TEST(CudaEmulatorThreads, AtomicsAcrossBlocksOnSeveralOsThreads) {
  if (emu::worker_threads() < 2)
    AGT_SKIP_HARDWARE() << "one OS thread runs the blocks (AMPGRAD_CUDA_EMULATOR_THREADS=1, or one core)";
  constexpr int kBlocks = 64, kThreads = 128;
  DeviceBuffer<unsigned> count(std::vector<unsigned>{0});
  DeviceBuffer<float> sum(std::vector<float>{0});
  DeviceBuffer<int> largest(std::vector<int>{-1}), arrived(std::vector<int>{0}), met(std::vector<int>{0, 0});
  DeviceBuffer<unsigned long long> bits(std::vector<unsigned long long>{0});
  launch(counters, kBlocks, kThreads, 0, nullptr, count.get(), sum.get(), largest.get(), bits.get(), arrived.get(),
         met.get());
  EXPECT_EQ(met.download(), (std::vector<int>{1, 1})) << "blocks 0 and 1 never ran at the same time";
  EXPECT_EQ(count.download()[0], unsigned(kBlocks * kThreads));
  EXPECT_EQ(sum.download()[0], float(kBlocks * kThreads));
  EXPECT_EQ(largest.download()[0], kBlocks * kThreads - 1);
  EXPECT_EQ(bits.download()[0], ~0ull);
}

// Two blocks at once, each with its static __shared__ value: each reads back its own.
__global__ void own_shared(int* arrived, int* seen) {
  __shared__ int mine;
  if (threadIdx.x == 0) mine = int(blockIdx.x) + 100;
  __syncthreads();
  if (threadIdx.x == 0) wait_for_partner(arrived);  // the other block has written its own by now
  __syncthreads();
  seen[blockIdx.x * blockDim.x + threadIdx.x] = mine;
}

TEST(CudaEmulatorThreads, SharedMemoryIsEachBlocksOwn) {
  if (emu::worker_threads() < 2)
    AGT_SKIP_HARDWARE() << "one OS thread runs the blocks (AMPGRAD_CUDA_EMULATOR_THREADS=1, or one core)";
  constexpr int kThreads = 64;
  DeviceBuffer<int> arrived(std::vector<int>{0}), seen(2 * kThreads);
  launch(own_shared, 2, kThreads, 0, nullptr, arrived.get(), seen.get());
  const std::vector<int> got = seen.download();
  for (int i = 0; i < 2 * kThreads; ++i) EXPECT_EQ(got[size_t(i)], i / kThreads + 100) << i;
}

// Dynamic shared memory starts as the poison pattern in every block.
__global__ void read_fresh_shared(uint32_t* out) {
  const uint32_t* s = ampgrad::cuda::dynamic_shared<uint32_t>();
  out[blockIdx.x * blockDim.x + threadIdx.x] = s[threadIdx.x];
  __syncthreads();
  ampgrad::cuda::dynamic_shared<uint32_t>()[threadIdx.x] = 0;  // the next block must not see it
}

TEST(CudaEmulatorBlock, FreshDynamicSharedMemoryIsPoisoned) {
  DeviceBuffer<uint32_t> out(4 * 32);
  launch(read_fresh_shared, 4, 32, 32 * sizeof(uint32_t), nullptr, out.get());
  for (uint32_t v : out.download()) {
    EXPECT_EQ(v, 0x7FF47FF4u);
    float f;
    std::memcpy(&f, &v, 4);
    EXPECT_TRUE(std::isnan(f));
  }
}

}  // namespace
