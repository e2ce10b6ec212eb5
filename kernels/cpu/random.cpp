// Random fills from the counter-based Philox generator: element i of a draw uses counter
// offset + i, so results depend on (seed, offset) only.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "cpu/avx512.h"
#include "cpu/cpu_backend.h"
#include "cpu/parallel.h"
#include "cpu/vec.h"
#include "ampgrad/philox.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ampgrad::cpu {
namespace {

// Philox4x32-10 for kLanes consecutive counters at once: kernels::Philox4x32 (ampgrad/philox.h,
// the definition) lane by lane, or its rounds in 16-lane AVX-512 registers, which beats one
// counter at a time (bench_ops' dropout rows time it).
constexpr int kLanes = 16;

struct PhiloxLanes {
  uint32_t out[4][kLanes];
};

// Lane by lane, from the definition.
[[gnu::always_inline]] inline void philox_lanes(uint64_t seed, uint64_t first, PhiloxLanes& r) {
  for (int j = 0; j < kLanes; ++j) {
    const kernels::Philox4x32 x(seed, first + uint64_t(j));
    for (int k = 0; k < 4; ++k) r.out[k][j] = x.out[k];
  }
}

#if defined(__x86_64__)
AG_AVX512_CODE_BEGIN
// (hi, lo) 32-bit halves of m * c for 16 lanes: VPMULUDQ multiplies the even lanes (and,
// shifted down, the odd ones) into 64-bit products, whose halves are blended back.
AG_AVX512_TARGET inline void mulhilo16(__m512i c, __m512i m, __m512i& hi, __m512i& lo) {
  const __m512i pe = _mm512_mul_epu32(c, m), po = _mm512_mul_epu32(_mm512_srli_epi64(c, 32), m);
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(pe, 32), po);
  lo = _mm512_mask_blend_epi32(0xAAAA, pe, _mm512_slli_epi64(po, 32));
}

AG_AVX512_TARGET inline void philox_lanes_avx512(uint64_t seed, uint64_t first, PhiloxLanes& r) {
  static_assert(kLanes == 16);
  const __m512i j = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  // 64-bit counters first + j: lanes 0-7 and 8-15, split into low and high words
  const __m512i a = _mm512_add_epi64(_mm512_set1_epi64(int64_t(first)), j);
  const __m512i b = _mm512_add_epi64(_mm512_set1_epi64(int64_t(first + 8)), j);
  const __m512i lo_idx = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i hi_idx = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  __m512i c0 = _mm512_permutex2var_epi32(a, lo_idx, b), c1 = _mm512_permutex2var_epi32(a, hi_idx, b);
  __m512i c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
  const __m512i m0 = _mm512_set1_epi32(int(0xD2511F53u)), m1 = _mm512_set1_epi32(int(0xCD9E8D57u));
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    __m512i h0, l0, h1, l1;
    mulhilo16(c0, m0, h0, l0);
    mulhilo16(c2, m1, h1, l1);
    const __m512i n0 = _mm512_xor_si512(_mm512_xor_si512(h1, c1), _mm512_set1_epi32(int(k0)));
    const __m512i n2 = _mm512_xor_si512(_mm512_xor_si512(h0, c3), _mm512_set1_epi32(int(k1)));
    c0 = n0, c1 = l1, c2 = n2, c3 = l0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  _mm512_storeu_si512(r.out[0], c0);
  _mm512_storeu_si512(r.out[1], c1);
  _mm512_storeu_si512(r.out[2], c2);
  _mm512_storeu_si512(r.out[3], c3);
}
#endif

// p[i] = draw(r, j) for i in [b, e), r the Philox outputs of counters offset + i0 ..,
// element i in lane j = i - i0: element i always uses counter offset + i.
template <bool kAvx512, class T, class Draw>
[[gnu::always_inline]] inline void draw_range(T* p, int64_t b, int64_t e, uint64_t seed, uint64_t offset,
                                              const Draw& draw) {
  PhiloxLanes r;
  for (int64_t i0 = b; i0 < e; i0 += kLanes) {
#if defined(__x86_64__)
    if constexpr (kAvx512) philox_lanes_avx512(seed, offset + uint64_t(i0), r);
    else
#endif
      philox_lanes(seed, offset + uint64_t(i0), r);
    const int n = int(std::min<int64_t>(kLanes, e - i0));
    for (int j = 0; j < n; ++j) p[i0 + j] = draw(r, j);
  }
}

#if defined(__x86_64__)
template <class T, class Draw>
AG_AVX512_TARGET void draw_range_avx512(T* p, int64_t b, int64_t e, uint64_t seed, uint64_t offset, const Draw& draw) {
  draw_range<true>(p, b, e, seed, offset, draw);
}
AG_AVX512_CODE_END
#else
template <class T, class Draw>
void draw_range_avx512(T*, int64_t, int64_t, uint64_t, uint64_t, const Draw&) {}  // never called: run_variant
#endif

// Fills out with draw.template operator()<T>(r, j) (see draw_range), in the variant of the
// kernels' level (cpu/isa.h).
template <class Draw>
void fill_random(const Tensor& out, const char* op, uint64_t seed, uint64_t offset, const Draw& draw) {
  Tensor dst = out.is_contiguous() ? out : make_tensor(out.sizes(), out.dtype(), out.device());
  dispatch_floating(dst.dtype(), op, [&]<class T>() {
    T* p = static_cast<T*>(dst.raw_data());
    const auto typed = [&](const PhiloxLanes& r, int j) { return draw.template operator()<T>(r, j); };
    parallel_for(0, dst.numel(), 4096, [&](int64_t b, int64_t e) {
      using Typed = std::remove_const_t<decltype(typed)>;
      run_variant<draw_range<false, T, Typed>, draw_range_avx512<T, Typed>>(p, b, e, seed, offset, typed);
    });
  });
  if (!out.is_contiguous()) cpu_backend().copy(dst, out);
}

// The largest value of T below x (and not below floor), for the rare draw that rounds up.
template <class T>
T below(double x, double floor) {
  if constexpr (is_float16_v<T>) {
    T t = cast<T>(x);
    while (cast<double>(t) >= x) {
      const uint16_t b = t.bits();
      // one step toward -inf: positive values lose a unit in the last place, negative gain one
      t = T::from_bits((b & 0x7FFF) == 0 ? uint16_t(0x8001) : (b & 0x8000) ? uint16_t(b + 1) : uint16_t(b - 1));
    }
    return cast<double>(t) < floor ? cast<T>(floor) : t;
  } else {
    const T t = std::nextafter(T(x), -std::numeric_limits<T>::infinity());
    return t < T(floor) ? T(floor) : t;
  }
}

}  // namespace

void CpuBackend::uniform(const Tensor& out, double low, double high, uint64_t seed, uint64_t offset) {
  const double span = high - low;
  fill_random(out, "uniform", seed, offset, [&]<class T>(const PhiloxLanes& r, int j) {
    const T v = cast<T>(low + span * kernels::uniform01(r.out[0][j], r.out[1][j]));
    // Rounding to the dtype may reach the open end (once in 2^9 bfloat16 draws of [0, 1)):
    // such a draw takes the dtype's largest value below `high` instead.
    return cast<double>(v) < high ? v : below<T>(high, low);
  });
}

void CpuBackend::normal(const Tensor& out, double mean, double std, uint64_t seed, uint64_t offset) {
  fill_random(out, "normal", seed, offset, [&]<class T>(const PhiloxLanes& r, int j) {
    const double u1 = 1.0 - kernels::uniform01(r.out[0][j], r.out[1][j]);  // (0, 1]
    const double u2 = kernels::uniform01(r.out[2][j], r.out[3][j]);
    return cast<T>(mean + std * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  });
}

}  // namespace ampgrad::cpu
