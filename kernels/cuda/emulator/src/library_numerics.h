// What the emulated cuBLASLt and cuDNN share: reading and writing the four floating
// element types, and the input roundings their reduced-precision math modes allow.
#pragma once

#include <cstdint>

#include "ampgrad/half.h"

namespace ampgrad::emu {

/// An element type of the libraries' operands (each library has its own enumeration).
enum class Elem { F32, F64, F16, BF16 };

inline int elem_size(Elem t) { return t == Elem::F64 ? 8 : t == Elem::F32 ? 4 : 2; }

/// Element i of `base`, exactly, as S (float or double).
template <class S>
S load(const void* base, Elem t, int64_t i) {
  switch (t) {
    case Elem::F32: return S(static_cast<const float*>(base)[i]);
    case Elem::F64: return S(static_cast<const double*>(base)[i]);
    case Elem::F16: return S(detail::half_bits_to_float(static_cast<const uint16_t*>(base)[i]));
    case Elem::BF16: break;
  }
  return S(detail::bf16_bits_to_float(static_cast<const uint16_t*>(base)[i]));
}

/// Stores v as element i of `base`, rounded once to the element type (to nearest even).
template <class S>
void store(void* base, Elem t, int64_t i, S v) {
  switch (t) {
    case Elem::F32: static_cast<float*>(base)[i] = float(v); return;
    case Elem::F64: static_cast<double*>(base)[i] = double(v); return;
    case Elem::F16: static_cast<uint16_t*>(base)[i] = detail::float_to_half_bits(float(v)); return;
    case Elem::BF16: break;
  }
  static_cast<uint16_t*>(base)[i] = detail::float_to_bf16_bits(float(v));
}

/// x rounded to TF32 (10 explicit mantissa bits) to nearest, ties away from zero: the
/// rounding of cvt.rna.tf32.f32, CUDA's conversion to TF32. Inf and NaN are kept.
inline float round_tf32(float x) {
  uint32_t u = detail::float_bits(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  u += 0x1000u;  // half the unit of the 13 dropped bits, added to the magnitude
  u &= 0xffffe000u;
  return detail::bits_float(u);
}

/// x rounded to float16 and back (to nearest even; beyond 65504 it is infinite).
inline float round_fp16(float x) { return detail::half_bits_to_float(detail::float_to_half_bits(x)); }

}  // namespace ampgrad::emu
