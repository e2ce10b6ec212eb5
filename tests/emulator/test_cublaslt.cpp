// The emulated cuBLASLt (kernels/cuda/emulator) against float64 loops written here in
// ampgrad's row-major terms: out[b] = a[b] @ w[b], a [M, K] and w [K, N] each stored
// row-major or as a transposed view, described to cuBLASLt as NVIDIA defines its
// column-major operands (the row-major X is the column-major X^T, so out^T = w^T a^T with
// cuBLASLt's A := w and B := a), as kernels/cuda/blas.cu does.
#include <cublasLt.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "emulator/library_test.h"
#include "support/testing.h"

#ifdef AMPGRAD_EMU_LIBS_STANDALONE
// The libraries built alone, without the emulated runtime: the work runs at once.
namespace ampgrad::emu {
void enqueue(cudaStream_t, std::function<void()> f) { f(); }
}  // namespace ampgrad::emu
#endif

namespace {

using ag::Tensor;

constexpr uint64_t kWorkspaceBytes = uint64_t(1) << 20;

// A workspace as cuBLASLt wants it: 256-byte aligned.
void* workspace() {
  alignas(256) static unsigned char buffer[kWorkspaceBytes];
  return buffer;
}

// ---- descriptors, released at scope exit ------------------------------------------------------
struct Lt {
  cublasLtHandle_t h = nullptr;
  Lt() { EXPECT_EQ(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS); }
  ~Lt() { cublasLtDestroy(h); }
};

struct Layout {
  cublasLtMatrixLayout_t h = nullptr;
  Layout(cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld) {
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&h, t, rows, cols, ld), CUBLAS_STATUS_SUCCESS);
  }
  Layout(Layout&& o) noexcept : h(o.h) { o.h = nullptr; }
  ~Layout() { cublasLtMatrixLayoutDestroy(h); }
  template <class V>
  Layout& set(cublasLtMatrixLayoutAttribute_t attr, V v) {
    EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(h, attr, &v, sizeof v), CUBLAS_STATUS_SUCCESS);
    return *this;
  }
};

struct Desc {
  cublasLtMatmulDesc_t h = nullptr;
  Desc(cublasComputeType_t ct, cudaDataType scale) {
    EXPECT_EQ(cublasLtMatmulDescCreate(&h, ct, scale), CUBLAS_STATUS_SUCCESS);
  }
  ~Desc() { cublasLtMatmulDescDestroy(h); }
  template <class V>
  Desc& set(cublasLtMatmulDescAttributes_t attr, V v) {
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(h, attr, &v, sizeof v), CUBLAS_STATUS_SUCCESS);
    return *this;
  }
};

struct Pref {
  cublasLtMatmulPreference_t h = nullptr;
  explicit Pref(uint64_t max_workspace = kWorkspaceBytes) {
    EXPECT_EQ(cublasLtMatmulPreferenceCreate(&h), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace,
                                                   sizeof max_workspace),
              CUBLAS_STATUS_SUCCESS);
  }
  ~Pref() { cublasLtMatmulPreferenceDestroy(h); }
};

cudaDataType lt_type(ag::DType dt) {
  switch (dt) {
    case ag::kFloat64: return CUDA_R_64F;
    case ag::kFloat16: return CUDA_R_16F;
    case ag::kBFloat16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

// ---- operands in ampgrad's terms --------------------------------------------------------------

// A [batch, rows, cols] operand: matrix b's element (r, c) at b * bs + r * ld + c
// (row-major), or at b * bs + c * ld + r (a transposed view). Every stored element is
// random, the gaps between rows and matrices too.
struct Operand {
  int64_t batch = 1, rows = 0, cols = 0;
  bool transposed = false;
  int64_t ld = 0, bs = 0;
  Tensor buf;    // the storage
  Tensor buf64;  // its values in float64, as they were made

  int64_t at(int64_t b, int64_t r, int64_t c) const { return b * bs + (transposed ? c * ld + r : r * ld + c); }
  double value(int64_t b, int64_t r, int64_t c) const { return buf64.data_ptr<double>()[at(b, r, c)]; }
  void* ptr() const { return buf.raw_data(); }
  ag::DType dtype() const { return buf.dtype(); }
};

// `pad` elements between rows (or columns), `gap` between matrices; broadcast: batch
// stride 0.
Operand operand(ag::DType dt, int64_t batch, int64_t rows, int64_t cols, bool transposed = false, int64_t pad = 2,
                int64_t gap = 3, bool broadcast = false) {
  Operand o;
  o.batch = batch, o.rows = rows, o.cols = cols, o.transposed = transposed;
  o.ld = (transposed ? rows : cols) + pad;
  const int64_t extent = transposed ? (cols - 1) * o.ld + rows : (rows - 1) * o.ld + cols;
  o.bs = broadcast ? 0 : extent + gap;
  o.buf = agt::randf({(batch - 1) * o.bs + extent}, dt);
  o.buf64 = o.buf.to(ag::kFloat64);
  return o;
}

// What cuBLASLt reads for X [R, C] used as X^T: the column-major [C, R] with X's ld and
// op N when X is row-major; the column-major [R, C] with op T when X is a transposed view.
Layout lt_layout(const Operand& o) {
  Layout l(lt_type(o.dtype()), uint64_t(o.transposed ? o.rows : o.cols), uint64_t(o.transposed ? o.cols : o.rows),
           o.ld);
  if (o.batch > 1)
    l.set(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, int32_t(o.batch)).set(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, o.bs);
  return l;
}
int32_t lt_op(const Operand& o) { return o.transposed ? CUBLAS_OP_T : CUBLAS_OP_N; }

// sum_k a[b, m, k] w[b, k, n] in float64: [B, M, N].
std::vector<double> ref_product(const Operand& a, const Operand& w) {
  std::vector<double> r(size_t(a.batch * a.rows * w.cols), 0.0);
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t m = 0; m < a.rows; ++m)
      for (int64_t n = 0; n < w.cols; ++n) {
        double s = 0;
        for (int64_t k = 0; k < a.cols; ++k) s += a.value(b, m, k) * w.value(b, k, n);
        r[size_t((b * a.rows + m) * w.cols + n)] = s;
      }
  return r;
}

// The matrices of `o` as they are now, as a float64 [B, R, C] tensor.
Tensor matrices(const Operand& o) {
  const Tensor now = o.buf.to(ag::kFloat64);
  const double* p = now.data_ptr<double>();
  std::vector<double> v;
  for (int64_t b = 0; b < o.batch; ++b)
    for (int64_t r = 0; r < o.rows; ++r)
      for (int64_t c = 0; c < o.cols; ++c) v.push_back(p[o.at(b, r, c)]);
  return ag::from_vector(v, {o.batch, o.rows, o.cols});
}
Tensor as_tensor(const std::vector<double>& v, const Operand& like) {
  return ag::from_vector(v, {like.batch, like.rows, like.cols});
}

// Whether the elements of o's storage outside its matrices still hold what they did.
::testing::AssertionResult gaps_untouched(const Operand& o) {
  const Tensor now = o.buf.to(ag::kFloat64);
  std::vector<bool> inside(size_t(now.numel()), false);
  for (int64_t b = 0; b < o.batch; ++b)
    for (int64_t r = 0; r < o.rows; ++r)
      for (int64_t c = 0; c < o.cols; ++c) inside[size_t(o.at(b, r, c))] = true;
  for (int64_t i = 0; i < now.numel(); ++i)
    if (!inside[size_t(i)] && !(now.data_ptr<double>()[i] == o.buf64.data_ptr<double>()[i]))
      return ::testing::AssertionFailure() << "element " << i << " outside the matrices was written";
  return ::testing::AssertionSuccess();
}

agt::Tol tol(ag::DType out, int64_t K) { return out == ag::kFloat32 ? agt::fp32_tol(K) : agt::tol_for(out); }

// ---- one call -------------------------------------------------------------------------------------
struct Call {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType scale = CUDA_R_32F;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  const void* aux = nullptr;
  int64_t aux_ld = 0;
  double alpha = 1, beta = 0;
};

Call call_for(ag::DType in) {
  Call c;
  if (in == ag::kFloat64) c.compute = CUBLAS_COMPUTE_64F, c.scale = CUDA_R_64F;
  return c;
}

// out = epilogue(alpha * a @ w + beta * out) through the heuristic and cublasLtMatmul,
// with C = D; returns the first status that is not SUCCESS.
cublasStatus_t gemm(const Operand& a, const Operand& w, const Operand& out, const Call& c) {
  Lt lt;
  Desc desc(c.compute, c.scale);
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, lt_op(w)).set(CUBLASLT_MATMUL_DESC_TRANSB, lt_op(a));
  desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, c.epilogue);
  if (c.bias) desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, c.bias);
  if (c.aux)
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, c.aux).set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, c.aux_ld);
  const Layout la = lt_layout(w), lb = lt_layout(a), ld = lt_layout(out);
  Pref pref;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt.h, desc.h, la.h, lb.h, ld.h, ld.h, pref.h, 1, &result, &found);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  EXPECT_EQ(found, 1);
  EXPECT_EQ(result.state, CUBLAS_STATUS_SUCCESS);
  EXPECT_LE(result.workspaceSize, kWorkspaceBytes);
  const float af = float(c.alpha), bf = float(c.beta);
  const double ad = c.alpha, bd = c.beta;
  const bool dbl = c.scale == CUDA_R_64F;
  st = cublasLtMatmul(lt.h, desc.h, dbl ? static_cast<const void*>(&ad) : &af, w.ptr(), la.h, a.ptr(), lb.h,
                      dbl ? static_cast<const void*>(&bd) : &bf, out.ptr(), ld.h, out.ptr(), ld.h, &result.algo,
                      workspace(), kWorkspaceBytes, nullptr);
  wait_for(nullptr);
  return st;
}

struct Types {
  ag::DType in, out;
};
// The dtype pairs blas.cu asks for: each dtype to itself, and the 16-bit ones to float32.
const Types kTypes[] = {{ag::kFloat32, ag::kFloat32}, {ag::kFloat64, ag::kFloat64},   {ag::kFloat16, ag::kFloat16},
                        {ag::kFloat16, ag::kFloat32}, {ag::kBFloat16, ag::kBFloat16}, {ag::kBFloat16, ag::kFloat32}};

std::string name(Types t) { return std::string(ag::dtype_name(t.in)) + "->" + ag::dtype_name(t.out); }

// ---- products ---------------------------------------------------------------------------------------

TEST(CublasLtEmu, EveryTransposePairAndDtypePair) {
  const int64_t M = 5, K = 7, N = 3;
  for (const Types t : kTypes)
    for (const bool ta : {false, true})
      for (const bool tw : {false, true}) {
        SCOPED_TRACE(name(t) + (ta ? " a^T" : " a") + (tw ? " w^T" : " w"));
        const Operand a = operand(t.in, 1, M, K, ta), w = operand(t.in, 1, K, N, tw);
        const Operand out = operand(t.out, 1, M, N);
        ASSERT_EQ(gemm(a, w, out, call_for(t.in)), CUBLAS_STATUS_SUCCESS);
        EXPECT_TRUE(agt::allclose(matrices(out), as_tensor(ref_product(a, w), out), tol(t.out, K)));
        EXPECT_TRUE(gaps_untouched(out));
      }
}

TEST(CublasLtEmu, StridedBatchesAndBroadcastBatches) {
  const int64_t B = 3, M = 4, K = 6, N = 5;
  for (const Types t : kTypes) {
    SCOPED_TRACE(name(t));
    // a's matrices apart by more than their size; w one matrix for every batch (stride 0).
    const Operand a = operand(t.in, B, M, K, false, 1, 7), w = operand(t.in, B, K, N, true, 2, 0, true);
    const Operand out = operand(t.out, B, M, N, false, 0, 5);
    ASSERT_EQ(gemm(a, w, out, call_for(t.in)), CUBLAS_STATUS_SUCCESS);
    EXPECT_TRUE(agt::allclose(matrices(out), as_tensor(ref_product(a, w), out), tol(t.out, K)));
    EXPECT_TRUE(gaps_untouched(out));
    // And the other way round: a broadcast left operand.
    const Operand a0 = operand(t.in, B, M, K, true, 1, 0, true), w1 = operand(t.in, B, K, N, false, 3, 2);
    ASSERT_EQ(gemm(a0, w1, out, call_for(t.in)), CUBLAS_STATUS_SUCCESS);
    EXPECT_TRUE(agt::allclose(matrices(out), as_tensor(ref_product(a0, w1), out), tol(t.out, K)));
  }
}

TEST(CublasLtEmu, AlphaAndBetaWithCInPlace) {
  const int64_t M = 4, K = 5, N = 6;
  for (const Types t : kTypes) {
    SCOPED_TRACE(name(t));
    const Operand a = operand(t.in, 1, M, K, true), w = operand(t.in, 1, K, N);
    const Operand out = operand(t.out, 1, M, N);
    const Tensor before = matrices(out);
    Call c = call_for(t.in);
    c.alpha = 0.5, c.beta = -2;
    ASSERT_EQ(gemm(a, w, out, c), CUBLAS_STATUS_SUCCESS);
    std::vector<double> ref = ref_product(a, w);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] = 0.5 * ref[i] - 2 * before.data_ptr<double>()[i];
    EXPECT_TRUE(agt::allclose(matrices(out), as_tensor(ref, out), tol(t.out, K)));
  }
}

TEST(CublasLtEmu, BetaZeroDoesNotReadC) {
  for (const Types t : kTypes) {
    SCOPED_TRACE(name(t));
    const Operand a = operand(t.in, 1, 3, 4), w = operand(t.in, 1, 4, 2);
    Operand out = operand(t.out, 1, 3, 2, false, 0, 0);
    out.buf = ag::full({out.buf.numel()}, std::numeric_limits<double>::quiet_NaN(), t.out);
    ASSERT_EQ(gemm(a, w, out, call_for(t.in)), CUBLAS_STATUS_SUCCESS);
    EXPECT_TRUE(agt::allclose(matrices(out), as_tensor(ref_product(a, w), out), tol(t.out, 4)));
  }
}

TEST(CublasLtEmu, OutOfPlaceCWithItsOwnLeadingDimension) {
  const int64_t M = 3, K = 4, N = 5;
  const Operand a = operand(ag::kFloat32, 1, M, K), w = operand(ag::kFloat32, 1, K, N);
  const Operand c = operand(ag::kFloat32, 1, M, N, false, 4), d = operand(ag::kFloat32, 1, M, N, false, 1);
  Lt lt;
  Desc desc(CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const Layout la = lt_layout(w), lb = lt_layout(a), lc = lt_layout(c), ld = lt_layout(d);
  const float alpha = 1, beta = 3;
  const Tensor c_before = matrices(c);
  ASSERT_EQ(cublasLtMatmul(lt.h, desc.h, &alpha, w.ptr(), la.h, a.ptr(), lb.h, &beta, c.ptr(), lc.h, d.ptr(), ld.h,
                           nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  wait_for(nullptr);
  std::vector<double> ref = ref_product(a, w);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) ref[size_t(m * N + n)] += 3 * c.value(0, m, n);
  EXPECT_TRUE(agt::allclose(matrices(d), as_tensor(ref, d), agt::fp32_tol(K + 1)));
  EXPECT_TRUE(agt::same_bits(matrices(c), c_before));
  EXPECT_TRUE(gaps_untouched(d));
}

TEST(CublasLtEmu, RowOrderLayouts) {
  // With CUBLASLT_ORDER_ROW the operands are read row-major as they are: D = A B.
  const int64_t M = 4, K = 3, N = 5;
  const Operand a = operand(ag::kFloat32, 1, M, K, false, 2), b = operand(ag::kFloat32, 1, K, N, false, 1);
  const Operand d = operand(ag::kFloat32, 1, M, N, false, 3);
  Lt lt;
  Desc desc(CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const int32_t row = CUBLASLT_ORDER_ROW;
  Layout la(CUDA_R_32F, M, K, a.ld), lb(CUDA_R_32F, K, N, b.ld), ld(CUDA_R_32F, M, N, d.ld);
  for (Layout* l : {&la, &lb, &ld}) l->set(CUBLASLT_MATRIX_LAYOUT_ORDER, row);
  const float alpha = 1, beta = 0;
  ASSERT_EQ(cublasLtMatmul(lt.h, desc.h, &alpha, a.ptr(), la.h, b.ptr(), lb.h, &beta, d.ptr(), ld.h, d.ptr(), ld.h,
                           nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  wait_for(nullptr);
  EXPECT_TRUE(agt::allclose(matrices(d), as_tensor(ref_product(a, b), d), agt::fp32_tol(K)));
  EXPECT_TRUE(gaps_untouched(d));
}

// ---- TF32 ---------------------------------------------------------------------------------------------

// The 1 x 1 product x * y under `compute`.
float product(float x, float y, cublasComputeType_t compute) {
  Operand a = operand(ag::kFloat32, 1, 1, 1, false, 0, 0), w = operand(ag::kFloat32, 1, 1, 1, false, 0, 0);
  const Operand out = operand(ag::kFloat32, 1, 1, 1, false, 0, 0);
  a.buf.data_ptr<float>()[0] = x;
  w.buf.data_ptr<float>()[0] = y;
  Call c;
  c.compute = compute;
  EXPECT_EQ(gemm(a, w, out, c), CUBLAS_STATUS_SUCCESS);
  return out.buf.data_ptr<float>()[0];
}

TEST(CublasLtEmu, FastTf32RoundsBothOperandsToTf32) {
  const float x = 1.0f + 0x1p-12f;  // exact in float32, between two TF32 values
  EXPECT_EQ(product(x, 1.0f, CUBLAS_COMPUTE_32F), x);
  EXPECT_EQ(product(x, 1.0f, CUBLAS_COMPUTE_32F_FAST_TF32), 1.0f);
  EXPECT_EQ(product(1.0f, x, CUBLAS_COMPUTE_32F_FAST_TF32), 1.0f);
  EXPECT_EQ(product(x, 1.0f, CUBLAS_COMPUTE_32F_PEDANTIC), x);
  // A tie rounds away from zero (cvt.rna.tf32.f32).
  EXPECT_EQ(product(1.0f + 0x1p-11f, 1.0f, CUBLAS_COMPUTE_32F_FAST_TF32), 1.0f + 0x1p-10f);
  EXPECT_EQ(product(-(1.0f + 0x1p-11f), 1.0f, CUBLAS_COMPUTE_32F_FAST_TF32), -(1.0f + 0x1p-10f));

  // Random operands: the sums of the TF32-rounded products, in float.
  const int64_t M = 6, K = 9, N = 4;
  const Operand a = operand(ag::kFloat32, 1, M, K, true), w = operand(ag::kFloat32, 1, K, N);
  const Operand out = operand(ag::kFloat32, 1, M, N);
  Call c;
  c.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  ASSERT_EQ(gemm(a, w, out, c), CUBLAS_STATUS_SUCCESS);
  std::vector<double> ref(size_t(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) ref[size_t(m * N + n)] += agt::tf32(a.value(0, m, k)) * agt::tf32(w.value(0, k, n));
  EXPECT_TRUE(agt::allclose(matrices(out), as_tensor(ref, out), agt::fp32_tol(K)));
  // ... which the exact product misses by far more than float32's rounding.
  EXPECT_FALSE(agt::allclose(matrices(out), as_tensor(ref_product(a, w), out), agt::fp32_tol(K)));
}

// ---- epilogues ------------------------------------------------------------------------------------------

// A bias vector [N] in `dt`.
Operand bias_of(ag::DType dt, int64_t N) { return operand(dt, 1, 1, N, false, 0, 0); }

TEST(CublasLtEmu, BiasEpilogueAddsOnePerOutputFeature) {
  // linear: out [M, N] = x [M, K] @ weight^T (weight [N, K] read transposed) + bias [N].
  const int64_t M = 5, K = 4, N = 6;
  for (const ag::DType dt : {ag::kFloat32, ag::kFloat64, ag::kFloat16, ag::kBFloat16}) {
    SCOPED_TRACE(ag::dtype_name(dt));
    const Operand x = operand(dt, 1, M, K), wt = operand(dt, 1, K, N, true), bias = bias_of(dt, N);
    const Operand out = operand(dt, 1, M, N);
    Call c = call_for(dt);
    c.epilogue = CUBLASLT_EPILOGUE_BIAS;
    c.bias = bias.ptr();
    ASSERT_EQ(gemm(x, wt, out, c), CUBLAS_STATUS_SUCCESS);
    std::vector<double> ref = ref_product(x, wt);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) ref[size_t(m * N + n)] += bias.value(0, 0, n);
    EXPECT_TRUE(agt::allclose(matrices(out), as_tensor(ref, out), tol(dt, K + 1)));
  }
}

double relu(double v) { return v < 0 ? 0 : v; }

TEST(CublasLtEmu, ActivationEpiloguesAndWhatTheyKeep) {
  const int64_t M = 5, K = 4, N = 16, mask_ld = 128;
  for (const ag::DType dt : {ag::kFloat32, ag::kFloat16, ag::kBFloat16}) {
    for (const uint32_t e : {CUBLASLT_EPILOGUE_RELU, CUBLASLT_EPILOGUE_RELU_BIAS, CUBLASLT_EPILOGUE_RELU_AUX,
                             CUBLASLT_EPILOGUE_RELU_AUX_BIAS, CUBLASLT_EPILOGUE_GELU, CUBLASLT_EPILOGUE_GELU_BIAS,
                             CUBLASLT_EPILOGUE_GELU_AUX, CUBLASLT_EPILOGUE_GELU_AUX_BIAS}) {
      SCOPED_TRACE(std::string(ag::dtype_name(dt)) + " epilogue " + std::to_string(e));
      const bool relu_kind = (e & CUBLASLT_EPILOGUE_RELU) != 0, with_bias = (e & CUBLASLT_EPILOGUE_BIAS) != 0;
      const bool keeps = (e & 128) != 0;
      const Operand x = operand(dt, 1, M, K), wt = operand(dt, 1, K, N, true), bias = bias_of(dt, N);
      const Operand out = operand(dt, 1, M, N, false, 0, 0);
      // The mask: M columns of mask_ld bits; the pre-activation: [M, N] in out's dtype.
      Tensor aux = relu_kind ? ag::zeros({M * mask_ld / 8}, ag::kUInt8) : ag::zeros({M * N}, dt);
      Call c;
      c.epilogue = e;
      if (with_bias) c.bias = bias.ptr();
      if (keeps) c.aux = aux.raw_data(), c.aux_ld = relu_kind ? mask_ld : N;
      ASSERT_EQ(gemm(x, wt, out, c), CUBLAS_STATUS_SUCCESS);
      const std::vector<double> prod = ref_product(x, wt);
      std::vector<double> pre(prod.size()), ref(prod.size());
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          const size_t i = size_t(m * N + n);
          pre[i] = prod[i] + (with_bias ? bias.value(0, 0, n) : 0.0);
          ref[i] = relu_kind ? relu(pre[i]) : agt::ref_gelu_tanh(pre[i]);
        }
      EXPECT_TRUE(agt::allclose(matrices(out), as_tensor(ref, out), tol(dt, K + 1)));
      if (!keeps) continue;
      if (relu_kind) {
        const uint8_t* mask = aux.data_ptr<uint8_t>();
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            const double v = pre[size_t(m * N + n)];
            if (std::abs(v) < 1e-2) continue;     // a sign rounding may flip
            const int64_t bit = m * mask_ld + n;  // column m of D^T, row n
            EXPECT_EQ((mask[bit / 8] >> (bit % 8)) & 1, v > 0 ? 1 : 0) << "m " << m << " n " << n;
          }
      } else {
        EXPECT_TRUE(agt::allclose(aux.to(ag::kFloat64).view({1, M, N}), as_tensor(pre, out), tol(dt, K + 1)));
      }
    }
  }
}

// GELU's derivative by central differences of the float64 reference.
double ref_dgelu(double x) {
  const double h = 1e-5;
  return (agt::ref_gelu_tanh(x + h) - agt::ref_gelu_tanh(x - h)) / (2 * h);
}

TEST(CublasLtEmu, GradientEpiloguesAndBiasGradient) {
  // grad_pre [M, N] = act'(pre) * (g [M, N2] @ next_weight [N2, N]); grad_bias = its column
  // sums. pre and the mask come from a forward epilogue, as blas.cu chains them.
  const int64_t M = 6, K = 3, N = 16, N2 = 5, mask_ld = 128;
  for (const ag::DType dt : {ag::kFloat32, ag::kFloat16, ag::kBFloat16})
    for (const bool relu_kind : {true, false})
      for (const bool bgrad : {false, true}) {
        SCOPED_TRACE(std::string(ag::dtype_name(dt)) + (relu_kind ? " drelu" : " dgelu") + (bgrad ? " bgrad" : ""));
        const Operand x = operand(dt, 1, M, K), wt = operand(dt, 1, K, N, true), bias = bias_of(dt, N);
        const Operand h = operand(dt, 1, M, N, false, 0, 0);
        Tensor aux = relu_kind ? ag::zeros({M * mask_ld / 8}, ag::kUInt8) : ag::zeros({M * N}, dt);
        const int64_t aux_ld = relu_kind ? mask_ld : N;
        Call fwd;
        fwd.epilogue = relu_kind ? CUBLASLT_EPILOGUE_RELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
        fwd.bias = bias.ptr(), fwd.aux = aux.raw_data(), fwd.aux_ld = aux_ld;
        ASSERT_EQ(gemm(x, wt, h, fwd), CUBLAS_STATUS_SUCCESS);
        // The slope as the backward reads it: the kept mask bit (its agreement with pre's
        // sign is the forward test's), or GELU's derivative at the kept pre-activation.
        const Tensor kept = relu_kind ? aux : aux.to(ag::kFloat64);
        auto slope = [&](int64_t m, int64_t n) {
          if (!relu_kind) return ref_dgelu(kept.data_ptr<double>()[m * N + n]);
          const int64_t bit = m * mask_ld + n;
          return double((kept.data_ptr<uint8_t>()[bit / 8] >> (bit % 8)) & 1);
        };

        const Operand g = operand(dt, 1, M, N2), nw = operand(dt, 1, N2, N);
        const Operand grad = operand(dt, 1, M, N, false, 0, 0), gb = bias_of(dt, N);
        Call bwd;
        bwd.epilogue = relu_kind ? (bgrad ? CUBLASLT_EPILOGUE_DRELU_BGRAD : CUBLASLT_EPILOGUE_DRELU)
                                 : (bgrad ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU);
        bwd.aux = aux.raw_data(), bwd.aux_ld = aux_ld;
        if (bgrad) bwd.bias = gb.ptr();
        ASSERT_EQ(gemm(g, nw, grad, bwd), CUBLAS_STATUS_SUCCESS);
        const std::vector<double> prod = ref_product(g, nw);
        std::vector<double> ref(prod.size()), col(size_t(N), 0.0);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            const size_t i = size_t(m * N + n);
            ref[i] = prod[i] * slope(m, n);
            col[size_t(n)] += ref[i];
          }
        EXPECT_TRUE(agt::allclose(matrices(grad), as_tensor(ref, grad), tol(dt, N2)));
        if (bgrad) {
          EXPECT_TRUE(agt::allclose(matrices(gb), as_tensor(col, gb), tol(dt, M * N2)));
        }
      }
}

// ---- what the heuristic and cublasLtMatmul refuse ------------------------------------------------------

// A 4 x 4 product D = A B described by `types` and adjusted by `tweak`; the status of the
// heuristic, and of cublasLtMatmul with the algorithm (or none) when the heuristic gives one.
struct Refusal {
  cublasStatus_t heuristic, matmul;
};
Refusal try_problem(cublasComputeType_t ct, cudaDataType scale, cudaDataType ab, cudaDataType cd,
                    const std::function<void(Desc&, Layout&, Layout&, Layout&)>& tweak = {},
                    size_t workspace_bytes = kWorkspaceBytes, void* ws = workspace()) {
  Lt lt;
  Desc desc(ct, scale);
  Layout la(ab, 4, 4, 4), lb(ab, 4, 4, 4), ld(cd, 4, 4, 4);
  if (tweak) tweak(desc, la, lb, ld);
  Pref pref;
  cublasLtMatmulHeuristicResult_t r{};
  int found = -1;
  Refusal out{};
  out.heuristic = cublasLtMatmulAlgoGetHeuristic(lt.h, desc.h, la.h, lb.h, ld.h, ld.h, pref.h, 1, &r, &found);
  if (out.heuristic != CUBLAS_STATUS_SUCCESS) {
    EXPECT_EQ(found, 0);
  }
  alignas(256) static double a[64], b[64], d[64], aux[64];
  desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(aux));
  desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(aux));
  const double one = 1, zero = 0;
  out.matmul = cublasLtMatmul(lt.h, desc.h, &one, a, la.h, b, lb.h, &zero, d, ld.h, d, ld.h,
                              out.heuristic == CUBLAS_STATUS_SUCCESS ? &r.algo : nullptr, ws, workspace_bytes, nullptr);
  wait_for(nullptr);
  return out;
}

#define EXPECT_REFUSED(status, ...)              \
  do {                                           \
    const Refusal r_ = try_problem(__VA_ARGS__); \
    EXPECT_EQ(r_.heuristic, status);             \
    EXPECT_EQ(r_.matmul, status);                \
  } while (0)

TEST(CublasLtEmu, TypeCombinationsOutsideNvidiasTableAreNotSupported) {
  // Accepted (controls for the rest).
  EXPECT_REFUSED(CUBLAS_STATUS_SUCCESS, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_32F);
  EXPECT_REFUSED(CUBLAS_STATUS_SUCCESS, CUBLAS_COMPUTE_64F, CUDA_R_64F, CUDA_R_64F, CUDA_R_64F);
  // A float32 product has no 16-bit output; 16-bit inputs no output of the other 16-bit type.
  EXPECT_REFUSED(CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_16F);
  EXPECT_REFUSED(CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF);
  EXPECT_REFUSED(CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_64F);
  // TF32 takes float32 operands only; 64F compute float64 only; 32F compute no float64.
  EXPECT_REFUSED(CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F, CUDA_R_16F, CUDA_R_16F);
  EXPECT_REFUSED(CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F, CUDA_R_16BF, CUDA_R_32F);
  EXPECT_REFUSED(CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_COMPUTE_64F, CUDA_R_64F, CUDA_R_32F, CUDA_R_32F);
  EXPECT_REFUSED(CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_64F, CUDA_R_64F);
  // The scale type is the compute type's.
  EXPECT_REFUSED(CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_COMPUTE_64F, CUDA_R_32F, CUDA_R_64F, CUDA_R_64F);
  EXPECT_REFUSED(CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_COMPUTE_32F, CUDA_R_64F, CUDA_R_32F, CUDA_R_32F);
  EXPECT_REFUSED(CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_16F, CUDA_R_32F, CUDA_R_32F);
  // A and B of two types.
  EXPECT_REFUSED(CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16F, CUDA_R_32F,
                 [](Desc&, Layout&, Layout& b, Layout&) { b.set(CUBLASLT_MATRIX_LAYOUT_TYPE, uint32_t(CUDA_R_16BF)); });
  // Half accumulation, integer products: in NVIDIA's table, not emulated.
  EXPECT_REFUSED(CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_COMPUTE_16F, CUDA_R_16F, CUDA_R_16F, CUDA_R_16F);
  EXPECT_REFUSED(CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_COMPUTE_32I, CUDA_R_32I, CUDA_R_8I, CUDA_R_32I);
}

TEST(CublasLtEmu, EpilogueCombinationsTheLibraryRefuses) {
  auto epilogue = [](uint32_t e) {
    return [e](Desc& d, Layout&, Layout&, Layout&) { d.set(CUBLASLT_MATMUL_DESC_EPILOGUE, e); };
  };
  // The bias is D's type.
  EXPECT_REFUSED(CUBLAS_STATUS_SUCCESS, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_32F,
                 [](Desc& d, Layout&, Layout&, Layout&) {
                   d.set(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(CUBLASLT_EPILOGUE_BIAS))
                       .set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(CUDA_R_32F));
                 });
  EXPECT_REFUSED(CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_32F,
                 [](Desc& d, Layout&, Layout&, Layout&) {
                   d.set(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(CUBLASLT_EPILOGUE_BIAS))
                       .set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(CUDA_R_16BF));
                 });
  // An activation with a bias on a row-major D (the table's footnote).
  EXPECT_REFUSED(CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                 [](Desc& d, Layout&, Layout&, Layout& l) {
                   d.set(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(CUBLASLT_EPILOGUE_RELU_BIAS));
                   l.set(CUBLASLT_MATRIX_LAYOUT_ORDER, int32_t(CUBLASLT_ORDER_ROW));
                 });
  // The auxiliary leading dimensions: multiples of 128 bits (mask) or 8 elements, >= D's rows.
  auto aux_ld = [](uint32_t e, int64_t ld) {
    return [e, ld](Desc& d, Layout&, Layout&, Layout&) {
      d.set(CUBLASLT_MATMUL_DESC_EPILOGUE, e).set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ld);
    };
  };
  EXPECT_REFUSED(CUBLAS_STATUS_SUCCESS, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                 aux_ld(CUBLASLT_EPILOGUE_RELU_AUX, 128));
  EXPECT_REFUSED(CUBLAS_STATUS_INVALID_VALUE, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                 aux_ld(CUBLASLT_EPILOGUE_RELU_AUX, 64));
  EXPECT_REFUSED(CUBLAS_STATUS_SUCCESS, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                 aux_ld(CUBLASLT_EPILOGUE_GELU_AUX, 8));
  EXPECT_REFUSED(CUBLAS_STATUS_INVALID_VALUE, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                 aux_ld(CUBLASLT_EPILOGUE_DGELU, 4));
  EXPECT_REFUSED(CUBLAS_STATUS_INVALID_VALUE, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                 aux_ld(CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 12));
  // No such epilogue; C transposed.
  EXPECT_REFUSED(CUBLAS_STATUS_INVALID_VALUE, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, epilogue(3));
  EXPECT_REFUSED(CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                 [](Desc& d, Layout&, Layout&, Layout&) { d.set(CUBLASLT_MATMUL_DESC_TRANSC, int32_t(CUBLAS_OP_T)); });
}

TEST(CublasLtEmu, MalformedProblemsAreInvalidValues) {
  const auto f32 = CUDA_R_32F;
  // op(A)'s columns are not op(B)'s rows; D's shape is not op(A) op(B)'s.
  EXPECT_REFUSED(CUBLAS_STATUS_INVALID_VALUE, CUBLAS_COMPUTE_32F, f32, f32, f32,
                 [](Desc&, Layout& a, Layout&, Layout&) { a.set(CUBLASLT_MATRIX_LAYOUT_COLS, uint64_t(3)); });
  EXPECT_REFUSED(CUBLAS_STATUS_INVALID_VALUE, CUBLAS_COMPUTE_32F, f32, f32, f32,
                 [](Desc&, Layout&, Layout&, Layout& d) { d.set(CUBLASLT_MATRIX_LAYOUT_ROWS, uint64_t(3)); });
  // Transposing A makes its 4 x 3 shape fit a 3-row D; without the transpose it does not.
  EXPECT_REFUSED(CUBLAS_STATUS_SUCCESS, CUBLAS_COMPUTE_32F, f32, f32, f32, [](Desc& s, Layout& a, Layout&, Layout& d) {
    a.set(CUBLASLT_MATRIX_LAYOUT_COLS, uint64_t(3));
    d.set(CUBLASLT_MATRIX_LAYOUT_ROWS, uint64_t(3));
    s.set(CUBLASLT_MATMUL_DESC_TRANSA, int32_t(CUBLAS_OP_T));
  });
  // A leading dimension smaller than the rows it separates.
  EXPECT_REFUSED(CUBLAS_STATUS_INVALID_VALUE, CUBLAS_COMPUTE_32F, f32, f32, f32,
                 [](Desc&, Layout&, Layout& b, Layout&) { b.set(CUBLASLT_MATRIX_LAYOUT_LD, int64_t(3)); });
  // Batch counts that differ; C and D of two types (C's layout given apart from D's).
  EXPECT_REFUSED(CUBLAS_STATUS_INVALID_VALUE, CUBLAS_COMPUTE_32F, f32, f32, f32,
                 [](Desc&, Layout& a, Layout&, Layout&) { a.set(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, int32_t(2)); });
  EXPECT_REFUSED(CUBLAS_STATUS_INVALID_VALUE, CUBLAS_COMPUTE_32F, f32, f32, f32,
                 [](Desc&, Layout&, Layout&, Layout& d) { d.set(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, int32_t(0)); });
  EXPECT_REFUSED(CUBLAS_STATUS_INVALID_VALUE, CUBLAS_COMPUTE_32F, f32, f32, f32,
                 [](Desc& s, Layout&, Layout&, Layout&) { s.set(CUBLASLT_MATMUL_DESC_TRANSA, int32_t(7)); });
  // The workspace: smaller than the algorithm's, or not 256-byte aligned.
  EXPECT_EQ(try_problem(CUBLAS_COMPUTE_32F, f32, f32, f32, {}, kWorkspaceBytes - 1).matmul,
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(try_problem(CUBLAS_COMPUTE_32F, f32, f32, f32, {}, kWorkspaceBytes - 64,
                        static_cast<unsigned char*>(workspace()) + 64)
                .matmul,
            CUBLAS_STATUS_INVALID_VALUE);
}

TEST(CublasLtEmu, CallArgumentsAreChecked) {
  Lt lt;
  Desc desc(CUBLAS_COMPUTE_32F, CUDA_R_32F);
  Layout l(CUDA_R_32F, 2, 2, 2), other(CUDA_R_32F, 2, 2, 3);
  Pref pref(0);
  alignas(256) static float a[8], b[8], d[8];
  const float one = 1, zero = 0;
  cublasLtMatmulHeuristicResult_t r{};
  int found = 0;
  // No handle; a request for no algorithm.
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(nullptr, desc.h, l.h, l.h, l.h, l.h, pref.h, 1, &r, &found),
            CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasLtMatmul(nullptr, desc.h, &one, a, l.h, b, l.h, &zero, d, l.h, d, l.h, nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt.h, desc.h, l.h, l.h, l.h, l.h, pref.h, 0, &r, &found),
            CUBLAS_STATUS_INVALID_VALUE);
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(lt.h, desc.h, l.h, l.h, l.h, l.h, pref.h, 1, &r, &found),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(r.workspaceSize, 0u);  // the preference allows none
  // A null alpha, a null A; C in place of D with another layout; an algorithm the
  // heuristic did not give; an algorithm given for another configuration.
  EXPECT_EQ(cublasLtMatmul(lt.h, desc.h, nullptr, a, l.h, b, l.h, &zero, d, l.h, d, l.h, &r.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(
      cublasLtMatmul(lt.h, desc.h, &one, nullptr, l.h, b, l.h, &zero, d, l.h, d, l.h, &r.algo, nullptr, 0, nullptr),
      CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmul(lt.h, desc.h, &one, a, l.h, b, l.h, &zero, d, other.h, d, l.h, &r.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatmulAlgo_t blank{};
  EXPECT_EQ(cublasLtMatmul(lt.h, desc.h, &one, a, l.h, b, l.h, &zero, d, l.h, d, l.h, &blank, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  Desc tf32(CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F);
  EXPECT_EQ(cublasLtMatmul(lt.h, tf32.h, &one, a, l.h, b, l.h, &zero, d, l.h, d, l.h, &r.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmul(lt.h, desc.h, &one, a, l.h, b, l.h, &zero, d, l.h, d, l.h, &r.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  wait_for(nullptr);
  // An epilogue without its bias.
  desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(CUBLASLT_EPILOGUE_BIAS));
  EXPECT_EQ(cublasLtMatmul(lt.h, desc.h, &one, a, l.h, b, l.h, &zero, d, l.h, d, l.h, nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
}

TEST(CublasLtEmu, PointersLessAlignedThanTheHeuristicWasToldAreRefused) {
  Lt lt;
  Desc desc(CUBLAS_COMPUTE_32F, CUDA_R_32F);
  Layout l(CUDA_R_32F, 2, 2, 2);
  alignas(256) static float buf[16];
  const float one = 1, zero = 0;
  auto algo_for = [&](uint32_t align_a) {
    Pref pref(0);
    EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                   sizeof align_a),
              CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulHeuristicResult_t r{};
    int found = 0;
    EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt.h, desc.h, l.h, l.h, l.h, l.h, pref.h, 1, &r, &found),
              CUBLAS_STATUS_SUCCESS);
    return r.algo;
  };
  const cublasLtMatmulAlgo_t aligned = algo_for(256), by4 = algo_for(4);
  float* a4 = buf + 1;  // 4-byte aligned only
  EXPECT_EQ(cublasLtMatmul(lt.h, desc.h, &one, a4, l.h, buf + 8, l.h, &zero, buf + 12, l.h, buf + 12, l.h, &aligned,
                           nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmul(lt.h, desc.h, &one, a4, l.h, buf + 8, l.h, &zero, buf + 12, l.h, buf + 12, l.h, &by4,
                           nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  wait_for(nullptr);
  // Not even a whole float.
  const cublasLtMatmulAlgo_t by1 = algo_for(1);
  EXPECT_EQ(cublasLtMatmul(lt.h, desc.h, &one, reinterpret_cast<unsigned char*>(buf) + 2, l.h, buf + 8, l.h, &zero,
                           buf + 12, l.h, buf + 12, l.h, &by1, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
}

// ---- descriptors and queueing ------------------------------------------------------------------------------

TEST(CublasLtEmu, AttributesRoundTripWithTheirSizesAndDefaults) {
  Desc desc(CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F);
  int32_t v = -1;
  size_t written = 0;
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(desc.h, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &v, sizeof v, &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(v, CUBLAS_COMPUTE_32F_FAST_TF32);
  EXPECT_EQ(written, sizeof v);
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSA, &v, sizeof v, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(v, CUBLAS_OP_N);
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(desc.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &v, sizeof v, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(v, -1);
  uint32_t e = 0;
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(desc.h, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(e, uint32_t(CUBLASLT_EPILOGUE_DEFAULT));
  // A size query; a value of the wrong size; no buffer.
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(desc.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER, nullptr, 0, &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(written, sizeof(void*));
  const int64_t wide = 1;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof wide),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSA, nullptr, 4),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSA, &v, sizeof v - 1, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);

  Layout l(CUDA_R_16BF, 3, 5, 7);
  uint64_t rows = 0;
  int32_t order = -1, batch = 0;
  int64_t ld = 0, stride = -1;
  uint32_t type = 0;
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(l.h, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof rows, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(l.h, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(l.h, CUBLASLT_MATRIX_LAYOUT_TYPE, &type, sizeof type, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(l.h, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof order, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(l.h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(l.h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride,
                                             nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(rows, 3u);
  EXPECT_EQ(ld, 7);
  EXPECT_EQ(type, uint32_t(CUDA_R_16BF));
  EXPECT_EQ(order, CUBLASLT_ORDER_COL);
  EXPECT_EQ(batch, 1);
  EXPECT_EQ(stride, 0);

  cublasLtMatmulPreference_t pref = nullptr;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  uint64_t ws = 1;
  uint32_t align = 0;
  EXPECT_EQ(
      cublasLtMatmulPreferenceGetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws, nullptr),
      CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulPreferenceGetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align, sizeof align,
                                                 nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(ws, 0u);
  EXPECT_EQ(align, 256u);
  cublasLtMatmulPreferenceDestroy(pref);
}

TEST(CublasLtEmu, TheCallReadsHostScalarsAndDescriptorsWhenItIsMade) {
  // What runs later on the stream sees alpha and the descriptors as they were at the call
  // (a check with teeth where the runtime defers queued work, in its strict mode).
  const Operand a = operand(ag::kFloat32, 1, 2, 3), w = operand(ag::kFloat32, 1, 3, 2);
  const Operand out = operand(ag::kFloat32, 1, 2, 2);
  Lt lt;
  Desc desc(CUBLAS_COMPUTE_32F, CUDA_R_32F);
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, lt_op(w)).set(CUBLASLT_MATMUL_DESC_TRANSB, lt_op(a));
  const Layout la = lt_layout(w), lb = lt_layout(a), ld = lt_layout(out);
  float alpha = 2, beta = 0;
  ASSERT_EQ(cublasLtMatmul(lt.h, desc.h, &alpha, w.ptr(), la.h, a.ptr(), lb.h, &beta, out.ptr(), ld.h, out.ptr(), ld.h,
                           nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  alpha = 100;
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, int32_t(CUBLAS_OP_T));
  wait_for(nullptr);
  std::vector<double> ref = ref_product(a, w);
  for (double& r : ref) r *= 2;
  EXPECT_TRUE(agt::allclose(matrices(out), as_tensor(ref, out), agt::fp32_tol(3)));
}

TEST(CublasLtEmu, DevicePointerModeReadsTheScalarsThemselves) {
  const Operand a = operand(ag::kFloat64, 1, 3, 2), w = operand(ag::kFloat64, 1, 2, 4);
  const Operand out = operand(ag::kFloat64, 1, 3, 4);
  const Tensor before = matrices(out);
  Lt lt;
  Desc desc(CUBLAS_COMPUTE_64F, CUDA_R_64F);
  desc.set(CUBLASLT_MATMUL_DESC_POINTER_MODE, int32_t(CUBLASLT_POINTER_MODE_DEVICE));
  const Layout la = lt_layout(w), lb = lt_layout(a), ld = lt_layout(out);
  static double scalars[2] = {3, 0.25};  // "device memory": alpha, beta
  ASSERT_EQ(cublasLtMatmul(lt.h, desc.h, &scalars[0], w.ptr(), la.h, a.ptr(), lb.h, &scalars[1], out.ptr(), ld.h,
                           out.ptr(), ld.h, nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  wait_for(nullptr);
  std::vector<double> ref = ref_product(a, w);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = 3 * ref[i] + 0.25 * before.data_ptr<double>()[i];
  EXPECT_TRUE(agt::allclose(matrices(out), as_tensor(ref, out), agt::tol_for(ag::kFloat64)));
}

TEST(CublasLtEmu, StatusNames) {
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
  EXPECT_EQ(int(CUBLAS_STATUS_INVALID_VALUE), 7);
  EXPECT_EQ(int(CUBLAS_STATUS_NOT_SUPPORTED), 15);
  EXPECT_NE(std::string(cublasLtGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED)), "");
}

}  // namespace
