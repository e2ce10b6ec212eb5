// Stochastic rounding of a float32 value to float16 or bfloat16, and the Philox draw the
// fused optimizer steps use for it (UpdateRounding::Stochastic, ampgrad/backend.h). Shared
// by every backend (AG_HOST_DEVICE), so a seed gives the same bits on the CPU and on CUDA.
//
// The rule: with tz the 16-bit value of |w| rounded toward zero, ulp the distance to the
// next 16-bit value away from zero, and u = uniform01(r) (24 bits, ampgrad/philox.h), the
// result is w rounded away from zero when u < (|w| - tz) / ulp, else toward zero: each
// neighbour with probability proportional to the closeness of w to it, and a
// representable w exactly. The probability is exact wherever (|w| - tz) / ulp has at most
// 24 bits (every bfloat16 result; every float16 result but float16 subnormals from float32
// values below 2^-14, where it is off by less than 2^-24). NaN, infinity and finite values
// beyond the largest finite 16-bit value round as the cast does (to nearest).
// The float64 specification is ampgrad::reference::round_stochastic
// (kernels/reference/include/ampgrad/reference/optim.h).
#pragma once

#include <cstdint>

#include "ampgrad/half.h"
#include "ampgrad/host_device.h"
#include "ampgrad/philox.h"

namespace ampgrad::kernels {

/// The 32 random bits that round element i of the optimizer's parameter `id` at the
/// parameter's step `step` (its count of updates before this one): word 0 of Philox4x32-10
/// at counter (i low, i high, id, step low) under `seed`.
AG_HOST_DEVICE inline uint32_t rounding_draw(uint64_t seed, int64_t i, int64_t id, int64_t step) {
  return Philox4x32(uint32_t(uint64_t(i)), uint32_t(uint64_t(i) >> 32), uint32_t(uint64_t(id)),
                    uint32_t(uint64_t(step)), uint32_t(seed), uint32_t(seed >> 32))
      .out[0];
}

/// bfloat16 bits of w rounded stochastically with the random bits r (see the file comment).
AG_HOST_DEVICE inline uint16_t stochastic_bf16_bits(float w, uint32_t r) {
  const uint32_t u = detail::float_bits(w);
  if ((u & 0x7FFFFFFFu) > 0x7F7F0000u) return detail::float_to_bf16_bits(w);  // beyond the largest finite, inf, NaN
  // The low 16 bits are (|w| - tz) / ulp in units of 2^-16, and u < low / 2^16 with
  // u = (r >> 8) / 2^24 is (r >> 16) < low. Adding one to the magnitude's bits steps away
  // from zero (through the subnormal/normal boundary too).
  const uint32_t low = u & 0xFFFFu;
  return uint16_t((u >> 16) + ((r >> 16) < low ? 1u : 0u));
}

/// float16 bits of w rounded stochastically with the random bits r (see the file comment).
AG_HOST_DEVICE inline uint16_t stochastic_half_bits(float w, uint32_t r) {
  const uint32_t u = detail::float_bits(w);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
  if (!(detail::bits_float(a) < 65504.0f)) return detail::float_to_half_bits(w);  // 65504 itself, beyond, inf, NaN
  if (a >= 0x38800000u) {
    // float16 normal (|w| >= 2^-14): 13 bits of float32 mantissa below float16's ulp, and
    // u < low / 2^13 is (r >> 19) < low.
    const uint32_t low = a & 0x1FFFu;
    const uint32_t mag = (a & ~0x1FFFu) + ((r >> 19) < low ? 0x2000u : 0u);
    return uint16_t(sign | detail::float_to_half_bits(detail::bits_float(mag)));  // exact: mag is a float16 value
  }
  // float16 subnormal: ulp 2^-24, |w| / ulp = n + frac with n < 1024; the bits are n (or
  // n + 1, which may be the smallest normal, 0x0400).
  const float q = detail::bits_float(a) * 16777216.0f;  // exact: a power-of-two scaling
  const uint32_t n = uint32_t(q);
  const float frac = q - float(n);
  return uint16_t(sign | (n + (uniform01(r) < frac ? 1u : 0u)));
}

}  // namespace ampgrad::kernels
