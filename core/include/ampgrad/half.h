// ampgrad/half.h — 16-bit floating-point scalar types.
//
//   Half      IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits.
//   BFloat16  "brain float":     1 sign, 8 exponent,  7 mantissa bits
//             (the upper half of an fp32).
//
// Both are plain storage types (trivially copyable, sizeof 2, the raw bits in
// member `x`); arithmetic is done by converting to float. `Half() = default`
// leaves `x` uninitialised, like `float`; use `Half{}` / `Half(0.0f)` for zero.
//
// Conversion conventions (identical for every code path in the library — the
// scalar functions here, the bulk routines in convert.h, and later GPU kernels):
//   * float -> 16-bit rounds to nearest, ties to even, using integer bit
//     manipulation only, so the result never depends on the FPU rounding mode
//     or on FTZ/DAZ flags.
//   * Overflow rounds to infinity (fp16: |x| >= 65520 -> inf, 65504 is the
//     largest finite value). Subnormal results are kept, never flushed; fp32
//     subnormal inputs are rounded exactly like any other value (for bf16 they
//     become bf16 subnormals or zero by RNE).
//   * NaN stays NaN and is made quiet, keeping the top payload bits:
//       fp16: sign | 0x7C00 | 0x0200 | (fp32 mantissa >> 13)
//       bf16: (fp32 bits >> 16) | 0x0040
//     This is bit-for-bit what x86 VCVTPS2PH (round-to-nearest immediate) and
//     VCVTNEPS2BF16 produce for NaNs.
//   * 16-bit -> float is exact. A signalling fp16 NaN comes back as a quiet
//     fp32 NaN (bit 22 set), as VCVTPH2PS does; bf16 -> float is a plain
//     16-bit shift, so bf16 NaN payloads (signalling or not) pass unchanged.
#pragma once

#include <cstdint>
#include <cstring>
#include <ostream>
#include <type_traits>

#include "ampgrad/host_device.h"

namespace ampgrad {

namespace detail {

/// Raw bits of a float (memcpy so it is valid in host and device code alike).
AG_HOST_DEVICE inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

/// Float with the given raw bits.
AG_HOST_DEVICE inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// Number of leading zero bits of a non-zero 32-bit value.
AG_HOST_DEVICE inline int clz32(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return __clz(static_cast<int>(v));
#elif defined(__GNUC__) || defined(__clang__)
  return __builtin_clz(v);
#else
  int n = 0;
  for (int step = 16; step > 0; step >>= 1)
    if ((v >> (32 - step)) == 0) n += step, v <<= step;
  return n;
#endif
}

/// fp32 -> IEEE binary16 bits, round to nearest even (see file comment).
AG_HOST_DEVICE inline uint16_t float_to_half_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;

  if (a >= 0x47800000u) {  // |f| >= 65536, inf or NaN
    if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x03FFu));
    return static_cast<uint16_t>(sign | 0x7C00u);
  }
  if (a >= 0x38800000u) {  // result is normal (|f| >= 2^-14), or 65520..65536 -> inf
    // Rebias the exponent (127 -> 15) in place, then round away the low 13
    // mantissa bits; a carry propagates into the exponent (and up to 0x7C00).
    const uint32_t m = a - 0x38000000u;
    return static_cast<uint16_t>(sign | ((m + 0x0FFFu + ((m >> 13) & 1u)) >> 13));
  }
  if (a <= 0x33000000u) return static_cast<uint16_t>(sign);  // |f| <= 2^-25: ties-to-even gives 0
  // Subnormal result: value / 2^-24 = mant >> (126 - exp), rounded to even.
  // Rounding up from 0x3FF yields 0x400, which is the smallest normal: correct.
  const uint32_t e = a >> 23;  // 102..112
  const uint32_t mant = (a & 0x007FFFFFu) | 0x00800000u;
  const uint32_t shift = 126u - e;  // 14..24
  const uint32_t half_ulp = (1u << (shift - 1)) - 1u;
  return static_cast<uint16_t>(sign | ((mant + half_ulp + ((mant >> shift) & 1u)) >> shift));
}

/// IEEE binary16 bits -> fp32 (exact; signalling NaNs are quietened).
AG_HOST_DEVICE inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x03FFu;
  uint32_t out;
  if (e == 0x1Fu) {
    out = sign | 0x7F800000u | (m << 13) | (m != 0 ? 0x00400000u : 0u);
  } else if (e != 0) {
    out = sign | ((e + 112u) << 23) | (m << 13);
  } else if (m == 0) {
    out = sign;
  } else {
    // Subnormal: value = m * 2^-24. With the top set bit at position p (0..9)
    // the fp32 exponent is p - 24 and the remaining bits form the mantissa.
    const uint32_t p = 31u - static_cast<uint32_t>(clz32(m));
    out = sign | ((p + 103u) << 23) | ((m << (23u - p)) & 0x007FFFFFu);
  }
  return bits_float(out);
}

/// fp32 -> bfloat16 bits, round to nearest even (see file comment).
AG_HOST_DEVICE inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Same exponent range as fp32, so RNE on the low 16 bits covers everything:
  // subnormals round within the subnormal range, and a carry out of the
  // largest finite values produces exactly the infinity pattern.
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/// bfloat16 bits -> fp32 (exact, bits passed through unchanged).
AG_HOST_DEVICE inline float bf16_bits_to_float(uint16_t b) {
  return bits_float(static_cast<uint32_t>(b) << 16);
}

}  // namespace detail

/// IEEE 754 binary16 value. Implicit conversions to and from float.
struct Half {
  uint16_t x;

  Half() = default;
  AG_HOST_DEVICE Half(float f) : x(detail::float_to_half_bits(f)) {}
  AG_HOST_DEVICE operator float() const { return detail::half_bits_to_float(x); }

  /// The value whose raw bits are `b` (no conversion).
  AG_HOST_DEVICE static constexpr Half from_bits(uint16_t b) {
    Half h{};
    h.x = b;
    return h;
  }
  AG_HOST_DEVICE constexpr uint16_t bits() const { return x; }
};

/// bfloat16 value (upper 16 bits of an fp32). Implicit conversions to and from float.
struct BFloat16 {
  uint16_t x;

  BFloat16() = default;
  AG_HOST_DEVICE BFloat16(float f) : x(detail::float_to_bf16_bits(f)) {}
  AG_HOST_DEVICE operator float() const { return detail::bf16_bits_to_float(x); }

  /// The value whose raw bits are `b` (no conversion).
  AG_HOST_DEVICE static constexpr BFloat16 from_bits(uint16_t b) {
    BFloat16 h{};
    h.x = b;
    return h;
  }
  AG_HOST_DEVICE constexpr uint16_t bits() const { return x; }
};

static_assert(sizeof(Half) == 2 && std::is_trivially_copyable_v<Half> &&
              std::is_standard_layout_v<Half>);
static_assert(sizeof(BFloat16) == 2 && std::is_trivially_copyable_v<BFloat16> &&
              std::is_standard_layout_v<BFloat16>);

/// True for the library's 16-bit floating-point storage types: the one definition of "a
/// 16-bit float" (dtype.h's is_reduced_floating is its dtype form); kernels widen them to
/// float to compute.
template <class T>
inline constexpr bool is_float16_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

/// Prints the value as a float (same formatting as `os << float`).
template <class T>
  requires is_float16_v<T>
std::ostream& operator<<(std::ostream& os, T v) {
  return os << static_cast<float>(v);
}

}  // namespace ampgrad
