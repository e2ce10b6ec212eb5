// Typed element access for CPU kernels.
//
// cast<D>(s) (kernels/cast.h) converts between any two storage types.
// load_acc/store_acc move a run of n elements between storage of type T (any byte stride)
// and a buffer of its accumulation type; for float16/bfloat16 with unit stride they use
// the bulk (F16C / AVX512-BF16) conversions, so half kernels compute on float chunks.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ampgrad/convert.h"
#include "ampgrad/dtype.h"
#include "cast.h"

namespace ampgrad::cpu {

/// Former name of is_float16_v (half.h), kept until kernels/cpu/amp.cpp uses that.
template <class T>
inline constexpr bool is_half_v = is_float16_v<T>;

/// Elements per chunk when 16-bit floats are widened to float for computation.
inline constexpr int64_t kChunk = 256;

using kernels::cast;

template <class T, class A = acc_type_t<T>>
inline void load_acc(const char* p, int64_t stride, A* dst, int64_t n) {
  if constexpr (is_float16_v<T>) {
    if (stride == int64_t(sizeof(T))) {
      convert(reinterpret_cast<const T*>(p), dst, size_t(n));
      return;
    }
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = cast<A>(*reinterpret_cast<const T*>(p + i * stride));
}

/// load_acc for rows x cols elements whose rows start row_stride bytes apart (elements
/// stride bytes apart within a row), into dst row-major (rows cols apart). 16-bit rows of
/// unit stride take convert_rows: one dispatch for the matrix, not one per row.
template <class T, class A = acc_type_t<T>>
inline void load_acc_rows(const char* p, int64_t row_stride, int64_t stride, A* dst, int64_t rows, int64_t cols) {
  if constexpr (is_float16_v<T>) {
    if (stride == int64_t(sizeof(T)) && row_stride % int64_t(sizeof(T)) == 0 && row_stride >= 0) {
      convert_rows(reinterpret_cast<const T*>(p), size_t(row_stride) / sizeof(T), dst, size_t(rows), size_t(cols));
      return;
    }
  }
  for (int64_t r = 0; r < rows; ++r) load_acc<T>(p + r * row_stride, stride, dst + r * cols, cols);
}

template <class T, class A = acc_type_t<T>>
inline void store_acc(const A* src, char* p, int64_t stride, int64_t n) {
  if constexpr (is_float16_v<T>) {
    if (stride == int64_t(sizeof(T))) {
      convert(src, reinterpret_cast<T*>(p), size_t(n));
      return;
    }
  }
  for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p + i * stride) = cast<T>(src[i]);
}

/// a * b + c: one fused multiply-add (one rounding) when Fma, else a product and a sum.
/// The library is compiled without contraction (CMakeLists.txt), so a fused multiply-add
/// happens only where written, and a vectorised loop rounds like its scalar twin. Fma is
/// for code compiled for a target that has the instruction; elsewhere it is a library call.
template <bool Fma, class A>
[[gnu::always_inline]] inline A madd(A a, A b, A c) {
  if constexpr (Fma) return std::fma(a, b, c);
  return a * b + c;
}

/// e^x in the accumulation type. For float it is branch-free, so loops calling it
/// vectorise (std::exp stays a scalar library call without -ffast-math): Cody-Waite
/// reduction x = n ln2 + r and Cephes' degree-6 polynomial for e^r, within 1 ulp of
/// std::exp for normal results; results below FLT_MIN flush to 0; inf, -inf and NaN
/// behave like std::exp. double uses std::exp.
/// GCC will not vectorise a float operation that it can move under a condition (it could
/// trap, under the default -ftrapping-math), and it moves any operation whose result only
/// one arm of a ?: uses. So every float operation runs on x unconditionally, n comes from
/// the 1.5 * 2^23 rounding trick (no float-to-int conversion), and the special cases are
/// applied with integer masks at the end.
/// Fma: the reduction and the polynomial as fused multiply-adds (madd), for variants
/// compiled for a target that has them (attention's row work); the default rounds each
/// product and sum, like every path of a build without contraction (CMakeLists.txt).
template <class A, bool Fma = false>
inline A exp_acc(A x) {
  if constexpr (!std::is_same_v<A, float>) {
    return std::exp(x);
  } else {
    constexpr float kLo = -87.3365478f, kHi = 88.7228394f;  // ln(FLT_MIN), ln(FLT_MAX)
    constexpr float kMagic = 12582912.0f;                     // 1.5 * 2^23
    const float shifted = madd<Fma>(x, 1.44269504088896341f, kMagic);
    const float fn = shifted - kMagic;  // round(x / ln2), exact for |x / ln2| < 2^22
    const int32_t n = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kMagic);
    const float r = madd<Fma>(-fn, -2.12194440e-4f, madd<Fma>(-fn, 0.693359375f, x));  // ln2 split in two
    float p = 1.9875691500e-4f;
    p = madd<Fma>(p, r, 1.3981999507e-3f);
    p = madd<Fma>(p, r, 8.3334519073e-3f);
    p = madd<Fma>(p, r, 4.1665795894e-2f);
    p = madd<Fma>(p, r, 1.6666665459e-1f);
    p = madd<Fma>(p, r, 5.0000001201e-1f);
    p = madd<Fma>(p * r, r, r) + 1.0f;
    // 2^n from the exponent bits; n = 128 is not a float's exponent, so take 2 * 2^127.
    const int32_t top = int32_t(n > 127);
    const float scale = std::bit_cast<float>(int32_t(uint32_t(n - top + 127) << 23));
    const float twice = std::bit_cast<float>(int32_t(0x3F800000 + (top << 23)));  // 1 or 2
    int32_t y = std::bit_cast<int32_t>(p * twice * scale);
    const int32_t below = -int32_t(x < kLo), above = -int32_t(x > kHi), nan = -int32_t(x != x);
    y &= ~below;                                                   // underflow: +0
    y = (y & ~above) | (std::bit_cast<int32_t>(std::numeric_limits<float>::infinity()) & above);
    y = (y & ~nan) | (std::bit_cast<int32_t>(x) & nan);
    return std::bit_cast<float>(y);
  }
}

}  // namespace ampgrad::cpu
