// Elementwise kernels: unary, binary, compare and where, each one map_loop (cpu/loops.h)
// instantiated per op from the functors in kernels/functors.h and per dtype by dispatch.
// The transcendental ops on float32, bfloat16 and float16 run the vector math kernels
// (cpu/vmath.h) instead, over whole runs (16-bit runs widened to float in chunks).
// A scalar operand is converted once and bound into the functor, so it is read from a
// register and the loop runs over the tensor operands alone; the functor, and so the
// math, is the same one either way.
#include "cpu/cpu_backend.h"
#include "cpu/loops.h"
#include "cpu/vec.h"
#include "cpu/vmath.h"
#include "functors.h"

namespace ampgrad::cpu {
namespace {

using kernels::BinaryFn;
using kernels::CompareFn;
using kernels::dispatch_for;
using kernels::UnaryFn;

// A scalar operand as a kernel on T reads it: converted to T as fill converts (an integer
// one from int64), then to A, exactly as an element of a tensor of dtype T would be.
template <class T, class A = acc_type_t<T>>
A scalar_value(const Operand& s) {
  const T v = s.is_integer() ? cast<T>(s.int_value()) : cast<T>(s.value());
  return cast<A>(v);
}

// The tensor among a and b that gives a binary or compare kernel its dtype.
const Tensor& tensor_operand(const Operand& a, const Operand& b, const char* op) {
  AG_CHECK(!a.is_scalar() || !b.is_scalar(), op, "expected at least one tensor operand, got two scalars");
  return a.is_scalar() ? b.tensor() : a.tensor();
}

// out = f(a, b) for T operands and an output of type O (T, or bool for comparisons).
template <class T, class O, class F>
void binary_kernel(const Operand& a, const Operand& b, const Tensor& out, const F f) {
  using A = acc_type_t<T>;
  if (b.is_scalar()) {
    const A bv = scalar_value<T>(b);
    map_loop<O, A, T>([f, bv](A x) { return f(x, bv); }, out, {&a.tensor()});
  } else if (a.is_scalar()) {
    const A av = scalar_value<T>(a);
    map_loop<O, A, T>([f, av](A y) { return f(av, y); }, out, {&b.tensor()});
  } else {
    map_loop<O, A, T, T>(f, out, {&a.tensor(), &b.tensor()});
  }
}

// out = cond ? a : b, copying elements as stored (no conversion, NaN payloads kept).
template <class T>
void where_kernel(const Tensor& cond, const Operand& a, const Operand& b, const Tensor& out) {
  if (a.is_scalar() && b.is_scalar()) {
    const T av = scalar_value<T, T>(a), bv = scalar_value<T, T>(b);
    map_loop<T, void, bool>([av, bv](bool c) { return c ? av : bv; }, out, {&cond});
  } else if (a.is_scalar()) {
    const T av = scalar_value<T, T>(a);
    map_loop<T, void, bool, T>([av](bool c, T y) { return c ? av : y; }, out, {&cond, &b.tensor()});
  } else if (b.is_scalar()) {
    const T bv = scalar_value<T, T>(b);
    map_loop<T, void, bool, T>([bv](bool c, T x) { return c ? x : bv; }, out, {&cond, &a.tensor()});
  } else {
    map_loop<T, void, bool, T, T>([](bool c, T x, T y) { return c ? x : y; }, out,
                                  {&cond, &a.tensor(), &b.tensor()});
  }
}


// out = fn(inputs...) through the vector math kernels, for T float, BFloat16 or Half: a
// contiguous float32 run goes straight in; any other run is widened (and gathered) into
// float chunks, computed, and narrowed (and scattered) back.
template <class T, int K>
void vmath_map(vmath::Fn fn, float param, const Tensor& out, const std::array<const Tensor*, K>& in) {
  static_assert(K == 1 || K == 2);
  std::array<const Tensor*, K + 1> ops{&out};
  for (int k = 0; k < K; ++k) ops[size_t(k) + 1] = in[size_t(k)];
  // [=]: param is captured only where the unary branch uses it (binary functions take none)
  const auto run = [=](const float* a, const float* b, float* y, int64_t n) {
    if constexpr (K == 1) vmath::unary(fn, a, y, n, param);
    else vmath::binary(fn, a, b, y, n);
  };
  // Each element costs tens of cycles here, so threads pay off sooner than for a plain loop.
  for_each_strided<K + 1>(ops, [&](char** p, const int64_t* s, int64_t n) {
    constexpr int64_t f = int64_t(sizeof(float));
    if constexpr (std::is_same_v<T, float>) {
      if (s[0] == f && s[1] == f && (K == 1 || s[K] == f)) {
        run(reinterpret_cast<const float*>(p[1]), reinterpret_cast<const float*>(p[K]),
            reinterpret_cast<float*>(p[0]), n);
        return;
      }
    }
    float buf[K][kChunk];
    for (int64_t i = 0; i < n; i += kChunk) {
      const int64_t m = std::min(kChunk, n - i);
      for (int k = 0; k < K; ++k) load_acc<T, float>(p[k + 1] + i * s[k + 1], s[k + 1], buf[k], m);
      run(buf[0], buf[K - 1], buf[0], m);
      store_acc<T, float>(buf[0], p[0] + i * s[0], s[0], m);
    }
  }, kMathGrain);
}

// Runs the vector math kernels for fn on a float32, bfloat16 or float16 output; false (and
// nothing done) when fn is None, the dtype is another, or the kernels are off.
template <int K>
bool try_vmath(vmath::Fn fn, float param, const Tensor& out, const std::array<const Tensor*, K>& in) {
  if (fn == vmath::Fn::None || vmath::active_isa() == vmath::Isa::None) return false;
  switch (out.dtype()) {
    case kFloat32: vmath_map<float, K>(fn, param, out, in); return true;
    case kBFloat16: vmath_map<BFloat16, K>(fn, param, out, in); return true;
    case kFloat16: vmath_map<Half, K>(fn, param, out, in); return true;
    default: return false;
  }
}

}  // namespace

void CpuBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out, UnaryParams p) {
  if (try_vmath<1>(vmath::unary_fn(op, p), float(p.a), out, {&x})) return;
  switch (op) {
#define AG_CASE(NAME)                                                                  \
  case UnaryOp::NAME: {                                                                \
    using Fn = UnaryFn<UnaryOp::NAME>;                                                 \
    const Fn f{p};                                                                     \
    return dispatch_for<Fn>(x.dtype(), op_name(op), [&]<class T>() {                   \
      map_loop<T, acc_type_t<T>, T>(f, out, {&x});                                     \
    });                                                                                \
  }
    AG_UNARY_OPS(AG_CASE)
#undef AG_CASE
  }
}

namespace {

// Calls f.template operator()<T>() with T the storage type of a float32, bfloat16 or
// float16 tensor (binary_widens' operands).
template <class F>
void with_float_storage(DType dt, const char* op, F&& f) {
  switch (dt) {
    case kFloat32: return f.template operator()<float>();
    case kBFloat16: return f.template operator()<BFloat16>();
    case kFloat16: return f.template operator()<Half>();
    default: AG_ERROR(op, "internal: a widened operand must be float32, bfloat16 or float16, got ", dtype_name(dt));
  }
}

// out (float32) = f(a, b) for tensor operands of float32 or 16-bit storage, each widened
// in chunks on the way in (map_loop), as cast_raw would widen it.
template <class F>
void widening_binary(const Tensor& a, const Tensor& b, const Tensor& out, const char* op, const F f) {
  with_float_storage(a.dtype(), op, [&]<class X>() {
    with_float_storage(b.dtype(), op, [&]<class Y>() { map_loop<float, float, X, Y>(f, out, {&a, &b}); });
  });
}

}  // namespace

void CpuBackend::activation_with_slope(Activation act, const Tensor& pre, const Tensor& out) {
  const vmath::Fn fn = vmath::unary_fn(activation_op(act), {});
  const DType dt = pre.dtype();
  const bool vec = fn != vmath::Fn::None && vmath::active_isa() != vmath::Isa::None &&
                   (dt == kFloat32 || dt == kBFloat16 || dt == kFloat16) && pre.is_contiguous() &&
                   out.is_contiguous() && out.dtype() == dt;
  if (!vec) {  // the same two results from the elementwise entries: act, and act' for a gradient of 1
    unary(activation_op(act), pre, out, {});
    binary(activation_backward_op(act), Operand::scalar(1.0), pre, pre);
    return;
  }
  char* const x = static_cast<char*>(pre.raw_data());
  char* const y = static_cast<char*>(out.raw_data());
  const auto run = [&]<class T>() {
    constexpr int64_t sz = int64_t(sizeof(T));
    parallel_for(0, pre.numel(), kMathGrain, [&](int64_t b, int64_t e) {
      if constexpr (std::is_same_v<T, float>) {
        float* xf = reinterpret_cast<float*>(x);
        vmath::with_derivative(fn, xf + b, reinterpret_cast<float*>(y) + b, xf + b, e - b);
      } else {
        float bx[kChunk], by[kChunk];
        for (int64_t i = b; i < e; i += kChunk) {
          const int64_t m = std::min(kChunk, e - i);
          load_acc<T, float>(x + i * sz, sz, bx, m);
          vmath::with_derivative(fn, bx, by, bx, m);
          store_acc<T, float>(by, y + i * sz, sz, m);
          store_acc<T, float>(bx, x + i * sz, sz, m);
        }
      }
    });
  };
  if (dt == kFloat32) run.operator()<float>();
  else if (dt == kBFloat16) run.operator()<BFloat16>();
  else run.operator()<Half>();
}

// The ops whose float32 kernel is the functor alone (no vector math path), so widening in
// the loop gives exactly the cast-then-op result.
bool CpuBackend::binary_widens(BinaryOp op) const {
  return op == BinaryOp::Add || op == BinaryOp::Sub || op == BinaryOp::Mul || op == BinaryOp::Div;
}

void CpuBackend::binary(BinaryOp op, const Operand& a, const Operand& b, const Tensor& out) {
  tensor_operand(a, b, op_name(op));
  if (out.dtype() == kFloat32 && !a.is_scalar() && !b.is_scalar() &&
      (a.tensor().dtype() != kFloat32 || b.tensor().dtype() != kFloat32)) {
    AG_CHECK(binary_widens(op), op_name(op), "internal: operands of ", dtype_name(a.tensor().dtype()), " and ",
             dtype_name(b.tensor().dtype()), " for a float32 result");
    switch (op) {
      case BinaryOp::Add: return widening_binary(a.tensor(), b.tensor(), out, op::add, BinaryFn<BinaryOp::Add>{});
      case BinaryOp::Sub: return widening_binary(a.tensor(), b.tensor(), out, op::sub, BinaryFn<BinaryOp::Sub>{});
      case BinaryOp::Mul: return widening_binary(a.tensor(), b.tensor(), out, op::mul, BinaryFn<BinaryOp::Mul>{});
      default: return widening_binary(a.tensor(), b.tensor(), out, op::div, BinaryFn<BinaryOp::Div>{});
    }
  }
  if (!a.is_scalar() && !b.is_scalar() && try_vmath<2>(vmath::binary_fn(op), 0.0f, out, {&a.tensor(), &b.tensor()}))
    return;
  switch (op) {
#define AG_CASE(NAME)                                                                  \
  case BinaryOp::NAME: {                                                               \
    using Fn = BinaryFn<BinaryOp::NAME>;                                               \
    return dispatch_for<Fn>(out.dtype(), op_name(op),                                  \
                            [&]<class T>() { binary_kernel<T, T>(a, b, out, Fn{}); }); \
  }
    AG_BINARY_OPS(AG_CASE)
#undef AG_CASE
  }
}

void CpuBackend::compare(CompareOp op, const Operand& a, const Operand& b, const Tensor& out) {
  const DType dt = tensor_operand(a, b, op_name(op)).dtype();
  switch (op) {
#define AG_CASE(NAME)                                                                  \
  case CompareOp::NAME:                                                                \
    return dispatch_all(dt, op_name(op), [&]<class T>() {                              \
      binary_kernel<T, bool>(a, b, out, CompareFn<CompareOp::NAME>{});                 \
    });
    AG_COMPARE_OPS(AG_CASE)
#undef AG_CASE
  }
}

void CpuBackend::where(const Tensor& cond, const Operand& a, const Operand& b, const Tensor& out) {
  dispatch_all(out.dtype(), op::where, [&]<class T>() { where_kernel<T>(cond, a, b, out); });
}

}  // namespace ampgrad::cpu
