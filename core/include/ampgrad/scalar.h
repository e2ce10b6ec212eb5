// Scalar: a C++ number passed to an op (t + 1, clamp(t, 0.0, 6.0)).
//
// It remembers whether it was written as a bool, an integer or a floating value, because
// promotion depends on it: an integral tensor plus 0.5 computes in the default floating
// dtype, while a float16 tensor times 2.0 stays float16 (a scalar never widens a tensor of
// the same category).
#pragma once

#include <cstdint>
#include <type_traits>

#include "ampgrad/dtype.h"

namespace ampgrad {

struct Scalar {
  enum class Kind : uint8_t { Bool, Integral, Floating };
  double value = 0;
  Kind kind = Kind::Floating;

  Scalar() = default;
  template <class T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
  Scalar(T v)  // NOLINT: implicit on purpose
      : value(static_cast<double>(v)),
        kind(std::is_same_v<T, bool>          ? Kind::Bool
             : std::is_integral_v<T>          ? Kind::Integral
                                              : Kind::Floating) {}
  Scalar(Half v) : value(float(v)), kind(Kind::Floating) {}      // NOLINT
  Scalar(BFloat16 v) : value(float(v)), kind(Kind::Floating) {}  // NOLINT

  double to_double() const { return value; }
  bool is_floating() const { return kind == Kind::Floating; }
};

/// The dtype of `tensor_dtype OP scalar`: the tensor's dtype unless the scalar belongs to a
/// higher category (floating over integral over bool).
inline DType result_type(DType tensor_dtype, const Scalar& s) {
  if (s.kind == Scalar::Kind::Floating && !is_floating(tensor_dtype)) return get_default_dtype();
  if (s.kind == Scalar::Kind::Integral && tensor_dtype == kBool) return kInt64;
  return tensor_dtype;
}

}  // namespace ampgrad
