// The emulated cuDNN (include/cudnn.h): tensor, filter and convolution descriptors read as
// NVIDIA's API reference defines them, the checks the library makes, and the three legacy
// convolution calls as plain loops queued on the handle's stream.
// docs/cuda-emulator.md (its cuBLASLt and cuDNN section) lists what is interpreted how and
// what is refused.
#include <cudnn.h>

#include <cstdint>
#include <initializer_list>
#include <new>
#include <vector>

#include "emu/stream.h"
#include "library_numerics.h"

struct cudnnContext {
  uint64_t magic;
  cudaStream_t stream;
};

struct cudnnTensorStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int n = 0, c = 0, h = 0, w = 0;
  int ns = 0, cs = 0, hs = 0, ws = 0;  // strides in elements
};

struct cudnnFilterStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;
  int k = 0, c = 0, h = 0, w = 0;
};

struct cudnnConvolutionStruct {
  bool set = false;
  int pad_h = 0, pad_w = 0, u = 1, v = 1, dil_h = 1, dil_w = 1;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  int groups = 1;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

namespace ampgrad::emu {
namespace {

constexpr uint64_t kHandleMagic = 0x636475486e646c65ull;  // "cduHndle"

bool valid(cudnnHandle_t h) { return h && h->magic == kHandleMagic; }

// How the products are formed: from exact inputs in float or double, or from float inputs
// rounded to TF32 or to float16 first (the math types that allow it).
enum class Arith { F32, TF32, FP16_INPUTS, F64 };

// One convolution, checked, with everything the loops need (copied from the descriptors,
// so that later changes to them do not reach queued work).
struct Conv {
  Elem elem = Elem::F32;
  Arith arith = Arith::F32;
  int64_t N = 0, C = 0, H = 0, W = 0;  // x
  int64_t K = 0, R = 0, S = 0;         // filter: K outputs of C / G inputs, R x S taps
  int64_t P = 0, Q = 0;                // y's height and width
  int64_t G = 1, Cg = 0, Kg = 0;       // groups, input and output channels per group
  int64_t pad_h = 0, pad_w = 0, u = 1, v = 1, dil_h = 1, dil_w = 1;
  bool flip = false;                           // CUDNN_CONVOLUTION: the filter is applied reversed
  int64_t xs[4] = {}, ys[4] = {}, fs[4] = {};  // strides of x [n c h w], y [n k p q], w [k c r s]
  size_t workspace = 0;

  // One past the largest element offset of x, y and the filter.
  int64_t x_extent() const { return x_at(N - 1, C - 1, H - 1, W - 1) + 1; }
  int64_t y_extent() const { return y_at(N - 1, K - 1, P - 1, Q - 1) + 1; }
  int64_t w_extent() const { return K * Cg * R * S; }

  int64_t x_at(int64_t n, int64_t c, int64_t h, int64_t w) const {
    return n * xs[0] + c * xs[1] + h * xs[2] + w * xs[3];
  }
  int64_t y_at(int64_t n, int64_t k, int64_t p, int64_t q) const {
    return n * ys[0] + k * ys[1] + p * ys[2] + q * ys[3];
  }
  // The weight applied at tap (r, s).
  int64_t w_at(int64_t k, int64_t c, int64_t r, int64_t s) const {
    if (flip) r = R - 1 - r, s = S - 1 - s;
    return k * fs[0] + c * fs[1] + r * fs[2] + s * fs[3];
  }
};

// The data type configurations of NVIDIA's table for the legacy convolutions (x, w and y
// share one type; the convolution descriptor's compute type accumulates). TRUE_HALF_CONFIG
// (half accumulation) exists in cuDNN but is not emulated.
cudnnStatus_t configuration(cudnnDataType_t data, cudnnDataType_t compute, cudnnMathType_t math, Conv& c) {
  switch (data) {
    case CUDNN_DATA_FLOAT:  // FLOAT_CONFIG
      if (compute != CUDNN_DATA_FLOAT) return CUDNN_STATUS_NOT_SUPPORTED;
      c.elem = Elem::F32;
      // FMA math computes in float; the default and tensor-op math allow TF32 tensor
      // cores (Ampere and later); ALLOW_CONVERSION allows converting the data to float16.
      c.arith = math == CUDNN_FMA_MATH                          ? Arith::F32
                : math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ? Arith::FP16_INPUTS
                                                                : Arith::TF32;
      return CUDNN_STATUS_SUCCESS;
    case CUDNN_DATA_HALF:      // PSEUDO_HALF_CONFIG
    case CUDNN_DATA_BFLOAT16:  // PSEUDO_BFLOAT16_CONFIG
      if (compute != CUDNN_DATA_FLOAT) return CUDNN_STATUS_NOT_SUPPORTED;
      c.elem = data == CUDNN_DATA_HALF ? Elem::F16 : Elem::BF16;
      c.arith = Arith::F32;
      return CUDNN_STATUS_SUCCESS;
    case CUDNN_DATA_DOUBLE:  // DOUBLE_CONFIG
      if (compute != CUDNN_DATA_DOUBLE) return CUDNN_STATUS_NOT_SUPPORTED;
      c.elem = Elem::F64;
      c.arith = Arith::F64;
      return CUDNN_STATUS_SUCCESS;
    default: return CUDNN_STATUS_NOT_SUPPORTED;
  }
}

// The output size along one dim, or -1 when the dilated filter is larger than the padded
// input.
int64_t out_size(int64_t in, int64_t pad, int64_t taps, int64_t dil, int64_t stride) {
  const int64_t span = (taps - 1) * dil + 1;
  if (in + 2 * pad < span) return -1;
  return (in + 2 * pad - span) / stride + 1;
}

cudnnStatus_t check_conv(const cudnnTensorStruct* x, const cudnnFilterStruct* w, const cudnnConvolutionStruct* cv,
                         const cudnnTensorStruct* y, Conv& c) {
  if (!x || !w || !cv || !y || !x->set || !w->set || !cv->set || !y->set) return CUDNN_STATUS_BAD_PARAM;
  if (x->type != w->type || x->type != y->type) return CUDNN_STATUS_BAD_PARAM;
  if (cudnnStatus_t st = configuration(x->type, cv->compute, cv->math, c)) return st;
  c.N = x->n, c.C = x->c, c.H = x->h, c.W = x->w;
  c.K = w->k, c.R = w->h, c.S = w->w;
  c.G = cv->groups;
  // x's channels split into G groups of the filter's c channels; the filter's k outputs too.
  if (c.C % c.G != 0 || int64_t(w->c) * c.G != c.C || c.K % c.G != 0) return CUDNN_STATUS_BAD_PARAM;
  c.Cg = w->c;
  c.Kg = c.K / c.G;
  c.pad_h = cv->pad_h, c.pad_w = cv->pad_w, c.u = cv->u, c.v = cv->v, c.dil_h = cv->dil_h, c.dil_w = cv->dil_w;
  c.flip = cv->mode == CUDNN_CONVOLUTION;
  c.P = out_size(c.H, c.pad_h, c.R, c.dil_h, c.u);
  c.Q = out_size(c.W, c.pad_w, c.S, c.dil_w, c.v);
  if (c.P < 0 || c.Q < 0) return CUDNN_STATUS_BAD_PARAM;
  if (y->n != c.N || y->c != c.K || y->h != c.P || y->w != c.Q) return CUDNN_STATUS_BAD_PARAM;
  const int64_t xs[4] = {x->ns, x->cs, x->hs, x->ws}, ys[4] = {y->ns, y->cs, y->hs, y->ws};
  for (int i = 0; i < 4; ++i) c.xs[i] = xs[i], c.ys[i] = ys[i];
  // NCHW filters are [k][c][r][s]; NHWC ones [k][r][s][c].
  if (w->format == CUDNN_TENSOR_NCHW) {
    c.fs[3] = 1, c.fs[2] = c.S, c.fs[1] = c.R * c.S, c.fs[0] = c.Cg * c.R * c.S;
  } else {
    c.fs[1] = 1, c.fs[3] = c.Cg, c.fs[2] = c.S * c.Cg, c.fs[0] = c.R * c.S * c.Cg;
  }
  // Every algorithm asks for an index table of the filter's taps (as implicit precomputed
  // GEMM keeps one); the loops never touch it.
  c.workspace = sizeof(int32_t) * size_t(c.Cg * c.R * c.S);
  return CUDNN_STATUS_SUCCESS;
}

// The elements [0, extent) of an input as the products see them (read once, in the
// accumulation type, rounded as the math type allows).
template <class A>
std::vector<A> inputs(const Conv& c, const void* base, int64_t extent) {
  std::vector<A> v(static_cast<size_t>(extent));
  for (int64_t i = 0; i < extent; ++i) {
    const A e = load<A>(base, c.elem, i);
    if (c.arith == Arith::TF32)
      v[size_t(i)] = A(round_tf32(float(e)));
    else if (c.arith == Arith::FP16_INPUTS)
      v[size_t(i)] = A(round_fp16(float(e)));
    else
      v[size_t(i)] = e;
  }
  return v;
}

// out[i] = alpha * acc[i] + beta * out[i] (out not read when beta is 0), rounded once.
template <class A>
void blend(const Conv& c, void* out, const std::vector<int64_t>& at, const std::vector<A>& acc, A alpha, A beta) {
  for (size_t i = 0; i < acc.size(); ++i) {
    A v = alpha * acc[i];
    if (beta != A(0)) v += beta * load<A>(out, c.elem, at[i]);
    store<A>(out, c.elem, at[i], v);
  }
}

// y[n, k, p, q] = sum over the group's channels and the taps of x * w.
template <class A>
void forward(const Conv& c, const void* xp, const void* wp, void* y, A alpha, A beta) {
  const std::vector<A> x = inputs<A>(c, xp, c.x_extent()), w = inputs<A>(c, wp, c.w_extent());
  std::vector<A> acc;
  std::vector<int64_t> at;
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t k = 0; k < c.K; ++k)
      for (int64_t p = 0; p < c.P; ++p)
        for (int64_t q = 0; q < c.Q; ++q) {
          const int64_t g = k / c.Kg;
          A s = 0;
          for (int64_t ci = 0; ci < c.Cg; ++ci)
            for (int64_t r = 0; r < c.R; ++r)
              for (int64_t t = 0; t < c.S; ++t) {
                const int64_t h = p * c.u - c.pad_h + r * c.dil_h, wi = q * c.v - c.pad_w + t * c.dil_w;
                if (h < 0 || h >= c.H || wi < 0 || wi >= c.W) continue;
                s += x[size_t(c.x_at(n, g * c.Cg + ci, h, wi))] * w[size_t(c.w_at(k, ci, r, t))];
              }
          acc.push_back(s);
          at.push_back(c.y_at(n, k, p, q));
        }
  blend(c, y, at, acc, alpha, beta);
}

// The output position along one dim whose tap `tap` reads input position i, or -1.
int64_t output_of(int64_t i, int64_t tap, int64_t stride, int64_t pad, int64_t dil, int64_t outs) {
  const int64_t t = i + pad - tap * dil;
  if (t < 0 || t % stride != 0 || t / stride >= outs) return -1;
  return t / stride;
}

// dx[n, c, h, w] = sum over the outputs that read it of dy * the weight that read it.
template <class A>
void backward_data(const Conv& c, const void* wp, const void* dyp, void* dx, A alpha, A beta) {
  const std::vector<A> w = inputs<A>(c, wp, c.w_extent()), dy = inputs<A>(c, dyp, c.y_extent());
  std::vector<A> acc;
  std::vector<int64_t> at;
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t ch = 0; ch < c.C; ++ch)
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t wi = 0; wi < c.W; ++wi) {
          const int64_t g = ch / c.Cg, ci = ch % c.Cg;
          A s = 0;
          for (int64_t k = g * c.Kg; k < (g + 1) * c.Kg; ++k)
            for (int64_t r = 0; r < c.R; ++r) {
              const int64_t p = output_of(h, r, c.u, c.pad_h, c.dil_h, c.P);
              if (p < 0) continue;
              for (int64_t t = 0; t < c.S; ++t) {
                const int64_t q = output_of(wi, t, c.v, c.pad_w, c.dil_w, c.Q);
                if (q < 0) continue;
                s += dy[size_t(c.y_at(n, k, p, q))] * w[size_t(c.w_at(k, ci, r, t))];
              }
            }
          acc.push_back(s);
          at.push_back(c.x_at(n, ch, h, wi));
        }
  blend(c, dx, at, acc, alpha, beta);
}

// dw at tap (r, s) of [k, c] = sum over the batch and the outputs of dy * the input read.
template <class A>
void backward_filter(const Conv& c, const void* xp, const void* dyp, void* dw, A alpha, A beta) {
  const std::vector<A> x = inputs<A>(c, xp, c.x_extent()), dy = inputs<A>(c, dyp, c.y_extent());
  std::vector<A> acc;
  std::vector<int64_t> at;
  for (int64_t k = 0; k < c.K; ++k)
    for (int64_t ci = 0; ci < c.Cg; ++ci)
      for (int64_t r = 0; r < c.R; ++r)
        for (int64_t t = 0; t < c.S; ++t) {
          const int64_t g = k / c.Kg;
          A s = 0;
          for (int64_t n = 0; n < c.N; ++n)
            for (int64_t p = 0; p < c.P; ++p)
              for (int64_t q = 0; q < c.Q; ++q) {
                const int64_t h = p * c.u - c.pad_h + r * c.dil_h, wi = q * c.v - c.pad_w + t * c.dil_w;
                if (h < 0 || h >= c.H || wi < 0 || wi >= c.W) continue;
                s += dy[size_t(c.y_at(n, k, p, q))] * x[size_t(c.x_at(n, g * c.Cg + ci, h, wi))];
              }
          acc.push_back(s);
          at.push_back(c.w_at(k, ci, r, t));
        }
  blend(c, dw, at, acc, alpha, beta);
}

// The algorithms: cuDNN never implemented forward DIRECT or backward-filter WINOGRAD;
// every other one computes the same loops here.
cudnnStatus_t check_algo(int algo, int count, int missing) {
  if (algo < 0 || algo >= count) return CUDNN_STATUS_BAD_PARAM;
  return algo == missing ? CUDNN_STATUS_NOT_SUPPORTED : CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t check_fwd_algo(cudnnConvolutionFwdAlgo_t a) {
  return check_algo(a, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, CUDNN_CONVOLUTION_FWD_ALGO_DIRECT);
}
cudnnStatus_t check_bwd_data_algo(cudnnConvolutionBwdDataAlgo_t a) {
  return check_algo(a, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, -1);
}
cudnnStatus_t check_bwd_filter_algo(cudnnConvolutionBwdFilterAlgo_t a) {
  return check_algo(a, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD);
}

// The one ranked result of a *_v7 query: the algorithm the emulator offers, or the
// configuration's refusal in its status.
template <class Perf, class Algo>
cudnnStatus_t rank(cudnnHandle_t h, cudnnStatus_t checked, const Conv& c, cudnnMathType_t math, Algo algo,
                   int requested, int* returned, Perf* perf) {
  if (!valid(h) || requested < 1 || !returned || !perf) return CUDNN_STATUS_BAD_PARAM;
  if (checked != CUDNN_STATUS_SUCCESS && checked != CUDNN_STATUS_NOT_SUPPORTED) return checked;
  Perf r{};
  r.algo = algo;
  r.status = checked;
  r.time = -1.0f;  // not measured
  r.memory = checked == CUDNN_STATUS_SUCCESS ? c.workspace : 0;
  r.determinism = CUDNN_DETERMINISTIC;
  r.mathType = math;
  perf[0] = r;
  *returned = 1;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t workspace_size(cudnnHandle_t h, cudnnStatus_t checked, cudnnStatus_t algo_ok, const Conv& c,
                             size_t* size) {
  if (!valid(h) || !size) return CUDNN_STATUS_BAD_PARAM;
  if (checked != CUDNN_STATUS_SUCCESS) return checked;
  if (algo_ok != CUDNN_STATUS_SUCCESS) return algo_ok;
  *size = c.workspace;
  return CUDNN_STATUS_SUCCESS;
}

// The checks of an execution call, then its work queued on the handle's stream with alpha
// and beta read now (cuDNN's scaling factors are host memory).
template <class Body>
cudnnStatus_t launch(cudnnHandle_t h, cudnnStatus_t checked, cudnnStatus_t algo_ok, const Conv& c, const void* alpha,
                     const void* beta, const void* in1, const void* in2, void* out, void* workspace,
                     size_t workspace_bytes, const Body& body) {
  if (!valid(h) || !alpha || !beta || !in1 || !in2 || !out) return CUDNN_STATUS_BAD_PARAM;
  if (checked != CUDNN_STATUS_SUCCESS) return checked;
  if (algo_ok != CUDNN_STATUS_SUCCESS) return algo_ok;
  if (workspace_bytes < c.workspace || (c.workspace > 0 && !workspace)) return CUDNN_STATUS_BAD_PARAM;
  if (c.arith == Arith::F64) {
    const double a = *static_cast<const double*>(alpha), b = *static_cast<const double*>(beta);
    enqueue(h->stream, [c, in1, in2, out, a, b, body] { body(c, in1, in2, out, a, b); });
  } else {
    const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
    enqueue(h->stream, [c, in1, in2, out, a, b, body] { body(c, in1, in2, out, a, b); });
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t bad_dims(std::initializer_list<int> dims) {
  for (int d : dims)
    if (d <= 0) return CUDNN_STATUS_BAD_PARAM;
  return CUDNN_STATUS_SUCCESS;
}

bool known_type(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT:
    case CUDNN_DATA_DOUBLE:
    case CUDNN_DATA_HALF:
    case CUDNN_DATA_INT8:
    case CUDNN_DATA_INT32:
    case CUDNN_DATA_BFLOAT16:
    case CUDNN_DATA_INT64: return true;
  }
  return false;
}

}  // namespace
}  // namespace ampgrad::emu

using namespace ampgrad::emu;

extern "C" {

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH: return "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH";
    case CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH: return "CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH";
    case CUDNN_STATUS_DEPRECATED: return "CUDNN_STATUS_DEPRECATED";
    case CUDNN_STATUS_LICENSE_ERROR: return "CUDNN_STATUS_LICENSE_ERROR";
    case CUDNN_STATUS_RUNTIME_IN_PROGRESS: return "CUDNN_STATUS_RUNTIME_IN_PROGRESS";
    case CUDNN_STATUS_RUNTIME_FP_OVERFLOW: return "CUDNN_STATUS_RUNTIME_FP_OVERFLOW";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER: return "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER";
    case CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED: return "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED";
    case CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND: return "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND";
    case CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT: return "CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT";
    case CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH: return "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH";
    case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH: return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_SUPPORTED_SHAPE: return "CUDNN_STATUS_NOT_SUPPORTED_SHAPE";
    case CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE: return "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE";
    case CUDNN_STATUS_NOT_SUPPORTED_LAYOUT: return "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT";
    case CUDNN_STATUS_INTERNAL_ERROR: return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
  }
  return "CUDNN_STATUS_UNKNOWN";
}

// ---- handle ----------------------------------------------------------------------------------
cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  if (!handle) return CUDNN_STATUS_BAD_PARAM;
  *handle = new (std::nothrow) cudnnContext{kHandleMagic, nullptr};
  return *handle ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_INTERNAL_ERROR;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  if (!valid(handle)) return CUDNN_STATUS_BAD_PARAM;
  handle->magic = 0;
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId) {
  if (!valid(handle)) return CUDNN_STATUS_BAD_PARAM;
  handle->stream = streamId;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t* streamId) {
  if (!valid(handle) || !streamId) return CUDNN_STATUS_BAD_PARAM;
  *streamId = handle->stream;
  return CUDNN_STATUS_SUCCESS;
}

// ---- tensors ------------------------------------------------------------------------------------
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* tensorDesc) {
  if (!tensorDesc) return CUDNN_STATUS_BAD_PARAM;
  *tensorDesc = new (std::nothrow) cudnnTensorStruct{};
  return *tensorDesc ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_INTERNAL_ERROR;
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc) {
  delete tensorDesc;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetTensor4dDescriptorEx(cudnnTensorDescriptor_t t, cudnnDataType_t dataType, int n, int c, int h,
                                           int w, int nStride, int cStride, int hStride, int wStride) {
  if (!t || !known_type(dataType)) return CUDNN_STATUS_BAD_PARAM;
  if (bad_dims({n, c, h, w, nStride, cStride, hStride, wStride})) return CUDNN_STATUS_BAD_PARAM;
  t->set = true;
  t->type = dataType;
  t->n = n, t->c = c, t->h = h, t->w = w;
  t->ns = nStride, t->cs = cStride, t->hs = hStride, t->ws = wStride;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t t, cudnnTensorFormat_t format,
                                         cudnnDataType_t dataType, int n, int c, int h, int w) {
  if (bad_dims({n, c, h, w})) return CUDNN_STATUS_BAD_PARAM;
  if (format == CUDNN_TENSOR_NCHW) return cudnnSetTensor4dDescriptorEx(t, dataType, n, c, h, w, c * h * w, h * w, w, 1);
  if (format == CUDNN_TENSOR_NHWC) return cudnnSetTensor4dDescriptorEx(t, dataType, n, c, h, w, h * w * c, 1, w * c, c);
  return CUDNN_STATUS_BAD_PARAM;
}
cudnnStatus_t cudnnGetTensor4dDescriptor(const cudnnTensorDescriptor_t t, cudnnDataType_t* dataType, int* n, int* c,
                                         int* h, int* w, int* nStride, int* cStride, int* hStride, int* wStride) {
  if (!t || !t->set || !dataType || !n || !c || !h || !w || !nStride || !cStride || !hStride || !wStride)
    return CUDNN_STATUS_BAD_PARAM;
  *dataType = t->type;
  *n = t->n, *c = t->c, *h = t->h, *w = t->w;
  *nStride = t->ns, *cStride = t->cs, *hStride = t->hs, *wStride = t->ws;
  return CUDNN_STATUS_SUCCESS;
}

// ---- filters -------------------------------------------------------------------------------------
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* filterDesc) {
  if (!filterDesc) return CUDNN_STATUS_BAD_PARAM;
  *filterDesc = new (std::nothrow) cudnnFilterStruct{};
  return *filterDesc ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_INTERNAL_ERROR;
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t filterDesc) {
  delete filterDesc;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t f, cudnnDataType_t dataType,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
  if (!f || !known_type(dataType) || bad_dims({k, c, h, w})) return CUDNN_STATUS_BAD_PARAM;
  if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC) return CUDNN_STATUS_BAD_PARAM;
  f->set = true;
  f->type = dataType;
  f->format = format;
  f->k = k, f->c = c, f->h = h, f->w = w;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetFilter4dDescriptor(const cudnnFilterDescriptor_t f, cudnnDataType_t* dataType,
                                         cudnnTensorFormat_t* format, int* k, int* c, int* h, int* w) {
  if (!f || !f->set || !dataType || !format || !k || !c || !h || !w) return CUDNN_STATUS_BAD_PARAM;
  *dataType = f->type;
  *format = f->format;
  *k = f->k, *c = f->c, *h = f->h, *w = f->w;
  return CUDNN_STATUS_SUCCESS;
}

// ---- convolution descriptors -----------------------------------------------------------------------
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* convDesc) {
  if (!convDesc) return CUDNN_STATUS_BAD_PARAM;
  *convDesc = new (std::nothrow) cudnnConvolutionStruct{};
  return *convDesc ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_INTERNAL_ERROR;
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t convDesc) {
  delete convDesc;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t cv, int pad_h, int pad_w, int u, int v,
                                              int dilation_h, int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t computeType) {
  if (!cv || pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dilation_h <= 0 || dilation_w <= 0)
    return CUDNN_STATUS_BAD_PARAM;
  if ((mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION) || !known_type(computeType))
    return CUDNN_STATUS_BAD_PARAM;
  cv->set = true;
  cv->pad_h = pad_h, cv->pad_w = pad_w, cv->u = u, cv->v = v, cv->dil_h = dilation_h, cv->dil_w = dilation_w;
  cv->mode = mode;
  cv->compute = computeType;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolution2dDescriptor(const cudnnConvolutionDescriptor_t cv, int* pad_h, int* pad_w, int* u,
                                              int* v, int* dilation_h, int* dilation_w, cudnnConvolutionMode_t* mode,
                                              cudnnDataType_t* computeType) {
  if (!cv || !cv->set || !pad_h || !pad_w || !u || !v || !dilation_h || !dilation_w || !mode || !computeType)
    return CUDNN_STATUS_BAD_PARAM;
  *pad_h = cv->pad_h, *pad_w = cv->pad_w, *u = cv->u, *v = cv->v, *dilation_h = cv->dil_h, *dilation_w = cv->dil_w;
  *mode = cv->mode;
  *computeType = cv->compute;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t cv, int groupCount) {
  if (!cv || groupCount < 1) return CUDNN_STATUS_BAD_PARAM;
  cv->groups = groupCount;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionGroupCount(cudnnConvolutionDescriptor_t cv, int* groupCount) {
  if (!cv || !groupCount) return CUDNN_STATUS_BAD_PARAM;
  *groupCount = cv->groups;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t cv, cudnnMathType_t mathType) {
  if (!cv || mathType < CUDNN_DEFAULT_MATH || mathType > CUDNN_FMA_MATH) return CUDNN_STATUS_BAD_PARAM;
  cv->math = mathType;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionMathType(cudnnConvolutionDescriptor_t cv, cudnnMathType_t* mathType) {
  if (!cv || !mathType) return CUDNN_STATUS_BAD_PARAM;
  *mathType = cv->math;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t cv,
                                                    const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
                                                    int* n, int* c, int* h, int* wo) {
  if (!cv || !x || !w || !cv->set || !x->set || !w->set || !n || !c || !h || !wo) return CUDNN_STATUS_BAD_PARAM;
  if (x->c % cv->groups != 0 || w->c * cv->groups != x->c) return CUDNN_STATUS_BAD_PARAM;
  const int64_t p = out_size(x->h, cv->pad_h, w->h, cv->dil_h, cv->u),
                q = out_size(x->w, cv->pad_w, w->w, cv->dil_w, cv->v);
  if (p < 0 || q < 0) return CUDNN_STATUS_BAD_PARAM;
  *n = x->n, *c = w->k, *h = int(p), *wo = int(q);
  return CUDNN_STATUS_SUCCESS;
}

// ---- algorithms -------------------------------------------------------------------------------------
cudnnStatus_t cudnnGetConvolutionForwardAlgorithmMaxCount(cudnnHandle_t handle, int* count) {
  if (!valid(handle) || !count) return CUDNN_STATUS_BAD_PARAM;
  *count = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnnHandle_t handle, int* count) {
  if (!valid(handle) || !count) return CUDNN_STATUS_BAD_PARAM;
  *count = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnnHandle_t handle, int* count) {
  if (!valid(handle) || !count) return CUDNN_STATUS_BAD_PARAM;
  *count = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
                                                     const cudnnFilterDescriptor_t filterDesc,
                                                     const cudnnConvolutionDescriptor_t convDesc,
                                                     const cudnnTensorDescriptor_t destDesc,
                                                     const int requestedAlgoCount, int* returnedAlgoCount,
                                                     cudnnConvolutionFwdAlgoPerf_t* perfResults) {
  Conv c;
  const cudnnStatus_t st = check_conv(srcDesc, filterDesc, convDesc, destDesc, c);
  return rank(handle, st, c, convDesc ? convDesc->math : CUDNN_DEFAULT_MATH,
              CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, requestedAlgoCount, returnedAlgoCount, perfResults);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t filterDesc, const cudnnTensorDescriptor_t diffDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t gradDesc, const int requestedAlgoCount,
    int* returnedAlgoCount, cudnnConvolutionBwdDataAlgoPerf_t* perfResults) {
  Conv c;
  const cudnnStatus_t st = check_conv(gradDesc, filterDesc, convDesc, diffDesc, c);
  return rank(handle, st, c, convDesc ? convDesc->math : CUDNN_DEFAULT_MATH, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
              requestedAlgoCount, returnedAlgoCount, perfResults);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
                                                            const cudnnTensorDescriptor_t diffDesc,
                                                            const cudnnConvolutionDescriptor_t convDesc,
                                                            const cudnnFilterDescriptor_t gradDesc,
                                                            const int requestedAlgoCount, int* returnedAlgoCount,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t* perfResults) {
  Conv c;
  const cudnnStatus_t st = check_conv(srcDesc, gradDesc, convDesc, diffDesc, c);
  return rank(handle, st, c, convDesc ? convDesc->math : CUDNN_DEFAULT_MATH, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
              requestedAlgoCount, returnedAlgoCount, perfResults);
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                      const cudnnFilterDescriptor_t wDesc,
                                                      const cudnnConvolutionDescriptor_t convDesc,
                                                      const cudnnTensorDescriptor_t yDesc,
                                                      cudnnConvolutionFwdAlgo_t algo, size_t* sizeInBytes) {
  Conv c;
  const cudnnStatus_t st = check_conv(xDesc, wDesc, convDesc, yDesc, c);
  return workspace_size(handle, st, check_fwd_algo(algo), c, sizeInBytes);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc,
                                                           const cudnnTensorDescriptor_t dyDesc,
                                                           const cudnnConvolutionDescriptor_t convDesc,
                                                           const cudnnTensorDescriptor_t dxDesc,
                                                           cudnnConvolutionBwdDataAlgo_t algo, size_t* sizeInBytes) {
  Conv c;
  const cudnnStatus_t st = check_conv(dxDesc, wDesc, convDesc, dyDesc, c);
  return workspace_size(handle, st, check_bwd_data_algo(algo), c, sizeInBytes);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                             const cudnnTensorDescriptor_t dyDesc,
                                                             const cudnnConvolutionDescriptor_t convDesc,
                                                             const cudnnFilterDescriptor_t gradDesc,
                                                             cudnnConvolutionBwdFilterAlgo_t algo,
                                                             size_t* sizeInBytes) {
  Conv c;
  const cudnnStatus_t st = check_conv(xDesc, gradDesc, convDesc, dyDesc, c);
  return workspace_size(handle, st, check_bwd_filter_algo(algo), c, sizeInBytes);
}

// ---- the convolutions ---------------------------------------------------------------------------------
cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t xDesc,
                                      const void* x, const cudnnFilterDescriptor_t wDesc, const void* w,
                                      const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionFwdAlgo_t algo,
                                      void* workSpace, size_t workSpaceSizeInBytes, const void* beta,
                                      const cudnnTensorDescriptor_t yDesc, void* y) {
  Conv c;
  const cudnnStatus_t st = check_conv(xDesc, wDesc, convDesc, yDesc, c);
  return launch(
      handle, st, check_fwd_algo(algo), c, alpha, beta, x, w, y, workSpace, workSpaceSizeInBytes,
      [](const Conv& c, const void* x, const void* w, void* y, auto a, auto b) { forward(c, x, w, y, a, b); });
}
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha, const cudnnFilterDescriptor_t wDesc,
                                           const void* w, const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                           const cudnnConvolutionDescriptor_t convDesc,
                                           cudnnConvolutionBwdDataAlgo_t algo, void* workSpace,
                                           size_t workSpaceSizeInBytes, const void* beta,
                                           const cudnnTensorDescriptor_t dxDesc, void* dx) {
  Conv c;
  const cudnnStatus_t st = check_conv(dxDesc, wDesc, convDesc, dyDesc, c);
  return launch(handle, st, check_bwd_data_algo(algo), c, alpha, beta, w, dy, dx, workSpace, workSpaceSizeInBytes,
                [](const Conv& c, const void* w, const void* dy, void* dx, auto a, auto b) {
                  backward_data(c, w, dy, dx, a, b);
                });
}
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void* alpha,
                                             const cudnnTensorDescriptor_t xDesc, const void* x,
                                             const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                             const cudnnConvolutionDescriptor_t convDesc,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void* workSpace,
                                             size_t workSpaceSizeInBytes, const void* beta,
                                             const cudnnFilterDescriptor_t dwDesc, void* dw) {
  Conv c;
  const cudnnStatus_t st = check_conv(xDesc, dwDesc, convDesc, dyDesc, c);
  return launch(handle, st, check_bwd_filter_algo(algo), c, alpha, beta, x, dy, dw, workSpace, workSpaceSizeInBytes,
                [](const Conv& c, const void* x, const void* dy, void* dw, auto a, auto b) {
                  backward_filter(c, x, dy, dw, a, b);
                });
}

}  // extern "C"
