// The CUDA backend. So far it holds memory (stream-ordered pools: cudaMallocAsync and
// cudaFreeAsync on the storage's stream; pinned host memory from cudaHostAlloc), moves
// bytes between host and device on the current stream, and implements streams
// (non-blocking cudaStream_t) and events (cudaEvent_t); the kernel families arrive with the
// CUDA backend issue, and until then every other entry point inherits the default that
// names the op and says it is not implemented on cuda. Every CUDA runtime call that can
// fail for the caller goes through AG_CUDA_CHECK, which names the failing call; frees never
// throw (they run in destructors).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

#include "ampgrad/backend.h"
#include "ampgrad/hw/profile.h"

#define AG_CUDA_CHECK(op, call)                                                   \
  do {                                                                            \
    const cudaError_t err_ = (call);                                              \
    if (err_ != cudaSuccess)                                                      \
      AG_ERROR(op, #call " failed: ", cudaGetErrorString(err_));                  \
  } while (0)

namespace ampgrad {
namespace {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

// cudaMallocAsync's pool returns freed memory to the system at every synchronize unless its
// release threshold says to keep it; like PyTorch's async allocator, keep it all.
void keep_pool_memory(int device_index) {
  static std::once_flag once[64];
  std::call_once(once[device_index % 64], [&] {
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, device_index) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    uint64_t keep = UINT64_MAX;
    if (cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess) cudaGetLastError();
  });
}

cudaStream_t native(Stream s) { return static_cast<cudaStream_t>(stream_handle(s)); }
cudaEvent_t native(void* event) { return static_cast<cudaEvent_t>(event); }

class CudaBackend final : public Backend {
 public:
  DeviceType device_type() const override { return DeviceType::CUDA; }
  int device_count() override { return ampgrad::device_count(); }

  // ---- memory: stream-ordered (cudaMallocAsync / cudaFreeAsync on the storage's stream) ----
  Allocation allocate(size_t nbytes, Stream stream) override {
    const int index = stream.device().index;
    check_device(index, "allocate");
    AG_CUDA_CHECK("allocate", cudaSetDevice(index));
    keep_pool_memory(index);
    void* p = nullptr;
    AG_CUDA_CHECK("allocate", cudaMallocAsync(&p, nbytes ? nbytes : 1, native(stream)));
    return {p, false};
  }
  void deallocate(void* p, size_t, Stream stream) override {
    if (!p) return;
    cudaSetDevice(stream.device().index);
    if (cudaFreeAsync(p, native(stream)) != cudaSuccess) cudaGetLastError();  // never throws from a destructor path
  }
  Allocation allocate_pinned(size_t nbytes) override {
    void* p = nullptr;
    AG_CUDA_CHECK("pin_memory", cudaHostAlloc(&p, nbytes ? nbytes : 1, cudaHostAllocPortable));
    return {p, false};
  }
  void deallocate_pinned(void* p, size_t) override {
    if (p && cudaFreeHost(p) != cudaSuccess) cudaGetLastError();
  }
  size_t cached_bytes(int device_index) override {
    if (device_index < 0 || device_index >= ampgrad::device_count()) return 0;
    cudaMemPool_t pool;
    uint64_t reserved = 0, used = 0;
    if (cudaDeviceGetDefaultMemPool(&pool, device_index) != cudaSuccess ||
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) != cudaSuccess ||
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return size_t(reserved - std::min(used, reserved));
  }
  void empty_cache(int device_index) override {
    check_device(device_index, "empty_cache");
    cudaMemPool_t pool;
    AG_CUDA_CHECK("empty_cache", cudaDeviceGetDefaultMemPool(&pool, device_index));
    AG_CUDA_CHECK("empty_cache", cudaMemPoolTrimTo(pool, 0));
  }
  void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n, Stream stream,
                  bool non_blocking) override {
    const cudaMemcpyKind kind = dst_device.is_cuda() && src_device.is_cuda() ? cudaMemcpyDeviceToDevice
                                : dst_device.is_cuda()                       ? cudaMemcpyHostToDevice
                                                                             : cudaMemcpyDeviceToHost;
    AG_CUDA_CHECK("copy", cudaSetDevice(stream.device().index));
    AG_CUDA_CHECK("copy", cudaMemcpyAsync(dst, src, n, kind, native(stream)));
    if (!non_blocking) AG_CUDA_CHECK("copy", cudaStreamSynchronize(native(stream)));
  }

  // ---- streams and events -----------------------------------------------------------------
  void* create_stream(int device_index) override {
    check_device(device_index, "create_stream");
    AG_CUDA_CHECK("create_stream", cudaSetDevice(device_index));
    cudaStream_t s = nullptr;
    // Non-blocking: work on it does not wait for the legacy default stream, nor it for this.
    AG_CUDA_CHECK("create_stream", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }
  void destroy_stream(int device_index, void* handle) override {
    AG_CUDA_CHECK("destroy_stream", cudaSetDevice(device_index));
    // Work still queued on it runs; the driver releases the stream afterwards.
    AG_CUDA_CHECK("destroy_stream", cudaStreamDestroy(static_cast<cudaStream_t>(handle)));
  }
  void synchronize_stream(Stream s) override {
    AG_CUDA_CHECK("Stream::synchronize", cudaSetDevice(s.device().index));
    AG_CUDA_CHECK("Stream::synchronize", cudaStreamSynchronize(native(s)));
  }
  bool query_stream(Stream s) override {
    AG_CUDA_CHECK("Stream::query", cudaSetDevice(s.device().index));
    return ready("Stream::query", cudaStreamQuery(native(s)));
  }
  void synchronize_device(int device_index) override {
    check_device(device_index, "synchronize");
    AG_CUDA_CHECK("synchronize", cudaSetDevice(device_index));
    AG_CUDA_CHECK("synchronize", cudaDeviceSynchronize());
  }
  void* create_event(int device_index, bool enable_timing) override {
    check_device(device_index, "Event");
    AG_CUDA_CHECK("Event", cudaSetDevice(device_index));
    cudaEvent_t e = nullptr;
    AG_CUDA_CHECK("Event", cudaEventCreateWithFlags(&e, enable_timing ? cudaEventDefault : cudaEventDisableTiming));
    return e;
  }
  void destroy_event(int device_index, void* event) override {
    cudaSetDevice(device_index);
    if (cudaEventDestroy(native(event)) != cudaSuccess) cudaGetLastError();  // called from destructors
  }
  void record_event(void* event, Stream s) override {
    AG_CUDA_CHECK("Event::record", cudaSetDevice(s.device().index));
    AG_CUDA_CHECK("Event::record", cudaEventRecord(native(event), native(s)));
  }
  void stream_wait_event(Stream s, void* event) override {
    AG_CUDA_CHECK("Event::wait", cudaSetDevice(s.device().index));
    AG_CUDA_CHECK("Event::wait", cudaStreamWaitEvent(native(s), native(event), 0));
  }
  void synchronize_event(void* event) override {
    AG_CUDA_CHECK("Event::synchronize", cudaEventSynchronize(native(event)));
  }
  bool query_event(void* event) override { return ready("Event::query", cudaEventQuery(native(event))); }
  double event_elapsed_ms(void* start, void* end) override {
    float ms = 0;
    AG_CUDA_CHECK("Event::elapsed_time", cudaEventElapsedTime(&ms, native(start), native(end)));
    return double(ms);
  }

 private:
  static void check_device(int index, const char* op) {
    const int n = ampgrad::device_count();
    AG_CHECK(n > 0, op, "no CUDA device is available (this build has CUDA, the machine has no GPU or driver)");
    AG_CHECK(index >= 0 && index < n, op, "CUDA device ", index, " does not exist (", n, " found)");
  }
  // cudaSuccess: done; cudaErrorNotReady: still running (and not a sticky error to keep).
  static bool ready(const char* op, cudaError_t err) {
    if (err == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    AG_CHECK(err == cudaSuccess, op, "failed: ", cudaGetErrorString(err));
    return true;
  }
};

}  // namespace

Backend& cuda_backend(const char* op) {
  static CudaBackend* b = new CudaBackend();
  (void)op;
  return *b;
}

bool built_with_cuda() { return true; }

namespace hw::detail {
// For the hardware profile: any runtime error (no driver, a device that fails to answer)
// gives an empty list, never an exception, and the sticky error is cleared.
std::vector<CudaDevice> query_cuda_devices() {
  std::vector<CudaDevice> out;
  const int n = device_count();
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      cudaGetLastError();
      return {};
    }
    out.push_back({i, prop.name, prop.major, prop.minor, prop.totalGlobalMem, prop.multiProcessorCount});
  }
  return out;
}
}  // namespace hw::detail

}  // namespace ampgrad
