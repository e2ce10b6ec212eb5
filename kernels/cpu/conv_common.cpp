// The convolution and pooling code both builds use (conv_common.h): im2col convolution on
// the Eigen GEMM (the whole Eigen build; float64 in the oneDNN build), the bias gradient, and
// the pooling loops of both builds.
//
// Threading: a minibatch of images is split as gemm_common's batches are (over_items);
// pooling splits the planes.
//
// Max pooling updates a whole output row tap by tap, so the updates are independent and
// vectorise; a running maximum per output is a serial chain of compare-and-selects.
#include "cpu/conv_common.h"

#include <Eigen/Core>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

#include "ampgrad/raw.h"
#include "cpu/cpu_backend.h"
#include "cpu/gemm_common.h"
#include "cpu/parallel.h"
#include "cpu/vec.h"

namespace ampgrad::cpu {

// ---- im2col convolution --------------------------------------------------------------------

namespace {

struct ConvDims {
  int64_t N, C, H, W, OC, KH, KW, OH, OW, G, Cg, OCg;
  int64_t sh, sw, ph, pw, dh, dw;
  int64_t rows() const { return Cg * KH * KW; }  // of the column matrix
  int64_t cols() const { return OH * OW; }
  // A 1x1 kernel that reads every input pixel once: the input plane is the column matrix.
  bool pointwise() const {
    return KH == 1 && KW == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0;
  }
};

ConvDims conv_dims(const Shape& x, const Shape& w, const Shape& out, const Conv2dParams& p) {
  ConvDims d{};
  d.N = x[0];
  d.C = x[1];
  d.H = x[2];
  d.W = x[3];
  d.OC = w[0];
  d.KH = w[2];
  d.KW = w[3];
  d.OH = out[2];
  d.OW = out[3];
  d.G = p.groups;
  d.Cg = d.C / d.G;
  d.OCg = d.OC / d.G;
  d.sh = p.stride[0];
  d.sw = p.stride[1];
  d.ph = p.padding[0];
  d.pw = p.padding[1];
  d.dh = p.dilation[0];
  d.dw = p.dilation[1];
  return d;
}

template <class T>
void im2col(const T* x, T* col, const ConvDims& d) {
  for (int64_t c = 0; c < d.Cg; ++c)
    for (int64_t kh = 0; kh < d.KH; ++kh)
      for (int64_t kw = 0; kw < d.KW; ++kw) {
        T* dst = col + ((c * d.KH + kh) * d.KW + kw) * d.cols();
        const T* plane = x + c * d.H * d.W;
        for (int64_t oh = 0; oh < d.OH; ++oh) {
          const int64_t ih = oh * d.sh - d.ph + kh * d.dh;
          T* row = dst + oh * d.OW;
          if (ih < 0 || ih >= d.H) {
            std::fill(row, row + d.OW, T(0));
            continue;
          }
          const T* src = plane + ih * d.W;
          for (int64_t ow = 0; ow < d.OW; ++ow) {
            const int64_t iw = ow * d.sw - d.pw + kw * d.dw;
            row[ow] = iw >= 0 && iw < d.W ? src[iw] : T(0);
          }
        }
      }
}

// The adjoint of im2col: adds each column entry into the input pixel it was read from.
template <class T>
void col2im(const T* col, T* x, const ConvDims& d) {
  for (int64_t c = 0; c < d.Cg; ++c)
    for (int64_t kh = 0; kh < d.KH; ++kh)
      for (int64_t kw = 0; kw < d.KW; ++kw) {
        const T* src = col + ((c * d.KH + kh) * d.KW + kw) * d.cols();
        T* plane = x + c * d.H * d.W;
        for (int64_t oh = 0; oh < d.OH; ++oh) {
          const int64_t ih = oh * d.sh - d.ph + kh * d.dh;
          if (ih < 0 || ih >= d.H) continue;
          T* dst = plane + ih * d.W;
          const T* row = src + oh * d.OW;
          for (int64_t ow = 0; ow < d.OW; ++ow) {
            const int64_t iw = ow * d.sw - d.pw + kw * d.dw;
            if (iw >= 0 && iw < d.W) dst[iw] += row[ow];
          }
        }
      }
}

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using MapMat = Eigen::Map<RowMat<T>>;
template <class T>
using MapCMat = Eigen::Map<const RowMat<T>>;

double conv_flops(const ConvDims& d) { return 2.0 * double(d.OC) * double(d.rows()) * double(d.cols()); }

template <class T>
void conv_fwd(const T* x, const T* w, const T* bias, T* out, const ConvDims& d) {
  over_items(d.N, conv_flops(d), [&](int64_t n) {
    std::vector<T> col(d.pointwise() ? 0 : size_t(d.rows() * d.cols()));
    for (int64_t g = 0; g < d.G; ++g) {
      const T* xg = x + (n * d.C + g * d.Cg) * d.H * d.W;
      if (!d.pointwise()) im2col(xg, col.data(), d);
      MapCMat<T> cm(d.pointwise() ? xg : col.data(), d.rows(), d.cols());
      MapCMat<T> wg(w + g * d.OCg * d.rows(), d.OCg, d.rows());
      MapMat<T> og(out + (n * d.OC + g * d.OCg) * d.cols(), d.OCg, d.cols());
      og.noalias() = wg * cm;
      if (bias) og.colwise() += Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, 1>>(bias + g * d.OCg, d.OCg);
    }
  });
}

template <class T>
void conv_bwd_input(const T* gy, const T* w, T* gx, const ConvDims& d) {
  over_items(d.N, conv_flops(d), [&](int64_t n) {
    std::vector<T> col(d.pointwise() ? 0 : size_t(d.rows() * d.cols()));
    for (int64_t g = 0; g < d.G; ++g) {
      T* gxg = gx + (n * d.C + g * d.Cg) * d.H * d.W;
      MapCMat<T> wg(w + g * d.OCg * d.rows(), d.OCg, d.rows());
      MapCMat<T> gyg(gy + (n * d.OC + g * d.OCg) * d.cols(), d.OCg, d.cols());
      if (d.pointwise()) {
        MapMat<T>(gxg, d.rows(), d.cols()).noalias() = wg.transpose() * gyg;
      } else {
        MapMat<T>(col.data(), d.rows(), d.cols()).noalias() = wg.transpose() * gyg;
        std::fill(gxg, gxg + d.Cg * d.H * d.W, T(0));
        col2im(col.data(), gxg, d);
      }
    }
  });
}

// Each thread sums its images' contributions privately; the sums meet under a lock.
template <class T>
void conv_bwd_weight(const T* gy, const T* x, T* gw, const ConvDims& d) {
  const int64_t wsize = d.OC * d.rows();
  std::fill(gw, gw + wsize, T(0));
  std::mutex mu;
  auto chunk = [&](int64_t b, int64_t e, bool private_sum) {
    std::vector<T> col(d.pointwise() ? 0 : size_t(d.rows() * d.cols()));
    std::vector<T> local(private_sum ? size_t(wsize) : 0, T(0));
    T* acc = private_sum ? local.data() : gw;
    for (int64_t n = b; n < e; ++n)
      for (int64_t g = 0; g < d.G; ++g) {
        const T* xg = x + (n * d.C + g * d.Cg) * d.H * d.W;
        if (!d.pointwise()) im2col(xg, col.data(), d);
        MapCMat<T> cm(d.pointwise() ? xg : col.data(), d.rows(), d.cols());
        MapCMat<T> gyg(gy + (n * d.OC + g * d.OCg) * d.cols(), d.OCg, d.cols());
        MapMat<T>(acc + g * d.OCg * d.rows(), d.OCg, d.rows()).noalias() += gyg * cm.transpose();
      }
    if (private_sum) {
      std::lock_guard<std::mutex> lock(mu);
      for (int64_t i = 0; i < wsize; ++i) gw[i] += local[size_t(i)];
    }
  };
  if (split_items(d.N, conv_flops(d))) parallel_for(0, d.N, 1, [&](int64_t b, int64_t e) { chunk(b, e, true); });
  else chunk(0, d.N, false);
}

template <class T>
const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.raw_data()) : nullptr;
}

// Runs f.template operator()<T>() with T float or double; float16/bfloat16 tensors are
// replaced by float32 copies first (the caller converts its outputs back).
template <class F>
void dispatch_compute(DType dt, const char* op, const F& f) {
  dispatch_floating(dt, op, [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) f.template operator()<T>();
    else AG_ERROR(op, "internal: ", dtype_name(dt), " must be widened before the GEMM");
  });
}

}  // namespace

void eigen_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                  const Conv2dParams& p) {
  if (out.numel() == 0) return;
  if (is_reduced_floating(out.dtype())) {
    Tensor of = make_tensor(out.sizes(), kFloat32, out.device());
    eigen_conv2d(float32_copy(x), float32_copy(w), float32_copy(bias), of, p);
    cpu_backend().copy(of, out);
    return;
  }
  const ConvDims d = conv_dims(x.sizes(), w.sizes(), out.sizes(), p);
  dispatch_compute(out.dtype(), op::conv2d, [&]<class T>() {
    conv_fwd<T>(ptr_or_null<T>(x), ptr_or_null<T>(w), ptr_or_null<T>(bias),
                static_cast<T*>(out.raw_data()), d);
  });
}

void eigen_conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Tensor& grad_in,
                                 const Conv2dParams& p) {
  if (grad_in.numel() == 0) return;
  if (is_reduced_floating(grad_in.dtype())) {
    Tensor gf = make_tensor(grad_in.sizes(), kFloat32, grad_in.device());
    eigen_conv2d_backward_input(float32_copy(grad_out), float32_copy(w), gf, p);
    cpu_backend().copy(gf, grad_in);
    return;
  }
  const ConvDims d = conv_dims(grad_in.sizes(), w.sizes(), grad_out.sizes(), p);
  if (grad_out.numel() == 0) {
    cpu_backend().fill(grad_in, 0);
    return;
  }
  dispatch_compute(grad_in.dtype(), op::conv2d, [&]<class T>() {
    conv_bwd_input<T>(ptr_or_null<T>(grad_out), ptr_or_null<T>(w),
                      static_cast<T*>(grad_in.raw_data()), d);
  });
}

void eigen_conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Tensor& grad_w,
                                  const Tensor& grad_bias, const Conv2dParams& p) {
  if (grad_bias.defined()) conv_bias_grad(grad_out, grad_bias);
  if (!grad_w.defined() || grad_w.numel() == 0) return;
  if (is_reduced_floating(grad_w.dtype())) {
    Tensor gf = make_tensor(grad_w.sizes(), kFloat32, grad_w.device());
    eigen_conv2d_backward_weight(float32_copy(grad_out), float32_copy(x), gf, Tensor(), p);
    cpu_backend().copy(gf, grad_w);
    return;
  }
  const ConvDims d = conv_dims(x.sizes(), grad_w.sizes(), grad_out.sizes(), p);
  dispatch_compute(grad_w.dtype(), op::conv2d, [&]<class T>() {
    conv_bwd_weight<T>(ptr_or_null<T>(grad_out), ptr_or_null<T>(x),
                       static_cast<T*>(grad_w.raw_data()), d);
  });
}

void conv_bias_grad(const Tensor& grad_out, const Tensor& grad_bias) {
  const int64_t N = grad_out.size(0), C = grad_out.size(1);
  const int64_t plane = grad_out.size(2) * grad_out.size(3);
  dispatch_floating(grad_bias.dtype(), op::conv2d, [&]<class T>() {
    using A = acc_type_t<T>;
    const T* gy = static_cast<const T*>(grad_out.raw_data());
    T* gb = static_cast<T*>(grad_bias.raw_data());
    parallel_for(0, C, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, N * plane)),
                 [&](int64_t b, int64_t e) {
                   for (int64_t c = b; c < e; ++c) {
                     A s = 0;
                     for (int64_t n = 0; n < N; ++n) {
                       const T* p = gy + (n * C + c) * plane;
                       for (int64_t i = 0; i < plane; ++i) s += A(p[i]);
                     }
                     gb[c] = T(s);
                   }
                 });
  });
}

// ---- pooling ---------------------------------------------------------------------------------

namespace {

struct PoolDims {
  int64_t planes, H, W, OH, OW;
  PoolDims(const Shape& in, const Shape& out)
      : planes(in[0] * in[1]), H(in[2]), W(in[3]), OH(out[2]), OW(out[3]) {}
  int64_t grain() const { return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, H * W)); }
};

// Runs body(plane, scratch) over the planes in parallel; scratch is a per-thread buffer of
// H * W accumulators, used by the backward loops of 16-bit types (their gradients sum in
// float before one rounding).
template <class A, class Body>
void over_planes(const PoolDims& d, const Body& body) {
  parallel_for(0, d.planes, d.grain(), [&](int64_t b, int64_t e) {
    std::vector<A> scratch;
    for (int64_t pl = b; pl < e; ++pl) body(pl, scratch);
  });
}

// Accumulates into a gradient plane of type T: directly for float and double, through a
// float buffer for the 16-bit types.
template <class T, class Fill>
void accumulate_plane(T* gi, int64_t n, std::vector<acc_type_t<T>>& scratch, const Fill& fill) {
  using A = acc_type_t<T>;
  if constexpr (std::is_same_v<T, A>) {
    std::fill(gi, gi + n, T(0));
    fill(gi);
  } else {
    scratch.assign(size_t(n), A(0));
    fill(scratch.data());
    for (int64_t i = 0; i < n; ++i) gi[i] = T(scratch[size_t(i)]);
  }
}

// The kernel taps [k0, k1) whose input row start + k * d lies in [0, n).
inline void tap_range(int64_t start, int64_t k, int64_t d, int64_t n, int64_t& k0, int64_t& k1) {
  k0 = start < 0 ? (-start + d - 1) / d : 0;
  k1 = start > n - 1 ? 0 : std::min(k, (n - 1 - start) / d + 1);
}

// Per output row (or column): where its window starts and which taps fall inside the
// input; and per tap, the outputs it reaches. Worked out once per call.
struct Taps {
  std::vector<int64_t> start, k0, k1;  // per output
  std::vector<int64_t> o0, o1;         // per tap: outputs [o0, o1) read an input element
  Taps(int64_t outs, int64_t stride, int64_t pad, int64_t k, int64_t d, int64_t n)
      : start(size_t(outs)), k0(size_t(outs)), k1(size_t(outs)), o0(size_t(k), 0), o1(size_t(k), 0) {
    for (int64_t o = 0; o < outs; ++o) {
      start[size_t(o)] = o * stride - pad;
      tap_range(start[size_t(o)], k, d, n, k0[size_t(o)], k1[size_t(o)]);
    }
    for (int64_t t = 0; t < k; ++t) {
      int64_t lo = 0;
      while (lo < outs && !(t >= k0[size_t(lo)] && t < k1[size_t(lo)])) ++lo;
      int64_t hi = lo;
      while (hi < outs && t >= k0[size_t(hi)] && t < k1[size_t(hi)]) ++hi;
      o0[size_t(t)] = lo;
      o1[size_t(t)] = hi;
    }
  }
};

// One tap of a row of max-pool outputs: outputs [o0, o1) read input base + ow * sw. The
// outputs are independent, so the loop vectorises (32-bit indices keep the lanes of one
// width); a running maximum per output would be one long dependency chain instead.
template <class T, class A>
void max_tap(const T* __restrict xp, A* __restrict best, int32_t* __restrict bi, int64_t base, int64_t sw,
             int64_t o0, int64_t o1) {
  for (int64_t ow = o0; ow < o1; ++ow) {
    const int32_t i = int32_t(base + ow * sw);
    const A v = A(xp[i]);
    const A b = best[ow];
    const bool take = (v > b) | (v != v);  // PyTorch: a larger value or a NaN takes over
    best[ow] = take ? v : b;
    bi[ow] = take ? i : bi[ow];
  }
}
}  // namespace

Tensor pool_max_forward(const Tensor& x, const Tensor& out, const Pool2dParams& p) {
  Tensor idx = make_tensor(out.sizes(), kInt64, out.device());
  const PoolDims d(x.sizes(), out.sizes());
  AG_CHECK(d.H * d.W < (int64_t(1) << 31), op::max_pool2d, "input planes of ", d.H * d.W, " elements are too large");
  const int64_t dh = p.dilation[0], dw = p.dilation[1], sw = p.stride[1];
  const Taps th(d.OH, p.stride[0], p.padding[0], p.kernel[0], dh, d.H);
  const Taps tw(d.OW, sw, p.padding[1], p.kernel[1], dw, d.W);
  dispatch_floating(x.dtype(), op::max_pool2d, [&]<class T>() {
    using A = acc_type_t<T>;
    const T* xs = static_cast<const T*>(x.raw_data());
    T* os = static_cast<T*>(out.raw_data());
    int64_t* is = idx.data_ptr<int64_t>();
    parallel_for(0, d.planes, d.grain(), [&](int64_t pb, int64_t pe) {
      std::vector<A> best(size_t(d.OW));
      std::vector<int32_t> bi(size_t(d.OW));
      std::vector<A> plane(is_float16_v<T> ? size_t(d.H * d.W) : 0);
      for (int64_t pl = pb; pl < pe; ++pl) {
        // 16-bit planes are widened in bulk first; converting in the tap loop would
        // keep it from vectorising.
        const A* xp;
        if constexpr (is_float16_v<T>) {
          convert(xs + pl * d.H * d.W, plane.data(), size_t(d.H * d.W));
          xp = plane.data();
        } else {
          xp = xs + pl * d.H * d.W;
        }
        for (int64_t oh = 0; oh < d.OH; ++oh) {
          const int64_t hs = th.start[size_t(oh)], kh0 = th.k0[size_t(oh)], kh1 = th.k1[size_t(oh)];
          // -inf at the first tap inside the input; later taps in row-major order. A window
          // with no tap inside the input (dilation can skip over it) routes no gradient: -1.
          for (int64_t ow = 0; ow < d.OW; ++ow) {
            best[size_t(ow)] = -std::numeric_limits<A>::infinity();
            const bool any_tap = kh0 < kh1 && tw.k0[size_t(ow)] < tw.k1[size_t(ow)];
            bi[size_t(ow)] = any_tap ? int32_t((hs + kh0 * dh) * d.W + tw.start[size_t(ow)] + tw.k0[size_t(ow)] * dw) : -1;
          }
          for (int64_t kh = kh0; kh < kh1; ++kh)
            for (int64_t kw = 0; kw < p.kernel[1]; ++kw)
              max_tap<A, A>(xp, best.data(), bi.data(), (hs + kh * dh) * d.W - p.padding[1] + kw * dw, sw,
                            tw.o0[size_t(kw)], tw.o1[size_t(kw)]);
          T* op = os + (pl * d.OH + oh) * d.OW;
          int64_t* ip = is + (pl * d.OH + oh) * d.OW;
          for (int64_t ow = 0; ow < d.OW; ++ow) {
            op[ow] = T(best[size_t(ow)]);
            ip[ow] = bi[size_t(ow)];
          }
        }
      }
    });
  });
  return idx;
}

void pool_max_backward(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_in) {
  const PoolDims d(grad_in.sizes(), grad_out.sizes());
  const Tensor ic = detail::contiguous_raw(indices);
  dispatch_floating(grad_in.dtype(), op::max_pool2d, [&]<class T>() {
    using A = acc_type_t<T>;
    const T* go = static_cast<const T*>(grad_out.raw_data());
    const int64_t* is = ic.data_ptr<int64_t>();
    T* gi = static_cast<T*>(grad_in.raw_data());
    over_planes<A>(d, [&](int64_t pl, std::vector<A>& scratch) {
      const T* g = go + pl * d.OH * d.OW;
      const int64_t* ip = is + pl * d.OH * d.OW;
      accumulate_plane<T>(gi + pl * d.H * d.W, d.H * d.W, scratch, [&](auto* acc) {
        const int64_t n = d.H * d.W;  // an index outside the plane (a window with no input) adds nothing
        for (int64_t k = 0; k < d.OH * d.OW; ++k)
          if (ip[k] >= 0 && ip[k] < n) acc[ip[k]] += A(g[k]);
      });
    });
  });
}

namespace {
// PyTorch's avg-pool window: [start, end) clipped to the input, and the divisor, which
// with count_include_pad counts padding but not the overhang that ceil_mode adds.
struct AvgWindow {
  int64_t h0, h1, w0, w1, divisor;
};
inline AvgWindow avg_window(int64_t oh, int64_t ow, const PoolDims& d, const Pool2dParams& p) {
  int64_t h0 = oh * p.stride[0] - p.padding[0], w0 = ow * p.stride[1] - p.padding[1];
  int64_t h1 = std::min(h0 + p.kernel[0], d.H + p.padding[0]);
  int64_t w1 = std::min(w0 + p.kernel[1], d.W + p.padding[1]);
  const int64_t padded = (h1 - h0) * (w1 - w0);
  h0 = std::max<int64_t>(h0, 0);
  w0 = std::max<int64_t>(w0, 0);
  h1 = std::min(h1, d.H);
  w1 = std::min(w1, d.W);
  const int64_t inside = std::max<int64_t>(h1 - h0, 0) * std::max<int64_t>(w1 - w0, 0);
  return {h0, h1, w0, w1, p.count_include_pad ? padded : inside};
}
}  // namespace

void pool_avg_forward(const Tensor& x, const Tensor& out, const Pool2dParams& p) {
  const PoolDims d(x.sizes(), out.sizes());
  dispatch_floating(x.dtype(), op::avg_pool2d, [&]<class T>() {
    using A = acc_type_t<T>;
    const T* xs = static_cast<const T*>(x.raw_data());
    T* os = static_cast<T*>(out.raw_data());
    over_planes<A>(d, [&](int64_t pl, std::vector<A>&) {
      const T* xp = xs + pl * d.H * d.W;
      T* op = os + pl * d.OH * d.OW;
      for (int64_t oh = 0; oh < d.OH; ++oh)
        for (int64_t ow = 0; ow < d.OW; ++ow) {
          const AvgWindow wd = avg_window(oh, ow, d, p);
          A s = 0;
          for (int64_t ih = wd.h0; ih < wd.h1; ++ih)
            for (int64_t iw = wd.w0; iw < wd.w1; ++iw) s += A(xp[ih * d.W + iw]);
          op[oh * d.OW + ow] = wd.divisor > 0 ? T(s / A(wd.divisor)) : T(0);
        }
    });
  });
}

void pool_avg_backward(const Tensor& grad_out, const Tensor& grad_in, const Pool2dParams& p) {
  const PoolDims d(grad_in.sizes(), grad_out.sizes());
  dispatch_floating(grad_in.dtype(), op::avg_pool2d, [&]<class T>() {
    using A = acc_type_t<T>;
    const T* go = static_cast<const T*>(grad_out.raw_data());
    T* gi = static_cast<T*>(grad_in.raw_data());
    over_planes<A>(d, [&](int64_t pl, std::vector<A>& scratch) {
      const T* g = go + pl * d.OH * d.OW;
      accumulate_plane<T>(gi + pl * d.H * d.W, d.H * d.W, scratch, [&](auto* acc) {
        for (int64_t oh = 0; oh < d.OH; ++oh)
          for (int64_t ow = 0; ow < d.OW; ++ow) {
            const AvgWindow wd = avg_window(oh, ow, d, p);
            if (wd.divisor <= 0) continue;
            const A v = A(g[oh * d.OW + ow]) / A(wd.divisor);
            for (int64_t ih = wd.h0; ih < wd.h1; ++ih)
              for (int64_t iw = wd.w0; iw < wd.w1; ++iw) acc[ih * d.W + iw] += v;
          }
      });
    });
  });
}

}  // namespace ampgrad::cpu
