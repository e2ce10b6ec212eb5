// transpose16: a 16 x 16 block of 32-bit values transposed through AVX-512 registers, for
// kernels compiled for baseline x86-64 that call it from their own AVX-512 code (attention's
// k and v transposes, tile_gemm_bf16's pairs). Bits are moved, never converted, so the
// values may be any 32-bit words viewed as floats.
#pragma once

#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>

#include "cpu/avx512.h"

namespace ampgrad::cpu {

AG_AVX512_CODE_BEGIN
// dst[c * ldd + r] = src[r * lds + c] for a 16 x 16 block: 16 rows in registers, then the
// usual three rounds of shuffles (32-bit pairs, 64-bit pairs, 128-bit lanes twice).
__attribute__((target("avx512f"))) inline void transpose16(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
    const __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // r[4q + j] holds, in its 128-bit lane L, column 4L + j of rows 4q..4q+3: two rounds of
  // lane shuffles put column k of all 16 rows into r[k].
  for (int j = 0; j < 4; ++j) {
    t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
    t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xdd);
    t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xdd);
  }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
  }
  for (int k = 0; k < 16; ++k) _mm512_storeu_ps(dst + k * ldd, r[k]);
}

// The full 16 x 16 blocks of an R x C transpose, dst[c * ldd + r] = src[r * lds + c]; the
// caller checks that the CPU has AVX-512 and copies the leftover rows (r >= R / 16 * 16)
// and columns (c >= C / 16 * 16).
__attribute__((target("avx512f"))) inline void transpose_blocks(const float* src, int64_t lds, int64_t R, int64_t C,
                                                                 float* dst, int64_t ldd) {
  for (int64_t r0 = 0; r0 + 16 <= R; r0 += 16)
    for (int64_t c0 = 0; c0 + 16 <= C; c0 += 16) transpose16(src + r0 * lds + c0, lds, dst + c0 * ldd + r0, ldd);
}
AG_AVX512_CODE_END

}  // namespace ampgrad::cpu
#endif
