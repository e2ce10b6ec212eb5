// Elementwise functors: the single definition of what each unary, binary and comparison op
// computes, shared by every backend (AG_HOST_DEVICE makes them callable from CUDA).
//
// Each functor is specialised on its op enum (core/include/ampgrad/op_kinds.h); backends
// generate their dispatch from the same X-macro lists, so a missing functor fails to
// compile. Functors compute in the accumulation type A (float for float16, bfloat16 and
// float32; double for float64; the integer type for integral tensors); kFloatOnly marks
// math that the frontend only sends floating tensors to.
#pragma once

#include <cmath>
#include <type_traits>

#include "ampgrad/dtype.h"
#include "ampgrad/host_device.h"
#include "ampgrad/op_kinds.h"

namespace ampgrad::kernels {

// Integer arithmetic wraps around on overflow (two's complement), as PyTorch's does. It is
// done in the unsigned type because signed overflow is undefined behaviour in C++ (the
// compiler may assume it never happens); floating types compute as written.
template <class A>
AG_HOST_DEVICE A wrap_add(A a, A b) {
  if constexpr (std::is_integral_v<A> && std::is_signed_v<A>) return A(std::make_unsigned_t<A>(a) + std::make_unsigned_t<A>(b));
  else return A(a + b);
}
template <class A>
AG_HOST_DEVICE A wrap_sub(A a, A b) {
  if constexpr (std::is_integral_v<A> && std::is_signed_v<A>) return A(std::make_unsigned_t<A>(a) - std::make_unsigned_t<A>(b));
  else return A(a - b);
}
template <class A>
AG_HOST_DEVICE A wrap_mul(A a, A b) {
  if constexpr (std::is_integral_v<A> && std::is_signed_v<A>) return A(std::make_unsigned_t<A>(a) * std::make_unsigned_t<A>(b));
  else return A(a * b);
}

template <UnaryOp Op>
struct UnaryFn;
template <BinaryOp Op>
struct BinaryFn;
template <CompareOp Op>
struct CompareFn;

#define AG_UNARY_FN(NAME, FLOAT_ONLY, ...)                  \
  template <>                                                \
  struct UnaryFn<UnaryOp::NAME> {                            \
    static constexpr bool kFloatOnly = FLOAT_ONLY;           \
    UnaryParams p;                                           \
    template <class A>                                       \
    AG_HOST_DEVICE A operator()(A x) const {                 \
      __VA_ARGS__                                            \
    }                                                        \
  };

// -x of the most negative integer wraps to itself, as in PyTorch; -0.0 stays a negative zero.
AG_UNARY_FN(Neg, false, if constexpr (std::is_integral_v<A>) return wrap_sub(A(0), x); else return -x;)
AG_UNARY_FN(Abs, false, if constexpr (std::is_unsigned_v<A>) return x; else if constexpr (std::is_integral_v<A>) return x < A(0) ? wrap_sub(A(0), x) : x; else return x < A(0) ? A(-x) : x;)
AG_UNARY_FN(Sign, false, if constexpr (std::is_unsigned_v<A>) return A(x != A(0)); else return A((A(0) < x) - (x < A(0)));)
AG_UNARY_FN(Square, false, return wrap_mul(x, x);)
AG_UNARY_FN(Sqrt, true, return std::sqrt(x);)
AG_UNARY_FN(Rsqrt, true, return A(1) / std::sqrt(x);)
AG_UNARY_FN(Reciprocal, true, return A(1) / x;)
AG_UNARY_FN(Exp, true, return std::exp(x);)
AG_UNARY_FN(Log, true, return std::log(x);)
AG_UNARY_FN(Log1p, true, return std::log1p(x);)
AG_UNARY_FN(Tanh, true, return std::tanh(x);)
AG_UNARY_FN(Sigmoid, true, return A(1) / (A(1) + std::exp(-x));)
// x < 0 ? 0 : x keeps NaN, as PyTorch's relu does.
AG_UNARY_FN(Relu, false, if constexpr (std::is_unsigned_v<A>) return x; else return x < A(0) ? A(0) : x;)
// GELU as 0.5 x erfc(-x / sqrt2) = 0.5 x (1 + erf(x / sqrt2)), and the tanh form as
// x / (1 + e^(-2u)) = 0.5 x (1 + tanh(u)): the same functions without the cancellation of
// 1 + erf or 1 + tanh near -1, so negative inputs keep their relative accuracy.
AG_UNARY_FN(GeluErf, true, return A(0.5) * x * std::erfc(x * A(-0.70710678118654752440));)
AG_UNARY_FN(GeluTanh, true, {
  const A k = A(0.79788456080286535588);  // sqrt(2/pi)
  return x / (A(1) + std::exp(A(-2) * k * (x + A(0.044715) * x * x * x)));
})
AG_UNARY_FN(Silu, true, return x / (A(1) + std::exp(-x));)
// log(1 + e^x) as max(x, 0) + log1p(e^-|x|): no overflow for large x, and full relative
// accuracy for very negative x (where the value is about e^x).
AG_UNARY_FN(Softplus, true, return (x > A(0) ? x : A(0)) + std::log1p(std::exp(x < A(0) ? x : A(-x)));)
AG_UNARY_FN(PowScalar, true, {
  const A e = A(p.a);
  if (e == A(2)) return x * x;
  if (e == A(1)) return x;
  if (e == A(0.5)) return std::sqrt(x);
  return std::pow(x, e);
})
// NaN in x stays NaN (both comparisons are false).
AG_UNARY_FN(Clamp, false, {
  if constexpr (std::is_floating_point_v<A>) {
    const A lo = A(p.a), hi = A(p.b);
    return x < lo ? lo : (x > hi ? hi : x);
  } else {
    const double d = double(x);
    return d < p.a ? A(std::ceil(p.a)) : (d > p.b ? A(std::floor(p.b)) : x);
  }
})
#undef AG_UNARY_FN

#define AG_BINARY_FN(NAME, FLOAT_ONLY, ...)                 \
  template <>                                                \
  struct BinaryFn<BinaryOp::NAME> {                          \
    static constexpr bool kFloatOnly = FLOAT_ONLY;           \
    template <class A>                                       \
    AG_HOST_DEVICE A operator()(A a, A b) const {            \
      __VA_ARGS__                                            \
    }                                                        \
  };

AG_BINARY_FN(Add, false, return wrap_add(a, b);)
AG_BINARY_FN(Sub, false, return wrap_sub(a, b);)
AG_BINARY_FN(Mul, false, return wrap_mul(a, b);)
AG_BINARY_FN(Div, true, return a / b;)
AG_BINARY_FN(Pow, true, return std::pow(a, b);)
// NaN-propagating, like torch.maximum / torch.minimum.
AG_BINARY_FN(Maximum, false, if constexpr (std::is_floating_point_v<A>) { if (a != a) return a; if (b != b) return b; } return a > b ? a : b;)
AG_BINARY_FN(Minimum, false, if constexpr (std::is_floating_point_v<A>) { if (a != a) return a; if (b != b) return b; } return a < b ? a : b;)
// Fused activation gradients: a is the incoming gradient, b the saved input (or output).
AG_BINARY_FN(ReluBackward, true, return b > A(0) ? a : A(0);)
AG_BINARY_FN(GeluErfBackward, true, {
  const A cdf = A(0.5) * std::erfc(b * A(-0.70710678118654752440));
  const A pdf = std::exp(A(-0.5) * b * b) * A(0.39894228040143267794);  // 1/sqrt(2 pi)
  return a * (cdf + b * pdf);
})
AG_BINARY_FN(GeluTanhBackward, true, {
  const A k = A(0.79788456080286535588), c = A(0.044715);
  const A t = std::tanh(k * (b + c * b * b * b));
  return a * (A(0.5) * (A(1) + t) + A(0.5) * b * (A(1) - t * t) * k * (A(1) + A(3) * c * b * b));
})
AG_BINARY_FN(SiluBackward, true, {
  const A s = A(1) / (A(1) + std::exp(-b));
  return a * s * (A(1) + b * (A(1) - s));
})
AG_BINARY_FN(SigmoidBackward, true, return a * b * (A(1) - b);)  // b = sigmoid(x)
AG_BINARY_FN(TanhBackward, true, return a * (A(1) - b * b);)      // b = tanh(x)
#undef AG_BINARY_FN

#define AG_COMPARE_FN(NAME, ...)                            \
  template <>                                                \
  struct CompareFn<CompareOp::NAME> {                        \
    template <class A>                                       \
    AG_HOST_DEVICE bool operator()(A a, A b) const {         \
      __VA_ARGS__                                            \
    }                                                        \
  };
AG_COMPARE_FN(Eq, return a == b;)
AG_COMPARE_FN(Ne, return a != b;)
AG_COMPARE_FN(Lt, return a < b;)
AG_COMPARE_FN(Le, return a <= b;)
AG_COMPARE_FN(Gt, return a > b;)
AG_COMPARE_FN(Ge, return a >= b;)
AG_COMPARE_FN(LogicalAnd, return (a != A(0)) && (b != A(0));)
AG_COMPARE_FN(LogicalOr, return (a != A(0)) || (b != A(0));)
#undef AG_COMPARE_FN

/// Runs run.template operator()<T>() for dtype dt where the op of functor Fn is defined:
/// floating dtypes for a kFloatOnly functor, every dtype but bool otherwise (each backend's
/// elementwise dispatch, so that both refuse the same dtypes with the same message).
template <class Fn, class Run>
void dispatch_for(DType dt, const char* op, const Run& run) {
  if constexpr (Fn::kFloatOnly) {
    dispatch_floating(dt, op, run);
  } else {
    dispatch_all(dt, op, [&]<class T>() {
      if constexpr (std::is_same_v<T, bool>) AG_ERROR(op, "not defined for bool tensors");
      else run.template operator()<T>();
    });
  }
}

}  // namespace ampgrad::kernels
