// The emulated CUDA runtime API (cuda_runtime.h): one device, its memory, streams, events
// and the launches' checks.
//
// Device memory is host memory from a separate arena: each allocation is its own heap block
// of exactly the size asked for (so AddressSanitizer reports an access past its end from the
// kernel's frame), registered here with its size; fresh and freed blocks are filled with the
// poison pattern (emu/control.h), and without ASan freed blocks wait in a quarantine before
// the heap reuses them. A kernel argument that is a pointer must point into a live device
// or pinned allocation (or be null): a kernel given a host pointer, or a freed one, is
// stopped with cudaErrorIllegalAddress, as a GPU would fault reading it.
//
// Streams are in-order queues of work. Without strict mode each piece of work runs when it
// is queued; in strict mode it runs when something waits for it (run_until), a stream's work
// first running what it waits for on other streams (cudaStreamWaitEvent, and the legacy
// default stream's implicit waits: work on it waits for everything queued before on the
// blocking streams, and work on a blocking stream for everything queued before on it).
//
// Errors follow the runtime: each call returns its error and leaves it in the calling host
// thread's last error (cudaGetLastError returns and clears it, cudaPeekAtLastError only
// returns it); a bad launch configuration is such an error, not sticky; a fault inside a
// kernel is sticky: every later call that touches the device returns it.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "internal.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AMPGRAD_EMU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define AMPGRAD_EMU_ASAN 1
#endif

// ---- streams and events ------------------------------------------------------------------------
/// One piece of work on a stream, or a wait for a point of another stream.
struct QueueItem {
  uint64_t seq = 0;
  std::function<void()> work;  // empty for a wait
  std::shared_ptr<CUstream_st> wait_on;
  uint64_t wait_seq = 0;
  bool after_fault = false;  // runs even after a sticky error (frees, event records)
};

struct CUstream_st {
  unsigned flags = 0;
  bool legacy = false;
  bool destroyed = false;
  std::deque<QueueItem> queue;
  uint64_t next_seq = 1;  // the number the next item gets
  uint64_t done_seq = 0;  // everything up to this has run
  uint64_t tail() const { return next_seq - 1; }
  bool pending() const { return done_seq < tail(); }
};

struct CUevent_st {
  unsigned flags = 0;
  bool recorded = false;
  std::shared_ptr<CUstream_st> stream;  // of the last record
  uint64_t seq = 0;                     // the last record's item
  uint64_t generation = 0;
  bool complete = false;
  std::chrono::steady_clock::time_point time{};
};

/// The default memory pool's accounting. A stream-ordered free is counted when it is
/// called: the real pool may hand the bytes to the next allocation on that stream at once,
/// whenever the free itself runs; the emulator frees the block itself in stream order.
struct CUmemPoolHandle_st {
  uint64_t release_threshold = 0;
  uint64_t used = 0, used_high = 0;
  uint64_t kept = 0;  // freed bytes the pool would keep for reuse (accounted, not held)
  uint64_t reserved_high = 0;
  uint64_t reserved() const { return used + kept; }
};

namespace ampgrad::emu {
namespace {

using detail::env_long;

// ---- the device's properties --------------------------------------------------------------------
constexpr size_t kMiB = size_t(1) << 20;

cudaDeviceProp h200() {
  cudaDeviceProp p{};
  std::snprintf(p.name, sizeof p.name, "NVIDIA H200 (emulated)");
  p.totalGlobalMem = 143771 * kMiB;  // reported, never reserved
  p.sharedMemPerBlock = 48 * 1024;
  p.regsPerBlock = 65536;
  p.warpSize = 32;
  p.memPitch = 2147483647;
  p.maxThreadsPerBlock = 1024;
  p.maxThreadsDim[0] = 1024, p.maxThreadsDim[1] = 1024, p.maxThreadsDim[2] = 64;
  p.maxGridSize[0] = 2147483647, p.maxGridSize[1] = 65535, p.maxGridSize[2] = 65535;
  p.totalConstMem = 65536;
  p.major = 9, p.minor = 0;
  p.textureAlignment = 512;
  p.multiProcessorCount = 132;
  p.canMapHostMemory = 1;
  p.concurrentKernels = 1;
  p.ECCEnabled = 1;
  p.asyncEngineCount = 5;
  p.unifiedAddressing = 1;
  p.memoryBusWidth = 6144;
  p.l2CacheSize = 50 * int(kMiB);
  p.maxThreadsPerMultiProcessor = 2048;
  p.sharedMemPerMultiprocessor = 228 * 1024;
  p.regsPerMultiprocessor = 65536;
  p.managedMemory = 1;
  p.cooperativeLaunch = 1;
  p.sharedMemPerBlockOptin = 227 * 1024;
  p.maxBlocksPerMultiProcessor = 32;
  p.reservedSharedMemPerBlock = 1024;
  p.memoryPoolsSupported = 1;
  return p;
}

cudaDeviceProp a100() {
  cudaDeviceProp p = h200();
  std::snprintf(p.name, sizeof p.name, "NVIDIA A100-SXM4-80GB (emulated)");
  p.totalGlobalMem = 81920 * kMiB;
  p.major = 8, p.minor = 0;
  p.multiProcessorCount = 108;
  p.asyncEngineCount = 3;
  p.memoryBusWidth = 5120;
  p.l2CacheSize = 40 * int(kMiB);
  p.sharedMemPerMultiprocessor = 164 * 1024;
  p.sharedMemPerBlockOptin = 163 * 1024;
  return p;
}

/// AMPGRAD_CUDA_EMULATOR_DEVICE: sm_90 (or h200, the default) or sm_80 (or a100).
const cudaDeviceProp& props() {
  static const cudaDeviceProp p = [] {
    const char* e = std::getenv("AMPGRAD_CUDA_EMULATOR_DEVICE");
    const std::string v = e ? e : "";
    if (v == "sm_80" || v == "a100") return a100();
    if (!v.empty() && v != "sm_90" && v != "h200")
      std::fprintf(stderr,
                   "ampgrad CUDA emulator: AMPGRAD_CUDA_EMULATOR_DEVICE=%s is not sm_90, h200, sm_80 or a100; "
                   "emulating an H200 (sm_90)\n",
                   e);
    return h200();
  }();
  return p;
}

// ---- errors -------------------------------------------------------------------------------------------
thread_local cudaError_t t_last = cudaSuccess;
std::atomic<int> g_sticky{cudaSuccess};

cudaError_t sticky() { return cudaError_t(g_sticky.load(std::memory_order_relaxed)); }

/// A call's result: kept as the thread's last error when it is one.
cudaError_t result(cudaError_t e) {
  if (e != cudaSuccess) t_last = e;
  return e;
}

// ---- memory ----------------------------------------------------------------------------------------------
enum class Kind { Device, Pinned };

struct Allocation {
  size_t size;
  Kind kind;
  bool from_pool;    // cudaMallocAsync
  bool free_queued;  // cudaFreeAsync called, not yet run
};

#ifndef AMPGRAD_EMU_ASAN
/// Freed device blocks wait here, poisoned, before the heap gets them back (not under ASan,
/// whose own quarantine reports a use after free exactly).
constexpr size_t kQuarantineBytes = 64 * kMiB;
#endif

// ---- the runtime's state -----------------------------------------------------------------------------------
struct Runtime {
  std::recursive_mutex mu;
  bool strict = env_long("AMPGRAD_CUDA_EMULATOR_STRICT", 0) != 0;
  std::map<uintptr_t, Allocation> allocations;
  std::deque<std::pair<void*, size_t>> quarantine;
  size_t quarantined = 0;
  size_t device_bytes = 0;  // live device allocations
  std::shared_ptr<CUstream_st> legacy = std::make_shared<CUstream_st>();
  std::map<CUstream_st*, std::shared_ptr<CUstream_st>> streams;  // created, not destroyed
  std::vector<std::shared_ptr<CUstream_st>> destroyed;           // destroyed with work still queued
  std::map<CUevent_st*, std::shared_ptr<CUevent_st>> events;
  CUmemPoolHandle_st pool;
  std::map<const void*, int> max_dynamic_shared;  // cudaFuncSetAttribute
  std::string last_fault;
  Runtime() { legacy->legacy = true; }
};

Runtime& rt() {
  static Runtime* r = new Runtime();  // never destroyed: work may still be queued at exit
  return *r;
}

thread_local int t_device = 0;

void set_sticky(cudaError_t e, const std::string& message) {
  int expected = cudaSuccess;
  g_sticky.compare_exchange_strong(expected, int(e));
  rt().last_fault = message;
  std::fprintf(stderr, "ampgrad CUDA emulator: %s (%s)\n", message.c_str(), cudaGetErrorString(e));
}

void* allocate_block(size_t n) {
  void* p = nullptr;
  // 256 bytes, as cudaMalloc aligns; exactly n bytes, so that the sanitizer sees the end
  if (posix_memalign(&p, 256, n ? n : 1) != 0) return nullptr;
  detail::poison(p, n);
  return p;
}

void free_block(void* p, size_t n) {
  detail::poison(p, n);
#ifdef AMPGRAD_EMU_ASAN
  std::free(p);
#else
  Runtime& r = rt();
  r.quarantine.emplace_back(p, n);
  r.quarantined += n;
  while (r.quarantined > kQuarantineBytes) {
    std::free(r.quarantine.front().first);
    r.quarantined -= r.quarantine.front().second;
    r.quarantine.pop_front();
  }
#endif
}

/// The live allocation that holds [p, p + n) (n == 0: p may be its end), or null.
Allocation* find(const void* p, size_t n, uintptr_t* base_out = nullptr) {
  Runtime& r = rt();
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = r.allocations.upper_bound(a);
  if (it == r.allocations.begin()) return nullptr;
  --it;
  if (a - it->first > it->second.size || n > it->second.size - (a - it->first)) return nullptr;
  if (base_out) *base_out = it->first;
  return &it->second;
}

bool is_device(const void* p, size_t n) {
  const Allocation* a = find(p, n);
  return a && a->kind == Kind::Device;
}
bool is_pinned(const void* p, size_t n) {
  const Allocation* a = find(p, n);
  return a && a->kind == Kind::Pinned;
}

// ---- queues ---------------------------------------------------------------------------------------------------
void trim_pool();

/// Runs stream s up to item seq (in strict mode the only place work runs).
void run_until(CUstream_st& s, uint64_t seq) {
  while (!s.queue.empty() && s.queue.front().seq <= seq) {
    QueueItem item = std::move(s.queue.front());
    s.queue.pop_front();
    if (item.wait_on)
      run_until(*item.wait_on, item.wait_seq);
    else if (item.work && (sticky() == cudaSuccess || item.after_fault))
      item.work();
    s.done_seq = item.seq;
  }
}

uint64_t push(CUstream_st& s, QueueItem item) {
  item.seq = s.next_seq++;
  const uint64_t seq = item.seq;
  s.queue.push_back(std::move(item));
  return seq;
}

void push_wait(CUstream_st& s, const std::shared_ptr<CUstream_st>& on, uint64_t seq) {
  QueueItem w;
  w.wait_on = on;
  w.wait_seq = seq;
  push(s, std::move(w));
}

/// The legacy default stream's implicit synchronization, for work about to be queued on s.
void implicit_waits(CUstream_st& s) {
  Runtime& r = rt();
  if (s.legacy) {
    auto wait_for = [&](const std::shared_ptr<CUstream_st>& b) {
      if (!(b->flags & cudaStreamNonBlocking) && b->pending()) push_wait(s, b, b->tail());
    };
    for (auto& [h, b] : r.streams) wait_for(b);
    for (auto& b : r.destroyed) wait_for(b);
  } else if (!(s.flags & cudaStreamNonBlocking) && r.legacy->pending()) {
    push_wait(s, r.legacy, r.legacy->tail());
  }
}

/// Queues work on s; without strict mode it runs at once. Returns its item.
uint64_t enqueue_work(CUstream_st& s, std::function<void()> work, bool after_fault = false) {
  implicit_waits(s);
  QueueItem item;
  item.work = std::move(work);
  item.after_fault = after_fault;
  const uint64_t seq = push(s, std::move(item));
  if (!rt().strict) run_until(s, seq);
  return seq;
}

/// The stream a handle names (null for an unknown or destroyed one).
std::shared_ptr<CUstream_st> stream_of(cudaStream_t h) {
  Runtime& r = rt();
  if (h == nullptr || h == cudaStreamLegacy) return r.legacy;
  auto it = r.streams.find(h);
  return it == r.streams.end() ? nullptr : it->second;
}

std::shared_ptr<CUevent_st> event_of(cudaEvent_t h) {
  auto it = rt().events.find(h);
  return it == rt().events.end() ? nullptr : it->second;
}

void run_all() {
  Runtime& r = rt();
  run_until(*r.legacy, r.legacy->tail());
  for (auto& [h, s] : r.streams) run_until(*s, s->tail());
  for (auto& s : r.destroyed) run_until(*s, s->tail());
  r.destroyed.clear();
}

// The pool releases what it keeps beyond its release threshold at each synchronization
// (stream, event, device), as CUDA's default pool does.
void trim_pool() {
  CUmemPoolHandle_st& p = rt().pool;
  if (p.reserved() > p.release_threshold) p.kept = p.release_threshold > p.used ? p.release_threshold - p.used : 0;
}

// ---- kernels ----------------------------------------------------------------------------------------------------
cudaError_t check_configuration(const KernelLaunch& l) {
  const cudaDeviceProp& p = props();
  const dim3 g = l.grid, b = l.block;
  if (g.x == 0 || g.y == 0 || g.z == 0 || b.x == 0 || b.y == 0 || b.z == 0) return cudaErrorInvalidConfiguration;
  if (b.x > unsigned(p.maxThreadsDim[0]) || b.y > unsigned(p.maxThreadsDim[1]) || b.z > unsigned(p.maxThreadsDim[2]))
    return cudaErrorInvalidConfiguration;
  if (uint64_t(b.x) * b.y * b.z > uint64_t(p.maxThreadsPerBlock)) return cudaErrorInvalidConfiguration;
  if (g.x > unsigned(p.maxGridSize[0]) || g.y > unsigned(p.maxGridSize[1]) || g.z > unsigned(p.maxGridSize[2]))
    return cudaErrorInvalidConfiguration;
  auto it = rt().max_dynamic_shared.find(l.kernel);
  const size_t limit = it == rt().max_dynamic_shared.end() ? p.sharedMemPerBlock : size_t(it->second);
  if (l.shared_bytes > limit) return cudaErrorInvalidValue;
  return cudaSuccess;
}

void run_kernel(const KernelLaunch& l) {
  for (size_t i = 0; i < l.pointer_args.size(); ++i) {
    const void* p = l.pointer_args[i];
    if (p && !find(p, 0)) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%p", p);
      set_sticky(cudaErrorIllegalAddress, "kernel " + detail::kernel_name(l.kernel) + ": pointer argument " +
                                              std::to_string(i + 1) + " (" + buf +
                                              ") is not device memory (a host pointer, or freed): a GPU would fault "
                                              "reading it");
      return;
    }
  }
  const detail::Fault f = detail::run_grid(l);
  if (f.error != cudaSuccess) set_sticky(f.error, f.message);
}

// ---- copies -------------------------------------------------------------------------------------------------------
/// The kind a copy between these pointers has (cudaMemcpyDefault's inference).
cudaMemcpyKind infer(const void* dst, const void* src, size_t n) {
  const bool d = is_device(dst, n), s = is_device(src, n);
  return d && s ? cudaMemcpyDeviceToDevice
         : d    ? cudaMemcpyHostToDevice
         : s    ? cudaMemcpyDeviceToHost
                : cudaMemcpyHostToHost;
}

/// Queues a copy on s and, when the host must wait for it, runs it. `sync`: the API call is
/// synchronous (cudaMemcpy to or from the host).
cudaError_t copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, CUstream_st& s, bool sync) {
  if (n == 0) return cudaSuccess;
  if (!dst || !src) return cudaErrorInvalidValue;
  if (kind == cudaMemcpyDefault) kind = infer(dst, src, n);
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return cudaErrorInvalidMemcpyDirection;
  if (dst_dev != is_device(dst, n) || src_dev != is_device(src, n)) return cudaErrorInvalidValue;
  // a pageable source is read now (the runtime stages it); a pinned one when the copy runs
  std::function<void()> work;
  if (!src_dev && !is_pinned(src, n)) {
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                               static_cast<const unsigned char*>(src) + n);
    work = [dst, staged, n] { std::memcpy(dst, staged->data(), n); };
  } else {
    work = [dst, src, n] { std::memmove(dst, src, n); };
  }
  const uint64_t seq = enqueue_work(s, std::move(work));
  // the host waits for a copy into pageable memory, and for cudaMemcpy to or from the host
  if ((!dst_dev && !is_pinned(dst, n)) || (sync && !(dst_dev && src_dev))) {
    run_until(s, seq);
    trim_pool();
  }
  return sticky();
}

cudaError_t memset_on(void* p, int value, size_t n, CUstream_st& s) {
  if (n == 0) return cudaSuccess;
  if (!p || !is_device(p, n)) return cudaErrorInvalidValue;
  enqueue_work(s, [p, value, n] { std::memset(p, value, n); });
  return sticky();
}

// ---- frees ---------------------------------------------------------------------------------------------------------
void release(uintptr_t base) {
  Runtime& r = rt();
  auto it = r.allocations.find(base);
  if (it == r.allocations.end()) return;
  const Allocation a = it->second;
  r.allocations.erase(it);
  if (a.kind == Kind::Device) {
    r.device_bytes -= a.size;
    free_block(reinterpret_cast<void*>(base), a.size);
  } else {
    std::free(reinterpret_cast<void*>(base));
  }
}

}  // namespace

// ---- the emulator's own interface ----------------------------------------------------------------------------------
void submit(KernelLaunch l) {
  Runtime& r = rt();
  std::lock_guard<std::recursive_mutex> lock(r.mu);
  if (sticky() != cudaSuccess) {
    result(sticky());
    return;
  }
  const std::shared_ptr<CUstream_st> s = stream_of(l.stream);
  if (!s) {
    result(cudaErrorInvalidResourceHandle);
    return;
  }
  if (const cudaError_t e = check_configuration(l); e != cudaSuccess) {
    result(e);
    return;
  }
  auto launch = std::make_shared<const KernelLaunch>(std::move(l));
  enqueue_work(*s, [launch] { run_kernel(*launch); });
}

void enqueue(cudaStream_t stream, std::function<void()> f) {
  Runtime& r = rt();
  std::lock_guard<std::recursive_mutex> lock(r.mu);
  const std::shared_ptr<CUstream_st> s = stream_of(stream);
  if (!s) {
    std::fprintf(stderr, "ampgrad CUDA emulator: library work queued on an unknown stream %p is dropped\n",
                 static_cast<void*>(stream));
    result(cudaErrorInvalidResourceHandle);
    return;
  }
  enqueue_work(*s, std::move(f));
}

bool strict() {
  std::lock_guard<std::recursive_mutex> lock(rt().mu);
  return rt().strict;
}

void set_strict(bool on) {
  std::lock_guard<std::recursive_mutex> lock(rt().mu);
  if (!on) run_all();
  rt().strict = on;
}

std::string last_fault() {
  std::lock_guard<std::recursive_mutex> lock(rt().mu);
  return rt().last_fault;
}

int sticky_error() { return int(sticky()); }

int64_t queued(cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(rt().mu);
  const std::shared_ptr<CUstream_st> s = stream_of(stream);
  return s ? int64_t(s->tail() - s->done_seq) : -1;
}

void clear_sticky_error() {
  std::lock_guard<std::recursive_mutex> lock(rt().mu);
  g_sticky.store(cudaSuccess);
  t_last = cudaSuccess;
}

namespace detail {

void poison(void* p, size_t n) {
  auto* b = static_cast<unsigned char*>(p);
  const uint64_t pattern = 0x0001000100010001ull * kPoison16;
  size_t i = 0;
  // the pattern's low byte at even addresses
  if (n > 0 && reinterpret_cast<uintptr_t>(b) % 2) b[i++] = uint8_t(kPoison16 >> 8);
  for (; i + 8 <= n; i += 8) std::memcpy(b + i, &pattern, 8);
  for (; i < n; ++i) b[i] = uint8_t((reinterpret_cast<uintptr_t>(b + i) % 2) ? kPoison16 >> 8 : kPoison16 & 0xFF);
}

long env_long(const char* name, long fallback) {
  const char* s = std::getenv(name);
  if (!s || !*s) return fallback;
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  return end && *end == 0 ? v : fallback;
}

}  // namespace detail
}  // namespace ampgrad::emu

// ---- the CUDA runtime API
// ---------------------------------------------------------------------------------------------
using namespace ampgrad::emu;
using Lock = std::lock_guard<std::recursive_mutex>;

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidSymbol: return "invalid device symbol";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorAssert: return "device-side assert triggered";
    case cudaErrorIllegalInstruction: return "an illegal instruction was encountered";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorUnknown: return "unknown error";
  }
  return "unrecognized error code";
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define AMPGRAD_EMU_NAME(E) \
  case E: return #E;
    AMPGRAD_EMU_NAME(cudaSuccess)
    AMPGRAD_EMU_NAME(cudaErrorInvalidValue)
    AMPGRAD_EMU_NAME(cudaErrorMemoryAllocation)
    AMPGRAD_EMU_NAME(cudaErrorInitializationError)
    AMPGRAD_EMU_NAME(cudaErrorInvalidConfiguration)
    AMPGRAD_EMU_NAME(cudaErrorInvalidSymbol)
    AMPGRAD_EMU_NAME(cudaErrorInvalidDevicePointer)
    AMPGRAD_EMU_NAME(cudaErrorInvalidMemcpyDirection)
    AMPGRAD_EMU_NAME(cudaErrorInvalidDeviceFunction)
    AMPGRAD_EMU_NAME(cudaErrorNoDevice)
    AMPGRAD_EMU_NAME(cudaErrorInvalidDevice)
    AMPGRAD_EMU_NAME(cudaErrorInvalidResourceHandle)
    AMPGRAD_EMU_NAME(cudaErrorNotReady)
    AMPGRAD_EMU_NAME(cudaErrorIllegalAddress)
    AMPGRAD_EMU_NAME(cudaErrorLaunchOutOfResources)
    AMPGRAD_EMU_NAME(cudaErrorAssert)
    AMPGRAD_EMU_NAME(cudaErrorIllegalInstruction)
    AMPGRAD_EMU_NAME(cudaErrorMisalignedAddress)
    AMPGRAD_EMU_NAME(cudaErrorLaunchFailure)
    AMPGRAD_EMU_NAME(cudaErrorNotSupported)
    AMPGRAD_EMU_NAME(cudaErrorUnknown)
#undef AMPGRAD_EMU_NAME
  }
  return "cudaErrorUnrecognized";
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = t_last;
  t_last = cudaSuccess;
  return e != cudaSuccess ? e : sticky();
}

cudaError_t cudaPeekAtLastError() { return t_last != cudaSuccess ? t_last : sticky(); }

// ---- devices
// ----------------------------------------------------------------------------------------------------------
cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return result(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return result(cudaErrorInvalidValue);
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device != 0) return result(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!prop) return result(cudaErrorInvalidValue);
  if (device != 0) return result(cudaErrorInvalidDevice);
  *prop = props();
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (!value) return result(cudaErrorInvalidValue);
  if (device != 0) return result(cudaErrorInvalidDevice);
  const cudaDeviceProp& p = props();
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: *value = p.maxThreadsDim[0]; break;
    case cudaDevAttrMaxBlockDimY: *value = p.maxThreadsDim[1]; break;
    case cudaDevAttrMaxBlockDimZ: *value = p.maxThreadsDim[2]; break;
    case cudaDevAttrMaxGridDimX: *value = p.maxGridSize[0]; break;
    case cudaDevAttrMaxGridDimY: *value = p.maxGridSize[1]; break;
    case cudaDevAttrMaxGridDimZ: *value = p.maxGridSize[2]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = int(p.sharedMemPerBlock); break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = int(p.sharedMemPerMultiprocessor); break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = int(p.sharedMemPerBlockOptin); break;
    default: return result(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  Lock lock(rt().mu);
  run_all();
  trim_pool();
  return result(sticky());
}

// ---- memory
// -----------------------------------------------------------------------------------------------------------
namespace {
cudaError_t device_malloc(void** ptr, size_t size, bool from_pool) {
  if (!ptr) return cudaErrorInvalidValue;
  *ptr = nullptr;
  if (sticky() != cudaSuccess) return sticky();
  Runtime& r = rt();
  if (size > props().totalGlobalMem - std::min(props().totalGlobalMem, r.device_bytes))
    return cudaErrorMemoryAllocation;
  void* p = allocate_block(size);
  if (!p) return cudaErrorMemoryAllocation;
  r.allocations[reinterpret_cast<uintptr_t>(p)] = Allocation{size, Kind::Device, from_pool, false};
  r.device_bytes += size;
  if (from_pool) {
    CUmemPoolHandle_st& pool = r.pool;
    pool.kept = pool.kept >= size ? pool.kept - size : 0;  // reuses what the pool keeps, else grows
    pool.used += size;
    pool.used_high = std::max(pool.used_high, pool.used);
    pool.reserved_high = std::max(pool.reserved_high, pool.reserved());
  }
  *ptr = p;
  return cudaSuccess;
}

/// The base of a live device allocation p, or null.
Allocation* device_base(void* p) {
  auto it = rt().allocations.find(reinterpret_cast<uintptr_t>(p));
  return it != rt().allocations.end() && it->second.kind == Kind::Device ? &it->second : nullptr;
}

/// The pool gets back what was allocated from it (when the free is called).
void count_free(const Allocation& a) {
  if (!a.from_pool) return;
  CUmemPoolHandle_st& pool = rt().pool;
  pool.used -= a.size;
  pool.kept += a.size;
}
}  // namespace

cudaError_t cudaMalloc(void** ptr, size_t size) {
  Lock lock(rt().mu);
  return result(device_malloc(ptr, size, false));
}

cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream) {
  Lock lock(rt().mu);
  if (!stream_of(stream)) return result(cudaErrorInvalidResourceHandle);
  return result(device_malloc(ptr, size, true));
}

cudaError_t cudaFree(void* ptr) {
  Lock lock(rt().mu);
  if (!ptr) return cudaSuccess;
  Allocation* a = device_base(ptr);
  if (!a || a->free_queued) return result(cudaErrorInvalidValue);
  run_all();  // cudaFree waits for the device
  count_free(*device_base(ptr));
  release(reinterpret_cast<uintptr_t>(ptr));
  return result(sticky());
}

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  Lock lock(rt().mu);
  const std::shared_ptr<CUstream_st> s = stream_of(stream);
  if (!s) return result(cudaErrorInvalidResourceHandle);
  if (!ptr) return cudaSuccess;
  Allocation* a = device_base(ptr);
  if (!a || a->free_queued) return result(cudaErrorInvalidValue);
  a->free_queued = true;
  count_free(*a);
  const uintptr_t base = reinterpret_cast<uintptr_t>(ptr);
  enqueue_work(
      *s, [base] { release(base); }, /*after_fault=*/true);
  return result(sticky());
}

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  Lock lock(rt().mu);
  if (!ptr || flags > 0xF) return result(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (sticky() != cudaSuccess) return result(sticky());
  void* p = nullptr;
  if (posix_memalign(&p, 4096, size ? size : 1) != 0) return result(cudaErrorMemoryAllocation);
  detail::poison(p, size);
  rt().allocations[reinterpret_cast<uintptr_t>(p)] = Allocation{size, Kind::Pinned, false, false};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaHostAlloc(ptr, size, cudaHostAllocDefault); }

cudaError_t cudaFreeHost(void* ptr) {
  Lock lock(rt().mu);
  if (!ptr) return cudaSuccess;
  auto it = rt().allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == rt().allocations.end() || it->second.kind != Kind::Pinned) return result(cudaErrorInvalidValue);
  run_all();  // queued copies may still read or write it
  release(it->first);
  return result(sticky());
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  Lock lock(rt().mu);
  if (!free || !total) return result(cudaErrorInvalidValue);
  *total = props().totalGlobalMem;
  *free = *total - std::min(*total, rt().device_bytes);
  return result(sticky());
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  if (!pool) return result(cudaErrorInvalidValue);
  if (device != 0) return result(cudaErrorInvalidDevice);
  *pool = &rt().pool;
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  Lock lock(rt().mu);
  if (pool != &rt().pool) return result(cudaErrorInvalidResourceHandle);
  if (!value) return result(cudaErrorInvalidValue);
  uint64_t v;
  std::memcpy(&v, value, sizeof v);
  switch (attr) {
    case cudaMemPoolAttrReleaseThreshold: pool->release_threshold = v; return cudaSuccess;
    case cudaMemPoolAttrReservedMemHigh:
      if (v != 0) return result(cudaErrorInvalidValue);
      pool->reserved_high = pool->reserved();
      return cudaSuccess;
    case cudaMemPoolAttrUsedMemHigh:
      if (v != 0) return result(cudaErrorInvalidValue);
      pool->used_high = pool->used;
      return cudaSuccess;
    case cudaMemPoolReuseFollowEventDependencies:
    case cudaMemPoolReuseAllowOpportunistic:
    case cudaMemPoolReuseAllowInternalDependencies: return cudaSuccess;  // the emulator never reuses memory
    default: return result(cudaErrorInvalidValue);
  }
}

cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  Lock lock(rt().mu);
  if (pool != &rt().pool) return result(cudaErrorInvalidResourceHandle);
  if (!value) return result(cudaErrorInvalidValue);
  uint64_t v = 0;
  switch (attr) {
    case cudaMemPoolAttrReleaseThreshold: v = pool->release_threshold; break;
    case cudaMemPoolAttrReservedMemCurrent: v = pool->reserved(); break;
    case cudaMemPoolAttrReservedMemHigh: v = pool->reserved_high; break;
    case cudaMemPoolAttrUsedMemCurrent: v = pool->used; break;
    case cudaMemPoolAttrUsedMemHigh: v = pool->used_high; break;
    case cudaMemPoolReuseFollowEventDependencies:
    case cudaMemPoolReuseAllowOpportunistic:
    case cudaMemPoolReuseAllowInternalDependencies: {
      const int on = 1;
      std::memcpy(value, &on, sizeof on);
      return cudaSuccess;
    }
    default: return result(cudaErrorInvalidValue);
  }
  std::memcpy(value, &v, sizeof v);
  return cudaSuccess;
}

cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t min_bytes_to_keep) {
  Lock lock(rt().mu);
  if (pool != &rt().pool) return result(cudaErrorInvalidResourceHandle);
  // afterwards the pool reserves at most max(min_bytes_to_keep, what is in use)
  pool->kept = std::min<uint64_t>(pool->kept, min_bytes_to_keep > pool->used ? min_bytes_to_keep - pool->used : 0);
  return result(sticky());
}

// ---- copies and sets
// ----------------------------------------------------------------------------------------------------
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  Lock lock(rt().mu);
  if (sticky() != cudaSuccess) return result(sticky());
  return result(copy(dst, src, count, kind, *rt().legacy, true));
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  Lock lock(rt().mu);
  const std::shared_ptr<CUstream_st> s = stream_of(stream);
  if (!s) return result(cudaErrorInvalidResourceHandle);
  if (sticky() != cudaSuccess) return result(sticky());
  return result(copy(dst, src, count, kind, *s, false));
}

cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  Lock lock(rt().mu);
  if (sticky() != cudaSuccess) return result(sticky());
  return result(memset_on(ptr, value, count, *rt().legacy));
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  Lock lock(rt().mu);
  const std::shared_ptr<CUstream_st> s = stream_of(stream);
  if (!s) return result(cudaErrorInvalidResourceHandle);
  if (sticky() != cudaSuccess) return result(sticky());
  return result(memset_on(ptr, value, count, *s));
}

// ---- streams
// ------------------------------------------------------------------------------------------------------------
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  Lock lock(rt().mu);
  if (!stream || (flags & ~unsigned(cudaStreamNonBlocking))) return result(cudaErrorInvalidValue);
  if (sticky() != cudaSuccess) return result(sticky());
  auto s = std::make_shared<CUstream_st>();
  s->flags = flags;
  rt().streams[s.get()] = s;
  *stream = s.get();
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Lock lock(rt().mu);
  auto it = rt().streams.find(stream);
  if (it == rt().streams.end()) return result(cudaErrorInvalidResourceHandle);
  // work still queued runs later, in order; the stream's handle is gone now
  it->second->destroyed = true;
  if (it->second->pending()) rt().destroyed.push_back(it->second);
  rt().streams.erase(it);
  return result(sticky());
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Lock lock(rt().mu);
  const std::shared_ptr<CUstream_st> s = stream_of(stream);
  if (!s) return result(cudaErrorInvalidResourceHandle);
  run_until(*s, s->tail());
  trim_pool();
  return result(sticky());
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  Lock lock(rt().mu);
  const std::shared_ptr<CUstream_st> s = stream_of(stream);
  if (!s) return result(cudaErrorInvalidResourceHandle);
  run_until(*s, s->tail());  // strict mode: a query is a wait
  return result(sticky());
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  Lock lock(rt().mu);
  const std::shared_ptr<CUstream_st> s = stream_of(stream);
  const std::shared_ptr<CUevent_st> e = event_of(event);
  if (!s || !e) return result(cudaErrorInvalidResourceHandle);
  if (flags != 0) return result(cudaErrorInvalidValue);
  if (sticky() != cudaSuccess) return result(sticky());
  if (!e->recorded) return cudaSuccess;  // an event never recorded is complete
  if (e->stream != s) push_wait(*s, e->stream, e->seq);
  if (!rt().strict) run_until(*s, s->tail());
  return cudaSuccess;
}

// ---- events
// --------------------------------------------------------------------------------------------------------------
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  Lock lock(rt().mu);
  if (!event || (flags & ~0x7u)) return result(cudaErrorInvalidValue);
  if ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming)) return result(cudaErrorInvalidValue);
  if (sticky() != cudaSuccess) return result(sticky());
  auto e = std::make_shared<CUevent_st>();
  e->flags = flags;
  rt().events[e.get()] = e;
  *event = e.get();
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Lock lock(rt().mu);
  if (!rt().events.erase(event)) return result(cudaErrorInvalidResourceHandle);
  return result(sticky());  // a record still queued keeps the event's state alive
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Lock lock(rt().mu);
  const std::shared_ptr<CUstream_st> s = stream_of(stream);
  const std::shared_ptr<CUevent_st> e = event_of(event);
  if (!s || !e) return result(cudaErrorInvalidResourceHandle);
  if (sticky() != cudaSuccess) return result(sticky());
  const uint64_t gen = ++e->generation;
  e->recorded = true;
  e->complete = false;
  e->stream = s;
  std::weak_ptr<CUevent_st> w = e;
  e->seq = enqueue_work(
      *s,
      [w, gen] {
        if (auto ev = w.lock(); ev && ev->generation == gen) {
          ev->complete = true;
          ev->time = std::chrono::steady_clock::now();
        }
      },
      /*after_fault=*/true);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  Lock lock(rt().mu);
  const std::shared_ptr<CUevent_st> e = event_of(event);
  if (!e) return result(cudaErrorInvalidResourceHandle);
  if (e->recorded) run_until(*e->stream, e->seq);  // strict mode: a query is a wait
  return result(sticky());
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  Lock lock(rt().mu);
  const std::shared_ptr<CUevent_st> e = event_of(event);
  if (!e) return result(cudaErrorInvalidResourceHandle);
  if (e->recorded) run_until(*e->stream, e->seq);
  trim_pool();
  return result(sticky());
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  Lock lock(rt().mu);
  if (!ms) return result(cudaErrorInvalidValue);
  const std::shared_ptr<CUevent_st> a = event_of(start), b = event_of(end);
  if (!a || !b) return result(cudaErrorInvalidResourceHandle);
  if ((a->flags | b->flags) & cudaEventDisableTiming) return result(cudaErrorInvalidResourceHandle);
  if (!a->recorded || !b->recorded) return result(cudaErrorInvalidResourceHandle);
  if (sticky() != cudaSuccess) return result(sticky());
  if (!a->complete || !b->complete) return result(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(b->time - a->time).count();
  return cudaSuccess;
}

// ---- kernels
// ------------------------------------------------------------------------------------------------------------
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  Lock lock(rt().mu);
  if (!func) return result(cudaErrorInvalidDeviceFunction);
  switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize:
      if (value < 0 || size_t(value) > props().sharedMemPerBlockOptin) return result(cudaErrorInvalidValue);
      rt().max_dynamic_shared[func] = value;
      return cudaSuccess;
    case cudaFuncAttributePreferredSharedMemoryCarveout:
      if (value < -1 || value > 100) return result(cudaErrorInvalidValue);
      return cudaSuccess;
  }
  return result(cudaErrorInvalidValue);
}
