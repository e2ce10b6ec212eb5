// Typed element access for CPU kernels.
//
// cast<D>(s) converts between any two storage types (16-bit floats go through float).
// load_acc/store_acc move a run of n elements between storage of type T (any byte stride)
// and a buffer of its accumulation type; for float16/bfloat16 with unit stride they use
// the bulk (F16C / AVX512-BF16) conversions, so half kernels compute on float chunks.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ampgrad/convert.h"
#include "ampgrad/dtype.h"

namespace ampgrad::cpu {

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

/// Elements per chunk when 16-bit floats are widened to float for computation.
inline constexpr int64_t kChunk = 256;

template <class D, class S>
inline D cast(S s) {
  if constexpr (std::is_same_v<D, S>) {
    return s;
  } else if constexpr (std::is_same_v<D, bool>) {
    if constexpr (is_half_v<S>) return float(s) != 0.0f;
    else return s != S(0);
  } else if constexpr (is_half_v<S>) {
    return cast<D>(float(s));
  } else if constexpr (is_half_v<D>) {
    return D(float(s));
  } else {
    return static_cast<D>(s);
  }
}

template <class T, class A = acc_type_t<T>>
inline void load_acc(const char* p, int64_t stride, A* dst, int64_t n) {
  if constexpr (is_half_v<T>) {
    if (stride == int64_t(sizeof(T))) {
      convert(reinterpret_cast<const T*>(p), dst, size_t(n));
      return;
    }
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = cast<A>(*reinterpret_cast<const T*>(p + i * stride));
}

template <class T, class A = acc_type_t<T>>
inline void store_acc(const A* src, char* p, int64_t stride, int64_t n) {
  if constexpr (is_half_v<T>) {
    if (stride == int64_t(sizeof(T))) {
      convert(src, reinterpret_cast<T*>(p), size_t(n));
      return;
    }
  }
  for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p + i * stride) = cast<T>(src[i]);
}

}  // namespace ampgrad::cpu
