// Matrix products with Eigen alone (the AMPGRAD_ONEDNN=OFF build).
//
// The GEMM itself lives in gemm_common.cpp, because the oneDNN build uses it too for
// float64: strided operands are mapped in place as row- or column-major matrices, batches
// run in parallel when there are enough of them, and float16/bfloat16 go through float32.
#include "cpu/cpu_backend.h"
#include "cpu/gemm.h"
#include "cpu/gemm_common.h"

namespace ampgrad::cpu {
void CpuBackend::matmul(const Tensor& a, const Tensor& w, const Tensor& out) { eigen_matmul(a, w, out); }
void CpuBackend::linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) {
  eigen_linear(x, weight, bias, out);
}
Tensor CpuBackend::linear_act(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                              const Tensor& out, bool keep) {
  if (keep && !activation_grad_reads_output(act)) return linear_act_with_slope(x, weight, bias, act, out);
  return linear_act_composed(x, weight, bias, act, out, keep);
}
void CpuBackend::matmul_times(const Tensor& a, const Tensor& w, const Tensor& mul, const Tensor& out) {
  eigen_matmul(a, w, out);
  binary(BinaryOp::Mul, out, mul, out);
}
void tile_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0 || small_tile_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return;
  eigen_tile_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
}  // namespace ampgrad::cpu

namespace ampgrad::detail {
// Eigen caches nothing per shape.
size_t cpu_primitive_cache_size() { return 0; }
}  // namespace ampgrad::detail
