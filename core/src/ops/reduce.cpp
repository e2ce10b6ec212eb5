// Reductions: dim handling, the kernel call and the backward formula of each op.
//
// Every op normalises its dims (negative count from the end, an empty list means all,
// a repeat is an error naming the op), runs the backend's reduce into a keepdim-shaped
// output, and views it without the reduced dims unless keepdim. Backward formulas bring
// the gradient back to keepdim shape (`unreduce`) and broadcast it against the input.
// Sums of integral or bool tensors return int64; other reductions keep the input's dtype.
#include "ampgrad/ops/reduce.h"

#include <algorithm>
#include <cmath>

#include "ampgrad/dispatch.h"
#include "ampgrad/factories.h"
#include "ampgrad/ops/elementwise.h"
#include "ampgrad/ops/shape.h"
#include "internal.h"

namespace ampgrad {

namespace {

// Sorted, unique, non-negative dims; empty input means all dims.
Shape reduce_dims(const Tensor& x, const std::vector<int64_t>& dims, const char* op) {
  Shape out;
  if (dims.empty()) {
    for (int64_t d = 0; d < x.dim(); ++d) out.push_back(d);
    return out;
  }
  std::vector<char> seen(size_t(std::max<int64_t>(x.dim(), 1)), 0);
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, x.dim(), op);
    AG_CHECK(!seen[size_t(w)], op, "dim ", w, " appears more than once in the dims ", dims);
    seen[size_t(w)] = 1;
  }
  for (int64_t d = 0; d < x.dim(); ++d)
    if (seen[size_t(d)]) out.push_back(d);
  return out;  // a 0-dim tensor reduces over nothing
}

Shape keepdim_shape(const Shape& in, const Shape& dims) {
  Shape s = in;
  for (int64_t d : dims) s[size_t(d)] = 1;
  return s;
}

Shape squeezed_shape(const Shape& in, const Shape& dims) {
  Shape s;
  size_t k = 0;
  for (size_t d = 0; d < in.size(); ++d) {
    if (k < dims.size() && dims[k] == int64_t(d)) ++k;
    else s.push_back(in[d]);
  }
  return s;
}

int64_t reduced_count(const Tensor& x, const Shape& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= x.sizes()[size_t(d)];
  return n;
}

// The contiguous keepdim-shaped output viewed without the reduced dims (no autograd).
Tensor drop_dims(const Tensor& out, const Shape& dims, bool keepdim) {
  if (keepdim) return out;
  const Shape s = squeezed_shape(out.sizes(), dims);
  return detail::make_view(out, s, contiguous_strides(s), out.storage_offset());
}

Tensor reduce_raw(ReduceOp op, const Tensor& x, const Shape& dims, bool keepdim, DType out_dtype,
                  const char* name, ReduceParams p = {}) {
  Tensor out = make_tensor(keepdim_shape(x.sizes(), dims), out_dtype, x.device());
  backend(x.device(), name).reduce(op, x, dims, out, p);
  return drop_dims(out, dims, keepdim);
}

// The gradient g of a reduction over `dims` (keepdim or not) in keepdim shape, so that it
// broadcasts against the input.
Tensor unreduce(const Tensor& g, const Shape& in, const Shape& dims, bool keepdim) {
  if (keepdim) return g;
  return reshape(g, keepdim_shape(in, dims).vec());
}

void check_floating(const Tensor& x, const char* op) {
  AG_CHECK(is_floating(x.dtype()), op, "expected a floating dtype, got ", dtype_name(x.dtype()),
           "; cast the input first");
}

void check_nonempty(const Tensor& x, const Shape& dims, const char* op) {
  if (x.numel() != 0) return;
  for (int64_t d : dims)
    AG_CHECK(x.sizes()[size_t(d)] != 0, op, "cannot reduce over dim ", d, " of size 0 in shape ",
             x.sizes(), " (the reduction has no identity)");
}

// Gradient of amax/amin-like reductions: split evenly among the elements equal to the
// result (out_k, keepdim shape).
Tensor evenly_distribute(const Tensor& g_k, const Tensor& x, const Tensor& out_k, const Shape& dims) {
  Tensor mask = eq(x, out_k);
  Tensor count = sum(mask, dims.vec(), true);
  return where(mask, div(g_k, count.to(g_k.dtype())), 0.0);
}

Tensor extremum_all(const Tensor& x, const std::vector<int64_t>& dims0, bool keepdim, bool is_max,
                    const char* name) {
  detail::check_defined(x, name, "input");
  const Shape dims = reduce_dims(x, dims0, name);
  check_nonempty(x, dims, name);
  Tensor out = reduce_raw(is_max ? ReduceOp::Max : ReduceOp::Min, x, dims, keepdim, x.dtype(), name);
  if (any_requires_grad({&x})) {
    const Shape in = x.sizes();
    record(name, {x}, {out},
           [sx = SavedTensor(x), so = SavedTensor(out), in, dims, keepdim](const TensorList& g,
                                                                          GradMask) -> TensorList {
             return {evenly_distribute(unreduce(g[0], in, dims, keepdim), sx.get(),
                                       unreduce(so.get(), in, dims, keepdim), dims)};
           });
  }
  return out;
}

std::pair<Tensor, Tensor> extremum_dim(const Tensor& x, int64_t dim0, bool keepdim, bool is_max,
                                       const char* name) {
  detail::check_defined(x, name, "input");
  const int64_t dim = wrap_dim(dim0, x.dim(), name);
  const Shape dims = x.dim() == 0 ? Shape() : Shape{dim};
  check_nonempty(x, dims, name);
  const Shape ks = keepdim_shape(x.sizes(), dims);
  Tensor values = make_tensor(ks, x.dtype(), x.device());
  Tensor indices = make_tensor(ks, kInt64, x.device());
  if (x.dim() == 0) {  // a scalar is its own extreme, at index 0
    backend(x.device(), name).copy(x, values);
    backend(x.device(), name).fill(indices, 0);
  } else {
    backend(x.device(), name).max_min_dim(is_max, x, dim, values, indices);
  }
  values = drop_dims(values, dims, keepdim);
  indices = drop_dims(indices, dims, keepdim);
  if (any_requires_grad({&x})) {
    // The gradient goes to the reported index only (no autograd edge for the indices).
    const Shape in = x.sizes();
    record(name, {x}, {values},
           [idx = SavedTensor(indices), in, dims, dim, keepdim](const TensorList& g, GradMask) -> TensorList {
             if (in.empty()) return {g[0]};
             Shape pos_shape(in.size(), 1);
             pos_shape[size_t(dim)] = in[size_t(dim)];
             Tensor pos = arange(in[size_t(dim)], TensorOptions(kInt64).device(g[0].device())).view(pos_shape.vec());
             Tensor hit = eq(pos, unreduce(idx.get(), in, dims, keepdim));
             Tensor gk = unreduce(g[0], in, dims, keepdim);
             return {where(hit, expand(gk, in.vec()), 0.0)};
           });
  }
  return {values, indices};
}

}  // namespace

// ---- sum and mean ---------------------------------------------------------------------------

Tensor sum(const Tensor& x) { return sum(x, {}, false); }

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims0, bool keepdim) {
  if (auto in = dispatch::autocast(op::sum, x)) return sum((*in)[0], dims0, keepdim);
  detail::check_defined(x, op::sum, "input");
  const Shape dims = reduce_dims(x, dims0, op::sum);
  const DType dt = is_floating(x.dtype()) ? x.dtype() : kInt64;
  Tensor out = reduce_raw(ReduceOp::Sum, x, dims, keepdim, dt, op::sum);
  if (any_requires_grad({&x})) {
    const Shape in = x.sizes();
    record(op::sum, {x}, {out}, [in, dims, keepdim](const TensorList& g, GradMask) -> TensorList {
      return {expand(unreduce(g[0], in, dims, keepdim), in.vec())};
    });
  }
  return out;
}

Tensor mean(const Tensor& x) { return mean(x, {}, false); }

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims0, bool keepdim) {
  detail::check_defined(x, op::mean, "input");
  check_floating(x, op::mean);
  const Shape dims = reduce_dims(x, dims0, op::mean);
  Tensor out = reduce_raw(ReduceOp::Mean, x, dims, keepdim, x.dtype(), op::mean);
  if (any_requires_grad({&x})) {
    const Shape in = x.sizes();
    const double n = double(reduced_count(x, dims));
    record(op::mean, {x}, {out}, [in, dims, keepdim, n](const TensorList& g, GradMask) -> TensorList {
      return {expand(div(unreduce(g[0], in, dims, keepdim), n), in.vec())};
    });
  }
  return out;
}

// ---- var and std ----------------------------------------------------------------------------

namespace {

// d var / dx = 2 (x - mean) / (N - correction), times the incoming gradient g_k (keepdim).
Tensor var_backward(const Tensor& g_k, const Tensor& x, const Shape& dims, int64_t correction) {
  const int64_t n = reduced_count(x, dims);
  Tensor centered = sub(x, mean(x, dims.vec(), true));
  return mul(mul(g_k, 2.0 / double(std::max<int64_t>(0, n - correction))), centered);
}

Tensor var_std(const Tensor& x, const std::vector<int64_t>& dims0, int64_t correction, bool keepdim,
               bool is_std) {
  const char* name = is_std ? op::std : op::var;
  detail::check_defined(x, name, "input");
  check_floating(x, name);
  AG_CHECK(correction >= 0, name, "correction must be non-negative, got ", correction);
  const Shape dims = reduce_dims(x, dims0, name);
  ReduceParams p;
  p.correction = correction;
  Tensor out = reduce_raw(ReduceOp::Var, x, dims, keepdim, x.dtype(), name, p);
  if (is_std) out = detail::unary_raw(UnaryOp::Sqrt, out);
  if (any_requires_grad({&x})) {
    const Shape in = x.sizes();
    record(name, {x}, {out},
           [sx = SavedTensor(x), so = SavedTensor(out), in, dims, keepdim, correction, is_std](
               const TensorList& g, GradMask) -> TensorList {
             Tensor gk = unreduce(g[0], in, dims, keepdim);
             if (is_std) {  // d std = d var / (2 std); zero where std is zero, like PyTorch
               Tensor s = unreduce(so.get(), in, dims, keepdim);
               gk = where(eq(s, 0.0), 0.0, div(gk, mul(s, 2.0)));
             }
             return {var_backward(gk, sx.get(), dims, correction)};
           });
  }
  return out;
}

}  // namespace

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  return var_std(x, dims, correction, keepdim, false);
}

Tensor std(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  return var_std(x, dims, correction, keepdim, true);
}

// ---- max, min, argmax, argmin ----------------------------------------------------------------

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extremum_all(x, dims, keepdim, true, op::amax);
}
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extremum_all(x, dims, keepdim, false, op::amin);
}
Tensor max(const Tensor& x) { return extremum_all(x, {}, false, true, op::max); }
Tensor min(const Tensor& x) { return extremum_all(x, {}, false, false, op::min); }

std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  return extremum_dim(x, dim, keepdim, true, op::max);
}
std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim) {
  return extremum_dim(x, dim, keepdim, false, op::min);
}

namespace {
Tensor arg_extremum(const Tensor& x, int64_t dim0, bool keepdim, bool is_max) {
  const char* name = is_max ? op::argmax : op::argmin;
  detail::check_defined(x, name, "input");
  const int64_t dim = wrap_dim(dim0, x.dim(), name);
  const Shape dims = x.dim() == 0 ? Shape() : Shape{dim};
  check_nonempty(x, dims, name);
  return reduce_raw(is_max ? ReduceOp::ArgMax : ReduceOp::ArgMin, x, dims, keepdim, kInt64, name);
}
}  // namespace

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) { return arg_extremum(x, dim, keepdim, true); }
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) { return arg_extremum(x, dim, keepdim, false); }

// ---- logsumexp and norm -----------------------------------------------------------------------

Tensor logsumexp(const Tensor& x0, const std::vector<int64_t>& dims0, bool keepdim) {
  if (auto in = dispatch::autocast(op::logsumexp, x0)) return logsumexp((*in)[0], dims0, keepdim);
  detail::check_defined(x0, op::logsumexp, "input");
  // Integral inputs compute in the default floating dtype, like PyTorch.
  const Tensor x = is_floating(x0.dtype()) ? x0 : detail::cast_raw(x0, get_default_dtype());
  const Shape dims = reduce_dims(x, dims0, op::logsumexp);
  Tensor out = reduce_raw(ReduceOp::LogSumExp, x, dims, keepdim, x.dtype(), op::logsumexp);
  if (any_requires_grad({&x0})) {
    const Shape in = x.sizes();
    record(op::logsumexp, {x0}, {out},
           [sx = SavedTensor(x), so = SavedTensor(out), in, dims, keepdim](const TensorList& g,
                                                                          GradMask) -> TensorList {
             // g * softmax(x); a slice that is all -inf (out = -inf) gets zero, not NaN.
             Tensor ok = unreduce(so.get(), in, dims, keepdim);
             Tensor safe = where(eq(ok, -INFINITY), 0.0, ok);
             return {mul(unreduce(g[0], in, dims, keepdim), exp(sub(sx.get(), safe)))};
           });
  }
  return out;
}

Tensor norm(const Tensor& x, double p, const std::vector<int64_t>& dims0, bool keepdim) {
  if (auto in = dispatch::autocast(op::norm, x)) return norm((*in)[0], p, dims0, keepdim);
  detail::check_defined(x, op::norm, "input");
  check_floating(x, op::norm);
  AG_CHECK(!std::isnan(p), op::norm, "p must not be NaN");
  const Shape dims = reduce_dims(x, dims0, op::norm);
  if (std::isinf(p)) check_nonempty(x, dims, op::norm);
  ReduceParams rp;
  rp.p = p;
  Tensor out = reduce_raw(ReduceOp::Norm, x, dims, keepdim, x.dtype(), op::norm, rp);
  if (any_requires_grad({&x})) {
    const Shape in = x.sizes();
    record(op::norm, {x}, {out},
           [sx = SavedTensor(x), so = SavedTensor(out), in, dims, keepdim, p](const TensorList& g,
                                                                             GradMask) -> TensorList {
             const Tensor& xv = sx.get();
             Tensor gk = unreduce(g[0], in, dims, keepdim);
             Tensor nk = unreduce(so.get(), in, dims, keepdim);
             if (p == 0) return {zeros_like(xv)};
             if (p == 1) return {mul(gk, sign(xv))};
             if (std::isinf(p))  // like amax of |x|: split among the ties
               return {mul(sign(xv), evenly_distribute(gk, abs(xv), nk, dims))};
             // d/dx (sum |x|^p)^(1/p) = x |x|^(p-2) / norm^(p-1); zero at a zero norm
             Tensor zero = eq(nk, 0.0);
             Tensor safe_n = where(zero, 1.0, nk);
             Tensor scaled = p == 2 ? div(xv, safe_n)
                                    : div(mul(xv, pow(abs(xv), p - 2)), pow(safe_n, p - 1));
             return {where(zero, 0.0, mul(gk, scaled))};
           });
  }
  return out;
}

}  // namespace ampgrad
