// Small matrix products on the calling thread, for kernels that tile their own work and
// run inside their own parallel region (attention.cpp).
//
// The float product is the one that decides such a kernel's speed. The library is built
// for baseline x86-64 (SSE2), so Eigen's product runs on 4-wide vectors, while oneDNN's
// sgemm is JIT-compiled for the vectors the CPU has (AVX2, AVX-512), several times Eigen's
// rate on 64x64 tiles. The oneDNN build therefore takes oneDNN's sgemm for float
// (onednn_matmul.cpp), the Eigen build Eigen's (eigen_matmul.cpp); double is Eigen in both.
// Small float products go first to our own AVX-512 kernel at the kernels' level avx512: at
// attention's head sizes (32, 64) sgemm's per-call cost exceeded the product itself.
#pragma once

#include <cstdint>
#include <vector>

#include "ampgrad/half.h"

namespace ampgrad::cpu {

/// c [m, n] = alpha * op(a) op(b) + beta * c, every matrix row-major with its leading
/// dimension (lda, ldb, ldc >= its row length). op(a) is [m, k]: a is stored [m, k], or
/// [k, m] when ta; op(b) is [k, n]: b is stored [k, n], or [n, k] when tb. beta == 0
/// ignores c's old contents (NaN included). Single-threaded inside a parallel region.
void tile_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void tile_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
               const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

/// tile_gemm's own AVX-512 kernel for small float products (m <= 64, n and k <= 256;
/// tile_gemm_small.cpp), where a library sgemm's per-call cost would dominate: computes the
/// product and returns true, or returns false (nothing done) below the kernels' level avx512
/// (cpu/isa.h) or for a product it does not take. tile_gemm tries it first in both builds.
bool small_tile_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

/// A [K, N] matrix in bfloat16 (float ones rounded to nearest even) in the pair layout of
/// AVX512-BF16's dot products and AMX-BF16's tiles: rows 2q and 2q + 1 interleaved, element (p, j) in the 32-bit
/// word data[(p / 2) * N + j], its low half when p is even; an odd K gets a zero row. The
/// right operand of tile_gemm_bf16, packed once for many products (attention packs each
/// head's k^T, v, ... once).
struct Bf16Pairs {
  std::vector<uint32_t> data;
  int64_t K = 0, N = 0;
  bool finite = false;  ///< no infinity or NaN in b (AMX tiles take only such a b)
  /// Packs b [rows, cols] (leading dimension ldb); false, and nothing packed (K = N = 0),
  /// below the kernels' level avx512_bf16 (cpu/isa.h).
  bool pack(const float* b, int64_t ldb, int64_t rows, int64_t cols);
  /// The same from bfloat16 rows (nothing to round).
  bool pack(const BFloat16* b, int64_t ldb, int64_t rows, int64_t cols);
  /// Packs the transpose of m [rows, cols] (bfloat16 rows, leading dimension ldm): b = m^T
  /// is [cols, rows] (K = cols, N = rows).
  bool pack_transposed(const BFloat16* m, int64_t ldm, int64_t rows, int64_t cols);

 private:
  template <class F>
  bool fill(int64_t rows, int64_t cols, const F& pack);
};

/// c [m, n] = alpha * op(a) b[p0 : p0 + k, j0 : j0 + n] + beta * c, with op(a) ([m, k]; a
/// stored [k, m] when ta) rounded to bfloat16 and b packed as Bf16Pairs: the products of
/// bfloat16 values are exact and summed in float (both instructions count subnormal
/// operands as zero): on AMX-BF16 tiles at the kernels' level amx where b is finite, else
/// with VDPBF16PS. For products whose inputs are bfloat16 already. Declines (false, nothing
/// done) below the level avx512_bf16 (cpu/isa.h), for m > 64, k > 256 or k == 0, an odd p0,
/// an odd k that ends before b's last row (its last pair would take a value of b's next
/// row), or a range outside b.
bool tile_gemm_bf16(bool ta, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                    const Bf16Pairs& b, int64_t p0, int64_t j0, float beta, float* c, int64_t ldc);
/// The same with a's rows [m, k] in bfloat16 already (not transposed), read as they are.
bool tile_gemm_bf16(int64_t m, int64_t n, int64_t k, float alpha, const BFloat16* a, int64_t lda, const Bf16Pairs& b,
                    int64_t p0, int64_t j0, float beta, float* c, int64_t ldc);

/// Whether tile_gemm_bf16 runs at the kernels' level (avx512_bf16; AMX tiles at amx).
bool tile_gemm_bf16_available();

/// Keeps AMX's tile configuration loaded on this thread for the tile_gemm_bf16 calls made
/// while it lives (loading it costs about as much as a small product), and releases the
/// tiles when the outermost scope ends. Optional: without one each AMX product loads and
/// releases them itself. Nothing else may use the tiles on this thread while one is open
/// (oneDNN's AMX kernels configure their own), so a scope wraps a kernel's own loop only.
class Bf16TileScope {
 public:
  Bf16TileScope();
  ~Bf16TileScope();
  Bf16TileScope(const Bf16TileScope&) = delete;
  Bf16TileScope& operator=(const Bf16TileScope&) = delete;

 private:
  bool active_ = false;
};

/// tile_gemm's Eigen implementation (gemm_common.cpp), for both dtypes.
void eigen_tile_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void eigen_tile_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
                     int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

}  // namespace ampgrad::cpu
