// Reductions on the CPU: one driver for every ReduceOp and for max_min_dim.
//
// The input is first described by a ReduceLayout: size-1 dims dropped, the kept dims and the
// reduced dims listed apart, and neighbours in each list merged when their strides allow.
// Ops whose result does not depend on the order of the elements (all but ArgMax/ArgMin)
// also sort the reduced dims by stride, so a transposed input is still read in memory
// order. Then one of two layouts runs, neither of which transposes the data:
//   rows     the innermost reduced dim is contiguous: each output reduces runs along it
//            (pairwise sums over float chunks);
//   columns  some kept dim is contiguous (the [N, C] -> [C] bias gradient): a block of
//            outputs along it (up to kColBlock, so a bias gradient's rows are read whole
//            and in order) advances together over the reduced elements, each step
//            reading one contiguous slice into vectorisable per-column accumulators.
// Only when no dim has unit stride (stride-0 broadcasts, say) are short strided runs
// copied into a contiguous [kept..., reduced...] tensor first.
// Few outputs over many elements (a full sum) also split the reduced range into chunks
// whose partial states merge in order, the outputs' merges spread over the threads. The
// split depends only on the shape, so results never depend on the thread count.
//
// Accumulation is in acc_type_t (float for float32/float16/bfloat16, double for float64)
// and int64 for integral sums, never in 16 bits: pairwise within a chunk, Neumaier-
// compensated across chunks. Var and LogSumExp take two passes (mean or max first). Max
// and Min propagate NaN; ArgMax/ArgMin and max_min_dim return the first extreme's index
// (a NaN counts as the extreme), as a flat row-major index over the reduced dims.
//
// Reference: kernels/reference/include/ampgrad/reference/reduce.h (float64, the specification).
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "cpu/avx512.h"
#include "cpu/cpu_backend.h"
#include "cpu/loops.h"
#include "cpu/parallel.h"
#include "cpu/vec.h"

namespace ampgrad::cpu {
namespace {

// ---- layout -------------------------------------------------------------------------------

struct ReduceLayout {
  std::vector<int64_t> ksz, kst;  // kept dims, outer to inner, and their byte strides in x
  std::vector<int64_t> rsz, rst;  // reduced dims, outer to inner, and their byte strides
  int64_t M = 1;                  // outputs
  int64_t R = 1;                  // elements reduced into each output
  int64_t item = 1;
  const char* base = nullptr;
  int col = -1;  // columns layout: the contiguous kept dim; -1 for the rows layout
};

// Merges neighbours (a, b) of a dim list when b's stride times its size is a's stride.
void coalesce(std::vector<int64_t>& sz, std::vector<int64_t>& st) {
  size_t n = 0;
  for (size_t i = 0; i < sz.size(); ++i) {
    if (n > 0 && st[n - 1] == st[i] * sz[i]) {
      sz[n - 1] *= sz[i];
      st[n - 1] = st[i];
    } else {
      sz[n] = sz[i];
      st[n] = st[i];
      ++n;
    }
  }
  sz.resize(n);
  st.resize(n);
}

// The output is contiguous over the kept dims in their logical order, so merging kept dims
// never changes which output an element goes to; merging reduced dims keeps the flat
// reduced index. `order_free` lets the reduced dims be sorted by stride instead.
ReduceLayout make_layout(const Tensor& x, const Shape& dims, bool order_free) {
  AG_CHECK(x.dim() <= kMaxLoopDims, "reduce", "tensors of more than ", kMaxLoopDims,
           " dims are not supported, got ", x.dim());
  ReduceLayout p;
  p.item = int64_t(x.itemsize());
  p.base = static_cast<const char*>(x.raw_data());
  std::vector<char> red(size_t(x.dim()), 0);
  for (int64_t d : dims) red[size_t(d)] = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const int64_t sz = x.sizes()[size_t(d)], st = x.strides()[size_t(d)] * p.item;
    (red[size_t(d)] ? p.R : p.M) *= sz;
    if (sz == 1) continue;
    (red[size_t(d)] ? p.rsz : p.ksz).push_back(sz);
    (red[size_t(d)] ? p.rst : p.kst).push_back(st);
  }
  if (order_free && p.rsz.size() > 1) {
    std::vector<size_t> order(p.rsz.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    // Largest stride outermost; broadcast (stride-0) dims outermost of all.
    auto key = [&](size_t i) { return p.rst[i] == 0 ? std::numeric_limits<int64_t>::max() : std::abs(p.rst[i]); };
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) > key(b); });
    std::vector<int64_t> sz, st;
    for (size_t i : order) sz.push_back(p.rsz[i]), st.push_back(p.rst[i]);
    p.rsz = sz;
    p.rst = st;
  }
  coalesce(p.ksz, p.kst);
  coalesce(p.rsz, p.rst);
  return p;
}

// Offset (in the units of st) of the flat index i over the first n dims of (sz, st).
int64_t offset_of(int64_t i, const std::vector<int64_t>& sz, const std::vector<int64_t>& st,
                  size_t n) {
  int64_t off = 0;
  for (size_t d = n; d-- > 0;) {
    off += (i % sz[d]) * st[d];
    i /= sz[d];
  }
  return off;
}

// Walks the flat reduced indices [r0, r1) as runs along the innermost reduced dim, calling
// f(ptr, byte_stride, n, first_flat_index) for each.
template <class F>
void for_runs(const ReduceLayout& p, const char* base, int64_t r0, int64_t r1, const F& f) {
  const size_t nr = p.rsz.size();
  if (nr == 0) {  // nothing left to reduce: every output reads one element
    if (r0 < r1) f(base, p.item, r1 - r0, r0);
    return;
  }
  int64_t idx[kMaxLoopDims];
  int64_t rem = r0, off = 0;
  for (size_t d = nr; d-- > 0;) {
    idx[d] = rem % p.rsz[d];
    rem /= p.rsz[d];
    off += idx[d] * p.rst[d];
  }
  const int64_t L = p.rsz[nr - 1], Ls = p.rst[nr - 1];
  for (int64_t r = r0; r < r1;) {
    const int64_t n = std::min(L - idx[nr - 1], r1 - r);
    f(base + off, Ls, n, r);
    r += n;
    if (r >= r1) break;
    off += n * Ls;
    idx[nr - 1] += n;
    for (size_t d = nr - 1; d > 0 && idx[d] == p.rsz[d]; --d) {
      off += p.rst[d - 1] - p.rsz[d] * p.rst[d];
      idx[d] = 0;
      ++idx[d - 1];
    }
  }
}

// A plan, plus the contiguous copy it reads from when the input's layout needed one.
struct Prepared {
  ReduceLayout plan;
  Tensor copy;  // keeps the copied data alive
};

Prepared prepare(Backend& be, const Tensor& x, const Shape& dims, bool order_free) {
  Prepared pr{make_layout(x, dims, order_free), Tensor()};
  ReduceLayout& p = pr.plan;
  if (p.rsz.empty() || p.rst.back() == p.item) return pr;  // rows
  for (size_t i = p.ksz.size(); i-- > 0;)
    if (p.kst[i] == p.item) {
      p.col = int(i);
      return pr;
    }
  // Long strided runs (or a small tensor) are read in place; otherwise one copy makes the
  // reduced dims innermost and contiguous.
  if (p.rsz.back() >= 64 || p.M * p.R <= kGrain) return pr;
  Shape sizes, strides;
  for (size_t i = 0; i < p.ksz.size(); ++i) sizes.push_back(p.ksz[i]), strides.push_back(p.kst[i] / p.item);
  for (size_t i = 0; i < p.rsz.size(); ++i) sizes.push_back(p.rsz[i]), strides.push_back(p.rst[i] / p.item);
  Tensor view(std::make_shared<TensorImpl>(x.unsafe_impl()->storage, sizes, strides,
                                           x.storage_offset(), x.dtype()));
  pr.copy = make_tensor(sizes, x.dtype(), x.device());
  be.copy(view, pr.copy);
  p.ksz = {p.M};
  p.kst = {p.R * p.item};
  p.rsz = {p.R};
  p.rst = {p.item};
  if (p.M == 1) p.ksz.clear(), p.kst.clear();
  p.base = static_cast<const char*>(pr.copy.raw_data());
  return pr;
}

// ---- accumulation helpers -----------------------------------------------------------------

// Sum of f(v[i]): eight independent lanes over leaves of 256 (vectorisable; 32 additions
// per lane), halves recursively above, so the rounding error grows with log(n), not n.
template <class A, class F>
A tree_sum(const A* v, int64_t n, const F& f) {
  if (n > 256) {
    const int64_t h = (n / 2) & ~int64_t(7);
    return tree_sum(v, h, f) + tree_sum(v + h, n - h, f);
  }
  A lane[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) lane[k] += f(v[i + k]);
  A tail = 0;
  for (; i < n; ++i) tail += f(v[i]);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7])) +
         tail;
}

// Neumaier's compensated s += v (c collects the lost low-order bits).
template <class A>
inline void compensated_add(A& s, A& c, A v) {
  if constexpr (std::is_floating_point_v<A>) {
    const A t = s + v;
    if (std::abs(s) >= std::abs(v)) c += (s - t) + v;
    else c += (v - t) + s;
    s = t;
  } else {
    s += v;
  }
}

template <class A>
inline A compensated_value(A s, A c) {
  if constexpr (std::is_floating_point_v<A>) return std::isfinite(s) ? s + c : s;  // inf - inf in c
  else return s;
}

// ---- reducers --------------------------------------------------------------------------
//
// A reducer has a State per output with init / run (a contiguous buffer of values) /
// merge (a later state into an earlier one) / result, and a Block for the columns layout:
// per-column accumulators laid out as arrays so that a step over the slices of four
// consecutive reduced indices vectorises, flushed into the States every kColRows indices.

// Outputs that advance together in the columns layout. 2048, so that a bias gradient's rows
// (a [2048 x 1536] one, say) are read whole and in order rather than in short pieces of
// rows far apart, which the hardware prefetcher follows poorly. The accumulators and a
// 4-row float buffer take 40 KiB.
constexpr int64_t kColBlock = 2048;
constexpr int64_t kColRows = 128;   // steps summed plainly before a compensated flush

enum class SumKind { Sum, Mean, SqDev, ExpShift, AbsSum, SqSum, PowSum, NonZero };

// s[j] += (v[0][j] + v[1][j]) + (v[2][j] + v[3][j]): a column sum's step over four rows (a
// bias gradient's). The library is built for baseline x86-64, whose 4-lane loop issued a
// load per 4 floats and waited on memory; the AVX-512 variant, picked by the kernels' level
// (cpu/isa.h) as elsewhere, rounds each column alike (the lanes are independent columns).
template <class A>
[[gnu::always_inline]] inline void add4_rows(A* s, const A* const* v, int64_t w) {
  for (int64_t j = 0; j < w; ++j) s[j] += (v[0][j] + v[1][j]) + (v[2][j] + v[3][j]);
}
AG_AVX512_TARGET void add4_rows_avx512(float* s, const float* const* v, int64_t w) { add4_rows(s, v, w); }
template <class A>
void add4_rows_best(A* s, const A* const* v, int64_t w) {
  if constexpr (std::is_same_v<A, float>) run_variant<add4_rows<float>, add4_rows_avx512>(s, v, w);
  else add4_rows(s, v, w);
}

// Sums f(x) over the reduced elements. `param` holds a per-output value from a first pass:
// the mean (SqDev, for Var) or the max (ExpShift, for LogSumExp).
template <class A, SumKind K>
struct SumReducer {
  struct State {
    A s = 0, c = 0, m = 0;
  };
  struct Block {
    A s[kColBlock], m[kColBlock];
  };
  const A* param = nullptr;
  A p = 2;                 // PowSum
  int64_t correction = 0;  // SqDev

  State init(int64_t o) const {
    State st;
    if constexpr (K == SumKind::SqDev) st.m = param[o];
    if constexpr (K == SumKind::ExpShift) st.m = std::isfinite(param[o]) ? param[o] : A(0);
    return st;
  }
  A f(A x, A m) const {
    if constexpr (K == SumKind::Sum || K == SumKind::Mean) return x;
    else if constexpr (K == SumKind::SqDev) return (x - m) * (x - m);
    else if constexpr (K == SumKind::ExpShift) return exp_acc(x - m);
    else if constexpr (K == SumKind::AbsSum) return std::abs(x);
    else if constexpr (K == SumKind::SqSum) return x * x;
    else if constexpr (K == SumKind::PowSum) return std::pow(std::abs(x), p);
    else return x != A(0) ? A(1) : A(0);
  }
  void run(State& st, const A* v, int64_t n, int64_t) const {
    constexpr auto id = [](A x) { return x; };
    if constexpr (K == SumKind::Sum || K == SumKind::Mean) {
      compensated_add(st.s, st.c, tree_sum(v, n, id));
    } else {  // transform a piece in a plain loop (it vectorises; exp_acc inside tree_sum may not)
      A t[256];
      for (int64_t b = 0; b < n; b += 256) {
        const int64_t m = std::min<int64_t>(256, n - b);
        for (int64_t i = 0; i < m; ++i) t[i] = f(v[b + i], st.m);
        compensated_add(st.s, st.c, tree_sum(t, m, id));
      }
    }
  }
  void merge(State& st, const State& o) const {
    compensated_add(st.s, st.c, o.s);
    st.c += o.c;
  }
  void block_init(Block& b, const State* st, int64_t w) const {
    for (int64_t j = 0; j < w; ++j) b.s[j] = 0, b.m[j] = st[j].m;
  }
  void block_step(Block& b, const A* const* v, int nv, int64_t w, int64_t) const {
    if (nv == 4) {  // one accumulator update per four values
      if constexpr (K == SumKind::Sum || K == SumKind::Mean) {
        add4_rows_best(b.s, v, w);
      } else {
        for (int64_t j = 0; j < w; ++j)
          b.s[j] += (f(v[0][j], b.m[j]) + f(v[1][j], b.m[j])) + (f(v[2][j], b.m[j]) + f(v[3][j], b.m[j]));
      }
    } else {
      for (int q = 0; q < nv; ++q)
        for (int64_t j = 0; j < w; ++j) b.s[j] += f(v[q][j], b.m[j]);
    }
  }
  void block_flush(Block& b, State* st, int64_t w) const {
    for (int64_t j = 0; j < w; ++j) compensated_add(st[j].s, st[j].c, b.s[j]), b.s[j] = 0;
  }
  A result(const State& st, int64_t count, int64_t o) const {
    const A s = compensated_value(st.s, st.c);
    if constexpr (K == SumKind::Mean) return s / A(count);
    else if constexpr (K == SumKind::SqDev) return s / A(std::max<int64_t>(0, count - correction));
    else if constexpr (K == SumKind::ExpShift) return std::isfinite(param[o]) ? param[o] + std::log(s) : param[o];
    else if constexpr (K == SumKind::SqSum) return std::sqrt(s);
    else if constexpr (K == SumKind::PowSum) return std::pow(s, A(1) / p);
    else return s;
  }
};

// Max or min (of |x| with kAbs), with the flat index of the first extreme when kIndex.
// NaN beats every number, so it propagates and its index is reported.
template <class A, bool kMax, bool kIndex, bool kAbs = false>
struct ExtremumReducer {
  struct State {
    A v;
    int64_t i = -1;
  };
  struct Block {
    A v[kColBlock];
    int64_t i[kColBlock];
  };
  static A identity() {
    if constexpr (std::is_floating_point_v<A>)
      return kMax ? -std::numeric_limits<A>::infinity() : std::numeric_limits<A>::infinity();
    else return kMax ? std::numeric_limits<A>::lowest() : std::numeric_limits<A>::max();
  }
  State init(int64_t) const { return {identity(), -1}; }
  static A tf(A x) {
    if constexpr (kAbs) return std::abs(x);
    else return x;
  }
  static bool better(A x, A cur) {
    if constexpr (std::is_floating_point_v<A>)
      if (x != x) return cur == cur;
    return kMax ? x > cur : x < cur;
  }
  // The extreme of v and m. Eight lanes of selects and a separate NaN flag vectorise,
  // where one running select through `better` would not.
  static A extreme(const A* v, int64_t n, A m) {
    A lane[8];
    int nan[8] = {};
    for (int k = 0; k < 8; ++k) lane[k] = m;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (int k = 0; k < 8; ++k) {
        const A x = tf(v[i + k]);
        lane[k] = (kMax ? x > lane[k] : x < lane[k]) ? x : lane[k];
        if constexpr (std::is_floating_point_v<A>) nan[k] |= x != x;
      }
    for (; i < n; ++i) m = better(tf(v[i]), m) ? tf(v[i]) : m;
    for (int k = 0; k < 8; ++k) {
      m = better(lane[k], m) ? lane[k] : m;
      if constexpr (std::is_floating_point_v<A>)
        if (nan[k] && m == m) m = std::numeric_limits<A>::quiet_NaN();
    }
    return m;
  }
  void run(State& st, const A* v, int64_t n, int64_t i0) const {
    if constexpr (!kIndex) {
      st.v = extreme(v, n, st.v);
    } else {
      // Per block: the extreme first (a branch-free pass), then, only when it beats the
      // state, the first position holding it.
      constexpr int64_t kB = 1024;
      for (int64_t b = 0; b < n; b += kB) {
        const int64_t m = std::min(kB, n - b);
        const A e = extreme(v + b, m, identity());
        if (st.i >= 0 && !better(e, st.v)) continue;
        int64_t k = 0;
        if constexpr (std::is_floating_point_v<A>) {
          if (e != e) {
            while (v[b + k] == v[b + k]) ++k;
          } else {
            while (!(tf(v[b + k]) == e)) ++k;
          }
        } else {
          while (!(tf(v[b + k]) == e)) ++k;
        }
        st.v = e;
        st.i = i0 + b + k;
      }
    }
  }
  // `o` covers later indices than `st`, so a tie keeps st's (earlier) index.
  void merge(State& st, const State& o) const {
    if constexpr (kIndex) {
      if (o.i >= 0 && (st.i < 0 || better(o.v, st.v))) st = o;
    } else if (better(o.v, st.v)) {
      st.v = o.v;
    }
  }
  void block_init(Block& b, const State*, int64_t w) const {
    for (int64_t j = 0; j < w; ++j) b.v[j] = identity(), b.i[j] = -1;
  }
  // Branch-free (bitwise, not short-circuit, conditions) so that it vectorises.
  void block_step(Block& b, const A* const* v, int nv, int64_t w, int64_t idx) const {
    for (int q = 0; q < nv; ++q)
      for (int64_t j = 0; j < w; ++j) {
        const A x = tf(v[q][j]), cur = b.v[j];
        bool take = kMax ? x > cur : x < cur;
        if constexpr (std::is_floating_point_v<A>) take = take | ((x != x) & (cur == cur));
        if constexpr (kIndex) take = take | (b.i[j] < 0);
        b.v[j] = take ? x : cur;
        if constexpr (kIndex) b.i[j] = take ? idx + q : b.i[j];
      }
  }
  void block_flush(Block& b, State* st, int64_t w) const {
    for (int64_t j = 0; j < w; ++j) {
      merge(st[j], State{b.v[j], b.i[j]});
      b.v[j] = identity();
      b.i[j] = -1;
    }
  }
  A result(const State& st, int64_t, int64_t) const { return st.v; }
};

// ---- the driver ---------------------------------------------------------------------------

// Groups of outputs reduced together: one output (rows), or a block of up to W outputs
// along the contiguous kept dim `col` (columns); each group's reduced range is split in K
// parts. `others` are the remaining kept dims, with their strides in x and in the
// (contiguous) output.
struct ReduceGroups {
  bool columns = false;
  std::vector<int64_t> osz, ost_x, ost_o;  // the other kept dims: sizes, strides in x and in the output
  int64_t I = 1, col_ostride = 1;          // the columns dim: its size and output stride
  int64_t W = 1, nblk = 1, G = 1;          // outputs per group, groups per row of columns, groups
  int64_t K = 1, per_task = 1;             // parts of a group's reduced range, elements per task

  explicit ReduceGroups(const ReduceLayout& p) : columns(p.col >= 0) {
    int64_t ostride = 1;
    std::vector<int64_t> out_strides(p.ksz.size());
    for (size_t d = p.ksz.size(); d-- > 0;) out_strides[d] = ostride, ostride *= p.ksz[d];
    for (size_t d = 0; d < p.ksz.size(); ++d) {
      if (columns && int(d) == p.col) {
        I = p.ksz[d];
        col_ostride = out_strides[d];
      } else {
        osz.push_back(p.ksz[d]);
        ost_x.push_back(p.kst[d]);
        ost_o.push_back(out_strides[d]);
      }
    }
    W = columns ? std::min(I, kColBlock) : 1;
    nblk = (I + W - 1) / W;
    G = p.M / I * nblk;
    // Split the reduced range when there are few groups: enough tasks for 64 threads, each
    // of at least 64K elements and 128 reduced indices (the partial states of a split cost
    // a State per output, which must stay small next to the input it sums).
    K = std::clamp<int64_t>(std::min({(64 + G - 1) / G, W * p.R / 65536, p.R / 128}), 1, p.R);
    per_task = std::max<int64_t>(1, W * p.R / K);
  }
  // Group g's outputs in this many columns (W but at the end of a row of columns).
  int64_t width(int64_t g) const { return std::min(W, I - g % nblk * W); }
  // The flat index of output j of group g.
  int64_t output(int64_t g, int64_t j) const {
    return offset_of(g / nblk, osz, ost_o, osz.size()) + (g % nblk * W + j) * col_ostride;
  }
  // Group g's first element in x.
  const char* input(const ReduceLayout& p, int64_t g) const {
    return p.base + offset_of(g / nblk, osz, ost_x, osz.size()) + g % nblk * W * p.item;
  }
};

// One thread's states (a group's outputs), column accumulators and widening buffer.
template <class A, class Red>
struct ReduceScratch {
  std::vector<typename Red::State> st;
  // Per-column accumulators (tens of KB): on the heap, once per thread's range of tasks.
  std::unique_ptr<typename Red::Block> blk;
  std::unique_ptr<A[]> buf_owner;  // not vector<bool>
  A* buf;
  explicit ReduceScratch(const ReduceGroups& gr)
      : st(static_cast<size_t>(gr.W)),
        blk(gr.columns ? new typename Red::Block : nullptr),
        buf_owner(new A[size_t(std::max(kChunk, 4 * gr.W))]),
        buf(buf_owner.get()) {}
};

// Reduced indices r0..r1 of the one output at base into st (the rows layout): contiguous
// runs of A in place, the rest widened kChunk elements at a time.
template <class T, class A, class Red>
void reduce_rows(const ReduceLayout& p, const Red& red, const char* base, int64_t r0, int64_t r1,
                 typename Red::State& st, A* buf) {
  for_runs(p, base, r0, r1, [&](const char* ptr, int64_t s, int64_t n, int64_t i0) {
    if constexpr (std::is_same_v<T, A>) {
      if (s == int64_t(sizeof(T))) return red.run(st, reinterpret_cast<const A*>(ptr), n, i0);
    }
    for (int64_t i = 0; i < n; i += kChunk) {
      const int64_t m = std::min(kChunk, n - i);
      load_acc<T, A>(ptr + i * s, s, buf, m);
      red.run(st, buf, m, i0 + i);
    }
  });
}

// Reduced indices r0..r1 of the w outputs at base into sc.st (the columns layout): four rows
// at a time through the block accumulators, flushed into the states every kColRows rows.
template <class T, class A, class Red>
void reduce_columns(const ReduceLayout& p, const Red& red, const char* base, int64_t r0, int64_t r1, int64_t w,
                    ReduceScratch<A, Red>& sc) {
  typename Red::Block& blk = *sc.blk;
  A* buf = sc.buf;
  red.block_init(blk, sc.st.data(), w);
  int64_t steps = 0;
  for_runs(p, base, r0, r1, [&](const char* ptr, int64_t s, int64_t n, int64_t i0) {
    for (int64_t i = 0; i < n;) {
      const int nv = n - i >= 4 ? 4 : 1;
      const A* v[4];
      if constexpr (!std::is_same_v<T, A>) load_acc_rows<T, A>(ptr + i * s, s, p.item, buf, nv, w);
      for (int q = 0; q < nv; ++q) {
        if constexpr (std::is_same_v<T, A>) v[q] = reinterpret_cast<const A*>(ptr + (i + q) * s);
        else v[q] = buf + q * w;
      }
      red.block_step(blk, v, nv, w, i0 + i);
      i += nv;
      if ((steps += nv) >= kColRows) {
        red.block_flush(blk, sc.st.data(), w);
        steps = 0;
      }
    }
  });
  if (steps) red.block_flush(blk, sc.st.data(), w);
}

// Task t: part t % K of group t / K's reduced range, its states to the sink (K == 1) or to
// their places in `part`.
template <class T, class A, class Red, class Sink>
void reduce_task(const ReduceLayout& p, const Red& red, const ReduceGroups& gr, int64_t t, ReduceScratch<A, Red>& sc,
                 const Sink& sink, std::vector<typename Red::State>& part) {
  const int64_t K = gr.K, W = gr.W;
  const int64_t g = t / K, k = t % K;
  const int64_t w = gr.width(g);
  const char* base = gr.input(p, g);
  const int64_t o0 = gr.output(g, 0);
  const int64_t r0 = p.R * k / K, r1 = p.R * (k + 1) / K;
  for (int64_t j = 0; j < w; ++j) sc.st[j] = red.init(o0 + j * gr.col_ostride);
  if (!gr.columns) reduce_rows<T, A>(p, red, base, r0, r1, sc.st[0], sc.buf);
  else reduce_columns<T, A>(p, red, base, r0, r1, w, sc);
  if (K == 1) {
    for (int64_t j = 0; j < w; ++j) sink(o0 + j * gr.col_ostride, sc.st[j]);
  } else {
    for (int64_t j = 0; j < w; ++j) part[size_t((g * K + k) * W + j)] = sc.st[j];
  }
}

// The partial states join in order, the outputs spread over the threads (each sink call
// writes its own output).
template <class Red, class Sink>
void merge_parts(const Red& red, const ReduceGroups& gr, const std::vector<typename Red::State>& part,
                 const Sink& sink) {
  const int64_t K = gr.K, W = gr.W;
  parallel_for(0, gr.G * W, std::max<int64_t>(1, kGrain / (4 * K)), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t g = t / W, j = t % W;
      if (j >= gr.width(g)) continue;
      typename Red::State s = part[size_t(g * K * W + j)];
      for (int64_t k = 1; k < K; ++k) red.merge(s, part[size_t((g * K + k) * W + j)]);
      sink(gr.output(g, j), s);
    }
  });
}

// Runs `red` over the plan; sink(o, state) receives each output's final state, o being the
// flat (row-major) index of the output among the kept dims.
template <class T, class A, class Red, class Sink>
void run_reduce(const ReduceLayout& p, const Red& red, const Sink& sink) {
  using State = typename Red::State;
  if (p.M == 0) return;
  if (p.R == 0) {
    for (int64_t o = 0; o < p.M; ++o) sink(o, red.init(o));
    return;
  }
  const ReduceGroups gr(p);
  std::vector<State> part(gr.K > 1 ? size_t(gr.G * gr.K * gr.W) : 0);
  parallel_for(0, gr.G * gr.K, std::max<int64_t>(1, kGrain / gr.per_task), [&](int64_t tb, int64_t te) {
    ReduceScratch<A, Red> sc(gr);
    for (int64_t t = tb; t < te; ++t) reduce_task<T, A>(p, red, gr, t, sc, sink, part);
  });
  if (gr.K > 1) merge_parts(red, gr, part, sink);
}

// Runs `red` and writes red.result(...) converted to O into the contiguous out.
template <class T, class A, class O, class Red>
void reduce_into(const ReduceLayout& p, const Red& red, const Tensor& out) {
  O* o = static_cast<O*>(out.raw_data());
  run_reduce<T, A>(p, red, [&](int64_t i, const typename Red::State& st) {
    o[i] = cast<O>(red.result(st, p.R, i));
  });
}

// First pass of Var / LogSumExp: one accumulation-type value per output.
template <class T, class A, class Red>
std::vector<A> reduce_to_vector(const ReduceLayout& p, const Red& red) {
  std::vector<A> v(size_t(p.M));
  run_reduce<T, A>(p, red, [&](int64_t i, const typename Red::State& st) { v[size_t(i)] = red.result(st, p.R, i); });
  return v;
}

void check_out(const Tensor& out, DType expected, const char* op) {
  AG_CHECK(out.dtype() == expected, op, "the output must be ", dtype_name(expected), ", got ",
           dtype_name(out.dtype()));
}

template <class T>
void reduce_floating(ReduceOp op, const ReduceLayout& p, const Tensor& out, ReduceParams prm) {
  using A = acc_type_t<T>;
  const char* name = op_name(op);
  check_out(out, dtype_of<T>, name);
  switch (op) {
    case ReduceOp::Mean:
      return reduce_into<T, A, T>(p, SumReducer<A, SumKind::Mean>{}, out);
    case ReduceOp::Var: {
      const std::vector<A> mean = reduce_to_vector<T, A>(p, SumReducer<A, SumKind::Mean>{});
      SumReducer<A, SumKind::SqDev> r;
      r.param = mean.data();
      r.correction = prm.correction;
      return reduce_into<T, A, T>(p, r, out);
    }
    case ReduceOp::LogSumExp: {
      const std::vector<A> mx = reduce_to_vector<T, A>(p, ExtremumReducer<A, true, false>{});
      SumReducer<A, SumKind::ExpShift> r;
      r.param = mx.data();
      return reduce_into<T, A, T>(p, r, out);
    }
    case ReduceOp::Norm: {
      const double q = prm.p;
      if (std::isinf(q) && q > 0) return reduce_into<T, A, T>(p, ExtremumReducer<A, true, false, true>{}, out);
      if (std::isinf(q)) return reduce_into<T, A, T>(p, ExtremumReducer<A, false, false, true>{}, out);
      if (q == 0) return reduce_into<T, A, T>(p, SumReducer<A, SumKind::NonZero>{}, out);
      if (q == 1) return reduce_into<T, A, T>(p, SumReducer<A, SumKind::AbsSum>{}, out);
      if (q == 2) return reduce_into<T, A, T>(p, SumReducer<A, SumKind::SqSum>{}, out);
      SumReducer<A, SumKind::PowSum> r;
      r.p = A(q);
      return reduce_into<T, A, T>(p, r, out);
    }
    default: AG_ERROR(name, "not a floating-only reduction");
  }
}

}  // namespace

void CpuBackend::reduce(ReduceOp op, const Tensor& x, const Shape& dims, const Tensor& out,
                        ReduceParams prm) {
  const char* name = op_name(op);
  const bool order_free = op != ReduceOp::ArgMax && op != ReduceOp::ArgMin;
  const Prepared pr = prepare(*this, x, dims, order_free);
  const ReduceLayout& p = pr.plan;
  switch (op) {
    case ReduceOp::Sum:
      return dispatch_all(x.dtype(), name, [&]<class T>() {
        if constexpr (std::is_floating_point_v<acc_type_t<T>>) {
          check_out(out, dtype_of<T>, name);
          reduce_into<T, acc_type_t<T>, T>(p, SumReducer<acc_type_t<T>, SumKind::Sum>{}, out);
        } else {  // integral and bool sums count in int64, like PyTorch
          check_out(out, kInt64, name);
          reduce_into<T, int64_t, int64_t>(p, SumReducer<int64_t, SumKind::Sum>{}, out);
        }
      });
    case ReduceOp::Max:
    case ReduceOp::Min:
      return dispatch_all(x.dtype(), name, [&]<class T>() {
        using A = acc_type_t<T>;
        check_out(out, dtype_of<T>, name);
        if (op == ReduceOp::Max) reduce_into<T, A, T>(p, ExtremumReducer<A, true, false>{}, out);
        else reduce_into<T, A, T>(p, ExtremumReducer<A, false, false>{}, out);
      });
    case ReduceOp::ArgMax:
    case ReduceOp::ArgMin:
      return dispatch_all(x.dtype(), name, [&]<class T>() {
        using A = acc_type_t<T>;
        check_out(out, kInt64, name);
        int64_t* o = out.data_ptr<int64_t>();
        auto write = [&](const auto& red) {
          run_reduce<T, A>(p, red, [&](int64_t i, const auto& st) { o[i] = st.i; });
        };
        if (op == ReduceOp::ArgMax) write(ExtremumReducer<A, true, true>{});
        else write(ExtremumReducer<A, false, true>{});
      });
    default:
      return dispatch_floating(x.dtype(), name, [&]<class T>() { reduce_floating<T>(op, p, out, prm); });
  }
}

void CpuBackend::max_min_dim(bool is_max, const Tensor& x, int64_t dim, const Tensor& values,
                             const Tensor& indices) {
  const char* name = is_max ? op::max : op::min;
  const Prepared pr = prepare(*this, x, Shape{dim}, false);
  dispatch_all(x.dtype(), name, [&]<class T>() {
    using A = acc_type_t<T>;
    check_out(values, dtype_of<T>, name);
    check_out(indices, kInt64, name);
    T* v = static_cast<T*>(values.raw_data());
    int64_t* ix = indices.data_ptr<int64_t>();
    auto write = [&](const auto& red) {
      run_reduce<T, A>(pr.plan, red, [&](int64_t i, const auto& st) {
        v[i] = cast<T>(st.v);
        ix[i] = st.i;
      });
    };
    if (is_max) write(ExtremumReducer<A, true, true>{});
    else write(ExtremumReducer<A, false, true>{});
  });
}

}  // namespace ampgrad::cpu
