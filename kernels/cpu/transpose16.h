// transpose16: a 16 x 16 block of 32-bit values transposed through AVX-512 registers, for
// kernels compiled for baseline x86-64 that call it from their own AVX-512 code (attention's
// k and v transposes, tile_gemm_bf16's pairs, the CPU backend's transposed copies);
// transpose32x32_16, a 32 x 32 block of 16-bit values, built on it; and transpose8x8_64, an
// 8 x 8 block of 64-bit values. Bits are moved, never converted, so the values may be any
// words of their width viewed as floats.
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
// dst[c * ldd + r] = src[r * lds + c] for a 32 x 32 block of 16-bit words (AVX-512 BW), ldd
// even. Rows 2p and 2p + 1 interleaved give 32-bit pairs, B[p][c] = (src(2p, c), src(2p + 1,
// c)); row c of the transpose is row c of B^T read as 16-bit words, so B (two 16 x 16
// halves, through an L1 buffer) goes through transpose16.
__attribute__((target("avx512f,avx512bw"))) inline void transpose32x32_16(const uint16_t* src, int64_t lds,
                                                                          uint16_t* dst, int64_t ldd) {
  alignas(64) uint32_t b[2][16 * 16];  // b[h][p * 16 + c'] = B[p][16 h + c']
  __m512i lo_idx, hi_idx;
  {
    alignas(64) uint16_t lo[32], hi[32];
    for (int i = 0; i < 16; ++i) {
      lo[2 * i] = uint16_t(i), lo[2 * i + 1] = uint16_t(32 + i);            // columns 0..15
      hi[2 * i] = uint16_t(16 + i), hi[2 * i + 1] = uint16_t(48 + i);       // columns 16..31
    }
    lo_idx = _mm512_load_si512(lo);
    hi_idx = _mm512_load_si512(hi);
  }
  for (int p = 0; p < 16; ++p) {
    const __m512i r0 = _mm512_loadu_si512(src + 2 * p * lds), r1 = _mm512_loadu_si512(src + (2 * p + 1) * lds);
    _mm512_store_si512(b[0] + p * 16, _mm512_permutex2var_epi16(r0, lo_idx, r1));
    _mm512_store_si512(b[1] + p * 16, _mm512_permutex2var_epi16(r0, hi_idx, r1));
  }
  for (int h = 0; h < 2; ++h)
    transpose16(reinterpret_cast<const float*>(b[h]), 16, reinterpret_cast<float*>(dst + 16 * h * ldd), ldd / 2);
}
// dst[c * ldd + r] = src[r * lds + c] for an 8 x 8 block of 64-bit words: pairs of rows
// interleaved, then two rounds of 128-bit lane shuffles, as transpose16's last steps.
__attribute__((target("avx512f"))) inline void transpose8x8_64(const double* src, int64_t lds, double* dst,
                                                                int64_t ldd) {
  __m512d r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm512_loadu_pd(src + i * lds);
  for (int i = 0; i < 8; i += 2) {  // t[i]: columns 0, 2, 4, 6 of rows i, i + 1; t[i + 1]: 1, 3, 5, 7
    t[i] = _mm512_unpacklo_pd(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_pd(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4)  // r[i + j]: columns j and j + 4 of rows i..i + 3
    for (int j = 0; j < 2; ++j) {
      r[i + j] = _mm512_shuffle_f64x2(t[i + j], t[i + 2 + j], 0x88);
      r[i + 2 + j] = _mm512_shuffle_f64x2(t[i + j], t[i + 2 + j], 0xdd);
    }
  for (int j = 0; j < 4; ++j) {  // t[k]: column k of all eight rows
    t[j] = _mm512_shuffle_f64x2(r[j], r[4 + j], 0x88);
    t[4 + j] = _mm512_shuffle_f64x2(r[j], r[4 + j], 0xdd);
  }
  for (int k = 0; k < 8; ++k) _mm512_storeu_pd(dst + k * ldd, t[k]);
}
AG_AVX512_CODE_END

}  // namespace ampgrad::cpu
#endif
