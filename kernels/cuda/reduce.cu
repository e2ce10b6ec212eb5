// Reductions on CUDA: every ReduceOp and max_min_dim, with the CPU's semantics
// (kernels/cpu/reduce.cpp).
//
// The input is described by a ReduceLayout, as on the CPU: size-1 dims dropped, kept and reduced
// dims listed apart (kept dims carry their stride in x and in the contiguous keepdim
// output), kept dims and (for ops that do not report an index) reduced dims sorted by
// stride, neighbours merged where strides allow. Any strides work; nothing is copied.
// Then one of two kernels runs:
//   rows     the innermost reduced dim has the smaller stride: a group of G threads (a
//            warp, part of one, or a whole block) reduces each output, its threads
//            striding over the flat reduced index, then shuffles and shared memory;
//   columns  a kept dim has the smaller stride (the [N, C] -> [C] bias gradient): 32
//            neighbouring outputs per block read coalesced slices, blockDim.y threads
//            split the reduced range of each, then a tree over threadIdx.y.
// Few outputs over many elements (a full sum) split the reduced range into K chunks: the
// first kernel writes K partial states per output into a temporary tensor, a second one
// merges them in a fixed tree. Block shapes and K depend only on the shape, and nothing
// uses atomics, so results are deterministic for a given shape (and independent of the GPU).
//
// Accumulation is in acc_type_t (float for float32/float16/bfloat16, double for float64),
// int64 for integral and bool sums, never in 16 bits. Var and LogSumExp take two passes
// (mean or max first, into a temporary). Max and Min propagate NaN; ArgMax/ArgMin and
// max_min_dim return the first extreme's index (a NaN counts as the extreme), as a flat
// row-major index over the reduced dims. Empty reductions give what the CPU gives: 0 for
// sums, NaN for Mean, the identity (-inf for a floating max) for extrema, index -1.
//
// Reference: kernels/reference/include/ampgrad/reference/reduce.h (float64, the specification).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ampgrad/factories.h"
#include "cuda/block_reduce.cuh"
#include "cuda/common.cuh"
#include "cuda/cuda_backend.h"

namespace ampgrad::cuda {
namespace {

using kernels::kMaxLoopDims;

// ---- plan ------------------------------------------------------------------------------

// Kept dims outer to inner with their element strides in x (kxs) and in the contiguous
// keepdim output (kos); reduced dims outer to inner with their element strides in x.
// Linear output index o runs over the kept dims in this order, innermost fastest.
struct ReduceLayout {
  int nk = 0, nr = 0;
  int64_t ksz[kMaxLoopDims], kxs[kMaxLoopDims], kos[kMaxLoopDims];
  int64_t rsz[kMaxLoopDims], rst[kMaxLoopDims];
  int64_t M = 1;  // outputs
  int64_t R = 1;  // elements reduced into each output
};

// Sort key: larger strides outer; broadcast (stride-0) dims outermost of all.
inline int64_t stride_key(int64_t s) { return s == 0 ? std::numeric_limits<int64_t>::max() : (s < 0 ? -s : s); }

ReduceLayout make_layout(const Tensor& x, const Shape& dims, bool order_free) {
  AG_CHECK(x.dim() <= kMaxLoopDims, "reduce", "tensors of more than ", kMaxLoopDims,
           " dims are not supported, got ", x.dim());
  const int64_t nd = x.dim();
  std::vector<char> red(size_t(nd), 0);
  for (int64_t d : dims) red[size_t(d)] = 1;
  // Output strides of the keepdim layout (reduced dims count as size 1).
  std::vector<int64_t> ostride(size_t(nd), 0);
  {
    int64_t s = 1;
    for (int64_t d = nd; d-- > 0;) {
      ostride[size_t(d)] = s;
      if (!red[size_t(d)]) s *= x.sizes()[size_t(d)];
    }
  }
  struct Dim {
    int64_t size, xs, os;
  };
  std::vector<Dim> kept, rdc;
  ReduceLayout p;
  for (int64_t d = 0; d < nd; ++d) {
    const int64_t sz = x.sizes()[size_t(d)];
    (red[size_t(d)] ? p.R : p.M) *= sz;
    if (sz == 1) continue;
    (red[size_t(d)] ? rdc : kept).push_back(Dim{sz, x.strides()[size_t(d)], ostride[size_t(d)]});
  }
  auto by_stride = [](const Dim& a, const Dim& b) { return stride_key(a.xs) > stride_key(b.xs); };
  // The output offset comes from each kept dim's own output stride, so their order is free.
  std::stable_sort(kept.begin(), kept.end(), by_stride);
  if (order_free) std::stable_sort(rdc.begin(), rdc.end(), by_stride);
  // Merge neighbours (a, b) when b's strides times its size are a's.
  size_t n = 0;
  for (size_t i = 0; i < kept.size(); ++i) {
    if (n > 0 && kept[n - 1].xs == kept[i].xs * kept[i].size && kept[n - 1].os == kept[i].os * kept[i].size) {
      kept[n - 1].size *= kept[i].size;
      kept[n - 1].xs = kept[i].xs;
      kept[n - 1].os = kept[i].os;
    } else {
      kept[n++] = kept[i];
    }
  }
  kept.resize(n);
  n = 0;
  for (size_t i = 0; i < rdc.size(); ++i) {
    if (n > 0 && rdc[n - 1].xs == rdc[i].xs * rdc[i].size) {
      rdc[n - 1].size *= rdc[i].size;
      rdc[n - 1].xs = rdc[i].xs;
    } else {
      rdc[n++] = rdc[i];
    }
  }
  rdc.resize(n);
  p.nk = int(kept.size());
  p.nr = int(rdc.size());
  for (int i = 0; i < p.nk; ++i) p.ksz[i] = kept[size_t(i)].size, p.kxs[i] = kept[size_t(i)].xs, p.kos[i] = kept[size_t(i)].os;
  for (int i = 0; i < p.nr; ++i) p.rsz[i] = rdc[size_t(i)].size, p.rst[i] = rdc[size_t(i)].xs;
  for (int i = p.nk; i < kMaxLoopDims; ++i) p.ksz[i] = 1, p.kxs[i] = 0, p.kos[i] = 0;
  for (int i = p.nr; i < kMaxLoopDims; ++i) p.rsz[i] = 1, p.rst[i] = 0;
  return p;
}

// Offsets in x and in the output of linear output index o.
__device__ __forceinline__ void kept_offsets(const ReduceLayout& p, int64_t o, int64_t& xoff, int64_t& ooff) {
  xoff = 0;
  ooff = 0;
  for (int d = p.nk - 1; d >= 0; --d) {
    const int64_t q = o / p.ksz[d], i = o - q * p.ksz[d];
    xoff += i * p.kxs[d];
    ooff += i * p.kos[d];
    o = q;
  }
}

// Offset in x of flat reduced index r.
__device__ __forceinline__ int64_t reduced_offset(const ReduceLayout& p, int64_t r) {
  if (p.nr == 1) return r * p.rst[0];
  int64_t off = 0;
  for (int d = p.nr - 1; d >= 0; --d) {
    const int64_t q = r / p.rsz[d];
    off += (r - q * p.rsz[d]) * p.rst[d];
    r = q;
  }
  return off;
}

__device__ __forceinline__ float d_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double d_pow(double a, double b) { return pow(a, b); }
__device__ __forceinline__ float d_abs(float v) { return fabsf(v); }
__device__ __forceinline__ double d_abs(double v) { return fabs(v); }
template <class A>
__device__ __forceinline__ A d_abs(A v) {  // integers (only floating ops take |x|)
  return v < A(0) ? A(-v) : v;
}
template <class A>
__device__ __forceinline__ bool d_isfinite(A v) {
  if constexpr (std::is_floating_point_v<A>) return isfinite(v);
  else return true;
}

// ---- reducers ----------------------------------------------------------------------------
//
// A reducer computes in Acc and has a trivially copyable State (it lives in shared memory
// and in temporary tensors) with init / step (one element, its flat reduced index r and the per-output
// value from ctx) / combine (any two states, in either order of indices) / result.

enum class SumKind { Sum, Mean, SqDev, ExpShift, AbsSum, SqSum, PowSum, NonZero };

template <class A>
struct SumState {
  A s;
  __device__ SumState shfl_down(int off) const { return {shfl_down_scalar(s, off)}; }
  __device__ SumState shfl(int src) const { return {shfl_scalar(s, src)}; }
};

// Sums f(x) over the reduced elements. `param` holds a per-output value from a first pass
// (indexed by output offset): the mean (SqDev, for Var) or the max (ExpShift, LogSumExp).
template <class A, SumKind K>
struct SumReducer {
  using Acc = A;
  using State = SumState<A>;
  const A* param = nullptr;
  A p = 2;                 // PowSum
  int64_t correction = 0;  // SqDev

  __device__ A ctx(int64_t ooff) const {
    if constexpr (K == SumKind::SqDev) return param[ooff];
    else if constexpr (K == SumKind::ExpShift) return d_isfinite(param[ooff]) ? param[ooff] : A(0);
    else return A(0);
  }
  __device__ State init() const { return {A(0)}; }
  __device__ A f(A x, A m) const {
    if constexpr (K == SumKind::Sum || K == SumKind::Mean) return x;
    else if constexpr (K == SumKind::SqDev) return (x - m) * (x - m);
    else if constexpr (K == SumKind::ExpShift) return d_exp(x - m);
    else if constexpr (K == SumKind::AbsSum) return d_abs(x);
    else if constexpr (K == SumKind::SqSum) return x * x;
    else if constexpr (K == SumKind::PowSum) return d_pow(d_abs(x), p);
    else return x != A(0) ? A(1) : A(0);
  }
  __device__ void step(State& st, A x, int64_t, A m) const { st.s += f(x, m); }
  __device__ State combine(const State& a, const State& b) const { return {a.s + b.s}; }
  __device__ A result(const State& st, int64_t count, int64_t ooff) const {
    const A s = st.s;
    if constexpr (K == SumKind::Mean) return s / A(count);
    else if constexpr (K == SumKind::SqDev) return s / A(count - correction > 0 ? count - correction : 0);
    else if constexpr (K == SumKind::ExpShift) return d_isfinite(param[ooff]) ? param[ooff] + d_log(s) : param[ooff];
    else if constexpr (K == SumKind::SqSum) return d_sqrt(s);
    else if constexpr (K == SumKind::PowSum) return d_pow(s, A(1) / p);
    else return s;
  }
};

template <class A>
struct ExtState {
  A v;
  int64_t i;  // flat reduced index of v; -1 before the first element
  __device__ ExtState shfl_down(int off) const { return {shfl_down_scalar(v, off), shfl_down_scalar(i, off)}; }
  __device__ ExtState shfl(int src) const { return {shfl_scalar(v, src), shfl_scalar(i, src)}; }
};
template <class A>
struct ExtValueState {
  A v;
  __device__ ExtValueState shfl_down(int off) const { return {shfl_down_scalar(v, off)}; }
  __device__ ExtValueState shfl(int src) const { return {shfl_scalar(v, src)}; }
};

// Max or min (of |x| with kAbs), with the flat index of the first extreme when kIndex.
// NaN beats every number, so it propagates and its index is reported; between equal
// values (or two NaNs) the smaller index wins, whatever order states combine in.
template <class A, bool kMax, bool kIndex, bool kAbs = false>
struct ExtremumReducer {
  using Acc = A;
  using State = std::conditional_t<kIndex, ExtState<A>, ExtValueState<A>>;

  __device__ static A identity() {
    if constexpr (std::is_floating_point_v<A>)
      return kMax ? -std::numeric_limits<A>::infinity() : std::numeric_limits<A>::infinity();
    else return kMax ? std::numeric_limits<A>::lowest() : std::numeric_limits<A>::max();
  }
  __device__ static bool better(A x, A cur) {
    if constexpr (std::is_floating_point_v<A>)
      if (x != x) return cur == cur;
    return kMax ? x > cur : x < cur;
  }
  __device__ A ctx(int64_t) const { return A(0); }
  __device__ State init() const {
    if constexpr (kIndex) return {identity(), -1};
    else return {identity()};
  }
  __device__ void step(State& st, A x, int64_t r, A) const {
    if constexpr (kAbs) x = d_abs(x);
    if constexpr (kIndex) {
      // Elements arrive in increasing r per thread: the first always counts, ties keep it.
      if (st.i < 0 || better(x, st.v)) st = {x, r};
    } else {
      if (better(x, st.v)) st.v = x;
    }
  }
  __device__ State combine(const State& a, const State& b) const {
    if constexpr (kIndex) {
      if (b.i < 0) return a;
      if (a.i < 0) return b;
      if (better(b.v, a.v)) return b;
      if (better(a.v, b.v)) return a;
      return b.i < a.i ? b : a;
    } else {
      return better(b.v, a.v) ? b : a;
    }
  }
  __device__ A result(const State& st, int64_t, int64_t) const { return st.v; }
};

// ---- outputs ------------------------------------------------------------------------------

// result converted to the output's storage type O.
template <class O>
struct ValueOut {
  O* out;
  template <class Red>
  __device__ void operator()(const Red& red, const typename Red::State& st, int64_t ooff, int64_t count) const {
    out[ooff] = convert<O>(red.result(st, count, ooff));
  }
};
// ArgMax / ArgMin: the index.
struct IndexOut {
  int64_t* out;
  template <class Red>
  __device__ void operator()(const Red&, const typename Red::State& st, int64_t ooff, int64_t) const {
    out[ooff] = st.i;
  }
};
// max_min_dim: the value and its index.
template <class O>
struct ValueIndexOut {
  O* values;
  int64_t* indices;
  template <class Red>
  __device__ void operator()(const Red& red, const typename Red::State& st, int64_t ooff, int64_t count) const {
    values[ooff] = convert<O>(red.result(st, count, ooff));
    indices[ooff] = st.i;
  }
};

// ---- kernels --------------------------------------------------------------------------------

template <class Red>
struct Combine {
  const Red* red;
  __device__ typename Red::State operator()(const typename Red::State& a, const typename Red::State& b) const {
    return red->combine(a, b);
  }
};

constexpr int kRowThreads = 256;  // threads per block of the rows and merge kernels
constexpr int kColWidth = 32;     // outputs per block of the columns kernel
constexpr int kMaxColRows = 16;   // its largest blockDim.y
constexpr int64_t kMaxChunks = 1024;

// Rows: group g = o * K + k (blockDim.x threads) reduces chunk k of output o; with K == 1
// it writes the output, else its partial state into partial[g].
template <class D, class Red, class Out>
__global__ void __launch_bounds__(512) reduce_rows_kernel(const D* __restrict__ x, ReduceLayout p, Red red, Out out,
                                                          int64_t K, typename Red::State* __restrict__ partial) {
  using A = typename Red::Acc;
  using State = typename Red::State;
  __shared__ State smem[kGroupSlots];
  const int G = int(blockDim.x);
  const int64_t tx = threadIdx.x;
  const int64_t groups = p.M * K;
  const int64_t per_block = blockDim.y;
  for (int64_t g0 = int64_t(blockIdx.x) * per_block; g0 < groups; g0 += int64_t(gridDim.x) * per_block) {
    const int64_t g = g0 + threadIdx.y;
    const bool active = g < groups;
    State st = red.init();
    int64_t ooff = 0;
    if (active) {
      const int64_t o = g / K, k = g - o * K;
      int64_t xoff;
      kept_offsets(p, o, xoff, ooff);
      const A m = red.ctx(ooff);
      const int64_t r0 = p.R * k / K, r1 = p.R * (k + 1) / K;
      const D* xb = x + xoff;
      int64_t r = r0 + tx;
      // Four loads in flight per thread; elements still step in increasing r.
      for (; r + 3 * G < r1; r += 4 * G) {
        const D v0 = xb[reduced_offset(p, r)], v1 = xb[reduced_offset(p, r + G)];
        const D v2 = xb[reduced_offset(p, r + 2 * G)], v3 = xb[reduced_offset(p, r + 3 * G)];
        red.step(st, convert<A>(v0), r, m);
        red.step(st, convert<A>(v1), r + G, m);
        red.step(st, convert<A>(v2), r + 2 * G, m);
        red.step(st, convert<A>(v3), r + 3 * G, m);
      }
      for (; r < r1; r += G) red.step(st, convert<A>(xb[reduced_offset(p, r)]), r, m);
    }
    st = group_reduce(st, Combine<Red>{&red}, smem);
    if (active && tx == 0) {
      if (K == 1) out(red, st, ooff, p.R);
      else partial[g] = st;
    }
  }
}

// Columns: blockDim = (32, BY). Task t = ((oo * nb + cb) * K + k) covers 32 neighbouring
// outputs c along the innermost kept dim (size I, unit stride in x) and chunk k of their
// reduced range, split over threadIdx.y.
template <class D, class Red, class Out>
__global__ void __launch_bounds__(512) reduce_cols_kernel(const D* __restrict__ x, ReduceLayout p, Red red, Out out,
                                                          int64_t K, typename Red::State* __restrict__ partial) {
  using A = typename Red::Acc;
  using State = typename Red::State;
  __shared__ State smem[kColWidth * kMaxColRows];
  const int64_t I = p.ksz[p.nk - 1];
  const int64_t nb = (I + kColWidth - 1) / kColWidth;
  const int64_t tasks = p.M / I * nb * K;
  const int64_t BY = blockDim.y;
  for (int64_t t = blockIdx.x; t < tasks; t += gridDim.x) {
    const int64_t k = t % K, rest = t / K;
    const int64_t cb = rest % nb, oo = rest / nb;
    const int64_t c = cb * kColWidth + threadIdx.x;
    const bool active = c < I;
    const int64_t o = oo * I + (active ? c : 0);
    int64_t xoff, ooff;
    kept_offsets(p, o, xoff, ooff);
    State st = red.init();
    if (active) {
      const A m = red.ctx(ooff);
      const int64_t r0 = p.R * k / K, r1 = p.R * (k + 1) / K;
      const D* xb = x + xoff;
      for (int64_t r = r0 + threadIdx.y; r < r1; r += BY) red.step(st, convert<A>(xb[reduced_offset(p, r)]), r, m);
    }
    st = column_allreduce(st, Combine<Red>{&red}, smem);
    if (active && threadIdx.y == 0) {
      if (K == 1) out(red, st, ooff, p.R);
      else partial[o * K + k] = st;
    }
  }
}

// Merges the K partial states of each output (partial[o * K .. o * K + K)) in a fixed tree.
template <class Red, class Out>
__global__ void __launch_bounds__(512) reduce_merge_kernel(ReduceLayout p, Red red, Out out, int64_t K,
                                                           const typename Red::State* __restrict__ partial) {
  using State = typename Red::State;
  __shared__ State smem[kGroupSlots];
  const int64_t G = blockDim.x, per_block = blockDim.y;
  for (int64_t o0 = int64_t(blockIdx.x) * per_block; o0 < p.M; o0 += int64_t(gridDim.x) * per_block) {
    const int64_t o = o0 + threadIdx.y;
    const bool active = o < p.M;
    State st = red.init();
    if (active)
      for (int64_t k = threadIdx.x; k < K; k += G) st = red.combine(st, partial[o * K + k]);
    st = group_reduce(st, Combine<Red>{&red}, smem);
    if (active && threadIdx.x == 0) {
      int64_t xoff, ooff;
      kept_offsets(p, o, xoff, ooff);
      out(red, st, ooff, p.R);
    }
  }
}


// Chunks of the reduced range: enough work units (outputs or column blocks, times chunks)
// to fill a GPU, each chunk at least min_chunk elements. Depends on the shape only.
int64_t chunks_for(int64_t units, int64_t R, int64_t min_chunk) {
  if (units >= 512 || R < 2 * min_chunk) return 1;
  const int64_t want = (1024 + units - 1) / units;
  return std::clamp<int64_t>(std::min(want, R / min_chunk), 1, kMaxChunks);
}

// Runs `red` over the plan, writing through `out`. T is the host type of x's dtype.
template <class T, class Red, class Out>
void run_reduce(const char* name, const Tensor& x, const ReduceLayout& p, const Red& red, const Out& out) {
  using D = dev_t<T>;
  using State = typename Red::State;
  if (p.M == 0) return;
  const Device dev = x.device();
  const cudaStream_t stream = stream_of(dev);
  const D* xp = static_cast<const D*>(x.raw_data());
  // Columns when the innermost kept dim has the smaller stride (or nothing is reduced).
  const bool columns =
      p.nk > 0 && p.R > 0 && (p.nr == 0 || stride_key(p.kxs[p.nk - 1]) < stride_key(p.rst[p.nr - 1]));
  int64_t K;
  dim3 block, grid;
  if (columns) {
    const int64_t I = p.ksz[p.nk - 1];
    const int64_t units = p.M / I * ((I + kColWidth - 1) / kColWidth);
    K = chunks_for(units, p.R, 4096);
    const int64_t Rc = (p.R + K - 1) / K;
    const int BY = pow2_at_least((Rc + 7) / 8, kMaxColRows);
    block = dim3(kColWidth, unsigned(BY));
    grid = dim3(grid_for(units * K, 1));
  } else {
    K = chunks_for(p.M, p.R, 8192);
    const int64_t Rc = (p.R + K - 1) / K;
    const int G = pow2_at_least((Rc + 3) / 4, kRowThreads);
    block = dim3(unsigned(G), unsigned(kRowThreads / G));
    grid = dim3(grid_for(p.M * K, kRowThreads / G));
  }
  Tensor partial;
  State* pp = nullptr;
  if (K > 1) {
    partial = empty({int64_t(sizeof(State)) * p.M * K}, TensorOptions().dtype(kUInt8).device(dev));
    pp = static_cast<State*>(partial.raw_data());
  }
  if (columns) launch(reduce_cols_kernel<D, Red, Out>, grid, block, 0, stream, xp, p, red, out, K, pp);
  else launch(reduce_rows_kernel<D, Red, Out>, grid, block, 0, stream, xp, p, red, out, K, pp);
  check_launch(name, dev.index);
  if (K > 1) {
    const int G = pow2_at_least((K + 3) / 4, kRowThreads);
    launch(reduce_merge_kernel<Red, Out>, grid_for(p.M, kRowThreads / G), dim3(unsigned(G), unsigned(kRowThreads / G)), 0, stream,
           p, red, out, K, pp);
    check_launch(name, dev.index);
  }
  // `partial` is freed on the stream after the kernels that use it.
}

template <class T>
dev_t<T>* out_ptr(const Tensor& t) {
  return static_cast<dev_t<T>*>(t.raw_data());
}

void check_out(const Tensor& out, DType expected, const char* op) {
  AG_CHECK(out.dtype() == expected, op, "the output must be ", dtype_name(expected), ", got ",
           dtype_name(out.dtype()));
}

template <class T, class Red>
void reduce_into(const char* name, const Tensor& x, const ReduceLayout& p, const Red& red, const Tensor& out) {
  run_reduce<T>(name, x, p, red, ValueOut<dev_t<T>>{out_ptr<T>(out)});
}

// First pass of Var / LogSumExp: one accumulation-type value per output, in a temporary.
template <class T, class Red>
Tensor reduce_to_temp(const char* name, const Tensor& x, const ReduceLayout& p, const Red& red) {
  using A = acc_type_t<T>;
  Tensor t = empty({p.M}, TensorOptions().dtype(dtype_of<A>).device(x.device()));
  run_reduce<T>(name, x, p, red, ValueOut<A>{static_cast<A*>(t.raw_data())});
  return t;
}

template <class T>
void reduce_floating(ReduceOp op, const Tensor& x, const ReduceLayout& p, const Tensor& out, ReduceParams prm) {
  using A = acc_type_t<T>;
  const char* name = op_name(op);
  check_out(out, dtype_of<T>, name);
  switch (op) {
    case ReduceOp::Mean:
      return reduce_into<T>(name, x, p, SumReducer<A, SumKind::Mean>{}, out);
    case ReduceOp::Var: {
      const Tensor mean = reduce_to_temp<T>(name, x, p, SumReducer<A, SumKind::Mean>{});
      SumReducer<A, SumKind::SqDev> r;
      r.param = static_cast<const A*>(mean.raw_data());
      r.correction = prm.correction;
      return reduce_into<T>(name, x, p, r, out);
    }
    case ReduceOp::LogSumExp: {
      const Tensor mx = reduce_to_temp<T>(name, x, p, ExtremumReducer<A, true, false>{});
      SumReducer<A, SumKind::ExpShift> r;
      r.param = static_cast<const A*>(mx.raw_data());
      return reduce_into<T>(name, x, p, r, out);
    }
    case ReduceOp::Norm: {
      const double q = prm.p;
      if (std::isinf(q) && q > 0) return reduce_into<T>(name, x, p, ExtremumReducer<A, true, false, true>{}, out);
      if (std::isinf(q)) return reduce_into<T>(name, x, p, ExtremumReducer<A, false, false, true>{}, out);
      if (q == 0) return reduce_into<T>(name, x, p, SumReducer<A, SumKind::NonZero>{}, out);
      if (q == 1) return reduce_into<T>(name, x, p, SumReducer<A, SumKind::AbsSum>{}, out);
      if (q == 2) return reduce_into<T>(name, x, p, SumReducer<A, SumKind::SqSum>{}, out);
      SumReducer<A, SumKind::PowSum> r;
      r.p = A(q);
      return reduce_into<T>(name, x, p, r, out);
    }
    default: AG_ERROR(name, "not a floating-only reduction");
  }
}

template <class T>
void reduce_sum(const char* name, const Tensor& x, const ReduceLayout& p, const Tensor& out) {
  using A = acc_type_t<T>;
  if constexpr (std::is_floating_point_v<A>) {
    check_out(out, dtype_of<T>, name);
    reduce_into<T>(name, x, p, SumReducer<A, SumKind::Sum>{}, out);
  } else {  // integral and bool sums count in int64, like PyTorch
    check_out(out, kInt64, name);
    run_reduce<T>(name, x, p, SumReducer<int64_t, SumKind::Sum>{}, ValueOut<int64_t>{out.data_ptr<int64_t>()});
  }
}

template <class T>
void reduce_extremum(ReduceOp op, const Tensor& x, const ReduceLayout& p, const Tensor& out) {
  using A = acc_type_t<T>;
  const char* name = op_name(op);
  if (op == ReduceOp::Max || op == ReduceOp::Min) {
    check_out(out, dtype_of<T>, name);
    if (op == ReduceOp::Max) reduce_into<T>(name, x, p, ExtremumReducer<A, true, false>{}, out);
    else reduce_into<T>(name, x, p, ExtremumReducer<A, false, false>{}, out);
  } else {
    check_out(out, kInt64, name);
    const IndexOut o{out.data_ptr<int64_t>()};
    if (op == ReduceOp::ArgMax) run_reduce<T>(name, x, p, ExtremumReducer<A, true, true>{}, o);
    else run_reduce<T>(name, x, p, ExtremumReducer<A, false, true>{}, o);
  }
}

template <class T>
void max_min_typed(bool is_max, const char* name, const Tensor& x, const ReduceLayout& p, const Tensor& values,
                   const Tensor& indices) {
  using A = acc_type_t<T>;
  check_out(values, dtype_of<T>, name);
  check_out(indices, kInt64, name);
  const ValueIndexOut<dev_t<T>> o{out_ptr<T>(values), indices.data_ptr<int64_t>()};
  if (is_max) run_reduce<T>(name, x, p, ExtremumReducer<A, true, true>{}, o);
  else run_reduce<T>(name, x, p, ExtremumReducer<A, false, true>{}, o);
}

}  // namespace

void CudaBackend::reduce(ReduceOp op, const Tensor& x, const Shape& dims, const Tensor& out,
                         ReduceParams prm) {
  const char* name = op_name(op);
  const bool order_free = op != ReduceOp::ArgMax && op != ReduceOp::ArgMin;
  const ReduceLayout p = make_layout(x, dims, order_free);
  DeviceGuard guard(x.device().index, name);
  switch (op) {
    case ReduceOp::Sum:
      return dispatch_all(x.dtype(), name, [&]<class T>() { reduce_sum<T>(name, x, p, out); });
    case ReduceOp::Max:
    case ReduceOp::Min:
    case ReduceOp::ArgMax:
    case ReduceOp::ArgMin:
      return dispatch_all(x.dtype(), name, [&]<class T>() { reduce_extremum<T>(op, x, p, out); });
    default:
      return dispatch_floating(x.dtype(), name, [&]<class T>() { reduce_floating<T>(op, x, p, out, prm); });
  }
}

void CudaBackend::max_min_dim(bool is_max, const Tensor& x, int64_t dim, const Tensor& values,
                              const Tensor& indices) {
  const char* name = is_max ? op::max : op::min;
  const ReduceLayout p = make_layout(x, Shape{dim}, false);
  DeviceGuard guard(x.device().index, name);
  dispatch_all(x.dtype(), name, [&]<class T>() { max_min_typed<T>(is_max, name, x, p, values, indices); });
}

}  // namespace ampgrad::cuda
