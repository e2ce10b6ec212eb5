// Backend selection, and the defaults that a backend without an entry point inherits.
#include "ampgrad/backend.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

#include "internal.h"

namespace ampgrad {

Backend& backend(DeviceType type, const char* op) {
  if (type == DeviceType::CPU) return cpu_backend();
  return cuda_backend(op);
}

#define AG_MISSING(op) AG_ERROR(op, "not implemented on ", device_type_name(device_type()))

// Asked once: the devices present do not change while the process runs, and pinning asks
// for every batch.
Backend* accelerator_backend() {
  static Backend* const accelerator = []() -> Backend* {
    if (!built_with_cuda()) return nullptr;
    Backend& cuda = cuda_backend("accelerator");
    return cuda.device_count() > 0 ? &cuda : nullptr;
  }();
  return accelerator;
}

// Without page-locked memory of its own a backend hands out ordinary CPU memory.
Backend::Allocation Backend::allocate_pinned(size_t nbytes) { return cpu_backend().allocate(nbytes, Stream()); }
void Backend::deallocate_pinned(void* p, size_t nbytes) { cpu_backend().deallocate(p, nbytes, Stream()); }
size_t Backend::cached_bytes(int) { return 0; }
void Backend::empty_cache(int) {}
int Backend::device_count() { AG_MISSING("device_count"); }
void Backend::copy_bytes(void*, Device, const void*, Device, size_t, Stream, bool) { AG_MISSING("copy"); }

void* Backend::create_stream(int) { AG_MISSING("create_stream"); }
void Backend::destroy_stream(Stream, void*) { AG_MISSING("destroy_stream"); }
void Backend::synchronize_stream(Stream) { AG_MISSING("Stream::synchronize"); }
bool Backend::query_stream(Stream) { AG_MISSING("Stream::query"); }
void Backend::synchronize_device(int) { AG_MISSING("synchronize"); }
void* Backend::create_event(int, bool) { AG_MISSING("Event"); }
void Backend::destroy_event(int, void*) { AG_MISSING("Event"); }
void Backend::record_event(void*, Stream) { AG_MISSING("Event::record"); }
void Backend::stream_wait_event(Stream, void*) { AG_MISSING("Event::wait"); }
void Backend::synchronize_event(void*) { AG_MISSING("Event::synchronize"); }
bool Backend::query_event(void*) { AG_MISSING("Event::query"); }
double Backend::event_elapsed_ms(void*, void*) { AG_MISSING("Event::elapsed_time"); }

void Backend::copy(const Tensor&, const Tensor&) { AG_MISSING("copy"); }
void Backend::fill(const Tensor&, double) { AG_MISSING("fill"); }
void Backend::unary(UnaryOp op, const Tensor&, const Tensor&, UnaryParams) { AG_MISSING(op_name(op)); }
void Backend::binary(BinaryOp op, const Operand&, const Operand&, const Tensor&) { AG_MISSING(op_name(op)); }
void Backend::compare(CompareOp op, const Operand&, const Operand&, const Tensor&) { AG_MISSING(op_name(op)); }
void Backend::where(const Tensor&, const Operand&, const Operand&, const Tensor&) { AG_MISSING(op::where); }
void Backend::reduce(ReduceOp op, const Tensor&, const Shape&, const Tensor&, ReduceParams) { AG_MISSING(op_name(op)); }
void Backend::max_min_dim(bool, const Tensor&, int64_t, const Tensor&, const Tensor&) { AG_MISSING(op::max); }
void Backend::uniform(const Tensor&, double, double, uint64_t, uint64_t) { AG_MISSING("uniform"); }
void Backend::normal(const Tensor&, double, double, uint64_t, uint64_t) { AG_MISSING("normal"); }
void Backend::index_select(const Tensor&, int64_t, const Tensor&, const Tensor&) { AG_MISSING(op::index_select); }
void Backend::index_add(const Tensor&, int64_t, const Tensor&, const Tensor&) { AG_MISSING("index_add"); }
void Backend::gather(const Tensor&, int64_t, const Tensor&, const Tensor&) { AG_MISSING(op::gather); }
void Backend::scatter_add(const Tensor&, int64_t, const Tensor&, const Tensor&) { AG_MISSING("scatter_add"); }
void Backend::matmul(const Tensor&, const Tensor&, const Tensor&) { AG_MISSING(op::matmul); }
void Backend::linear(const Tensor&, const Tensor&, const Tensor&, const Tensor&) { AG_MISSING(op::linear); }
void Backend::conv2d(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&) { AG_MISSING(op::conv2d); }
void Backend::conv2d_backward_input(const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&) { AG_MISSING(op::conv2d); }
void Backend::conv2d_backward_weight(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&) { AG_MISSING(op::conv2d); }
Tensor Backend::max_pool2d(const Tensor&, const Tensor&, const Pool2dParams&) { AG_MISSING(op::max_pool2d); }
void Backend::max_pool2d_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Pool2dParams&) { AG_MISSING(op::max_pool2d); }
void Backend::avg_pool2d(const Tensor&, const Tensor&, const Pool2dParams&) { AG_MISSING(op::avg_pool2d); }
void Backend::avg_pool2d_backward(const Tensor&, const Tensor&, const Pool2dParams&) { AG_MISSING(op::avg_pool2d); }
void Backend::softmax(const Tensor&, int64_t, bool, const Tensor&) { AG_MISSING(op::softmax); }
void Backend::softmax_backward(const Tensor&, const Tensor&, int64_t, bool, const Tensor&) { AG_MISSING(op::softmax); }
void Backend::layer_norm(const Tensor&, int64_t, const Tensor&, const Tensor&, double, const Tensor&, const Tensor&, const Tensor&) { AG_MISSING(op::layer_norm); }
void Backend::layer_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) { AG_MISSING(op::layer_norm); }
int64_t Backend::layer_norm_inner(const Tensor& x, const Tensor& mean, const Tensor& grad_w, const Tensor& grad_b) {
  const int64_t rows = mean.numel();
  return grad_w.defined() ? grad_w.numel() : grad_b.defined() ? grad_b.numel() : rows > 0 ? x.numel() / rows : 0;
}

void Backend::cross_entropy(const Tensor&, int64_t, int64_t, const Tensor&, int64_t, double, const Tensor&, const Tensor&) { AG_MISSING(op::cross_entropy); }
void Backend::cross_entropy_backward(const Tensor&, const Tensor&, int64_t, int64_t, const Tensor&, int64_t, double, const Tensor&, const Tensor&) { AG_MISSING(op::cross_entropy); }

void Backend::sgd_step(const OptimizerLists&, const SgdParams&) { AG_MISSING("SGD"); }
void Backend::adam_step(const OptimizerLists&, const AdamParams&) { AG_MISSING("Adam"); }
void Backend::scale_and_check(const TensorList&, const Tensor&, const Tensor&) { AG_MISSING("scale_and_check"); }
void Backend::sum_of_squares(const TensorList&, const Tensor&) { AG_MISSING("sum_of_squares"); }
void Backend::update_scale(const Tensor&, const Tensor&, const Tensor&, const ScaleUpdateRule&) { AG_MISSING("update_scale"); }

#undef AG_MISSING

void OptimizerLists::check(const char* op, bool two_moments) const {
  const size_t n = params.size();
  AG_CHECK(grads.size() == n && steps.size() == n && masters.size() == n && (buf1.empty() || buf1.size() == n) &&
               (buf2.empty() || buf2.size() == n),
           op, "parameter, gradient, state and step lists differ in length (", n, " parameters)");
  if (two_moments) AG_CHECK(buf1.size() == n && buf2.size() == n, op, "expected both moment lists");
  AG_CHECK(casts.empty() || casts.size() == n, op, "the cast list has ", casts.size(), " entries for ", n,
           " parameters");
  for (size_t i = 0; i < casts.size(); ++i) {
    const Tensor& c = casts[i];
    if (!c.defined()) continue;
    AG_CHECK(params[i].dtype() == kFloat32 && !masters[i].defined(), op, "parameter ", i,
             " has a cast but is ", dtype_name(params[i].dtype()), masters[i].defined() ? " with a master" : "",
             " (casts are for float32 parameters without one)");
    AG_CHECK(is_reduced_floating(c.dtype()) && c.is_contiguous() && c.sizes() == params[i].sizes() &&
                 c.device() == params[i].device(),
             op, "the cast of parameter ", i, " must be a contiguous float16 or bfloat16 tensor of shape ",
             params[i].sizes(), " on ", params[i].device(), ", got ", dtype_name(c.dtype()), " ", c.sizes(),
             c.is_contiguous() ? "" : " (strided)");
  }
  if (found_inf.defined())
    AG_CHECK(found_inf.dtype() == kFloat32 && found_inf.numel() == 1, op,
             "found_inf must be a float32 tensor of one element");
  if (rounding == UpdateRounding::Stochastic)
    AG_CHECK(ids.size() == n, op, "stochastic rounding needs one id per parameter, got ", ids.size(), " for ", n);
  AG_CHECK(comps.empty() || comps.size() == n, op, "the compensation list has ", comps.size(), " entries for ", n,
           " parameters");
  if (rounding == UpdateRounding::Compensated)
    for (size_t i = 0; i < n; ++i) {
      if (!is_reduced_floating(params[i].dtype()) || masters[i].defined()) continue;
      AG_CHECK(i < comps.size() && comps[i].defined(), op, "parameter ", i, " (", dtype_name(params[i].dtype()),
               ") has no compensation buffer for compensated rounding");
      const Tensor& c = comps[i];
      AG_CHECK(c.dtype() == params[i].dtype() && c.is_contiguous() && c.sizes() == params[i].sizes() &&
                   c.device() == params[i].device(),
               op, "the compensation of parameter ", i, " must be a contiguous ", dtype_name(params[i].dtype()),
               " tensor of shape ", params[i].sizes(), " on ", params[i].device(), ", got ", dtype_name(c.dtype()), " ",
               c.sizes(), " on ", c.device());
    }
  if (stalled.defined())
    AG_CHECK(stalled.dtype() == kInt64 && stalled.dim() == 1 && stalled.numel() == int64_t(n) &&
                 stalled.is_contiguous() && (n == 0 || stalled.device() == params[0].device()),
             op, "the stalled counts must be a contiguous 1-D int64 tensor of ", n,
             " elements (one per parameter) on the parameters' device, got ", dtype_name(stalled.dtype()), " ",
             stalled.sizes(), stalled.is_contiguous() ? "" : " (not contiguous)", " on ", stalled.device());
}

const char* update_rounding_name(UpdateRounding r) {
  switch (r) {
    case UpdateRounding::Nearest: return "nearest";
    case UpdateRounding::Stochastic: return "stochastic";
    case UpdateRounding::Compensated: return "compensated";
    case UpdateRounding::Master: return "master";
  }
  return "?";
}

UpdateRounding parse_update_rounding(std::string_view name) {
  for (UpdateRounding r :
       {UpdateRounding::Nearest, UpdateRounding::Stochastic, UpdateRounding::Compensated, UpdateRounding::Master})
    if (name == update_rounding_name(r)) return r;
  AG_ERROR("update_rounding", "unknown update rounding '", std::string(name),
           "' (expected nearest, stochastic, compensated or master)");
}

// ---- composed forms of the fused entries ------------------------------------------------
// One rule for every fused entry (linear_act, conv2d_block, attention and their backwards):
// Backend's default is the composition of the backend's own primitive entries, and a
// backend overrides the entry only where it has a fused form, calling the *_composed helper
// itself for the cases that form does not cover.

Tensor Backend::linear_act(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                           const Tensor& out, bool keep) {
  return linear_act_composed(x, weight, bias, act, out, keep);
}

void Backend::linear_act_backward(const Tensor& g, const Tensor& next_weight, const Tensor& out, const Tensor& saved,
                                  Activation act, const Tensor& grad_pre, const Tensor& grad_bias) {
  linear_act_backward_composed(g, next_weight, out, saved, act, grad_pre, grad_bias);
}

void Backend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                        const AttentionParams& p, const Tensor& out, const Tensor& lse) {
  attention_composed(q, k, v, mask, p, out, lse);
}

void Backend::attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& mask, const Tensor& out, const Tensor& lse, const AttentionParams& p,
                                 const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v) {
  attention_backward_composed(grad_out, q, k, v, mask, out, lse, p, grad_q, grad_k, grad_v);
}

Shape conv2d_output_shape(const Shape& x, const Shape& w, const Conv2dParams& p) {
  Shape s{x[0], w[0], 0, 0};
  for (int i = 0; i < 2; ++i)
    s[2 + i] = (x[2 + i] + 2 * p.padding[i] - p.dilation[i] * (w[2 + i] - 1) - 1) / p.stride[i] + 1;
  return s;
}

TensorList Backend::conv2d_block(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                                 const Conv2dParams& p, Activation act, const Pool2dParams& pool) {
  return conv2d_block_composed(x, w, bias, out, p, act, pool);
}

void Backend::conv2d_block_backward(const Tensor& g, const Tensor& x, const Tensor& w, const TensorList& saved,
                                    const Conv2dParams& p, Activation act, const Pool2dParams& pool,
                                    const Tensor& grad_x, const Tensor& grad_w, const Tensor& grad_bias) {
  conv2d_block_backward_composed(g, x, w, saved, p, act, pool, grad_x, grad_w, grad_bias);
}

TensorList Backend::conv2d_block_composed(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                                          const Conv2dParams& p, Activation act, const Pool2dParams& pool) {
  AG_CHECK(act == Activation::None || act == Activation::Relu, op::conv2d_block,
           "the activation must be none or relu, got ", activation_name(act));
  Tensor y = make_tensor(conv2d_output_shape(x.sizes(), w.sizes(), p), out.dtype(), out.device());
  conv2d(x, w, bias, y, p);
  if (act != Activation::None) unary(activation_op(act), y, y, {});
  Tensor pooled = max_pool2d(y, out, pool);
  return {y, pooled};
}

void Backend::conv2d_block_backward_composed(const Tensor& g, const Tensor& x, const Tensor& w,
                                             const TensorList& saved, const Conv2dParams& p, Activation act,
                                             const Pool2dParams& pool, const Tensor& grad_x, const Tensor& grad_w,
                                             const Tensor& grad_bias) {
  AG_CHECK(saved.size() == 2, op::conv2d_block, "internal: expected the activation and the pooling's result");
  const Tensor& y = saved[0];
  Tensor gy = make_tensor(y.sizes(), g.dtype(), g.device());
  max_pool2d_backward(g, y, saved[1], gy, pool);
  if (act != Activation::None) binary(activation_backward_op(act), gy, y, gy);
  if (grad_x.defined()) conv2d_backward_input(gy, w, grad_x, p);
  if (grad_w.defined() || grad_bias.defined()) conv2d_backward_weight(gy, x, grad_w, grad_bias, p);
}

Tensor Backend::linear_act_composed(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                                    const Tensor& out, bool keep) {
  const bool keep_pre = keep && !activation_grad_reads_output(act);
  Tensor pre = keep_pre ? make_tensor(out.sizes(), out.dtype(), out.device()) : out;
  linear(x, weight, bias, pre);
  unary(activation_op(act), pre, out, {});  // in place when the pre-activation is not kept
  return keep_pre ? pre : Tensor();
}

void Backend::linear_act_backward_composed(const Tensor& g, const Tensor& next_weight, const Tensor& out,
                                           const Tensor& pre, Activation act, const Tensor& grad_pre,
                                           const Tensor& grad_bias) {
  const Tensor& saved = activation_grad_reads_output(act) ? out : pre;
  AG_CHECK(saved.defined(), op::linear, "the gradient of ", activation_name(act), " needs the ",
           activation_grad_reads_output(act) ? "output" : "pre-activation", ", which was not kept");
  const int64_t N = grad_pre.size(1);
  if (next_weight.defined()) {
    matmul(detail::one_batch(g), detail::one_batch(next_weight), detail::one_batch(grad_pre));
    binary(activation_backward_op(act), grad_pre, saved, grad_pre);
  } else {
    binary(activation_backward_op(act), g, saved, grad_pre);
  }
  if (grad_bias.defined())
    reduce(ReduceOp::Sum, grad_pre, Shape{0}, detail::make_view(grad_bias, {1, N}, {N, 1}, grad_bias.storage_offset()),
           {});
}

// ---- attention, composed --------------------------------------------------------------

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// t [batch..., R, C] as a contiguous [N, R, C] tensor (a copy when t is not contiguous).
Tensor batches(const Tensor& t, int64_t N) {
  const Tensor c = detail::contiguous_raw(t);
  const int64_t R = t.size(t.dim() - 2), C = t.size(t.dim() - 1);
  return detail::make_view(c, {N, R, C}, {R * C, C, 1}, c.storage_offset());
}

// The transpose [N, C, R] of a contiguous [N, R, C] view, in place.
Tensor transposed(const Tensor& t) {
  const int64_t R = t.size(1), C = t.size(2);
  return detail::make_view(t, {t.size(0), C, R}, {R * C, 1, C}, t.storage_offset());
}

// The causal rule as an additive mask [Tq, Tk] on dev (0 where j <= i, -inf above): a view
// of an [n, n] mask kept per device and dtype, since element (i, j) does not depend on the
// size. No backend entry makes an index sequence, so the mask is written on the host and
// copied (a blocking copy) only when n has to grow, doubling; outgrown masks are kept, never
// freed, so a kernel still reading one on any stream is safe, and a steady state copies
// nothing.
Tensor causal_mask(Backend& be, Device dev, DType acc, int64_t Tq, int64_t Tk) {
  struct Kept {
    Device dev;
    DType dtype;
    Tensor mask;
  };
  static std::mutex mu;
  static auto* kept = new std::vector<Kept>();  // never destroyed: device memory outlives exit order
  std::lock_guard<std::mutex> lock(mu);
  const int64_t need = std::max<int64_t>({Tq, Tk, 1});
  const Kept* found = nullptr;
  for (const Kept& k : *kept)
    if (k.dev == dev && k.dtype == acc && k.mask.size(0) >= need) found = &k;
  if (!found) {
    int64_t n = 64;
    while (n < need) n *= 2;
    Tensor host = make_tensor({n, n}, acc, Device(kCPU));
    const auto write = [&]<class A>() {  // acc is float32 or float64
      A* h = static_cast<A*>(host.raw_data());
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) h[i * n + j] = j <= i ? A(0) : -std::numeric_limits<A>::infinity();
    };
    if (acc == kFloat64) write.operator()<double>();
    else write.operator()<float>();
    Tensor mask = make_tensor({n, n}, acc, dev);
    be.copy_bytes(mask.raw_data(), dev, host.raw_data(), Device(kCPU), host.nbytes(), current_stream(dev), false);
    kept->push_back({dev, acc, mask});
    found = &kept->back();
  }
  return detail::make_view(found->mask, {Tq, Tk}, {found->mask.size(0), 1}, 0);
}

// Scores in the accumulation dtype: scale * q k^T, plus the mask, plus the causal mask.
Tensor composed_scores(Backend& be, const Tensor& q3, const Tensor& k3, const Tensor& mask, const AttentionParams& p,
                       const AttentionSizes& d, DType acc) {
  const Device dev = q3.device();
  Tensor s = make_tensor({d.N, d.Tq, d.Tk}, acc, dev);
  if (d.D == 0) be.fill(s, 0);
  else be.matmul(q3, transposed(k3), s);
  be.binary(BinaryOp::Mul, s, Operand::scalar(p.scale), s);
  if (mask.defined()) {
    const Tensor s_full = detail::make_view(s, mask.sizes(), contiguous_strides(mask.sizes()), 0);
    be.binary(BinaryOp::Add, s_full, mask, s_full);
  }
  if (p.causal) be.binary(BinaryOp::Add, s, detail::expand_raw(causal_mask(be, dev, acc, d.Tq, d.Tk), s.sizes()), s);
  return s;
}

// The dropout factors of AttentionParams: 1 / (1 - p) where the float64 draw is below
// 1 - p, else 0 (the same draws as the fused kernels'), in the accumulation dtype.
Tensor composed_dropout(Backend& be, const AttentionParams& p, const AttentionSizes& d, DType acc, Device dev) {
  Tensor u = make_tensor({d.N, d.Tq, d.Tk}, kFloat64, dev);
  be.uniform(u, 0, 1, p.seed, p.offset);
  Tensor keep = make_tensor(u.sizes(), kBool, dev);
  be.compare(CompareOp::Lt, u, Operand::scalar(1 - p.dropout_p), keep);
  Tensor z = make_tensor(u.sizes(), acc, dev);
  be.where(keep, Operand::scalar(1 / (1 - p.dropout_p)), Operand::scalar(0), z);
  return z;
}

// out [N, M, Nc] = a [N, M, K] @ b [N, K, Nc], zeros when K == 0.
void composed_bmm(Backend& be, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (a.size(2) == 0) be.fill(out, 0);
  else be.matmul(a, b, out);
}

}  // namespace

// Reference: kernels/reference/src/attention.cpp (what CUDA's attention computes, through this).
void Backend::attention_composed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                 const AttentionParams& p, const Tensor& out, const Tensor& lse) {
  const AttentionSizes d(q, k, v);
  if (d.N == 0 || d.Tq == 0) return;
  const DType acc = lse.dtype();
  const Device dev = q.device();
  const Tensor lse3 = detail::make_view(lse, {d.N, d.Tq, 1}, {d.Tq, 1, 1}, lse.storage_offset());
  // A strided out (Backend::attention) gets the product through a contiguous temporary.
  const bool direct = out.is_contiguous();
  const Tensor res = direct ? out : make_tensor(out.sizes(), out.dtype(), out.device());
  const Tensor out3 = detail::make_view(res, {d.N, d.Tq, d.Dv}, {d.Tq * d.Dv, d.Dv, 1}, res.storage_offset());
  if (d.Tk == 0) {  // no key at all: every row is empty
    fill(out, 0);
    fill(lse, kInf);
    return;
  }
  const Tensor s = composed_scores(*this, batches(q, d.N), batches(k, d.N), mask, p, d, acc);
  // lse = m + log(sum exp(s - m)) with the row max m; a row whose max is -inf has no
  // visible key: it shifts by 0 (no NaN from -inf - -inf) and its lse becomes +inf.
  Tensor m = make_tensor({d.N, d.Tq, 1}, acc, dev);
  reduce(ReduceOp::Max, s, Shape{2}, m, {});
  Tensor empty = make_tensor(m.sizes(), kBool, dev);
  compare(CompareOp::Eq, m, Operand::scalar(-kInf), empty);
  where(empty, Operand::scalar(0), m, m);
  Tensor prob = make_tensor(s.sizes(), acc, dev);
  binary(BinaryOp::Sub, s, detail::expand_raw(m, s.sizes()), prob);
  unary(UnaryOp::Exp, prob, prob, {});
  reduce(ReduceOp::Sum, prob, Shape{2}, lse3, {});
  unary(UnaryOp::Log, lse3, lse3, {});
  binary(BinaryOp::Add, lse3, m, lse3);
  where(empty, Operand::scalar(kInf), lse3, lse3);
  // p = exp(s - lse): exactly 0 on empty rows
  binary(BinaryOp::Sub, s, detail::expand_raw(lse3, s.sizes()), prob);
  unary(UnaryOp::Exp, prob, prob, {});
  if (p.dropout_p > 0) binary(BinaryOp::Mul, prob, composed_dropout(*this, p, d, acc, dev), prob);
  composed_bmm(*this, detail::cast_raw(prob, q.dtype()), batches(v, d.N), out3);
  if (!direct) copy(res, out);
}

void Backend::attention_backward_composed(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                          const Tensor& v, const Tensor& mask, const Tensor& out,
                                          const Tensor& lse, const AttentionParams& p, const Tensor& grad_q,
                                          const Tensor& grad_k, const Tensor& grad_v) {
  const AttentionSizes d(q, k, v);
  if (d.N == 0) return;
  if (d.Tq == 0 || d.Tk == 0) {  // no score at all: the gradients that have elements are 0
    for (const Tensor* g : {&grad_q, &grad_k, &grad_v})
      if (g->defined()) fill(*g, 0);
    return;
  }
  const DType acc = lse.dtype(), dt = q.dtype();
  const Device dev = q.device();
  const Tensor q3 = batches(q, d.N), k3 = batches(k, d.N), v3 = batches(v, d.N), go = batches(grad_out, d.N);
  const Tensor lse3 = detail::make_view(lse, {d.N, d.Tq, 1}, {d.Tq, 1, 1}, lse.storage_offset());
  const Tensor s = composed_scores(*this, q3, k3, mask, p, d, acc);
  Tensor prob = make_tensor(s.sizes(), acc, dev);
  binary(BinaryOp::Sub, s, detail::expand_raw(lse3, s.sizes()), prob);
  unary(UnaryOp::Exp, prob, prob, {});
  const Tensor z = p.dropout_p > 0 ? composed_dropout(*this, p, d, acc, dev) : Tensor();
  // A strided gradient (Backend::attention_backward) gets its product through a contiguous
  // temporary, copied in at the end.
  std::vector<std::pair<Tensor, Tensor>> copies;
  auto view3 = [&](const Tensor& g, int64_t R, int64_t C) {
    Tensor res = g;
    if (!g.is_contiguous()) {
      res = make_tensor(g.sizes(), g.dtype(), g.device());
      copies.emplace_back(res, g);
    }
    return detail::make_view(res, {d.N, R, C}, {R * C, C, 1}, res.storage_offset());
  };
  if (grad_v.defined()) {  // dv = dropped(p)^T @ dout
    Tensor dropped = prob;
    if (z.defined()) {
      dropped = make_tensor(s.sizes(), acc, dev);
      binary(BinaryOp::Mul, prob, z, dropped);
    }
    composed_bmm(*this, transposed(detail::cast_raw(dropped, dt)), go, view3(grad_v, d.Tk, d.Dv));
  }
  if (!grad_q.defined() && !grad_k.defined()) {
    for (const auto& [res, g] : copies) copy(res, g);
    return;
  }
  // ds = scale * p * (dp - rowsum(p * dp)), dp = (dout @ v^T) * dropout: softmax's gradient
  Tensor dp = make_tensor(s.sizes(), acc, dev), ds = make_tensor(s.sizes(), acc, dev);
  composed_bmm(*this, go, transposed(v3), dp);
  if (z.defined()) binary(BinaryOp::Mul, dp, z, dp);
  softmax_backward(dp, prob, 2, false, ds);
  binary(BinaryOp::Mul, ds, Operand::scalar(p.scale), ds);
  const Tensor dst = detail::cast_raw(ds, dt);
  if (grad_q.defined()) composed_bmm(*this, dst, k3, view3(grad_q, d.Tq, d.D));
  if (grad_k.defined()) composed_bmm(*this, transposed(dst), q3, view3(grad_k, d.Tk, d.D));
  for (const auto& [res, g] : copies) copy(res, g);
}

}  // namespace ampgrad
