// Small matrix products on the calling thread, for kernels that tile their own work and
// run inside their own parallel region (attention.cpp).
//
// The float product is the one that decides such a kernel's speed. The library is built
// for baseline x86-64 (SSE2), so Eigen's product runs on 4-wide vectors, while oneDNN's
// sgemm is JIT-compiled for the vectors the CPU has (AVX2, AVX-512): about 4x Eigen's rate
// on 64x64 tiles. The oneDNN build therefore takes oneDNN's sgemm for float
// (onednn_matmul.cpp), the Eigen build Eigen's (eigen_matmul.cpp); double is Eigen in both.
// Small float products go first to our own AVX-512 kernel where the CPU has AVX-512: at
// attention's head sizes (32, 64) sgemm's per-call cost exceeded the product itself.
#pragma once

#include <cstdint>

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
/// product and returns true, or returns false (nothing done) on a CPU without AVX-512 or a
/// product it does not take. tile_gemm tries it first in both builds.
bool small_tile_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

/// tile_gemm's Eigen implementation (conv_common.cpp), for both dtypes.
void eigen_tile_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void eigen_tile_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
                     int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

}  // namespace ampgrad::cpu
