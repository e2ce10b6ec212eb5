// The emulated cuBLASLt (include/cublasLt.h): descriptors read as NVIDIA's API reference
// defines them, the argument checks the library makes, and cublasLtMatmul as plain loops
// queued on the stream. docs/cuda-emulator.md (its cuBLASLt and cuDNN section) lists what
// is interpreted how and what is refused.
#include <cublasLt.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <new>
#include <type_traits>
#include <vector>

#include "emu/stream.h"
#include "library_numerics.h"

struct cublasLtContext {
  uint64_t magic;
};

namespace ampgrad::emu {
namespace {

constexpr uint64_t kHandleMagic = 0x636c7448616e646cull;  // "cltHandl"
constexpr uint64_t kAlgoMagic = 0x456d754c74416c67ull;    // "EmuLtAlg"
// The workspace the emulated algorithm asks for when the preference allows it (as a
// split-K algorithm would); none otherwise. The loops never touch it.
constexpr uint64_t kAlgoWorkspace = uint64_t(1) << 20;
// A kernel reads at most 16 bytes at a time: the alignment an algorithm chosen for a
// preference can rely on is the preference's, up to 16.
constexpr uint32_t kMaxKernelAlignment = 16;

// ---- descriptor state (each field has its attribute's C type) ---------------------------------
struct Layout {
  uint32_t type;
  int32_t order;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch;
  int64_t stride;
};

struct Desc {
  int32_t compute, scale, pointer_mode, transa, transb, transc;
  uint32_t epilogue;
  const void* bias;
  int64_t bias_stride;
  const void* aux;
  int64_t aux_ld, aux_stride;
  int32_t bias_type;
};

struct Pref {
  uint64_t max_workspace;
  uint32_t align_a, align_b, align_c, align_d;
};

// The state lives in the semi-opaque struct's storage, as NVIDIA's *Init functions allow.
template <class T, class Opaque>
T& state(Opaque* o) {
  static_assert(sizeof(T) <= sizeof(o->data) && alignof(T) <= alignof(uint64_t) && std::is_trivially_copyable_v<T>);
  return *std::launder(reinterpret_cast<T*>(o->data));
}
template <class T, class Opaque>
cublasStatus_t create(Opaque** out, const T& init) {
  if (!out) return CUBLAS_STATUS_INVALID_VALUE;
  Opaque* o = new (std::nothrow) Opaque{};
  if (!o) return CUBLAS_STATUS_ALLOC_FAILED;
  new (o->data) T(init);
  *out = o;
  return CUBLAS_STATUS_SUCCESS;
}

// ---- attributes: a field and its size ---------------------------------------------------------
struct Field {
  void* p = nullptr;  // nullptr: no such attribute
  size_t size = 0;
};
template <class V>
Field field(V& v) {
  return {&v, sizeof v};
}

cublasStatus_t set_field(Field f, const void* buf, size_t size) {
  if (!f.p || !buf || size != f.size) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(f.p, buf, size);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t get_field(Field f, void* buf, size_t size, size_t* written) {
  if (!f.p) return CUBLAS_STATUS_INVALID_VALUE;
  if (size == 0) {  // a query of the size
    if (!written) return CUBLAS_STATUS_INVALID_VALUE;
    *written = f.size;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (!buf || size != f.size) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(buf, f.p, size);
  if (written) *written = size;
  return CUBLAS_STATUS_SUCCESS;
}

Field layout_field(Layout& l, cublasLtMatrixLayoutAttribute_t attr) {
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return field(l.type);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return field(l.order);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return field(l.rows);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return field(l.cols);
    case CUBLASLT_MATRIX_LAYOUT_LD: return field(l.ld);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return field(l.batch);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return field(l.stride);
  }
  return {};
}

Field desc_field(Desc& d, cublasLtMatmulDescAttributes_t attr) {
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return field(d.compute);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return field(d.scale);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return field(d.pointer_mode);
    case CUBLASLT_MATMUL_DESC_TRANSA: return field(d.transa);
    case CUBLASLT_MATMUL_DESC_TRANSB: return field(d.transb);
    case CUBLASLT_MATMUL_DESC_TRANSC: return field(d.transc);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return field(d.epilogue);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return field(d.bias);
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: return field(d.bias_stride);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return field(d.aux);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return field(d.aux_ld);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: return field(d.aux_stride);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return field(d.bias_type);
  }
  return {};
}

Field pref_field(Pref& p, cublasLtMatmulPreferenceAttributes_t attr) {
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return field(p.max_workspace);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return field(p.align_a);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return field(p.align_b);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return field(p.align_c);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return field(p.align_d);
  }
  return {};
}

// ---- the problem, checked ---------------------------------------------------------------------

// Epilogue bits (cublasLtEpilogue_t is built from them).
constexpr uint32_t kRelu = 2, kBias = 4, kDRelu = 8, kBGrad = 16, kGelu = 32, kDGelu = 64, kAux = 128;

bool known_epilogue(uint32_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT:
    case CUBLASLT_EPILOGUE_RELU:
    case CUBLASLT_EPILOGUE_RELU_AUX:
    case CUBLASLT_EPILOGUE_BIAS:
    case CUBLASLT_EPILOGUE_RELU_BIAS:
    case CUBLASLT_EPILOGUE_RELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_DRELU:
    case CUBLASLT_EPILOGUE_DRELU_BGRAD:
    case CUBLASLT_EPILOGUE_GELU:
    case CUBLASLT_EPILOGUE_GELU_AUX:
    case CUBLASLT_EPILOGUE_GELU_BIAS:
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_DGELU:
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: return true;
  }
  return false;
}

// How the products are formed: in float (inputs exact), in float from TF32-rounded inputs,
// or in double.
enum class Math { F32, TF32, F64 };

struct Problem {
  Desc desc;
  Layout a, b, c, d;
  bool trans_a = false, trans_b = false;
  uint64_t m = 0, n = 0, k = 0;
  Math math = Math::F32;
};

bool same_layout(const Layout& x, const Layout& y) {
  return x.type == y.type && x.order == y.order && x.rows == y.rows && x.cols == y.cols && x.ld == y.ld &&
         x.batch == y.batch && (x.batch == 1 || x.stride == y.stride);
}

// The order and leading dimension of one layout; ld 0 is allowed where `broadcast`
// (an out-of-place C).
cublasStatus_t check_layout(const Layout& l, bool broadcast) {
  if (l.order == CUBLASLT_ORDER_COL32 || l.order == CUBLASLT_ORDER_COL4_4R2_8C ||
      l.order == CUBLASLT_ORDER_COL32_2R_4R4)
    return CUBLAS_STATUS_NOT_SUPPORTED;  // the integer kernels' orders
  if (l.order != CUBLASLT_ORDER_COL && l.order != CUBLASLT_ORDER_ROW) return CUBLAS_STATUS_INVALID_VALUE;
  if (l.batch < 1 || l.ld < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (l.rows > uint64_t(INT32_MAX) || l.cols > uint64_t(INT32_MAX)) return CUBLAS_STATUS_NOT_SUPPORTED;
  // The stride between columns (COL) or rows (ROW) must keep them apart.
  const uint64_t need = l.order == CUBLASLT_ORDER_COL ? l.rows : l.cols;
  if (broadcast && l.ld == 0) return CUBLAS_STATUS_SUCCESS;
  if (uint64_t(l.ld) < (need > 1 ? need : 1)) return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

// NVIDIA's table of cublasLtMatmul's data types (the rows the emulator computes).
cublasStatus_t check_types(int32_t compute, int32_t scale, uint32_t ab, uint32_t cd, Math& math) {
  switch (compute) {
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
      math = Math::F32;
      if (scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
      if (ab == CUDA_R_32F && cd == CUDA_R_32F) return CUBLAS_STATUS_SUCCESS;
      if (ab == CUDA_R_16F && (cd == CUDA_R_16F || cd == CUDA_R_32F)) return CUBLAS_STATUS_SUCCESS;
      if (ab == CUDA_R_16BF && (cd == CUDA_R_16BF || cd == CUDA_R_32F)) return CUBLAS_STATUS_SUCCESS;
      return CUBLAS_STATUS_NOT_SUPPORTED;
    case CUBLAS_COMPUTE_32F_FAST_TF32:
      math = Math::TF32;
      return scale == CUDA_R_32F && ab == CUDA_R_32F && cd == CUDA_R_32F ? CUBLAS_STATUS_SUCCESS
                                                                         : CUBLAS_STATUS_NOT_SUPPORTED;
    case CUBLAS_COMPUTE_64F:
    case CUBLAS_COMPUTE_64F_PEDANTIC:
      math = Math::F64;
      return scale == CUDA_R_64F && ab == CUDA_R_64F && cd == CUDA_R_64F ? CUBLAS_STATUS_SUCCESS
                                                                         : CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;  // 16F, 32I, FAST_16F/16BF: not emulated
}

cublasStatus_t check_epilogue(const Problem& p) {
  const uint32_t e = p.desc.epilogue;
  if (!known_epilogue(e)) return CUBLAS_STATUS_INVALID_VALUE;
  const bool bias = (e & (kBias | kBGrad)) != 0, act = (e & (kRelu | kGelu | kDRelu | kDGelu)) != 0;
  if (bias && p.desc.bias_type != -1 && uint32_t(p.desc.bias_type) != p.d.type) return CUBLAS_STATUS_NOT_SUPPORTED;
  // A row-major D takes no activation combined with a bias (the table's footnote), and
  // no auxiliary matrix (the emulator's: its leading dimension is defined for columns).
  if (p.d.order == CUBLASLT_ORDER_ROW && ((bias && act) || (e & kAux))) return CUBLAS_STATUS_NOT_SUPPORTED;
  if ((e & kBGrad) && p.d.batch > 1) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (e & kAux) {
    // The ReLU mask has a leading dimension in bits, a multiple of 128; GELU's
    // pre-activation one in elements, a multiple of 8; both at least D's rows.
    const int64_t unit = (e & (kRelu | kDRelu)) ? 128 : 8;
    if (p.desc.aux_ld < int64_t(p.m) || p.desc.aux_ld % unit != 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (p.d.batch > 1 && p.desc.aux_stride % unit != 0) return CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_SUCCESS;
}

// Everything that can be checked without the data: the status cublasLtMatmul (and the
// heuristic) gives the problem. C may be null (then it is D's layout).
cublasStatus_t check_problem(const Desc& desc, const Layout* A, const Layout* B, const Layout* C, const Layout* D,
                             Problem& p) {
  if (!A || !B || !D) return CUBLAS_STATUS_INVALID_VALUE;
  p.desc = desc;
  p.a = *A;
  p.b = *B;
  p.d = *D;
  p.c = C ? *C : *D;
  for (const int32_t op : {desc.transa, desc.transb, desc.transc})
    if (op != CUBLAS_OP_N && op != CUBLAS_OP_T && op != CUBLAS_OP_C) return CUBLAS_STATUS_INVALID_VALUE;
  if (desc.transc != CUBLAS_OP_N) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (desc.pointer_mode != CUBLASLT_POINTER_MODE_HOST && desc.pointer_mode != CUBLASLT_POINTER_MODE_DEVICE)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  const bool out_of_place_c = C && !same_layout(*C, *D);
  if ((st = check_layout(p.a, false)) || (st = check_layout(p.b, false)) || (st = check_layout(p.c, out_of_place_c)) ||
      (st = check_layout(p.d, false)))
    return st;
  // C and D: one type, shape, batch and order (C's leading dimension may differ).
  if (p.c.type != p.d.type || p.c.rows != p.d.rows || p.c.cols != p.d.cols || p.c.batch != p.d.batch ||
      p.c.order != p.d.order)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (p.a.type != p.b.type) return CUBLAS_STATUS_NOT_SUPPORTED;
  if ((st = check_types(desc.compute, desc.scale, p.a.type, p.d.type, p.math))) return st;
  // op(A) is m x k, op(B) k x n, D m x n. CUBLAS_OP_C of real data is its transpose.
  p.trans_a = desc.transa != CUBLAS_OP_N;
  p.trans_b = desc.transb != CUBLAS_OP_N;
  p.m = p.d.rows;
  p.n = p.d.cols;
  const uint64_t a_rows = p.trans_a ? p.a.cols : p.a.rows, a_cols = p.trans_a ? p.a.rows : p.a.cols;
  const uint64_t b_rows = p.trans_b ? p.b.cols : p.b.rows, b_cols = p.trans_b ? p.b.rows : p.b.cols;
  p.k = a_cols;
  if (a_rows != p.m || b_cols != p.n || b_rows != p.k) return CUBLAS_STATUS_INVALID_VALUE;
  if (p.a.batch != p.d.batch || p.b.batch != p.d.batch) return CUBLAS_STATUS_INVALID_VALUE;
  return check_epilogue(p);
}

// ---- the algorithm ------------------------------------------------------------------------------

uint32_t alignment_of(const void* ptr) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(ptr);
  if (v == 0) return 256;
  const uintptr_t a = v & (~v + 1);
  return uint32_t(a > 256 ? 256 : a);
}
uint64_t cap(uint32_t a) { return a > 256 ? 256 : a; }

// What the algorithm was chosen for: the type configuration and epilogue it computes.
uint64_t fingerprint(const Problem& p) {
  return uint64_t(uint32_t(p.desc.compute) & 0xff) | uint64_t(uint32_t(p.desc.scale) & 0xff) << 8 |
         uint64_t(p.a.type & 0xff) << 16 | uint64_t(p.d.type & 0xff) << 24 | uint64_t(p.desc.epilogue) << 32;
}

cublasLtMatmulAlgo_t make_algo(const Problem& p, const Pref& pref) {
  cublasLtMatmulAlgo_t algo{};
  algo.data[0] = kAlgoMagic;
  algo.data[1] = pref.max_workspace >= kAlgoWorkspace ? kAlgoWorkspace : 0;
  algo.data[2] = cap(pref.align_a) | cap(pref.align_b) << 16 | cap(pref.align_c) << 32 | cap(pref.align_d) << 48;
  // The heuristic reads the epilogue's pointers for their alignment only.
  algo.data[3] = uint64_t(alignment_of(p.desc.bias)) | uint64_t(alignment_of(p.desc.aux)) << 16;
  algo.data[4] = fingerprint(p);
  return algo;
}

constexpr Pref kDefaultPref{0, 256, 256, 256, 256};

// The alignment an algorithm relies on for operand `i` (0..3: A, B, C, D; 4, 5: bias, aux).
uint32_t relied_alignment(const cublasLtMatmulAlgo_t& algo, int i) {
  const uint64_t v = i < 4 ? (algo.data[2] >> (16 * i)) & 0xffff : (algo.data[3] >> (16 * (i - 4))) & 0xffff;
  return uint32_t(v < kMaxKernelAlignment ? v : kMaxKernelAlignment);
}

// ---- the arithmetic -----------------------------------------------------------------------------

// The element type of a cudaDataType the table admits.
Elem elem(uint32_t t) {
  switch (t) {
    case CUDA_R_32F: return Elem::F32;
    case CUDA_R_64F: return Elem::F64;
    case CUDA_R_16F: return Elem::F16;
  }
  return Elem::BF16;
}

// Element (r, c) of matrix `b` of the batch, in elements from the base pointer.
int64_t offset(const Layout& l, uint64_t r, uint64_t c, int64_t b) {
  const int64_t rc = l.order == CUBLASLT_ORDER_COL ? int64_t(r) + int64_t(c) * l.ld : int64_t(r) * l.ld + int64_t(c);
  return b * l.stride + rc;
}

// cuBLASLt's GELU is the tanh form; dgelu is its derivative.
template <class S>
S gelu(S x) {
  const S c = S(0.7978845608028654), a = S(0.044715);
  return S(0.5) * x * (S(1) + std::tanh(c * (x + a * x * x * x)));
}
template <class S>
S dgelu(S x) {
  const S c = S(0.7978845608028654), a = S(0.044715);
  const S t = std::tanh(c * (x + a * x * x * x));
  return S(0.5) * (S(1) + t) + S(0.5) * x * (S(1) - t * t) * c * (S(1) + S(3) * a * x * x);
}

bool mask_bit(const void* mask, int64_t bit) { return (static_cast<const uint8_t*>(mask)[bit / 8] >> (bit % 8)) & 1; }
void set_mask_bit(void* mask, int64_t bit, bool on) {
  uint8_t& byte = static_cast<uint8_t*>(mask)[bit / 8];
  const uint8_t m = uint8_t(1u << (bit % 8));
  byte = on ? uint8_t(byte | m) : uint8_t(byte & ~m);
}

struct Pointers {
  const void *a, *b, *c;
  void* d;
  const void* bias;  // written by the BGRAD epilogues
  const void* aux;   // written by the *_AUX epilogues
};

// D = epilogue(alpha * op(A) op(B) + beta * C) in the scale type S (float or double): the
// sums in S, each output rounded once to D's type. Every output is computed before any is
// written, so C (or the epilogue's inputs) may be D.
template <class S>
void run(const Problem& p, const Pointers& ptr, S alpha, S beta) {
  const int64_t B = p.d.batch, m = int64_t(p.m), n = int64_t(p.n), k = int64_t(p.k);
  const bool tf32 = p.math == Math::TF32;
  std::vector<S> out(size_t(B * m * n));
  std::vector<S> opa(size_t(m * k)), opb(size_t(k * n));
  for (int64_t b = 0; b < B; ++b) {
    // op(A) [m, k] and op(B) [k, n] in S, row-major.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t l = 0; l < k; ++l) {
        const int64_t at = p.trans_a ? offset(p.a, l, i, b) : offset(p.a, i, l, b);
        S v = load<S>(ptr.a, elem(p.a.type), at);
        if (tf32) v = S(round_tf32(float(v)));
        opa[size_t(i * k + l)] = v;
      }
    for (int64_t l = 0; l < k; ++l)
      for (int64_t j = 0; j < n; ++j) {
        const int64_t at = p.trans_b ? offset(p.b, j, l, b) : offset(p.b, l, j, b);
        S v = load<S>(ptr.b, elem(p.b.type), at);
        if (tf32) v = S(round_tf32(float(v)));
        opb[size_t(l * n + j)] = v;
      }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        S acc = 0;
        for (int64_t l = 0; l < k; ++l) acc += opa[size_t(i * k + l)] * opb[size_t(l * n + j)];
        S v = alpha * acc;
        if (beta != S(0)) v += beta * load<S>(ptr.c, elem(p.c.type), offset(p.c, i, j, b));  // beta 0: C is not read
        out[size_t((b * m + i) * n + j)] = v;
      }
  }

  const uint32_t e = p.desc.epilogue;
  const uint32_t bias_type = p.desc.bias_type == -1 ? p.d.type : uint32_t(p.desc.bias_type);
  std::vector<S> bias_grad(size_t(m), S(0));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        S v = out[size_t((b * m + i) * n + j)];
        const int64_t aux_at = b * p.desc.aux_stride + j * p.desc.aux_ld + i;  // column-major, in elements or bits
        if (e & kBias) v += load<S>(ptr.bias, elem(bias_type), b * p.desc.bias_stride + i);
        if ((e & kAux) && (e & kRelu)) set_mask_bit(const_cast<void*>(ptr.aux), aux_at, v > S(0));
        if ((e & kAux) && (e & kGelu)) store<S>(const_cast<void*>(ptr.aux), elem(p.d.type), aux_at, v);
        if (e & kRelu) v = v < S(0) ? S(0) : v;  // NaN stays NaN
        if (e & kGelu) v = gelu(v);
        if (e & kDRelu) v = mask_bit(ptr.aux, aux_at) ? v : S(0);
        if (e & kDGelu) v *= dgelu(load<S>(ptr.aux, elem(p.d.type), aux_at));
        if (e & kBGrad) bias_grad[size_t(i)] += v;
        store<S>(ptr.d, elem(p.d.type), offset(p.d, i, j, b), v);
      }
  if (e & kBGrad)
    for (int64_t i = 0; i < m; ++i) store<S>(const_cast<void*>(ptr.bias), elem(bias_type), i, bias_grad[size_t(i)]);
}

// The scale type's value behind a scalar pointer.
template <class S>
S scalar(const void* p) {
  return *static_cast<const S*>(p);
}

bool valid_handle(cublasLtHandle_t h) { return h && h->magic == kHandleMagic; }

}  // namespace
}  // namespace ampgrad::emu

using namespace ampgrad::emu;

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle) {
  if (!lightHandle) return CUBLAS_STATUS_INVALID_VALUE;
  cublasLtHandle_t h = new (std::nothrow) cublasLtContext{kHandleMagic};
  if (!h) return CUBLAS_STATUS_ALLOC_FAILED;
  *lightHandle = h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
  if (!valid_handle(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  lightHandle->magic = 0;
  delete lightHandle;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "an error was detected when checking the current licensing";
  }
  return "unknown cuBLAS status";
}

// ---- layouts ------------------------------------------------------------------------------------
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  return create(matLayout, Layout{uint32_t(type), CUBLASLT_ORDER_COL, rows, cols, ld, 1, 0});
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  delete matLayout;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t sizeInBytes) {
  if (!matLayout) return CUBLAS_STATUS_INVALID_VALUE;
  return set_field(layout_field(state<Layout>(matLayout), attr), buf, sizeInBytes);
}
cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr,
                                                void* buf, size_t sizeInBytes, size_t* sizeWritten) {
  if (!matLayout) return CUBLAS_STATUS_INVALID_VALUE;
  return get_field(layout_field(state<Layout>(matLayout), attr), buf, sizeInBytes, sizeWritten);
}

// ---- operation descriptors ------------------------------------------------------------------------
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType) {
  Desc d{};
  d.compute = computeType;
  d.scale = scaleType;
  d.pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  d.transa = d.transb = d.transc = CUBLAS_OP_N;
  d.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  d.bias_type = -1;
  return create(matmulDesc, d);
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  delete matmulDesc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t sizeInBytes) {
  if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
  return set_field(desc_field(state<Desc>(matmulDesc), attr), buf, sizeInBytes);
}
cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              void* buf, size_t sizeInBytes, size_t* sizeWritten) {
  if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
  return get_field(desc_field(state<Desc>(matmulDesc), attr), buf, sizeInBytes, sizeWritten);
}

// ---- preferences ------------------------------------------------------------------------------------
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) { return create(pref, kDefaultPref); }
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t sizeInBytes) {
  if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
  return set_field(pref_field(state<Pref>(pref), attr), buf, sizeInBytes);
}
cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, void* buf,
                                                    size_t sizeInBytes, size_t* sizeWritten) {
  if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
  return get_field(pref_field(state<Pref>(pref), attr), buf, sizeInBytes, sizeWritten);
}

// ---- the heuristic ------------------------------------------------------------------------------------
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int* returnAlgoCount) {
  if (!valid_handle(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!operationDesc || !preference || requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount)
    return CUBLAS_STATUS_INVALID_VALUE;
  *returnAlgoCount = 0;
  auto layout = [](cublasLtMatrixLayout_t l) { return l ? &state<Layout>(l) : nullptr; };
  Problem p;
  const cublasStatus_t st =
      check_problem(state<Desc>(operationDesc), layout(Adesc), layout(Bdesc), layout(Cdesc), layout(Ddesc), p);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const Pref& pref = state<Pref>(preference);
  cublasLtMatmulHeuristicResult_t r{};
  r.algo = make_algo(p, pref);
  r.workspaceSize = size_t(r.algo.data[1]);
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  heuristicResultsArray[0] = r;
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}

// ---- the product ---------------------------------------------------------------------------------------
cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspaceSizeInBytes, cudaStream_t stream) {
  if (!valid_handle(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!computeDesc || !alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  auto layout = [](cublasLtMatrixLayout_t l) { return l ? &state<Layout>(l) : nullptr; };
  Problem p;  // the descriptors as they are now: later changes do not reach the queued work
  cublasStatus_t st =
      check_problem(state<Desc>(computeDesc), layout(Adesc), layout(Bdesc), layout(Cdesc), layout(Ddesc), p);
  if (st != CUBLAS_STATUS_SUCCESS) return st;

  // The algorithm: one the heuristic returned for this configuration, or (algo NULL) the
  // one an implicit query with the default preference returns.
  const cublasLtMatmulAlgo_t chosen = algo ? *algo : make_algo(p, kDefaultPref);
  if (chosen.data[0] != kAlgoMagic || chosen.data[4] != fingerprint(p)) return CUBLAS_STATUS_INVALID_VALUE;
  if (workspaceSizeInBytes < chosen.data[1]) return CUBLAS_STATUS_INVALID_VALUE;
  if (chosen.data[1] > 0 && !workspace) return CUBLAS_STATUS_INVALID_VALUE;
  if (workspace && workspaceSizeInBytes > 0 && reinterpret_cast<uintptr_t>(workspace) % 256 != 0)
    return CUBLAS_STATUS_INVALID_VALUE;

  // In place needs Cdesc == Ddesc.
  if (C == D && Cdesc && !same_layout(p.c, p.d)) return CUBLAS_STATUS_INVALID_VALUE;
  const bool host_scalars = p.desc.pointer_mode == CUBLASLT_POINTER_MODE_HOST;
  const bool f64 = p.math == Math::F64;
  const bool beta_zero = host_scalars && (f64 ? scalar<double>(beta) == 0 : scalar<float>(beta) == 0);
  const bool empty_out = p.m == 0 || p.n == 0;
  if (!empty_out && (!D || (p.k > 0 && (!A || !B)) || (!beta_zero && !C))) return CUBLAS_STATUS_INVALID_VALUE;

  const uint32_t e = p.desc.epilogue;
  const bool needs_bias = (e & (kBias | kBGrad)) != 0, needs_aux = (e & kAux) != 0;
  if (!empty_out && ((needs_bias && !p.desc.bias) || (needs_aux && !p.desc.aux))) return CUBLAS_STATUS_INVALID_VALUE;

  // Every pointer holds whole elements, at least as aligned as the algorithm relies on;
  // on the GPU a pointer that is not is a misaligned-address fault.
  const uint32_t bias_type = p.desc.bias_type == -1 ? p.d.type : uint32_t(p.desc.bias_type);
  const void* const operands[6] = {A,
                                   B,
                                   beta_zero ? nullptr : C,
                                   D,
                                   needs_bias ? p.desc.bias : nullptr,
                                   needs_aux && (e & (kGelu | kDGelu)) ? p.desc.aux : nullptr};
  const uint32_t types[6] = {p.a.type, p.b.type, p.c.type, p.d.type, bias_type, p.d.type};
  for (int i = 0; i < 6; ++i) {
    if (!operands[i]) continue;
    const uint32_t have = alignment_of(operands[i]);
    if (have < uint32_t(elem_size(elem(types[i]))) || have < relied_alignment(chosen, i))
      return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (empty_out) return CUBLAS_STATUS_SUCCESS;

  const Pointers ptr{A, B, C, D, p.desc.bias, p.desc.aux};
  if (f64) {
    const double a = host_scalars ? scalar<double>(alpha) : 0, b = host_scalars ? scalar<double>(beta) : 0;
    enqueue(stream, [p, ptr, a, b, host_scalars, alpha, beta] {
      run<double>(p, ptr, host_scalars ? a : scalar<double>(alpha), host_scalars ? b : scalar<double>(beta));
    });
  } else {
    const float a = host_scalars ? scalar<float>(alpha) : 0, b = host_scalars ? scalar<float>(beta) : 0;
    enqueue(stream, [p, ptr, a, b, host_scalars, alpha, beta] {
      run<float>(p, ptr, host_scalars ? a : scalar<float>(alpha), host_scalars ? b : scalar<float>(beta));
    });
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
