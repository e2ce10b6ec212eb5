// cast<D>(s): the one conversion between any two element types of the dtypes, used by
// every backend's host code and by the CPU's kernels: bool is "!= 0", the 16-bit floats go
// through float (so a double is rounded twice, as a float16 tensor made from a float64 one
// is everywhere), a floating value becomes an integer as float_to_integral says, the rest
// is a static_cast. CUDA device code has its own convert<> with the same rules on the
// hardware conversions (kernels/cuda/common.cuh).
#pragma once

#include <cstdint>
#include <type_traits>

#include "ampgrad/half.h"
#include "ampgrad/host_device.h"

namespace ampgrad::kernels {

/// A floating value as the integral type D, defined for every input (a plain static_cast
/// is undefined behaviour out of D's range): truncated toward zero to int64, then wrapped
/// to D, as PyTorch's CPU converts (-2.5 to uint8 is 254). NaN and values outside int64
/// give INT64_MIN, wrapped (x86's "integer indefinite", what PyTorch's CPU gives too).
template <class D, class S>
AG_HOST_DEVICE inline D float_to_integral(S s) {
  static_assert(std::is_integral_v<D> && !std::is_same_v<D, bool> && std::is_floating_point_v<S>);
  // 2^63 is exact in float and double; the range test is false for NaN.
  const int64_t v = s >= S(-9223372036854775808.0) && s < S(9223372036854775808.0) ? int64_t(s) : INT64_MIN;
  return static_cast<D>(v);  // modular since C++20
}

template <class D, class S>
inline D cast(S s) {
  if constexpr (std::is_same_v<D, S>) {
    return s;
  } else if constexpr (std::is_same_v<D, bool>) {
    if constexpr (is_float16_v<S>) return float(s) != 0.0f;
    else return s != S(0);
  } else if constexpr (is_float16_v<S>) {
    return cast<D>(float(s));
  } else if constexpr (is_float16_v<D>) {
    return D(float(s));
  } else if constexpr (std::is_integral_v<D> && std::is_floating_point_v<S>) {
    return float_to_integral<D>(s);
  } else {
    return static_cast<D>(s);
  }
}

}  // namespace ampgrad::kernels
