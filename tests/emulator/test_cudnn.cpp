// The emulated cuDNN (kernels/cuda/emulator) against a float64 convolution written here:
// one walk over every (output, filter tap) pair that reads an input element defines the
// forward (gather into the output), backward-data (scatter into the input) and
// backward-filter (scatter into the taps) references, with padding, stride, dilation and
// groups as NVIDIA's API reference defines them.
#include <cudnn.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "emulator/library_test.h"
#include "support/testing.h"

namespace {

using ag::Tensor;

// ---- descriptors, released at scope exit ------------------------------------------------------
struct Dnn {
  cudnnHandle_t h = nullptr;
  Dnn() {
    EXPECT_EQ(cudnnCreate(&h), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetStream(h, nullptr), CUDNN_STATUS_SUCCESS);
  }
  ~Dnn() { cudnnDestroy(h); }
};
struct TensorDesc {
  cudnnTensorDescriptor_t h = nullptr;
  TensorDesc() { EXPECT_EQ(cudnnCreateTensorDescriptor(&h), CUDNN_STATUS_SUCCESS); }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(h); }
};
struct FilterDesc {
  cudnnFilterDescriptor_t h = nullptr;
  FilterDesc() { EXPECT_EQ(cudnnCreateFilterDescriptor(&h), CUDNN_STATUS_SUCCESS); }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(h); }
};
struct ConvDesc {
  cudnnConvolutionDescriptor_t h = nullptr;
  ConvDesc() { EXPECT_EQ(cudnnCreateConvolutionDescriptor(&h), CUDNN_STATUS_SUCCESS); }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(h); }
};

cudnnDataType_t dnn_type(ag::DType dt) {
  switch (dt) {
    case ag::kFloat64: return CUDNN_DATA_DOUBLE;
    case ag::kFloat16: return CUDNN_DATA_HALF;
    case ag::kBFloat16: return CUDNN_DATA_BFLOAT16;
    default: return CUDNN_DATA_FLOAT;
  }
}

// ---- the problem and its float64 reference --------------------------------------------------------

// x [N, C, H, W], w [K, C / G, R, S], y [N, K, P, Q]; padding, strides (u vertical, v
// horizontal) and dilations per dim.
struct Case {
  int64_t N, C, H, W, K, R, S, G;
  int64_t pad_h, pad_w, u, v, dil_h, dil_w;
  int64_t P() const { return (H + 2 * pad_h - (dil_h * (R - 1) + 1)) / u + 1; }
  int64_t Q() const { return (W + 2 * pad_w - (dil_w * (S - 1) + 1)) / v + 1; }
  int64_t Cg() const { return C / G; }
};

// Shapes whose height and width differ in every parameter, a plain one, and a depthwise one.
const Case kCases[] = {
    {2, 4, 7, 6, 6, 3, 2, 2, 1, 2, 2, 1, 1, 2},
    {1, 3, 5, 5, 2, 3, 3, 1, 0, 0, 1, 1, 1, 1},
    {2, 4, 6, 5, 4, 2, 3, 4, 0, 1, 1, 2, 2, 1},
};

// Calls f(x index, w index, y index) for every output element and every filter tap whose
// input position lies inside x (contiguous NCHW / KCRS / NKPQ); `flip` applies the filter
// reversed (CUDNN_CONVOLUTION).
void each_product(const Case& c, bool flip, const std::function<void(int64_t, int64_t, int64_t)>& f) {
  const int64_t P = c.P(), Q = c.Q(), Cg = c.Cg(), Kg = c.K / c.G;
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t k = 0; k < c.K; ++k)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q)
          for (int64_t ci = 0; ci < Cg; ++ci)
            for (int64_t r = 0; r < c.R; ++r)
              for (int64_t s = 0; s < c.S; ++s) {
                const int64_t h = p * c.u - c.pad_h + r * c.dil_h, w = q * c.v - c.pad_w + s * c.dil_w;
                if (h < 0 || h >= c.H || w < 0 || w >= c.W) continue;
                const int64_t channel = (k / Kg) * Cg + ci;
                const int64_t rr = flip ? c.R - 1 - r : r, ss = flip ? c.S - 1 - s : s;
                f(((n * c.C + channel) * c.H + h) * c.W + w, ((k * Cg + ci) * c.R + rr) * c.S + ss,
                  ((n * c.K + k) * P + p) * Q + q);
              }
}

enum class Dir { Forward, BackwardData, BackwardFilter };

// The operands of one call, random, in `dt`; `out` is what the call writes.
struct Data {
  Tensor x, w, y;
  Tensor& out(Dir d) { return d == Dir::Forward ? y : d == Dir::BackwardData ? x : w; }
};
Data data(const Case& c, ag::DType dt) {
  return {agt::randf({c.N, c.C, c.H, c.W}, dt), agt::randf({c.K, c.Cg(), c.R, c.S}, dt),
          agt::randf({c.N, c.K, c.P(), c.Q()}, dt)};
}

// alpha * (the direction's sums over the products, from the float64 values of the
// operands, each rounded by `round`) + beta * out_before.
Tensor reference(const Case& c, Dir d, const Data& in, const Tensor& out_before, double alpha, double beta,
                 bool flip = false, const std::function<double(double)>& round = {}) {
  const Tensor x = in.x.to(ag::kFloat64), w = in.w.to(ag::kFloat64), y = in.y.to(ag::kFloat64);
  auto val = [&](const Tensor& t, int64_t i) {
    return round ? round(t.data_ptr<double>()[i]) : t.data_ptr<double>()[i];
  };
  Tensor sums = ag::zeros(out_before.sizes().vec(), ag::kFloat64);
  double* s = sums.data_ptr<double>();
  each_product(c, flip, [&](int64_t xi, int64_t wi, int64_t yi) {
    if (d == Dir::Forward) s[yi] += val(x, xi) * val(w, wi);
    if (d == Dir::BackwardData) s[xi] += val(y, yi) * val(w, wi);
    if (d == Dir::BackwardFilter) s[wi] += val(y, yi) * val(x, xi);
  });
  const Tensor before = out_before.to(ag::kFloat64);
  for (int64_t i = 0; i < sums.numel(); ++i)
    s[i] = alpha * s[i] + (beta != 0 ? beta * before.data_ptr<double>()[i] : 0);
  return sums;
}

// The number of products in one output's sum, for float32's tolerance.
int64_t terms(const Case& c, Dir d) {
  if (d == Dir::Forward) return c.Cg() * c.R * c.S;
  if (d == Dir::BackwardData) return (c.K / c.G) * c.R * c.S;
  return c.N * c.P() * c.Q();
}
agt::Tol tol(ag::DType dt, int64_t n) { return dt == ag::kFloat32 ? agt::fp32_tol(n) : agt::tol_for(dt); }

// ---- one call -----------------------------------------------------------------------------------------
struct ConvOptions {
  cudnnMathType_t math = CUDNN_FMA_MATH;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  double alpha = 1, beta = 0;
};

// Describes the case as conv.cu does (NCHW tensors, KCRS filter, the group count and math
// type on the convolution), asks the _v7 query for an algorithm and the workspace query for
// its size, and runs the direction. Returns the first status that is not SUCCESS.
cudnnStatus_t run(const Case& c, Dir d, Data& io, const ConvOptions& set) {
  const ag::DType dt = io.x.dtype();
  const cudnnDataType_t t = dnn_type(dt), compute = dt == ag::kFloat64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  Dnn dnn;
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  EXPECT_EQ(cudnnSetTensor4dDescriptor(x.h, CUDNN_TENSOR_NCHW, t, int(c.N), int(c.C), int(c.H), int(c.W)),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnSetTensor4dDescriptor(y.h, CUDNN_TENSOR_NCHW, t, int(c.N), int(c.K), int(c.P()), int(c.Q())),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnSetFilter4dDescriptor(w.h, t, CUDNN_TENSOR_NCHW, int(c.K), int(c.Cg()), int(c.R), int(c.S)),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnSetConvolution2dDescriptor(conv.h, int(c.pad_h), int(c.pad_w), int(c.u), int(c.v), int(c.dil_h),
                                            int(c.dil_w), set.mode, compute),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnSetConvolutionGroupCount(conv.h, int(c.G)), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnSetConvolutionMathType(conv.h, set.math), CUDNN_STATUS_SUCCESS);

  const float af = float(set.alpha), bf = float(set.beta);
  const double ad = set.alpha, bd = set.beta;
  const void* alpha = dt == ag::kFloat64 ? static_cast<const void*>(&ad) : &af;
  const void* beta = dt == ag::kFloat64 ? static_cast<const void*>(&bd) : &bf;
  int found = 0;
  size_t bytes = 0;
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  std::vector<unsigned char> ws;
  switch (d) {
    case Dir::Forward: {
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      st = cudnnGetConvolutionForwardAlgorithm_v7(dnn.h, x.h, w.h, conv.h, y.h, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                  &found, perf);
      if (st || (st = perf[0].status)) return st;
      if ((st = cudnnGetConvolutionForwardWorkspaceSize(dnn.h, x.h, w.h, conv.h, y.h, perf[0].algo, &bytes))) return st;
      EXPECT_EQ(bytes, perf[0].memory);
      ws.resize(bytes);
      st = cudnnConvolutionForward(dnn.h, alpha, x.h, io.x.raw_data(), w.h, io.w.raw_data(), conv.h, perf[0].algo,
                                   ws.data(), bytes, beta, y.h, io.y.raw_data());
      break;
    }
    case Dir::BackwardData: {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      st = cudnnGetConvolutionBackwardDataAlgorithm_v7(dnn.h, w.h, y.h, conv.h, x.h,
                                                       CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &found, perf);
      if (st || (st = perf[0].status)) return st;
      if ((st = cudnnGetConvolutionBackwardDataWorkspaceSize(dnn.h, w.h, y.h, conv.h, x.h, perf[0].algo, &bytes)))
        return st;
      EXPECT_EQ(bytes, perf[0].memory);
      ws.resize(bytes);
      st = cudnnConvolutionBackwardData(dnn.h, alpha, w.h, io.w.raw_data(), y.h, io.y.raw_data(), conv.h, perf[0].algo,
                                        ws.data(), bytes, beta, x.h, io.x.raw_data());
      break;
    }
    case Dir::BackwardFilter: {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      st = cudnnGetConvolutionBackwardFilterAlgorithm_v7(dnn.h, x.h, y.h, conv.h, w.h,
                                                         CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &found, perf);
      if (st || (st = perf[0].status)) return st;
      if ((st = cudnnGetConvolutionBackwardFilterWorkspaceSize(dnn.h, x.h, y.h, conv.h, w.h, perf[0].algo, &bytes)))
        return st;
      EXPECT_EQ(bytes, perf[0].memory);
      ws.resize(bytes);
      st = cudnnConvolutionBackwardFilter(dnn.h, alpha, x.h, io.x.raw_data(), y.h, io.y.raw_data(), conv.h,
                                          perf[0].algo, ws.data(), bytes, beta, w.h, io.w.raw_data());
      break;
    }
  }
  EXPECT_EQ(found, 1);
  wait_for(nullptr);
  return st;
}

const char* dir_name(Dir d) {
  return d == Dir::Forward ? "forward" : d == Dir::BackwardData ? "backward-data" : "backward-filter";
}

// The 16-bit dtypes with tensor-op math and float32 without TF32 (FMA), as conv.cu asks.
cudnnMathType_t exact_math(ag::DType dt) {
  return dt == ag::kFloat16 || dt == ag::kBFloat16 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
}

// ---- the three directions ------------------------------------------------------------------------------

TEST(CudnnEmu, EveryDirectionEveryDtypeWithPaddingStrideDilationGroups) {
  for (const Dir d : {Dir::Forward, Dir::BackwardData, Dir::BackwardFilter})
    for (const ag::DType dt : {ag::kFloat32, ag::kFloat64, ag::kFloat16, ag::kBFloat16})
      for (const Case& c : kCases) {
        SCOPED_TRACE(std::string(dir_name(d)) + " " + ag::dtype_name(dt) + " groups " + std::to_string(c.G));
        Data io = data(c, dt);
        const Tensor before = io.out(d).clone();
        ConvOptions set;
        set.math = exact_math(dt);
        ASSERT_EQ(run(c, d, io, set), CUDNN_STATUS_SUCCESS);
        EXPECT_TRUE(agt::allclose(io.out(d), reference(c, d, io, before, 1, 0), tol(dt, terms(c, d))));
      }
}

TEST(CudnnEmu, AlphaScalesAndBetaBlendsTheExistingOutput) {
  const Case& c = kCases[0];
  for (const Dir d : {Dir::Forward, Dir::BackwardData, Dir::BackwardFilter})
    for (const ag::DType dt : {ag::kFloat32, ag::kFloat64, ag::kFloat16, ag::kBFloat16}) {
      SCOPED_TRACE(std::string(dir_name(d)) + " " + ag::dtype_name(dt));
      Data io = data(c, dt);
      const Tensor before = io.out(d).clone();
      ConvOptions set;
      set.math = exact_math(dt);
      set.alpha = 0.5, set.beta = -1.5;
      ASSERT_EQ(run(c, d, io, set), CUDNN_STATUS_SUCCESS);
      EXPECT_TRUE(agt::allclose(io.out(d), reference(c, d, io, before, 0.5, -1.5), tol(dt, terms(c, d) + 1)));
    }
}

TEST(CudnnEmu, BetaZeroDoesNotReadTheOutput) {
  const Case& c = kCases[1];
  for (const Dir d : {Dir::Forward, Dir::BackwardData, Dir::BackwardFilter}) {
    SCOPED_TRACE(dir_name(d));
    Data io = data(c, ag::kFloat32);
    io.out(d) = ag::full(io.out(d).sizes().vec(), std::numeric_limits<double>::quiet_NaN(), ag::kFloat32);
    ASSERT_EQ(run(c, d, io, ConvOptions{}), CUDNN_STATUS_SUCCESS);
    const Tensor zeros = ag::zeros(io.out(d).sizes().vec(), ag::kFloat32);
    EXPECT_TRUE(agt::allclose(io.out(d), reference(c, d, io, zeros, 1, 0), tol(ag::kFloat32, terms(c, d))));
  }
}

TEST(CudnnEmu, ConvolutionModeAppliesTheFilterReversed) {
  const Case& c = kCases[0];
  for (const Dir d : {Dir::Forward, Dir::BackwardData, Dir::BackwardFilter}) {
    SCOPED_TRACE(dir_name(d));
    Data io = data(c, ag::kFloat64);
    const Tensor before = io.out(d).clone();
    ConvOptions set;
    set.mode = CUDNN_CONVOLUTION;
    ASSERT_EQ(run(c, d, io, set), CUDNN_STATUS_SUCCESS);
    EXPECT_TRUE(agt::allclose(io.out(d), reference(c, d, io, before, 1, 0, true), agt::tol_for(ag::kFloat64)));
    EXPECT_FALSE(agt::allclose(io.out(d), reference(c, d, io, before, 1, 0, false), agt::tol_for(ag::kFloat64)));
  }
}

// ---- precision ---------------------------------------------------------------------------------------

// x rounded to 11 significant bits, to nearest with ties away from zero (TF32, by frexp
// and std::round).
double tf32(double x) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = 0;
  const double m = std::frexp(x, &e);
  return std::ldexp(std::round(std::ldexp(m, 11)), e - 11);
}

// The 1 x 1 convolution of one float32 value by a filter of 1.
float one_tap(float x, cudnnMathType_t math) {
  const Case c{1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1};
  Data io = data(c, ag::kFloat32);
  io.x.data_ptr<float>()[0] = x;
  io.w.data_ptr<float>()[0] = 1;
  ConvOptions set;
  set.math = math;
  EXPECT_EQ(run(c, Dir::Forward, io, set), CUDNN_STATUS_SUCCESS);
  return io.y.data_ptr<float>()[0];
}

TEST(CudnnEmu, Float32MathTypes) {
  // 1 + 2^-11: exact in float32; a tie for TF32 (to 1 + 2^-10, away from zero) and for
  // float16 (to 1, even).
  const float x = 1.0f + 0x1p-11f;
  EXPECT_EQ(one_tap(x, CUDNN_FMA_MATH), x);
  EXPECT_EQ(one_tap(x, CUDNN_DEFAULT_MATH), 1.0f + 0x1p-10f);
  EXPECT_EQ(one_tap(x, CUDNN_TENSOR_OP_MATH), 1.0f + 0x1p-10f);
  EXPECT_EQ(one_tap(x, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION), 1.0f);
  // Random data under the default math: the sums of TF32-rounded products, in float.
  const Case& c = kCases[0];
  for (const Dir d : {Dir::Forward, Dir::BackwardData, Dir::BackwardFilter}) {
    SCOPED_TRACE(dir_name(d));
    Data io = data(c, ag::kFloat32);
    const Tensor before = io.out(d).clone();
    ConvOptions set;
    set.math = CUDNN_DEFAULT_MATH;
    ASSERT_EQ(run(c, d, io, set), CUDNN_STATUS_SUCCESS);
    EXPECT_TRUE(
        agt::allclose(io.out(d), reference(c, d, io, before, 1, 0, false, tf32), tol(ag::kFloat32, terms(c, d))));
    EXPECT_FALSE(agt::allclose(io.out(d), reference(c, d, io, before, 1, 0), tol(ag::kFloat32, terms(c, d))));
  }
}

TEST(CudnnEmu, SixteenBitDataAccumulatesInFloat32) {
  // 1 + u + u (u half of the format's unit at 1): summed in float32 it is 1 + 2u, which the
  // format holds; summed in the format it stays 1 (each step a tie, to even).
  const Case c{1, 3, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1};
  for (const ag::DType dt : {ag::kFloat16, ag::kBFloat16}) {
    SCOPED_TRACE(ag::dtype_name(dt));
    const double u = dt == ag::kFloat16 ? 0x1p-11 : 0x1p-8;
    for (const cudnnMathType_t math : {CUDNN_DEFAULT_MATH, CUDNN_TENSOR_OP_MATH, CUDNN_FMA_MATH}) {
      Data io = data(c, dt);
      io.x = ag::from_vector(std::vector<double>{1, u, u}, {1, 3, 1, 1}).to(dt);
      io.w = ag::ones({1, 3, 1, 1}, dt);
      ConvOptions set;
      set.math = math;
      ASSERT_EQ(run(c, Dir::Forward, io, set), CUDNN_STATUS_SUCCESS);
      EXPECT_EQ(io.y.to(ag::kFloat64).data_ptr<double>()[0], 1 + 2 * u) << "math " << math;
    }
  }
}

// ---- descriptors -------------------------------------------------------------------------------------

TEST(CudnnEmu, StridedTensorsAndNhwcFilters) {
  // x with gaps between rows and images (SetTensor4dDescriptorEx), the filter KRSC.
  const Case c = kCases[0];
  const int64_t hs = c.W + 3, cs = c.H * hs + 1, ns = c.C * cs + 5;
  const Tensor xs = agt::randf({c.N * ns}, ag::kFloat32);
  const Tensor wk = agt::randf({c.K, c.R, c.S, c.Cg()}, ag::kFloat32);
  Data packed = data(c, ag::kFloat32);  // x and w in NCHW / KCRS, for the reference
  {
    const float* s = xs.data_ptr<float>();
    float* x = packed.x.data_ptr<float>();
    for (int64_t n = 0; n < c.N; ++n)
      for (int64_t ch = 0; ch < c.C; ++ch)
        for (int64_t h = 0; h < c.H; ++h)
          for (int64_t w = 0; w < c.W; ++w) x[((n * c.C + ch) * c.H + h) * c.W + w] = s[n * ns + ch * cs + h * hs + w];
    packed.w = wk.permute({0, 3, 1, 2}).contiguous();
  }
  const Tensor before = packed.y.clone();
  Dnn dnn;
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  ASSERT_EQ(cudnnSetTensor4dDescriptorEx(x.h, CUDNN_DATA_FLOAT, int(c.N), int(c.C), int(c.H), int(c.W), int(ns),
                                         int(cs), int(hs), 1),
            CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(
      cudnnSetFilter4dDescriptor(w.h, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, int(c.K), int(c.Cg()), int(c.R), int(c.S)),
      CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetConvolution2dDescriptor(conv.h, int(c.pad_h), int(c.pad_w), int(c.u), int(c.v), int(c.dil_h),
                                            int(c.dil_w), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
            CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetConvolutionGroupCount(conv.h, int(c.G)), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetConvolutionMathType(conv.h, CUDNN_FMA_MATH), CUDNN_STATUS_SUCCESS);
  int n = 0, k = 0, p = 0, q = 0;
  ASSERT_EQ(cudnnGetConvolution2dForwardOutputDim(conv.h, x.h, w.h, &n, &k, &p, &q), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(std::vector<int64_t>({n, k, p, q}), std::vector<int64_t>({c.N, c.K, c.P(), c.Q()}));
  ASSERT_EQ(cudnnSetTensor4dDescriptor(y.h, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, k, p, q), CUDNN_STATUS_SUCCESS);
  size_t bytes = 0;
  ASSERT_EQ(cudnnGetConvolutionForwardWorkspaceSize(dnn.h, x.h, w.h, conv.h, y.h,
                                                    CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, &bytes),
            CUDNN_STATUS_SUCCESS);
  std::vector<unsigned char> ws(bytes);
  const float one = 1, zero = 0;
  Tensor out = ag::zeros({c.N, c.K, c.P(), c.Q()}, ag::kFloat32);
  ASSERT_EQ(
      cudnnConvolutionForward(dnn.h, &one, x.h, xs.raw_data(), w.h, wk.raw_data(), conv.h,
                              CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, ws.data(), bytes, &zero, y.h, out.raw_data()),
      CUDNN_STATUS_SUCCESS);
  wait_for(nullptr);
  EXPECT_TRUE(
      agt::allclose(out, reference(c, Dir::Forward, packed, before, 1, 0), tol(ag::kFloat32, terms(c, Dir::Forward))));

  cudnnDataType_t t{};
  int d[8] = {};
  ASSERT_EQ(cudnnGetTensor4dDescriptor(x.h, &t, &d[0], &d[1], &d[2], &d[3], &d[4], &d[5], &d[6], &d[7]),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(std::vector<int>(d, d + 8),
            std::vector<int>({int(c.N), int(c.C), int(c.H), int(c.W), int(ns), int(cs), int(hs), 1}));
}

// ---- algorithms, workspaces and refusals ----------------------------------------------------------------

// Descriptors for `c` in float32 that a test then spoils.
struct Described {
  Dnn dnn;
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  explicit Described(const Case& c, cudnnDataType_t t = CUDNN_DATA_FLOAT, cudnnDataType_t compute = CUDNN_DATA_FLOAT) {
    EXPECT_EQ(cudnnSetTensor4dDescriptor(x.h, CUDNN_TENSOR_NCHW, t, int(c.N), int(c.C), int(c.H), int(c.W)),
              CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetTensor4dDescriptor(y.h, CUDNN_TENSOR_NCHW, t, int(c.N), int(c.K), int(c.P()), int(c.Q())),
              CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetFilter4dDescriptor(w.h, t, CUDNN_TENSOR_NCHW, int(c.K), int(c.Cg()), int(c.R), int(c.S)),
              CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetConvolution2dDescriptor(conv.h, int(c.pad_h), int(c.pad_w), int(c.u), int(c.v), int(c.dil_h),
                                              int(c.dil_w), CUDNN_CROSS_CORRELATION, compute),
              CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetConvolutionGroupCount(conv.h, int(c.G)), CUDNN_STATUS_SUCCESS);
  }
  // The status of the forward query's one result (or of the query itself when it fails).
  cudnnStatus_t forward_status() {
    cudnnConvolutionFwdAlgoPerf_t perf[8];
    int found = 0;
    const cudnnStatus_t st = cudnnGetConvolutionForwardAlgorithm_v7(dnn.h, x.h, w.h, conv.h, y.h, 8, &found, perf);
    return st != CUDNN_STATUS_SUCCESS ? st : perf[0].status;
  }
  cudnnStatus_t backward_data_status() {
    cudnnConvolutionBwdDataAlgoPerf_t perf[6];
    int found = 0;
    const cudnnStatus_t st = cudnnGetConvolutionBackwardDataAlgorithm_v7(dnn.h, w.h, y.h, conv.h, x.h, 6, &found, perf);
    return st != CUDNN_STATUS_SUCCESS ? st : perf[0].status;
  }
};

TEST(CudnnEmu, AlgorithmQueriesOfferOneAlgorithmAndItsWorkspace) {
  const Case& c = kCases[0];
  Described s(c);
  ASSERT_EQ(cudnnSetConvolutionMathType(s.conv.h, CUDNN_TENSOR_OP_MATH), CUDNN_STATUS_SUCCESS);
  int count = 0;
  EXPECT_EQ(cudnnGetConvolutionForwardAlgorithmMaxCount(s.dnn.h, &count), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(count, CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
  EXPECT_EQ(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(s.dnn.h, &count), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(count, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
  EXPECT_EQ(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(s.dnn.h, &count), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(count, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);

  cudnnConvolutionBwdFilterAlgoPerf_t perf[7];
  int found = -1;
  ASSERT_EQ(cudnnGetConvolutionBackwardFilterAlgorithm_v7(s.dnn.h, s.x.h, s.y.h, s.conv.h, s.w.h, 7, &found, perf),
            CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(found, 1);
  EXPECT_EQ(perf[0].status, CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(perf[0].mathType, CUDNN_TENSOR_OP_MATH);  // the math it was ranked for: the descriptor's
  EXPECT_EQ(perf[0].determinism, CUDNN_DETERMINISTIC);
  size_t bytes = 0;
  ASSERT_EQ(
      cudnnGetConvolutionBackwardFilterWorkspaceSize(s.dnn.h, s.x.h, s.y.h, s.conv.h, s.w.h, perf[0].algo, &bytes),
      CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(bytes, perf[0].memory);
  EXPECT_GT(bytes, 0u);
  EXPECT_EQ(cudnnGetConvolutionForwardAlgorithm_v7(s.dnn.h, s.x.h, s.w.h, s.conv.h, s.y.h, 0, &found, nullptr),
            CUDNN_STATUS_BAD_PARAM);

  // A workspace smaller than the algorithm's; an algorithm cuDNN never implemented; no
  // such algorithm.
  std::vector<float> x(size_t(c.N * c.C * c.H * c.W)), w(size_t(c.K * c.Cg() * c.R * c.S)),
      y(size_t(c.N * c.K * c.P() * c.Q()));
  std::vector<unsigned char> ws(bytes);
  const float one = 1, zero = 0;
  EXPECT_EQ(cudnnConvolutionBackwardFilter(s.dnn.h, &one, s.x.h, x.data(), s.y.h, y.data(), s.conv.h, perf[0].algo,
                                           ws.data(), bytes - 1, &zero, s.w.h, w.data()),
            CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnConvolutionBackwardFilter(s.dnn.h, &one, s.x.h, x.data(), s.y.h, y.data(), s.conv.h,
                                           CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD, ws.data(), bytes, &zero, s.w.h,
                                           w.data()),
            CUDNN_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cudnnConvolutionForward(s.dnn.h, &one, s.x.h, x.data(), s.w.h, w.data(), s.conv.h,
                                    CUDNN_CONVOLUTION_FWD_ALGO_DIRECT, ws.data(), bytes, &zero, s.y.h, y.data()),
            CUDNN_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cudnnConvolutionForward(s.dnn.h, &one, s.x.h, x.data(), s.w.h, w.data(), s.conv.h,
                                    cudnnConvolutionFwdAlgo_t(CUDNN_CONVOLUTION_FWD_ALGO_COUNT), ws.data(), bytes,
                                    &zero, s.y.h, y.data()),
            CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(
      cudnnConvolutionForward(s.dnn.h, &one, s.x.h, x.data(), s.w.h, w.data(), s.conv.h,
                              CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, ws.data(), bytes, nullptr, s.y.h, y.data()),
      CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnConvolutionForward(nullptr, &one, s.x.h, x.data(), s.w.h, w.data(), s.conv.h,
                                    CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, ws.data(), bytes, &zero, s.y.h, y.data()),
            CUDNN_STATUS_BAD_PARAM);
}

TEST(CudnnEmu, DataTypeConfigurationsOutsideNvidiasTableAreNotSupported) {
  const Case& c = kCases[1];
  // Controls: PSEUDO_HALF_CONFIG, PSEUDO_BFLOAT16_CONFIG, DOUBLE_CONFIG.
  EXPECT_EQ(Described(c, CUDNN_DATA_HALF, CUDNN_DATA_FLOAT).forward_status(), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(Described(c, CUDNN_DATA_BFLOAT16, CUDNN_DATA_FLOAT).forward_status(), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(Described(c, CUDNN_DATA_DOUBLE, CUDNN_DATA_DOUBLE).forward_status(), CUDNN_STATUS_SUCCESS);
  // float data accumulated in double or half; double in float; bfloat16 in bfloat16; int8 data.
  EXPECT_EQ(Described(c, CUDNN_DATA_FLOAT, CUDNN_DATA_DOUBLE).forward_status(), CUDNN_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(Described(c, CUDNN_DATA_FLOAT, CUDNN_DATA_HALF).forward_status(), CUDNN_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(Described(c, CUDNN_DATA_DOUBLE, CUDNN_DATA_FLOAT).backward_data_status(), CUDNN_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(Described(c, CUDNN_DATA_BFLOAT16, CUDNN_DATA_BFLOAT16).forward_status(), CUDNN_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(Described(c, CUDNN_DATA_INT8, CUDNN_DATA_INT32).backward_data_status(), CUDNN_STATUS_NOT_SUPPORTED);
  // TRUE_HALF_CONFIG is cuDNN's, not the emulator's.
  EXPECT_EQ(Described(c, CUDNN_DATA_HALF, CUDNN_DATA_HALF).forward_status(), CUDNN_STATUS_NOT_SUPPORTED);
}

TEST(CudnnEmu, InconsistentDescriptorsAreBadParams) {
  const Case c = kCases[0];
  {  // x and y of two data types
    Described s(c);
    ASSERT_EQ(cudnnSetTensor4dDescriptor(s.y.h, CUDNN_TENSOR_NCHW, CUDNN_DATA_HALF, int(c.N), int(c.K), int(c.P()),
                                         int(c.Q())),
              CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(s.forward_status(), CUDNN_STATUS_BAD_PARAM);
  }
  {  // y's size is not the convolution's
    Described s(c);
    ASSERT_EQ(cudnnSetTensor4dDescriptor(s.y.h, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(c.N), int(c.K), int(c.P()) + 1,
                                         int(c.Q())),
              CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(s.forward_status(), CUDNN_STATUS_BAD_PARAM);
    EXPECT_EQ(s.backward_data_status(), CUDNN_STATUS_BAD_PARAM);
  }
  {  // the filter's channels are not x's per group
    Described s(c);
    ASSERT_EQ(cudnnSetConvolutionGroupCount(s.conv.h, 1), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(s.forward_status(), CUDNN_STATUS_BAD_PARAM);
  }
  {  // a dilated filter larger than the padded input
    Described s(c);
    ASSERT_EQ(cudnnSetConvolution2dDescriptor(s.conv.h, 0, 0, 1, 1, 5, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
              CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(s.forward_status(), CUDNN_STATUS_BAD_PARAM);
  }
  {  // a convolution descriptor never set
    Described s(c);
    ConvDesc blank;
    cudnnConvolutionFwdAlgoPerf_t perf[1];
    int found = 0;
    EXPECT_EQ(cudnnGetConvolutionForwardAlgorithm_v7(s.dnn.h, s.x.h, s.w.h, blank.h, s.y.h, 1, &found, perf),
              CUDNN_STATUS_BAD_PARAM);
  }
  // Values the setters refuse.
  ConvDesc conv;
  EXPECT_EQ(cudnnSetConvolution2dDescriptor(conv.h, -1, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
            CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnSetConvolution2dDescriptor(conv.h, 0, 0, 0, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
            CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnSetConvolution2dDescriptor(conv.h, 0, 0, 1, 1, 1, 0, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
            CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnSetConvolutionGroupCount(conv.h, 0), CUDNN_STATUS_BAD_PARAM);
  // (A math type outside the enumeration is refused too, but C++ cannot form one without
  // undefined behaviour: the enumeration's values fit in two bits, and UBSan says so.)
  TensorDesc t;
  EXPECT_EQ(cudnnSetTensor4dDescriptor(t.h, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 0, 2, 2), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnCreate(nullptr), CUDNN_STATUS_BAD_PARAM);
}

TEST(CudnnEmu, HandleStreamAndErrorStrings) {
  Dnn dnn;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(0x10);
  EXPECT_EQ(cudnnSetStream(dnn.h, s), CUDNN_STATUS_SUCCESS);
  cudaStream_t got = nullptr;
  EXPECT_EQ(cudnnGetStream(dnn.h, &got), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(got, s);
  EXPECT_EQ(cudnnSetStream(nullptr, s), CUDNN_STATUS_BAD_PARAM);
  EXPECT_STREQ(cudnnGetErrorString(CUDNN_STATUS_BAD_PARAM), "CUDNN_STATUS_BAD_PARAM");
  EXPECT_STREQ(cudnnGetErrorString(CUDNN_STATUS_NOT_SUPPORTED), "CUDNN_STATUS_NOT_SUPPORTED");
  EXPECT_EQ(int(CUDNN_STATUS_BAD_PARAM), 2000);
  EXPECT_EQ(int(CUDNN_STATUS_NOT_SUPPORTED), 3000);
}

}  // namespace
