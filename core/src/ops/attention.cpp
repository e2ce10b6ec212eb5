// scaled_dot_product_attention: checks, one backend call each way (Backend::attention and
// attention_backward) and one node.
//
// The kernels see one kind of mask: additive, in the accumulation dtype (float32; float64
// for float64 inputs) and broadcast to [batch..., Tq, Tk] with stride-0 dims, so a [Tq, Tk]
// mask is never copied per head. A bool mask becomes 0 / -inf here (at its own size); the
// causal rule stays a flag, so the CPU kernel skips the key blocks above the diagonal.
// The node saves q, k, v, the mask, the output and the per-row log-sum-exp; the backward
// recomputes the probabilities from them.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "ampgrad/checked.h"
#include "ampgrad/dispatch.h"
#include "ampgrad/factories.h"
#include "ampgrad/ops/nn.h"
#include "internal.h"

namespace ampgrad {

namespace {

constexpr OpName kName = op::scaled_dot_product_attention;

Shape batch_dims(const Tensor& t) {
  Shape s = t.sizes();
  s.erase(s.size() - 1);
  s.erase(s.size() - 1);
  return s;
}

// The mask as the kernels take it (see the file comment), or undefined.
Tensor additive_mask(const Tensor& mask, const Shape& scores, DType acc) {
  if (!mask.defined()) return Tensor();
  bool fits = mask.dim() <= int64_t(scores.size());
  for (int64_t i = 1; fits && i <= mask.dim(); ++i) {
    const int64_t m = mask.sizes()[size_t(mask.dim() - i)], s = scores[scores.size() - size_t(i)];
    fits = m == s || m == 1;
  }
  AG_CHECK(fits, kName, "attn_mask of shape ", mask.sizes(), " does not broadcast to the scores' shape ", scores,
           " ([batch..., Tq, Tk])");
  Tensor add;
  if (mask.dtype() == kBool) {
    add = make_tensor(mask.sizes(), acc, mask.device(), kName);
    backend(mask.device(), kName)
        .where(mask, Operand::scalar(0), Operand::scalar(-std::numeric_limits<double>::infinity()), add);
  } else {
    add = detail::cast_raw(mask, acc);
  }
  return detail::expand_raw(add, scores);
}

// The output [batch..., H, Tq, Dv] for q [batch..., H, Tq, D], in the memory order
// [batch..., Tq, H, Dv]: the heads' outputs of one position side by side, which is the
// order a transformer merges them back in (y.transpose(-3, -2).reshape(..., H * Dv) is
// then a view, not a copy). PyTorch's CPU flash attention returns the same layout. Below
// rank 4 (no batch dim besides the heads) or with H = 1 it is plain contiguous.
Tensor make_output(const Shape& shape, DType dt, Device dev) {
  const size_t n = shape.size();
  if (n < 4 || shape[n - 3] <= 1) return make_tensor(shape, dt, dev, kName);
  Shape mem = shape;
  std::swap(mem[n - 3], mem[n - 2]);
  const Tensor base = make_tensor(mem, dt, dev, kName);
  Shape strides = base.strides();
  std::swap(strides[n - 3], strides[n - 2]);
  return detail::make_view(base, shape, strides, 0);
}

// Fresh tensors for the gradients of q, k and v (the wanted ones). When the three are
// equally spaced slices along one dim of one buffer, with one shape and strides, unit-
// stride rows and no overlap (a transformer's q, k and v: its [B, T, 3C] projection split
// in three and viewed as heads [B, H, T, D]), the gradients are the same slices of one new
// buffer laid out like that parent: the split's backward then finds them already joined
// (no cat) and the heads' transpose and reshape back are views. Otherwise each gradient
// is contiguous.
TensorList gradient_buffers(const Tensor& q, const Tensor& k, const Tensor& v, GradMask need) {
  const Tensor* in[3] = {&q, &k, &v};
  TensorList out(3);
  const bool shared = need[0] && need[1] && need[2] && q.dim() >= 1 && q.stride(-1) == 1 && k.is_alias_of(q) &&
                      v.is_alias_of(q) && k.dtype() == q.dtype() && v.dtype() == q.dtype() &&
                      k.sizes() == q.sizes() && v.sizes() == q.sizes() && k.strides() == q.strides() &&
                      v.strides() == q.strides();
  if (shared) {
    // The three offsets in increasing order, o, o + delta, o + 2 delta, with delta one dim's
    // whole extent: the parent is that dim three times as long.
    int rank[3] = {0, 1, 2};
    std::sort(rank, rank + 3, [&](int a, int b) { return in[a]->storage_offset() < in[b]->storage_offset(); });
    const int64_t o = in[rank[0]]->storage_offset(), delta = in[rank[1]]->storage_offset() - o;
    const int64_t dims = q.dim();
    int64_t j = -1;
    for (int64_t d = 0; d < dims && j < 0 && delta > 0; ++d)
      if (q.stride(d) > 0 && q.size(d) * q.stride(d) == delta) j = d;
    if (j >= 0 && in[rank[2]]->storage_offset() - o == 2 * delta) {
      Shape parent = q.sizes();
      parent[size_t(j)] *= 3;
      if (detail::non_overlapping(parent, q.strides())) {
        const Tensor buf = detail::empty_in_order(parent, q.strides(), q.dtype(), q.device(), kName);
        for (int slot = 0; slot < 3; ++slot)
          out[size_t(rank[slot])] = detail::make_view(buf, q.sizes(), buf.strides(),
                                                      buf.storage_offset() + slot * q.size(j) * buf.stride(j));
        return out;
      }
    }
  }
  for (size_t i = 0; i < 3; ++i)
    if (need[i]) out[i] = make_tensor(in[i]->sizes(), in[i]->dtype(), in[i]->device(), kName);
  return out;
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) {
  if (auto in = dispatch::autocast(kName, q, k, v, opts.attn_mask)) {
    AttentionOptions cast = opts;
    cast.attn_mask = (*in)[3];
    return scaled_dot_product_attention((*in)[0], (*in)[1], (*in)[2], cast);
  }
  detail::check_defined(q, kName, "query");
  detail::check_defined(k, kName, "key");
  detail::check_defined(v, kName, "value");
  detail::check_same_device(q, k, kName);
  detail::check_same_device(q, v, kName);
  AG_CHECK(is_floating(q.dtype()), kName, "query must be floating, got ", dtype_name(q.dtype()));
  AG_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), kName, "query, key and value must share a dtype, got ",
           dtype_name(q.dtype()), ", ", dtype_name(k.dtype()), " and ", dtype_name(v.dtype()));
  AG_CHECK(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim(), kName,
           "query, key and value must have one rank of at least 2 ([batch..., T, D]), got shapes ", q.sizes(), ", ",
           k.sizes(), " and ", v.sizes());
  AG_CHECK(batch_dims(k) == batch_dims(q) && batch_dims(v) == batch_dims(q), kName,
           "query, key and value must have the same batch dims, got shapes ", q.sizes(), ", ", k.sizes(), " and ",
           v.sizes());
  const int64_t Tq = q.size(-2), Tk = k.size(-2), D = q.size(-1);
  AG_CHECK(k.size(-1) == D, kName, "key's last dim ", k.size(-1), " must equal query's ", D, " (shapes ", q.sizes(),
           " and ", k.sizes(), ")");
  AG_CHECK(v.size(-2) == Tk, kName, "value has ", v.size(-2), " positions but key has ", Tk, " (shapes ", k.sizes(),
           " and ", v.sizes(), ")");
  AG_CHECK(opts.dropout_p >= 0 && opts.dropout_p < 1, kName, "dropout_p must be in [0, 1), got ", opts.dropout_p);
  AttentionParams p;
  p.scale = opts.scale ? *opts.scale : D > 0 ? 1 / std::sqrt(double(D)) : 1.0;
  AG_CHECK(std::isfinite(p.scale), kName, "scale must be finite, got ", p.scale);
  p.causal = opts.is_causal;
  p.dropout_p = opts.dropout_p;
  const Tensor& mask = opts.attn_mask;
  if (mask.defined()) {
    detail::check_same_device(q, mask, kName);
    AG_CHECK(!opts.is_causal, kName, "is_causal and attn_mask cannot both be set (the causal rule is a mask)");
    AG_CHECK(mask.dtype() == kBool || is_floating(mask.dtype()), kName, "attn_mask must be bool or floating, got ",
             dtype_name(mask.dtype()));
    AG_CHECK(!(mask.requires_grad() && GradMode::is_enabled()), kName,
             "attn_mask requires grad, but no gradient flows to the mask; pass it detached");
  }

  const DType acc = q.dtype() == kFloat64 ? kFloat64 : kFloat32;
  Shape scores = batch_dims(q);
  scores.push_back(Tq);
  scores.push_back(Tk);
  const int64_t n_scores = checked_numel(scores, kName);
  const Tensor add_mask = additive_mask(mask, scores, acc);
  if (p.dropout_p > 0) {
    const auto state = generator_advance(uint64_t(n_scores));
    p.seed = state.first;
    p.offset = state.second;
  }
  Shape out_shape = batch_dims(q);
  out_shape.push_back(Tq);
  Shape lse_shape = out_shape;
  out_shape.push_back(v.size(-1));
  Tensor out = make_output(out_shape, q.dtype(), q.device());
  Tensor lse = make_tensor(lse_shape, acc, q.device(), kName);
  backend(q.device(), kName).attention(q, k, v, add_mask, p, out, lse);
  if (any_requires_grad({&q, &k, &v}))
    record(kName, {q, k, v}, {out},
           [sq = SavedTensor(q), sk = SavedTensor(k), sv = SavedTensor(v), sm = SavedTensor(add_mask),
            so = SavedTensor(out), sl = SavedTensor(lse), p](const TensorList& g, GradMask need) -> TensorList {
             const Tensor &qs = sq.get(), &ks = sk.get(), &vs = sv.get();
             const TensorList grads = gradient_buffers(qs, ks, vs, need);
             const Tensor &gq = grads[0], &gk = grads[1], &gv = grads[2];
             backend(qs.device(), kName)
                 .attention_backward(detail::cast_raw(g[0], qs.dtype()), qs, ks, vs, sm.get(), so.get(), sl.get(), p,
                                     gq, gk, gv);
             return {gq, gk, gv};
           });
  return out;
}

}  // namespace ampgrad
