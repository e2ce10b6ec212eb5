// cast<D>(s): the one conversion between any two element types of the dtypes, used by
// every backend's host code and by the CPU's kernels: bool is "!= 0", the 16-bit floats go
// through float (so a double is rounded twice, as a float16 tensor made from a float64 one
// is everywhere), the rest is a static_cast. CUDA device code has its own convert<> with
// the same rules on the hardware conversions (kernels/cuda/common.cuh).
#pragma once

#include <type_traits>

#include "ampgrad/half.h"

namespace ampgrad::kernels {

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
  } else {
    return static_cast<D>(s);
  }
}

}  // namespace ampgrad::kernels
