// Convolution through oneDNN primitives, pooling through oneDNN's primitives or the shared
// loops (the AMPGRAD_ONEDNN=ON build).
//
// Forward, backward-data and backward-weights (with the bias gradient fused) are oneDNN
// convolution primitives created with "any" layouts: oneDNN picks blocked layouts for its
// direct JIT kernels, and cached reorders move the caller's plain NCHW / OIHW (GOIHW with
// groups) tensors in and out through scratch tensors: on CNN-sized layers the direct
// kernels beat the GEMM-based ones oneDNN uses for plain layouts, reorders included. Each primitive and its reorders form one cached plan
// (onednn_cache.h); the backward ones are created with a forward hint as oneDNN requires.
// float32 and bfloat16 run natively; float16 without a oneDNN f16 kernel on this CPU goes
// through float32 copies, and float64 (which oneDNN lacks) through im2col + Eigen.
//
// Pooling runs oneDNN's pooling primitives (JIT-compiled vector code, where the loops are scalar)
// wherever they agree with PyTorch's window rules, and conv_common's loops, which follow
// those rules exactly, elsewhere: inputs holding a NaN or -inf (oneDNN's max skips NaNs and
// starts from the lowest finite value), average
// pooling whose ceil_mode window overhangs the padding with count_include_pad, float16
// and float64. max_pool2d saves oneDNN's workspace or the loops' int64 indices.

#include "cpu/block_pool.h"
#include "cpu/conv_common.h"
#include "cpu/cpu_backend.h"
#include "cpu/onednn_cache.h"
#include "cpu/parallel.h"

namespace ampgrad::cpu {
namespace {

using namespace onednn;

enum class ConvKind : int64_t { Forward = 2, BackwardData = 3, BackwardWeights = 4 };

// The problem, read off the input, weight and output shapes.
struct ConvProblem {
  memory::dims src, wei, dst, bias, strides, dilation, padding;
  memory::format_tag wtag;
  ConvProblem(const Shape& x, const Shape& w, const Shape& y, const Conv2dParams& p) {
    src = {x[0], x[1], x[2], x[3]};
    dst = {y[0], y[1], y[2], y[3]};
    bias = {w[0]};
    if (p.groups > 1) {
      wei = {p.groups, w[0] / p.groups, w[1], w[2], w[3]};
      wtag = memory::format_tag::goihw;
    } else {
      wei = {w[0], w[1], w[2], w[3]};
      wtag = memory::format_tag::oihw;
    }
    strides = {p.stride[0], p.stride[1]};
    dilation = {p.dilation[0] - 1, p.dilation[1] - 1};  // oneDNN counts the gaps
    // Symmetric padding gives oneDNN's output size the same floor as PyTorch's.
    padding = {p.padding[0], p.padding[1]};
  }
  Key key(ConvKind kind, DType dtype, bool bias_too) const {
    Key k;
    k << int64_t(kind) << int64_t(dtype) << bias_too;
    for (const auto* v : {&src, &wei, &dst, &strides, &dilation, &padding})
      for (int64_t d : *v) k << d;
    return k;
  }
  // The caller's plain layouts, and "any" for the primitive to choose its own.
  memory::desc src_md(dt t, bool any) const { return {src, t, any ? memory::format_tag::any : memory::format_tag::nchw}; }
  memory::desc dst_md(dt t, bool any) const { return {dst, t, any ? memory::format_tag::any : memory::format_tag::nchw}; }
  memory::desc wei_md(dt t, bool any) const { return {wei, t, any ? memory::format_tag::any : wtag}; }
  memory::desc bias_md(dt t) const { return {bias, t, memory::format_tag::a}; }

  dnnl::convolution_forward::primitive_desc forward_pd(dt t, bool with_bias) const {
    const auto d = with_bias
        ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                          src_md(t, true), wei_md(t, true), bias_md(t), dst_md(t, true),
                                          strides, dilation, padding, padding)
        : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                          src_md(t, true), wei_md(t, true), dst_md(t, true), strides,
                                          dilation, padding, padding);
    return {d, engine()};
  }
};

Cache<PrimitivePlan>& conv_cache() {
  static auto* c = new Cache<PrimitivePlan>();
  return *c;
}

// blocked: the caller's destination (forward) or its gradient (backward) is in the
// layout the forward without bias chose (conv2d_block's activation), not plain NCHW.
std::shared_ptr<PrimitivePlan> build_plan(const ConvProblem& cp, ConvKind kind, dt t, bool bias, bool blocked) {
  const auto fwd = cp.forward_pd(t, bias && kind != ConvKind::BackwardData);
  const memory::desc dst_user = blocked ? cp.forward_pd(t, false).dst_desc() : cp.dst_md(t, false);
  switch (kind) {
    case ConvKind::Forward: {
      std::vector<ArgSpec> specs{{DNNL_ARG_SRC, cp.src_md(t, false), fwd.src_desc(), false},
                                 {DNNL_ARG_WEIGHTS, cp.wei_md(t, false), fwd.weights_desc(), false}};
      if (bias) specs.push_back({DNNL_ARG_BIAS, cp.bias_md(t), fwd.bias_desc(), false});
      specs.push_back({DNNL_ARG_DST, dst_user, fwd.dst_desc(), true});
      auto plan = make_plan<dnnl::convolution_forward>(fwd, specs);
      plan->dst_user = dst_user;
      return plan;
    }
    case ConvKind::BackwardData: {
      const dnnl::convolution_backward_data::desc d(dnnl::algorithm::convolution_direct, cp.src_md(t, true),
                                                    cp.wei_md(t, true), cp.dst_md(t, true), cp.strides,
                                                    cp.dilation, cp.padding, cp.padding);
      const dnnl::convolution_backward_data::primitive_desc pd(d, engine(), fwd);
      return make_plan<dnnl::convolution_backward_data>(
          pd, {{DNNL_ARG_DIFF_DST, dst_user, pd.diff_dst_desc(), false},
               {DNNL_ARG_WEIGHTS, cp.wei_md(t, false), pd.weights_desc(), false},
               {DNNL_ARG_DIFF_SRC, cp.src_md(t, false), pd.diff_src_desc(), true}});
    }
    case ConvKind::BackwardWeights: {
      const auto d = bias ? dnnl::convolution_backward_weights::desc(
                                dnnl::algorithm::convolution_direct, cp.src_md(t, true), cp.wei_md(t, true),
                                cp.bias_md(t), cp.dst_md(t, true), cp.strides, cp.dilation, cp.padding, cp.padding)
                          : dnnl::convolution_backward_weights::desc(
                                dnnl::algorithm::convolution_direct, cp.src_md(t, true), cp.wei_md(t, true),
                                cp.dst_md(t, true), cp.strides, cp.dilation, cp.padding, cp.padding);
      const dnnl::convolution_backward_weights::primitive_desc pd(d, engine(), fwd);
      std::vector<ArgSpec> specs{{DNNL_ARG_SRC, cp.src_md(t, false), pd.src_desc(), false},
                                 {DNNL_ARG_DIFF_DST, dst_user, pd.diff_dst_desc(), false},
                                 {DNNL_ARG_DIFF_WEIGHTS, cp.wei_md(t, false), pd.diff_weights_desc(), true}};
      if (bias) specs.push_back({DNNL_ARG_DIFF_BIAS, cp.bias_md(t), pd.diff_bias_desc(), true});
      return make_plan<dnnl::convolution_backward_weights>(pd, specs);
    }
  }
  return std::make_shared<PrimitivePlan>();
}

// The cached plan; oneDNN having no (or only a reference) kernel gives a not-ok plan.
std::shared_ptr<PrimitivePlan> get_plan(const ConvProblem& cp, ConvKind kind, DType dtype, bool bias,
                                        bool blocked = false, const char* op = ampgrad::op::conv2d) {
  return guarded(op, [&] {
    return conv_cache().get(cp.key(kind, dtype, bias) << blocked, [&] {
      try {
        return build_plan(cp, kind, dnnl_type(dtype), bias, blocked);
      } catch (const dnnl::error& e) {
        if (e.status == dnnl_unimplemented) return std::make_shared<PrimitivePlan>();
        throw;
      }
    });
  }, [&] {
    return std::string(dtype_name(dtype)) + " input " + dims_str(cp.src) + ", weight " + dims_str(cp.wei) +
           ", output " + dims_str(cp.dst) + ", stride " + dims_str(cp.strides) + ", padding " + dims_str(cp.padding) +
           ", dilation gaps " + dims_str(cp.dilation);
  });
}

Tensor float_or_undefined(const Tensor& t) {
  if (!t.defined()) return t;
  Tensor f = make_tensor(t.sizes(), kFloat32, t.device());
  cpu_backend().copy(t, f);
  return f;
}

Tensor float_like(const Tensor& t) { return t.defined() ? make_tensor(t.sizes(), kFloat32, t.device()) : t; }

void copy_back(const Tensor& from, const Tensor& to) {
  if (to.defined()) cpu_backend().copy(from, to);
}

}  // namespace

void CpuBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                        const Conv2dParams& p) {
  if (out.numel() == 0) return;
  if (out.dtype() == kFloat64) return eigen_conv2d(x, w, bias, out, p);
  const ConvProblem cp(x.sizes(), w.sizes(), out.sizes(), p);
  auto plan = get_plan(cp, ConvKind::Forward, out.dtype(), bias.defined());
  if (!plan->ok()) {
    Tensor of = float_like(out);
    conv2d(float_or_undefined(x), float_or_undefined(w), float_or_undefined(bias), of, p);
    return copy_back(of, out);
  }
  if (bias.defined()) plan->execute({x.raw_data(), w.raw_data(), bias.raw_data(), out.raw_data()}, op::conv2d);
  else plan->execute({x.raw_data(), w.raw_data(), out.raw_data()}, op::conv2d);
}

void CpuBackend::conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Tensor& grad_in,
                                       const Conv2dParams& p) {
  if (grad_in.numel() == 0) return;
  if (grad_out.numel() == 0) return fill(grad_in, 0);
  if (grad_in.dtype() == kFloat64) return eigen_conv2d_backward_input(grad_out, w, grad_in, p);
  const ConvProblem cp(grad_in.sizes(), w.sizes(), grad_out.sizes(), p);
  auto plan = get_plan(cp, ConvKind::BackwardData, grad_in.dtype(), false);
  if (!plan->ok()) {
    Tensor gf = float_like(grad_in);
    conv2d_backward_input(float_or_undefined(grad_out), float_or_undefined(w), gf, p);
    return copy_back(gf, grad_in);
  }
  plan->execute({grad_out.raw_data(), w.raw_data(), grad_in.raw_data()}, op::conv2d);
}

void CpuBackend::conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Tensor& grad_w,
                                        const Tensor& grad_bias, const Conv2dParams& p) {
  if (!grad_w.defined()) {
    if (grad_bias.defined()) conv_bias_grad(grad_out, grad_bias);
    return;
  }
  if (grad_w.numel() == 0) {
    if (grad_bias.defined()) conv_bias_grad(grad_out, grad_bias);
    return;
  }
  if (grad_out.numel() == 0) {
    fill(grad_w, 0);
    if (grad_bias.defined()) fill(grad_bias, 0);
    return;
  }
  if (grad_w.dtype() == kFloat64) return eigen_conv2d_backward_weight(grad_out, x, grad_w, grad_bias, p);
  const ConvProblem cp(x.sizes(), grad_w.sizes(), grad_out.sizes(), p);
  auto plan = get_plan(cp, ConvKind::BackwardWeights, grad_w.dtype(), grad_bias.defined());
  if (!plan->ok()) {
    Tensor gw = float_like(grad_w), gb = float_like(grad_bias);
    conv2d_backward_weight(float_or_undefined(grad_out), float_or_undefined(x), gw, gb, p);
    copy_back(gw, grad_w);
    return copy_back(gb, grad_bias);
  }
  if (grad_bias.defined())
    plan->execute({x.raw_data(), grad_out.raw_data(), grad_w.raw_data(), grad_bias.raw_data()}, op::conv2d);
  else plan->execute({x.raw_data(), grad_out.raw_data(), grad_w.raw_data()}, op::conv2d);
}

// ---- pooling -----------------------------------------------------------------------------

namespace {

enum class PoolKind : int64_t { MaxForward = 5, MaxBackward = 6, AvgForward = 7, AvgBackward = 8 };

// A pooling problem in oneDNN's terms. ceil_mode becomes extra right padding, just enough
// for oneDNN's floor-based output size to equal ours.
struct PoolProblem {
  memory::dims src, dst, strides, kernel, dilation, pad_l, pad_r;
  PoolProblem(const Shape& x, const Shape& y, const Pool2dParams& p) {
    src = {x[0], x[1], x[2], x[3]};
    dst = {y[0], y[1], y[2], y[3]};
    for (int i = 0; i < 2; ++i) {
      const int64_t in = x[2 + i], out = y[2 + i], k = p.kernel[i], s = p.stride[i], d = p.dilation[i];
      const int64_t pl = p.padding[i], floor_out = (in + 2 * pl - d * (k - 1) - 1) / s + 1;
      strides.push_back(s);
      kernel.push_back(k);
      dilation.push_back(d - 1);  // oneDNN counts the gaps
      pad_l.push_back(pl);
      pad_r.push_back(out == floor_out ? pl : (out - 1) * s + d * (k - 1) + 1 - in - pl);
    }
  }
  // ceil_mode's last window reaches past the declared padding.
  bool overhang() const { return pad_r != pad_l; }
  Key key(PoolKind kind, DType dtype, bool include_pad) const {
    Key k;
    k << int64_t(kind) << int64_t(dtype) << include_pad;
    for (const auto* v : {&src, &dst, &strides, &kernel, &dilation, &pad_l, &pad_r})
      for (int64_t d : *v) k << d;
    return k;
  }
};

struct PoolEntry {
  std::shared_ptr<Prim> prim;  // null: no fast kernel
  size_t workspace_bytes = 0;
};

Cache<PoolEntry>& pool_cache() {
  static auto* c = new Cache<PoolEntry>();
  return *c;
}

std::shared_ptr<PoolEntry> get_pool(const PoolProblem& pp, PoolKind kind, DType dtype, bool include_pad) {
  return guarded("pool2d", [&] {
    return pool_cache().get(pp.key(kind, dtype, include_pad), [&] {
      auto e = std::make_shared<PoolEntry>();
      const dt t = dnnl_type(dtype);
      const bool is_max = kind == PoolKind::MaxForward || kind == PoolKind::MaxBackward;
      const auto alg = is_max ? dnnl::algorithm::pooling_max
                              : include_pad ? dnnl::algorithm::pooling_avg_include_padding
                                            : dnnl::algorithm::pooling_avg_exclude_padding;
      const memory::desc src(pp.src, t, memory::format_tag::nchw), dst(pp.dst, t, memory::format_tag::nchw);
      try {
        const dnnl::pooling_v2_forward::primitive_desc fwd(
            dnnl::pooling_v2_forward::desc(dnnl::prop_kind::forward_training, alg, src, dst, pp.strides, pp.kernel,
                                           pp.dilation, pp.pad_l, pp.pad_r),
            engine());
        const memory::desc ws = fwd.workspace_desc();
        e->workspace_bytes = ws.get_size();
        if (kind == PoolKind::MaxForward || kind == PoolKind::AvgForward) {
          if (is_reference(fwd)) return e;
          std::vector<std::pair<int, memory::desc>> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}};
          if (is_max) args.push_back({DNNL_ARG_WORKSPACE, ws});
          e->prim = std::make_shared<Prim>(dnnl::pooling_v2_forward(fwd), args);
        } else {
          const dnnl::pooling_v2_backward::primitive_desc bwd(
              dnnl::pooling_v2_backward::desc(alg, src, dst, pp.strides, pp.kernel, pp.dilation, pp.pad_l, pp.pad_r),
              engine(), fwd);
          if (is_reference(bwd)) return e;
          std::vector<std::pair<int, memory::desc>> args{{DNNL_ARG_DIFF_DST, dst}};
          if (is_max) args.push_back({DNNL_ARG_WORKSPACE, ws});
          args.push_back({DNNL_ARG_DIFF_SRC, src});
          e->prim = std::make_shared<Prim>(dnnl::pooling_v2_backward(bwd), args);
        }
      } catch (const dnnl::error& err) {
        // Geometry oneDNN does not take (strides near int64's max, say) is still valid
        // pooling: the loops compute it.
        if (err.status != dnnl_unimplemented && err.status != dnnl_invalid_arguments) throw;
      }
      return e;
    });
  }, [&] {
    return std::string(dtype_name(dtype)) + " input " + dims_str(pp.src) + ", output " + dims_str(pp.dst) +
           ", kernel " + dims_str(pp.kernel) + ", stride " + dims_str(pp.strides) + ", padding " + dims_str(pp.pad_l) +
           " / " + dims_str(pp.pad_r);
  });
}

bool pool_dtype(DType dt) { return dt == kFloat32 || dt == kBFloat16; }

// Whether x holds a NaN or -inf: one vectorisable pass over the bits (NaN: exponent all
// ones and a non-zero mantissa).
bool any_nan_or_neg_inf(const Tensor& x) {
  auto scan = [&](auto bits_tag, uint64_t abs_mask, uint64_t inf_bits, uint64_t neg_inf_bits) {
    using U = decltype(bits_tag);
    const U* p = static_cast<const U*>(x.raw_data());
    bool found = false;
    std::mutex mu;
    parallel_for(0, x.numel(), kGrain * 4, [&](int64_t b, int64_t e) {
      U bad = 0;
      for (int64_t i = b; i < e; ++i) bad |= U(((p[i] & U(abs_mask)) > U(inf_bits)) | (p[i] == U(neg_inf_bits)));
      if (bad) {
        std::lock_guard<std::mutex> lock(mu);
        found = true;
      }
    });
    return found;
  };
  if (x.dtype() == kBFloat16) return scan(uint16_t(), 0x7FFF, 0x7F80, 0xFF80);
  return scan(uint32_t(), 0x7FFFFFFF, 0x7F800000, 0xFF800000);
}

}  // namespace

// oneDNN's max pooling skips NaNs, while PyTorch's (and the loops') let a NaN win its
// window, and it starts each window at the lowest finite value, so a window of -inf (or
// of -inf and padding) would give -FLT_MAX instead of -inf; an input with a NaN or a -inf
// therefore takes the loops. Their saved tensor is int64
// indices, oneDNN's a uint8 workspace, which tells the backward which one ran.
Tensor CpuBackend::max_pool2d(const Tensor& x, const Tensor& out, const Pool2dParams& p) {
  if (pool_dtype(x.dtype()) && out.numel() > 0 && !any_nan_or_neg_inf(x)) {
    const PoolProblem pp(x.sizes(), out.sizes(), p);
    auto e = get_pool(pp, PoolKind::MaxForward, x.dtype(), false);
    if (e->prim) {
      Tensor ws = make_tensor({int64_t(e->workspace_bytes)}, kUInt8, x.device());
      e->prim->execute({x.raw_data(), out.raw_data(), ws.raw_data()}, op::max_pool2d);
      return ws;
    }
  }
  return pool_max_forward(x, out, p);
}

void CpuBackend::max_pool2d_backward(const Tensor& grad_out, const Tensor&, const Tensor& saved,
                                     const Tensor& grad_in, const Pool2dParams& p) {
  if (saved.dtype() == kInt64) return pool_max_backward(grad_out, saved, grad_in);
  const PoolProblem pp(grad_in.sizes(), grad_out.sizes(), p);
  auto e = get_pool(pp, PoolKind::MaxBackward, grad_in.dtype(), false);
  AG_CHECK(e->prim != nullptr, op::max_pool2d, "internal: no oneDNN backward for a oneDNN forward");
  e->prim->execute({grad_out.raw_data(), saved.raw_data(), grad_in.raw_data()}, op::max_pool2d);
}

// oneDNN's include-padding average divides by the full window, also where ceil_mode's
// extra window reaches past the padding, which PyTorch does not count: that case (and
// dtypes oneDNN lacks) takes the loops.
void CpuBackend::avg_pool2d(const Tensor& x, const Tensor& out, const Pool2dParams& p) {
  const PoolProblem pp(x.sizes(), out.sizes(), p);
  if (pool_dtype(x.dtype()) && out.numel() > 0 && !(p.count_include_pad && pp.overhang())) {
    auto e = get_pool(pp, PoolKind::AvgForward, x.dtype(), p.count_include_pad);
    if (e->prim) return e->prim->execute({x.raw_data(), out.raw_data()}, op::avg_pool2d);
  }
  pool_avg_forward(x, out, p);
}

void CpuBackend::avg_pool2d_backward(const Tensor& grad_out, const Tensor& grad_in, const Pool2dParams& p) {
  const PoolProblem pp(grad_in.sizes(), grad_out.sizes(), p);
  if (pool_dtype(grad_in.dtype()) && grad_out.numel() > 0 && !(p.count_include_pad && pp.overhang())) {
    auto e = get_pool(pp, PoolKind::AvgBackward, grad_in.dtype(), p.count_include_pad);
    if (e->prim) return e->prim->execute({grad_out.raw_data(), grad_in.raw_data()}, op::avg_pool2d);
  }
  pool_avg_backward(grad_out, grad_in, p);
}


// ---- conv2d_block: the activation stays blocked -------------------------------------------
//
// The convolution writes the full-size activation y in the layout its forward chose
// (nChw16c, channels-last, ...) and our own max pooling (block_pool.cpp) reads it there:
// the ReLU, the max with max_pool2d's rules (a NaN wins its window, -inf stays -inf, the
// first maximum in row-major order keeps the gradient) and the NCHW output in one pass,
// plus the window position of each maximum, or "none" where the ReLU stops the gradient.
// The backward writes the pooled gradient into the activation's gradient in the same
// layout, which the convolution's backward primitives take as their diff_dst (oneDNN's
// own pooling on these layouts was slower, and its channels-last bfloat16 backward summed
// overlapping windows wrongly when the channels are not a multiple of 16). So the activation is
// neither reordered nor kept for the backward, and the ReLU costs no pass of its own.
// Only windows that do not overlap (each activation element in one window at most: the
// backward writes instead of adding) and of at most 254 taps are taken; the saved list is
// {the uint8 window positions}, against the composed form's {y, max_pool2d's result}.

namespace {

// The layout of a oneDNN activation in block_pool's terms, when it is plain or blocked
// over channels alone.
bool act_layout(const memory::desc& md, BlockLayout& L) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.format_kind != dnnl_blocked || d.ndims != 4 || d.offset0 != 0) return false;
  const auto& b = d.format_desc.blocking;
  L.C = d.dims[1];
  L.sn = b.strides[0];
  L.sh = b.strides[2];
  L.sw = b.strides[3];
  if (b.inner_nblks == 0) {
    if (b.strides[1] == 1) {  // channels-last: one block of C lanes
      L.cb = L.C;
      L.sc = 0;
    } else {
      L.cb = 1;
      L.sc = b.strides[1];
    }
  } else if (b.inner_nblks == 1 && b.inner_idxs[0] == 1) {
    L.cb = b.inner_blks[0];
    L.sc = b.strides[1];
  } else {
    return false;
  }
  L.blocks = (L.C + L.cb - 1) / L.cb;
  return true;
}

std::pair<PoolDim, PoolDim> pool_dims(const Shape& ys, const Pool2dParams& pool) {
  return {{pool.kernel[0], pool.stride[0], pool.padding[0], pool.dilation[0], ys[2]},
          {pool.kernel[1], pool.stride[1], pool.padding[1], pool.dilation[1], ys[3]}};
}

}  // namespace

TensorList CpuBackend::conv2d_block(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                                    const Conv2dParams& p, Activation act, const Pool2dParams& pool) {
  const DType dtype = out.dtype();
  bool overlap = false;
  for (int i = 0; i < 2; ++i) overlap |= pool.stride[i] < pool.dilation[i] * (pool.kernel[i] - 1) + 1;
  if (!pool_dtype(dtype) || out.numel() == 0 || overlap || pool.kernel[0] * pool.kernel[1] >= kNoGradient ||
      (act != Activation::None && act != Activation::Relu))
    return conv2d_block_composed(x, w, bias, out, p, act, pool);
  const Shape ys = conv2d_output_shape(x.sizes(), w.sizes(), p);
  const ConvProblem cp(x.sizes(), w.sizes(), ys, p);
  auto plan = get_plan(cp, ConvKind::Forward, dtype, bias.defined(), true, op::conv2d_block);
  BlockLayout L;
  if (!plan->ok() || !act_layout(plan->dst_user, L)) return conv2d_block_composed(x, w, bias, out, p, act, pool);
  const Device dev = out.device();
  // y lives only until the pooling has read it.
  Tensor y = make_tensor({int64_t(plan->dst_user.get_size())}, kUInt8, dev);
  if (bias.defined()) plan->execute({x.raw_data(), w.raw_data(), bias.raw_data(), y.raw_data()}, op::conv2d_block);
  else plan->execute({x.raw_data(), w.raw_data(), y.raw_data()}, op::conv2d_block);
  Tensor arg = make_tensor(out.sizes(), kUInt8, dev);
  const auto [ph, pw] = pool_dims(ys, pool);
  block_pool_forward(dtype, y.raw_data(), L, ph, pw, ys[0], out.size(2), out.size(3), act == Activation::Relu,
                     out.raw_data(), arg.data_ptr<uint8_t>());
  return {arg};
}

void CpuBackend::conv2d_block_backward(const Tensor& g, const Tensor& x, const Tensor& w, const TensorList& saved,
                                       const Conv2dParams& p, Activation act, const Pool2dParams& pool,
                                       const Tensor& grad_x, const Tensor& grad_w, const Tensor& grad_bias) {
  if (saved.size() != 1)
    return conv2d_block_backward_composed(g, x, w, saved, p, act, pool, grad_x, grad_w, grad_bias);
  const DType dtype = g.dtype();
  const Shape ys = conv2d_output_shape(x.sizes(), w.sizes(), p);
  const ConvProblem cp(x.sizes(), w.sizes(), ys, p);
  // The forward's plan, cached: its destination layout is the gradient's.
  auto fwd = get_plan(cp, ConvKind::Forward, dtype, grad_bias.defined(), true, op::conv2d_block);
  BlockLayout L;
  AG_CHECK(fwd->ok() && act_layout(fwd->dst_user, L), op::conv2d_block,
           "internal: no blocked layout for a blocked forward");
  const Device dev = g.device();
  const size_t gy_bytes = fwd->dst_user.get_size();
  Tensor gy = make_tensor({int64_t(gy_bytes)}, kUInt8, dev);
  const auto [ph, pw] = pool_dims(ys, pool);
  block_pool_backward(dtype, g.raw_data(), saved[0].data_ptr<uint8_t>(), L, ph, pw, ys[0], g.size(2), g.size(3),
                      gy.raw_data(), gy_bytes);
  // The activation's gradient in NCHW, for a convolution backward without a blocked plan.
  Tensor plain;
  auto gy_plain = [&]() -> const Tensor& {
    if (!plain.defined()) {
      plain = make_tensor(ys, dtype, dev);
      guarded(
          op::conv2d_block,
          [&] {
            const memory::desc to(cp.dst, dnnl_type(dtype), memory::format_tag::nchw);
            const dnnl::reorder::primitive_desc rpd(engine(), fwd->dst_user, engine(), to);
            Prim(dnnl::reorder(rpd), {{DNNL_ARG_FROM, fwd->dst_user}, {DNNL_ARG_TO, to}})
                .execute({gy.raw_data(), plain.raw_data()}, op::conv2d_block);
          },
          [] { return std::string("the activation gradient's reorder"); });
    }
    return plain;
  };
  if (grad_x.defined() && grad_x.numel() > 0) {
    auto plan = get_plan(cp, ConvKind::BackwardData, dtype, false, true, op::conv2d_block);
    if (plan->ok()) plan->execute({gy.raw_data(), w.raw_data(), grad_x.raw_data()}, op::conv2d_block);
    else conv2d_backward_input(gy_plain(), w, grad_x, p);
  }
  if (grad_w.defined() && grad_w.numel() > 0) {
    auto plan = get_plan(cp, ConvKind::BackwardWeights, dtype, grad_bias.defined(), true, op::conv2d_block);
    if (!plan->ok()) return conv2d_backward_weight(gy_plain(), x, grad_w, grad_bias, p);
    if (grad_bias.defined())
      plan->execute({x.raw_data(), gy.raw_data(), grad_w.raw_data(), grad_bias.raw_data()}, op::conv2d_block);
    else plan->execute({x.raw_data(), gy.raw_data(), grad_w.raw_data()}, op::conv2d_block);
  } else if (grad_bias.defined()) {
    conv_bias_grad(gy_plain(), grad_bias);
  }
}

}  // namespace ampgrad::cpu
