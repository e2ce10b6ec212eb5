// matmul and linear on CUDA through cuBLASLt (cublasLtMatmul).
//
// Layout. ampgrad matrices are row-major views with any strides; cuBLASLt is column-major.
// A row-major [R, C] matrix is the column-major [C, R] matrix of its transpose, so the
// product out[M, N] = a[M, K] @ w[K, N] is computed as the column-major product
// out^T[N, M] = w^T[N, K] @ a^T[K, M]: cuBLASLt's A is w and its B is a. An operand whose
// column stride is 1 (row-major with leading dimension = its row stride) is passed as is
// (op N); one whose row stride is 1 (a transposed view, column-major with leading
// dimension = its column stride) is passed with op T. So the backward's g @ w^T and
// a^T @ g and linear's weight^T are read in place, exactly as the CPU reads them
// (cpu/gemm_common.cpp); an operand with neither stride 1 (or overlapping rows) is made
// contiguous first. A broadcast batch (stride 0) is a strided batch with offset 0; a
// broadcast right operand whose left operand stacks its batches row after row becomes one
// tall GEMM, as on the CPU.
//
// Precision. float16 and bfloat16 accumulate in float32 (CUBLAS_COMPUTE_32F) and write
// their own dtype or float32 (the contract's mixed-precision gradients); float32 uses
// CUBLAS_COMPUTE_32F, or CUBLAS_COMPUTE_32F_FAST_TF32 when ag::set_float32_matmul_precision
// allows ("high" or "medium"); float64 uses CUBLAS_COMPUTE_64F.
//
// linear adds its bias in the epilogue (CUBLASLT_EPILOGUE_BIAS: one value per row of the
// column-major out^T, that is per output feature). Where cuBLASLt offers no algorithm with
// the epilogue, the product runs without it and a small kernel adds the bias.
//
// linear_act applies ReLU or tanh-form GELU in the epilogue too (cuBLASLt's GELU is the
// tanh form, so the erf form runs as bias epilogue plus the GELU kernel). For training it
// keeps what the gradient needs: RELU_AUX writes a bit mask of the positive elements (one
// bit each, leading dimension rounded up to 128 bits), GELU_AUX the pre-activation. The
// gradient through the next product, act'(h) * (g @ next_weight), is one GEMM with the
// DRELU_BGRAD / DGELU_BGRAD epilogue, which also sums the bias gradient. Any case without
// an algorithm (or with a leading dimension cuBLASLt refuses) takes Backend's composed form.
//
// Caching. One cuBLASLt handle per device; one 32 MiB workspace per stream, so that
// products on different streams never share scratch memory (from the stream-ordered pool,
// given back in stream order when the stream is destroyed); and one GemmPlan per problem
// (descriptors, layouts and the heuristic's algorithm), keyed by device, dtypes, compute
// type, shapes, layouts and the pointers' alignments (the heuristic assumes the alignment
// it was shown). A steady-state step
// creates no descriptor and calls no heuristic. Everything is queued on the current stream
// of the tensors' device; nothing waits on the host.
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ampgrad/matmul_precision.h"
#include "ampgrad/raw.h"
#include "cuda/common.cuh"
#include "cuda/cuda_backend.h"

namespace ampgrad::cuda {
namespace {

constexpr int kMaxDevices = 64;
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

// ---- per-device state -------------------------------------------------------------------

cublasLtHandle_t lt_handle(int device, const char* op) {
  static std::mutex mu;
  static cublasLtHandle_t handles[kMaxDevices] = {};
  AG_CHECK(device >= 0 && device < kMaxDevices, op, "device index ", device, " out of range");
  std::lock_guard<std::mutex> lock(mu);
  if (!handles[device]) AG_CUDA_CHECK(op, cublasLtCreate(&handles[device]));
  return handles[device];
}

// The workspaces, keyed by (device, stream id): an id is never reused, where a destroyed
// stream's native handle can come back for a new stream that does not wait for the old
// stream's products. Each is stream-ordered memory from the device's pool, allocated on its
// stream and freed on it when the stream is destroyed (release_blas_workspace).
struct Workspaces {
  std::mutex mu;
  std::vector<std::pair<int64_t, void*>> spaces[kMaxDevices];
};
Workspaces& workspaces() {
  static Workspaces* w = new Workspaces;  // never destroyed: streams can outlive static destruction
  return *w;
}

// The workspace of products queued on s (the caller holds a DeviceGuard for its device).
void* workspace(Stream s, cudaStream_t stream, const char* op) {
  const int device = s.device().index;
  Workspaces& w = workspaces();
  std::lock_guard<std::mutex> lock(w.mu);
  for (const auto& [id, p] : w.spaces[device])
    if (id == s.id()) return p;
  void* p = nullptr;
  AG_CUDA_CHECK(op, cudaMallocAsync(&p, kWorkspaceBytes, stream));
  w.spaces[device].push_back({s.id(), p});
  return p;
}

// ---- operands ---------------------------------------------------------------------------

// Whether an [R, C] matrix with strides (rs, cs) reads as row-major or column-major with a
// leading dimension; size-1 dims constrain nothing (as cpu/gemm_common.cpp).
bool row_major_ok(int64_t R, int64_t C, int64_t rs, int64_t cs) {
  return (cs == 1 || C <= 1) && (R <= 1 || rs >= std::max<int64_t>(C, 1));
}
bool col_major_ok(int64_t R, int64_t C, int64_t rs, int64_t cs) {
  return (rs == 1 || R <= 1) && (C <= 1 || cs >= std::max<int64_t>(R, 1));
}

// One [B, R, C] operand as cuBLASLt reads it.
struct Mat {
  const void* ptr = nullptr;
  int64_t bs = 0;          // batch stride; 0 when broadcast or B == 1
  int64_t ld = 1;          // leading dimension
  bool row_major = true;   // false: column-major (a transposed view)
  Tensor hold;             // a contiguous copy this operand reads, kept alive for the call
};

Mat describe(const void* ptr, int64_t B, int64_t R, int64_t C, int64_t bs, int64_t rs, int64_t cs) {
  Mat m;
  m.ptr = ptr;
  m.bs = B > 1 ? bs : 0;
  if (row_major_ok(R, C, rs, cs)) {
    m.row_major = true;
    m.ld = R <= 1 ? std::max<int64_t>(C, 1) : rs;
  } else {
    m.row_major = false;
    m.ld = C <= 1 ? std::max<int64_t>(R, 1) : cs;
  }
  return m;
}

// t [B, R, C] as a Mat: in place when its matrices have a BLAS layout, else from a
// contiguous copy (a broadcast batch is copied once and stays broadcast).
Mat matmul_operand(const Tensor& t) {
  const int64_t B = t.size(0), R = t.size(1), C = t.size(2), rs = t.stride(1), cs = t.stride(2);
  const int64_t bs = B > 1 ? t.stride(0) : 0;
  if (row_major_ok(R, C, rs, cs) || col_major_ok(R, C, rs, cs)) return describe(t.raw_data(), B, R, C, bs, rs, cs);
  const Tensor src = B > 1 && bs == 0 ? detail::make_view(t, {1, R, C}, t.strides(), t.storage_offset()) : t;
  Tensor c = detail::contiguous_raw(src);
  Mat m = describe(c.raw_data(), B, R, C, B > 1 && bs == 0 ? 0 : R * C, C, 1);
  m.hold = std::move(c);
  return m;
}

// A 2-D matrix [R, C] read with strides (rs, cs) off `t` (linear's x, or weight seen
// transposed): in place, or from a contiguous copy of t itself.
Mat linear_operand(const Tensor& t, bool transposed) {
  const int64_t R = transposed ? t.size(1) : t.size(0), C = transposed ? t.size(0) : t.size(1);
  const int64_t rs = transposed ? t.stride(1) : t.stride(0), cs = transposed ? t.stride(0) : t.stride(1);
  if (row_major_ok(R, C, rs, cs) || col_major_ok(R, C, rs, cs)) return describe(t.raw_data(), 1, R, C, 0, rs, cs);
  Tensor c = detail::contiguous_raw(t);  // [t0, t1] with strides (t1, 1)
  Mat m = transposed ? describe(c.raw_data(), 1, R, C, 0, 1, t.size(1)) : describe(c.raw_data(), 1, R, C, 0, C, 1);
  m.hold = std::move(c);
  return m;
}

// ---- types ------------------------------------------------------------------------------

cudaDataType cuda_type(DType dt, const char* op) {
  switch (dt) {
    case kFloat32: return CUDA_R_32F;
    case kFloat64: return CUDA_R_64F;
    case kFloat16: return CUDA_R_16F;
    case kBFloat16: return CUDA_R_16BF;
    default: AG_ERROR(op, "expected float32, float64, float16 or bfloat16 operands on cuda, got ", dtype_name(dt));
  }
}

cublasComputeType_t compute_type(DType dt) {
  if (dt == kFloat64) return CUBLAS_COMPUTE_64F;
  if (dt == kFloat32 && float32_matmul_precision() != Float32MatmulPrecision::Highest)
    return CUBLAS_COMPUTE_32F_FAST_TF32;
  return CUBLAS_COMPUTE_32F;
}

// The alignment in bytes of a device address, capped at 256 (cuBLASLt's default assumption).
int64_t alignment(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  if (v == 0) return 256;
  const uintptr_t a = v & (~v + 1);
  return int64_t(a > 256 ? 256 : a);
}

// ---- plans ------------------------------------------------------------------------------

// An epilogue and the buffers it reads or writes.
struct Epi {
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // *BIAS: the bias (read); *BGRAD: the bias gradient (written)
  void* aux = nullptr;         // *_AUX: written; DRELU/DGELU: read
  int64_t aux_ld = 0;          // in elements (bits for the ReLU mask)
  bool uses_bias() const { return (kind & (CUBLASLT_EPILOGUE_BIAS | 16)) != 0; }  // 16: the BGRAD bit
  bool bias_grad() const { return (kind & 16) != 0; }
  bool uses_aux() const { return (kind & 128) != 0; }
};

// One problem, as the plan cache knows it.
struct Problem {
  int device = 0;
  DType dtype = kFloat32, out_dtype = kFloat32;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  Epi epi;
  int64_t B = 1, M = 0, K = 0, N = 0;
  const Mat* a = nullptr;  // [B, M, K]
  const Mat* w = nullptr;  // [B, K, N]
  const void* out = nullptr;

  using Key = std::array<int64_t, 21>;
  Key key() const {
    return {device, int64_t(dtype), int64_t(out_dtype), int64_t(compute), int64_t(epi.kind), B, M, K, N,
            a->row_major, a->ld, a->bs, w->row_major, w->ld, w->bs, alignment(a->ptr), alignment(w->ptr),
            alignment(out), epi.uses_bias() ? alignment(epi.bias) : 0, epi.uses_aux() ? alignment(epi.aux) : 0,
            epi.aux_ld};
  }
};

struct KeyHash {
  size_t operator()(const Problem::Key& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : k) h = (h ^ uint64_t(v)) * 1099511628211ull;
    return size_t(h);
  }
};

struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;  // cuBLASLt's A (w), B (a), C = D (out)
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;  // false: cuBLASLt has no algorithm for the problem with its epilogue
  std::mutex mu;    // the epilogue's pointers live in desc: set and enqueue under it
};

template <class V>
void set_desc(const char* op, cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
  AG_CUDA_CHECK(op, cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v));
}
template <class V>
void set_layout(const char* op, cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const V& v) {
  AG_CUDA_CHECK(op, cublasLtMatrixLayoutSetAttribute(l, attr, &v, sizeof v));
}

// A layout with its batch (batch count B, stride bs in elements; 0 broadcasts).
cublasLtMatrixLayout_t make_layout(const char* op, cudaDataType t, int64_t rows, int64_t cols, int64_t ld, int64_t B,
                                   int64_t bs) {
  cublasLtMatrixLayout_t l = nullptr;
  AG_CUDA_CHECK(op, cublasLtMatrixLayoutCreate(&l, t, uint64_t(rows), uint64_t(cols), ld));
  if (B > 1) {
    set_layout(op, l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, int32_t(B));
    set_layout(op, l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, int64_t(bs));
  }
  return l;
}

// Points desc at the epilogue's buffers (at plan time their alignment guides the heuristic).
void set_epilogue_pointers(const char* op, cublasLtMatmulDesc_t desc, const Epi& e) {
  if (e.uses_bias()) set_desc(op, desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, e.bias);
  if (e.uses_aux()) set_desc(op, desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, e.aux);
}

// Builds the descriptors and asks the heuristic for an algorithm with the problem's
// epilogue. Returns false (the plan's handles released) when cuBLASLt has none.
bool build(const Problem& p, GemmPlan& plan, cublasLtHandle_t h, const char* op) {
  const cudaDataType t = cuda_type(p.dtype, op), td = cuda_type(p.out_dtype, op);
  const cudaDataType scale = p.dtype == kFloat64 ? CUDA_R_64F : CUDA_R_32F;
  AG_CUDA_CHECK(op, cublasLtMatmulDescCreate(&plan.desc, p.compute, scale));
  // out^T [N, M] = op(w^T) [N, K] @ op(a^T) [K, M], column-major (see the top of the file).
  const int32_t ta = p.w->row_major ? CUBLAS_OP_N : CUBLAS_OP_T;
  const int32_t tb = p.a->row_major ? CUBLAS_OP_N : CUBLAS_OP_T;
  set_desc(op, plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, ta);
  set_desc(op, plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, tb);
  if (p.epi.kind != CUBLASLT_EPILOGUE_DEFAULT) {
    set_desc(op, plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, p.epi.kind);
    if (p.epi.uses_bias() && !p.epi.bias_grad()) set_desc(op, plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(t));
    if (p.epi.uses_aux()) set_desc(op, plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(p.epi.aux_ld));
    set_epilogue_pointers(op, plan.desc, p.epi);
  }
  plan.la = p.w->row_major ? make_layout(op, t, p.N, p.K, p.w->ld, p.B, p.w->bs)
                           : make_layout(op, t, p.K, p.N, p.w->ld, p.B, p.w->bs);
  plan.lb = p.a->row_major ? make_layout(op, t, p.K, p.M, p.a->ld, p.B, p.a->bs)
                           : make_layout(op, t, p.M, p.K, p.a->ld, p.B, p.a->bs);
  plan.ld = make_layout(op, td, p.N, p.M, p.N, p.B, p.M * p.N);

  cublasLtMatmulPreference_t pref = nullptr;
  AG_CUDA_CHECK(op, cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  const uint32_t al_a = uint32_t(alignment(p.w->ptr)), al_b = uint32_t(alignment(p.a->ptr)),
                 al_d = uint32_t(alignment(p.out));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(h, plan.desc, plan.la, plan.lb, plan.ld, plan.ld, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) AG_CUDA_CHECK(op, st);
  if (st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    plan.algo = result.algo;
    plan.ok = true;
    return true;
  }
  cublasLtMatmulDescDestroy(plan.desc);
  cublasLtMatrixLayoutDestroy(plan.la);
  cublasLtMatrixLayoutDestroy(plan.lb);
  cublasLtMatrixLayoutDestroy(plan.ld);
  plan.desc = nullptr;
  plan.la = plan.lb = plan.ld = nullptr;
  return false;
}

// The cached plan of a problem, built on first use (a plan without an algorithm is cached
// too, so the heuristic is asked once). Plans live for the process.
GemmPlan& get_plan(const Problem& p, cublasLtHandle_t h, const char* op) {
  static std::mutex mu;
  static auto* cache = new std::unordered_map<Problem::Key, std::unique_ptr<GemmPlan>, KeyHash>();
  const Problem::Key key = p.key();
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(key);
  if (it != cache->end()) return *it->second;
  auto plan = std::make_unique<GemmPlan>();
  build(p, *plan, h, op);
  return *cache->emplace(key, std::move(plan)).first->second;
}

// ---- small kernels ----------------------------------------------------------------------

// out[m, n] (+)= bias[n] over contiguous out [rows, N]; `accumulate` false writes the bias
// alone (a product over K = 0).
template <class D>
__global__ void add_bias_rows(D* out, const D* bias, int64_t n_total, int64_t N, bool accumulate) {
  using A = dacc_t<D>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n_total; i += int64_t(gridDim.x) * blockDim.x) {
    const A b = convert<A>(bias[i % N]);
    out[i] = convert<D>(accumulate ? convert<A>(out[i]) + b : b);
  }
}

void launch_add_bias(const Tensor& bias, const Tensor& out, int64_t n_total, int64_t N, bool accumulate,
                     cudaStream_t stream, const char* op) {
  dispatch_floating(out.dtype(), op, [&]<class T>() {
    using D = dev_t<T>;
    launch(add_bias_rows<D>, blocks_for(n_total), kThreads, 0, stream,
           static_cast<D*>(out.raw_data()), static_cast<const D*>(bias.raw_data()), n_total, N, accumulate);
  });
  check_launch(op, out.device().index);
}

// ---- the product ------------------------------------------------------------------------

// Queues out [B, M, N] (contiguous) = epi(a [B, M, K] @ w [B, K, N]), K > 0, and returns
// true; returns false, queueing nothing, when cuBLASLt has no algorithm with epi.
bool gemm(Mat a, Mat w, int64_t B, int64_t M, int64_t K, int64_t N, const Epi& epi, const Tensor& out, DType dtype,
          const char* op) {
  const int device = out.device().index;
  DeviceGuard guard(device, op);
  const cudaStream_t stream = stream_of(out.device());
  (void)cuda_type(dtype, op);
  // A shared right operand and left batches stacked row after row: one tall GEMM.
  if (B > 1 && w.bs == 0 && a.row_major && a.bs == M * a.ld) {
    M *= B;
    B = 1;
    a.bs = 0;
  }
  AG_CHECK(B <= INT32_MAX, op, "a batch of ", B, " products is more than cuBLASLt takes");
  Problem p;
  p.device = device;
  p.dtype = dtype;
  p.out_dtype = out.dtype();
  p.compute = compute_type(dtype);
  p.epi = epi;
  p.B = B;
  p.M = M;
  p.K = K;
  p.N = N;
  p.a = &a;
  p.w = &w;
  p.out = out.raw_data();
  const cublasLtHandle_t h = lt_handle(device, op);
  GemmPlan& plan = get_plan(p, h, op);
  if (!plan.ok) return false;
  void* ws = workspace(current_stream(out.device()), stream, op);
  const float one_f = 1, zero_f = 0;
  const double one_d = 1, zero_d = 0;
  const void* alpha = dtype == kFloat64 ? static_cast<const void*>(&one_d) : &one_f;
  const void* beta = dtype == kFloat64 ? static_cast<const void*>(&zero_d) : &zero_f;
  std::lock_guard<std::mutex> lock(plan.mu);
  if (epi.kind != CUBLASLT_EPILOGUE_DEFAULT) set_epilogue_pointers(op, plan.desc, epi);
  AG_CUDA_CHECK(op, cublasLtMatmul(h, plan.desc, alpha, w.ptr, plan.la, a.ptr, plan.lb, beta, out.raw_data(), plan.ld,
                                   out.raw_data(), plan.ld, &plan.algo, ws, kWorkspaceBytes, stream));
  return true;
}

// out [B, M, N] (contiguous) = a [B, M, K] @ w [B, K, N] (+ bias [N]).
void run(Mat a, Mat w, int64_t B, int64_t M, int64_t K, int64_t N, const Tensor& bias, const Tensor& out,
         DType dtype, const char* op) {
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device().index, op);
  const cudaStream_t stream = stream_of(out.device());
  (void)cuda_type(dtype, op);
  if (K == 0) {  // an empty sum: zeros, plus the bias
    if (bias.defined()) launch_add_bias(bias, out, out.numel(), N, false, stream, op);
    else AG_CUDA_CHECK(op, cudaMemsetAsync(out.raw_data(), 0, out.nbytes(), stream));
    return;
  }
  if (bias.defined() && gemm(a, w, B, M, K, N, Epi{CUBLASLT_EPILOGUE_BIAS, bias.raw_data()}, out, dtype, op)) return;
  if (!gemm(a, w, B, M, K, N, Epi{}, out, dtype, op))
    AG_ERROR(op, "cuBLASLt has no algorithm for ", dtype_name(dtype), " [", B, ", ", M, ", ", K, "] @ [", B, ", ", K,
             ", ", N, "] -> ", dtype_name(out.dtype()), " (leading dimensions ", a.ld, " and ", w.ld, ")");
  if (bias.defined()) launch_add_bias(bias, out, out.numel(), N, true, stream, op);
}

// The bias as the epilogue reads it: contiguous.
Tensor packed_bias(const Tensor& bias) {
  if (!bias.defined() || bias.stride(0) == 1 || bias.size(0) <= 1) return bias;
  return detail::contiguous_raw(bias);
}

// The ReLU mask's leading dimension: N bits rounded up to 128.
int64_t relu_mask_ld(int64_t N) { return (N + 127) / 128 * 128; }

}  // namespace

void release_blas_workspace(Stream s, cudaStream_t stream) {
  Workspaces& w = workspaces();
  std::lock_guard<std::mutex> lock(w.mu);
  auto& v = w.spaces[s.device().index];
  for (auto it = v.begin(); it != v.end(); ++it)
    if (it->first == s.id()) {
      AG_CUDA_CHECK("destroy_stream", cudaFreeAsync(it->second, stream));
      v.erase(it);
      return;
    }
}

void CudaBackend::matmul(const Tensor& a, const Tensor& w, const Tensor& out) {
  if (out.numel() == 0) return;
  const Mat ma = matmul_operand(a), mw = matmul_operand(w);
  run(ma, mw, a.size(0), a.size(1), a.size(2), w.size(2), Tensor(), out, a.dtype(), op::matmul);
}

void CudaBackend::linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) {
  if (out.numel() == 0) return;
  const Mat mx = linear_operand(x, false), mw = linear_operand(weight, true);
  run(mx, mw, 1, x.size(0), x.size(1), weight.size(0), packed_bias(bias), out, x.dtype(), op::linear);
}

Tensor CudaBackend::linear_act(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                               const Tensor& out, bool keep) {
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  const bool relu = act == Activation::Relu;
  // The erf form of GELU, float64 and empty products have no epilogue form.
  if (out.numel() == 0 || K == 0 || x.dtype() == kFloat64 || !(relu || act == Activation::GeluTanh) ||
      (keep && !relu && N % 8 != 0))
    return linear_act_composed(x, weight, bias, act, out, keep);
  const Tensor b = packed_bias(bias);
  const bool with_bias = b.defined();
  Epi e;
  e.bias = with_bias ? b.raw_data() : nullptr;
  Tensor aux;
  if (keep) {
    aux = relu ? make_tensor({M * relu_mask_ld(N) / 8}, kUInt8, out.device()) : make_tensor(out.sizes(), out.dtype(), out.device());
    e.aux = aux.raw_data();
    e.aux_ld = relu ? relu_mask_ld(N) : N;
    e.kind = relu ? (with_bias ? CUBLASLT_EPILOGUE_RELU_AUX_BIAS : CUBLASLT_EPILOGUE_RELU_AUX)
                  : (with_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX);
  } else {
    e.kind = relu ? (with_bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU)
                  : (with_bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU);
  }
  if (gemm(linear_operand(x, false), linear_operand(weight, true), 1, M, K, N, e, out, x.dtype(), op::linear))
    return aux;
  return linear_act_composed(x, weight, bias, act, out, keep);
}

void CudaBackend::linear_act_backward(const Tensor& g, const Tensor& next_weight, const Tensor& out,
                                      const Tensor& saved, Activation act, const Tensor& grad_pre,
                                      const Tensor& grad_bias) {
  const int64_t M = grad_pre.size(0), N = grad_pre.size(1);
  // A mask from RELU_AUX, or the pre-activation of tanh-form GELU: the epilogue reads it.
  const bool relu_mask = act == Activation::Relu && saved.defined() && saved.dtype() == kUInt8;
  const bool gelu_pre = act == Activation::GeluTanh && saved.defined() && N % 8 == 0;
  if (next_weight.defined() && (relu_mask || gelu_pre) && grad_pre.numel() > 0 && g.size(1) > 0 &&
      g.dtype() != kFloat64) {
    Epi e;
    const bool bgrad = grad_bias.defined();
    e.kind = relu_mask ? (bgrad ? CUBLASLT_EPILOGUE_DRELU_BGRAD : CUBLASLT_EPILOGUE_DRELU)
                       : (bgrad ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU);
    e.bias = bgrad ? grad_bias.raw_data() : nullptr;
    e.aux = saved.raw_data();
    e.aux_ld = relu_mask ? relu_mask_ld(N) : N;
    if (gemm(linear_operand(g, false), linear_operand(next_weight, false), 1, M, g.size(1), N, e, grad_pre, g.dtype(),
             op::linear))
      return;
  }
  AG_CHECK(!relu_mask || out.defined(), op::linear, "the ReLU gradient needs the output when the mask cannot be used");
  linear_act_backward_composed(g, next_weight, out, relu_mask ? Tensor() : saved, act, grad_pre, grad_bias);
}

}  // namespace ampgrad::cuda
