// Scaled dot-product attention on the CPU: the Backend entries attention and
// attention_backward (backend.h has their contract), FlashAttention-2's algorithm on tiles.
//
// One task per batch entry (a head), spread by parallel_for with grain 1 (each is big
// work; entries under a megaflop are grouped). float32 and float64 operands are read in
// place (any row stride); 16-bit ones are widened once per entry into float buffers with
// load_acc, except bfloat16 ones at the kernels' level avx512_bf16 (below). Everything is
// computed in A, float (double for float64). Then:
//   forward   for each block of kBr queries, walks the blocks of kBc keys (stopping at the
//             diagonal when causal) with a running max m, normaliser l and output
//             accumulator per row (the online softmax): S = scale q k^T + mask (-inf where
//             causal hides a key), m' = max(m, rowmax S), P = exp(S - m'),
//             l = l e^(m - m') + rowsum P, acc = acc e^(m - m') + dropout(P) v. Only one
//             [kBr, kBc] tile of scores exists at a time, whatever T is. The output is acc / l;
//             lse = m + log l is saved per row, +inf for a row with no visible key (l = 0),
//             whose output is 0 rather than 0/0.
//   backward  recomputes each tile's probabilities from q, k and the saved lse,
//             P = exp(S - lse) (0 on a row whose lse is +inf), and with D_i = rowsum(dO * O)
//             (O the saved output): dv += dropout(P)^T dO, dP = dropout(dO v^T),
//             dS = P * (dP - D_i), dq += scale dS k, dk += scale dS^T q. Key blocks are the
//             outer loop, so a block's dk and dv stay in cache while the query blocks pass;
//             dq, dk and dv of the entry accumulate in A and are written once.
// The products are tile_gemm calls (gemm.h: our AVX-512 kernel for these small float
// products at the kernels' level avx512, else oneDNN's sgemm or Eigen), all on row-major
// operands: k and v are transposed once per entry for the products that take k^T and v^T.
// bfloat16 inputs multiply in bfloat16 pairs instead (tile_gemm_bf16: AMX tiles, else
// VDPBF16PS), their right operands packed once per entry (pack_for), straight from the
// inputs' rows when those are unit-stride (direct_bf16: nothing widened then);
// the row work (max, exp_acc, sums) is one always-inlined function compiled for AVX-512,
// AVX2 and the baseline (see row_work), each variant chosen by the kernels' level
// (cpu/isa.h, hw::set_kernel_isa). Dropout draws the keep decision of probability
// (b, i, j) from Philox counter offset + (b * Tq + i) * Tk + j in both directions
// (AttentionParams), so the backward regenerates the forward's mask and nothing
// [Tq, Tk]-sized is saved.
//
// Reference: kernels/reference/include/ampgrad/reference/attention.h (float64, the specification).
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "cpu/avx512.h"
#include "cpu/cpu_backend.h"
#include "cpu/gemm.h"
#include "cpu/parallel.h"
#include "cpu/rows.h"
#include "cpu/transpose16.h"
#include "cpu/vec.h"
#include "ampgrad/philox.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ampgrad::cpu {
namespace {

constexpr int64_t kBr = 64;  // queries per tile
constexpr int64_t kBc = 64;  // keys per tile (the leading dimension of the score tiles)
// A tile that the causal diagonal crosses is multiplied in stripes of this many queries
// (or keys), each product only as long as the keys (queries) that the stripe can see: the
// diagonal tile costs 5/8 of a full one (a T = 64 model has nothing but diagonal tiles).
constexpr int64_t kStripe = 16;

// Where the causal rule cuts a tile of queries i0.. and keys j0..: local key c is visible
// from local query r when c <= r + off. `cut` says the tile hides some of its entries.
struct Diagonal {
  int64_t off = 0;
  bool cut = false;
  Diagonal(bool causal, int64_t i0, int64_t j0, int64_t cols) : off(i0 - j0), cut(causal && j0 + cols - 1 > i0) {}
  // f(r0, r1, n) per stripe of queries r0..r1 of a rows x cols tile, n the keys [0, n) that
  // hold everything the stripe sees (0: none); one call for the whole tile when not cut.
  template <class F>
  void query_stripes(int64_t rows, int64_t cols, const F& f) const {
    if (!cut) return f(int64_t(0), rows, cols);
    for (int64_t r0 = 0; r0 < rows; r0 += kStripe) {
      const int64_t r1 = std::min(rows, r0 + kStripe);
      f(r0, r1, std::clamp<int64_t>(r1 + off, 0, cols));
    }
  }
  // f(c0, c1, r) per stripe of keys c0..c1, queries [r, rows) holding every one that sees
  // them (r == rows: none); one call for the whole tile when not cut.
  template <class F>
  void key_stripes(int64_t rows, int64_t cols, const F& f) const {
    if (!cut) return f(int64_t(0), cols, int64_t(0));
    for (int64_t c0 = 0; c0 < cols; c0 += kStripe)
      f(c0, std::min(cols, c0 + kStripe), std::clamp<int64_t>(c0 - off, 0, rows));
  }
};

// The sizes of one call (backend.h), and how many batch entries a parallel chunk takes.
struct Dims : AttentionSizes {
  using AttentionSizes::AttentionSizes;
  // Batch entries per parallel chunk: one, unless an entry is too small (under about a
  // megaflop) to repay waking another thread, as for gemm_common's products (over_items).
  int64_t grain() const {
    const int64_t flops = std::max<int64_t>(1, 2 * Tq * Tk * (D + Dv));
    return std::max<int64_t>(1, (int64_t(1) << 20) / flops);
  }
};

// Element offset of batch entry b in t [batch..., R, C] (any strides, 0 for broadcast dims).
int64_t batch_offset(const Tensor& t, int64_t b) {
  int64_t off = 0;
  for (int64_t d = t.dim() - 3; d >= 0; --d) {
    const int64_t s = t.size(d);
    off += (b % s) * t.stride(d);
    b /= s;
  }
  return off;
}

// Rows of a matrix as the products read them: element (r, c) at p[r * ld + c].
template <class A>
struct Rows {
  const A* p;
  int64_t ld;
};

// Whether rows ld elements of A apart alias in the L1 cache: at a multiple of 1 KiB the
// rows of a tile fall on a quarter of the sets (4 KiB per way) and evict each other as the
// small kernel streams them, and the product slows down; rows at other distances do not.
template <class A>
bool aliasing_rows(int64_t ld, int64_t rows) {
  return rows > 16 && ld > 0 && (ld * int64_t(sizeof(A))) % 1024 == 0;
}

// The leading dimension for a buffer of rows n elements long: n, or one cache line more
// where n would alias (aliasing_rows).
template <class A>
int64_t buffer_ld(int64_t n, int64_t rows) {
  const int64_t ld = std::max<int64_t>(n, 1);
  return aliasing_rows<A>(ld, rows) ? ld + int64_t(64 / sizeof(A)) : ld;
}

// Batch entry b of t [batch..., R, C] (element type T): read in place when T is already
// the accumulation type and the rows are unit-stride, do not overlap (what BLAS takes) and
// do not alias in the cache, else widened (or copied) into buf with load_acc.
template <class T, class A>
Rows<A> entry_rows(const Tensor& t, int64_t b, std::vector<A>& buf) {
  const int64_t R = t.size(-2), C = t.size(-1), rs = t.stride(-2), cs = t.stride(-1);
  const T* base = static_cast<const T*>(t.raw_data()) + batch_offset(t, b);
  if constexpr (std::is_same_v<T, A>) {
    if ((cs == 1 || C <= 1) && rs >= std::max<int64_t>(C, 1) && !aliasing_rows<A>(rs, R)) return {base, rs};
  }
  const int64_t ld = buffer_ld<A>(C, R);
  buf.resize(size_t(R * ld));
  for (int64_t r = 0; r < R; ++r)
    load_acc_rows<T>(reinterpret_cast<const char*>(base + r * rs), rs * int64_t(sizeof(T)), cs * int64_t(sizeof(T)),
                     buf.data() + r * ld, 1, C);
  return {buf.data(), ld};
}

// The per-thread buffers that entry_rows widens into (left empty for operands read in place),
// and the transposed keys and values.
template <class A>
struct Widened {
  std::vector<A> q, k, v, go, o, kt, vt;
  Bf16Pairs qp, kp, vp, gop, ktp, vtp;  // bfloat16 pairs (pack_for)
};

// The transpose [C, R] (leading dimension R) of the R x C rows m, into buf: the products
// that take k^T or v^T then read rows, which tile_gemm's small kernel streams, and each
// key block is transposed once per entry rather than once per query block. Float blocks
// of 16 x 16 go through AVX-512 registers at the level avx512 (element by element is a
// strided gather); the rest is copied element by element.
template <class A>
Rows<A> transposed(const Rows<A>& m, int64_t R, int64_t C, std::vector<A>& buf) {
  const int64_t ld = buffer_ld<A>(R, C);
  buf.resize(size_t(std::max<int64_t>(C * ld, 1)));
  int64_t R16 = 0, C16 = 0;  // the block-transposed part: rows < R16 and columns < C16
#if defined(__x86_64__)
  if constexpr (std::is_same_v<A, float>) {
    if (use_avx512()) {
      transpose_blocks(m.p, m.ld, R, C, buf.data(), ld);
      R16 = R / 16 * 16, C16 = C / 16 * 16;
    }
  }
#endif
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = r < R16 ? C16 : 0; c < C; ++c) buf[size_t(c * ld + r)] = m.p[r * m.ld + c];
  return {buf.data(), ld};
}

// What a task reads of one batch entry: its operands, its mask and the scale.
template <class A>
struct Entry {
  Rows<A> q, k, v;   // [Tq, D], [Tk, D], [Tk, Dv]
  Rows<A> kt;        // k transposed, [D, Tk]
  const A* mask;     // element (i, j) at mask[i * mr + j * mc], or null
  int64_t mr, mc;
  A scale;
  // q, k^T, k and v packed for tile_gemm_bf16 (pack_for, or from the inputs in place), or null
  const Bf16Pairs *qp = nullptr, *ktp = nullptr, *kp = nullptr, *vp = nullptr;
  Rows<BFloat16> q16{nullptr, 0};  // q's bfloat16 rows read in place (direct entries), or null
};

// bfloat16 inputs at the kernels' level avx512_bf16: the right operands of an entry's
// products are packed into bfloat16 pairs once per entry, and the products run on them
// (tile_gemm_bf16: AMX tiles, else VDPBF16PS). q, k, v and dO are exact in bfloat16; the
// probabilities and dS are rounded to it for their products, as FlashAttention does with
// 16-bit inputs; the sums and all the row work stay float. Returns &buf, or null (the float
// products).
template <class T, class A>
const Bf16Pairs* pack_for(const Rows<A>& m, int64_t R, int64_t C, Bf16Pairs& buf) {
  if constexpr (std::is_same_v<T, BFloat16> && std::is_same_v<A, float>) {
    if (buf.pack(m.p, m.ld, R, C)) return &buf;
  }
  (void)m, (void)R, (void)C, (void)buf;
  return nullptr;
}

// A task's AMX tile configuration, held across its products when they are bfloat16 ones.
template <class T>
std::optional<Bf16TileScope> bf16_tiles() {
  if constexpr (std::is_same_v<T, BFloat16>) return std::optional<Bf16TileScope>(std::in_place);
  return std::nullopt;
}

// Whether an entry's bfloat16 operands can be read in place: the products all run on
// bfloat16 pairs then (tile_gemm_bf16 takes every product attention asks of it when the
// head sizes are at most 256: stripes of at most 64 rows start at even rows, and an odd
// inner dimension only ends at a matrix's last row), so nothing is widened to float,
// and k^T and v^T are packed straight from k's and v's rows. Causal attention with more
// keys than queries is left out: there a block's visible keys end at its last query, before
// the last key, and an odd count of them is an odd inner dimension that tile_gemm_bf16
// declines, which a direct entry, without float rows, could not fall back from.
template <class T>
bool direct_bf16(const Dims& d, bool causal, std::initializer_list<const Tensor*> ts) {
  if constexpr (!std::is_same_v<T, BFloat16>) {
    (void)d, (void)causal, (void)ts;
    return false;
  } else {
    if (!tile_gemm_bf16_available() || d.D > 256 || d.Dv > 256 || (causal && d.Tk > d.Tq)) return false;
    for (const Tensor* t : ts)
      if (!(t->stride(-1) == 1 || t->size(-1) <= 1) || t->stride(-2) < std::max<int64_t>(t->size(-1), 1)) return false;
    return true;
  }
}

// Batch entry b of a bfloat16 t [batch..., R, C] as rows read in place (direct_bf16 held).
template <class T>
Rows<BFloat16> rows16(const Tensor& t, int64_t b) {
  if constexpr (std::is_same_v<T, BFloat16>)
    return {static_cast<const BFloat16*>(t.raw_data()) + batch_offset(t, b), std::max<int64_t>(t.stride(-2), 1)};
  (void)t, (void)b;
  return {nullptr, 0};
}

// c = alpha op(a) b[p0.., j0..] + beta c, b [K, N] given by its float rows bf and, where
// packed, its bfloat16 pairs bp (tile_gemm_bf16 first; tile_gemm if it declines). a16:
// op(a)'s rows in bfloat16 (not transposed), used instead of a when given. Entries read
// in place (direct_bf16) have no float rows: their products never decline.
template <class A>
void product(bool ta, int64_t m, int64_t n, int64_t k, A alpha, const A* a, int64_t lda, const Rows<A>& bf,
             const Bf16Pairs* bp, int64_t p0, int64_t j0, A beta, A* c, int64_t ldc,
             Rows<BFloat16> a16 = {nullptr, 0}) {
  if constexpr (std::is_same_v<A, float>) {
    if (bp && a16.p && tile_gemm_bf16(m, n, k, alpha, a16.p, a16.ld, *bp, p0, j0, beta, c, ldc)) return;
    if (bp && !a16.p && tile_gemm_bf16(ta, m, n, k, alpha, a, lda, *bp, p0, j0, beta, c, ldc)) return;
  }
  assert(bf.p && "a bfloat16 product read in place was declined");
  tile_gemm(ta, false, m, n, k, alpha, a, lda, bf.p + p0 * bf.ld + j0, bf.ld, beta, c, ldc);
}

// The score tile s [rows, cols] (leading dim kBc) of queries i0.. and keys j0..:
// scale * q k^T + mask, and -inf where the causal rule hides key j from query i (j > i).
// Across the diagonal only the visible part is multiplied; the rest is set to -inf below.
template <class A>
void score_tile(const Entry<A>& e, const Dims& d, bool causal, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                A* s) {
  Diagonal(causal, i0, j0, cols).query_stripes(rows, cols, [&](int64_t r0, int64_t r1, int64_t n) {
    if (n > 0)
      product(false, r1 - r0, n, d.D, e.scale, e.q.p ? e.q.p + (i0 + r0) * e.q.ld : nullptr, e.q.ld, e.kt, e.ktp, 0, j0, A(0),
              s + r0 * kBc, kBc, e.q16.p ? Rows<BFloat16>{e.q16.p + (i0 + r0) * e.q16.ld, e.q16.ld} : e.q16);
  });
  if (e.mask) {
    for (int64_t r = 0; r < rows; ++r) {
      const A* m = e.mask + (i0 + r) * e.mr + j0 * e.mc;
      A* row = s + r * kBc;
      if (e.mc == 1)
        for (int64_t c = 0; c < cols; ++c) row[c] += m[c];
      else
        for (int64_t c = 0; c < cols; ++c) row[c] += m[c * e.mc];
    }
  }
  if (causal && j0 + cols - 1 > i0) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = std::max<int64_t>(0, i0 + r + 1 - j0); c < cols; ++c)
        s[r * kBc + c] = -std::numeric_limits<A>::infinity();
  }
}

// z [rows, cols] (leading dim kBc): the dropout factor of each probability of the tile,
// 1 / (1 - p) where the draw keeps it, else 0 (the rule of AttentionParams).
template <class A>
void dropout_tile(const AttentionParams& p, const Dims& d, int64_t b, int64_t i0, int64_t rows, int64_t j0,
                  int64_t cols, A* z) {
  const double keep = 1 - p.dropout_p;
  const A kept = A(1 / keep);
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t first = p.offset + uint64_t((b * d.Tq + i0 + r) * d.Tk + j0);
    for (int64_t c = 0; c < cols; ++c) {
      const kernels::Philox4x32 x(p.seed, first + uint64_t(c));
      z[r * kBc + c] = kernels::uniform01(x.out[0], x.out[1]) < keep ? kept : A(0);
    }
  }
}

// ---- the row work of a tile --------------------------------------------------------------
// At these sizes the exps and sums of the tiles cost as much as the products (a score takes
// 4 * D flops of product and one exp_acc). The library is built for baseline x86-64, so
// this part is compiled for AVX-512 and for AVX2 + FMA too, by target attributes as in
// core/src/convert.cpp, and run_rows picks one by the kernels' level (cpu/isa.h): the one
// definition below is inlined into each variant.

// One step of the row work: its kind and the tile buffers it reads and writes.
enum class RowStep { OnlineSoftmax, Probabilities, ScoreGrad };
template <class A>
struct RowArgs {
  int64_t rows, cols;
  A* s;           // the tile [rows, cols] (ld kBc): scores in; probabilities or dS out
  const A* z;     // dropout factors (ld kBc) or null
  A* m = nullptr;  // OnlineSoftmax: running max and normaliser per row,
  A* l = nullptr;
  A* acc = nullptr;  // and the output accumulator [rows, dv] to rescale
  int64_t dv = 0;
  const A* lse = nullptr;  // Probabilities: the saved log-sum-exp of each row
  const A* p = nullptr;    // ScoreGrad: s holds dO V^T; p the probabilities, pd receives p * z,
  A* pd = nullptr;
  const A* di = nullptr;   // di the rows' rowsum(dO * O)
  // Across the causal diagonal (cut), row r sees keys [0, r + off] only: the rest of its
  // scores are -inf, its probabilities and score gradients 0.
  int64_t off = 0;
  bool cut = false;
};

constexpr int kLanes = 16;  // a 512-bit vector of floats

// The kLanes lanes of a row's max and sum combined as a tree, four steps deep: lane k takes
// lane k + w for w = 8, 4, 2, 1, as whole vectors (GCC and clang vector extensions), and
// lane 0 holds the result. Each ISA variant keeps them in its own registers; walked as an
// array, the halving steps went through the stack, and the forward at T = 64 and 256
// spent a fifth of its time in them.
template <class A>
struct LaneTree {
  typedef A V16 __attribute__((vector_size(16 * sizeof(A))));
  typedef A V8 __attribute__((vector_size(8 * sizeof(A))));
  typedef A V4 __attribute__((vector_size(4 * sizeof(A))));
  typedef A V2 __attribute__((vector_size(2 * sizeof(A))));
  // lo = max(lo, hi) for Max (lane k's max with lane k + w: the later lane where it is
  // greater; NaN never is), else lo + hi. Operands by reference: vectors passed by value
  // have a different ABI on each target (GCC's -Wpsabi), though this is always inlined.
  template <bool Max, class V>
  [[gnu::always_inline]] static void step(V& lo, const V& hi) {
    if constexpr (Max) lo = hi > lo ? hi : lo;
    else lo = lo + hi;
  }
  // Each step halves the width, so the later ones run on narrower registers.
  template <bool Max>
  [[gnu::always_inline]] static A reduce(const A (&lane)[kLanes]) {
    static_assert(kLanes == 16);
    V16 v;
    std::memcpy(&v, lane, sizeof v);
    V8 v8 = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
    step<Max>(v8, V8(__builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15)));
    V4 v4 = __builtin_shufflevector(v8, v8, 0, 1, 2, 3);
    step<Max>(v4, V4(__builtin_shufflevector(v8, v8, 4, 5, 6, 7)));
    V2 v2 = __builtin_shufflevector(v4, v4, 0, 1);
    step<Max>(v2, V2(__builtin_shufflevector(v4, v4, 2, 3)));
    A r = v2[0];
    step<Max>(r, v2[1]);
    return r;
  }
  [[gnu::always_inline]] static A max(const A (&lane)[kLanes]) { return reduce<true>(lane); }
  [[gnu::always_inline]] static A sum(const A (&lane)[kLanes]) { return reduce<false>(lane); }
};

// The columns of row r that the row work computes: the keys it sees, rounded up to whole
// vectors (the -inf scores in the rounding give 0 like the rest); what follows is set to 0
// rather than computed. A T = 64 model's tiles are all diagonal ones, half hidden.
template <class A>
[[gnu::always_inline]] inline int64_t row_span(const RowArgs<A>& a, int64_t r) {
  if (!a.cut) return a.cols;
  const int64_t seen = std::clamp<int64_t>(r + a.off + 1, 0, a.cols);
  return std::min(a.cols, (seen + kLanes - 1) / kLanes * kLanes);
}

// Fma: exp_acc's fused multiply-adds, in the variants compiled for targets that have them.
template <class A, bool Fma>
[[gnu::always_inline]] inline void row_work(RowStep step, const RowArgs<A>& a) {
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();
  // OnlineSoftmax: every row's max first, in a pass of its own, so that one row's
  // reduction overlaps the next rows' loads instead of holding up its exps (a row is a
  // single chain: max, shift, exps, sum). The max runs in kLanes independent lanes
  // (combined in a fixed order), written out here rather than called from rows.h so that
  // it is inlined into each ISA variant; NaN scores are skipped by the max and reach the sum.
  A row_max[kBr], shift[kBr], alpha[kBr];
  if (step == RowStep::OnlineSoftmax) {
    assert(a.rows <= kBr);
    for (int64_t r = 0; r < a.rows; ++r) {
      const A* row = a.s + r * kBc;
      const int64_t n = row_span(a, r);
      A lane[kLanes];
      for (int k = 0; k < kLanes; ++k) lane[k] = kNegInf;
      int64_t c = 0;
      for (; c + kLanes <= n; c += kLanes)
        for (int k = 0; k < kLanes; ++k) lane[k] = row[c + k] > lane[k] ? row[c + k] : lane[k];
      A mx = kNegInf;
      for (; c < n; ++c) mx = row[c] > mx ? row[c] : mx;
      const A lane_max = LaneTree<A>::max(lane);
      row_max[r] = lane_max > mx ? lane_max : mx;
    }
    // Then each row's shift and rescaling factor, vectorised across rows. A row with nothing
    // visible yet keeps max -inf: shift by 0, not by -inf (-inf - -inf would be NaN); its
    // exps are 0 and its accumulator stays 0.
    for (int64_t r = 0; r < a.rows; ++r) {
      const A m_old = a.m[r], m_new = row_max[r] > m_old ? row_max[r] : m_old;
      shift[r] = m_new == kNegInf ? A(0) : m_new;
      alpha[r] = exp_acc<A, Fma>(m_old - shift[r]);
      a.m[r] = m_new;
    }
  }
  for (int64_t r = 0; r < a.rows; ++r) {
    A* row = a.s + r * kBc;
    const A* zr = a.z ? a.z + r * kBc : nullptr;
    const int64_t n = row_span(a, r);
    switch (step) {
      case RowStep::OnlineSoftmax: {
        const A sh = shift[r];
        A lane[kLanes] = {};
        int64_t c = 0;
        for (; c + kLanes <= n; c += kLanes)
          for (int k = 0; k < kLanes; ++k) {
            const A e = exp_acc<A, Fma>(row[c + k] - sh);
            row[c + k] = e;
            lane[k] += e;
          }
        A sum = 0;
        for (; c < n; ++c) sum += (row[c] = exp_acc<A, Fma>(row[c] - sh));
        std::fill(row + n, row + a.cols, A(0));
        sum += LaneTree<A>::sum(lane);
        a.l[r] = a.l[r] * alpha[r] + sum;
        if (alpha[r] != A(1)) {
          A* acc = a.acc + r * a.dv;
          for (int64_t c = 0; c < a.dv; ++c) acc[c] *= alpha[r];
        }
        if (zr)
          for (int64_t c = 0; c < n; ++c) row[c] *= zr[c];
        break;
      }
      case RowStep::Probabilities: {
        const A shift = a.lse[r];  // +inf on a row that sees no key: exp gives 0
        for (int64_t c = 0; c < n; ++c) row[c] = exp_acc<A, Fma>(row[c] - shift);
        std::fill(row + n, row + a.cols, A(0));
        if (zr) {
          A* pd = a.pd + r * kBc;
          for (int64_t c = 0; c < a.cols; ++c) pd[c] = row[c] * zr[c];
        }
        break;
      }
      case RowStep::ScoreGrad: {
        const A* pr = a.p + r * kBc;
        const A dr = a.di[r];
        if (zr)
          for (int64_t c = 0; c < n; ++c) row[c] = pr[c] * (row[c] * zr[c] - dr);
        else
          for (int64_t c = 0; c < n; ++c) row[c] = pr[c] * (row[c] - dr);
        std::fill(row + n, row + a.cols, A(0));
        break;
      }
    }
  }
}

#if defined(__x86_64__)
AG_AVX512_TARGET void row_work_avx512(RowStep step,
                                                                                    const RowArgs<float>& a) {
  row_work<float, true>(step, a);
}
__attribute__((target("avx2,fma"))) void row_work_avx2(RowStep step, const RowArgs<float>& a) {
  row_work<float, true>(step, a);
}
#endif

// The row work in the variant of the kernels' level (float); double is compiled once.
template <class A>
void run_rows(RowStep step, const RowArgs<A>& a) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<A, float>) {
    const KernelIsa isa = kernel_isa();
    if (isa >= KernelIsa::Avx512) return row_work_avx512(step, a);
    if (isa >= KernelIsa::Avx2) return row_work_avx2(step, a);
  }
#endif
  row_work<A, false>(step, a);
}

template <class A>
const A* mask_of(const Tensor& mask, int64_t b) {
  return mask.defined() ? static_cast<const A*>(mask.raw_data()) + batch_offset(mask, b) : nullptr;
}

template <class T>
void forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const AttentionParams& p,
             const Tensor& out, const Tensor& lse, const Dims& d) {
  using A = acc_type_t<T>;
  const bool drop = p.dropout_p > 0;
  const int64_t mr = mask.defined() ? mask.stride(-2) : 0, mc = mask.defined() ? mask.stride(-1) : 0;
  char* out_base = static_cast<char*>(out.raw_data());
  const int64_t out_rs = out.stride(-2);  // rows are unit-stride (Backend::attention)
  A* lse_base = static_cast<A*>(lse.raw_data());
  const bool direct = direct_bf16<T>(d, p.causal, {&q, &k, &v});
  parallel_for(0, d.N, d.grain(), [&](int64_t b0, int64_t b1) {
    const std::optional<Bf16TileScope> tiles = bf16_tiles<T>();
    Widened<A> w;
    std::vector<A> s(size_t(kBr * kBc)), z(drop ? size_t(kBr * kBc) : 0), acc(size_t(kBr * d.Dv)), m(kBr), l(kBr);
    for (int64_t b = b0; b < b1; ++b) {
      Entry<A> e{{nullptr, 0}, {nullptr, 0}, {nullptr, 0}, {nullptr, 0}, mask_of<A>(mask, b), mr, mc, A(p.scale)};
      if (direct) {
        const Rows<BFloat16> k16 = rows16<T>(k, b), v16 = rows16<T>(v, b);
        e.q16 = rows16<T>(q, b);
        w.ktp.pack_transposed(k16.p, k16.ld, d.Tk, d.D);
        w.vp.pack(v16.p, v16.ld, d.Tk, d.Dv);
        e.ktp = &w.ktp, e.vp = &w.vp;
      } else {
        e.q = entry_rows<T>(q, b, w.q), e.k = entry_rows<T>(k, b, w.k), e.v = entry_rows<T>(v, b, w.v);
        e.kt = transposed(e.k, d.Tk, d.D, w.kt);
        e.ktp = pack_for<T>(e.kt, d.D, d.Tk, w.ktp);
        e.vp = pack_for<T>(e.v, d.Tk, d.Dv, w.vp);
      }
      for (int64_t i0 = 0; i0 < d.Tq; i0 += kBr) {
        const int64_t rows = std::min(kBr, d.Tq - i0);
        std::fill(m.begin(), m.end(), -std::numeric_limits<A>::infinity());
        std::fill(l.begin(), l.end(), A(0));
        std::fill(acc.begin(), acc.end(), A(0));
        const int64_t jend = p.causal ? std::min(d.Tk, i0 + rows) : d.Tk;
        for (int64_t j0 = 0; j0 < jend; j0 += kBc) {
          const int64_t cols = std::min(kBc, jend - j0);
          score_tile(e, d, p.causal, i0, rows, j0, cols, s.data());
          if (drop) dropout_tile(p, d, b, i0, rows, j0, cols, z.data());
          RowArgs<A> ra{rows, cols, s.data(), drop ? z.data() : nullptr};
          const Diagonal dg(p.causal, i0, j0, cols);
          ra.off = dg.off, ra.cut = dg.cut;
          ra.m = m.data();
          ra.l = l.data();
          ra.acc = acc.data();
          ra.dv = d.Dv;
          run_rows(RowStep::OnlineSoftmax, ra);
          // acc += P V, each stripe of queries over the keys it sees (P is 0 past them)
          dg.query_stripes(rows, cols, [&](int64_t r0, int64_t r1, int64_t n) {
            if (n > 0)
              product(false, r1 - r0, d.Dv, n, A(1), s.data() + r0 * kBc, kBc, e.v, e.vp, j0, 0, A(1),
                      acc.data() + r0 * d.Dv, d.Dv);
          });
        }
        for (int64_t r = 0; r < rows; ++r) {
          // l == 0 only when no key was visible (a visible row has a term exp(0) = 1); a NaN
          // score makes l NaN, which flows into the output and lse.
          const bool empty = l[size_t(r)] == A(0);
          lse_base[b * d.Tq + i0 + r] = empty ? std::numeric_limits<A>::infinity() : m[size_t(r)] + std::log(l[size_t(r)]);
          const A inv = empty ? A(0) : A(1) / l[size_t(r)];
          A* a = acc.data() + r * d.Dv;
          for (int64_t c = 0; c < d.Dv; ++c) a[c] *= inv;
        }
        char* o = out_base + (batch_offset(out, b) + i0 * out_rs) * int64_t(sizeof(T));
        if (out_rs == d.Dv) {
          store_acc<T>(acc.data(), o, int64_t(sizeof(T)), rows * d.Dv);
        } else {
          for (int64_t r = 0; r < rows; ++r)
            store_acc<T>(acc.data() + r * d.Dv, o + r * out_rs * int64_t(sizeof(T)), int64_t(sizeof(T)), d.Dv);
        }
      }
    }
  });
}

// The operands of one backward call, and what every batch entry reads of them.
template <class T>
struct BackwardCall {
  using A = acc_type_t<T>;
  const Tensor &grad_out, &q, &k, &v, &mask, &out, &lse;
  const AttentionParams& p;
  const Tensor &grad_q, &grad_k, &grad_v;
  const Dims& d;
  bool drop = p.dropout_p > 0;
  int64_t mr = mask.defined() ? mask.stride(-2) : 0, mc = mask.defined() ? mask.stride(-1) : 0;
  const A* lse_base = static_cast<const A*>(lse.raw_data());
};

// One thread's buffers: the widened and packed operands, D_i = rowsum(dO * O) of an entry,
// its gradients in A, and one tile's probabilities (pt), dS, dropout factors (z) and
// dropout(P) (pd).
template <class A>
struct BackwardWork {
  Widened<A> w;
  std::vector<A> di, dq, dk, dv;
  std::vector<A> pt, ds, z, pd;
  BackwardWork(const Dims& d, bool drop)
      : di(size_t(d.Tq)),
        dq(size_t(d.Tq * d.D)),
        dk(size_t(d.Tk * d.D)),
        dv(size_t(d.Tk * d.Dv)),
        pt(size_t(kBr * kBc)),
        ds(size_t(kBr * kBc)),
        z(drop ? size_t(kBr * kBc) : 0),
        pd(drop ? size_t(kBr * kBc) : 0) {}
};

// One batch entry of the backward: the forward's Entry (q, k and their packed forms) plus
// v^T and dO, as rows (the widened path) or bfloat16 rows (the direct one), packed or not.
template <class A>
struct BackwardEntry {
  Entry<A> e;
  Rows<A> vt{nullptr, 0}, go{nullptr, 0};
  Rows<BFloat16> go16{nullptr, 0};
  const Bf16Pairs *vtp = nullptr, *gop = nullptr;
};

// Entry b with the operands read as bfloat16 rows in place and packed (direct_bf16), and its D_i.
template <class T, class A = acc_type_t<T>>
BackwardEntry<A> load_entry_bf16(const BackwardCall<T>& c, int64_t b, BackwardWork<A>& w) {
  const Dims& d = c.d;
  BackwardEntry<A> be{
      {{nullptr, 0}, {nullptr, 0}, {nullptr, 0}, {nullptr, 0}, mask_of<A>(c.mask, b), c.mr, c.mc, A(c.p.scale)}};
  const Rows<BFloat16> q16 = rows16<T>(c.q, b), k16 = rows16<T>(c.k, b), v16 = rows16<T>(c.v, b),
                       o16 = rows16<T>(c.out, b);
  be.go16 = rows16<T>(c.grad_out, b);
  be.e.q16 = q16;
  w.w.qp.pack(q16.p, q16.ld, d.Tq, d.D);
  w.w.ktp.pack_transposed(k16.p, k16.ld, d.Tk, d.D);
  w.w.kp.pack(k16.p, k16.ld, d.Tk, d.D);
  w.w.vtp.pack_transposed(v16.p, v16.ld, d.Tk, d.Dv);
  w.w.gop.pack(be.go16.p, be.go16.ld, d.Tq, d.Dv);
  be.e.qp = &w.w.qp, be.e.ktp = &w.w.ktp, be.e.kp = &w.w.kp, be.vtp = &w.w.vtp, be.gop = &w.w.gop;
  for (int64_t i = 0; i < d.Tq; ++i) {
    const BFloat16* gr = be.go16.p + i * be.go16.ld;
    const BFloat16* orow = o16.p + i * o16.ld;
    w.di[size_t(i)] = lane_sum<A>(d.Dv, [&](int64_t col) { return A(float(gr[col])) * A(float(orow[col])); });
  }
  return be;
}

// Entry b with the operands widened to A where they are not already rows of A, k and v
// transposed, packed where the products take bfloat16 pairs (pack_for), and its D_i.
template <class T, class A = acc_type_t<T>>
BackwardEntry<A> load_entry_widened(const BackwardCall<T>& c, int64_t b, BackwardWork<A>& w) {
  const Dims& d = c.d;
  BackwardEntry<A> be{
      {{nullptr, 0}, {nullptr, 0}, {nullptr, 0}, {nullptr, 0}, mask_of<A>(c.mask, b), c.mr, c.mc, A(c.p.scale)}};
  Entry<A>& e = be.e;
  e.q = entry_rows<T>(c.q, b, w.w.q), e.k = entry_rows<T>(c.k, b, w.w.k), e.v = entry_rows<T>(c.v, b, w.w.v);
  e.kt = transposed(e.k, d.Tk, d.D, w.w.kt);
  be.vt = transposed(e.v, d.Tk, d.Dv, w.w.vt);
  be.go = entry_rows<T>(c.grad_out, b, w.w.go);
  const Rows<A> o = entry_rows<T>(c.out, b, w.w.o);
  e.qp = pack_for<T>(e.q, d.Tq, d.D, w.w.qp);
  e.ktp = pack_for<T>(e.kt, d.D, d.Tk, w.w.ktp);
  e.kp = pack_for<T>(e.k, d.Tk, d.D, w.w.kp);
  be.vtp = pack_for<T>(be.vt, d.Dv, d.Tk, w.w.vtp), be.gop = pack_for<T>(be.go, d.Tq, d.Dv, w.w.gop);
  for (int64_t i = 0; i < d.Tq; ++i) {
    const A* gr = be.go.p + i * be.go.ld;
    const A* orow = o.p + i * o.ld;
    w.di[size_t(i)] = lane_sum<A>(d.Dv, [&](int64_t col) { return gr[col] * orow[col]; });
  }
  return be;
}

// The tile of queries i0.. (rows of them) and keys j0.. (cols) of batch entry b, and where
// the causal diagonal cuts it: across it each product runs in stripes over what the stripe sees.
struct BackwardTile {
  int64_t b, i0, rows, j0, cols;
  Diagonal dg;
};

// The tile's probabilities P into w.pt (recomputed from the scores and the saved lse), and
// with dropout its factors into w.z and dropout(P) into w.pd.
template <class T, class A>
void tile_probabilities(const BackwardCall<T>& c, const BackwardEntry<A>& be, const BackwardTile& t,
                        BackwardWork<A>& w) {
  score_tile(be.e, c.d, c.p.causal, t.i0, t.rows, t.j0, t.cols, w.pt.data());
  if (c.drop) dropout_tile(c.p, c.d, t.b, t.i0, t.rows, t.j0, t.cols, w.z.data());
  RowArgs<A> ra{t.rows, t.cols, w.pt.data(), c.drop ? w.z.data() : nullptr};
  ra.off = t.dg.off, ra.cut = t.dg.cut;
  ra.lse = c.lse_base + t.b * c.d.Tq + t.i0;
  ra.pd = w.pd.data();
  run_rows(RowStep::Probabilities, ra);
}

// dV_j += dropout(P)^T dO_i
template <class T, class A>
void add_value_grad(const BackwardCall<T>& c, const BackwardEntry<A>& be, const BackwardTile& t, BackwardWork<A>& w) {
  const A* pv = c.drop ? w.pd.data() : w.pt.data();
  t.dg.key_stripes(t.rows, t.cols, [&](int64_t c0, int64_t c1, int64_t r) {
    if (r < t.rows)
      product(true, c1 - c0, c.d.Dv, t.rows - r, A(1), pv + r * kBc + c0, kBc, be.go, be.gop, t.i0 + r, 0, A(1),
              w.dv.data() + (t.j0 + c0) * c.d.Dv, c.d.Dv);
  });
}

// dS = P * (dropout(dP) - D_i) into w.ds, from dP = dO_i V_j^T (0 where unseen).
template <class T, class A>
void tile_score_grad(const BackwardCall<T>& c, const BackwardEntry<A>& be, const BackwardTile& t, BackwardWork<A>& w) {
  const Rows<A>& go = be.go;
  const Rows<BFloat16>& go16 = be.go16;
  t.dg.query_stripes(t.rows, t.cols, [&](int64_t r0, int64_t r1, int64_t n) {
    if (n > 0)
      product(false, r1 - r0, n, c.d.Dv, A(1), go.p ? go.p + (t.i0 + r0) * go.ld : nullptr, go.ld, be.vt, be.vtp, 0,
              t.j0, A(0), w.ds.data() + r0 * kBc, kBc,
              go16.p ? Rows<BFloat16>{go16.p + (t.i0 + r0) * go16.ld, go16.ld} : go16);
    // ScoreGrad reads each row up to its span (row_span: the keys it sees, rounded up
    // to whole vectors) and zeroes the rest itself; only a span past n is filled here.
    const int64_t upto = std::min(t.cols, (n + kLanes - 1) / kLanes * kLanes);
    for (int64_t r = r0; r < r1 && n < upto; ++r) std::fill_n(w.ds.data() + r * kBc + n, upto - n, A(0));
  });
  RowArgs<A> rg{t.rows, t.cols, w.ds.data(), c.drop ? w.z.data() : nullptr};
  rg.off = t.dg.off, rg.cut = t.dg.cut;
  rg.p = w.pt.data();
  rg.di = w.di.data() + t.i0;
  run_rows(RowStep::ScoreGrad, rg);
}

// dq_i += dS K_j (scaled when stored), dK_j += scale dS^T q_i
template <class T, class A>
void add_query_key_grads(const BackwardCall<T>& c, const BackwardEntry<A>& be, const BackwardTile& t,
                         BackwardWork<A>& w) {
  const Entry<A>& e = be.e;
  t.dg.query_stripes(t.rows, t.cols, [&](int64_t r0, int64_t r1, int64_t n) {
    if (n > 0)
      product(false, r1 - r0, c.d.D, n, A(1), w.ds.data() + r0 * kBc, kBc, e.k, e.kp, t.j0, 0, A(1),
              w.dq.data() + (t.i0 + r0) * c.d.D, c.d.D);
  });
  t.dg.key_stripes(t.rows, t.cols, [&](int64_t c0, int64_t c1, int64_t r) {
    if (r < t.rows)
      product(true, c1 - c0, c.d.D, t.rows - r, e.scale, w.ds.data() + r * kBc + c0, kBc, e.q, e.qp, t.i0 + r, 0, A(1),
              w.dk.data() + (t.j0 + c0) * c.d.D, c.d.D);
  });
}

// Entry b's dq, dK and dV in w, tile by tile: key blocks outside, query blocks inside.
template <class T, class A>
void accumulate_gradients(const BackwardCall<T>& c, int64_t b, const BackwardEntry<A>& be, BackwardWork<A>& w) {
  const Dims& d = c.d;
  std::fill(w.dq.begin(), w.dq.end(), A(0));
  std::fill(w.dk.begin(), w.dk.end(), A(0));
  std::fill(w.dv.begin(), w.dv.end(), A(0));
  for (int64_t j0 = 0; j0 < d.Tk; j0 += kBc) {
    const int64_t cols = std::min(kBc, d.Tk - j0);
    // causal: query blocks that end before key j0 see none of this block's keys
    for (int64_t i0 = c.p.causal ? j0 / kBr * kBr : 0; i0 < d.Tq; i0 += kBr) {
      const int64_t rows = std::min(kBr, d.Tq - i0);
      const BackwardTile t{b, i0, rows, j0, cols, Diagonal(c.p.causal, i0, j0, cols)};
      tile_probabilities(c, be, t, w);
      add_value_grad(c, be, t, w);
      tile_score_grad(c, be, t, w);
      add_query_key_grads(c, be, t, w);
    }
  }
}

// One gradient of entry b, times mul, stored by its strides (unit-stride rows,
// Backend::attention_backward); nothing for an undefined g. Rows far apart (a split
// projection's heads: 128 bytes every 2304) are prefetched for writing eight rows ahead;
// without it their stores cost more than the cat they save.
template <class T, class A>
void store_gradient(const Tensor& g, int64_t b, std::vector<A>& buf, int64_t rows, int64_t cols, A mul) {
  if (!g.defined()) return;
  if (mul != A(1))
    for (A& x : buf) x *= mul;
  constexpr int64_t sz = int64_t(sizeof(T));
  char* base = static_cast<char*>(g.raw_data()) + batch_offset(g, b) * sz;
  const int64_t rs = g.stride(-2);
  if (rs == cols) return store_acc<T>(buf.data(), base, sz, rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    if (r + 8 < rows)
      for (int64_t byte = 0; byte < cols * sz; byte += 64) __builtin_prefetch(base + (r + 8) * rs * sz + byte, 1, 3);
    store_acc<T>(buf.data() + r * cols, base + r * rs * sz, sz, cols);
  }
}

template <class T>
void backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
              const Tensor& out, const Tensor& lse, const AttentionParams& p, const Tensor& grad_q,
              const Tensor& grad_k, const Tensor& grad_v, const Dims& d) {
  using A = acc_type_t<T>;
  const BackwardCall<T> c{grad_out, q, k, v, mask, out, lse, p, grad_q, grad_k, grad_v, d};
  const bool direct = direct_bf16<T>(d, p.causal, {&q, &k, &v, &grad_out, &out});
  parallel_for(0, d.N, d.grain(), [&](int64_t b0, int64_t b1) {
    const std::optional<Bf16TileScope> tiles = bf16_tiles<T>();
    BackwardWork<A> w(d, c.drop);
    for (int64_t b = b0; b < b1; ++b) {
      const BackwardEntry<A> be = direct ? load_entry_bf16(c, b, w) : load_entry_widened(c, b, w);
      accumulate_gradients(c, b, be, w);
      store_gradient<T>(grad_q, b, w.dq, d.Tq, d.D, A(p.scale));
      store_gradient<T>(grad_k, b, w.dk, d.Tk, d.D, A(1));
      store_gradient<T>(grad_v, b, w.dv, d.Tk, d.Dv, A(1));
    }
  });
}

}  // namespace

void CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                           const AttentionParams& p, const Tensor& out, const Tensor& lse) {
  const Dims d(q, k, v);
  if (d.N == 0 || d.Tq == 0) return;
  dispatch_floating(q.dtype(), op::scaled_dot_product_attention,
                    [&]<class T>() { forward<T>(q, k, v, mask, p, out, lse, d); });
}

void CpuBackend::attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& mask, const Tensor& out, const Tensor& lse,
                                    const AttentionParams& p, const Tensor& grad_q, const Tensor& grad_k,
                                    const Tensor& grad_v) {
  const Dims d(q, k, v);
  if (d.N == 0) return;
  dispatch_floating(q.dtype(), op::scaled_dot_product_attention,
                    [&]<class T>() { backward<T>(grad_out, q, k, v, mask, out, lse, p, grad_q, grad_k, grad_v, d); });
}

}  // namespace ampgrad::cpu
