// What every CUDA kernel family shares: the checking macro, the device guard, the current
// stream, the device-side storage types of the dtypes with their conversions, launch
// helpers (every launch goes through launch(), launch.cuh), and the device error slot that
// index kernels report into. Device code is guarded by AMPGRAD_CUDA_DEVICE_CODE, defined
// under nvcc and in the emulated build (-DAMPGRAD_CUDA=EMULATE).
//
// NaN payloads: GPU kernels promise NaN-ness, not bits. A NaN input gives a NaN output
// wherever the CPU gives one, but its payload and sign may differ (the hardware's
// conversions and min/max produce the canonical NaN). Copies without a dtype change and
// `where` move elements as stored, and keep payloads, as on the CPU.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <type_traits>

#include "ampgrad/backend.h"
#include "cast.h"
#include "cuda/launch.cuh"
#include "layout.h"

namespace ampgrad::cuda {

// ---- errors -----------------------------------------------------------------------------
// One checking macro for the runtime, cuBLAS(Lt) and cuDNN: status_ok/status_string are
// overloaded on each library's status type.
inline bool status_ok(cudaError_t s) { return s == cudaSuccess; }
inline const char* status_string(cudaError_t s) { return cudaGetErrorString(s); }
inline bool status_ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
const char* status_string(cublasStatus_t s);
inline bool status_ok(cudnnStatus_t s) { return s == CUDNN_STATUS_SUCCESS; }
const char* status_string(cudnnStatus_t s);

/// Throws ag::Error "[op] call failed: <error string>" when a CUDA, cuBLAS, cuBLASLt or
/// cuDNN call does not succeed.
#define AG_CUDA_CHECK(op, call)                                                          \
  do {                                                                                   \
    const auto st_ = (call);                                                             \
    if (!::ampgrad::cuda::status_ok(st_)) {                                              \
      if constexpr (std::is_same_v<std::decay_t<decltype(st_)>, cudaError_t>)            \
        cudaGetLastError(); /* a non-sticky error would otherwise be seen again */       \
      AG_ERROR(op, #call " failed: ", ::ampgrad::cuda::status_string(st_));              \
    }                                                                                    \
  } while (0)

/// Checks the launch of the kernel just queued for `op` (bad configuration, no kernel
/// image for this GPU); with set_debug_sync(true) also waits for it and reports device
/// errors at once. Every launch is followed by one call.
void check_launch(const char* op, int device_index);

/// Makes `index` the current device for its scope and restores the caller's on exit, so
/// no cudaSetDevice is left changed behind a caller's back.
class DeviceGuard {
 public:
  DeviceGuard(int index, const char* op);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

/// The stream kernels for tensors on `device` queue their work on (the contract's current
/// stream of that device).
inline cudaStream_t stream_of(Device device) {
  return static_cast<cudaStream_t>(stream_handle(current_stream(device)));
}

// ---- device errors ----------------------------------------------------------------------
/// What an index kernel found wrong: the first error wins (atomicCAS on `code`).
struct DeviceError {
  int code;         // 0: none; else an ErrorOp
  int64_t value;    // the offending index
  int64_t bound;    // the size it had to stay below
};
/// The ops that report device errors; op_name gives each its name.
enum ErrorOp : int { kErrNone = 0, kErrIndexSelect, kErrIndexAdd, kErrGather, kErrScatterAdd, kErrEmbedding, kErrCrossEntropy };
const char* error_op_name(int code);

/// The device's error slot (allocated on first use), passed to kernels that can fail.
DeviceError* error_slot(int device_index);
/// Reads the slot after a host wait; throws ag::Error naming the op and the values when a
/// kernel reported an error, and clears it. Called by every host wait of the backend.
void raise_device_errors(int device_index);

// Frees the cuBLASLt workspace of s, if it has one, in s's order (blas.cu); destroy_stream
// calls it before the stream goes.
void release_blas_workspace(Stream s, cudaStream_t stream);

#ifdef AMPGRAD_CUDA_DEVICE_CODE
/// Records an index error from device code (the first one is kept).
__device__ inline void report_index_error(DeviceError* slot, int op, int64_t value, int64_t bound) {
  if (atomicCAS(&slot->code, 0, op) == 0) {
    slot->value = value;
    slot->bound = bound;
  }
}
#endif

// ---- dtypes on the device -------------------------------------------------------------
/// The device-side storage type of a dtype's C++ type: __half and __nv_bfloat16 for the
/// 16-bit floats (same layout as ag::Half / ag::BFloat16, with hardware conversions), the
/// type itself otherwise.
template <class T>
struct DeviceStorage {
  using type = T;
};
template <>
struct DeviceStorage<Half> {
  using type = __half;
};
template <>
struct DeviceStorage<BFloat16> {
  using type = __nv_bfloat16;
};
template <class T>
using dev_t = typename DeviceStorage<T>::type;

/// The type a kernel on storage type D computes in (acc_type_t of the host type).
template <class D>
struct DeviceAcc {
  using type = acc_type_t<D>;
};
template <>
struct DeviceAcc<__half> {
  using type = float;
};
template <>
struct DeviceAcc<__nv_bfloat16> {
  using type = float;
};
template <class D>
using dacc_t = typename DeviceAcc<D>::type;

template <class D>
inline constexpr bool is_dev_half_v = std::is_same_v<D, __half> || std::is_same_v<D, __nv_bfloat16>;

#ifdef AMPGRAD_CUDA_DEVICE_CODE
/// Converts between device storage types as the CPU's cast<> does: bool is "!= 0", the
/// 16-bit floats go through float (round to nearest even, in hardware), a floating value
/// becomes an integer by float_to_integral, the rest is a static_cast.
template <class To, class From>
__device__ __forceinline__ To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, __half>) {
    return convert<To>(__half2float(v));
  } else if constexpr (std::is_same_v<From, __nv_bfloat16>) {
    return convert<To>(__bfloat162float(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_same_v<To, __half>) {
    return __float2half_rn(float(v));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return __float2bfloat16_rn(float(v));
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    return kernels::float_to_integral<To>(v);  // the host's rule, not the hardware's saturation
  } else {
    return static_cast<To>(v);
  }
}
#endif

/// A host value as a kernel on storage type D receives it: converted to the dtype as fill
/// converts (an integer Operand from int64), then to D's compute type.
template <class T>
dacc_t<dev_t<T>> host_scalar(const Operand& s) {
  const T v = s.is_integer() ? kernels::cast<T>(s.int_value()) : kernels::cast<T>(s.value());
  return kernels::cast<acc_type_t<T>>(v);
}

// ---- launching -------------------------------------------------------------------------
inline constexpr int kThreads = 256;
/// Blocks for n threads' worth of work at kThreads per block, capped so that grid-stride
/// loops cover the rest (a few waves per SM is enough to saturate memory).
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

/// Calls f.template operator()<T>() for the dtype, with T the host C++ type (use dev_t<T>
/// for the kernel's storage type). Same contract as ampgrad::dispatch_all.
using ampgrad::dispatch_all;
using ampgrad::dispatch_floating;

#ifdef AMPGRAD_CUDA_DEVICE_CODE
/// The byte offsets of all N operands of L at linear index i (kernels::offset_of for every
/// operand in one pass of divisions). The loop is unrolled to kMaxLoopDims so that a
/// layout passed by value is indexed statically and stays in the parameter space.
template <int N>
__device__ __forceinline__ void offsets_of(const kernels::StridedLayout<N>& L, int64_t i, int64_t (&off)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) off[k] = 0;
#pragma unroll
  for (int d = 0; d < kernels::kMaxLoopDims; ++d) {
    if (d == L.ndim) break;
    const int64_t q = i / L.sizes[d];
    const int64_t r = i - q * L.sizes[d];
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] += r * L.strides[k][d];
    i = q;
  }
}
#endif

}  // namespace ampgrad::cuda
