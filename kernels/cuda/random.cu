// Random fills of the CUDA backend: uniform and normal from the counter-based Philox
// generator (core/include/ampgrad/philox.h), bit for bit the CPU's draws (kernels/cpu/random.cpp).
//
// Element i (row-major, whatever out's strides) takes Philox block (seed, offset + i), so
// a draw depends on (seed, offset) only, not on the grid or the backend. The formulas are
// the CPU's, in double: uniform is low + span * u with u from 53 bits, rounded to the
// dtype, a draw that rounds up to `high` replaced by the dtype's largest value below it;
// normal is Box-Muller on two 53-bit uniforms. The arithmetic uses the _rn intrinsics so
// that nvcc does not contract it into FMAs the CPU does not use: uniform is therefore
// identical to the CPU in every dtype. Normal's log and cos come from the device's math
// library, whose double results may differ from glibc's in the last bit: float32 and the
// 16-bit dtypes round to the CPU's value except when that bit decides the rounding (about
// once in 2^28 draws), float64 may differ in its last bits.
#include <cstdint>
#include <limits>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/cuda_backend.h"
#include "ampgrad/philox.h"

namespace ampgrad::cuda {
namespace {

using kernels::Philox4x32;
using kernels::StridedLayout;
using kernels::uniform01;

__device__ __forceinline__ uint16_t bits16(__half v) { return __half_as_ushort(v); }
__device__ __forceinline__ uint16_t bits16(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
template <class D>
__device__ __forceinline__ D from_bits16(uint16_t b) {
  if constexpr (std::is_same_v<D, __half>) return __ushort_as_half(b);
  else return __ushort_as_bfloat16(b);
}

// The largest value of D below x (and not below floor), for the rare draw that rounds up
// (the CPU's below<T>).
template <class D>
__device__ D below(double x, double floor) {
  if constexpr (is_dev_half_v<D>) {
    D t = convert<D>(x);
    while (convert<double>(t) >= x) {
      const uint16_t b = bits16(t);
      // one step toward -inf: positive values lose a unit in the last place, negative gain one
      t = from_bits16<D>((b & 0x7FFF) == 0 ? uint16_t(0x8001) : (b & 0x8000) ? uint16_t(b + 1) : uint16_t(b - 1));
    }
    return convert<double>(t) < floor ? convert<D>(floor) : t;
  } else if constexpr (std::is_same_v<D, float>) {
    const float t = nextafterf(float(x), -std::numeric_limits<float>::infinity());
    return t < float(floor) ? float(floor) : t;
  } else {
    const double t = nextafter(x, -std::numeric_limits<double>::infinity());
    return t < floor ? floor : t;
  }
}

template <class D>
struct UniformDraw {
  double low, span, high;
  uint64_t seed, offset;
  __device__ D operator()(int64_t i) const {
    const Philox4x32 r(seed, offset + uint64_t(i));
    const D v = convert<D>(__dadd_rn(low, __dmul_rn(span, uniform01(r.out[0], r.out[1]))));
    return convert<double>(v) < high ? v : below<D>(high, low);
  }
};

template <class D>
struct NormalDraw {
  double mean, stddev;
  uint64_t seed, offset;
  __device__ D operator()(int64_t i) const {
    const Philox4x32 r(seed, offset + uint64_t(i));
    const double u1 = __dsub_rn(1.0, uniform01(r.out[0], r.out[1]));  // (0, 1]
    const double u2 = uniform01(r.out[2], r.out[3]);
    const double radius = sqrt(__dmul_rn(-2.0, log(u1)));
    const double c = cos(__dmul_rn(6.283185307179586, u2));
    return convert<D>(__dadd_rn(mean, __dmul_rn(__dmul_rn(stddev, radius), c)));
  }
};

// out element i = gen(i); Dense: out is contiguous, else its byte offset comes from L.
template <bool Dense, class D, class Gen>
__global__ void random_kernel(StridedLayout<1> L, Gen gen) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < L.numel; i += stride) {
    if constexpr (Dense) {
      reinterpret_cast<D*>(L.base[0])[i] = gen(i);
    } else {
      int64_t off[1];
      offsets_of(L, i, off);
      *reinterpret_cast<D*>(L.base[0] + off[0]) = gen(i);
    }
  }
}

template <class D, class Gen>
void launch_random(const char* op, const Tensor& out, const Gen& gen) {
  const StridedLayout<1> L = kernels::make_layout<1>({&out});
  if (L.numel == 0) return;
  const int dev = out.device().index;
  DeviceGuard guard(dev, op);
  const cudaStream_t stream = stream_of(out.device());
  if (kernels::is_dense(L, 0, sizeof(D)))
    launch(random_kernel<true, D, Gen>, blocks_for(L.numel), kThreads, 0, stream, L, gen);
  else
    launch(random_kernel<false, D, Gen>, blocks_for(L.numel), kThreads, 0, stream, L, gen);
  check_launch(op, dev);
}

}  // namespace

void CudaBackend::uniform(const Tensor& out, double low, double high, uint64_t seed, uint64_t offset) {
  const double span = high - low;
  dispatch_floating(out.dtype(), "uniform", [&]<class T>() {
    using D = dev_t<T>;
    launch_random<D>("uniform", out, UniformDraw<D>{low, span, high, seed, offset});
  });
}

void CudaBackend::normal(const Tensor& out, double mean, double std, uint64_t seed, uint64_t offset) {
  dispatch_floating(out.dtype(), "normal", [&]<class T>() {
    using D = dev_t<T>;
    launch_random<D>("normal", out, NormalDraw<D>{mean, std, seed, offset});
  });
}

}  // namespace ampgrad::cuda
