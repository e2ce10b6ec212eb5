// The CUDA backend's memory, streams, events and errors: stream-ordered pools
// (cudaMallocAsync and cudaFreeAsync on the storage's stream, a release threshold that
// keeps freed memory for reuse, so a steady-state step calls neither cudaMalloc nor
// cudaFree), pinned host memory (cudaHostAlloc), copies on the current stream,
// non-blocking cudaStream_t streams and cudaEvent_t events. Every host wait here then reads
// the device error slot, so an index error found by a kernel surfaces as an ag::Error at
// the next counted sync. Frees never throw (they run in destructors).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>

#include "ampgrad/hw/profile.h"
#include "ampgrad/sync.h"
#include "cuda/common.cuh"
#include "cuda/cuda_backend.h"

namespace ampgrad::cuda {
namespace {

int count_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

void check_device(int index, const char* op) {
  const int n = count_devices();
  AG_CHECK(n > 0, op, "no CUDA device is available (this build has CUDA, the machine has no GPU or driver)");
  AG_CHECK(index >= 0 && index < n, op, "CUDA device ", index, " does not exist (", n, " found)");
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

// An event with the device it belongs to, so that a wait on it knows whose errors to read.
struct EventBox {
  cudaEvent_t event;
  int device;
};
EventBox* box(void* e) { return static_cast<EventBox*>(e); }

// cudaSuccess: done; cudaErrorNotReady: still running (and not a sticky error to keep).
bool ready(const char* op, cudaError_t err) {
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  AG_CHECK(err == cudaSuccess, op, "failed: ", cudaGetErrorString(err));
  return true;
}

constexpr int kMaxDevices = 64;

}  // namespace

// ---- errors --------------------------------------------------------------------------------
const char* status_string(cublasStatus_t s) { return cublasLtGetStatusName(s); }
const char* status_string(cudnnStatus_t s) { return cudnnGetErrorString(s); }

const char* error_op_name(int code) {
  switch (code) {
    case kErrIndexSelect: return op::index_select;
    case kErrIndexAdd: return "index_add";
    case kErrGather: return op::gather;
    case kErrScatterAdd: return "scatter_add";
    case kErrEmbedding: return op::embedding;
    case kErrCrossEntropy: return op::cross_entropy;
    default: return "cuda";
  }
}

namespace {
// Devices whose error slot a kernel was given; only those can hold an error.
std::atomic<uint64_t> g_slots_in_use{0};

// A device's error slot: the device word kernels report into, a pinned copy the host reads,
// and a private non-blocking stream on which the host takes a report. Reading the slot after
// a wait on one stream must not wait for the others (a synchronous copy on the legacy
// default stream, which is our default stream, waits for all of its work), and taking a
// report must not race with a kernel still running on another stream: one atomic exchange
// on the device takes it, and a report that comes later stays for the next wait.
struct ErrorSlot {
  DeviceError* dev = nullptr;
  DeviceError* host = nullptr;
  cudaStream_t stream = nullptr;
};

__global__ void take_device_error(DeviceError* slot, DeviceError* out) {
  const int code = atomicExch(&slot->code, 0);
  out->code = code;
  out->value = code ? slot->value : 0;
  out->bound = code ? slot->bound : 0;
}

const ErrorSlot& slot_of(int device_index) {
  static std::mutex mu;
  static ErrorSlot slots[kMaxDevices];
  AG_CHECK(device_index >= 0 && device_index < kMaxDevices, "cuda", "device index ", device_index, " out of range");
  std::lock_guard<std::mutex> lock(mu);
  ErrorSlot& s = slots[device_index];
  if (!s.dev) {
    DeviceGuard guard(device_index, "cuda");
    AG_CUDA_CHECK("cuda", cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    AG_CUDA_CHECK("cuda", cudaHostAlloc(reinterpret_cast<void**>(&s.host), sizeof(DeviceError), cudaHostAllocDefault));
    AG_CUDA_CHECK("cuda", cudaMalloc(&s.dev, sizeof(DeviceError)));
    AG_CUDA_CHECK("cuda", cudaMemsetAsync(s.dev, 0, sizeof(DeviceError), s.stream));
    // Kernels on other streams do not wait for the private stream: the slot is zero before
    // the first kernel that gets it is queued.
    AG_CUDA_CHECK("cuda", cudaStreamSynchronize(s.stream));
  }
  return s;
}
}  // namespace

DeviceError* error_slot(int device_index) {
  DeviceError* s = slot_of(device_index).dev;
  g_slots_in_use.fetch_or(uint64_t(1) << device_index, std::memory_order_relaxed);
  return s;
}

void raise_device_errors(int device_index) {
  if (device_index < 0 || device_index >= kMaxDevices) return;
  // Only a slot a kernel was given can hold an error (error_slot marks it).
  if (!(g_slots_in_use.load(std::memory_order_relaxed) & (uint64_t(1) << device_index))) return;
  const ErrorSlot& slot = slot_of(device_index);
  DeviceGuard guard(device_index, "cuda");
  launch(take_device_error, 1, 1, 0, slot.stream, slot.dev, slot.host);
  AG_CUDA_CHECK("cuda", cudaGetLastError());
  AG_CUDA_CHECK("cuda", cudaStreamSynchronize(slot.stream));
  const DeviceError e = *slot.host;
  if (e.code == 0) return;
  if (e.code == kErrCrossEntropy)  // the CPU kernel's wording
    AG_ERROR(op::cross_entropy, "target ", e.value, " is out of range for ", e.bound,
             " classes (found on cuda:", device_index, ")");
  AG_ERROR(error_op_name(e.code), "index ", e.value, " is out of range for a dimension of size ", e.bound,
           " (found on cuda:", device_index, ")");
}

void check_launch(const char* op, int device_index) {
  AG_CUDA_CHECK(op, cudaGetLastError());
  if (debug_sync()) {
    AG_CUDA_CHECK(op, cudaStreamSynchronize(stream_of(Device(kCUDA, device_index))));
    raise_device_errors(device_index);
  }
}

DeviceGuard::DeviceGuard(int index, const char* op) {
  int current = -1;
  AG_CUDA_CHECK(op, cudaGetDevice(&current));
  if (current != index) {
    AG_CUDA_CHECK(op, cudaSetDevice(index));
    previous_ = current;
  }
}
DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

// ---- memory -----------------------------------------------------------------------------------
int CudaBackend::device_count() { return count_devices(); }

Backend::Allocation CudaBackend::allocate(size_t nbytes, Stream stream) {
  const int index = stream.device().index;
  check_device(index, "allocate");
  DeviceGuard guard(index, "allocate");
  keep_pool_memory(index);
  void* p = nullptr;
  AG_CUDA_CHECK("allocate", cudaMallocAsync(&p, nbytes ? nbytes : 1, native(stream)));
  return {p, false};
}

void CudaBackend::deallocate(void* p, size_t, Stream stream) {
  if (!p) return;
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess) current = -1;
  if (current != stream.device().index) cudaSetDevice(stream.device().index);
  if (cudaFreeAsync(p, native(stream)) != cudaSuccess) cudaGetLastError();  // never throws from a destructor path
  if (current >= 0 && current != stream.device().index) cudaSetDevice(current);
}

Backend::Allocation CudaBackend::allocate_pinned(size_t nbytes) {
  void* p = nullptr;
  AG_CUDA_CHECK("pin_memory", cudaHostAlloc(&p, nbytes ? nbytes : 1, cudaHostAllocPortable));
  return {p, false};
}

void CudaBackend::deallocate_pinned(void* p, size_t) {
  if (p && cudaFreeHost(p) != cudaSuccess) cudaGetLastError();
}

size_t CudaBackend::cached_bytes(int device_index) {
  if (device_index < 0 || device_index >= count_devices()) return 0;
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

void CudaBackend::empty_cache(int device_index) {
  check_device(device_index, "empty_cache");
  cudaMemPool_t pool;
  AG_CUDA_CHECK("empty_cache", cudaDeviceGetDefaultMemPool(&pool, device_index));
  AG_CUDA_CHECK("empty_cache", cudaMemPoolTrimTo(pool, 0));
}

void CudaBackend::copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n,
                             Stream stream, bool non_blocking) {
  const cudaMemcpyKind kind = dst_device.is_cuda() && src_device.is_cuda() ? cudaMemcpyDeviceToDevice
                              : dst_device.is_cuda()                       ? cudaMemcpyHostToDevice
                                                                           : cudaMemcpyDeviceToHost;
  const int index = stream.device().index;
  DeviceGuard guard(index, "copy");
  AG_CUDA_CHECK("copy", cudaMemcpyAsync(dst, src, n, kind, native(stream)));
  if (!non_blocking) {
    AG_CUDA_CHECK("copy", cudaStreamSynchronize(native(stream)));
    raise_device_errors(index);
  }
}

// ---- streams and events ----------------------------------------------------------------------
void* CudaBackend::create_stream(int device_index) {
  check_device(device_index, "create_stream");
  DeviceGuard guard(device_index, "create_stream");
  cudaStream_t s = nullptr;
  // Non-blocking: work on it does not wait for the legacy default stream, nor it for this.
  AG_CUDA_CHECK("create_stream", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void CudaBackend::destroy_stream(Stream s, void* handle) {
  DeviceGuard guard(s.device().index, "destroy_stream");
  const auto stream = static_cast<cudaStream_t>(handle);
  release_blas_workspace(s, stream);
  // Work still queued on it runs; the driver releases the stream afterwards.
  AG_CUDA_CHECK("destroy_stream", cudaStreamDestroy(stream));
}

void CudaBackend::synchronize_stream(Stream s) {
  DeviceGuard guard(s.device().index, "Stream::synchronize");
  AG_CUDA_CHECK("Stream::synchronize", cudaStreamSynchronize(native(s)));
  raise_device_errors(s.device().index);
}

bool CudaBackend::query_stream(Stream s) {
  DeviceGuard guard(s.device().index, "Stream::query");
  return ready("Stream::query", cudaStreamQuery(native(s)));
}

void CudaBackend::synchronize_device(int device_index) {
  check_device(device_index, "synchronize");
  DeviceGuard guard(device_index, "synchronize");
  AG_CUDA_CHECK("synchronize", cudaDeviceSynchronize());
  raise_device_errors(device_index);
}

void* CudaBackend::create_event(int device_index, bool enable_timing) {
  check_device(device_index, "Event");
  DeviceGuard guard(device_index, "Event");
  cudaEvent_t e = nullptr;
  AG_CUDA_CHECK("Event", cudaEventCreateWithFlags(&e, enable_timing ? cudaEventDefault : cudaEventDisableTiming));
  return new EventBox{e, device_index};
}

void CudaBackend::destroy_event(int, void* event) {
  if (!event) return;
  if (cudaEventDestroy(box(event)->event) != cudaSuccess) cudaGetLastError();  // called from destructors
  delete box(event);
}

void CudaBackend::record_event(void* event, Stream s) {
  DeviceGuard guard(s.device().index, "Event::record");
  AG_CUDA_CHECK("Event::record", cudaEventRecord(box(event)->event, native(s)));
}

void CudaBackend::stream_wait_event(Stream s, void* event) {
  DeviceGuard guard(s.device().index, "Event::wait");
  AG_CUDA_CHECK("Event::wait", cudaStreamWaitEvent(native(s), box(event)->event, 0));
}

void CudaBackend::synchronize_event(void* event) {
  AG_CUDA_CHECK("Event::synchronize", cudaEventSynchronize(box(event)->event));
  raise_device_errors(box(event)->device);
}

bool CudaBackend::query_event(void* event) { return ready("Event::query", cudaEventQuery(box(event)->event)); }

double CudaBackend::event_elapsed_ms(void* start, void* end) {
  float ms = 0;
  AG_CUDA_CHECK("Event::elapsed_time", cudaEventElapsedTime(&ms, box(start)->event, box(end)->event));
  return double(ms);
}

CudaBackend& backend_instance() {
  static CudaBackend* b = new CudaBackend();
  return *b;
}

}  // namespace ampgrad::cuda

namespace ampgrad {

Backend& cuda_backend(const char*) { return cuda::backend_instance(); }

bool built_with_cuda() { return true; }

bool cuda_emulated() {
#ifdef AMPGRAD_CUDA_EMULATOR
  return true;
#else
  return false;
#endif
}

namespace hw::detail {
// For the hardware profile: any runtime error (no driver, a device that fails to answer)
// gives an empty list, never an exception, and the sticky error is cleared.
std::vector<CudaDevice> query_cuda_devices() {
  std::vector<CudaDevice> out;
  const int n = cuda::count_devices();
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
