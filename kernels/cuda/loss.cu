// Cross entropy with class-index targets on CUDA: log-softmax and NLL in one kernel per
// direction, with the CPU's semantics (kernels/cpu/loss.cpp; backend.h has the contract).
// float16/bfloat16 compute in float32, float64 in double.
//
// x is contiguous, read as [outer, C, inner]; a position is one (outer, inner) pair.
//   inner == 1  a group of G threads per row (G from C, up to 512; several rows per block
//               when G is small): a max pass and a pass summing exp(x - max) (and x, for
//               label smoothing), with block_reduce.cuh's fixed trees, then the group's
//               first thread writes the loss and lse. Backward needs no reduction: the
//               group writes g * exp(x - lse) - g * ls / C, less g * (1 - ls) at the target.
//   inner > 1   one thread per position walks its C logits (stride inner, so neighbouring
//               threads read neighbouring addresses), both directions.
// lse = max + log(sum) is saved per position (float32, float64 for float64 x). A target
// that is neither ignore_index nor in [0, C) is never used for an address: the forward
// kernel reports it into the device error slot (op cross_entropy, raised at the next host
// wait, backend.cu) and writes NaN there; backward takes no class off for it. Ignored
// positions get loss 0 and a zero gradient row.
//
// Reference: kernels/reference/include/ampgrad/reference/loss.h (float64, the specification).
#include <algorithm>
#include <cmath>
#include <limits>

#include "cuda/block_reduce.cuh"
#include "cuda/common.cuh"
#include "cuda/cuda_backend.h"

namespace ampgrad::cuda {
namespace {

// The scalars of one call, in the compute type A.
template <class A>
struct Coeffs {
  int64_t C, inner, ignore;
  A keep;      // 1 - label_smoothing
  A smooth;    // label_smoothing
  A smooth_c;  // label_smoothing / C
  bool smoothing;
};

template <class A>
Coeffs<A> coeffs_of(int64_t C, int64_t inner, int64_t ignore, double ls) {
  return {C, inner, ignore, A(1 - ls), A(ls), A(ls / double(C)), ls > 0};
}

// Writes one position's loss and lse from its max m, sum of exp(x - m) s, sum of x sx,
// and the logits xr (the class k at xr[k * stride]).
template <class D, class A>
__device__ __forceinline__ void finish_position(const D* __restrict__ xr, int64_t stride, int64_t p, A m, A s, A sx,
                                                int64_t t, const Coeffs<A>& k, D* __restrict__ loss,
                                                A* __restrict__ lse, DeviceError* err) {
  const A log_sum = d_log(s);
  lse[p] = m + log_sum;
  A l = 0;
  if (t != k.ignore) {
    if (t < 0 || t >= k.C) {
      report_index_error(err, kErrCrossEntropy, t, k.C);
      l = std::numeric_limits<A>::quiet_NaN();
    } else {
      // (lse - x) as (m - x) + log_sum: exact near the max
      const A nll = (m - convert<A>(xr[t * stride])) + log_sum;
      l = k.smoothing ? k.keep * nll + k.smooth * ((m - sx / A(k.C)) + log_sum) : nll;
    }
  }
  loss[p] = convert<D>(l);
}

// ---- forward -------------------------------------------------------------------------------

template <class D, class A>
__global__ void __launch_bounds__(512) cross_entropy_rows_kernel(const D* __restrict__ x,
                                                                 const int64_t* __restrict__ target,
                                                                 D* __restrict__ loss, A* __restrict__ lse,
                                                                 int64_t rows, Coeffs<A> k, DeviceError* err) {
  __shared__ A smem[kGroupSlots];
  const int64_t G = blockDim.x, per_block = blockDim.y, C = k.C;
  for (int64_t r0 = int64_t(blockIdx.x) * per_block; r0 < rows; r0 += int64_t(gridDim.x) * per_block) {
    const int64_t row = r0 + threadIdx.y;
    const bool active = row < rows;
    const D* xr = x + (active ? row : 0) * C;
    A m = -std::numeric_limits<A>::infinity();
    if (active)
      for (int64_t i = threadIdx.x; i < C; i += G) {
        const A v = convert<A>(xr[i]);
        m = v > m ? v : m;  // NaNs skipped; a NaN row still gives NaN through exp
      }
    m = group_allreduce(m, MaxF{}, smem);
    A s = 0, sx = 0;
    if (active)
      for (int64_t i = threadIdx.x; i < C; i += G) {
        const A v = convert<A>(xr[i]);
        s += d_exp(v - m);
        sx += v;
      }
    s = group_reduce(s, SumF{}, smem);
    if (k.smoothing) sx = group_reduce(sx, SumF{}, smem);  // uniform across the block
    if (!active || threadIdx.x != 0) continue;
    finish_position<D, A>(xr, 1, row, m, s, sx, target[row], k, loss, lse, err);
  }
}

// inner > 1: one thread per position p = o * inner + i, its class c at (o * C + c) * inner + i.
template <class D, class A>
__global__ void cross_entropy_cols_kernel(const D* __restrict__ x, const int64_t* __restrict__ target,
                                          D* __restrict__ loss, A* __restrict__ lse, int64_t positions, Coeffs<A> k,
                                          DeviceError* err) {
  const int64_t C = k.C, inner = k.inner;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < positions;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = p / inner;
    const D* xr = x + o * C * inner + (p - o * inner);
    A m = -std::numeric_limits<A>::infinity();
    for (int64_t c = 0; c < C; ++c) {
      const A v = convert<A>(xr[c * inner]);
      m = v > m ? v : m;
    }
    A s = 0, sx = 0;
    for (int64_t c = 0; c < C; ++c) {
      const A v = convert<A>(xr[c * inner]);
      s += d_exp(v - m);
      sx += v;
    }
    finish_position<D, A>(xr, inner, p, m, s, sx, target[p], k, loss, lse, err);
  }
}

// ---- backward ------------------------------------------------------------------------------

// d/dx_c of position p's loss times g: g * exp(x_c - lse) - g * ls / C, less g * (1 - ls) at
// the target class.
template <class A>
__device__ __forceinline__ A grad_of(A v, A l, A g, A gs, A gt, bool at_target) {
  const A d = g * d_exp(v - l) - gs;
  return at_target ? d - gt : d;
}

template <class D, class A>
__global__ void __launch_bounds__(512) cross_entropy_backward_rows_kernel(
    const D* __restrict__ go, const D* __restrict__ x, const int64_t* __restrict__ target, const A* __restrict__ lse,
    D* __restrict__ gx, int64_t rows, Coeffs<A> k) {
  const int64_t G = blockDim.x, per_block = blockDim.y, C = k.C;
  for (int64_t row = int64_t(blockIdx.x) * per_block + threadIdx.y; row < rows;
       row += int64_t(gridDim.x) * per_block) {
    const int64_t t = target[row];
    D* gr = gx + row * C;
    if (t == k.ignore) {
      for (int64_t i = threadIdx.x; i < C; i += G) gr[i] = convert<D>(A(0));
      continue;
    }
    const D* xr = x + row * C;
    const A g = convert<A>(go[row]), l = lse[row], gs = g * k.smooth_c, gt = g * k.keep;
    for (int64_t i = threadIdx.x; i < C; i += G) gr[i] = convert<D>(grad_of(convert<A>(xr[i]), l, g, gs, gt, i == t));
  }
}

template <class D, class A>
__global__ void cross_entropy_backward_cols_kernel(const D* __restrict__ go, const D* __restrict__ x,
                                                   const int64_t* __restrict__ target, const A* __restrict__ lse,
                                                   D* __restrict__ gx, int64_t positions, Coeffs<A> k) {
  const int64_t C = k.C, inner = k.inner;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < positions;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = p / inner, off = o * C * inner + (p - o * inner);
    const int64_t t = target[p];
    if (t == k.ignore) {
      for (int64_t c = 0; c < C; ++c) gx[off + c * inner] = convert<D>(A(0));
      continue;
    }
    const A g = convert<A>(go[p]), l = lse[p], gs = g * k.smooth_c, gt = g * k.keep;
    for (int64_t c = 0; c < C; ++c)
      gx[off + c * inner] = convert<D>(grad_of(convert<A>(x[off + c * inner]), l, g, gs, gt, c == t));
  }
}

template <class T>
void launch_cross_entropy(const Tensor& x, int64_t classes, int64_t inner, const Tensor& target,
                          int64_t ignore_index, double label_smoothing, const Tensor& loss, const Tensor& lse) {
  using D = dev_t<T>;
  using A = acc_type_t<T>;
  const Device dev = x.device();
  const cudaStream_t stream = stream_of(dev);
  const int64_t positions = target.numel();
  const Coeffs<A> k = coeffs_of<A>(classes, inner, ignore_index, label_smoothing);
  const D* xp = static_cast<const D*>(x.raw_data());
  const int64_t* tp = static_cast<const int64_t*>(target.raw_data());
  D* lp = static_cast<D*>(loss.raw_data());
  A* sp = static_cast<A*>(lse.raw_data());
  DeviceError* err = error_slot(dev.index);
  if (inner == 1) {
    const dim3 block = row_block(classes);
    launch(cross_entropy_rows_kernel<D, A>, grid_for(positions, block.y), block, 0, stream,
           xp, tp, lp, sp, positions, k, err);
  } else {
    launch(cross_entropy_cols_kernel<D, A>, grid_for(positions, kBlockThreads), kBlockThreads, 0, stream,
           xp, tp, lp, sp, positions, k, err);
  }
  check_launch(op::cross_entropy, dev.index);
}

template <class T>
void launch_cross_entropy_backward(const Tensor& grad_loss, const Tensor& x, int64_t classes, int64_t inner,
                                   const Tensor& target, int64_t ignore_index, double label_smoothing,
                                   const Tensor& lse, const Tensor& grad_x) {
  using D = dev_t<T>;
  using A = acc_type_t<T>;
  const Device dev = x.device();
  const cudaStream_t stream = stream_of(dev);
  const int64_t positions = target.numel();
  const Coeffs<A> k = coeffs_of<A>(classes, inner, ignore_index, label_smoothing);
  const D* gp = static_cast<const D*>(grad_loss.raw_data());
  const D* xp = static_cast<const D*>(x.raw_data());
  const int64_t* tp = static_cast<const int64_t*>(target.raw_data());
  const A* sp = static_cast<const A*>(lse.raw_data());
  D* gxp = static_cast<D*>(grad_x.raw_data());
  if (inner == 1) {
    const dim3 block = row_block(classes);
    launch(cross_entropy_backward_rows_kernel<D, A>, grid_for(positions, block.y), block, 0, stream,
           gp, xp, tp, sp, gxp, positions, k);
  } else {
    launch(cross_entropy_backward_cols_kernel<D, A>, grid_for(positions, kBlockThreads), kBlockThreads, 0, stream,
           gp, xp, tp, sp, gxp, positions, k);
  }
  check_launch(op::cross_entropy, dev.index);
}

}  // namespace

void CudaBackend::cross_entropy(const Tensor& x, int64_t classes, int64_t inner, const Tensor& target,
                                int64_t ignore_index, double label_smoothing, const Tensor& loss, const Tensor& lse) {
  if (target.numel() == 0) return;
  // The kernel dereferences the targets on x's device (the frontend checks this; a backend
  // caller might not).
  AG_CHECK(target.dtype() == kInt64 && target.device() == x.device(), op::cross_entropy,
           "target must be int64 on the input's device, got ", dtype_name(target.dtype()), " on ", target.device());
  DeviceGuard guard(x.device().index, op::cross_entropy);
  dispatch_floating(x.dtype(), op::cross_entropy, [&]<class T>() {
    launch_cross_entropy<T>(x, classes, inner, target, ignore_index, label_smoothing, loss, lse);
  });
}

void CudaBackend::cross_entropy_backward(const Tensor& grad_loss, const Tensor& x, int64_t classes, int64_t inner,
                                         const Tensor& target, int64_t ignore_index, double label_smoothing,
                                         const Tensor& lse, const Tensor& grad_x) {
  if (target.numel() == 0 || classes == 0) return;
  DeviceGuard guard(x.device().index, op::cross_entropy);
  dispatch_floating(x.dtype(), op::cross_entropy, [&]<class T>() {
    launch_cross_entropy_backward<T>(grad_loss, x, classes, inner, target, ignore_index, label_smoothing, lse,
                                     grad_x);
  });
}

}  // namespace ampgrad::cuda
