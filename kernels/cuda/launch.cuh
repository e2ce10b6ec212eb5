// The one way kernels/cuda launches a kernel, and what device code may rely on under nvcc
// and under the CUDA emulator alike (-DAMPGRAD_CUDA=EMULATE: the .cu files compiled as C++
// against kernels/cuda/emulator, docs/cuda-emulator.md).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

/// Defined where the .cu files' device code is compiled: by nvcc, or as C++ for the
/// emulator (which leaves __CUDACC__ undefined: host-only headers keep their meaning).
#if defined(__CUDACC__) || defined(AMPGRAD_CUDA_EMULATOR)
#define AMPGRAD_CUDA_DEVICE_CODE 1
#endif

namespace ampgrad::cuda {

/// kernel<<<grid, block, shared_bytes, stream>>>(args...): the arguments are converted to
/// the kernel's parameters and copied now; a bad configuration is reported by the next
/// cudaGetLastError (check_launch, common.cuh), as for the launch syntax. An error left in
/// the runtime's last-error slot before the launch is dropped first.
template <class... Params, class... Args>
inline void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                   Args&&... args) {
  // Every launch is followed by check_launch, whose cudaGetLastError must see this launch's
  // error only: drop one that a library call (cuBLASLt, cuDNN, NCCL) left behind and
  // reported through its own status. A sticky error (a fault) is not cleared by this.
  (void)cudaGetLastError();
#if defined(__CUDACC__)
  kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
#else
  ::ampgrad::emu::launch(kernel, grid, block, shared_bytes, stream, std::forward<Args>(args)...);
#endif
}

#if defined(AMPGRAD_CUDA_DEVICE_CODE)
/// The block's dynamic shared memory (the launch's shared_bytes), as T: what
/// `extern __shared__ T buf[];` declares under nvcc, which a C++ compiler cannot.
template <class T>
__device__ inline T* dynamic_shared() {
#if defined(__CUDACC__)
  extern __shared__ __align__(16) unsigned char ampgrad_dynamic_shared[];
  return reinterpret_cast<T*>(ampgrad_dynamic_shared);
#else
  return static_cast<T*>(::ampgrad::emu::detail::dynamic_shared_memory());
#endif
}
#endif

}  // namespace ampgrad::cuda
