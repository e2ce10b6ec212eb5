// Scaled dot-product attention on the CPU: the Backend entries attention and
// attention_backward (backend.h has their contract), FlashAttention-2's algorithm on tiles.
//
// One task per batch entry (a head), spread by parallel_for with grain 1 (each is big
// work; entries under a megaflop are grouped). A task widens its q (times the scale: Qs), k and v into contiguous buffers of the
// accumulation type A (float; double for float64 inputs) with load_acc, then:
//   forward   for each block of kBr queries, walks the blocks of kBc keys (stopping at the
//             diagonal when causal) with a running max m, normaliser l and output
//             accumulator per row (the online softmax): S = Qs K^T + mask (-inf where
//             causal hides a key), m' = max(m, rowmax S), P = exp(S - m'),
//             l = l e^(m - m') + rowsum P, acc = acc e^(m - m') + dropout(P) V. Only one
//             [kBr, kBc] tile of scores exists at a time, whatever T is. The output is acc / l;
//             lse = m + log l is saved per row, +inf for a row with no visible key (l = 0),
//             whose output is 0 rather than 0/0.
//   backward  recomputes each tile's probabilities from q, k and the saved lse,
//             P = exp(S - lse) (0 on a row whose lse is +inf), and with D_i = rowsum(dO * O)
//             (O the saved output): dV += dropout(P)^T dO, dP = dropout(dO V^T),
//             dS = P * (dP - D_i), dQs += dS K, dK += dS^T Qs; dq = scale * dQs, and dK
//             carries the scale through Qs. Key blocks are the outer loop, so a block's dK
//             and dV stay in cache while the query blocks pass.
// The products are tile_gemm calls (gemm.h: oneDNN's sgemm for float in the oneDNN build);
// the row work (max, exp_acc, sums) is written so that it vectorises. Dropout draws the keep
// decision of probability (b, i, j) from Philox counter offset + (b * Tq + i) * Tk + j in both
// directions (AttentionParams), so the backward regenerates the forward's mask and nothing
// [Tq, Tk]-sized is saved.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/gemm.h"
#include "cpu/parallel.h"
#include "cpu/rows.h"
#include "cpu/vec.h"
#include "philox.h"

namespace ampgrad::cpu {
namespace {

constexpr int64_t kBr = 64;  // queries per tile
constexpr int64_t kBc = 64;  // keys per tile (the leading dimension of the score tiles)

// The sizes of one call: N batch entries (the batch dims flattened row-major), Tq queries,
// Tk keys, head dims D (q, k) and Dv (v).
struct Dims {
  int64_t N = 1, Tq, Tk, D, Dv;
  Dims(const Tensor& q, const Tensor& k, const Tensor& v)
      : Tq(q.size(-2)), Tk(k.size(-2)), D(q.size(-1)), Dv(v.size(-1)) {
    for (int64_t i = 0; i + 2 < q.dim(); ++i) N *= q.size(i);
  }
  // Batch entries per parallel chunk: one, unless an entry is too small (under about a
  // megaflop) to repay waking another thread, as for conv_common's products.
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

// Batch entry b of t [batch..., R, C] (element type T, any strides) widened into dst
// [R, C] (contiguous), times mul.
template <class T, class A>
void load_entry(const Tensor& t, int64_t b, A* dst, A mul) {
  const int64_t R = t.size(-2), C = t.size(-1), rs = t.stride(-2), cs = t.stride(-1);
  const char* base = static_cast<const char*>(t.raw_data()) + batch_offset(t, b) * int64_t(sizeof(T));
  for (int64_t r = 0; r < R; ++r) {
    A* row = dst + r * C;
    load_acc<T>(base + r * rs * int64_t(sizeof(T)), cs * int64_t(sizeof(T)), row, C);
    if (mul != A(1))
      for (int64_t c = 0; c < C; ++c) row[c] *= mul;
  }
}

// What a task reads of one batch entry: its widened operands and its mask.
template <class A>
struct Entry {
  const A *qs, *k, *v;  // [Tq, D] (times the scale), [Tk, D], [Tk, Dv]
  const A* mask;        // element (i, j) at mask[i * mr + j * mc], or null
  int64_t mr, mc;
};

// The score tile s [rows, cols] (leading dim kBc) of queries i0.. and keys j0..:
// Qs K^T + mask, and -inf where the causal rule hides key j from query i (j > i).
template <class A>
void score_tile(const Entry<A>& e, const Dims& d, bool causal, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                A* s) {
  tile_gemm(false, true, rows, cols, d.D, A(1), e.qs + i0 * d.D, d.D, e.k + j0 * d.D, d.D, A(0), s, kBc);
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

template <class A>
const A* mask_of(const Tensor& mask, int64_t b) {
  return mask.defined() ? static_cast<const A*>(mask.raw_data()) + batch_offset(mask, b) : nullptr;
}

template <class T>
void forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const AttentionParams& p,
             const Tensor& out, const Tensor& lse, const Dims& d) {
  using A = acc_type_t<T>;
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();
  const bool drop = p.dropout_p > 0;
  const int64_t mr = mask.defined() ? mask.stride(-2) : 0, mc = mask.defined() ? mask.stride(-1) : 0;
  char* out_base = static_cast<char*>(out.raw_data());
  A* lse_base = static_cast<A*>(lse.raw_data());
  parallel_for(0, d.N, d.grain(), [&](int64_t b0, int64_t b1) {
    std::vector<A> qs(size_t(d.Tq * d.D)), kb(size_t(d.Tk * d.D)), vb(size_t(d.Tk * d.Dv));
    std::vector<A> s(size_t(kBr * kBc)), z(drop ? size_t(kBr * kBc) : 0), acc(size_t(kBr * d.Dv)), m(kBr), l(kBr);
    for (int64_t b = b0; b < b1; ++b) {
      load_entry<T>(q, b, qs.data(), A(p.scale));
      load_entry<T>(k, b, kb.data(), A(1));
      load_entry<T>(v, b, vb.data(), A(1));
      const Entry<A> e{qs.data(), kb.data(), vb.data(), mask_of<A>(mask, b), mr, mc};
      for (int64_t i0 = 0; i0 < d.Tq; i0 += kBr) {
        const int64_t rows = std::min(kBr, d.Tq - i0);
        std::fill(m.begin(), m.end(), kNegInf);
        std::fill(l.begin(), l.end(), A(0));
        std::fill(acc.begin(), acc.end(), A(0));
        const int64_t jend = p.causal ? std::min(d.Tk, i0 + rows) : d.Tk;
        for (int64_t j0 = 0; j0 < jend; j0 += kBc) {
          const int64_t cols = std::min(kBc, jend - j0);
          score_tile(e, d, p.causal, i0, rows, j0, cols, s.data());
          if (drop) dropout_tile(p, d, b, i0, rows, j0, cols, z.data());
          for (int64_t r = 0; r < rows; ++r) {
            A* row = s.data() + r * kBc;
            const A mx = row_max(row, cols);
            const A m_new = mx > m[size_t(r)] ? mx : m[size_t(r)];
            // A row with nothing visible yet keeps max -inf: shift by 0, not by -inf (-inf - -inf
            // would be NaN); its exps are 0 and its accumulator stays 0.
            const A shift = m_new == kNegInf ? A(0) : m_new;
            const A alpha = exp_acc(m[size_t(r)] - shift);
            for (int64_t c = 0; c < cols; ++c) row[c] = exp_acc(row[c] - shift);
            l[size_t(r)] = l[size_t(r)] * alpha + lane_sum<A>(cols, [&](int64_t c) { return row[c]; });
            m[size_t(r)] = m_new;
            if (alpha != A(1)) {
              A* a = acc.data() + r * d.Dv;
              for (int64_t c = 0; c < d.Dv; ++c) a[c] *= alpha;
            }
            if (drop) {
              const A* zr = z.data() + r * kBc;
              for (int64_t c = 0; c < cols; ++c) row[c] *= zr[c];
            }
          }
          tile_gemm(false, false, rows, d.Dv, cols, A(1), s.data(), kBc, e.v + j0 * d.Dv, d.Dv, A(1), acc.data(), d.Dv);
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
        store_acc<T>(acc.data(), out_base + (b * d.Tq + i0) * d.Dv * int64_t(sizeof(T)), int64_t(sizeof(T)),
                     rows * d.Dv);
      }
    }
  });
}

template <class T>
void backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
              const Tensor& out, const Tensor& lse, const AttentionParams& p, const Tensor& grad_q,
              const Tensor& grad_k, const Tensor& grad_v, const Dims& d) {
  using A = acc_type_t<T>;
  const bool drop = p.dropout_p > 0;
  const int64_t mr = mask.defined() ? mask.stride(-2) : 0, mc = mask.defined() ? mask.stride(-1) : 0;
  const A* lse_base = static_cast<const A*>(lse.raw_data());
  parallel_for(0, d.N, d.grain(), [&](int64_t b0, int64_t b1) {
    std::vector<A> qs(size_t(d.Tq * d.D)), kb(size_t(d.Tk * d.D)), vb(size_t(d.Tk * d.Dv));
    std::vector<A> go(size_t(d.Tq * d.Dv)), o(size_t(d.Tq * d.Dv)), di(size_t(d.Tq));
    std::vector<A> dq(size_t(d.Tq * d.D)), dk(size_t(d.Tk * d.D)), dv(size_t(d.Tk * d.Dv));
    std::vector<A> pt(size_t(kBr * kBc)), ds(size_t(kBr * kBc)), z(drop ? size_t(kBr * kBc) : 0),
        pd(drop ? size_t(kBr * kBc) : 0);
    for (int64_t b = b0; b < b1; ++b) {
      load_entry<T>(q, b, qs.data(), A(p.scale));
      load_entry<T>(k, b, kb.data(), A(1));
      load_entry<T>(v, b, vb.data(), A(1));
      load_entry<T>(grad_out, b, go.data(), A(1));
      load_entry<T>(out, b, o.data(), A(1));
      for (int64_t i = 0; i < d.Tq; ++i) {
        const A* gr = go.data() + i * d.Dv;
        const A* orow = o.data() + i * d.Dv;
        di[size_t(i)] = lane_sum<A>(d.Dv, [&](int64_t c) { return gr[c] * orow[c]; });
      }
      std::fill(dq.begin(), dq.end(), A(0));
      std::fill(dk.begin(), dk.end(), A(0));
      std::fill(dv.begin(), dv.end(), A(0));
      const Entry<A> e{qs.data(), kb.data(), vb.data(), mask_of<A>(mask, b), mr, mc};
      const A* lse_b = lse_base + b * d.Tq;
      for (int64_t j0 = 0; j0 < d.Tk; j0 += kBc) {
        const int64_t cols = std::min(kBc, d.Tk - j0);
        // causal: query blocks that end before key j0 see none of this block's keys
        for (int64_t i0 = p.causal ? j0 / kBr * kBr : 0; i0 < d.Tq; i0 += kBr) {
          const int64_t rows = std::min(kBr, d.Tq - i0);
          score_tile(e, d, p.causal, i0, rows, j0, cols, pt.data());
          for (int64_t r = 0; r < rows; ++r) {
            A* row = pt.data() + r * kBc;
            const A shift = lse_b[i0 + r];  // +inf on an empty row: exp gives 0
            for (int64_t c = 0; c < cols; ++c) row[c] = exp_acc(row[c] - shift);
          }
          const A* dropped = pt.data();
          if (drop) {
            dropout_tile(p, d, b, i0, rows, j0, cols, z.data());
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t c = 0; c < cols; ++c) pd[size_t(r * kBc + c)] = pt[size_t(r * kBc + c)] * z[size_t(r * kBc + c)];
            dropped = pd.data();
          }
          // dV_j += dropout(P)^T dO_i; dP = dO_i V_j^T
          tile_gemm(true, false, cols, d.Dv, rows, A(1), dropped, kBc, go.data() + i0 * d.Dv, d.Dv, A(1),
                    dv.data() + j0 * d.Dv, d.Dv);
          tile_gemm(false, true, rows, cols, d.Dv, A(1), go.data() + i0 * d.Dv, d.Dv, e.v + j0 * d.Dv, d.Dv, A(0),
                    ds.data(), kBc);
          for (int64_t r = 0; r < rows; ++r) {
            A* dsr = ds.data() + r * kBc;
            const A* pr = pt.data() + r * kBc;
            const A dr = di[size_t(i0 + r)];
            if (drop) {
              const A* zr = z.data() + r * kBc;
              for (int64_t c = 0; c < cols; ++c) dsr[c] = pr[c] * (dsr[c] * zr[c] - dr);
            } else {
              for (int64_t c = 0; c < cols; ++c) dsr[c] = pr[c] * (dsr[c] - dr);
            }
          }
          // dQs_i += dS K_j; dK_j += dS^T Qs_i
          tile_gemm(false, false, rows, d.D, cols, A(1), ds.data(), kBc, e.k + j0 * d.D, d.D, A(1),
                    dq.data() + i0 * d.D, d.D);
          tile_gemm(true, false, cols, d.D, rows, A(1), ds.data(), kBc, e.qs + i0 * d.D, d.D, A(1),
                    dk.data() + j0 * d.D, d.D);
        }
      }
      const auto store = [&](const Tensor& g, std::vector<A>& buf, int64_t rows, int64_t cols, A mul) {
        if (!g.defined()) return;
        if (mul != A(1))
          for (A& x : buf) x *= mul;
        store_acc<T>(buf.data(), static_cast<char*>(g.raw_data()) + b * rows * cols * int64_t(sizeof(T)),
                     int64_t(sizeof(T)), rows * cols);
      };
      store(grad_q, dq, d.Tq, d.D, A(p.scale));
      store(grad_k, dk, d.Tk, d.D, A(1));
      store(grad_v, dv, d.Tk, d.Dv, A(1));
    }
  });
}

}  // namespace

void CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                           const AttentionParams& p, const Tensor& out, const Tensor& lse) {
  const Dims d(q, k, v);
  if (d.N == 0 || d.Tq == 0) return;
  dispatch_floating(q.dtype(), "scaled_dot_product_attention",
                    [&]<class T>() { forward<T>(q, k, v, mask, p, out, lse, d); });
}

void CpuBackend::attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& mask, const Tensor& out, const Tensor& lse,
                                    const AttentionParams& p, const Tensor& grad_q, const Tensor& grad_k,
                                    const Tensor& grad_v) {
  const Dims d(q, k, v);
  if (d.N == 0) return;
  dispatch_floating(q.dtype(), "scaled_dot_product_attention", [&]<class T>() {
    backward<T>(grad_out, q, k, v, mask, out, lse, p, grad_q, grad_k, grad_v, d);
  });
}

}  // namespace ampgrad::cpu
