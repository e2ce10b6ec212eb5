// Deterministic reductions across the threads of a block, shared by reduce.cu, norm.cu and
// loss.cu.
//
// Two shapes of thread block are used by those kernels:
//   groups   blockDim.x == G (a power of two up to 1024) threads cooperate on one row,
//            blockDim.y rows per block; warp shuffles within a warp, then one value per
//            warp through shared memory and a last shuffle round in the group's first warp.
//   columns  blockDim.x == 32 neighbouring columns, blockDim.y (a power of two) threads
//            splitting each column's elements; a tree over threadIdx.y in shared memory.
// Every combination happens in a fixed order (a tree that depends only on the block
// shape), never with atomics, so a result depends only on the launch configuration, which
// the callers derive from the tensor's shape alone.
//
// Values may be arithmetic scalars or small trivially copyable structs that provide
// `V shfl_down(int offset) const` and `V shfl(int src_lane) const` (per-member shuffles).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace ampgrad::cuda {

inline constexpr unsigned kFullMask = 0xffffffffu;

// A scalar through a warp shuffle: 4- and 8-byte types by their bits, smaller integers
// (bool, uint8) widened to int.
template <class V>
__device__ __forceinline__ V shfl_down_scalar(V v, int off) {
  if constexpr (sizeof(V) == 8) {
    long long t;
    memcpy(&t, &v, 8);
    t = __shfl_down_sync(kFullMask, t, unsigned(off));
    memcpy(&v, &t, 8);
    return v;
  } else if constexpr (sizeof(V) == 4) {
    int t;
    memcpy(&t, &v, 4);
    t = __shfl_down_sync(kFullMask, t, unsigned(off));
    memcpy(&v, &t, 4);
    return v;
  } else {
    return static_cast<V>(__shfl_down_sync(kFullMask, static_cast<int>(v), unsigned(off)));
  }
}

template <class V>
__device__ __forceinline__ V shfl_scalar(V v, int src) {
  if constexpr (sizeof(V) == 8) {
    long long t;
    memcpy(&t, &v, 8);
    t = __shfl_sync(kFullMask, t, src);
    memcpy(&v, &t, 8);
    return v;
  } else if constexpr (sizeof(V) == 4) {
    int t;
    memcpy(&t, &v, 4);
    t = __shfl_sync(kFullMask, t, src);
    memcpy(&v, &t, 4);
    return v;
  } else {
    return static_cast<V>(__shfl_sync(kFullMask, static_cast<int>(v), src));
  }
}

template <class V>
__device__ __forceinline__ V shfl_down_any(const V& v, int off) {
  if constexpr (std::is_arithmetic_v<V>) return shfl_down_scalar(v, off);
  else return v.shfl_down(off);
}

template <class V>
__device__ __forceinline__ V shfl_any(const V& v, int src) {
  if constexpr (std::is_arithmetic_v<V>) return shfl_scalar(v, src);
  else return v.shfl(src);
}

/// The combining functors of the row kernels (norm.cu, loss.cu).
struct SumF {
  template <class A>
  __device__ A operator()(A a, A b) const { return a + b; }
};
/// The larger of two values that are never NaN (NaN inputs are skipped before).
struct MaxF {
  template <class A>
  __device__ A operator()(A a, A b) const { return b > a ? b : a; }
};

/// Shared-memory slots group_reduce / group_allreduce need: one per warp of a block of at
/// most 1024 threads.
inline constexpr int kGroupSlots = 32;

/// Reduces v over the blockDim.x threads of each group (blockDim.x a power of two, at most
/// 1024) with f, in a fixed tree; the result is valid in the thread with threadIdx.x == 0.
/// Every thread of the block calls it (it synchronises the block when blockDim.x > 32).
/// smem: kGroupSlots values.
template <class V, class F>
__device__ V group_reduce(V v, const F& f, V* smem) {
  const int G = int(blockDim.x);
  const int width = G < 32 ? G : 32;
  // Lane 0 of each G-wide segment ends with the tree over lanes [0, G) of its segment;
  // lanes past the segment only feed lanes whose results are never used.
  for (int off = width >> 1; off > 0; off >>= 1) v = f(v, shfl_down_any(v, off));
  if (G <= 32) return v;
  const int nw = G >> 5;  // warps per group, a power of two
  const int lane = int(threadIdx.x) & 31, w = int(threadIdx.x) >> 5;
  __syncthreads();  // earlier readers of smem are done
  if (lane == 0) smem[int(threadIdx.y) * nw + w] = v;
  __syncthreads();
  if (w == 0) {
    V t = smem[int(threadIdx.y) * nw + (lane < nw ? lane : 0)];
    for (int off = nw >> 1; off > 0; off >>= 1) t = f(t, shfl_down_any(t, off));
    v = t;
  }
  return v;
}

/// group_reduce, with the result given to every thread of the group.
template <class V, class F>
__device__ V group_allreduce(V v, const F& f, V* smem) {
  v = group_reduce(v, f, smem);
  const int G = int(blockDim.x);
  if (G <= 32) return shfl_any(v, int(threadIdx.x + threadIdx.y * blockDim.x) & 31 & ~(G - 1));
  __syncthreads();  // smem's per-warp values have been read
  if (threadIdx.x == 0) smem[threadIdx.y] = v;  // blockDim.y <= 1024 / 64 here
  __syncthreads();
  return smem[threadIdx.y];
}

/// Reduces v over threadIdx.y (blockDim.x == 32, blockDim.y a power of two) for each
/// threadIdx.x with f, in a fixed tree; every thread receives its column's result. Every
/// thread of the block calls it. smem: blockDim.x * blockDim.y values.
template <class V, class F>
__device__ V column_allreduce(V v, const F& f, V* smem) {
  const int i = int(threadIdx.y) * 32 + int(threadIdx.x);
  __syncthreads();  // earlier readers of smem are done
  smem[i] = v;
  __syncthreads();
  for (int h = int(blockDim.y) >> 1; h > 0; h >>= 1) {
    if (int(threadIdx.y) < h) smem[i] = f(smem[i], smem[i + h * 32]);
    __syncthreads();
  }
  return smem[threadIdx.x];
}

/// The smallest power of two >= n (1 for n <= 1), capped at cap (a power of two).
inline int pow2_at_least(int64_t n, int cap) {
  int p = 1;
  while (p < cap && p < n) p <<= 1;
  return p;
}

// The geometry of the row kernels (softmax, layer norm, cross entropy): G threads per row,
// several rows per block when G is small.
constexpr int kMaxGroup = 512;      // threads per row in the row kernels
constexpr int kBlockThreads = 256;  // threads per block when several rows share one
constexpr unsigned kMaxBlocks = 65535u * 16u;

/// Blocks for `units` rows (or elements) at per_block each, capped (the kernels loop).
inline unsigned grid_for(int64_t units, int64_t per_block) {
  const int64_t b = (units + per_block - 1) / per_block;
  return unsigned(b < 1 ? 1 : b > int64_t(kMaxBlocks) ? int64_t(kMaxBlocks) : b);
}

/// A block of G threads per row of n elements (G a power of two, about 8 elements a
/// thread), several rows per block when G is small.
inline dim3 row_block(int64_t n) {
  const int G = pow2_at_least((n + 7) / 8, kMaxGroup);
  return dim3(unsigned(G), unsigned(G >= kBlockThreads ? 1 : kBlockThreads / G));
}

// Device math in the accumulation type (float or double), shared by the reductions and the
// normalisation kernels.
__device__ __forceinline__ float d_exp(float v) { return expf(v); }
__device__ __forceinline__ double d_exp(double v) { return exp(v); }
__device__ __forceinline__ float d_log(float v) { return logf(v); }
__device__ __forceinline__ double d_log(double v) { return log(v); }
__device__ __forceinline__ float d_sqrt(float v) { return sqrtf(v); }
__device__ __forceinline__ double d_sqrt(double v) { return sqrt(v); }

}  // namespace ampgrad::cuda
