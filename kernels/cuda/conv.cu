// Convolution on CUDA through cuDNN, and pooling with our own kernels (NCHW, contiguous).
//
// Convolution. Forward, backward-data and backward-filter are cuDNN's legacy convolution
// calls (cudnnConvolutionForward / BackwardData / BackwardFilter) with groups and
// dilation in the convolution descriptor. float32, float16 and bfloat16 compute in
// float32 (float16/bfloat16 with tensor-op math); float32 uses CUDNN_FMA_MATH (no TF32)
// unless ag::set_float32_matmul_precision allows TF32 ("high", "medium": CUDNN_DEFAULT_MATH),
// as the products do; float64 computes in float64. Each problem (kind, shapes, parameters,
// dtype, math) gets one plan, built on first use and kept for the process: its
// descriptors and the algorithm cudnnGet*Algorithm_v7 ranks first among those that
// succeed within a workspace cap, with the math type that algorithm was ranked for. The
// workspace is an ampgrad tensor on the device (the stream-ordered pool), so it is freed
// in stream order. The cuDNN handle is per host thread and device (a handle holds its
// stream, so threads never race on cudnnSetStream); it is bound to the current stream at
// each call and never destroyed. The bias is added, and its gradient summed per channel
// in float32 (float64 for float64) and rounded once, by two small kernels of ours, as
// the CPU does (conv_bias_grad).
//
// Pooling runs our kernels rather than cuDNN's pooling, which has no dilation and divides
// a ceil_mode window that overhangs the padding by the full window: the kernels follow
// PyTorch's window rules exactly as the CPU loops do (cpu/conv_common.cpp): dilation,
// ceil_mode, count_include_pad, a NaN wins its max window, float32 accumulation for the
// 16-bit dtypes. max_pool2d saves the int64 index (h * W + w) of each maximum within its
// plane, as the CPU does. The backward kernels gather (one thread per input element sums
// the outputs whose windows read it, in the CPU's order), so no atomics and no
// nondeterminism; a max window that lies wholly in padding (output -inf) passes no
// gradient.
//
// Empty problems follow the CPU: a product over no input channels (or no input pixels)
// is zeros plus the bias; an empty gradient is zeros.
#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "ampgrad/factories.h"
#include "ampgrad/matmul_precision.h"
#include "cuda/common.cuh"
#include "cuda/cuda_backend.h"

namespace ampgrad::cuda {
namespace {

constexpr int kMaxDevices = 64;
// Algorithms needing more workspace than this are passed over while a cheaper one exists.
constexpr size_t kWorkspaceCap = size_t(1) << 30;

// ---- cuDNN state -------------------------------------------------------------------------

// This thread's handle for `device`, bound to `stream` (the caller holds a DeviceGuard).
cudnnHandle_t dnn_handle(int device, cudaStream_t stream, const char* op) {
  thread_local cudnnHandle_t handles[kMaxDevices] = {};
  AG_CHECK(device >= 0 && device < kMaxDevices, op, "device index ", device, " out of range");
  if (!handles[device]) AG_CUDA_CHECK(op, cudnnCreate(&handles[device]));
  AG_CUDA_CHECK(op, cudnnSetStream(handles[device], stream));
  return handles[device];
}

struct DnnTypes {
  cudnnDataType_t data, compute;
};

DnnTypes dnn_types(DType dt, const char* op) {
  switch (dt) {
    case kFloat32: return {CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT};
    case kFloat16: return {CUDNN_DATA_HALF, CUDNN_DATA_FLOAT};
    case kBFloat16: return {CUDNN_DATA_BFLOAT16, CUDNN_DATA_FLOAT};
    case kFloat64: return {CUDNN_DATA_DOUBLE, CUDNN_DATA_DOUBLE};
    default: AG_ERROR(op, "expected a float32, float64, float16 or bfloat16 tensor on cuda, got ", dtype_name(dt));
  }
}

// The math type a problem asks cuDNN for (the chosen algorithm's may refine it).
cudnnMathType_t requested_math(DType dt) {
  if (dt == kFloat16 || dt == kBFloat16) return CUDNN_TENSOR_OP_MATH;
  if (dt == kFloat32 && float32_matmul_precision() == Float32MatmulPrecision::Highest) return CUDNN_FMA_MATH;
  return CUDNN_DEFAULT_MATH;
}

int as_int(int64_t v, const char* op, const char* what) {
  AG_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(), op, what, " ", v, " is more than cuDNN takes");
  return int(v);
}

// ---- convolution plans ---------------------------------------------------------------------

enum class Kind : int64_t { Forward = 0, BackwardData = 1, BackwardFilter = 2 };

struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  int algo = 0;
  size_t workspace = 0;
};

using ConvKey = std::array<int64_t, 24>;

struct KeyHash {
  size_t operator()(const ConvKey& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : k) h = (h ^ uint64_t(v)) * 1099511628211ull;
    return size_t(h);
  }
};

// The first usable algorithm of a ranked list: succeeded, within the workspace cap when
// any is, and not ranked for tensor ops when the math asked for is FMA (float32 without
// TF32). Returns its index, or -1.
template <class Perf>
int pick(const Perf* perf, int n, cudnnMathType_t requested) {
  int best = -1;
  for (int i = 0; i < n; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (requested == CUDNN_FMA_MATH &&
        (perf[i].mathType == CUDNN_TENSOR_OP_MATH || perf[i].mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
      continue;
    if (perf[i].memory <= kWorkspaceCap) return i;
    if (best < 0 || perf[i].memory < perf[best].memory) best = i;
  }
  return best;
}

const char* kind_name(Kind kind) {
  return kind == Kind::Forward ? "forward" : kind == Kind::BackwardData ? "backward-data" : "backward-filter";
}

// What makes a problem's plan: the device, kind, dtype, math, shapes and parameters.
ConvKey conv_key(Kind kind, const Shape& xs, const Shape& ws, const Shape& ys, const Conv2dParams& p, DType dt,
                 cudnnMathType_t math, int device) {
  return {device,      int64_t(kind), int64_t(dt),  int64_t(math), xs[0],         xs[1], xs[2],    xs[3],
          ws[0],       ws[1],         ws[2],        ws[3],         ys[2],         ys[3], p.groups, p.stride[0],
          p.stride[1], p.padding[0],  p.padding[1], p.dilation[0], p.dilation[1], ys[0], ys[1],    0};
}

// The plan's descriptors of x, y, w and the convolution, asking for `math`.
void describe_problem(ConvPlan& c, const Shape& xs, const Shape& ws, const Shape& ys, const Conv2dParams& p, DType dt,
                      cudnnMathType_t math, const char* op) {
  const DnnTypes t = dnn_types(dt, op);
  AG_CHECK(xs.numel() <= std::numeric_limits<int>::max() && ys.numel() <= std::numeric_limits<int>::max(), op,
           "tensors of ", xs.numel(), " and ", ys.numel(), " elements are more than cuDNN takes in one call");
  AG_CUDA_CHECK(op, cudnnCreateTensorDescriptor(&c.x));
  AG_CUDA_CHECK(op, cudnnCreateTensorDescriptor(&c.y));
  AG_CUDA_CHECK(op, cudnnCreateFilterDescriptor(&c.w));
  AG_CUDA_CHECK(op, cudnnCreateConvolutionDescriptor(&c.conv));
  AG_CUDA_CHECK(op, cudnnSetTensor4dDescriptor(c.x, CUDNN_TENSOR_NCHW, t.data, as_int(xs[0], op, "batch"),
                                               as_int(xs[1], op, "channels"), as_int(xs[2], op, "height"),
                                               as_int(xs[3], op, "width")));
  AG_CUDA_CHECK(op, cudnnSetTensor4dDescriptor(c.y, CUDNN_TENSOR_NCHW, t.data, as_int(ys[0], op, "batch"),
                                               as_int(ys[1], op, "channels"), as_int(ys[2], op, "height"),
                                               as_int(ys[3], op, "width")));
  AG_CUDA_CHECK(op, cudnnSetFilter4dDescriptor(c.w, t.data, CUDNN_TENSOR_NCHW, as_int(ws[0], op, "out_channels"),
                                               as_int(ws[1], op, "channels"), as_int(ws[2], op, "kernel height"),
                                               as_int(ws[3], op, "kernel width")));
  AG_CUDA_CHECK(op, cudnnSetConvolution2dDescriptor(
                        c.conv, as_int(p.padding[0], op, "padding"), as_int(p.padding[1], op, "padding"),
                        as_int(p.stride[0], op, "stride"), as_int(p.stride[1], op, "stride"),
                        as_int(p.dilation[0], op, "dilation"), as_int(p.dilation[1], op, "dilation"),
                        CUDNN_CROSS_CORRELATION, t.compute));
  AG_CUDA_CHECK(op, cudnnSetConvolutionGroupCount(c.conv, as_int(p.groups, op, "groups")));
  AG_CUDA_CHECK(op, cudnnSetConvolutionMathType(c.conv, math));
}

// Runs rank(n, &found, perf), a cudnnGet*Algorithm_v7 call, and takes the first usable of
// its ranking (pick): its algorithm into c.algo and the math it was ranked for into
// chosen_math. False when none is usable.
template <class Perf, class Rank>
bool pick_ranked(int n, cudnnMathType_t requested, ConvPlan& c, cudnnMathType_t& chosen_math, const Rank& rank) {
  int found = 0;
  std::unique_ptr<Perf[]> perf(new Perf[size_t(n)]);
  rank(n, &found, perf.get());
  const int chosen = pick(perf.get(), found, requested);
  if (chosen < 0) return false;
  c.algo = int(perf[size_t(chosen)].algo);
  chosen_math = perf[size_t(chosen)].mathType;
  return true;
}

// The algorithm of the plan's kind that cuDNN ranks first among the usable ones (pick).
bool choose_algorithm(Kind kind, ConvPlan& c, cudnnHandle_t h, cudnnMathType_t math, cudnnMathType_t& chosen_math,
                      const char* op) {
  int n = 0;
  switch (kind) {
    case Kind::Forward:
      AG_CUDA_CHECK(op, cudnnGetConvolutionForwardAlgorithmMaxCount(h, &n));
      return pick_ranked<cudnnConvolutionFwdAlgoPerf_t>(n, math, c, chosen_math, [&](int m, int* found, auto* perf) {
        AG_CUDA_CHECK(op, cudnnGetConvolutionForwardAlgorithm_v7(h, c.x, c.w, c.conv, c.y, m, found, perf));
      });
    case Kind::BackwardData:
      AG_CUDA_CHECK(op, cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &n));
      return pick_ranked<cudnnConvolutionBwdDataAlgoPerf_t>(
          n, math, c, chosen_math, [&](int m, int* found, auto* perf) {
            AG_CUDA_CHECK(op, cudnnGetConvolutionBackwardDataAlgorithm_v7(h, c.w, c.y, c.conv, c.x, m, found, perf));
          });
    case Kind::BackwardFilter:
      AG_CUDA_CHECK(op, cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &n));
      return pick_ranked<cudnnConvolutionBwdFilterAlgoPerf_t>(
          n, math, c, chosen_math, [&](int m, int* found, auto* perf) {
            AG_CUDA_CHECK(op, cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, c.x, c.y, c.conv, c.w, m, found, perf));
          });
  }
  return false;
}

// The workspace the plan's algorithm needs, into c.workspace.
void size_workspace(Kind kind, ConvPlan& c, cudnnHandle_t h, const char* op) {
  switch (kind) {
    case Kind::Forward:
      AG_CUDA_CHECK(op, cudnnGetConvolutionForwardWorkspaceSize(h, c.x, c.w, c.conv, c.y,
                                                                cudnnConvolutionFwdAlgo_t(c.algo), &c.workspace));
      break;
    case Kind::BackwardData:
      AG_CUDA_CHECK(op, cudnnGetConvolutionBackwardDataWorkspaceSize(h, c.w, c.y, c.conv, c.x,
                                                                     cudnnConvolutionBwdDataAlgo_t(c.algo),
                                                                     &c.workspace));
      break;
    case Kind::BackwardFilter:
      AG_CUDA_CHECK(op, cudnnGetConvolutionBackwardFilterWorkspaceSize(h, c.x, c.y, c.conv, c.w,
                                                                       cudnnConvolutionBwdFilterAlgo_t(c.algo),
                                                                       &c.workspace));
      break;
  }
}

// The plan of a problem, from the cache or built (descriptors, algorithm, workspace) and kept.
// x [N, C, H, W], w [OC, C / groups, KH, KW], y [N, OC, OH, OW].
ConvPlan& get_plan(Kind kind, const Shape& xs, const Shape& ws, const Shape& ys, const Conv2dParams& p, DType dt,
                   int device, cudnnHandle_t h, const char* op) {
  static std::mutex mu;
  static auto* cache = new std::unordered_map<ConvKey, std::unique_ptr<ConvPlan>, KeyHash>();
  const cudnnMathType_t math = requested_math(dt);
  const ConvKey key = conv_key(kind, xs, ws, ys, p, dt, math, device);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(key);
  if (it != cache->end()) return *it->second;

  auto plan = std::make_unique<ConvPlan>();
  describe_problem(*plan, xs, ws, ys, p, dt, math, op);
  cudnnMathType_t chosen_math = math;
  AG_CHECK(choose_algorithm(kind, *plan, h, math, chosen_math, op), op, "cuDNN has no ", kind_name(kind),
           " algorithm for ", dtype_name(dt), " input of shape ", xs, " and weight of shape ", ws, " (groups ",
           p.groups, ")");
  // The algorithm was ranked for this math type; run it with that one, except that FMA
  // (float32 without TF32) stays FMA.
  if (math != CUDNN_FMA_MATH) AG_CUDA_CHECK(op, cudnnSetConvolutionMathType(plan->conv, chosen_math));
  size_workspace(kind, *plan, h, op);
  return *cache->emplace(key, std::move(plan)).first->second;
}

// Scratch memory for one call: a device tensor from the stream-ordered pool, freed in
// stream order when the call returns.
Tensor workspace_for(size_t bytes, Device device) {
  if (bytes == 0) return Tensor();
  return empty({int64_t(bytes)}, TensorOptions().dtype(kUInt8).device(device));
}
void* data_or_null(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

// alpha = 1 and beta = 0 in the type cuDNN reads them in (double for float64 data).
struct Scales {
  float one_f = 1, zero_f = 0;
  double one_d = 1, zero_d = 0;
  bool dbl;
  explicit Scales(DType dt) : dbl(dt == kFloat64) {}
  const void* one() const { return dbl ? static_cast<const void*>(&one_d) : &one_f; }
  const void* zero() const { return dbl ? static_cast<const void*>(&zero_d) : &zero_f; }
};

// ---- bias kernels ----------------------------------------------------------------------------

// out[n, c, :] (+)= bias[c] over contiguous out [N, C, plane]; without `accumulate` the
// bias is written alone (a convolution over no input).
template <class D>
__global__ void add_channel_bias(D* out, const D* bias, int64_t total, int64_t plane, int64_t C, bool accumulate) {
  using A = dacc_t<D>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const A b = convert<A>(bias[(i / plane) % C]);
    out[i] = convert<D>(accumulate ? convert<A>(out[i]) + b : b);
  }
}

// gb[c] = the sum of gy [N, C, plane] over N and plane: one block per channel, summed in
// the compute type and rounded once.
template <class D>
__global__ void channel_sums(const D* gy, D* gb, int64_t N, int64_t C, int64_t plane) {
  using A = dacc_t<D>;
  __shared__ A part[kThreads];
  const int64_t c = blockIdx.x;
  A s = 0;
  for (int64_t j = threadIdx.x; j < N * plane; j += blockDim.x) {
    const int64_t n = j / plane, i = j - n * plane;
    s += convert<A>(gy[(n * C + c) * plane + i]);
  }
  part[threadIdx.x] = s;
  __syncthreads();
  for (int step = kThreads / 2; step > 0; step /= 2) {
    if (int(threadIdx.x) < step) part[threadIdx.x] += part[threadIdx.x + step];
    __syncthreads();
  }
  if (threadIdx.x == 0) gb[c] = convert<D>(part[0]);
}

void launch_channel_bias(const Tensor& bias, const Tensor& out, bool accumulate, cudaStream_t stream,
                         const char* op) {
  const int64_t total = out.numel(), plane = out.size(2) * out.size(3), C = out.size(1);
  if (total == 0) return;
  dispatch_floating(out.dtype(), op, [&]<class T>() {
    using D = dev_t<T>;
    launch(add_channel_bias<D>, blocks_for(total), kThreads, 0, stream,
           static_cast<D*>(out.raw_data()), static_cast<const D*>(bias.raw_data()), total, plane, C, accumulate);
  });
  check_launch(op, out.device().index);
}

void bias_grad(const Tensor& grad_out, const Tensor& grad_bias, cudaStream_t stream, const char* op) {
  const int64_t N = grad_out.size(0), C = grad_out.size(1), plane = grad_out.size(2) * grad_out.size(3);
  if (C == 0) return;
  AG_CHECK(C <= std::numeric_limits<int>::max(), op, C, " channels are too many for one launch");
  dispatch_floating(grad_bias.dtype(), op, [&]<class T>() {
    using D = dev_t<T>;
    launch(channel_sums<D>, unsigned(C), kThreads, 0, stream,
           static_cast<const D*>(grad_out.raw_data()), static_cast<D*>(grad_bias.raw_data()), N, C, plane);
  });
  check_launch(op, grad_bias.device().index);
}

void zero(const Tensor& t, cudaStream_t stream, const char* op) {
  if (t.defined() && t.numel() > 0) AG_CUDA_CHECK(op, cudaMemsetAsync(t.raw_data(), 0, t.nbytes(), stream));
}

// ---- pooling kernels -------------------------------------------------------------------------

struct PoolArgs {
  int64_t H, W, OH, OW;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  bool include_pad;
};

PoolArgs pool_args(const Shape& in, const Shape& out, const Pool2dParams& p) {
  return {in[2],       in[3],       out[2],       out[3],       p.kernel[0],   p.kernel[1],
          p.stride[0], p.stride[1], p.padding[0], p.padding[1], p.dilation[0], p.dilation[1],
          p.count_include_pad};
}

// The taps [k0, k1) whose input position start + k * d lies in [0, n) (as the CPU's tap_range).
__device__ inline void tap_range(int64_t start, int64_t k, int64_t d, int64_t n, int64_t& k0, int64_t& k1) {
  k0 = start < 0 ? (-start + d - 1) / d : 0;
  k1 = start > n - 1 ? 0 : min(k, (n - 1 - start) / d + 1);
}

// One thread per output: the maximum over the window's taps inside the input, in
// row-major tap order; a larger value or a NaN takes over. A window of -inf routes to its
// first tap; one with no tap inside the input (dilation can skip over it) gives -inf and
// index -1, so that its gradient goes nowhere (as the CPU).
template <class D>
__global__ void max_pool_forward(const D* x, D* out, int64_t* idx, int64_t total, PoolArgs a) {
  using A = dacc_t<D>;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ow = o % a.OW, oh = (o / a.OW) % a.OH, pl = o / (a.OW * a.OH);
    const int64_t hs = oh * a.sh - a.ph, ws = ow * a.sw - a.pw;
    int64_t kh0, kh1, kw0, kw1;
    tap_range(hs, a.kh, a.dh, a.H, kh0, kh1);
    tap_range(ws, a.kw, a.dw, a.W, kw0, kw1);
    const D* xp = x + pl * a.H * a.W;
    A best = -std::numeric_limits<A>::infinity();
    int64_t bi = kh0 < kh1 && kw0 < kw1 ? (hs + kh0 * a.dh) * a.W + ws + kw0 * a.dw : -1;
    for (int64_t kh = kh0; kh < kh1; ++kh) {
      const int64_t ih = hs + kh * a.dh;
      for (int64_t kw = kw0; kw < kw1; ++kw) {
        const int64_t i = ih * a.W + ws + kw * a.dw;
        const A v = convert<A>(xp[i]);
        if (v > best || v != v) {
          best = v;
          bi = i;
        }
      }
    }
    out[o] = convert<D>(best);
    idx[o] = bi;
  }
}

// The first output index along one dim whose window's tap `k` reads input position i, or
// -1: o * s - pad + k * d == i.
__device__ inline int64_t output_of(int64_t i, int64_t k, int64_t s, int64_t pad, int64_t d, int64_t outs) {
  const int64_t t = i + pad - k * d;
  if (t < 0 || t % s != 0) return -1;
  const int64_t o = t / s;
  return o < outs ? o : -1;
}

// One thread per input element: the sum of the gradients of the outputs whose saved
// maximum it is, taken in the outputs' row-major order (the CPU's order).
template <class D>
__global__ void max_pool_backward(const D* gy, const int64_t* idx, D* gx, int64_t total, PoolArgs a) {
  using A = dacc_t<D>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t iw = i % a.W, ih = (i / a.W) % a.H, pl = i / (a.W * a.H);
    const int64_t self = ih * a.W + iw, base = pl * a.OH * a.OW;
    A s = 0;
    for (int64_t kh = a.kh - 1; kh >= 0; --kh) {
      const int64_t oh = output_of(ih, kh, a.sh, a.ph, a.dh, a.OH);
      if (oh < 0) continue;
      for (int64_t kw = a.kw - 1; kw >= 0; --kw) {
        const int64_t ow = output_of(iw, kw, a.sw, a.pw, a.dw, a.OW);
        if (ow < 0) continue;
        const int64_t o = base + oh * a.OW + ow;
        if (idx[o] == self) s += convert<A>(gy[o]);
      }
    }
    gx[i] = convert<D>(s);
  }
}

// PyTorch's average window (the CPU's avg_window): [h0, h1) x [w0, w1) clipped to the
// input, and the divisor, which with count_include_pad counts the padding but not the
// overhang that ceil_mode adds.
struct AvgWindow {
  int64_t h0, h1, w0, w1, divisor;
};
__device__ inline AvgWindow avg_window(int64_t oh, int64_t ow, const PoolArgs& a) {
  int64_t h0 = oh * a.sh - a.ph, w0 = ow * a.sw - a.pw;
  int64_t h1 = min(h0 + a.kh, a.H + a.ph), w1 = min(w0 + a.kw, a.W + a.pw);
  const int64_t padded = (h1 - h0) * (w1 - w0);
  h0 = max(h0, int64_t(0));
  w0 = max(w0, int64_t(0));
  h1 = min(h1, a.H);
  w1 = min(w1, a.W);
  const int64_t inside = max(h1 - h0, int64_t(0)) * max(w1 - w0, int64_t(0));
  return {h0, h1, w0, w1, a.include_pad ? padded : inside};
}

template <class D>
__global__ void avg_pool_forward(const D* x, D* out, int64_t total, PoolArgs a) {
  using A = dacc_t<D>;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ow = o % a.OW, oh = (o / a.OW) % a.OH, pl = o / (a.OW * a.OH);
    const AvgWindow wd = avg_window(oh, ow, a);
    const D* xp = x + pl * a.H * a.W;
    A s = 0;
    for (int64_t ih = wd.h0; ih < wd.h1; ++ih)
      for (int64_t iw = wd.w0; iw < wd.w1; ++iw) s += convert<A>(xp[ih * a.W + iw]);
    out[o] = wd.divisor > 0 ? convert<D>(s / A(wd.divisor)) : convert<D>(A(0));
  }
}

// One thread per input element: the sum of grad / divisor over the windows that read it,
// in the outputs' row-major order (the CPU's order).
template <class D>
__global__ void avg_pool_backward(const D* gy, D* gx, int64_t total, PoolArgs a) {
  using A = dacc_t<D>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t iw = i % a.W, ih = (i / a.W) % a.H, pl = i / (a.W * a.H);
    const D* g = gy + pl * a.OH * a.OW;
    A s = 0;
    for (int64_t kh = a.kh - 1; kh >= 0; --kh) {
      const int64_t oh = output_of(ih, kh, a.sh, a.ph, 1, a.OH);
      if (oh < 0) continue;
      for (int64_t kw = a.kw - 1; kw >= 0; --kw) {
        const int64_t ow = output_of(iw, kw, a.sw, a.pw, 1, a.OW);
        if (ow < 0) continue;
        const AvgWindow wd = avg_window(oh, ow, a);
        if (wd.divisor <= 0 || ih < wd.h0 || ih >= wd.h1 || iw < wd.w0 || iw >= wd.w1) continue;
        s += convert<A>(g[oh * a.OW + ow]) / A(wd.divisor);
      }
    }
    gx[i] = convert<D>(s);
  }
}

// Runs launch.template operator()<D>(blocks, stream) for the floating dtype dt.
template <class F>
void launch_floating(DType dt, int64_t total, const Device& device, const char* op, const F& launch) {
  if (total == 0) return;
  DeviceGuard guard(device.index, op);
  const cudaStream_t stream = stream_of(device);
  dispatch_floating(dt, op, [&]<class T>() { launch.template operator()<dev_t<T>>(blocks_for(total), stream); });
  check_launch(op, device.index);
}

}  // namespace

// ---- convolution ------------------------------------------------------------------------------

void CudaBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                         const Conv2dParams& p) {
  const char* op = ampgrad::op::conv2d;
  if (out.numel() == 0) return;
  const int device = out.device().index;
  DeviceGuard guard(device, op);
  const cudaStream_t stream = stream_of(out.device());
  (void)dnn_types(out.dtype(), op);
  if (x.numel() == 0 || w.numel() == 0) {  // a sum over no input: zeros, plus the bias
    if (bias.defined()) launch_channel_bias(bias, out, false, stream, op);
    else zero(out, stream, op);
    return;
  }
  const cudnnHandle_t h = dnn_handle(device, stream, op);
  const ConvPlan& c = get_plan(Kind::Forward, x.sizes(), w.sizes(), out.sizes(), p, out.dtype(), device, h, op);
  const Tensor ws = workspace_for(c.workspace, out.device());
  const Scales s(out.dtype());
  AG_CUDA_CHECK(op, cudnnConvolutionForward(h, s.one(), c.x, x.raw_data(), c.w, w.raw_data(), c.conv,
                                            cudnnConvolutionFwdAlgo_t(c.algo), data_or_null(ws), c.workspace,
                                            s.zero(), c.y, out.raw_data()));
  if (bias.defined()) launch_channel_bias(bias, out, true, stream, op);
}

void CudaBackend::conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Tensor& grad_in,
                                        const Conv2dParams& p) {
  const char* op = ampgrad::op::conv2d;
  if (grad_in.numel() == 0) return;
  const int device = grad_in.device().index;
  DeviceGuard guard(device, op);
  const cudaStream_t stream = stream_of(grad_in.device());
  (void)dnn_types(grad_in.dtype(), op);
  if (grad_out.numel() == 0 || w.numel() == 0) return zero(grad_in, stream, op);
  const cudnnHandle_t h = dnn_handle(device, stream, op);
  const ConvPlan& c =
      get_plan(Kind::BackwardData, grad_in.sizes(), w.sizes(), grad_out.sizes(), p, grad_in.dtype(), device, h, op);
  const Tensor ws = workspace_for(c.workspace, grad_in.device());
  const Scales s(grad_in.dtype());
  AG_CUDA_CHECK(op, cudnnConvolutionBackwardData(h, s.one(), c.w, w.raw_data(), c.y, grad_out.raw_data(), c.conv,
                                                 cudnnConvolutionBwdDataAlgo_t(c.algo), data_or_null(ws),
                                                 c.workspace, s.zero(), c.x, grad_in.raw_data()));
}

void CudaBackend::conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Tensor& grad_w,
                                         const Tensor& grad_bias, const Conv2dParams& p) {
  const char* op = ampgrad::op::conv2d;
  const int device = grad_out.device().index;
  DeviceGuard guard(device, op);
  const cudaStream_t stream = stream_of(grad_out.device());
  if (grad_bias.defined()) bias_grad(grad_out, grad_bias, stream, op);
  if (!grad_w.defined() || grad_w.numel() == 0) return;
  (void)dnn_types(grad_w.dtype(), op);
  if (grad_out.numel() == 0 || x.numel() == 0) return zero(grad_w, stream, op);
  const cudnnHandle_t h = dnn_handle(device, stream, op);
  const ConvPlan& c =
      get_plan(Kind::BackwardFilter, x.sizes(), grad_w.sizes(), grad_out.sizes(), p, grad_w.dtype(), device, h, op);
  const Tensor ws = workspace_for(c.workspace, grad_w.device());
  const Scales s(grad_w.dtype());
  AG_CUDA_CHECK(op, cudnnConvolutionBackwardFilter(h, s.one(), c.x, x.raw_data(), c.y, grad_out.raw_data(), c.conv,
                                                   cudnnConvolutionBwdFilterAlgo_t(c.algo), data_or_null(ws),
                                                   c.workspace, s.zero(), c.w, grad_w.raw_data()));
}

// ---- pooling -----------------------------------------------------------------------------------

Tensor CudaBackend::max_pool2d(const Tensor& x, const Tensor& out, const Pool2dParams& p) {
  Tensor idx = empty(out.sizes().vec(), TensorOptions().dtype(kInt64).device(out.device()));
  const PoolArgs a = pool_args(x.sizes(), out.sizes(), p);
  const int64_t total = out.numel();
  launch_floating(x.dtype(), total, out.device(), op::max_pool2d, [&]<class D>(unsigned blocks, cudaStream_t stream) {
    launch(max_pool_forward<D>, blocks, kThreads, 0, stream,
           static_cast<const D*>(x.raw_data()), static_cast<D*>(out.raw_data()), idx.data_ptr<int64_t>(), total, a);
  });
  return idx;
}

void CudaBackend::max_pool2d_backward(const Tensor& grad_out, const Tensor&, const Tensor& saved,
                                      const Tensor& grad_in, const Pool2dParams& p) {
  AG_CHECK(saved.defined() && saved.dtype() == kInt64 && saved.numel() == grad_out.numel(), op::max_pool2d,
           "internal: the backward expects the int64 indices of the cuda forward");
  const PoolArgs a = pool_args(grad_in.sizes(), grad_out.sizes(), p);
  const int64_t total = grad_in.numel();
  launch_floating(grad_in.dtype(), total, grad_in.device(), op::max_pool2d,
                  [&]<class D>(unsigned blocks, cudaStream_t stream) {
                    launch(max_pool_backward<D>, blocks, kThreads, 0, stream,
                           static_cast<const D*>(grad_out.raw_data()), saved.data_ptr<int64_t>(),
                           static_cast<D*>(grad_in.raw_data()), total, a);
                  });
}

void CudaBackend::avg_pool2d(const Tensor& x, const Tensor& out, const Pool2dParams& p) {
  const PoolArgs a = pool_args(x.sizes(), out.sizes(), p);
  const int64_t total = out.numel();
  launch_floating(x.dtype(), total, out.device(), op::avg_pool2d, [&]<class D>(unsigned blocks, cudaStream_t stream) {
    launch(avg_pool_forward<D>, blocks, kThreads, 0, stream,
           static_cast<const D*>(x.raw_data()), static_cast<D*>(out.raw_data()), total, a);
  });
}

void CudaBackend::avg_pool2d_backward(const Tensor& grad_out, const Tensor& grad_in, const Pool2dParams& p) {
  const PoolArgs a = pool_args(grad_in.sizes(), grad_out.sizes(), p);
  const int64_t total = grad_in.numel();
  launch_floating(grad_in.dtype(), total, grad_in.device(), op::avg_pool2d,
                  [&]<class D>(unsigned blocks, cudaStream_t stream) {
                    launch(avg_pool_backward<D>, blocks, kThreads, 0, stream,
                           static_cast<const D*>(grad_out.raw_data()), static_cast<D*>(grad_in.raw_data()), total, a);
                  });
}

}  // namespace ampgrad::cuda
