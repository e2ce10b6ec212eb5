// The device math of the CUDA emulator: CUDA's global min/max overloads, the integer
// intrinsics, and the float intrinsics.
//
// The math library functions (expf, logf, sqrt, pow, ...) are the host's, from <math.h>,
// in the global namespace as CUDA declares them. The fast-math intrinsics (__expf,
// __fdividef, rsqrtf, __sinf, ...) compute the exact (correctly or nearly correctly
// rounded) host function, not the hardware's approximation: a kernel that relies on their
// error bounds or on flushing subnormals is not tested by the emulator
// (docs/cuda-emulator.md). The _rn intrinsics are single IEEE operations in round to
// nearest even; nothing is contracted into a fused multiply-add unless written as one.
#pragma once

#include <math.h>

#include <bit>
#include <cmath>
#include <cstdint>

// ---- min and max (CUDA declares them for every integer and floating pair) -------------------------
#define AMPGRAD_EMU_MIN_MAX(A, B, R)                                                                               \
  inline R min(A a, B b) { return static_cast<R>(a) < static_cast<R>(b) ? static_cast<R>(a) : static_cast<R>(b); } \
  inline R max(A a, B b) { return static_cast<R>(a) > static_cast<R>(b) ? static_cast<R>(a) : static_cast<R>(b); }
AMPGRAD_EMU_MIN_MAX(int, int, int)
AMPGRAD_EMU_MIN_MAX(unsigned int, unsigned int, unsigned int)
AMPGRAD_EMU_MIN_MAX(int, unsigned int, unsigned int)
AMPGRAD_EMU_MIN_MAX(unsigned int, int, unsigned int)
AMPGRAD_EMU_MIN_MAX(long, long, long)
AMPGRAD_EMU_MIN_MAX(unsigned long, unsigned long, unsigned long)
AMPGRAD_EMU_MIN_MAX(long, unsigned long, unsigned long)
AMPGRAD_EMU_MIN_MAX(unsigned long, long, unsigned long)
AMPGRAD_EMU_MIN_MAX(long long, long long, long long)
AMPGRAD_EMU_MIN_MAX(unsigned long long, unsigned long long, unsigned long long)
AMPGRAD_EMU_MIN_MAX(long long, unsigned long long, unsigned long long)
AMPGRAD_EMU_MIN_MAX(unsigned long long, long long, unsigned long long)
#undef AMPGRAD_EMU_MIN_MAX
// Floating min/max are fminf/fmax: a NaN operand gives the other one.
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline double min(float a, double b) { return fmin(double(a), b); }
inline double max(float a, double b) { return fmax(double(a), b); }
inline double min(double a, float b) { return fmin(a, double(b)); }
inline double max(double a, float b) { return fmax(a, double(b)); }
inline unsigned int umin(unsigned int a, unsigned int b) { return min(a, b); }
inline unsigned int umax(unsigned int a, unsigned int b) { return max(a, b); }
inline long long llmin(long long a, long long b) { return min(a, b); }
inline long long llmax(long long a, long long b) { return max(a, b); }
inline unsigned long long ullmin(unsigned long long a, unsigned long long b) { return min(a, b); }
inline unsigned long long ullmax(unsigned long long a, unsigned long long b) { return max(a, b); }

// ---- integer intrinsics --------------------------------------------------------------------------
inline int __popc(unsigned int x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __clz(int x) { return std::countl_zero(unsigned(x)); }
inline int __clzll(long long x) { return std::countl_zero((unsigned long long)x); }
/// 1 + the index of the least significant set bit; 0 for 0.
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(unsigned(x)) + 1; }
inline int __ffsll(long long x) { return x == 0 ? 0 : std::countr_zero((unsigned long long)x) + 1; }
inline unsigned int __brev(unsigned int x) {
  unsigned int r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline unsigned long long __brevll(unsigned long long x) {
  return (unsigned long long)(__brev(unsigned(x))) << 32 | __brev(unsigned(x >> 32));
}
inline int __mulhi(int a, int b) { return int((int64_t(a) * int64_t(b)) >> 32); }
inline unsigned int __umulhi(unsigned int a, unsigned int b) { return unsigned((uint64_t(a) * uint64_t(b)) >> 32); }
inline long long __mul64hi(long long a, long long b) { return (long long)((__int128(a) * __int128(b)) >> 64); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)((unsigned __int128)a * b >> 64);
}
/// The low 32 bits of the product of the low 24 bits of a and b (signed).
inline int __mul24(int a, int b) {
  return int(int64_t(int32_t(uint32_t(a) << 8) >> 8) * int64_t(int32_t(uint32_t(b) << 8) >> 8));
}
inline unsigned int __umul24(unsigned int a, unsigned int b) { return (a & 0xFFFFFFu) * (b & 0xFFFFFFu); }
inline unsigned __sad(int x, int y, unsigned z) { return unsigned(x > y ? int64_t(x) - y : int64_t(y) - x) + z; }
inline unsigned __usad(unsigned x, unsigned y, unsigned z) { return (x > y ? x - y : y - x) + z; }

// ---- float intrinsics ----------------------------------------------------------------------------
// Single operations in round to nearest even (no contraction: the emulated build compiles
// with -ffp-contract=off).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline double __drcp_rn(double a) { return 1.0 / a; }
inline double __dsqrt_rn(double a) { return sqrt(a); }
// The fast-math intrinsics, computed exactly (see the file comment).
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float a) { return expf(a); }
inline float __exp10f(float a) { return exp10f(a); }
inline float __logf(float a) { return logf(a); }
inline float __log2f(float a) { return log2f(a); }
inline float __log10f(float a) { return log10f(a); }
inline float __sinf(float a) { return sinf(a); }
inline float __cosf(float a) { return cosf(a); }
inline float __tanf(float a) { return tanf(a); }
inline void __sincosf(float a, float* s, float* c) { *s = sinf(a), *c = cosf(a); }
inline float __powf(float a, float b) { return powf(a, b); }
inline float __frsqrt_rn(float a) { return 1.0f / sqrtf(a); }
inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
inline double rsqrt(double a) { return 1.0 / sqrt(a); }
inline float rcbrtf(float a) { return 1.0f / cbrtf(a); }
inline double rcbrt(double a) { return 1.0 / cbrt(a); }
inline void sincosf(float a, float* s, float* c) { *s = sinf(a), *c = cosf(a); }
inline void sincos(double a, double* s, double* c) { *s = sin(a), *c = cos(a); }
inline float sinpif(float a) { return float(sin(M_PI * double(a))); }
inline float cospif(float a) { return float(cos(M_PI * double(a))); }
inline float normcdff(float a) { return float(0.5 * erfc(-double(a) / M_SQRT2)); }
inline double normcdf(double a) { return 0.5 * erfc(-a / M_SQRT2); }
/// Clamps to [0, 1]; NaN gives 0.
inline float __saturatef(float a) { return a >= 1.0f ? 1.0f : (a > 0.0f ? a : 0.0f); }
inline int __float_as_int(float a) { return std::bit_cast<int>(a); }
inline float __int_as_float(int a) { return std::bit_cast<float>(a); }
inline unsigned int __float_as_uint(float a) { return std::bit_cast<unsigned int>(a); }
inline float __uint_as_float(unsigned int a) { return std::bit_cast<float>(a); }
inline long long __double_as_longlong(double a) { return std::bit_cast<long long>(a); }
inline double __longlong_as_double(long long a) { return std::bit_cast<double>(a); }
inline int __double2hiint(double a) { return int(std::bit_cast<unsigned long long>(a) >> 32); }
inline int __double2loint(double a) { return int(std::bit_cast<unsigned long long>(a)); }
inline double __hiloint2double(int hi, int lo) {
  return std::bit_cast<double>((unsigned long long)(unsigned(hi)) << 32 | unsigned(lo));
}
