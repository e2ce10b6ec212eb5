// The vector math kernels for one instruction set (cpu/vmath.h), included by exactly one
// translation unit per set, which defines first:
//   AG_VMATH_NS    the namespace of its entry points (sse2, avx2, avx512)
//   AG_VMATH_W     floats per register (4, 8, 16)
//   AG_VMATH_V     the register type (__m128, __m256, __m512)
//   AG_VMATH_SET1  the intrinsic that broadcasts a float
//   AG_VMATH_ISA   SLEEF's suffix for the set (sse2, avx2, avx512f)
//   AG_VMATH_FMSUB a * b - c rounded once, where the set has FMA (else left undefined)
//   AG_VMATH_SCALEF x * 2^floor(n) rounded once, where the set has it (avx512's scalef)
// and is compiled with the set's flags. Everything here has internal linkage or lives in
// that namespace, and only system headers are included, so nothing compiled with the
// wider set's flags can be picked by the linker for baseline code.
#include <immintrin.h>
#include <sleef.h>

#include <cstdint>
#include <cstring>

#include "fn.h"

#define AG_VMATH_CAT_(a, b, c, d) Sleef_##a##f##b##_##c##d
#define AG_VMATH_CAT(a, b, c, d) AG_VMATH_CAT_(a, b, c, d)
/// SLEEF's entry point for f at this width and accuracy (u10: 1.0 ulp, u15: 1.5 ulp).
#define AG_SLEEF(f, u) AG_VMATH_CAT(f, AG_VMATH_W, u, AG_VMATH_ISA)

namespace ampgrad::cpu::vmath::AG_VMATH_NS {
namespace {

using V = AG_VMATH_V;
constexpr int W = AG_VMATH_W;
// The lane mask of a comparison (GCC and clang vector extensions: -1 where true).
using M = decltype(V{} < V{});

inline V splat(float x) { return AG_VMATH_SET1(x); }
// m ? a : b per lane. The vector conditional (GCC, and clang since 13) lets the compiler
// keep a comparison's mask in a mask register and blend in one instruction on AVX-512;
// the bitwise form, (m & a) | (~m & b), costs two instructions per select.
inline V select(M m, V a, V b) { return m ? a : b; }
inline V vabs(V x) { return select(x < splat(0.0f), -x, x); }

inline V exp(V x) { return AG_SLEEF(exp, u10)(x); }
inline V log(V x) { return AG_SLEEF(log, u10)(x); }
// SLEEF's log1p holds its 1 ulp up to 1e38; far below that log1p(x) and log(x) round alike.
inline V log1p(V x) { return select(x > splat(1e30f), log(x), AG_SLEEF(log1p, u10)(x)); }
inline V tanh(V x) { return AG_SLEEF(tanh, u10)(x); }
// e^x for x <= 0, inline: Cody-Waite reduction x = n ln2 + r and Cephes' degree-6
// polynomial for e^r (as exp_acc in cpu/vec.h, within 1 ulp), with 2^n applied as two
// factors 2^(n - n/2) and 2^(n/2), each a normal float down to n = -150, so results below
// FLT_MIN come out as the nearest denormal, not 0. For erfc below: SLEEF's expf is a call,
// around which every live vector register is spilled, and this loop is bound by its
// instruction count.
inline V exp_nonpositive(V x) {
  const V magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const V shifted = x * splat(1.44269504088896341f) + magic;
  const V fn = shifted - magic;  // round(x / ln2)
  const V r = (x - fn * splat(0.693359375f)) - fn * splat(-2.12194440e-4f);  // ln2 split in two
  V p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  p = p * r * r + r + splat(1.0f);
#ifdef AG_VMATH_SCALEF
  return AG_VMATH_SCALEF(p, fn);  // one rounding, as below: the same result in 1 op for 7
#else
  const M n = reinterpret_cast<M>(shifted) - reinterpret_cast<M>(magic);  // vector casts keep the bits
  const M half = n >> 1;
  const V s1 = reinterpret_cast<V>((half + 127) << 23), s2 = reinterpret_cast<V>((n - half + 127) << 23);
  return p * s1 * s2;
#endif
}

// erfc(z) = e^(-z^2) P(t), t = 1 / (1 + 0.47 |z|), for z >= 0; 2 - erfc(-z) below 0. P is
// a degree-11 polynomial fitted (Chebyshev nodes, weighted least squares in float64) to
// erfc(z) e^(z^2) over [0, 10], past which erfc underflows: relative error 4e-8 with its
// coefficients rounded to float. z^2 is split exactly into hi + lo (Dekker), so e^(-z^2) =
// e^(-hi) (1 - lo) does not amplify the square's rounding. SLEEF's own erfcf (1.5 ulp)
// costs twelve times its expf, and was the largest item of the GPT's training step.
// erfc(z), and in *gauss e^(-z^2) as computed on the way (0 past |z| = 10), which GELU's
// backward needs as its density: one exp serves both.
inline V erfc(V z, V* gauss) {
  constexpr float kP[] = {0.03609233349561691f,  -0.22530852258205414f, 0.5677000880241394f,
                          -0.6952030658721924f,  0.391875296831131f,    -0.15989181399345398f,
                          0.14889253675937653f,  0.1689431369304657f,   0.23655128479003906f,
                          0.26518699526786804f,  0.26516133546829224f,  4.3361580992495874e-07f};
  const V a = vabs(z);
  const M far = a > splat(10.0f);  // erfc(10) = 2e-45: 0 in float (and inf, NaN-free)
  const V ac = select(far, splat(10.0f), a);
  const V t = splat(1.0f) / (splat(1.0f) + splat(0.47f) * ac);
  V p = splat(kP[0]);
  for (int i = 1; i < 12; ++i) p = p * t + splat(kP[i]);
  const V hi = ac * ac;
#ifdef AG_VMATH_FMSUB
  const V lo = AG_VMATH_FMSUB(ac, ac, hi);  // exact: the square's rounding error
#else
  const V c = splat(4097.0f) * ac;  // Veltkamp: ac = ah + al, each with 12 significant bits
  const V ah = c - (c - ac), al = ac - ah;
  const V lo = ((ah * ah - hi) + splat(2.0f) * ah * al) + al * al;  // exact, as the FMA's
#endif
  const V g = select(far, splat(0.0f), exp_nonpositive(-hi) * (splat(1.0f) - lo));
  if (gauss) *gauss = g;
  const V r = g * p;
  // Near 0, 1 - erf(z) from erf's Taylor series (terms z^(2n+1) (-1)^n / (n! (2n+1)) up to
  // n = 4, below 1e-9 relative for |z| < 0.25) has fewer roundings than the long P(t); past
  // 0.25, P(t) holds GELU's 4 ulps (test_vmath). Five terms up to 0.25 cost fewer
  // instructions than eight up to 0.5 would.
  constexpr float kTaylor[] = {1.0f / 216, -1.0f / 42, 1.0f / 10, -1.0f / 3, 1.0f};
  const V z2 = z * z;
  V q = splat(kTaylor[0]);
  for (int i = 1; i < 5; ++i) q = q * z2 + splat(kTaylor[i]);
  const V near = splat(1.0f) - splat(1.12837916709551257390f) * z * q;  // 2 / sqrt(pi)
  const V out = select(z < splat(0.0f), splat(2.0f) - r, select(z != z, z, r));
  return select(a < splat(0.25f), near, out);
}
inline V erfc(V z) { return erfc(z, nullptr); }
inline V pow(V x, V e) { return AG_SLEEF(pow, u10)(x, e); }
// 1 / (1 + e^-x) from e = e^-|x| <= 1: no overflow, and e / (1 + e) keeps the tiny values
// of large negative x (down to the denormals) instead of flushing them to 0.
inline V sigmoid(V x) {
  const V e = exp(-vabs(x));
  const V r = splat(1.0f) / (splat(1.0f) + e);
  return select(x < splat(0.0f), e * r, r);
}

constexpr float kSqrtHalf = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
constexpr float kSqrt2OverPi = 0.79788456080286535588f;
constexpr float kGeluC = 0.044715f;

// 0.5 x (1 + erf(x / sqrt2)) = 0.5 x erfc(-x / sqrt2): no cancellation for negative x.
inline V gelu_erf(V x) { return splat(0.5f) * x * erfc(x * splat(-kSqrtHalf)); }
// 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3).
inline V gelu_tanh(V x) {
  const V u = splat(kSqrt2OverPi) * (x + splat(kGeluC) * x * x * x);
  return x * sigmoid(splat(2.0f) * u);
}
inline V silu(V x) { return x * sigmoid(x); }

// The density e^(-x^2 / 2) / sqrt(2 pi) is erfc's own e^(-z^2), z = -x / sqrt2 (z^2 split
// exactly, so no less accurate than exp(-0.5 x x)); 0 past |x| = 14.1, where it is below
// float's smallest value.
// GELU's slope cdf + x pdf from erfc's c = erfc(-x / sqrt2) and gauss = e^(-x^2 / 2): the
// one form the gradient and with_derivative share, so both round alike on every compiler.
inline V gelu_erf_slope(V x, V c, V gauss) {
  const V cdf = splat(0.5f) * c;
  const V pdf = gauss * splat(kInvSqrt2Pi);
  return cdf + x * pdf;
}
inline V gelu_erf_backward(V g, V x) {
  V gauss;
  const V c = erfc(x * splat(-kSqrtHalf), &gauss);
  return g * gelu_erf_slope(x, c, gauss);
}
// With e = e^-2|u| and r = 1 / (1 + e): 1 + tanh(u) = 2 sigmoid(2u) and 1 - tanh(u)^2 =
// 4 e r^2, neither of which cancels as t -> +-1. Past |x| = 20 the derivative is 1 or 0 in
// float; clamping there keeps x^3 finite (so the second term is 0, not 0 * inf).
inline V gelu_tanh_backward(V g, V x) {
  const V xc = select(x > splat(20.0f), splat(20.0f), select(x < splat(-20.0f), splat(-20.0f), x));
  const V x2 = xc * xc;
  const V u = splat(kSqrt2OverPi) * (xc + splat(kGeluC) * x2 * xc);
  const V e = exp(splat(-2.0f) * vabs(u));
  const V r = splat(1.0f) / (splat(1.0f) + e);
  const V half_one_plus_t = select(u < splat(0.0f), e * r, r);
  const V dt = splat(4.0f) * e * r * r * splat(kSqrt2OverPi) * (splat(1.0f) + splat(3.0f * kGeluC) * x2);
  return g * (half_one_plus_t + splat(0.5f) * x * dt);
}
// s (1 + x (1 - s)) with s = sigmoid(x) and 1 - s = sigmoid(-x) both from e = e^-|x|, so
// 1 - s keeps its relative accuracy for large x instead of cancelling.
inline V silu_backward(V g, V x) {
  const V e = exp(-vabs(x));
  const V r = splat(1.0f) / (splat(1.0f) + e);
  const M neg = x < splat(0.0f);
  const V s = select(neg, e * r, r), one_minus_s = select(neg, r, e * r);
  return g * s * (splat(1.0f) + x * one_minus_s);
}

inline V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
inline void store(float* p, V v) { std::memcpy(p, &v, sizeof(V)); }

// y = f(x) over n floats: whole registers, then the tail through a zero-padded register.
// The loops below prefetch their inputs kPrefetch floats (1 KiB) ahead. These functions
// spend tens of cycles per register, so the hardware's prefetcher, which follows the loads,
// falls behind when the input is not in this core's cache (a product's result written by
// the other thread's share), and the loop would wait on its loads.
// (The address is formed as an integer: a pointer past the end of the array would be
// undefined behaviour, and a prefetch of any address is harmless.)
constexpr int64_t kPrefetch = 256;
inline void prefetch_ahead(const float* p) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) + kPrefetch * sizeof(float)));
}

template <class F>
void map1(const float* x, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    prefetch_ahead(x + i);
    store(y + i, f(load(x + i)));
  }
  if (i < n) {
    float bx[W] = {}, by[W];
    std::memcpy(bx, x + i, size_t(n - i) * sizeof(float));
    store(by, f(load(bx)));
    std::memcpy(y + i, by, size_t(n - i) * sizeof(float));
  }
}
template <class F>
void map2(const float* a, const float* b, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    prefetch_ahead(a + i);
    prefetch_ahead(b + i);
    store(y + i, f(load(a + i), load(b + i)));
  }
  if (i < n) {
    float ba[W] = {}, bb[W] = {}, by[W];
    std::memcpy(ba, a + i, size_t(n - i) * sizeof(float));
    std::memcpy(bb, b + i, size_t(n - i) * sizeof(float));
    store(by, f(load(ba), load(bb)));
    std::memcpy(y + i, by, size_t(n - i) * sizeof(float));
  }
}

// y = f(x, &d) over n floats, f also giving a second result d, in one pass (d may be x:
// each register of x is read before its lanes of d are written).
template <class F>
void map1_twice(const float* x, float* y, float* d, int64_t n, F f) {
  int64_t i = 0;
  V second;
  for (; i + W <= n; i += W) {
    prefetch_ahead(x + i);
    store(y + i, f(load(x + i), &second));
    store(d + i, second);
  }
  if (i < n) {
    float bx[W] = {}, by[W], bd[W];
    std::memcpy(bx, x + i, size_t(n - i) * sizeof(float));
    store(by, f(load(bx), &second));
    store(bd, second);
    std::memcpy(y + i, by, size_t(n - i) * sizeof(float));
    std::memcpy(d + i, bd, size_t(n - i) * sizeof(float));
  }
}

}  // namespace

void unary(Fn fn, const float* x, float* y, int64_t n, float param) {
  switch (fn) {
    case Fn::Exp: return map1(x, y, n, [](V v) { return exp(v); });
    case Fn::Log: return map1(x, y, n, [](V v) { return log(v); });
    case Fn::Log1p: return map1(x, y, n, [](V v) { return log1p(v); });
    case Fn::Tanh: return map1(x, y, n, [](V v) { return tanh(v); });
    case Fn::Sigmoid: return map1(x, y, n, [](V v) { return sigmoid(v); });
    case Fn::GeluErf: return map1(x, y, n, [](V v) { return gelu_erf(v); });
    case Fn::GeluTanh: return map1(x, y, n, [](V v) { return gelu_tanh(v); });
    case Fn::Silu: return map1(x, y, n, [](V v) { return silu(v); });
    case Fn::PowScalar: {
      const V e = splat(param);
      return map1(x, y, n, [e](V v) { return pow(v, e); });
    }
    default: return;
  }
}

void with_derivative(Fn fn, const float* x, float* y, float* d, int64_t n) {
  switch (fn) {
    // One erfc for both: the value as gelu_erf computes it, the derivative as
    // gelu_erf_backward does for an incoming gradient of 1.
    case Fn::GeluErf:
      return map1_twice(x, y, d, n, [](V v, V* dv) {
        V gauss;
        const V c = erfc(v * splat(-kSqrtHalf), &gauss);
        *dv = gelu_erf_slope(v, c, gauss);
        return splat(0.5f) * v * c;
      });
    case Fn::GeluTanh:
      return map1_twice(x, y, d, n, [](V v, V* dv) {
        *dv = gelu_tanh_backward(splat(1.0f), v);
        return gelu_tanh(v);
      });
    case Fn::Silu:
      return map1_twice(x, y, d, n, [](V v, V* dv) {
        *dv = silu_backward(splat(1.0f), v);
        return silu(v);
      });
    default: return;
  }
}

void binary(Fn fn, const float* a, const float* b, float* y, int64_t n) {
  switch (fn) {
    case Fn::Pow: return map2(a, b, y, n, [](V u, V v) { return pow(u, v); });
    case Fn::GeluErfBackward: return map2(a, b, y, n, [](V g, V v) { return gelu_erf_backward(g, v); });
    case Fn::GeluTanhBackward: return map2(a, b, y, n, [](V g, V v) { return gelu_tanh_backward(g, v); });
    case Fn::SiluBackward: return map2(a, b, y, n, [](V g, V v) { return silu_backward(g, v); });
    default: return;
  }
}

}  // namespace ampgrad::cpu::vmath::AG_VMATH_NS
