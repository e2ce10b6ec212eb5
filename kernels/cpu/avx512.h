// Pieces shared by the CPU kernels' own AVX-512 code, which the library (built for baseline
// x86-64) compiles through target attributes (tile_gemm_small.cpp, tile_gemm_bf16.cpp,
// attention.cpp, random.cpp, transpose16.h).
#pragma once

#include <cstdint>

#include "cpu/isa.h"

#if defined(__x86_64__)
#include <immintrin.h>

/// The instruction set of the kernels' AVX-512 variants of plain C++ loops (row work,
/// layer norm, Adam, the random fills): compiled with this attribute, run only where
/// use_avx512() says so (cpu/isa.h: the level avx512 or wider), mostly through run_variant.
#define AG_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

// GCC 12 warns of uninitialized vectors inside its own AVX-512 intrinsics: code using them
// sits between these two.
#if defined(__GNUC__) && !defined(__clang__)
#define AG_AVX512_CODE_BEGIN                                  \
  _Pragma("GCC diagnostic push")                              \
  _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")       \
  _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define AG_AVX512_CODE_END _Pragma("GCC diagnostic pop")
#else
#define AG_AVX512_CODE_BEGIN
#define AG_AVX512_CODE_END
#endif

namespace ampgrad::cpu {

AG_AVX512_CODE_BEGIN

/// c[r][16 v + j] = alpha * acc[r][v][j] + beta * c[r][16 v + j] for a block of MR rows of c
/// (ldc apart) and NV vectors of columns, only the lanes of `last` in the last vector;
/// beta == 0 ignores c's old contents, NaN included (gemm.h). The store of the register
/// blocks of tile_gemm's kernels.
template <int MR, int NV>
__attribute__((target("avx512f"), always_inline)) inline void store_block(const __m512 (&acc)[MR][NV], float alpha,
                                                                          float beta, float* c, int64_t ldc,
                                                                          __mmask16 last) {
  const __m512 al = _mm512_set1_ps(alpha), be = _mm512_set1_ps(beta);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    float* crow = c + r * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __mmask16 mk = v == NV - 1 ? last : __mmask16(0xFFFF);
      __m512 out = _mm512_mul_ps(al, acc[r][v]);
      if (beta != 0.0f) out = _mm512_fmadd_ps(be, _mm512_maskz_loadu_ps(mk, crow + 16 * v), out);
      _mm512_mask_storeu_ps(crow + 16 * v, mk, out);
    }
  }
}

AG_AVX512_CODE_END

}  // namespace ampgrad::cpu
#else
// Off x86-64 a twin of plain C++ loops is the same loops (run_variant never calls it there).
#define AG_AVX512_TARGET
#endif
