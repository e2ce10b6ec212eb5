// tile_gemm's own AVX-512 kernel for the small products of the attention tiles (gemm.h).
//
// A 64 x 64 x 32 product is about 130 thousand multiply-adds, a few microseconds of
// AVX-512 work; oneDNN's sgemm spends more than that per call on its dispatch and packing,
// so attention's tile products ran slower through it. This kernel keeps a
// block of 4 rows x 64 columns of c in 16 vector registers and streams op(b)'s rows through
// them; a transposed b is first copied into a [k, n] buffer on the stack. Compiled for
// AVX-512 by a target attribute (the library is built for baseline x86-64, as attention's
// row work); small_tile_gemm answers false below the kernels' level avx512 (cpu/isa.h: a CPU
// without AVX-512, or hw::set_kernel_isa) or where the product is not small, and tile_gemm
// then takes its general path (oneDNN's sgemm or Eigen).
#include <algorithm>
#include <cstdint>

#include "cpu/avx512.h"
#include "cpu/gemm.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ampgrad::cpu {
namespace {

constexpr int64_t kMaxM = 64;        // a small product: rows of c,
constexpr int64_t kMaxNK = 256;      // columns of c and the inner dimension each,
constexpr int64_t kMaxBt = 64 * 256; // and a transposed b of at most this many elements (64 KiB)
constexpr int64_t kCols = 64;        // columns of c per register block: 4 vectors of 16

#if defined(__x86_64__)
#define AG_AVX512 __attribute__((target("avx512f")))

// One block of c: rows i0..i0+MR, columns j0..j0+nc (nc <= 16 * NV), from op(a) and the
// [k, n] matrix bk (leading dimension ldbk). MR, NV and TA are template parameters so that
// the accumulators are named registers, not an array in memory.
template <int MR, int NV, bool TA>
AG_AVX512 inline void block(int64_t k, float alpha, const float* a, int64_t lda, const float* bk, int64_t ldbk,
                            float beta, float* c, int64_t ldc, int64_t i0, int64_t j0, int64_t nc) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  // Only the last vector of the block may be partial.
  const __mmask16 last = __mmask16((uint32_t(1) << (nc - 16 * (NV - 1))) - 1);
  const float* ap = TA ? a + i0 : a + i0 * lda;
  for (int64_t p = 0; p < k; ++p) {
    const float* brow = bk + p * ldbk + j0;
    __m512 b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      b[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(last, brow + 16 * v) : _mm512_loadu_ps(brow + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 ab = _mm512_set1_ps(TA ? ap[p * lda + r] : ap[r * lda + p]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(ab, b[v], acc[r][v]);
    }
  }
  store_block(acc, alpha, beta, c + i0 * ldc + j0, ldc, last);
}

// The blocks of a column range of nc <= 64 columns, NV = ceil(nc / 16) vectors wide: 4
// rows at a time, or 8 when the range is at most two vectors wide (attention's head size
// 32), so that 16 accumulators hide the FMA latency and each b row loaded serves 8 rows.
template <int NV, bool TA>
AG_AVX512 void columns(int64_t m, int64_t k, float alpha, const float* a, int64_t lda, const float* bk, int64_t ldbk,
                       float beta, float* c, int64_t ldc, int64_t j0, int64_t nc) {
  int64_t i0 = 0;
  if constexpr (NV <= 2)
    for (; i0 + 8 <= m; i0 += 8) block<8, NV, TA>(k, alpha, a, lda, bk, ldbk, beta, c, ldc, i0, j0, nc);
  for (; i0 + 4 <= m; i0 += 4) block<4, NV, TA>(k, alpha, a, lda, bk, ldbk, beta, c, ldc, i0, j0, nc);
  for (; i0 < m; ++i0) block<1, NV, TA>(k, alpha, a, lda, bk, ldbk, beta, c, ldc, i0, j0, nc);
}

template <bool TA>
AG_AVX512 void all_columns(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                           const float* bk, int64_t ldbk, float beta, float* c, int64_t ldc) {
  for (int64_t j0 = 0; j0 < n; j0 += kCols) {
    const int64_t nc = std::min(kCols, n - j0);
    switch ((nc + 15) / 16) {
      case 1: columns<1, TA>(m, k, alpha, a, lda, bk, ldbk, beta, c, ldc, j0, nc); break;
      case 2: columns<2, TA>(m, k, alpha, a, lda, bk, ldbk, beta, c, ldc, j0, nc); break;
      case 3: columns<3, TA>(m, k, alpha, a, lda, bk, ldbk, beta, c, ldc, j0, nc); break;
      default: columns<4, TA>(m, k, alpha, a, lda, bk, ldbk, beta, c, ldc, j0, nc); break;
    }
  }
}

AG_AVX512 void gemm_avx512(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // op(b) as [k, n] rows: b itself, or its transpose copied into bt.
  alignas(64) float bt[kMaxBt];
  const float* bk = b;
  int64_t ldbk = ldb;
  if (tb) {
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p) bt[p * n + j] = b[j * ldb + p];
    bk = bt;
    ldbk = n;
  }
  if (ta) all_columns<true>(m, n, k, alpha, a, lda, bk, ldbk, beta, c, ldc);
  else all_columns<false>(m, n, k, alpha, a, lda, bk, ldbk, beta, c, ldc);
}
#undef AG_AVX512
#endif

}  // namespace

bool small_tile_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
#if defined(__x86_64__)
  if (!use_avx512() || m > kMaxM || n > kMaxNK || k > kMaxNK || k == 0 || (tb && n * k > kMaxBt)) return false;
  gemm_avx512(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  return true;
#else
  (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b, (void)ldb, (void)beta,
      (void)c, (void)ldc;
  return false;
#endif
}

}  // namespace ampgrad::cpu
