// The Eigen GEMM that both builds use (gemm_common.h): the matmul geometry, the batched
// products of eigen_matmul and eigen_linear (the whole Eigen build; float64 in the oneDNN
// build), and tile_gemm's Eigen implementation (gemm.h).
//
// Threading: a batch with at least as many items as threads is split over threads with one
// single-threaded GEMM each; a smaller one runs its items in turn and lets Eigen split each
// GEMM (Eigen's OpenMP path stays serial when called inside a parallel region, so the two
// never nest). The convolution's products share the rule (over_items).
#include "cpu/gemm_common.h"

#include <Eigen/Core>
#include <vector>

#include "ampgrad/raw.h"
#include "cpu/cpu_backend.h"
#include "cpu/gemm.h"
#include "cpu/parallel.h"

namespace ampgrad::cpu {

// ---- geometry ------------------------------------------------------------------------------

namespace {

// Whether a [R, C] matrix with strides (rs, cs) can be read as row-major or column-major
// with a leading dimension. Size-1 dims put no constraint on their stride.
bool row_major_ok(int64_t R, int64_t C, int64_t rs, int64_t cs) {
  return (cs == 1 || C <= 1) && (R <= 1 || rs >= std::max<int64_t>(C, 1));
}
bool col_major_ok(int64_t R, int64_t C, int64_t rs, int64_t cs) {
  return (rs == 1 || R <= 1) && (C <= 1 || cs >= std::max<int64_t>(R, 1));
}

MatLayout layout_of(const Tensor& t) {
  const int64_t R = t.size(1), C = t.size(2), rs = t.stride(1), cs = t.stride(2);
  MatLayout L;
  L.bs = t.size(0) > 1 ? t.stride(0) : 0;
  if (row_major_ok(R, C, rs, cs)) {
    L.cs = 1;
    L.rs = R <= 1 ? std::max<int64_t>(C, 1) : rs;
  } else {
    L.rs = 1;
    L.cs = C <= 1 ? std::max<int64_t>(R, 1) : cs;
  }
  return L;
}

Tensor contiguous_copy(const Tensor& t, DType dt) {
  Tensor c = make_tensor(t.sizes(), dt, t.device());
  cpu_backend().copy(t, c);
  return c;
}

}  // namespace

Tensor float32_copy(const Tensor& t) { return t.defined() ? contiguous_copy(t, kFloat32) : t; }

Tensor gemm_operand(const Tensor& t) {
  const int64_t n = t.dim();
  const int64_t R = t.size(n - 2), C = t.size(n - 1), rs = t.stride(n - 2), cs = t.stride(n - 1);
  if (row_major_ok(R, C, rs, cs) || col_major_ok(R, C, rs, cs)) return t;
  return contiguous_copy(t, t.dtype());
}

MatmulGeom matmul_geom(const Tensor& a, const Tensor& w) {
  MatmulGeom g;
  g.B = a.size(0);
  g.M = a.size(1);
  g.K = a.size(2);
  g.N = w.size(2);
  g.a = layout_of(a);
  g.w = layout_of(w);
  // A shared right operand and left batches stacked row after row: one tall GEMM.
  if (g.B > 1 && g.w.bs == 0 && g.a.row_major() && g.a.bs == g.M * g.a.rs) {
    g.M *= g.B;
    g.B = 1;
    g.a.bs = 0;
  }
  return g;
}

Tensor operand_copy(const Tensor& t, DType dt) {
  const int64_t R = t.size(1), C = t.size(2);
  if (t.size(0) > 1 && t.stride(0) == 0) {
    Tensor one = detail::make_view(t, {1, R, C}, t.strides(), t.storage_offset());
    Tensor f = operand_copy(one, dt);
    return detail::make_view(f, t.sizes(), {0, f.stride(1), f.stride(2)}, 0);
  }
  if (!row_major_ok(R, C, t.stride(1), t.stride(2))) {  // copy the transpose in order, view it back
    Tensor tt = detail::make_view(t, {t.size(0), C, R}, {t.stride(0), t.stride(2), t.stride(1)}, t.storage_offset());
    Tensor f = contiguous_copy(tt, dt);
    return detail::make_view(f, t.sizes(), {R * C, 1, R}, 0);
  }
  return contiguous_copy(t, dt);
}

// ---- Eigen GEMM ------------------------------------------------------------------------

bool split_items(int64_t items, double flops_per_item) {
  const int threads = omp_get_max_threads();
  if (items <= 1 || threads == 1 || omp_in_parallel() || double(items) * flops_per_item < double(1 << 20)) return false;
  return items >= threads || flops_per_item < double(1 << 22);
}

namespace {

template <class T, int LA, int LW>
void gemm_one(const T* a, int64_t lda, const T* w, int64_t ldw, T* c, int64_t M, int64_t K, int64_t N, const T* bias) {
  using namespace Eigen;
  using MatA = Map<const Matrix<T, Dynamic, Dynamic, LA>, 0, OuterStride<>>;
  using MatW = Map<const Matrix<T, Dynamic, Dynamic, LW>, 0, OuterStride<>>;
  Map<Matrix<T, Dynamic, Dynamic, RowMajor>> C(c, M, N);
  if (K == 0) C.setZero();
  else C.noalias() = MatA(a, M, K, OuterStride<>(lda)) * MatW(w, K, N, OuterStride<>(ldw));
  if (bias) C.rowwise() += Map<const Matrix<T, 1, Dynamic>>(bias, N);
}

template <class T>
void gemm_layouts(bool a_rows, bool w_rows, const T* a, int64_t lda, const T* w, int64_t ldw, T* c, int64_t M,
                  int64_t K, int64_t N, const T* bias) {
  constexpr int R = Eigen::RowMajor, Cm = Eigen::ColMajor;
  if (a_rows) {
    if (w_rows) gemm_one<T, R, R>(a, lda, w, ldw, c, M, K, N, bias);
    else gemm_one<T, R, Cm>(a, lda, w, ldw, c, M, K, N, bias);
  } else {
    if (w_rows) gemm_one<T, Cm, R>(a, lda, w, ldw, c, M, K, N, bias);
    else gemm_one<T, Cm, Cm>(a, lda, w, ldw, c, M, K, N, bias);
  }
}

template <class T>
void gemm_batched(const MatmulGeom& g, const T* a, const T* w, T* c, const T* bias) {
  over_items(g.B, 2.0 * double(g.M) * double(g.N) * double(g.K), [&](int64_t b) {
    gemm_layouts<T>(g.a.row_major(), g.w.row_major(), a + b * g.a.bs, g.a.ld(), w + b * g.w.bs, g.w.ld(),
                    c + b * g.M * g.N, g.M, g.K, g.N, bias);
  });
}

// out = a @ w (+ bias) for 3-D a, w; float16/bfloat16 through float32 buffers.
void gemm_any(const Tensor& a0, const Tensor& w0, const Tensor& bias, const Tensor& out) {
  if (out.numel() == 0) return;
  if (is_reduced_floating(a0.dtype())) {  // out is a0's dtype or float32
    const bool direct = out.dtype() == kFloat32;
    Tensor of = direct ? out : make_tensor(out.sizes(), kFloat32, out.device());
    gemm_any(operand_copy(a0, kFloat32), operand_copy(w0, kFloat32), float32_copy(bias), of);
    if (!direct) cpu_backend().copy(of, out);
    return;
  }
  const Tensor a = gemm_operand(a0), w = gemm_operand(w0);
  const Tensor b = bias.defined() ? detail::contiguous_raw(bias) : bias;
  const MatmulGeom g = matmul_geom(a, w);
  dispatch_floating(out.dtype(), op::matmul, [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      gemm_batched<T>(g, static_cast<const T*>(a.raw_data()), static_cast<const T*>(w.raw_data()),
                      static_cast<T*>(out.raw_data()), b.defined() ? static_cast<const T*>(b.raw_data()) : nullptr);
    }
  });
}

}  // namespace

void eigen_matmul(const Tensor& a, const Tensor& w, const Tensor& out, const Tensor& bias) {
  gemm_any(a, w, bias, out);
}

LinearAsMatmul::LinearAsMatmul(const Tensor& x, const Tensor& weight, const Tensor& o)
    : a(detail::make_view(x, {1, x.size(0), x.size(1)}, {0, x.stride(0), x.stride(1)}, x.storage_offset())),
      w(detail::make_view(weight, {1, weight.size(1), weight.size(0)}, {0, weight.stride(1), weight.stride(0)},
                          weight.storage_offset())),
      out(detail::make_view(o, {1, o.size(0), o.size(1)}, {0, o.size(1), 1}, o.storage_offset())) {}

void eigen_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) {
  const LinearAsMatmul v(x, weight, out);
  gemm_any(v.a, v.w, bias, v.out);
}

// ---- small products for tiled kernels (gemm.h) ----------------------------------------

namespace {

template <class T>
void tile_gemm_impl(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
                    int64_t ldb, T beta, T* c, int64_t ldc) {
  using namespace Eigen;
  using Mat = Map<const Matrix<T, Dynamic, Dynamic, RowMajor>, 0, OuterStride<>>;
  Map<Matrix<T, Dynamic, Dynamic, RowMajor>, 0, OuterStride<>> C(c, m, n, OuterStride<>(ldc));
  if (beta == T(0)) C.setZero();
  else if (beta != T(1)) C *= beta;
  if (k == 0 || m == 0 || n == 0) return;
  const Mat A(a, ta ? k : m, ta ? m : k, OuterStride<>(lda)), B(b, tb ? n : k, tb ? k : n, OuterStride<>(ldb));
  if (ta && tb) C.noalias() += alpha * A.transpose() * B.transpose();
  else if (ta) C.noalias() += alpha * A.transpose() * B;
  else if (tb) C.noalias() += alpha * A * B.transpose();
  else C.noalias() += alpha * A * B;
}

}  // namespace

void eigen_tile_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  tile_gemm_impl<float>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void eigen_tile_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
                     const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  tile_gemm_impl<double>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void tile_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
               const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  tile_gemm_impl<double>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace ampgrad::cpu
