// Softmax / log-softmax and layer norm on the CPU, forward and backward.
//
// Inputs are contiguous (the frontend makes them so). Softmax views x as [outer, n, inner]
// around dim: with inner == 1 (the last dim, the common case) each row is contiguous and
// is widened into a per-thread float buffer once; otherwise a block of up to 16
// neighbouring columns is widened row by row, every read a contiguous slice, and the math
// vectorises across the columns. Rows subtract their max before exponentiating, with
// exp_acc (vec.h) so that the exp loops vectorise; the float bodies are compiled for the
// baseline and for AVX-512 (run_softmax_block).
//
// Layer norm normalises rows of `inner` elements. Statistics are two-pass (mean, then the
// mean squared deviation) in the accumulation type, and mean and rstd are saved per row
// (float32, or float64 for float64 x). Backward computes grad_in per row, and the weight
// and bias gradients as per-chunk partial sums over rows that are added in a fixed order
// afterwards: no races, and the same result for any thread count.
// float16/bfloat16 are computed in float32 throughout. Layer norm's row loops are compiled
// for the baseline and for AVX-512 (see "layer norm's rows" below); float rows are read
// and written in place, 16-bit ones widened per row.
//
// Reference: kernels/reference/include/ampgrad/reference/softmax.h and
//   kernels/reference/include/ampgrad/reference/norm.h (float64, the specification).
#include <array>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/avx512.h"
#include "cpu/cpu_backend.h"
#include "cpu/loops.h"
#include "cpu/parallel.h"
#include "cpu/rows.h"
#include "cpu/vec.h"

namespace ampgrad::cpu {
namespace {

constexpr int64_t kCols = 16;  // columns handled together when dim is not the last

// Runs body(buffers, n, w, scratch) over the [outer, n, inner] views: each task widens a
// [n, w] block (w neighbouring columns, w == 1 when dim is the last) of every `in`
// operand into a float buffer, row-major, so every read is a contiguous slice; body
// computes in place into buffer 0, which is stored to `out`. scratch holds 2 w values.
template <class T, int NIn, class Body>
void for_each_block(const Split3& s, const std::array<const Tensor*, NIn>& in, const Tensor& out,
                    const Body& body) {
  using A = acc_type_t<T>;
  const int64_t W = s.inner == 1 ? 1 : std::min(kCols, s.inner);
  const int64_t nblk = (s.inner + W - 1) / W;
  const int64_t tasks = s.outer * nblk;
  const int64_t sz = int64_t(sizeof(T));
  parallel_for(0, tasks, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, s.n * W)), [&](int64_t tb, int64_t te) {
    std::vector<A> bufs[NIn];
    for (int k = 0; k < NIn; ++k) bufs[k].resize(size_t(s.n * W));
    std::vector<A> scratch(static_cast<size_t>(2 * W));
    for (int64_t t = tb; t < te; ++t) {
      const int64_t o = t / nblk, c0 = (t % nblk) * W, w = std::min(W, s.inner - c0);
      const int64_t first = (o * s.n * s.inner + c0) * sz;  // byte offset of (o, 0, c0)
      A* b[NIn];
      for (int k = 0; k < NIn; ++k) {
        b[k] = bufs[k].data();
        const char* p = static_cast<const char*>(in[size_t(k)]->raw_data()) + first;
        if (w == 1 && s.inner == 1) load_acc<T>(p, sz, b[k], s.n);
        else for (int64_t i = 0; i < s.n; ++i) load_acc<T>(p + i * s.inner * sz, sz, b[k] + i * w, w);
      }
      body(b, s.n, w, scratch.data());
      char* q = static_cast<char*>(out.raw_data()) + first;
      if (w == 1 && s.inner == 1) store_acc<T>(b[0], q, sz, s.n);
      else for (int64_t i = 0; i < s.n; ++i) store_acc<T>(b[0] + i * w, q + i * s.inner * sz, sz, w);
    }
  });
}

// The bodies below have a row form (w == 1: vectorised along the row) and a column form
// (vectorised across the w columns, element (i, j) at v[i * w + j]). kLog is a template
// parameter: a runtime choice inside the loops would keep them from vectorising.

template <bool kLog, class A>
[[gnu::always_inline]] inline void softmax_block(A* v, int64_t n, int64_t w, A* scratch) {
  if (w == 1) {
    const A m = row_max(v, n);  // a NaN row gives NaN through exp below
    if constexpr (kLog) {
      // (x - max) - log(sum): x - max is exact near the max, so large inputs keep precision
      for (int64_t i = 0; i < n; ++i) v[i] -= m;
      A sum = 0, t[256];
      for (int64_t c = 0; c < n; c += 256) {
        const int64_t k = std::min<int64_t>(256, n - c);
        for (int64_t i = 0; i < k; ++i) t[i] = exp_acc(v[c + i]);
        sum += lane_sum<A>(k, [&](int64_t i) { return t[i]; });
      }
      const A ls = std::log(sum);
      for (int64_t i = 0; i < n; ++i) v[i] -= ls;
    } else {
      for (int64_t i = 0; i < n; ++i) v[i] = exp_acc(v[i] - m);
      const A inv = A(1) / lane_sum<A>(n, [&](int64_t i) { return v[i]; });
      for (int64_t i = 0; i < n; ++i) v[i] *= inv;
    }
    return;
  }
  A* m = scratch;
  A* sum = scratch + w;
  for (int64_t j = 0; j < w; ++j) m[j] = -std::numeric_limits<A>::infinity(), sum[j] = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < w; ++j) m[j] = v[i * w + j] > m[j] ? v[i * w + j] : m[j];
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < w; ++j) {
      const A d = v[i * w + j] - m[j], e = exp_acc(d);
      sum[j] += e;
      v[i * w + j] = kLog ? d : e;
    }
  for (int64_t j = 0; j < w; ++j) sum[j] = kLog ? std::log(sum[j]) : A(1) / sum[j];
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < w; ++j) {
      if constexpr (kLog) v[i * w + j] -= sum[j];
      else v[i * w + j] *= sum[j];
    }
}

// softmax: d = y * (g - <g, y>); log-softmax: d = g - exp(y) * sum(g). In place in g.
template <bool kLog, class A>
[[gnu::always_inline]] inline void softmax_backward_block(A* g, const A* y, int64_t n, int64_t w, A* scratch) {
  if (w == 1) {
    if constexpr (kLog) {
      const A sum = lane_sum<A>(n, [&](int64_t i) { return g[i]; });
      for (int64_t i = 0; i < n; ++i) g[i] -= exp_acc(y[i]) * sum;
    } else {
      const A dot = lane_sum<A>(n, [&](int64_t i) { return g[i] * y[i]; });
      for (int64_t i = 0; i < n; ++i) g[i] = y[i] * (g[i] - dot);
    }
    return;
  }
  A* acc = scratch;
  for (int64_t j = 0; j < w; ++j) acc[j] = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < w; ++j) {
      if constexpr (kLog) acc[j] += g[i * w + j];
      else acc[j] += g[i * w + j] * y[i * w + j];
    }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < w; ++j) {
      const size_t k = size_t(i * w + j);
      if constexpr (kLog) g[k] -= exp_acc(y[k]) * acc[j];
      else g[k] = y[k] * (g[k] - acc[j]);
    }
}

// The softmax bodies in the variant of the kernels' level (cpu/isa.h): compiled for AVX-512
// too by a target attribute (the library is built for baseline x86-64, where exp_acc runs 4
// floats wide), as cross entropy's rows (loss.cpp). The same arithmetic in both.
template <bool kLog>
AG_AVX512_TARGET void softmax_block_avx512(float* v, int64_t n, int64_t w, float* scratch) {
  softmax_block<kLog>(v, n, w, scratch);
}
template <bool kLog>
AG_AVX512_TARGET void softmax_backward_block_avx512(float* g, const float* y, int64_t n, int64_t w, float* scratch) {
  softmax_backward_block<kLog>(g, y, n, w, scratch);
}

template <bool kLog, class A>
void run_softmax_block(A* v, int64_t n, int64_t w, A* scratch) {
  if constexpr (std::is_same_v<A, float>)
    run_variant<softmax_block<kLog, float>, softmax_block_avx512<kLog>>(v, n, w, scratch);
  else softmax_block<kLog>(v, n, w, scratch);
}

template <bool kLog, class A>
void run_softmax_backward_block(A* g, const A* y, int64_t n, int64_t w, A* scratch) {
  if constexpr (std::is_same_v<A, float>)
    run_variant<softmax_backward_block<kLog, float>, softmax_backward_block_avx512<kLog>>(g, y, n, w, scratch);
  else softmax_backward_block<kLog>(g, y, n, w, scratch);
}

// ---- layer norm's rows ------------------------------------------------------------------
// The library is built for baseline x86-64, where these loops ran 4 wide; they are one
// always-inlined definition compiled for the baseline and, by a target attribute, for
// AVX-512, picked by the kernels' level (as attention's row work is). Their sums run in
// kLanes lanes combined in a fixed order in every variant, and are written out here rather
// than taken from rows.h so that they are inlined into each variant.

constexpr int kLanes = 16;

template <class A>
[[gnu::always_inline]] inline A fold(const A* l) {
  A h[kLanes / 2];
  for (int k = 0; k < kLanes / 2; ++k) h[k] = l[k] + l[k + kLanes / 2];
  for (int k = 0; k < kLanes / 4; ++k) h[k] += h[k + kLanes / 4];
  return (h[0] + h[2]) + (h[1] + h[3]);
}

// What a task of the forward reads and writes: rows of x (storage type T) into rows of y,
// mean and rstd per row; w and b widened (or null).
template <class T>
struct LnForward {
  using A = acc_type_t<T>;
  const char* x;
  char* y;
  const A* w;
  const A* b;
  A* mean;
  A* rstd;
  int64_t inner;
  A eps;
  DType y16 = kFloat32;  // float rows: y in this 16-bit dtype instead (else kFloat32)
};

// Row r of a 16-bit tensor (dtype dt) of rows of n: stored from n floats, or widened into them.
inline void store_row16(const float* buf, char* y, DType dt, int64_t r, int64_t n) {
  if (dt == kBFloat16) store_acc<BFloat16>(buf, y + r * n * 2, 2, n);
  else store_acc<Half>(buf, y + r * n * 2, 2, n);
}
inline void load_row16(const char* g, DType dt, int64_t r, int64_t n, float* buf) {
  if (dt == kBFloat16) load_acc<BFloat16>(g + r * n * 2, 2, buf, n);
  else load_acc<Half>(g + r * n * 2, 2, buf, n);
}

template <class T>
[[gnu::always_inline]] inline void ln_forward_rows(const LnForward<T>& a, int64_t rb, int64_t re,
                                                   acc_type_t<T>* buf) {
  using A = acc_type_t<T>;
  const int64_t n = a.inner, sz = int64_t(sizeof(T));
  for (int64_t r = rb; r < re; ++r) {
    // float rows are read and written in place; 16-bit ones widened into buf and back
    const A* v = buf;
    A* out = buf;
    if constexpr (std::is_same_v<T, A>) {
      v = reinterpret_cast<const A*>(a.x + r * n * sz);
      if (a.y16 == kFloat32) out = reinterpret_cast<A*>(a.y + r * n * sz);
    } else {
      load_acc<T>(a.x + r * n * sz, sz, buf, n);
    }
    A lane[kLanes] = {}, tail = 0;
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (int k = 0; k < kLanes; ++k) lane[k] += v[i + k];
    for (; i < n; ++i) tail += v[i];
    const A mu = (fold(lane) + tail) / A(n);
    for (int k = 0; k < kLanes; ++k) lane[k] = 0;
    tail = 0;
    for (i = 0; i + kLanes <= n; i += kLanes)
      for (int k = 0; k < kLanes; ++k) lane[k] += (v[i + k] - mu) * (v[i + k] - mu);
    for (; i < n; ++i) tail += (v[i] - mu) * (v[i] - mu);
    const A rs = A(1) / std::sqrt((fold(lane) + tail) / A(n) + a.eps);
    if (a.w && a.b)
      for (i = 0; i < n; ++i) out[i] = (v[i] - mu) * rs * a.w[i] + a.b[i];
    else if (a.w)
      for (i = 0; i < n; ++i) out[i] = (v[i] - mu) * rs * a.w[i];
    else if (a.b)
      for (i = 0; i < n; ++i) out[i] = (v[i] - mu) * rs + a.b[i];
    else
      for (i = 0; i < n; ++i) out[i] = (v[i] - mu) * rs;
    if constexpr (!std::is_same_v<T, A>) store_acc<T>(buf, a.y + r * n * sz, sz, n);
    else if constexpr (std::is_same_v<T, float>)
      if (a.y16 != kFloat32) store_row16(buf, a.y, a.y16, r, n);
    a.mean[r] = mu;
    a.rstd[r] = rs;
  }
}

// What the backward reads and writes: rows of the output gradient and x, the saved mean and
// rstd, the widened weight (all ones without one); grad_in's rows (or null).
template <class T>
struct LnBackward {
  using A = acc_type_t<T>;
  const char* g;
  const char* x;
  char* gi;
  const A* w;
  const A* mean;
  const A* rstd;
  int64_t inner;
  DType g16 = kFloat32;  // float rows: g in this 16-bit dtype instead (else kFloat32)
};

// A task's buffers: one row of the gradient and of x (used only for 16-bit rows, which are
// widened into them), and the running column sums of g * x hat and g over up to
// kBlockRows rows (never null: a caller that does not want one passes a scratch row).
template <class A>
struct LnScratch {
  A* g;
  A* xh;
  A* bw;
  A* bb;
};

// Rows r0..r1 of one chunk, whose partial weight and bias gradients are tw and tb (null
// when not wanted). w is the widened weight, all ones when the norm has none. Two passes
// over each row, both in L1: the first accumulates the column sums and the row's two
// means, the second writes dx from g and x again, so no row-sized temporary is written
// (separate passes would each read or write the row again).
template <class T>
[[gnu::always_inline]] inline void ln_backward_rows(const LnBackward<T>& a, int64_t r0, int64_t r1,
                                                    acc_type_t<T>* tw, acc_type_t<T>* tb,
                                                    const LnScratch<acc_type_t<T>>& s) {
  using A = acc_type_t<T>;
  constexpr int64_t kBlockRows = 128;  // rows summed plainly before joining the chunk total
  const int64_t n = a.inner, sz = int64_t(sizeof(T));
  const A* w = a.w;
  A* bw = s.bw;
  A* bb = s.bb;
  for (int64_t r = r0; r < r1; ++r) {
    const A* g = s.g;
    const A* x = s.xh;
    if constexpr (std::is_same_v<T, A>) {
      g = reinterpret_cast<const A*>(a.g + r * n * sz);
      x = reinterpret_cast<const A*>(a.x + r * n * sz);
      if constexpr (std::is_same_v<T, float>)
        if (a.g16 != kFloat32) load_row16(a.g, a.g16, r, n, s.g), g = s.g;
    } else {
      load_acc<T>(a.g + r * n * sz, sz, s.g, n);
      load_acc<T>(a.x + r * n * sz, sz, s.xh, n);
    }
    const A mu = a.mean[r], rs = a.rstd[r];
    // pass 1: bw += g * xhat, bb += g, and the sums of wg * xhat and wg (wg = weight * g)
    A l1[kLanes] = {}, l2[kLanes] = {}, t1 = 0, t2 = 0;
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (int k = 0; k < kLanes; ++k) {
        const A xh = (x[i + k] - mu) * rs, gv = g[i + k], wg = gv * w[i + k];
        bw[i + k] += gv * xh;
        bb[i + k] += gv;
        l1[k] += wg * xh;
        l2[k] += wg;
      }
    for (; i < n; ++i) {
      const A xh = (x[i] - mu) * rs, gv = g[i], wg = gv * w[i];
      bw[i] += gv * xh;
      bb[i] += gv;
      t1 += wg * xh;
      t2 += wg;
    }
    if ((r - r0) % kBlockRows == kBlockRows - 1 || r == r1 - 1) {
      if (tw)
        for (i = 0; i < n; ++i) tw[i] += bw[i];
      if (tb)
        for (i = 0; i < n; ++i) tb[i] += bb[i];
      for (i = 0; i < n; ++i) bw[i] = 0, bb[i] = 0;
    }
    if (!a.gi) continue;
    // pass 2: dx = rstd * (wg - mean(wg) - xhat * mean(wg * xhat))
    const A c1 = (fold(l1) + t1) / A(n), c2 = (fold(l2) + t2) / A(n);
    A* dx = std::is_same_v<T, A> ? reinterpret_cast<A*>(a.gi + r * n * sz) : s.g;
    for (i = 0; i < n; ++i) dx[i] = rs * (g[i] * w[i] - c2 - (x[i] - mu) * rs * c1);
    if constexpr (!std::is_same_v<T, A>) store_acc<T>(s.g, a.gi + r * n * sz, sz, n);
  }
}

template <class T>
AG_AVX512_TARGET void ln_forward_avx512(const LnForward<T>& a, int64_t rb,
                                                                                    int64_t re, float* buf) {
  ln_forward_rows<T>(a, rb, re, buf);
}
template <class T>
AG_AVX512_TARGET void ln_backward_avx512(
    const LnBackward<T>& a, int64_t r0, int64_t r1, float* tw, float* tb, const LnScratch<float>& s) {
  ln_backward_rows<T>(a, r0, r1, tw, tb, s);
}

// The rows in the variant of the kernels' level (float accumulation); double is compiled once.
template <class T>
void run_ln_forward(const LnForward<T>& a, int64_t rb, int64_t re, acc_type_t<T>* buf) {
  if constexpr (std::is_same_v<acc_type_t<T>, float>)
    run_variant<ln_forward_rows<T>, ln_forward_avx512<T>>(a, rb, re, buf);
  else ln_forward_rows<T>(a, rb, re, buf);
}

template <class T>
void run_ln_backward(const LnBackward<T>& a, int64_t r0, int64_t r1, acc_type_t<T>* tw, acc_type_t<T>* tb,
                     const LnScratch<acc_type_t<T>>& s) {
  if constexpr (std::is_same_v<acc_type_t<T>, float>)
    run_variant<ln_backward_rows<T>, ln_backward_avx512<T>>(a, r0, r1, tw, tb, s);
  else ln_backward_rows<T>(a, r0, r1, tw, tb, s);
}

}  // namespace

void CpuBackend::softmax(const Tensor& x, int64_t dim, bool log, const Tensor& out) {
  const Split3 s(x.sizes(), dim);
  if (x.numel() == 0) return;
  dispatch_floating(x.dtype(), log ? op::log_softmax : op::softmax, [&]<class T>() {
    using A = acc_type_t<T>;
    for_each_block<T, 1>(s, {&x}, out, [&](A** b, int64_t n, int64_t w, A* scratch) {
      if (log) run_softmax_block<true>(b[0], n, w, scratch);
      else run_softmax_block<false>(b[0], n, w, scratch);
    });
  });
}

void CpuBackend::softmax_backward(const Tensor& grad_out, const Tensor& y, int64_t dim, bool log,
                                  const Tensor& grad_in) {
  const Split3 s(y.sizes(), dim);
  if (y.numel() == 0) return;
  dispatch_floating(y.dtype(), log ? op::log_softmax : op::softmax, [&]<class T>() {
    using A = acc_type_t<T>;
    for_each_block<T, 2>(s, {&grad_out, &y}, grad_in, [&](A** b, int64_t n, int64_t w, A* scratch) {
      if (log) run_softmax_backward_block<true>(b[0], b[1], n, w, scratch);
      else run_softmax_backward_block<false>(b[0], b[1], n, w, scratch);
    });
  });
}

void CpuBackend::layer_norm(const Tensor& x, int64_t inner, const Tensor& weight, const Tensor& bias,
                            double eps, const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  const int64_t rows = inner > 0 ? x.numel() / inner : 0;
  if (x.numel() == 0) return;
  dispatch_floating(x.dtype(), op::layer_norm, [&]<class T>() {
    using A = acc_type_t<T>;
    const int64_t sz = int64_t(sizeof(T));
    std::vector<A> w, b;  // widened once, shared by all rows
    if (weight.defined())
      w.resize(size_t(inner)), load_acc<T>(static_cast<const char*>(weight.raw_data()), sz, w.data(), inner);
    if (bias.defined())
      b.resize(size_t(inner)), load_acc<T>(static_cast<const char*>(bias.raw_data()), sz, b.data(), inner);
    LnForward<T> a{static_cast<const char*>(x.raw_data()), static_cast<char*>(y.raw_data()),
                   w.empty() ? nullptr : w.data(), b.empty() ? nullptr : b.data(),
                   static_cast<A*>(mean.raw_data()), static_cast<A*>(rstd.raw_data()), inner, A(eps)};
    if (y.dtype() != x.dtype()) a.y16 = y.dtype();  // float32 x, 16-bit y (layer_norm_narrows)
    parallel_for(0, rows, std::max<int64_t>(1, kGrain / inner), [&](int64_t rb, int64_t re) {
      std::vector<A> v(static_cast<size_t>(inner));
      run_ln_forward(a, rb, re, v.data());
    });
  });
}

void CpuBackend::layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean,
                                     const Tensor& rstd, const Tensor& weight, const Tensor& grad_in,
                                     const Tensor& grad_w, const Tensor& grad_b) {
  const int64_t rows = mean.numel();
  const int64_t inner = layer_norm_inner(x, mean, grad_w, grad_b);
  dispatch_floating(x.dtype(), op::layer_norm, [&]<class T>() {
    using A = acc_type_t<T>;
    const int64_t sz = int64_t(sizeof(T));
    if (inner == 0 || rows == 0) {  // empty rows: parameter gradients are zero
      std::vector<A> z(size_t(inner), A(0));
      if (grad_w.defined()) store_acc<T>(z.data(), static_cast<char*>(grad_w.raw_data()), sz, inner);
      if (grad_b.defined()) store_acc<T>(z.data(), static_cast<char*>(grad_b.raw_data()), sz, inner);
      return;
    }
    std::vector<A> w(size_t(inner), A(1));  // ones without a weight: the rows multiply unconditionally
    if (weight.defined()) load_acc<T>(static_cast<const char*>(weight.raw_data()), sz, w.data(), inner);
    const bool want_w = grad_w.defined(), want_b = grad_b.defined(), want_x = grad_in.defined();
    // Chunks of rows each own a partial [inner] sum for grad_w and grad_b; the number of
    // chunks depends only on the shape.
    const int64_t chunks = std::clamp<int64_t>(rows * inner / 32768, 1, std::min<int64_t>(rows, 64));
    std::vector<A> pw(want_w ? size_t(chunks * inner) : 0, A(0)), pb(want_b ? size_t(chunks * inner) : 0, A(0));
    LnBackward<T> a{static_cast<const char*>(grad_out.raw_data()), static_cast<const char*>(x.raw_data()),
                    want_x ? static_cast<char*>(grad_in.raw_data()) : nullptr, w.data(),
                    static_cast<const A*>(mean.raw_data()), static_cast<const A*>(rstd.raw_data()), inner};
    if (grad_out.dtype() != x.dtype()) a.g16 = grad_out.dtype();  // float32 x, 16-bit g
    parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
      // rows of 16-bit g and x widened (unused for float), and the block column sums
      std::vector<A> g(std::is_same_v<T, A> && a.g16 == kFloat32 ? 0 : size_t(inner)),
          xv(std::is_same_v<T, A> ? 0 : size_t(inner)), bw(size_t(inner), A(0)), bb(size_t(inner), A(0));
      const LnScratch<A> sc{g.data(), xv.data(), bw.data(), bb.data()};
      for (int64_t c = cb; c < ce; ++c)
        run_ln_backward(a, rows * c / chunks, rows * (c + 1) / chunks, want_w ? pw.data() + c * inner : nullptr,
                        want_b ? pb.data() + c * inner : nullptr, sc);
    });
    // Partial sums join in chunk order.
    for (int pass = 0; pass < 2; ++pass) {
      const Tensor& dst = pass == 0 ? grad_w : grad_b;
      std::vector<A>& part = pass == 0 ? pw : pb;
      if (!dst.defined()) continue;
      for (int64_t c = 1; c < chunks; ++c)
        for (int64_t i = 0; i < inner; ++i) part[size_t(i)] += part[size_t(c * inner + i)];
      store_acc<T>(part.data(), static_cast<char*>(dst.raw_data()), sz, inner);
    }
  });
}

}  // namespace ampgrad::cpu
