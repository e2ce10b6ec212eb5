// Elementwise kernels of the CUDA backend: copy, fill, unary, binary, compare and where.
//
// Every entry is one map, out[i] = f(in[0][i], ...), over the tensor operands, with f a
// named functor struct (nvcc refuses __device__ lambdas inside the generic lambdas of the
// dtype dispatch). The math is kernels/functors.h's, the same the CPU runs: f converts
// each loaded element to the compute type (dacc_t: float for float16, bfloat16 and
// float32, double for float64, the integer type for integers) with the hardware
// conversions of convert<>, applies the functor, and converts once on store. A scalar
// operand is converted on the host as the CPU converts it (host_scalar) and bound into f,
// so it is a kernel argument in a register and the map runs over the tensors alone.
//
// Two kernels serve every map:
//  * map_dense_kernel, when every tensor operand is dense in one order and aligned: each
//    thread moves 16 bytes of its widest operand per access (4 floats, 8 halves; narrower
//    operands by the same element count), plus a scalar tail;
//  * map_strided_kernel otherwise: the coalesced StridedLayout of kernels/layout.h passed
//    by value, byte offsets from offsets_of.
// Both are grid-stride loops on 64-bit indices, launched on the current stream of the
// output's device under a DeviceGuard, each launch followed by check_launch.
//
// Dtype rules and errors are the CPU's (kernels/cpu/elementwise.cpp): kFloatOnly
// functors dispatch on the floating dtypes, the others on every dtype but bool; compare
// and where take every dtype. Results agree with the CPU's to the rounding of the
// device's math library and of FMA contraction (see common.cuh on NaN payloads).
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "cuda/common.cuh"
#include "cuda/cuda_backend.h"
#include "functors.h"

namespace ampgrad::cuda {
namespace {

using kernels::dispatch_for;
using kernels::StridedLayout;

// ---- the map kernels ------------------------------------------------------------------------

template <class T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

constexpr size_t max_size(std::initializer_list<size_t> sizes) {
  size_t m = 1;
  for (size_t s : sizes) m = s > m ? s : m;
  return m;
}

/// Elements per thread and access in the dense kernel: 16 bytes of the widest operand.
template <class O, class... Ins>
inline constexpr int kVecWidth = int(16 / max_size({sizeof(O), sizeof(Ins)...}));

template <int V, class O, class F, class... Ins>
__device__ __forceinline__ void apply_vec(const F& f, O* out, const Vec<Ins, V>&... xs) {
  Vec<O, V> o;
#pragma unroll
  for (int j = 0; j < V; ++j) o.v[j] = f(xs.v[j]...);
  *reinterpret_cast<Vec<O, V>*>(out) = o;
}

// out[i] = f(in[i]...) for dense operands whose addresses are aligned to their Vec.
template <class O, class F, class... Ins>
__global__ void map_dense_kernel(F f, int64_t n, O* out, const Ins*... in) {
  constexpr int V = kVecWidth<O, Ins...>;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / V;
  for (int64_t v = tid; v < nvec; v += stride) {
    const int64_t i = v * V;
    apply_vec<V>(f, out + i, *reinterpret_cast<const Vec<Ins, V>*>(in + i)...);
  }
  for (int64_t i = nvec * V + tid; i < n; i += stride) out[i] = f(in[i]...);
}

template <class O, class... Ins, class F, size_t... I>
__device__ __forceinline__ void apply_at(const F& f, char* const* base, const int64_t* off,
                                         std::index_sequence<I...>) {
  *reinterpret_cast<O*>(base[0] + off[0]) = f(*reinterpret_cast<const Ins*>(base[I + 1] + off[I + 1])...);
}

// The same map over any strides (broadcast inputs have stride 0).
template <class O, class F, class... Ins>
__global__ void map_strided_kernel(StridedLayout<1 + int(sizeof...(Ins))> L, F f) {
  constexpr int N = 1 + int(sizeof...(Ins));
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < L.numel; i += stride) {
    int64_t off[N];
    offsets_of(L, i, off);
    apply_at<O, Ins...>(f, L.base, off, std::index_sequence_for<Ins...>());
  }
}

/// out = f(in...) where O and Ins... are the device storage types of out and the tensor
/// operands `in` (broadcast to out's shape already).
template <class O, class... Ins, class F>
void launch_map(const char* op, const F& f, const Tensor& out,
                const std::array<const Tensor*, sizeof...(Ins)>& in) {
  constexpr int K = int(sizeof...(Ins));
  constexpr int N = K + 1;
  std::array<const Tensor*, N> ops{};
  ops[0] = &out;
  std::copy(in.begin(), in.end(), ops.begin() + 1);
  const StridedLayout<N> L = kernels::make_layout<N>(ops);
  if (L.numel == 0) return;
  const int dev = out.device().index;
  DeviceGuard guard(dev, op);
  const cudaStream_t stream = stream_of(out.device());

  constexpr int V = kVecWidth<O, Ins...>;
  constexpr size_t item[N] = {sizeof(O), sizeof(Ins)...};
  bool dense = true;
  for (int k = 0; k < N; ++k)
    dense = dense && kernels::is_dense(L, k, int64_t(item[k])) &&
            reinterpret_cast<uintptr_t>(L.base[k]) % (item[k] * V) == 0;
  if (dense) {
    const unsigned blocks = blocks_for((L.numel + V - 1) / V);
    [&]<size_t... I>(std::index_sequence<I...>) {
      launch(map_dense_kernel<O, F, Ins...>, blocks, kThreads, 0, stream,
             f, L.numel, reinterpret_cast<O*>(L.base[0]), reinterpret_cast<const Ins*>(L.base[I + 1])...);
    }(std::index_sequence_for<Ins...>());
  } else {
    launch(map_strided_kernel<O, F, Ins...>, blocks_for(L.numel), kThreads, 0, stream, L, f);
  }
  check_launch(op, dev);
}

// ---- element functors -------------------------------------------------------------------------
// O: the output's storage type; A: the compute type; Fn: the op's functor.

template <class O, class A, class Fn>
struct UnaryMap {
  Fn fn;
  template <class In>
  __device__ O operator()(In x) const {
    return convert<O>(fn(convert<A>(x)));
  }
};

template <class O, class A, class Fn>
struct BinaryMap {
  Fn fn;
  template <class In>
  __device__ O operator()(In x, In y) const {
    return convert<O>(fn(convert<A>(x), convert<A>(y)));
  }
};

// b is a scalar, already in the compute type.
template <class O, class A, class Fn>
struct BinaryScalarRight {
  Fn fn;
  A b;
  template <class In>
  __device__ O operator()(In x) const {
    return convert<O>(fn(convert<A>(x), b));
  }
};

// a is a scalar, already in the compute type.
template <class O, class A, class Fn>
struct BinaryScalarLeft {
  Fn fn;
  A a;
  template <class In>
  __device__ O operator()(In y) const {
    return convert<O>(fn(a, convert<A>(y)));
  }
};

// where moves elements as stored (no conversion; NaN payloads are kept).
template <class D>
struct WhereTT {
  __device__ D operator()(bool c, D x, D y) const { return c ? x : y; }
};
template <class D>
struct WhereST {
  D a;
  __device__ D operator()(bool c, D y) const { return c ? a : y; }
};
template <class D>
struct WhereTS {
  D b;
  __device__ D operator()(bool c, D x) const { return c ? x : b; }
};
template <class D>
struct WhereSS {
  D a, b;
  __device__ D operator()(bool c) const { return c ? a : b; }
};

template <class D>
struct ConvertTo {
  template <class S>
  __device__ D operator()(S x) const {
    return convert<D>(x);
  }
};

template <class D>
struct Constant {
  D v;
  __device__ D operator()() const { return v; }
};

// ---- host helpers ---------------------------------------------------------------------------------

/// A host value of T as the device storage type holds it (same bits).
template <class T>
dev_t<T> to_storage(const T& v) {
  static_assert(sizeof(dev_t<T>) == sizeof(T) && std::is_trivially_copyable_v<T>);
  dev_t<T> d;
  std::memcpy(static_cast<void*>(&d), &v, sizeof d);
  return d;
}

/// A scalar operand as stored in a tensor of dtype T (converted as fill converts).
template <class T>
dev_t<T> storage_scalar(const Operand& s) {
  return to_storage<T>(s.is_integer() ? kernels::cast<T>(s.int_value()) : kernels::cast<T>(s.value()));
}

// The tensor among a and b that gives a binary or compare kernel its dtype.
const Tensor& tensor_operand(const Operand& a, const Operand& b, const char* op) {
  AG_CHECK(!a.is_scalar() || !b.is_scalar(), op, "expected at least one tensor operand, got two scalars");
  return a.is_scalar() ? b.tensor() : a.tensor();
}

// out = fn(a, b) for operands of host type T and an output of host type OT (T, or bool).
template <class T, class OT, class Fn>
void binary_kernel(const char* op, const Operand& a, const Operand& b, const Tensor& out, const Fn fn) {
  using D = dev_t<T>;
  using O = dev_t<OT>;
  using A = dacc_t<D>;
  if (b.is_scalar()) {
    launch_map<O, D>(op, BinaryScalarRight<O, A, Fn>{fn, host_scalar<T>(b)}, out, {&a.tensor()});
  } else if (a.is_scalar()) {
    launch_map<O, D>(op, BinaryScalarLeft<O, A, Fn>{fn, host_scalar<T>(a)}, out, {&b.tensor()});
  } else {
    launch_map<O, D, D>(op, BinaryMap<O, A, Fn>{fn}, out, {&a.tensor(), &b.tensor()});
  }
}

template <class T>
void where_kernel(const Tensor& cond, const Operand& a, const Operand& b, const Tensor& out) {
  using D = dev_t<T>;
  const char* op = ampgrad::op::where;
  if (a.is_scalar() && b.is_scalar()) {
    launch_map<D, bool>(op, WhereSS<D>{storage_scalar<T>(a), storage_scalar<T>(b)}, out, {&cond});
  } else if (a.is_scalar()) {
    launch_map<D, bool, D>(op, WhereST<D>{storage_scalar<T>(a)}, out, {&cond, &b.tensor()});
  } else if (b.is_scalar()) {
    launch_map<D, bool, D>(op, WhereTS<D>{storage_scalar<T>(b)}, out, {&cond, &a.tensor()});
  } else {
    launch_map<D, bool, D, D>(op, WhereTT<D>{}, out, {&cond, &a.tensor(), &b.tensor()});
  }
}


}  // namespace

void CudaBackend::copy(const Tensor& src, const Tensor& dst) {
  dispatch_all(dst.dtype(), "copy", [&]<class DT>() {
    dispatch_all(src.dtype(), "copy", [&]<class ST>() {
      using D = dev_t<DT>;
      using S = dev_t<ST>;
      if constexpr (std::is_same_v<D, S>) {
        // Same dtype, both dense and in one order: a plain device-to-device copy.
        const StridedLayout<2> L = kernels::make_layout<2>({&dst, &src});
        if (L.numel > 0 && kernels::is_dense(L, 0, sizeof(D)) && kernels::is_dense(L, 1, sizeof(D))) {
          if (L.base[0] == L.base[1]) return;  // a tensor copied onto itself
          const int dev = dst.device().index;
          DeviceGuard guard(dev, "copy");
          AG_CUDA_CHECK("copy", cudaMemcpyAsync(L.base[0], L.base[1], size_t(L.numel) * sizeof(D),
                                                cudaMemcpyDeviceToDevice, stream_of(dst.device())));
          return;
        }
      }
      launch_map<D, S>("copy", ConvertTo<D>{}, dst, {&src});
    });
  });
}

void CudaBackend::fill(const Tensor& dst, double value) {
  dispatch_all(dst.dtype(), "fill", [&]<class T>() {
    using D = dev_t<T>;
    launch_map<D>("fill", Constant<D>{to_storage<T>(kernels::cast<T>(value))}, dst, {});
  });
}

void CudaBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out, UnaryParams p) {
  switch (op) {
#define AG_CASE(NAME)                                                                   \
  case UnaryOp::NAME: {                                                                 \
    using Fn = kernels::UnaryFn<UnaryOp::NAME>;                                         \
    const Fn fn{p};                                                                     \
    return dispatch_for<Fn>(x.dtype(), op_name(op), [&]<class T>() {                    \
      using D = dev_t<T>;                                                               \
      launch_map<D, D>(op_name(op), UnaryMap<D, dacc_t<D>, Fn>{fn}, out, {&x});         \
    });                                                                                 \
  }
    AG_UNARY_OPS(AG_CASE)
#undef AG_CASE
  }
}

void CudaBackend::binary(BinaryOp op, const Operand& a, const Operand& b, const Tensor& out) {
  tensor_operand(a, b, op_name(op));
  switch (op) {
#define AG_CASE(NAME)                                                                   \
  case BinaryOp::NAME: {                                                                \
    using Fn = kernels::BinaryFn<BinaryOp::NAME>;                                       \
    return dispatch_for<Fn>(out.dtype(), op_name(op), [&]<class T>() {                  \
      binary_kernel<T, T>(op_name(op), a, b, out, Fn{});                                \
    });                                                                                 \
  }
    AG_BINARY_OPS(AG_CASE)
#undef AG_CASE
  }
}

void CudaBackend::compare(CompareOp op, const Operand& a, const Operand& b, const Tensor& out) {
  const DType dt = tensor_operand(a, b, op_name(op)).dtype();
  switch (op) {
#define AG_CASE(NAME)                                                                   \
  case CompareOp::NAME:                                                                 \
    return dispatch_all(dt, op_name(op), [&]<class T>() {                               \
      binary_kernel<T, bool>(op_name(op), a, b, out, kernels::CompareFn<CompareOp::NAME>{}); \
    });
    AG_COMPARE_OPS(AG_CASE)
#undef AG_CASE
  }
}

void CudaBackend::where(const Tensor& cond, const Operand& a, const Operand& b, const Tensor& out) {
  dispatch_all(out.dtype(), op::where, [&]<class T>() { where_kernel<T>(cond, a, b, out); });
}

}  // namespace ampgrad::cuda
