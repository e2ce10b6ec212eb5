// Softmax / log-softmax and layer norm on the CPU, forward and backward.
//
// Inputs are contiguous (the frontend makes them so). Softmax views x as [outer, n, inner]
// around dim: with inner == 1 (the last dim, the common case) each row is contiguous and
// is widened into a per-thread float buffer once; otherwise a block of up to 16
// neighbouring columns is widened row by row, every read a contiguous slice, and the math
// vectorises across the columns. Rows subtract their max before exponentiating, with
// exp_acc (vec.h) so that the exp loops vectorise.
//
// Layer norm normalises rows of `inner` elements. Statistics are two-pass (mean, then the
// mean squared deviation) in the accumulation type, and mean and rstd are saved per row
// (float32, or float64 for float64 x). Backward computes grad_in per row, and the weight
// and bias gradients as per-chunk partial sums over rows that are added in a fixed order
// afterwards: no races, and the same result for any thread count.
// float16/bfloat16 are computed in float32 throughout.
#include <array>
#include <cmath>
#include <limits>
#include <vector>

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
void softmax_block(A* v, int64_t n, int64_t w, A* scratch) {
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
void softmax_backward_block(A* g, const A* y, int64_t n, int64_t w, A* scratch) {
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

}  // namespace

void CpuBackend::softmax(const Tensor& x, int64_t dim, bool log, const Tensor& out) {
  const Split3 s(x.sizes(), dim);
  if (x.numel() == 0) return;
  dispatch_floating(x.dtype(), log ? "log_softmax" : "softmax", [&]<class T>() {
    using A = acc_type_t<T>;
    for_each_block<T, 1>(s, {&x}, out, [&](A** b, int64_t n, int64_t w, A* scratch) {
      if (log) softmax_block<true>(b[0], n, w, scratch);
      else softmax_block<false>(b[0], n, w, scratch);
    });
  });
}

void CpuBackend::softmax_backward(const Tensor& grad_out, const Tensor& y, int64_t dim, bool log,
                                  const Tensor& grad_in) {
  const Split3 s(y.sizes(), dim);
  if (y.numel() == 0) return;
  dispatch_floating(y.dtype(), log ? "log_softmax" : "softmax", [&]<class T>() {
    using A = acc_type_t<T>;
    for_each_block<T, 2>(s, {&grad_out, &y}, grad_in, [&](A** b, int64_t n, int64_t w, A* scratch) {
      if (log) softmax_backward_block<true>(b[0], b[1], n, w, scratch);
      else softmax_backward_block<false>(b[0], b[1], n, w, scratch);
    });
  });
}

void CpuBackend::layer_norm(const Tensor& x, int64_t inner, const Tensor& weight, const Tensor& bias,
                            double eps, const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  const int64_t rows = inner > 0 ? x.numel() / inner : 0;
  if (x.numel() == 0) return;
  dispatch_floating(x.dtype(), "layer_norm", [&]<class T>() {
    using A = acc_type_t<T>;
    const int64_t sz = int64_t(sizeof(T));
    std::vector<A> w, b;  // widened once, shared by all rows
    if (weight.defined()) w.resize(size_t(inner)), load_acc<T>(static_cast<const char*>(weight.raw_data()), sz, w.data(), inner);
    if (bias.defined()) b.resize(size_t(inner)), load_acc<T>(static_cast<const char*>(bias.raw_data()), sz, b.data(), inner);
    const char* xp = static_cast<const char*>(x.raw_data());
    char* yp = static_cast<char*>(y.raw_data());
    A* mp = static_cast<A*>(mean.raw_data());
    A* rp = static_cast<A*>(rstd.raw_data());
    parallel_for(0, rows, std::max<int64_t>(1, kGrain / inner), [&](int64_t rb, int64_t re) {
      std::vector<A> v(static_cast<size_t>(inner));
      for (int64_t r = rb; r < re; ++r) {
        load_acc<T>(xp + r * inner * sz, sz, v.data(), inner);
        const A mu = lane_sum<A>(inner, [&](int64_t i) { return v[size_t(i)]; }) / A(inner);
        const A var = lane_sum<A>(inner, [&](int64_t i) {
                        const A d = v[size_t(i)] - mu;
                        return d * d;
                      }) / A(inner);
        const A rs = A(1) / std::sqrt(var + A(eps));
        for (int64_t i = 0; i < inner; ++i) {
          A t = (v[size_t(i)] - mu) * rs;
          if (!w.empty()) t *= w[size_t(i)];
          if (!b.empty()) t += b[size_t(i)];
          v[size_t(i)] = t;
        }
        store_acc<T>(v.data(), yp + r * inner * sz, sz, inner);
        mp[r] = mu;
        rp[r] = rs;
      }
    });
  });
}

void CpuBackend::layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean,
                                     const Tensor& rstd, const Tensor& weight, const Tensor& grad_in,
                                     const Tensor& grad_w, const Tensor& grad_b) {
  const int64_t rows = mean.numel();
  const int64_t inner = grad_w.defined()   ? grad_w.numel()
                        : grad_b.defined() ? grad_b.numel()
                        : rows > 0         ? x.numel() / rows
                                           : 0;
  dispatch_floating(x.dtype(), "layer_norm", [&]<class T>() {
    using A = acc_type_t<T>;
    const int64_t sz = int64_t(sizeof(T));
    if (inner == 0 || rows == 0) {  // empty rows: parameter gradients are zero
      std::vector<A> z(size_t(inner), A(0));
      if (grad_w.defined()) store_acc<T>(z.data(), static_cast<char*>(grad_w.raw_data()), sz, inner);
      if (grad_b.defined()) store_acc<T>(z.data(), static_cast<char*>(grad_b.raw_data()), sz, inner);
      return;
    }
    std::vector<A> w;
    if (weight.defined()) w.resize(size_t(inner)), load_acc<T>(static_cast<const char*>(weight.raw_data()), sz, w.data(), inner);
    const bool want_w = grad_w.defined(), want_b = grad_b.defined(), want_x = grad_in.defined();
    const char* gp = static_cast<const char*>(grad_out.raw_data());
    const char* xp = static_cast<const char*>(x.raw_data());
    char* gip = want_x ? static_cast<char*>(grad_in.raw_data()) : nullptr;
    const A* mp = static_cast<const A*>(mean.raw_data());
    const A* rp = static_cast<const A*>(rstd.raw_data());
    // Chunks of rows each own a partial [inner] sum for grad_w and grad_b; the number of
    // chunks depends only on the shape.
    const int64_t chunks = std::clamp<int64_t>(rows * inner / 32768, 1, std::min<int64_t>(rows, 64));
    std::vector<A> pw(want_w ? size_t(chunks * inner) : 0, A(0)), pb(want_b ? size_t(chunks * inner) : 0, A(0));
    parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
      std::vector<A> g(static_cast<size_t>(inner)), xv(static_cast<size_t>(inner)), bw, bb;
      constexpr int64_t kBlockRows = 128;  // rows summed plainly before joining the chunk total
      if (want_w) bw.assign(size_t(inner), A(0));
      if (want_b) bb.assign(size_t(inner), A(0));
      for (int64_t c = cb; c < ce; ++c) {
        const int64_t r0 = rows * c / chunks, r1 = rows * (c + 1) / chunks;
        A* tw = want_w ? pw.data() + c * inner : nullptr;
        A* tb = want_b ? pb.data() + c * inner : nullptr;
        for (int64_t r = r0; r < r1; ++r) {
          load_acc<T>(gp + r * inner * sz, sz, g.data(), inner);
          load_acc<T>(xp + r * inner * sz, sz, xv.data(), inner);
          const A mu = mp[r], rs = rp[r];
          for (int64_t i = 0; i < inner; ++i) xv[size_t(i)] = (xv[size_t(i)] - mu) * rs;  // x hat
          if (want_w)
            for (int64_t i = 0; i < inner; ++i) bw[size_t(i)] += g[size_t(i)] * xv[size_t(i)];
          if (want_b)
            for (int64_t i = 0; i < inner; ++i) bb[size_t(i)] += g[size_t(i)];
          if ((r - r0) % kBlockRows == kBlockRows - 1 || r == r1 - 1) {
            for (int64_t i = 0; i < inner && want_w; ++i) tw[i] += bw[size_t(i)], bw[size_t(i)] = 0;
            for (int64_t i = 0; i < inner && want_b; ++i) tb[i] += bb[size_t(i)], bb[size_t(i)] = 0;
          }
          if (!want_x) continue;
          // dx = rstd * (wg - mean(wg) - xhat * mean(wg * xhat)), wg = weight * g
          if (!w.empty())
            for (int64_t i = 0; i < inner; ++i) g[size_t(i)] *= w[size_t(i)];
          const A c1 = lane_sum<A>(inner, [&](int64_t i) { return g[size_t(i)] * xv[size_t(i)]; }) / A(inner);
          const A c2 = lane_sum<A>(inner, [&](int64_t i) { return g[size_t(i)]; }) / A(inner);
          for (int64_t i = 0; i < inner; ++i) g[size_t(i)] = rs * (g[size_t(i)] - c2 - xv[size_t(i)] * c1);
          store_acc<T>(g.data(), gip + r * inner * sz, sz, inner);
        }
      }
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
