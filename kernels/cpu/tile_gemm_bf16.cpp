// tile_gemm_bf16 and Bf16Pairs (gemm.h): the attention tiles' products for bfloat16
// inputs, on AMX-BF16 tiles or AVX512-BF16 dot products.
//
// Both multiply pairs of bfloat16 values along the inner dimension and sum in float, so
// both take the right operand in rows of pairs (Bf16Pairs, packed once per attention head)
// and the left one as rows of pairs on the stack, made per call (pack_a: a tile of
// probabilities or score gradients rounded, or bfloat16 rows of q or dO copied).
//   AMX     (the kernels' level amx) c in blocks of 32 x 32, four 16 x 16 float tiles, each
//           TDPBF16PS a 16 x 16 x 32 product: a 64 x 64 x 64 product is 32 of them, against
//           8192 AVX-512 FMAs for the float kernel. The left operand is packed in rows of
//           32-value blocks, zero past k; the tiles then read b's pairs past the product's
//           rows and columns, which is exact only where they are finite (0 * x == 0), so
//           AMX takes a packed b only when all of it is finite (Bf16Pairs::finite) and b's
//           buffer is padded so those reads stay inside it.
//   AVX512  (the level avx512_bf16, and any b that AMX declines) VDPBF16PS, 32
//           multiply-adds per instruction where the float kernel (tile_gemm_small.cpp) does
//           16, with its register blocking: 4 rows by 64 columns of c in 16 accumulators.
//           On Sapphire Rapids this ran slower than the float kernel (one port runs
//           VDPBF16PS, two run FMAs), which AMX replaces there.
// Compiled for those ISAs by target attributes (the library is built for baseline x86-64).
#include <algorithm>
#include <cstdint>

#include "cpu/avx512.h"
#include "cpu/gemm.h"
#include "cpu/transpose16.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ampgrad::cpu {
namespace {

constexpr int64_t kMaxM = 64;   // rows of c,
constexpr int64_t kMaxK = 256;  // and the inner dimension, that the stack buffer holds
constexpr int64_t kRows = 4;    // rows of c per register block
constexpr int64_t kCols = 64;   // columns of c per register block: 4 vectors of 16

constexpr int64_t kPad = 16;   // pair rows of zeros after a packed b, for AMX's reads past k

// The kernels' level (cpu/isa.h) says which instructions run: VDPBF16PS from avx512_bf16,
// AMX tiles at amx (a level that cpu_features() grants only once Linux gave the process the
// tile data state, ARCH_REQ_XCOMP_PERM, as oneDNN asks for its own AMX kernels).
bool use_bf16() { return kernel_isa() >= KernelIsa::Avx512Bf16; }

#if defined(__x86_64__) && defined(__linux__)
bool use_amx() { return kernel_isa() >= KernelIsa::Amx; }
#else
bool use_amx() { return false; }
#endif

#if defined(__x86_64__)
AG_AVX512_CODE_BEGIN
#define AG_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

inline __mmask16 first(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? 0 : __mmask16((1u << n) - 1); }
inline __mmask32 first32(int64_t n) { return n >= 32 ? __mmask32(0xFFFFFFFF) : n <= 0 ? 0 : __mmask32((1u << n) - 1); }

// 16 pairs (r0[j], r1[j]) for j < 16 (lanes past `mk` zero; r1 null: zero second halves),
// each pair one 32-bit lane, the element of r0 in its low half; rounded to nearest even.
AG_BF16 inline __m512i pair_rows(const float* r0, const float* r1, __mmask16 mk) {
  const __m512 lo = _mm512_maskz_loadu_ps(mk, r0);
  const __m512 hi = r1 ? _mm512_maskz_loadu_ps(mk, r1) : _mm512_setzero_ps();
  // [lo's 16 values | hi's 16 values] as 16-bit lanes, then interleaved
  const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                       5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, both);
}

// The same pairs from two rows already in bfloat16: no rounding, only interleaving.
AG_BF16 inline __m512i pair_rows(const uint16_t* r0, const uint16_t* r1, __mmask16 mk) {
  const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, r0));
  const __m512i hi = r1 ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, r1)) : _mm512_setzero_si512();
  return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}

// op(a) as rows of pairs, ap[i * la + q] for i < m and q < la (la >= (k + 1) / 2, a
// multiple of 16), zero past k. From float a, rounded ([m, k], or [k, m] when ta):
AG_BF16 void pack_a(bool ta, int64_t m, int64_t k, const float* a, int64_t lda, uint32_t* ap, int64_t la) {
  if (!ta) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < 2 * la; p += 32) {
        const float* row = a + i * lda + p;
        const __m512 lo = _mm512_maskz_loadu_ps(first(k - p), row);
        const __m512 hi = _mm512_maskz_loadu_ps(first(k - p - 16), row + 16);
        _mm512_storeu_si512(ap + i * la + p / 2, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
      }
    return;
  }
  // 16 x 16 blocks of pairs (q, i) from pairs of a's rows, transposed into ap's rows
  const int64_t kq = (k + 1) / 2;
  alignas(64) uint32_t blk[16 * 16];
  for (int64_t q0 = 0; q0 < la; q0 += 16)
    for (int64_t i0 = 0; i0 < m; i0 += 16) {
      for (int64_t qq = 0; qq < 16; ++qq) {
        const int64_t q = q0 + qq;
        const float* r0 = a + 2 * q * lda + i0;
        const __m512i v =
            q < kq ? pair_rows(r0, 2 * q + 1 < k ? r0 + lda : nullptr, first(m - i0)) : _mm512_setzero_si512();
        _mm512_store_si512(blk + qq * 16, v);
      }
      // rows of ap past m (up to the block's 16) are scratch: the caller's buffer holds 64
      transpose16(reinterpret_cast<const float*>(blk), 16, reinterpret_cast<float*>(ap + i0 * la + q0), la);
    }
}
// and from bfloat16 rows [m, k]: copied as they are.
AG_BF16 void pack_a(int64_t m, int64_t k, const uint16_t* a, int64_t lda, uint32_t* ap, int64_t la) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < 2 * la; p += 32)
      _mm512_storeu_si512(ap + i * la + p / 2, _mm512_maskz_loadu_epi16(first32(k - p), a + i * lda + p));
}

// One block of c: rows i0..i0+MR, columns j0..j0+nc (nc <= 16 * NV), from the rows of
// pairs ap (la apart) and b's pairs bp (row q of pairs at bp + q * ldb).
template <int MR, int NV>
AG_BF16 inline void block(int64_t kq, float alpha, const uint32_t* ap, int64_t la, const uint32_t* bp, int64_t ldb,
                          float beta, float* c, int64_t ldc, int64_t i0, int64_t j0, int64_t nc) {
  __m512 acc[MR][NV];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  const __mmask16 last = first(nc - 16 * (NV - 1));  // only the last vector may be partial
  for (int64_t q = 0; q < kq; ++q) {
    const uint32_t* brow = bp + q * ldb + j0;
    __m512i b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      b[v] = v == NV - 1 ? _mm512_maskz_loadu_epi32(last, brow + 16 * v) : _mm512_loadu_si512(brow + 16 * v);
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const __m512i a = _mm512_set1_epi32(int(ap[(i0 + r) * la + q]));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        acc[r][v] = _mm512_dpbf16_ps(acc[r][v], reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b[v]));
    }
  }
  store_block(acc, alpha, beta, c + i0 * ldc + j0, ldc, last);
}

template <int NV>
AG_BF16 void columns(int64_t m, int64_t kq, float alpha, const uint32_t* ap, int64_t la, const uint32_t* bp,
                     int64_t ldb, float beta, float* c, int64_t ldc, int64_t j0, int64_t nc) {
  int64_t i0 = 0;
  for (; i0 + kRows <= m; i0 += kRows) block<4, NV>(kq, alpha, ap, la, bp, ldb, beta, c, ldc, i0, j0, nc);
  for (; i0 < m; ++i0) block<1, NV>(kq, alpha, ap, la, bp, ldb, beta, c, ldc, i0, j0, nc);
}

// c = alpha a b + beta c with VDPBF16PS, a as rows of pairs (ap, la apart).
AG_BF16 void gemm_dot(int64_t m, int64_t n, int64_t k, float alpha, const uint32_t* ap, int64_t la,
                      const uint32_t* bp, int64_t ldb, float beta, float* c, int64_t ldc) {
  const int64_t kq = (k + 1) / 2;
  for (int64_t j0 = 0; j0 < n; j0 += kCols) {
    const int64_t nc = std::min(kCols, n - j0);
    switch ((nc + 15) / 16) {
      case 1: columns<1>(m, kq, alpha, ap, la, bp, ldb, beta, c, ldc, j0, nc); break;
      case 2: columns<2>(m, kq, alpha, ap, la, bp, ldb, beta, c, ldc, j0, nc); break;
      case 3: columns<3>(m, kq, alpha, ap, la, bp, ldb, beta, c, ldc, j0, nc); break;
      default: columns<4>(m, kq, alpha, ap, la, bp, ldb, beta, c, ldc, j0, nc); break;
    }
  }
}

#if defined(__linux__)
#define AG_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))

// The tile configuration (palette 1): all eight tiles 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};
// In static storage: the compiler does not see LDTILECFG read the bytes of a local copy,
// and dropped their stores.
constexpr TileConfig kTileConfig{};

// Bf16TileScopes open on this thread: while one is, the tile configuration stays loaded.
thread_local int tile_scopes = 0;

AG_AMX void load_tile_config() { _tile_loadconfig(&kTileConfig); }
AG_AMX void release_tiles() { _tile_release(); }

// c = alpha a b + beta c on AMX tiles: a as rows of pairs (ap, la apart, la a multiple of
// 16, zero past k; 64 rows readable); bp the first used pair row of b at column 0 of the
// product (ldb pairs apart), all of b finite and padded by kPad zero pair rows.
AG_AMX void gemm_amx(int64_t m, int64_t n, float alpha, const uint32_t* ap, int64_t la, const uint32_t* bp,
                     int64_t ldb, float beta, float* c, int64_t ldc) {
  if (tile_scopes == 0) load_tile_config();
  // GCC 12's _tile_loadd is an asm that does not say it reads memory: without this barrier
  // the stores into ap could be dropped or moved past the loads.
  __asm__ volatile("" ::: "memory");
  alignas(64) float cb[32 * 32];
  for (int64_t i0 = 0; i0 < m; i0 += 32)
    for (int64_t j0 = 0; j0 < n; j0 += 32) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t kk = 0; kk < la / 16; ++kk) {
        const uint32_t* at = ap + i0 * la + kk * 16;
        const uint32_t* bt = bp + kk * 16 * ldb + j0;
        _tile_loadd(4, at, la * 4);
        _tile_loadd(5, at + 16 * la, la * 4);
        _tile_loadd(6, bt, ldb * 4);
        _tile_loadd(7, bt + 16, ldb * 4);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, cb, 128);
      _tile_stored(1, cb + 16, 128);
      _tile_stored(2, cb + 16 * 32, 128);
      _tile_stored(3, cb + 16 * 32 + 16, 128);
      for (int64_t r = 0; r < std::min<int64_t>(32, m - i0); ++r) {
        const __m512 acc[1][2] = {{_mm512_load_ps(cb + r * 32), _mm512_load_ps(cb + r * 32 + 16)}};
        float* crow = c + (i0 + r) * ldc + j0;
        if (n - j0 > 16) store_block<1, 2>(acc, alpha, beta, crow, ldc, first(n - j0 - 16));
        else {
          const __m512 one[1][1] = {{acc[0][0]}};
          store_block<1, 1>(one, alpha, beta, crow, ldc, first(n - j0));
        }
      }
    }
  if (tile_scopes == 0) release_tiles();
}
#undef AG_AMX
#endif

// Packs b [K, N] (float or bfloat16 rows) into pairs (Bf16Pairs' layout); returns whether
// every value is finite.
template <class S>
AG_BF16 bool pack_pairs(const S* b, int64_t ldb, int64_t K, int64_t N, uint32_t* out) {
  const __m512i exp = _mm512_set1_epi16(0x7F80);  // a bfloat16's exponent bits: all set for inf and NaN
  __mmask32 special = 0;
  for (int64_t q = 0; q < (K + 1) / 2; ++q) {
    const S* r0 = b + 2 * q * ldb;
    for (int64_t j = 0; j < N; j += 16) {
      const __m512i v = pair_rows(r0 + j, 2 * q + 1 < K ? r0 + ldb + j : nullptr, first(N - j));
      special |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(v, exp), exp);
      _mm512_mask_storeu_epi32(out + q * N + j, first(N - j), v);
    }
  }
  return special == 0;
}

// Packs the transpose of bfloat16 rows m [R, C] (b = m^T, [C, R]): pair q of b's column j
// is the 32-bit word q of m's row j, so 16 x 16 blocks of words are transposed.
AG_BF16 bool pack_pairs_transposed(const uint16_t* m, int64_t ldm, int64_t R, int64_t C, uint32_t* out) {
  const __m512i exp = _mm512_set1_epi16(0x7F80);
  __mmask32 special = 0;
  const int64_t kq = (C + 1) / 2;
  alignas(64) uint32_t blk[16 * 16], tr[16 * 16];
  for (int64_t j0 = 0; j0 < R; j0 += 16)
    for (int64_t q0 = 0; q0 < kq; q0 += 16) {
      for (int64_t jj = 0; jj < 16; ++jj) {
        // words q0.. of row j0 + jj; past C (half a word when C is odd) zero
        const __m512i v = j0 + jj < R ? _mm512_maskz_loadu_epi16(first32(C - 2 * q0), m + (j0 + jj) * ldm + 2 * q0)
                                      : _mm512_setzero_si512();
        special |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(v, exp), exp);
        _mm512_store_si512(blk + jj * 16, v);
      }
      transpose16(reinterpret_cast<const float*>(blk), 16, reinterpret_cast<float*>(tr), 16);
      for (int64_t qq = 0; qq < std::min<int64_t>(16, kq - q0); ++qq)
        _mm512_mask_storeu_epi32(out + (q0 + qq) * R + j0, first(R - j0), _mm512_load_si512(tr + qq * 16));
    }
  return special == 0;
}
#undef AG_BF16
AG_AVX512_CODE_END

// c = alpha op(a) b[p0 :, j0 :] + beta c for a packed by pack(ap, la) (la given): AMX
// where it takes b, else VDPBF16PS. The checks are tile_gemm_bf16's (gemm.h).
template <class Pack>
bool run_bf16(int64_t m, int64_t n, int64_t k, float alpha, const Pack& pack, const Bf16Pairs& b, int64_t p0,
              int64_t j0, float beta, float* c, int64_t ldc) {
  const bool odd_inside = k % 2 == 1 && p0 + k < b.K;  // its last pair would take b's next row
  if (!use_bf16() || m > kMaxM || k > kMaxK || k <= 0 || p0 % 2 != 0 || odd_inside || p0 < 0 || j0 < 0 ||
      p0 + k > b.K || j0 + n > b.N)
    return false;
  if (m == 0 || n == 0) return true;
  const uint32_t* bp = b.data.data() + p0 / 2 * b.N + j0;
  const int64_t la = ((k + 1) / 2 + 15) / 16 * 16;  // pairs per row of ap: whole AMX tiles
  alignas(64) uint32_t ap[kMaxM * kMaxK / 2];
  pack(ap, la);
#if defined(__linux__)
  if (b.finite && use_amx()) {
    gemm_amx(m, n, alpha, ap, la, bp, b.N, beta, c, ldc);
    return true;
  }
#endif
  gemm_dot(m, n, k, alpha, ap, la, bp, b.N, beta, c, ldc);
  return true;
}
#endif

}  // namespace

bool tile_gemm_bf16_available() { return use_bf16(); }

Bf16TileScope::Bf16TileScope() {
#if defined(__x86_64__) && defined(__linux__)
  active_ = use_amx();
  if (active_ && tile_scopes++ == 0) load_tile_config();
#endif
}

Bf16TileScope::~Bf16TileScope() {
#if defined(__x86_64__) && defined(__linux__)
  if (active_ && --tile_scopes == 0) release_tiles();
#endif
}

// kPad zero pair rows and a row's worth more: AMX's tiles read up to 16 pair rows past the
// product's last and 32 columns past its first.
template <class F>
bool Bf16Pairs::fill(int64_t rows, int64_t cols, const F& pack) {
  K = N = 0;
  finite = false;
  if (!use_bf16()) return false;
  data.assign(size_t(((rows + 1) / 2 + kPad) * cols + 32), 0u);
  finite = pack(data.data());
  K = rows, N = cols;
  return true;
}

bool Bf16Pairs::pack(const float* b, int64_t ldb, int64_t rows, int64_t cols) {
#if defined(__x86_64__)
  return fill(rows, cols, [&](uint32_t* out) { return pack_pairs(b, ldb, rows, cols, out); });
#else
  (void)b, (void)ldb, (void)rows, (void)cols;
  return false;
#endif
}

bool Bf16Pairs::pack(const BFloat16* b, int64_t ldb, int64_t rows, int64_t cols) {
#if defined(__x86_64__)
  return fill(rows, cols,
              [&](uint32_t* out) { return pack_pairs(reinterpret_cast<const uint16_t*>(b), ldb, rows, cols, out); });
#else
  (void)b, (void)ldb, (void)rows, (void)cols;
  return false;
#endif
}

bool Bf16Pairs::pack_transposed(const BFloat16* m, int64_t ldm, int64_t rows, int64_t cols) {
#if defined(__x86_64__)
  return fill(cols, rows, [&](uint32_t* out) {
    return pack_pairs_transposed(reinterpret_cast<const uint16_t*>(m), ldm, rows, cols, out);
  });
#else
  (void)m, (void)ldm, (void)rows, (void)cols;
  return false;
#endif
}

bool tile_gemm_bf16(bool ta, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                    const Bf16Pairs& b, int64_t p0, int64_t j0, float beta, float* c, int64_t ldc) {
#if defined(__x86_64__)
  return run_bf16(m, n, k, alpha, [&](uint32_t* ap, int64_t la) { pack_a(ta, m, k, a, lda, ap, la); }, b, p0, j0,
                  beta, c, ldc);
#else
  (void)ta, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b, (void)p0, (void)j0, (void)beta,
      (void)c, (void)ldc;
  return false;
#endif
}

bool tile_gemm_bf16(int64_t m, int64_t n, int64_t k, float alpha, const BFloat16* a, int64_t lda, const Bf16Pairs& b,
                    int64_t p0, int64_t j0, float beta, float* c, int64_t ldc) {
#if defined(__x86_64__)
  return run_bf16(
      m, n, k, alpha,
      [&](uint32_t* ap, int64_t la) { pack_a(m, k, reinterpret_cast<const uint16_t*>(a), lda, ap, la); }, b, p0, j0,
      beta, c, ldc);
#else
  (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b, (void)p0, (void)j0, (void)beta, (void)c,
      (void)ldc;
  return false;
#endif
}

}  // namespace ampgrad::cpu
