// Softmax, log-softmax and layer norm: checks, the fused forward kernel, and a backward
// through the backend's fused gradient kernel (these are hot paths: one pass each way).
//
// Softmax saves its output only (its gradient needs nothing else). Layer norm saves the
// input, the weight, and the per-row float32 (float64 for float64) mean and rstd from the
// forward, so backward never recomputes the statistics. Kernels get contiguous tensors of
// one dtype: x, weight and bias are promoted together, and the engine casts each gradient
// back to its input's dtype.
#include <cmath>
#include <optional>

#include "ampgrad/dispatch.h"
#include "ampgrad/ops/nn.h"
#include "ampgrad/ops/shape.h"
#include "internal.h"

namespace ampgrad {

namespace {

Tensor softmax_impl(const Tensor& x, int64_t dim0, bool log) {
  const char* name = log ? op::log_softmax : op::softmax;
  detail::check_defined(x, name, "input");
  AG_CHECK(is_floating(x.dtype()), name, "expected a floating dtype, got ", dtype_name(x.dtype()),
           "; cast the input first");
  const int64_t dim = wrap_dim(dim0, x.dim(), name);
  const Tensor xc = detail::contiguous_raw(x);
  Tensor out = make_tensor(x.sizes(), x.dtype(), x.device());
  backend(x.device(), name).softmax(xc, dim, log, out);
  if (any_requires_grad({&x}))
    record(name, {x}, {out}, [sy = SavedTensor(out), dim, log, name](const TensorList& g, GradMask) -> TensorList {
      const Tensor& y = sy.get();
      const Tensor gc = detail::contiguous_raw(detail::cast_raw(g[0], y.dtype()));
      Tensor gi = make_tensor(y.sizes(), y.dtype(), y.device());
      backend(y.device(), name).softmax_backward(gc, y, dim, log, gi);
      return {gi};
    });
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  if (auto in = dispatch::autocast(op::softmax, x)) return softmax((*in)[0], dim);
  return softmax_impl(x, dim, false);
}
Tensor log_softmax(const Tensor& x, int64_t dim) {
  if (auto in = dispatch::autocast(op::log_softmax, x)) return log_softmax((*in)[0], dim);
  return softmax_impl(x, dim, true);
}

namespace {

// layer_norm; with `narrow` (a 16-bit dtype, for float32 inputs on a backend that
// layer_norm_narrows) the output and its gradient are in that dtype.
Tensor layer_norm_impl(const Tensor& x, const std::vector<int64_t>& normalized_shape, const Tensor& weight,
                       const Tensor& bias, double eps, std::optional<DType> narrow) {
  detail::check_defined(x, op::layer_norm, "input");
  AG_CHECK(is_floating(x.dtype()), op::layer_norm, "expected a floating dtype, got ", dtype_name(x.dtype()));
  const Shape ns(normalized_shape);
  const int64_t k = int64_t(ns.size());
  AG_CHECK(k > 0, op::layer_norm, "normalized_shape must not be empty");
  bool match = x.dim() >= k;
  for (int64_t i = 0; match && i < k; ++i) match = x.sizes()[size_t(x.dim() - k + i)] == ns[size_t(i)];
  AG_CHECK(match, op::layer_norm, "normalized_shape ", ns, " does not match the trailing dims of the input shape ",
           x.sizes());
  AG_CHECK(eps >= 0, op::layer_norm, "eps must be non-negative, got ", eps);
  DType dt = x.dtype();
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    const char* what = p == &weight ? "weight" : "bias";
    AG_CHECK(p->sizes() == ns, op::layer_norm, what, " of shape ", p->sizes(), " does not match normalized_shape ", ns);
    AG_CHECK(is_floating(p->dtype()), op::layer_norm, what, " must be floating, got ", dtype_name(p->dtype()));
    detail::check_same_device(x, *p, op::layer_norm);
    dt = promote_types(dt, p->dtype());
  }
  const int64_t inner = ns.numel();
  int64_t rows = 1;
  for (int64_t i = 0; i < x.dim() - k; ++i) rows *= x.sizes()[size_t(i)];
  auto prep = [&](const Tensor& t) {
    return t.defined() ? detail::contiguous_raw(detail::cast_raw(t, dt)) : Tensor();
  };
  const Tensor xc = prep(x), wc = prep(weight), bc = prep(bias);
  const DType stat_dt = dt == kFloat64 ? kFloat64 : kFloat32;
  const DType out = narrow ? *narrow : dt;
  Tensor y = make_tensor(x.sizes(), out, x.device());
  Tensor mean = make_tensor({rows}, stat_dt, x.device());
  Tensor rstd = make_tensor({rows}, stat_dt, x.device());
  backend(x.device(), op::layer_norm).layer_norm(xc, inner, wc, bc, eps, y, mean, rstd);
  if (any_requires_grad({&x, &weight, &bias}))
    record(op::layer_norm, {x, weight, bias}, {y},
           [sx = SavedTensor(xc), sw = wc.defined() ? SavedTensor(wc) : SavedTensor(), mean, rstd, ns, dt, out](
               const TensorList& g, GradMask need) -> TensorList {
             const Tensor& xs = sx.get();
             const Tensor w = sw.defined() ? sw.get() : Tensor();
             // A narrowed output's 16-bit gradient is read as it is (widened in the kernel).
             const Tensor gc = detail::contiguous_raw(detail::cast_raw(g[0], g[0].dtype() == out ? out : dt));
             Tensor gi = need[0] ? make_tensor(xs.sizes(), dt, xs.device()) : Tensor();
             Tensor gw = need[1] ? make_tensor(ns, dt, xs.device()) : Tensor();
             Tensor gb = need[2] ? make_tensor(ns, dt, xs.device()) : Tensor();
             backend(xs.device(), op::layer_norm).layer_norm_backward(gc, xs, mean, rstd, w, gi, gw, gb);
             return {gi, gw, gb};
           });
  return y;
}

}  // namespace

Tensor layer_norm(const Tensor& x, const std::vector<int64_t>& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  if (auto in = dispatch::autocast(op::layer_norm, x, weight, bias))
    return layer_norm((*in)[0], normalized_shape, (*in)[1], (*in)[2], eps);
  return layer_norm_impl(x, normalized_shape, weight, bias, eps, std::nullopt);
}

Tensor layer_norm_to(const Tensor& x, const std::vector<int64_t>& normalized_shape, const Tensor& weight,
                     const Tensor& bias, double eps, DType out_dtype) {
  AG_CHECK(is_reduced_floating(out_dtype), op::layer_norm_to, "out_dtype must be float16 or bfloat16, got ",
           dtype_name(out_dtype));
  detail::check_defined(x, op::layer_norm_to, "input");
  // float32 inputs, as autocast's float32 row for layer_norm gives them (float64 stays).
  const auto f32 = [](const Tensor& t) {
    return t.defined() && is_floating(t.dtype()) && t.dtype() != kFloat64 ? t.to(kFloat32) : t;
  };
  const Tensor xf = f32(x), wf = f32(weight), bf = f32(bias);
  const bool all32 = xf.dtype() == kFloat32 && (!wf.defined() || wf.dtype() == kFloat32) &&
                     (!bf.defined() || bf.dtype() == kFloat32);
  if (all32 && backend(x.device(), op::layer_norm_to).layer_norm_narrows())
    return layer_norm_impl(xf, normalized_shape, wf, bf, eps, out_dtype);
  return layer_norm_impl(xf, normalized_shape, wf, bf, eps, std::nullopt).to(out_dtype);
}

}  // namespace ampgrad
