// The CUDA emulator's runtime: launch checks with the runtime's error codes, the emulated
// device's properties, device memory (poison, exact-size blocks, pointers a GPU would
// fault on), streams and events in strict mode, and the legacy default stream's implicit
// synchronization.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "emulator/emulator_test.h"
#include "support/testing.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMUTEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define EMUTEST_ASAN 1
#endif

namespace {

using emutest::DeviceBuffer;
using emutest::launch;
using emutest::sync_and_clear;
namespace emu = ampgrad::emu;

/// Turns strict mode on or off for a scope.
class StrictGuard {
 public:
  explicit StrictGuard(bool on) : saved_(emu::strict()) { emu::set_strict(on); }
  ~StrictGuard() { emu::set_strict(saved_); }

 private:
  bool saved_;
};

cudaDeviceProp properties() {
  cudaDeviceProp p{};
  EXPECT_EQ(cudaGetDeviceProperties(&p, 0), cudaSuccess);
  return p;
}

__global__ void mark(int* out) { out[0] = 1; }

// Writes n ints through the block's dynamic shared memory.
__global__ void through_shared(int* out, int n) {
  int* s = ampgrad::cuda::dynamic_shared<int>();
  for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) s[i] = 3 * i;
  __syncthreads();
  for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) out[i] = s[i];
}

__global__ void add_one(const float* x, float* y, int n) {
  for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += int(gridDim.x * blockDim.x)) y[i] = x[i] + 1;
}

__global__ void iota(float* x, int n, float scale) {
  for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += int(gridDim.x * blockDim.x)) x[i] = scale * i;
}

// ---- the launch's checks ----------------------------------------------------------------------------

TEST(CudaEmulatorLaunch, BadConfigurationsGiveTheRuntimesErrorsWithoutStickiness) {
  struct Bad {
    dim3 grid, block;
    size_t shared;
    cudaError_t expected;
    const char* what;
  };
  const Bad cases[] = {
      {1, 1025, 0, cudaErrorInvalidConfiguration, "1025 threads in x"},
      {1, dim3(32, 33), 0, cudaErrorInvalidConfiguration, "1056 threads in all"},
      {1, dim3(1, 1, 65), 0, cudaErrorInvalidConfiguration, "block z above 64"},
      {dim3(1, 65536), 1, 0, cudaErrorInvalidConfiguration, "grid y above 65535"},
      {dim3(1, 1, 65536), 1, 0, cudaErrorInvalidConfiguration, "grid z above 65535"},
      {dim3(2147483648u), 1, 0, cudaErrorInvalidConfiguration, "grid x above 2^31 - 1"},
      {0, 32, 0, cudaErrorInvalidConfiguration, "an empty grid"},
      {1, dim3(32, 0), 0, cudaErrorInvalidConfiguration, "an empty block"},
      {1, 32, 48 * 1024 + 1, cudaErrorInvalidValue, "dynamic shared memory above 48 KiB without the opt-in"},
  };
  DeviceBuffer<int> out(std::vector<int>{0});
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.what);
    launch(mark, c.grid, c.block, c.shared, nullptr, out.get());
    EXPECT_EQ(cudaPeekAtLastError(), c.expected);
    EXPECT_EQ(cudaPeekAtLastError(), c.expected) << "peeking does not clear it";
    EXPECT_EQ(cudaGetLastError(), c.expected);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a configuration error is not sticky";
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(out.download()[0], 0) << "the kernel ran";
  }
  // the largest block and grid dimensions are accepted
  launch(mark, dim3(1, 65535, 1), 1, 0, nullptr, out.get());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  launch(mark, 1, dim3(1, 1, 64), 0, nullptr, out.get());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(out.download()[0], 1);
}

TEST(CudaEmulatorLaunch, DynamicSharedMemoryOptIn) {
  const cudaDeviceProp p = properties();
  const int n = 100 * 1024 / 4;  // 100 KiB of ints
  DeviceBuffer<int> out(size_t(n) + 1);
  launch(through_shared, 1, 256, size_t(n) * 4, nullptr, out.get(), n);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue) << "100 KiB needs the opt-in";
  ASSERT_EQ(cudaFuncSetAttribute(through_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, n * 4), cudaSuccess);
  launch(through_shared, 1, 256, size_t(n) * 4, nullptr, out.get(), n);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<int> got = out.download();
  for (int i = 0; i < n; ++i) ASSERT_EQ(got[size_t(i)], 3 * i) << i;
  // one byte more than the attribute allows
  launch(through_shared, 1, 256, size_t(n) * 4 + 1, nullptr, out.get(), n);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  // the device's per-block maximum, even with the attribute
  EXPECT_EQ(cudaFuncSetAttribute(through_shared, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(p.sharedMemPerBlockOptin) + 1),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  launch(through_shared, 1, 256, p.sharedMemPerBlockOptin + 1, nullptr, out.get(), n);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
}

// ---- the device ----------------------------------------------------------------------------------------

TEST(CudaEmulatorDevice, PropertiesOfTheEmulatedGpu) {
  int count = 0;
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, 1);
  const cudaDeviceProp p = properties();
  const char* env = std::getenv("AMPGRAD_CUDA_EMULATOR_DEVICE");
  const std::string profile = env ? env : "";
  if (profile == "sm_80" || profile == "a100") {
    EXPECT_STREQ(p.name, "NVIDIA A100-SXM4-80GB (emulated)");
    EXPECT_EQ(p.major * 10 + p.minor, 80);
    EXPECT_EQ(p.multiProcessorCount, 108);
    EXPECT_EQ(p.sharedMemPerBlockOptin, 163u * 1024);
  } else {
    EXPECT_STREQ(p.name, "NVIDIA H200 (emulated)");
    EXPECT_EQ(p.major * 10 + p.minor, 90);
    EXPECT_EQ(p.multiProcessorCount, 132);
    EXPECT_EQ(p.sharedMemPerMultiprocessor, 228u * 1024);
    EXPECT_EQ(p.sharedMemPerBlockOptin, 227u * 1024);
    EXPECT_EQ(p.totalGlobalMem, size_t(143771) << 20);
  }
  EXPECT_EQ(p.sharedMemPerBlock, 48u * 1024);
  EXPECT_EQ(p.maxThreadsPerBlock, 1024);
  EXPECT_EQ(p.warpSize, 32);
  EXPECT_EQ(p.maxThreadsDim[2], 64);
  EXPECT_EQ(p.maxGridSize[0], 2147483647);
  // the memory is reported, not reserved
  size_t free = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  EXPECT_EQ(total, p.totalGlobalMem);
  EXPECT_GT(free, total / 2);
  // one device
  cudaDeviceProp other{};
  EXPECT_EQ(cudaGetDeviceProperties(&other, 1), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaSetDevice(1), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(CudaEmulatorDevice, TheHardwareProfileSeesTheEmulatedGpu) {
  const ag::hw::HardwareProfile& hw = ag::hw::query();
  EXPECT_TRUE(hw.cuda_emulated);
  EXPECT_TRUE(ag::cuda_emulated());
  ASSERT_EQ(hw.cuda.size(), 1u);
  const cudaDeviceProp p = properties();
  EXPECT_EQ(hw.cuda[0].name, p.name);
  EXPECT_EQ(hw.cuda[0].cc(), p.major * 10 + p.minor);
  EXPECT_EQ(hw.cuda[0].sm_count, p.multiProcessorCount);
  // "auto" decides as the emulated GPU would, and says it is emulated
  const ag::PrecisionDecision d = ag::resolve_precision("auto", "cuda", hw);
  EXPECT_EQ(d.precision, ag::Precision::MixedBF16) << d.reason;
  EXPECT_TRUE(agt::contains(d.reason, "emulated on the CPU")) << d.reason;
}

// ---- memory ---------------------------------------------------------------------------------------------

TEST(CudaEmulatorMemory, FreshDeviceMemoryIsPoisonInEveryFloatingType) {
  DeviceBuffer<uint16_t> fresh(16);
  for (uint16_t b : fresh.download()) EXPECT_EQ(b, emu::kPoison16);
  std::vector<uint16_t> h = fresh.download();
  float f;
  double d;
  std::memcpy(&f, h.data(), 4);
  std::memcpy(&d, h.data(), 8);
  EXPECT_TRUE(std::isnan(f));
  EXPECT_TRUE(std::isnan(d));
  EXPECT_TRUE(__hisnan(__ushort_as_half(h[0])));
  EXPECT_TRUE(__hisnan(__ushort_as_bfloat16(h[0])));
  // and from the stream-ordered allocator
  void* p = nullptr;
  ASSERT_EQ(cudaMallocAsync(&p, 64, nullptr), cudaSuccess);
  uint16_t b[32];
  ASSERT_EQ(cudaMemcpy(b, p, 64, cudaMemcpyDeviceToHost), cudaSuccess);
  for (uint16_t v : b) EXPECT_EQ(v, emu::kPoison16);
  EXPECT_EQ(cudaFreeAsync(p, nullptr), cudaSuccess);
  EXPECT_EQ(cudaFreeAsync(p, nullptr), cudaErrorInvalidValue) << "freed twice";
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
}

TEST(CudaEmulatorMemory, AKernelReadingUnwrittenMemoryComputesNaN) {
  DeviceBuffer<float> x(100), y(100);
  launch(add_one, 2, 64, 0, nullptr, x.get(), y.get(), 100);
  for (float v : y.download()) EXPECT_TRUE(std::isnan(v));
}

TEST(CudaEmulatorMemory, FreedDeviceMemoryIsPoisoned) {
#ifdef EMUTEST_ASAN
  AGT_SKIP_BUILD() << "AddressSanitizer build: freed memory goes to ASan's quarantine, which reports any use";
#else
  float* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 8 * sizeof(float)), cudaSuccess);
  launch(iota, 1, 8, 0, nullptr, p, 8, 1.0f);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  // the emulator keeps freed blocks a while before the heap may reuse them
  uint16_t b[16];
  std::memcpy(b, p, sizeof b);
  for (uint16_t v : b) EXPECT_EQ(v, emu::kPoison16);
#endif
}

TEST(CudaEmulatorMemory, HostOrFreedPointerArgumentIsAnIllegalAddress) {
  std::vector<int> host(4, 0);
  launch(mark, 1, 1, 0, nullptr, host.data());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a GPU finds out when the kernel runs";
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress) << "sticky";
  EXPECT_TRUE(agt::contains(emu::last_fault(), "pointer argument 1")) << emu::last_fault();
  EXPECT_TRUE(agt::contains(emu::last_fault(), "is not device memory")) << emu::last_fault();
  sync_and_clear();
  EXPECT_EQ(host[0], 0) << "the kernel ran on host memory";

  int* freed = nullptr;
  ASSERT_EQ(cudaMalloc(&freed, 4), cudaSuccess);
  ASSERT_EQ(cudaFree(freed), cudaSuccess);
  launch(mark, 1, 1, 0, nullptr, freed);
  EXPECT_EQ(sync_and_clear(), cudaErrorIllegalAddress);
}

__global__ void write_pinned(int* p) { p[threadIdx.x] = int(threadIdx.x) + 10; }

TEST(CudaEmulatorMemory, PinnedMemoryIsReachableFromKernels) {
  int* p = nullptr;
  ASSERT_EQ(cudaHostAlloc(&p, 8 * sizeof(int), cudaHostAllocPortable), cudaSuccess);
  launch(write_pinned, 1, 8, 0, nullptr, p);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(p[i], i + 10);
  EXPECT_EQ(cudaFreeHost(p), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(p), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
}

TEST(CudaEmulatorMemory, CopiesCheckTheirKindAndRange) {
  DeviceBuffer<float> d(8);
  std::vector<float> a(8, 1.0f), b(8, 0.0f);
  EXPECT_EQ(cudaMemcpy(b.data(), a.data(), 32, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d.get(), a.data(), 32, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d.get(), a.data(), 36, cudaMemcpyHostToDevice), cudaErrorInvalidValue) << "past the end";
  EXPECT_EQ(cudaMemset(a.data(), 0, 4), cudaErrorInvalidValue) << "host memory";
  EXPECT_EQ(cudaFree(a.data()), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  // the kind inferred from the pointers
  EXPECT_EQ(cudaMemcpy(d.get(), a.data(), 32, cudaMemcpyDefault), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(b.data(), d.get(), 32, cudaMemcpyDefault), cudaSuccess);
  EXPECT_EQ(b, a);
}

TEST(CudaEmulatorMemory, PoolKeepsFreedMemoryUpToItsThreshold) {
  cudaMemPool_t pool;
  ASSERT_EQ(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
  auto get = [&](cudaMemPoolAttr a) {
    uint64_t v = 0;
    EXPECT_EQ(cudaMemPoolGetAttribute(pool, a, &v), cudaSuccess);
    return v;
  };
  const uint64_t threshold = get(cudaMemPoolAttrReleaseThreshold);
  uint64_t keep = std::numeric_limits<uint64_t>::max();
  ASSERT_EQ(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const uint64_t used0 = get(cudaMemPoolAttrUsedMemCurrent);
  void* p = nullptr;
  ASSERT_EQ(cudaMallocAsync(&p, 1 << 20, nullptr), cudaSuccess);
  EXPECT_EQ(get(cudaMemPoolAttrUsedMemCurrent), used0 + (1 << 20));
  const uint64_t reserved = get(cudaMemPoolAttrReservedMemCurrent);
  EXPECT_GE(reserved, used0 + (1 << 20));
  ASSERT_EQ(cudaFreeAsync(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_EQ(get(cudaMemPoolAttrUsedMemCurrent), used0);
  EXPECT_EQ(get(cudaMemPoolAttrReservedMemCurrent), reserved) << "kept for reuse";
  ASSERT_EQ(cudaMemPoolTrimTo(pool, 0), cudaSuccess);
  EXPECT_EQ(get(cudaMemPoolAttrReservedMemCurrent), used0);
  uint64_t restore = threshold;
  ASSERT_EQ(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &restore), cudaSuccess);
}

// ---- streams and events -------------------------------------------------------------------------------------

struct TwoStreams {
  cudaStream_t a = nullptr, b = nullptr;
  explicit TwoStreams(unsigned flags) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&a, flags), cudaSuccess);
    EXPECT_EQ(cudaStreamCreateWithFlags(&b, flags), cudaSuccess);
  }
  ~TwoStreams() {
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
  }
};

// Stream a writes x; stream b reads it into y, after an event wait or not; then b is
// synchronized and y read.
std::vector<float> produce_consume(bool wait) {
  constexpr int n = 256;
  TwoStreams s(cudaStreamNonBlocking);
  DeviceBuffer<float> x(n), y(n);
  cudaEvent_t written;
  EXPECT_EQ(cudaEventCreateWithFlags(&written, cudaEventDisableTiming), cudaSuccess);
  launch(iota, 2, 128, 0, s.a, x.get(), n, 2.0f);
  EXPECT_EQ(cudaEventRecord(written, s.a), cudaSuccess);
  if (wait) EXPECT_EQ(cudaStreamWaitEvent(s.b, written, 0), cudaSuccess);
  launch(add_one, 2, 128, 0, s.b, x.get(), y.get(), n);
  EXPECT_EQ(cudaStreamSynchronize(s.b), cudaSuccess);
  std::vector<float> out(n);
  EXPECT_EQ(cudaMemcpyAsync(out.data(), y.get(), n * sizeof(float), cudaMemcpyDeviceToHost, s.b), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(written), cudaSuccess);
  return out;
}

bool all_right(const std::vector<float>& y) {
  for (size_t i = 0; i < y.size(); ++i)
    if (y[i] != 2.0f * float(i) + 1) return false;
  return true;
}

TEST(CudaEmulatorStreams, StrictModeCatchesAMissingCrossStreamWait) {
  StrictGuard strict(true);
  EXPECT_TRUE(all_right(produce_consume(true)));
  const std::vector<float> y = produce_consume(false);
  EXPECT_FALSE(all_right(y));
  EXPECT_TRUE(std::isnan(y[5])) << "stream b read x before stream a wrote it";
}

TEST(CudaEmulatorStreams, WithoutStrictModeTheMissingWaitPassesByLuck) {
  StrictGuard eager(false);
  EXPECT_TRUE(all_right(produce_consume(false)));
}

// The legacy default stream waits for the work queued before on blocking streams, and they
// for its; non-blocking streams take part in neither.
TEST(CudaEmulatorStreams, LegacyDefaultStreamSynchronizesWithBlockingStreamsOnly) {
  StrictGuard strict(true);
  constexpr int n = 64;
  for (unsigned flags : {unsigned(cudaStreamDefault), unsigned(cudaStreamNonBlocking)}) {
    SCOPED_TRACE(flags == cudaStreamDefault ? "blocking stream" : "non-blocking stream");
    const bool implicit = flags == cudaStreamDefault;
    TwoStreams s(flags);
    {  // a stream writes, the legacy stream reads
      DeviceBuffer<float> x(n), y(n);
      launch(iota, 1, 64, 0, s.a, x.get(), n, 2.0f);
      launch(add_one, 1, 64, 0, nullptr, x.get(), y.get(), n);
      EXPECT_EQ(all_right(y.download()), implicit);  // cudaMemcpy: the legacy stream
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
    {  // the legacy stream writes, a stream reads
      DeviceBuffer<float> x(n), y(n);
      launch(iota, 1, 64, 0, nullptr, x.get(), n, 2.0f);
      launch(add_one, 1, 64, 0, s.b, x.get(), y.get(), n);
      ASSERT_EQ(cudaStreamSynchronize(s.b), cudaSuccess);
      std::vector<float> out(n);
      ASSERT_EQ(cudaMemcpyAsync(out.data(), y.get(), n * sizeof(float), cudaMemcpyDeviceToHost, s.b), cudaSuccess);
      EXPECT_EQ(all_right(out), implicit);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
  }
}

TEST(CudaEmulatorStreams, CopiesToPinnedMemoryArriveWhenWaitedFor) {
  StrictGuard strict(true);
  constexpr int n = 32;
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  DeviceBuffer<float> x(n);
  float* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, n * sizeof(float), cudaHostAllocPortable), cudaSuccess);
  launch(iota, 1, 32, 0, s, x.get(), n, 1.0f);
  ASSERT_EQ(cudaMemcpyAsync(pinned, x.get(), n * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_TRUE(std::isnan(pinned[3])) << "a non-blocking copy into pinned memory returns before it is done";
  ASSERT_EQ(cudaStreamQuery(s), cudaSuccess);  // a query waits in strict mode
  EXPECT_EQ(pinned[3], 3.0f);
  // from pageable memory the source is read at the call; from pinned memory when it runs
  std::vector<float> pageable(n, 5.0f);
  ASSERT_EQ(cudaMemcpyAsync(x.get(), pageable.data(), n * sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess);
  pageable.assign(n, 6.0f);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  std::vector<float> got(n);
  ASSERT_EQ(cudaMemcpyAsync(got.data(), x.get(), n * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(got[0], 5.0f);
  for (int i = 0; i < n; ++i) pinned[i] = 7.0f;
  ASSERT_EQ(cudaMemcpyAsync(x.get(), pinned, n * sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess);
  for (int i = 0; i < n; ++i) pinned[i] = 8.0f;  // a race a GPU has too
  ASSERT_EQ(cudaMemcpyAsync(got.data(), x.get(), n * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(got[0], 8.0f);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST(CudaEmulatorStreams, EventsRecordQueryAndTime) {
  StrictGuard strict(true);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t start, end, untimed, never;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&end), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&never), cudaSuccess);
  DeviceBuffer<float> x(1024);
  ASSERT_EQ(cudaEventRecord(start, s), cudaSuccess);
  launch(iota, 4, 256, 0, s, x.get(), 1024, 1.0f);
  ASSERT_EQ(cudaEventRecord(end, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(untimed, s), cudaSuccess);
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, end), cudaErrorNotReady) << "nothing has waited for the stream yet";
  EXPECT_EQ(cudaGetLastError(), cudaErrorNotReady);
  EXPECT_EQ(cudaEventQuery(never), cudaSuccess) << "an event never recorded is complete";
  ASSERT_EQ(cudaEventSynchronize(end), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, end), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, untimed), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, never), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  for (cudaEvent_t e : {start, end, untimed, never}) EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(start), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
}

TEST(CudaEmulatorStreams, WorkOfADestroyedStreamStillRuns) {
  StrictGuard strict(true);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  DeviceBuffer<float> x(64);
  launch(iota, 1, 64, 0, s, x.get(), 64, 3.0f);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(x.download()[10], 30.0f);
}

// ---- AddressSanitizer -----------------------------------------------------------------------------------------

__global__ void read_past_the_end(const float* x, float* y, int n) { y[0] = x[n]; }

// One element past the end of an exact-size block.
[[maybe_unused]] void run_read_past_the_end() {
  DeviceBuffer<float> x(10), y(1);
  launch(read_past_the_end, 1, 1, 0, nullptr, x.get(), y.get(), 10);
  cudaDeviceSynchronize();
}

TEST(CudaEmulatorSanitizer, OutOfBoundsReadInAKernelIsReported) {
#ifndef EMUTEST_ASAN
  AGT_SKIP_BUILD() << "not an AddressSanitizer build: an out-of-bounds read in a kernel goes unnoticed here";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(run_read_past_the_end(), "heap-buffer-overflow(.|\n)*read_past_the_end");
#endif
}

}  // namespace
