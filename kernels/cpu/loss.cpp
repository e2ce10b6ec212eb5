// Cross entropy with class-index targets on the CPU: log-softmax and NLL in one pass per
// position, forward and backward (the Backend entries cross_entropy and
// cross_entropy_backward; backend.h has their contract).
//
// x is contiguous, read as [outer, C, inner]; a position is one (outer, inner) pair and
// owns the C logits of its class dim. Like softmax (norm.cpp):
//   inner == 1  each position's row is contiguous: float32 and float64 rows are read in
//               place, 16-bit rows are widened into a per-thread float buffer once; max,
//               then the sum of exp(x - max) in chunks of 256 so that exp_acc vectorises;
//   inner > 1   a block of up to 16 neighbouring positions is widened row by row (each
//               read a contiguous slice), and the math vectorises across the positions.
// float16/bfloat16 are computed in float32, float64 in double. lse = max + log(sum) is
// saved per position; backward is elementwise from it: g * exp(x - lse) - g * ls / C, with
// g * (1 - ls) taken off at the target class, and zeros at ignored positions; values below
// the smallest normal float become zero (flush_denormal).
//
// A bad target (neither ignore_index nor in [0, C)) cannot throw inside the parallel
// region: threads record the lowest bad position, and the kernel throws for it after the
// region, so the message names the first bad target in order.
//
// Reference: kernels/reference/include/ampgrad/reference/loss.h (float64, the specification).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/avx512.h"
#include "cpu/cpu_backend.h"
#include "cpu/parallel.h"
#include "cpu/rows.h"
#include "cpu/vec.h"

namespace ampgrad::cpu {
namespace {

constexpr int64_t kCols = 16;  // positions handled together when inner > 1
constexpr int64_t kNoBad = std::numeric_limits<int64_t>::max();

// Keeps the lowest bad position seen by any thread.
void note_bad(std::atomic<int64_t>& first, int64_t p) {
  int64_t cur = first.load(std::memory_order_relaxed);
  while (p < cur && !first.compare_exchange_weak(cur, p, std::memory_order_relaxed)) {
  }
}

// What a loss needs to know about one call.
struct Params {
  int64_t C, inner, ignore;
  double ls;
};

// The loss of one position from its max m, log of the sum of exp(x - m), logit of the
// target class xt and mean logit xbar (used only when ls > 0): (lse - x) written as
// (m - x) + log_sum, exact near the max.
template <class A>
A position_loss(A m, A log_sum, A xt, A xbar, double ls) {
  const A nll = (m - xt) + log_sum;
  if (ls == 0) return nll;
  return A(1 - ls) * nll + A(ls) * ((m - xbar) + log_sum);
}

// True for a target that names a class; records a bad one (not ignore_index either).
inline bool valid_target(int64_t t, int64_t p, const Params& q, std::atomic<int64_t>& bad) {
  if (t == q.ignore) return false;
  if (t < 0 || t >= q.C) {
    note_bad(bad, p);
    return false;
  }
  return true;
}

// ---- forward ------------------------------------------------------------------------------

// Rows rb..re of the forward; inlined into each ISA variant (forward_rows below).
template <class T>
[[gnu::always_inline]] inline void forward_range(const T* x, const int64_t* tp, T* loss, acc_type_t<T>* lse,
                                                 int64_t rb, int64_t re, const Params& q, std::atomic<int64_t>& bad) {
  using A = acc_type_t<T>;
  const int64_t C = q.C;
  std::vector<A> buf(std::is_same_v<T, A> ? 0 : size_t(C));
  A t[256];
  for (int64_t r = rb; r < re; ++r) {
    const A* v;
    if constexpr (std::is_same_v<T, A>) {
      v = x + r * C;
    } else {
      load_acc<T>(reinterpret_cast<const char*>(x + r * C), int64_t(sizeof(T)), buf.data(), C);
      v = buf.data();
    }
    const A m = row_max(v, C);  // a NaN row gives NaN through exp below
    A sum = 0;
    for (int64_t c = 0; c < C; c += 256) {
      const int64_t k = std::min<int64_t>(256, C - c);
      for (int64_t i = 0; i < k; ++i) t[i] = exp_acc(v[c + i] - m);
      sum += lane_sum<A>(k, [&](int64_t i) { return t[i]; });
    }
    const A log_sum = std::log(sum);
    lse[r] = m + log_sum;
    const int64_t tg = tp[r];
    A l = 0;
    if (valid_target(tg, r, q, bad)) {
      const A xbar = q.ls > 0 ? lane_sum<A>(C, [&](int64_t i) { return v[i]; }) / A(C) : A(0);
      l = position_loss<A>(m, log_sum, v[tg], xbar, q.ls);
    }
    loss[r] = cast<T>(l);
  }
}

// inner > 1: task (o, block of w <= kCols positions starting at i0); the block holds
// element (c, j) at b[c * w + j].
template <class T>
void forward_cols(const T* x, const int64_t* tp, T* loss, acc_type_t<T>* lse, int64_t outer, const Params& q,
                  std::atomic<int64_t>& bad) {
  using A = acc_type_t<T>;
  const int64_t C = q.C, inner = q.inner, W = std::min(kCols, inner);
  const int64_t nblk = (inner + W - 1) / W, sz = int64_t(sizeof(T));
  parallel_for(0, outer * nblk, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, C * W)), [&](int64_t tb, int64_t te) {
    std::vector<A> b(size_t(C * W));
    A m[kCols], sum[kCols], sx[kCols];
    for (int64_t task = tb; task < te; ++task) {
      const int64_t o = task / nblk, i0 = (task % nblk) * W, w = std::min(W, inner - i0);
      const char* base = reinterpret_cast<const char*>(x + o * C * inner + i0);
      for (int64_t c = 0; c < C; ++c) load_acc<T>(base + c * inner * sz, sz, b.data() + c * w, w);
      for (int64_t j = 0; j < w; ++j) m[j] = -std::numeric_limits<A>::infinity(), sum[j] = 0, sx[j] = 0;
      for (int64_t c = 0; c < C; ++c)
        for (int64_t j = 0; j < w; ++j) m[j] = b[size_t(c * w + j)] > m[j] ? b[size_t(c * w + j)] : m[j];
      for (int64_t c = 0; c < C; ++c)
        for (int64_t j = 0; j < w; ++j) sum[j] += exp_acc(b[size_t(c * w + j)] - m[j]);
      if (q.ls > 0)
        for (int64_t c = 0; c < C; ++c)
          for (int64_t j = 0; j < w; ++j) sx[j] += b[size_t(c * w + j)];
      for (int64_t j = 0; j < w; ++j) {
        const int64_t p = o * inner + i0 + j, tg = tp[p];
        const A log_sum = std::log(sum[j]);
        lse[p] = m[j] + log_sum;
        A l = 0;
        if (valid_target(tg, p, q, bad)) l = position_loss<A>(m[j], log_sum, b[size_t(tg * w + j)], sx[j] / A(C), q.ls);
        loss[p] = cast<T>(l);
      }
    }
  });
}

// ---- backward -----------------------------------------------------------------------------

// The gradient flushes values below the smallest normal float to zero, as exp_acc does its
// results: a confident model's probabilities times 1 / N (mean reduction) can fall into the
// denormals, and a product that reads them runs many times slower on x86 (microcode assists
// on denormal operands), and a GPT head's weight gradient reads this gradient whole.
// The change is under FLT_MIN (1.2e-38) in absolute value; NaN passes.
template <class A>
[[gnu::always_inline]] inline A flush_denormal(A v) {
  return std::abs(v) < std::numeric_limits<A>::min() ? A(0) : v;
}

// Rows rb..re of the backward; inlined into each ISA variant (backward_rows below).
template <class T>
[[gnu::always_inline]] inline void backward_range(const T* go, const T* x, const int64_t* tp, const acc_type_t<T>* lse,
                                                  T* gx, int64_t rb, int64_t re, const Params& q) {
  using A = acc_type_t<T>;
  const int64_t C = q.C;
  std::vector<A> vin(std::is_same_v<T, A> ? 0 : size_t(C)), vout(std::is_same_v<T, A> ? 0 : size_t(C));
  for (int64_t r = rb; r < re; ++r) {
    const int64_t tg = tp[r];
    A* out;
    if constexpr (std::is_same_v<T, A>) out = gx + r * C;
    else out = vout.data();
    if (tg == q.ignore) {
      std::fill(out, out + C, A(0));
    } else {
      const A* v;
      if constexpr (std::is_same_v<T, A>) {
        v = x + r * C;
      } else {
        load_acc<T>(reinterpret_cast<const char*>(x + r * C), int64_t(sizeof(T)), vin.data(), C);
        v = vin.data();
      }
      const A g = cast<A>(go[r]), l = lse[r], gs = g * A(q.ls / double(C));
      for (int64_t i = 0; i < C; ++i) out[i] = flush_denormal(g * exp_acc(v[i] - l) - gs);
      if (tg >= 0 && tg < C) out[tg] -= g * A(1 - q.ls);
    }
    if constexpr (!std::is_same_v<T, A>) store_acc<T>(out, reinterpret_cast<char*>(gx + r * C), int64_t(sizeof(T)), C);
  }
}

// ---- the row ranges in the variant of the kernels' level --------------------------------------
// The library is built for baseline x86-64, where exp_acc runs 4 floats wide; the float
// rows are also compiled for AVX-512 (target attribute, as layer norm's and attention's row
// work) and picked by the kernels' level (cpu/isa.h). No contraction either way, and the
// lanes of the sums are fixed (rows.h), so both variants give the same bits.
template <class T>
AG_AVX512_TARGET void forward_range_avx512(const T* x, const int64_t* tp, T* loss, float* lse, int64_t rb, int64_t re,
                                           const Params& q, std::atomic<int64_t>& bad) {
  forward_range<T>(x, tp, loss, lse, rb, re, q, bad);
}
template <class T>
AG_AVX512_TARGET void backward_range_avx512(const T* go, const T* x, const int64_t* tp, const float* lse, T* gx,
                                            int64_t rb, int64_t re, const Params& q) {
  backward_range<T>(go, x, tp, lse, gx, rb, re, q);
}

template <class T>
void forward_rows(const T* x, const int64_t* tp, T* loss, acc_type_t<T>* lse, int64_t rows, const Params& q,
                  std::atomic<int64_t>& bad) {
  parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, q.C)), [&](int64_t rb, int64_t re) {
    if constexpr (std::is_same_v<acc_type_t<T>, float>)
      run_variant<forward_range<T>, forward_range_avx512<T>>(x, tp, loss, lse, rb, re, q, bad);
    else forward_range<T>(x, tp, loss, lse, rb, re, q, bad);
  });
}

template <class T>
void backward_rows(const T* go, const T* x, const int64_t* tp, const acc_type_t<T>* lse, T* gx, int64_t rows,
                   const Params& q) {
  parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, q.C)), [&](int64_t rb, int64_t re) {
    if constexpr (std::is_same_v<acc_type_t<T>, float>)
      run_variant<backward_range<T>, backward_range_avx512<T>>(go, x, tp, lse, gx, rb, re, q);
    else backward_range<T>(go, x, tp, lse, gx, rb, re, q);
  });
}

template <class T>
void backward_cols(const T* go, const T* x, const int64_t* tp, const acc_type_t<T>* lse, T* gx, int64_t outer,
                   const Params& q) {
  using A = acc_type_t<T>;
  const int64_t C = q.C, inner = q.inner, W = std::min(kCols, inner);
  const int64_t nblk = (inner + W - 1) / W, sz = int64_t(sizeof(T));
  parallel_for(0, outer * nblk, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, C * W)), [&](int64_t tb, int64_t te) {
    std::vector<A> b(size_t(C * W));
    A g[kCols], gs[kCols], l[kCols];
    for (int64_t task = tb; task < te; ++task) {
      const int64_t o = task / nblk, i0 = (task % nblk) * W, w = std::min(W, inner - i0), p0 = o * inner + i0;
      const int64_t first = (o * C * inner + i0) * sz;  // byte offset of (o, 0, i0)
      for (int64_t c = 0; c < C; ++c)
        load_acc<T>(reinterpret_cast<const char*>(x) + first + c * inner * sz, sz, b.data() + c * w, w);
      for (int64_t j = 0; j < w; ++j) {
        g[j] = cast<A>(go[p0 + j]);
        gs[j] = g[j] * A(q.ls / double(C));
        l[j] = lse[p0 + j];
      }
      for (int64_t c = 0; c < C; ++c)
        for (int64_t j = 0; j < w; ++j)
          b[size_t(c * w + j)] = flush_denormal(g[j] * exp_acc(b[size_t(c * w + j)] - l[j]) - gs[j]);
      for (int64_t j = 0; j < w; ++j) {
        const int64_t tg = tp[p0 + j];
        if (tg == q.ignore)
          for (int64_t c = 0; c < C; ++c) b[size_t(c * w + j)] = 0;
        else if (tg >= 0 && tg < C)
          b[size_t(tg * w + j)] -= g[j] * A(1 - q.ls);
      }
      for (int64_t c = 0; c < C; ++c)
        store_acc<T>(b.data() + c * w, reinterpret_cast<char*>(gx) + first + c * inner * sz, sz, w);
    }
  });
}

}  // namespace

void CpuBackend::cross_entropy(const Tensor& x, int64_t classes, int64_t inner, const Tensor& target,
                               int64_t ignore_index, double label_smoothing, const Tensor& loss, const Tensor& lse) {
  const int64_t positions = target.numel();
  if (positions == 0) return;
  const int64_t outer = positions / inner;
  const Params q{classes, inner, ignore_index, label_smoothing};
  const int64_t* tp = target.data_ptr<int64_t>();
  std::atomic<int64_t> bad{kNoBad};
  dispatch_floating(x.dtype(), op::cross_entropy, [&]<class T>() {
    using A = acc_type_t<T>;
    const T* xp = static_cast<const T*>(x.raw_data());
    T* lp = static_cast<T*>(loss.raw_data());
    A* sp = static_cast<A*>(lse.raw_data());
    if (inner == 1) forward_rows<T>(xp, tp, lp, sp, outer, q, bad);
    else forward_cols<T>(xp, tp, lp, sp, outer, q, bad);
  });
  const int64_t p = bad.load();
  if (p != kNoBad)
    AG_ERROR(op::cross_entropy, "target ", tp[p], " is out of range for ", classes, " classes (expected [0, ",
             classes - 1, "] or ignore_index ", ignore_index, ")");
}

void CpuBackend::cross_entropy_backward(const Tensor& grad_loss, const Tensor& x, int64_t classes, int64_t inner,
                                        const Tensor& target, int64_t ignore_index, double label_smoothing,
                                        const Tensor& lse, const Tensor& grad_x) {
  const int64_t positions = target.numel();
  if (positions == 0 || classes == 0) return;
  const int64_t outer = positions / inner;
  const Params q{classes, inner, ignore_index, label_smoothing};
  dispatch_floating(x.dtype(), op::cross_entropy, [&]<class T>() {
    using A = acc_type_t<T>;
    const T* gp = static_cast<const T*>(grad_loss.raw_data());
    const T* xp = static_cast<const T*>(x.raw_data());
    const int64_t* tp = target.data_ptr<int64_t>();
    const A* sp = static_cast<const A*>(lse.raw_data());
    T* gxp = static_cast<T*>(grad_x.raw_data());
    if (inner == 1) backward_rows<T>(gp, xp, tp, sp, gxp, outer, q);
    else backward_cols<T>(gp, xp, tp, sp, gxp, outer, q);
  });
}

}  // namespace ampgrad::cpu
