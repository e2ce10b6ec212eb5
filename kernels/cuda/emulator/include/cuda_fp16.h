// The emulated cuda_fp16.h: __half and __half2 with CUDA's names, conversions and
// arithmetic, rounded as the GPU rounds (emu/fp16.h: ampgrad's own float16 conversion,
// the hardware's canonical NaN, one rounding for every wider operation).
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>

#include "emu/fp16.h"
#include "emu/types.h"

struct __half_raw {
  unsigned short x;
};

/// IEEE binary16, stored as its bits in `__x` (as CUDA's). Converts implicitly to and from
/// float (round to nearest even) and from the integer types; arithmetic rounds once.
struct __half {
  __half() = default;
  constexpr __half(const __half_raw& r) : __x(r.x) {}
  __half(float v) : __x(::ampgrad::emu::fp::from_float_rn(kFormat, v)) {}
  __half(double v) : __x(::ampgrad::emu::fp::from_double_rn(kFormat, v)) {}
  __half(short v) : __x(::ampgrad::emu::fp::from_int64_rn(kFormat, v)) {}
  __half(unsigned short v) : __x(::ampgrad::emu::fp::from_int64_rn(kFormat, v)) {}
  __half(int v) : __x(::ampgrad::emu::fp::from_int64_rn(kFormat, v)) {}
  __half(unsigned int v) : __x(::ampgrad::emu::fp::from_int64_rn(kFormat, v)) {}
  __half(long v) : __x(::ampgrad::emu::fp::from_int64_rn(kFormat, v)) {}
  __half(unsigned long v) : __x(::ampgrad::emu::fp::from_uint64_rn(kFormat, v)) {}
  __half(long long v) : __x(::ampgrad::emu::fp::from_int64_rn(kFormat, v)) {}
  __half(unsigned long long v) : __x(::ampgrad::emu::fp::from_uint64_rn(kFormat, v)) {}
  __half& operator=(const __half_raw& r) {
    __x = r.x;
    return *this;
  }
  constexpr operator __half_raw() const { return __half_raw{__x}; }
  operator float() const { return ::ampgrad::emu::fp::to_float(kFormat, __x); }

  static constexpr ::ampgrad::emu::fp::Format kFormat = ::ampgrad::emu::fp::Format::Half;
  unsigned short __x;
};

struct alignas(4) __half2 {
  __half x, y;
};

namespace ampgrad::emu::fp {
inline __half make_half(uint16_t b) { return __half(__half_raw{b}); }
inline double wide(__half h) { return double(float(h)); }
}  // namespace ampgrad::emu::fp

// ---- conversions ---------------------------------------------------------------------------------
inline __half __float2half(float a) { return __half(a); }
inline __half __float2half_rn(float a) { return __half(a); }
inline __half __float2half_rz(float a) {
  using namespace ampgrad::emu::fp;
  return make_half(from_float(Format::Half, a, Rounding::TowardZero));
}
inline __half __float2half_rd(float a) {
  using namespace ampgrad::emu::fp;
  return make_half(from_float(Format::Half, a, Rounding::Down));
}
inline __half __float2half_ru(float a) {
  using namespace ampgrad::emu::fp;
  return make_half(from_float(Format::Half, a, Rounding::Up));
}
inline float __half2float(__half a) { return float(a); }
inline __half __double2half(double a) { return __half(a); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short b) { return ampgrad::emu::fp::make_half(b); }
inline short __half_as_short(__half h) { return short(h.__x); }
inline __half __short_as_half(short b) { return ampgrad::emu::fp::make_half(uint16_t(b)); }

#define AMPGRAD_EMU_HALF_INT(NAME, I)                                                                       \
  inline __half __##NAME##2half_rn(I v) { return __half(v); }                                               \
  inline I __half2##NAME##_rn(__half h) {                                                                   \
    return ampgrad::emu::fp::to_integer<I>(__half::kFormat, h.__x, ampgrad::emu::fp::Rounding::Nearest);    \
  }                                                                                                         \
  inline I __half2##NAME##_rz(__half h) {                                                                   \
    return ampgrad::emu::fp::to_integer<I>(__half::kFormat, h.__x, ampgrad::emu::fp::Rounding::TowardZero); \
  }                                                                                                         \
  inline I __half2##NAME##_rd(__half h) {                                                                   \
    return ampgrad::emu::fp::to_integer<I>(__half::kFormat, h.__x, ampgrad::emu::fp::Rounding::Down);       \
  }                                                                                                         \
  inline I __half2##NAME##_ru(__half h) {                                                                   \
    return ampgrad::emu::fp::to_integer<I>(__half::kFormat, h.__x, ampgrad::emu::fp::Rounding::Up);         \
  }
AMPGRAD_EMU_HALF_INT(short, short)
AMPGRAD_EMU_HALF_INT(ushort, unsigned short)
AMPGRAD_EMU_HALF_INT(int, int)
AMPGRAD_EMU_HALF_INT(uint, unsigned int)
AMPGRAD_EMU_HALF_INT(ll, long long)
AMPGRAD_EMU_HALF_INT(ull, unsigned long long)
#undef AMPGRAD_EMU_HALF_INT

// ---- arithmetic and comparisons (each rounds once) ---------------------------------------------------
inline __half __hadd(__half a, __half b) {
  using namespace ampgrad::emu::fp;
  double e;
  const double s = two_sum(wide(a), wide(b), e);
  return make_half(from_double_rn(Format::Half, s, e));
}
inline __half __hsub(__half a, __half b) {
  using namespace ampgrad::emu::fp;
  double e;
  const double s = two_sum(wide(a), -wide(b), e);
  return make_half(from_double_rn(Format::Half, s, e));
}
/// Products of two 11-bit significands are exact in a double.
inline __half __hmul(__half a, __half b) {
  using namespace ampgrad::emu::fp;
  return make_half(from_double_rn(Format::Half, wide(a) * wide(b)));
}
/// A quotient of 11-bit significands never rounds onto a float16 midpoint in a double.
inline __half __hdiv(__half a, __half b) {
  using namespace ampgrad::emu::fp;
  return make_half(from_double_rn(Format::Half, wide(a) / wide(b)));
}
inline __half __hfma(__half a, __half b, __half c) {
  using namespace ampgrad::emu::fp;
  double e;
  const double s = two_sum(wide(a) * wide(b), wide(c), e);
  return make_half(from_double_rn(Format::Half, s, e));
}
inline __half __hneg(__half a) { return ampgrad::emu::fp::make_half(uint16_t(a.__x ^ 0x8000u)); }
inline __half __habs(__half a) { return ampgrad::emu::fp::make_half(uint16_t(a.__x & 0x7FFFu)); }
inline bool __hisnan(__half a) { return ampgrad::emu::fp::is_nan(__half::kFormat, a.__x); }
inline int __hisinf(__half a) { return (a.__x & 0x7FFFu) == 0x7C00u ? ((a.__x & 0x8000u) ? -1 : 1) : 0; }
inline bool __heq(__half a, __half b) { return float(a) == float(b); }
inline bool __hne(__half a, __half b) { return float(a) < float(b) || float(a) > float(b); }
inline bool __hlt(__half a, __half b) { return float(a) < float(b); }
inline bool __hle(__half a, __half b) { return float(a) <= float(b); }
inline bool __hgt(__half a, __half b) { return float(a) > float(b); }
inline bool __hge(__half a, __half b) { return float(a) >= float(b); }
inline bool __hequ(__half a, __half b) { return !(float(a) < float(b) || float(a) > float(b)); }
inline bool __hneu(__half a, __half b) { return float(a) != float(b); }
inline bool __hltu(__half a, __half b) { return !(float(a) >= float(b)); }
inline bool __hleu(__half a, __half b) { return !(float(a) > float(b)); }
inline bool __hgtu(__half a, __half b) { return !(float(a) <= float(b)); }
inline bool __hgeu(__half a, __half b) { return !(float(a) < float(b)); }
/// The larger (smaller) value; one NaN operand gives the other, two give the canonical NaN.
inline __half __hmax(__half a, __half b) {
  if (__hisnan(a) && __hisnan(b)) return ampgrad::emu::fp::make_half(ampgrad::emu::fp::kCanonicalNaN16);
  return __hisnan(a) ? b : __hisnan(b) ? a : (float(b) > float(a) ? b : a);
}
inline __half __hmin(__half a, __half b) {
  if (__hisnan(a) && __hisnan(b)) return ampgrad::emu::fp::make_half(ampgrad::emu::fp::kCanonicalNaN16);
  return __hisnan(a) ? b : __hisnan(b) ? a : (float(b) < float(a) ? b : a);
}
/// max / min that propagate NaN (the canonical NaN).
inline __half __hmax_nan(__half a, __half b) {
  return (__hisnan(a) || __hisnan(b)) ? ampgrad::emu::fp::make_half(ampgrad::emu::fp::kCanonicalNaN16) : __hmax(a, b);
}
inline __half __hmin_nan(__half a, __half b) {
  return (__hisnan(a) || __hisnan(b)) ? ampgrad::emu::fp::make_half(ampgrad::emu::fp::kCanonicalNaN16) : __hmin(a, b);
}
inline __half hsqrt(__half a) {
  return ampgrad::emu::fp::make_half(
      ampgrad::emu::fp::from_double_rn(__half::kFormat, std::sqrt(ampgrad::emu::fp::wide(a))));
}
inline __half hrcp(__half a) { return __hdiv(__half(1.0f), a); }
inline __half hexp(__half a) { return __half(std::exp(float(a))); }
inline __half hlog(__half a) { return __half(std::log(float(a))); }

inline __half operator+(const __half& a, const __half& b) { return __hadd(a, b); }
inline __half operator-(const __half& a, const __half& b) { return __hsub(a, b); }
inline __half operator*(const __half& a, const __half& b) { return __hmul(a, b); }
inline __half operator/(const __half& a, const __half& b) { return __hdiv(a, b); }
inline __half& operator+=(__half& a, const __half& b) { return a = __hadd(a, b); }
inline __half& operator-=(__half& a, const __half& b) { return a = __hsub(a, b); }
inline __half& operator*=(__half& a, const __half& b) { return a = __hmul(a, b); }
inline __half& operator/=(__half& a, const __half& b) { return a = __hdiv(a, b); }
inline __half operator-(const __half& a) { return __hneg(a); }
inline __half operator+(const __half& a) { return a; }
inline bool operator==(const __half& a, const __half& b) { return __heq(a, b); }
inline bool operator!=(const __half& a, const __half& b) { return __hneu(a, b); }
inline bool operator<(const __half& a, const __half& b) { return __hlt(a, b); }
inline bool operator<=(const __half& a, const __half& b) { return __hle(a, b); }
inline bool operator>(const __half& a, const __half& b) { return __hgt(a, b); }
inline bool operator>=(const __half& a, const __half& b) { return __hge(a, b); }

// ---- __half2 -------------------------------------------------------------------------------------
inline __half2 __halves2half2(__half a, __half b) { return {a, b}; }
inline __half2 __half2half2(__half a) { return {a, a}; }
inline __half2 __float2half2_rn(float a) { return {__half(a), __half(a)}; }
inline __half2 __floats2half2_rn(float a, float b) { return {__half(a), __half(b)}; }
inline float2 __half22float2(__half2 a) { return {float(a.x), float(a.y)}; }
inline __half2 __float22half2_rn(float2 a) { return {__half(a.x), __half(a.y)}; }
inline __half __low2half(__half2 a) { return a.x; }
inline __half __high2half(__half2 a) { return a.y; }
inline float __low2float(__half2 a) { return float(a.x); }
inline float __high2float(__half2 a) { return float(a.y); }
inline __half2 __lows2half2(__half2 a, __half2 b) { return {a.x, b.x}; }
inline __half2 __highs2half2(__half2 a, __half2 b) { return {a.y, b.y}; }
inline __half2 __hadd2(__half2 a, __half2 b) { return {__hadd(a.x, b.x), __hadd(a.y, b.y)}; }
inline __half2 __hsub2(__half2 a, __half2 b) { return {__hsub(a.x, b.x), __hsub(a.y, b.y)}; }
inline __half2 __hmul2(__half2 a, __half2 b) { return {__hmul(a.x, b.x), __hmul(a.y, b.y)}; }
inline __half2 __h2div(__half2 a, __half2 b) { return {__hdiv(a.x, b.x), __hdiv(a.y, b.y)}; }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) { return {__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)}; }
inline __half2 __hneg2(__half2 a) { return {__hneg(a.x), __hneg(a.y)}; }
inline __half2 __habs2(__half2 a) { return {__habs(a.x), __habs(a.y)}; }
inline __half2 __hmax2(__half2 a, __half2 b) { return {__hmax(a.x, b.x), __hmax(a.y, b.y)}; }
inline __half2 __hmin2(__half2 a, __half2 b) { return {__hmin(a.x, b.x), __hmin(a.y, b.y)}; }

/// atomicAdd on a float16 (sm_70 and later): the sum rounded once, by compare and swap.
inline __half atomicAdd(__half* p, __half v) {
  std::atomic_ref<unsigned short> a(p->__x);
  unsigned short old = a.load();
  while (!a.compare_exchange_weak(old, __hadd(__ushort_as_half(old), v).__x)) {
  }
  return __ushort_as_half(old);
}
