// Softmax / log-softmax and layer norm on CUDA, forward and backward, with the CPU's
// semantics (kernels/cpu/norm.cpp). float16/bfloat16 compute in float32, float64 in double.
//
// Inputs are contiguous. Softmax views x as [outer, n, inner] around dim:
//   inner == 1  each row of n is contiguous: a group of G threads per row (G from n, up to
//               a block of 512) makes a max pass, a sum-of-exp pass and a write pass, with
//               the group's max and sum shared through shuffles and shared memory;
//   inner > 1   32 neighbouring columns per block, read as coalesced slices, blockDim.y
//               threads splitting each column's n elements, a tree over threadIdx.y.
// Rows subtract their max (NaNs ignored, as on the CPU: a NaN still makes the row NaN
// through exp) before exponentiating. Backward needs one reduction (sum of g, or of g * y).
//
// Layer norm normalises rows of `inner` elements with two-pass statistics (mean, then the
// mean squared deviation) saved per row as float32 (float64 for float64 x). Backward
// computes grad_in per row; the weight and bias gradients are column sums over rows: blocks
// of 32 columns sum chunks of rows into a temporary [chunks, inner] tensor, and a second
// kernel adds the chunks in order. Every reduction is a fixed tree whose shape depends
// only on the tensor's shape, without atomics, so results are deterministic.
//
// Reference: kernels/reference/include/ampgrad/reference/softmax.h and
//   kernels/reference/include/ampgrad/reference/norm.h (float64, the specification).
#include <algorithm>
#include <cmath>
#include <limits>

#include "ampgrad/factories.h"
#include "cuda/block_reduce.cuh"
#include "cuda/common.cuh"
#include "cuda/cuda_backend.h"

namespace ampgrad::cuda {
namespace {

using kernels::Split3;

constexpr int kColWidth = 32;
constexpr int kMaxColRows = 16;

// 32 columns by BY threads along n (about 8 elements a thread).
dim3 col_block(int64_t n) { return dim3(kColWidth, unsigned(pow2_at_least((n + 7) / 8, kMaxColRows))); }

// ---- softmax ---------------------------------------------------------------------------------

// inner == 1: rows of n contiguous elements.
template <class D, class A, bool kLog>
__global__ void __launch_bounds__(512) softmax_rows_kernel(const D* __restrict__ x, D* __restrict__ y, int64_t rows,
                                                           int64_t n) {
  __shared__ A smem[kGroupSlots];
  const int64_t G = blockDim.x, per_block = blockDim.y;
  for (int64_t r0 = int64_t(blockIdx.x) * per_block; r0 < rows; r0 += int64_t(gridDim.x) * per_block) {
    const int64_t row = r0 + threadIdx.y;
    const bool active = row < rows;
    const D* xr = x + (active ? row : 0) * n;
    A m = -std::numeric_limits<A>::infinity();
    if (active)
      for (int64_t i = threadIdx.x; i < n; i += G) {
        const A v = convert<A>(xr[i]);
        m = v > m ? v : m;
      }
    m = group_allreduce(m, MaxF{}, smem);
    A s = 0;
    if (active)
      for (int64_t i = threadIdx.x; i < n; i += G) s += d_exp(convert<A>(xr[i]) - m);
    s = group_allreduce(s, SumF{}, smem);
    if (!active) continue;
    D* yr = y + row * n;
    if constexpr (kLog) {
      // (x - max) - log(sum): x - max is exact near the max, so large inputs keep precision
      const A ls = d_log(s);
      for (int64_t i = threadIdx.x; i < n; i += G) yr[i] = convert<D>((convert<A>(xr[i]) - m) - ls);
    } else {
      const A inv = A(1) / s;
      for (int64_t i = threadIdx.x; i < n; i += G) yr[i] = convert<D>(d_exp(convert<A>(xr[i]) - m) * inv);
    }
  }
}

// inner > 1: blockDim = (32, BY); task t = o * nb + cb covers columns [cb * 32, cb * 32 + 32)
// of slice o, element (o, i, c) at (o * n + i) * inner + c.
template <class D, class A, bool kLog>
__global__ void __launch_bounds__(512) softmax_cols_kernel(const D* __restrict__ x, D* __restrict__ y, int64_t outer,
                                                           int64_t n, int64_t inner) {
  __shared__ A smem[kColWidth * kMaxColRows];
  const int64_t nb = (inner + kColWidth - 1) / kColWidth, tasks = outer * nb, BY = blockDim.y;
  for (int64_t t = blockIdx.x; t < tasks; t += gridDim.x) {
    const int64_t o = t / nb, c = (t - o * nb) * kColWidth + threadIdx.x;
    const bool active = c < inner;
    const int64_t base = o * n * inner + (active ? c : 0);
    A m = -std::numeric_limits<A>::infinity();
    if (active)
      for (int64_t i = threadIdx.y; i < n; i += BY) {
        const A v = convert<A>(x[base + i * inner]);
        m = v > m ? v : m;
      }
    m = column_allreduce(m, MaxF{}, smem);
    A s = 0;
    if (active)
      for (int64_t i = threadIdx.y; i < n; i += BY) s += d_exp(convert<A>(x[base + i * inner]) - m);
    s = column_allreduce(s, SumF{}, smem);
    if (!active) continue;
    if constexpr (kLog) {
      const A ls = d_log(s);
      for (int64_t i = threadIdx.y; i < n; i += BY)
        y[base + i * inner] = convert<D>((convert<A>(x[base + i * inner]) - m) - ls);
    } else {
      const A inv = A(1) / s;
      for (int64_t i = threadIdx.y; i < n; i += BY)
        y[base + i * inner] = convert<D>(d_exp(convert<A>(x[base + i * inner]) - m) * inv);
    }
  }
}

// softmax: d = y * (g - <g, y>); log-softmax: d = g - exp(y) * sum(g).
template <class A, bool kLog>
__device__ __forceinline__ A softmax_grad_term(A g, A y) {
  if constexpr (kLog) return g;
  else return g * y;
}
template <class A, bool kLog>
__device__ __forceinline__ A softmax_grad(A g, A y, A acc) {
  if constexpr (kLog) return g - d_exp(y) * acc;
  else return y * (g - acc);
}

template <class D, class A, bool kLog>
__global__ void __launch_bounds__(512) softmax_backward_rows_kernel(const D* __restrict__ go, const D* __restrict__ y,
                                                                    D* __restrict__ gi, int64_t rows, int64_t n) {
  __shared__ A smem[kGroupSlots];
  const int64_t G = blockDim.x, per_block = blockDim.y;
  for (int64_t r0 = int64_t(blockIdx.x) * per_block; r0 < rows; r0 += int64_t(gridDim.x) * per_block) {
    const int64_t row = r0 + threadIdx.y;
    const bool active = row < rows;
    const int64_t base = (active ? row : 0) * n;
    A acc = 0;
    if (active)
      for (int64_t i = threadIdx.x; i < n; i += G)
        acc += softmax_grad_term<A, kLog>(convert<A>(go[base + i]), convert<A>(y[base + i]));
    acc = group_allreduce(acc, SumF{}, smem);
    if (!active) continue;
    for (int64_t i = threadIdx.x; i < n; i += G)
      gi[base + i] = convert<D>(softmax_grad<A, kLog>(convert<A>(go[base + i]), convert<A>(y[base + i]), acc));
  }
}

template <class D, class A, bool kLog>
__global__ void __launch_bounds__(512) softmax_backward_cols_kernel(const D* __restrict__ go, const D* __restrict__ y,
                                                                    D* __restrict__ gi, int64_t outer, int64_t n,
                                                                    int64_t inner) {
  __shared__ A smem[kColWidth * kMaxColRows];
  const int64_t nb = (inner + kColWidth - 1) / kColWidth, tasks = outer * nb, BY = blockDim.y;
  for (int64_t t = blockIdx.x; t < tasks; t += gridDim.x) {
    const int64_t o = t / nb, c = (t - o * nb) * kColWidth + threadIdx.x;
    const bool active = c < inner;
    const int64_t base = o * n * inner + (active ? c : 0);
    A acc = 0;
    if (active)
      for (int64_t i = threadIdx.y; i < n; i += BY)
        acc += softmax_grad_term<A, kLog>(convert<A>(go[base + i * inner]), convert<A>(y[base + i * inner]));
    acc = column_allreduce(acc, SumF{}, smem);
    if (!active) continue;
    for (int64_t i = threadIdx.y; i < n; i += BY) {
      const int64_t k = base + i * inner;
      gi[k] = convert<D>(softmax_grad<A, kLog>(convert<A>(go[k]), convert<A>(y[k]), acc));
    }
  }
}

template <class T, bool kLog>
void launch_softmax(const Tensor& x, const Split3& s, const Tensor& out, const char* name) {
  using D = dev_t<T>;
  using A = acc_type_t<T>;
  const Device dev = x.device();
  const cudaStream_t stream = stream_of(dev);
  const D* xp = static_cast<const D*>(x.raw_data());
  D* yp = static_cast<D*>(out.raw_data());
  if (s.inner == 1) {
    const dim3 block = row_block(s.n);
    launch(softmax_rows_kernel<D, A, kLog>, grid_for(s.outer, block.y), block, 0, stream, xp, yp, s.outer, s.n);
  } else {
    const dim3 block = col_block(s.n);
    const int64_t tasks = s.outer * ((s.inner + kColWidth - 1) / kColWidth);
    launch(softmax_cols_kernel<D, A, kLog>, grid_for(tasks, 1), block, 0, stream, xp, yp, s.outer, s.n, s.inner);
  }
  check_launch(name, dev.index);
}

template <class T, bool kLog>
void launch_softmax_backward(const Tensor& grad_out, const Tensor& y, const Split3& s, const Tensor& grad_in,
                             const char* name) {
  using D = dev_t<T>;
  using A = acc_type_t<T>;
  const Device dev = y.device();
  const cudaStream_t stream = stream_of(dev);
  const D* gp = static_cast<const D*>(grad_out.raw_data());
  const D* yp = static_cast<const D*>(y.raw_data());
  D* gip = static_cast<D*>(grad_in.raw_data());
  if (s.inner == 1) {
    const dim3 block = row_block(s.n);
    launch(softmax_backward_rows_kernel<D, A, kLog>, grid_for(s.outer, block.y), block, 0, stream,
           gp, yp, gip, s.outer, s.n);
  } else {
    const dim3 block = col_block(s.n);
    const int64_t tasks = s.outer * ((s.inner + kColWidth - 1) / kColWidth);
    launch(softmax_backward_cols_kernel<D, A, kLog>, grid_for(tasks, 1), block, 0, stream,
           gp, yp, gip, s.outer, s.n, s.inner);
  }
  check_launch(name, dev.index);
}

// ---- layer norm ------------------------------------------------------------------------------

// One group of G threads per row: mean, then the mean squared deviation, then the write.
// w and b may be null.
template <class D, class A>
__global__ void __launch_bounds__(512) layer_norm_kernel(const D* __restrict__ x, const D* __restrict__ w,
                                                         const D* __restrict__ b, D* __restrict__ y,
                                                         A* __restrict__ mean, A* __restrict__ rstd, int64_t rows,
                                                         int64_t inner, double eps) {
  __shared__ A smem[kGroupSlots];
  const int64_t G = blockDim.x, per_block = blockDim.y;
  for (int64_t r0 = int64_t(blockIdx.x) * per_block; r0 < rows; r0 += int64_t(gridDim.x) * per_block) {
    const int64_t row = r0 + threadIdx.y;
    const bool active = row < rows;
    const D* xr = x + (active ? row : 0) * inner;
    A s = 0;
    if (active)
      for (int64_t i = threadIdx.x; i < inner; i += G) s += convert<A>(xr[i]);
    const A mu = group_allreduce(s, SumF{}, smem) / A(inner);
    A q = 0;
    if (active)
      for (int64_t i = threadIdx.x; i < inner; i += G) {
        const A d = convert<A>(xr[i]) - mu;
        q += d * d;
      }
    const A var = group_allreduce(q, SumF{}, smem) / A(inner);
    if (!active) continue;
    const A rs = A(1) / d_sqrt(var + A(eps));
    D* yr = y + row * inner;
    for (int64_t i = threadIdx.x; i < inner; i += G) {
      A t = (convert<A>(xr[i]) - mu) * rs;
      if (w) t *= convert<A>(w[i]);
      if (b) t += convert<A>(b[i]);
      yr[i] = convert<D>(t);
    }
    if (threadIdx.x == 0) {
      mean[row] = mu;
      rstd[row] = rs;
    }
  }
}

// grad_in per row: dx = rstd * (wg - mean(wg) - xhat * mean(wg * xhat)), wg = weight * g.
template <class D, class A>
__global__ void __launch_bounds__(512) layer_norm_grad_in_kernel(const D* __restrict__ go, const D* __restrict__ x,
                                                                 const A* __restrict__ mean, const A* __restrict__ rstd,
                                                                 const D* __restrict__ w, D* __restrict__ gi,
                                                                 int64_t rows, int64_t inner) {
  __shared__ A smem[kGroupSlots];
  const int64_t G = blockDim.x, per_block = blockDim.y;
  for (int64_t r0 = int64_t(blockIdx.x) * per_block; r0 < rows; r0 += int64_t(gridDim.x) * per_block) {
    const int64_t row = r0 + threadIdx.y;
    const bool active = row < rows;
    const int64_t base = (active ? row : 0) * inner;
    const A mu = active ? mean[row] : A(0), rs = active ? rstd[row] : A(0);
    A s1 = 0, s2 = 0;
    if (active)
      for (int64_t i = threadIdx.x; i < inner; i += G) {
        A g = convert<A>(go[base + i]);
        if (w) g *= convert<A>(w[i]);
        const A xh = (convert<A>(x[base + i]) - mu) * rs;
        s1 += g * xh;
        s2 += g;
      }
    const A c1 = group_allreduce(s1, SumF{}, smem) / A(inner);
    const A c2 = group_allreduce(s2, SumF{}, smem) / A(inner);
    if (!active) continue;
    for (int64_t i = threadIdx.x; i < inner; i += G) {
      A g = convert<A>(go[base + i]);
      if (w) g *= convert<A>(w[i]);
      const A xh = (convert<A>(x[base + i]) - mu) * rs;
      gi[base + i] = convert<D>(rs * (g - c2 - xh * c1));
    }
  }
}

// Column sums over rows for grad_w (sum of g * xhat) and grad_b (sum of g): blockDim =
// (32, BY), grid (column blocks, K); block (cb, k) sums rows [rows * k / K, rows * (k + 1) / K)
// of its 32 columns. With K == 1 it writes gw/gb (either may be null), else the partial
// sums pw/pb[k * inner + c].
template <class D, class A>
__global__ void __launch_bounds__(512) layer_norm_params_kernel(const D* __restrict__ go, const D* __restrict__ x,
                                                                const A* __restrict__ mean, const A* __restrict__ rstd,
                                                                int64_t rows, int64_t inner, int64_t K,
                                                                A* __restrict__ pw, A* __restrict__ pb,
                                                                D* __restrict__ gw, D* __restrict__ gb) {
  __shared__ A smem[kColWidth * kMaxColRows];
  const int64_t c = int64_t(blockIdx.x) * kColWidth + threadIdx.x, k = blockIdx.y;
  const bool active = c < inner;
  const int64_t r0 = rows * k / K, r1 = rows * (k + 1) / K;
  A sw = 0, sb = 0;
  if (active)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
      const A g = convert<A>(go[r * inner + c]);
      sw += g * ((convert<A>(x[r * inner + c]) - mean[r]) * rstd[r]);
      sb += g;
    }
  sw = column_allreduce(sw, SumF{}, smem);
  sb = column_allreduce(sb, SumF{}, smem);
  if (!active || threadIdx.y != 0) return;
  if (K == 1) {
    if (gw) gw[c] = convert<D>(sw);
    if (gb) gb[c] = convert<D>(sb);
  } else {
    if (pw) pw[k * inner + c] = sw;
    if (pb) pb[k * inner + c] = sb;
  }
}

// Adds the K partial sums of each column in chunk order.
template <class D, class A>
__global__ void layer_norm_params_merge_kernel(const A* __restrict__ part, int64_t K, int64_t inner,
                                               D* __restrict__ out) {
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < inner; c += int64_t(gridDim.x) * blockDim.x) {
    A s = part[c];
    for (int64_t k = 1; k < K; ++k) s += part[k * inner + c];
    out[c] = convert<D>(s);
  }
}

template <class T>
void launch_layer_norm(const Tensor& x, int64_t inner, const Tensor& weight, const Tensor& bias, double eps,
                       const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  using D = dev_t<T>;
  using A = acc_type_t<T>;
  const Device dev = x.device();
  const int64_t rows = x.numel() / inner;
  const dim3 block = row_block(inner);
  launch(layer_norm_kernel<D, A>, grid_for(rows, block.y), block, 0, stream_of(dev),
         static_cast<const D*>(x.raw_data()), weight.defined() ? static_cast<const D*>(weight.raw_data()) : nullptr,
         bias.defined() ? static_cast<const D*>(bias.raw_data()) : nullptr, static_cast<D*>(y.raw_data()),
         static_cast<A*>(mean.raw_data()), static_cast<A*>(rstd.raw_data()), rows, inner, eps);
  check_launch(op::layer_norm, dev.index);
}

template <class T>
void launch_layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                const Tensor& weight, const Tensor& grad_in, const Tensor& grad_w,
                                const Tensor& grad_b, int64_t rows, int64_t inner) {
  using D = dev_t<T>;
  using A = acc_type_t<T>;
  const Device dev = x.device();
  const cudaStream_t stream = stream_of(dev);
  D* gw = grad_w.defined() ? static_cast<D*>(grad_w.raw_data()) : nullptr;
  D* gb = grad_b.defined() ? static_cast<D*>(grad_b.raw_data()) : nullptr;
  if (inner == 0 || rows == 0) {  // empty rows: parameter gradients are zero (all-zero bits)
    if (gw) AG_CUDA_CHECK(op::layer_norm, cudaMemsetAsync(gw, 0, size_t(inner) * sizeof(D), stream));
    if (gb) AG_CUDA_CHECK(op::layer_norm, cudaMemsetAsync(gb, 0, size_t(inner) * sizeof(D), stream));
    return;
  }
  const D* gp = static_cast<const D*>(grad_out.raw_data());
  const D* xp = static_cast<const D*>(x.raw_data());
  const A* mp = static_cast<const A*>(mean.raw_data());
  const A* rp = static_cast<const A*>(rstd.raw_data());
  if (grad_in.defined()) {
    const dim3 block = row_block(inner);
    launch(layer_norm_grad_in_kernel<D, A>, grid_for(rows, block.y), block, 0, stream,
           gp, xp, mp, rp, weight.defined() ? static_cast<const D*>(weight.raw_data()) : nullptr,
           static_cast<D*>(grad_in.raw_data()), rows, inner);
    check_launch(op::layer_norm, dev.index);
  }
  if (!gw && !gb) return;
  // Chunks of rows: enough blocks to fill a GPU, each chunk at least 64 rows; from the
  // shape alone.
  const int64_t ncb = (inner + kColWidth - 1) / kColWidth;
  const int64_t K = ncb >= 512 || rows < 128
                        ? 1
                        : std::clamp<int64_t>(std::min((1024 + ncb - 1) / ncb, rows / 64), 1, 1024);
  const int64_t Rc = (rows + K - 1) / K;
  const dim3 block(kColWidth, unsigned(pow2_at_least((Rc + 7) / 8, kMaxColRows)));
  AG_CHECK(ncb <= int64_t(0x7fffffff), op::layer_norm, "rows of ", inner, " elements are too long");
  const dim3 grid{unsigned(ncb), unsigned(K)};
  Tensor part;
  A *pw = nullptr, *pb = nullptr;
  if (K > 1) {
    part = empty({(gw ? K * inner : 0) + (gb ? K * inner : 0)}, TensorOptions().dtype(dtype_of<A>).device(dev));
    A* base = static_cast<A*>(part.raw_data());
    if (gw) pw = base;
    if (gb) pb = base + (gw ? K * inner : 0);
  }
  launch(layer_norm_params_kernel<D, A>, grid, block, 0, stream, gp, xp, mp, rp, rows, inner, K, pw, pb, gw, gb);
  check_launch(op::layer_norm, dev.index);
  if (K > 1) {
    for (int pass = 0; pass < 2; ++pass) {
      A* src = pass == 0 ? pw : pb;
      D* dst = pass == 0 ? gw : gb;
      if (!dst) continue;
      launch(layer_norm_params_merge_kernel<D, A>, grid_for(inner, kBlockThreads), kBlockThreads, 0, stream,
             src, K, inner, dst);
      check_launch(op::layer_norm, dev.index);
    }
  }
  // `part` is freed on the stream after the kernels that use it.
}

}  // namespace

void CudaBackend::softmax(const Tensor& x, int64_t dim, bool log, const Tensor& out) {
  const Split3 s(x.sizes(), dim);
  if (x.numel() == 0) return;
  const char* name = log ? op::log_softmax : op::softmax;
  DeviceGuard guard(x.device().index, name);
  dispatch_floating(x.dtype(), name, [&]<class T>() {
    if (log) launch_softmax<T, true>(x, s, out, name);
    else launch_softmax<T, false>(x, s, out, name);
  });
}

void CudaBackend::softmax_backward(const Tensor& grad_out, const Tensor& y, int64_t dim, bool log,
                                   const Tensor& grad_in) {
  const Split3 s(y.sizes(), dim);
  if (y.numel() == 0) return;
  const char* name = log ? op::log_softmax : op::softmax;
  DeviceGuard guard(y.device().index, name);
  dispatch_floating(y.dtype(), name, [&]<class T>() {
    if (log) launch_softmax_backward<T, true>(grad_out, y, s, grad_in, name);
    else launch_softmax_backward<T, false>(grad_out, y, s, grad_in, name);
  });
}

void CudaBackend::layer_norm(const Tensor& x, int64_t inner, const Tensor& weight, const Tensor& bias,
                             double eps, const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  if (x.numel() == 0) return;
  DeviceGuard guard(x.device().index, op::layer_norm);
  dispatch_floating(x.dtype(), op::layer_norm,
                    [&]<class T>() { launch_layer_norm<T>(x, inner, weight, bias, eps, y, mean, rstd); });
}

void CudaBackend::layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean,
                                      const Tensor& rstd, const Tensor& weight, const Tensor& grad_in,
                                      const Tensor& grad_w, const Tensor& grad_b) {
  const int64_t rows = mean.numel();
  const int64_t inner = layer_norm_inner(x, mean, grad_w, grad_b);
  DeviceGuard guard(x.device().index, op::layer_norm);
  dispatch_floating(x.dtype(), op::layer_norm, [&]<class T>() {
    launch_layer_norm_backward<T>(grad_out, x, mean, rstd, weight, grad_in, grad_w, grad_b, rows, inner);
  });
}

}  // namespace ampgrad::cuda
