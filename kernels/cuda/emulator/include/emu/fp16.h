// Rounding to the 16-bit floats as the GPU rounds, for cuda_fp16.h and cuda_bf16.h.
//
// float -> 16 bits in round to nearest even is ampgrad's own conversion
// (ampgrad/half.h: one definition for the CPU and the emulated GPU), except for NaN:
// the hardware's conversions (cvt.rn.f16.f32, cvt.rn.bf16.f32) return the canonical NaN
// 0x7FFF where the host keeps the payload. float16 -> float is exact, a NaN giving the
// canonical 0x7FFFFFFF; bfloat16 -> float is a bit move (CUDA's __bfloat162float), so it
// keeps a NaN's payload.
//
// Everything wider than float (double, int64, a sum or fused multiply-add of two 16-bit
// values) is rounded once: first to float in round-to-odd (truncate, then set the last
// bit when inexact), which float's 13 (float16) or 16 (bfloat16) spare bits make exact
// for the second rounding, to 16 bits in round to nearest even. The directed roundings
// (_rz, _rd, _ru) step from the nearest-even result.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ampgrad/half.h"

namespace ampgrad::emu::fp {

inline constexpr uint16_t kCanonicalNaN16 = 0x7FFF;
inline constexpr uint32_t kCanonicalNaN32 = 0x7FFFFFFFu;

enum class Format { Half, BFloat16 };

inline uint16_t from_float_rn(Format f, float v) {
  if (std::isnan(v)) return kCanonicalNaN16;
  return f == Format::Half ? ::ampgrad::detail::float_to_half_bits(v) : ::ampgrad::detail::float_to_bf16_bits(v);
}

inline float to_float(Format f, uint16_t b) {
  if (f == Format::BFloat16) return ::ampgrad::detail::bf16_bits_to_float(b);
  if ((b & 0x7C00u) == 0x7C00u && (b & 0x03FFu) != 0) return std::bit_cast<float>(kCanonicalNaN32);
  return ::ampgrad::detail::half_bits_to_float(b);
}

inline bool is_nan(Format f, uint16_t b) {
  return f == Format::Half ? (b & 0x7C00u) == 0x7C00u && (b & 0x03FFu) != 0
                           : (b & 0x7F80u) == 0x7F80u && (b & 0x007Fu) != 0;
}

/// hi + lo (a double and the exact error of the operation that produced it, or 0) as a
/// float in round-to-odd: exact values stay; others become the float next to zero of the
/// two around them, with its last bit set. |lo| must be at most half an ulp of hi.
inline float to_float_odd(double hi, double lo = 0) {
  if (std::isnan(hi) || std::isinf(hi)) return float(hi);
  const float f = float(hi);                                    // round to nearest even
  const double above = double(f) - hi;                          // exact (f and hi are within a factor of two) or inf
  if (!std::isinf(f) && above == lo) return f;                  // f is hi + lo exactly
  const bool f_above = std::isinf(f) ? f > 0 : above - lo > 0;  // f > hi + lo
  uint32_t bits = std::bit_cast<uint32_t>(f);
  if (f == 0.0f) {
    bits = (hi != 0 ? hi < 0 : lo < 0) ? 0x80000000u : 0u;  // truncates to a zero of x's sign
  } else if ((f > 0) == f_above) {
    bits -= 1;  // one step toward zero
  }
  return std::bit_cast<float>(bits | 1u);
}

/// The exact sum a + b as a double and its error (Knuth's TwoSum).
inline double two_sum(double a, double b, double& err) {
  const double s = a + b;
  const double bb = s - a;
  err = (a - (s - bb)) + (b - bb);
  return s;
}

/// hi + lo, rounded once to the 16-bit format (nearest even; canonical NaN).
inline uint16_t from_double_rn(Format f, double hi, double lo = 0) {
  if (std::isnan(hi)) return kCanonicalNaN16;
  return from_float_rn(f, to_float_odd(hi, lo));
}

/// An integer, rounded once to the 16-bit format.
inline uint16_t from_int64_rn(Format f, int64_t v) {
  const uint64_t m = v < 0 ? uint64_t(0) - uint64_t(v) : uint64_t(v);
  // below 2^53 a double holds m exactly; above, the high 53 bits and the rest, far below
  // half an ulp of a float of that size
  const float mag =
      m < (uint64_t(1) << 53) ? to_float_odd(double(m)) : to_float_odd(double(m & ~uint64_t(0x7FF)), double(m & 0x7FF));
  return from_float_rn(f, v < 0 ? -mag : mag);
}
inline uint16_t from_uint64_rn(Format f, uint64_t m) {
  const float mag =
      m < (uint64_t(1) << 53) ? to_float_odd(double(m)) : to_float_odd(double(m & ~uint64_t(0x7FF)), double(m & 0x7FF));
  return from_float_rn(f, mag);
}

/// The next 16-bit value toward +inf (up) or -inf (down); NaN and the infinity in that
/// direction stay.
inline uint16_t step(Format f, uint16_t b, bool up) {
  if (is_nan(f, b)) return b;
  const uint16_t inf = f == Format::Half ? 0x7C00 : 0x7F80;
  const bool neg = (b & 0x8000u) != 0;
  const uint16_t mag = b & 0x7FFFu;
  if (up ? (!neg && mag == inf) : (neg && mag == inf)) return b;
  if (mag == 0) return up ? uint16_t(0x0001) : uint16_t(0x8001);  // from either zero
  // away from zero when the direction matches the sign, else toward it
  return (up != neg) ? uint16_t(b + 1) : uint16_t(b - 1);
}

enum class Rounding { Nearest, TowardZero, Down, Up };

/// v (a float) in the given rounding: the nearest-even result, stepped once if it lies on
/// the wrong side of v.
inline uint16_t from_float(Format f, float v, Rounding r) {
  uint16_t b = from_float_rn(f, v);
  if (r == Rounding::Nearest || std::isnan(v)) return b;
  const float got = to_float(f, b);
  if (got == v) return b;
  const bool got_above = got > v;
  const bool want_below = r == Rounding::Down || (r == Rounding::TowardZero && v > 0);
  const bool want_above = r == Rounding::Up || (r == Rounding::TowardZero && v < 0);
  if (got_above && want_below)
    b = step(f, b, false);
  else if (!got_above && want_above)
    b = step(f, b, true);
  return b;
}

/// A 16-bit value to an integer type: NaN gives 0, values out of range saturate (the
/// hardware's cvt.rzi and friends).
template <class I>
inline I to_integer(Format f, uint16_t b, Rounding r) {
  const float v = to_float(f, b);
  if (std::isnan(v)) return I(0);
  double t = double(v);
  switch (r) {
    case Rounding::Nearest: t = std::nearbyint(t); break;
    case Rounding::TowardZero: t = std::trunc(t); break;
    case Rounding::Down: t = std::floor(t); break;
    case Rounding::Up: t = std::ceil(t); break;
  }
  if (t <= double(std::numeric_limits<I>::lowest())) return std::numeric_limits<I>::lowest();
  if (t >= double(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return I(t);
}

}  // namespace ampgrad::emu::fp
