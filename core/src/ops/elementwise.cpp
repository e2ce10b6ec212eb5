// Elementwise ops: promotion and broadcasting, the kernel call, and the backward formula,
// side by side for each op.
#include "ampgrad/ops/elementwise.h"

#include <cmath>

#include "ampgrad/dispatch.h"
#include "ampgrad/factories.h"
#include "ampgrad/ops/shape.h"
#include "internal.h"

namespace ampgrad {

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    AG_CHECK(da == db || da == 1 || db == 1, op, "shapes ", a, " and ", b,
             " cannot be broadcast together (dim ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace detail {

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  AG_CHECK(a.device() == b.device(), op, "expected tensors on one device, got ", a.device(),
           " and ", b.device());
}

void check_defined(const Tensor& t, const char* op, const char* what) {
  AG_CHECK(t.defined(), op, what, " is an undefined tensor");
}

Tensor unary_raw(UnaryOp op, const Tensor& x, UnaryParams p) {
  Tensor out = make_tensor(x.sizes(), x.dtype(), x.device());
  backend(x.device(), op_name(op)).unary(op, x, out, p);
  return out;
}

Tensor binary_raw(BinaryOp op, const Tensor& a, const Tensor& b) {
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), op_name(op));
  Tensor out = make_tensor(shape, a.dtype(), a.device());
  backend(a.device(), op_name(op)).binary(op, expand_raw(a, shape), expand_raw(b, shape), out);
  return out;
}

void bump_version(const Tensor& t) { ++t.unsafe_impl()->storage->version; }

void apply_inplace(Tensor& self, const char* op, bool needs_grad,
                   const std::function<Tensor()>& compute,
                   const std::function<void()>& write_into) {
  if (GradMode::is_enabled() && self.requires_grad() && self.is_leaf())
    AG_ERROR(op, "a leaf tensor that requires grad (shape ", self.sizes(),
             ") cannot be modified in place in grad mode; use ag::NoGradGuard");
  if (!needs_grad) {
    write_into();
    bump_version(self);
    return;
  }
  Tensor r = compute();
  AG_CHECK(r.sizes() == self.sizes(), op, "the result's shape ", r.sizes(),
           " does not match the shape ", self.sizes(), " of the tensor modified in place");
  backend(self.device(), op).copy(r, self);
  bump_version(self);
  AutogradMeta& m = self.unsafe_impl()->meta();
  m.grad_fn = r.grad_fn();
  m.output_nr = r.output_nr();
}

}  // namespace detail

using detail::binary_raw;
using detail::cast_raw;
using detail::expand_raw;
using detail::unary_raw;

namespace {

// Runs a binary kernel after promotion and broadcasting.
Tensor binary_forward(BinaryOp op, const Tensor& a, const Tensor& b, const char* name,
                      bool float_only) {
  detail::check_defined(a, name, "input");
  detail::check_defined(b, name, "other");
  detail::check_same_device(a, b, name);
  DType dt = promote_types(a.dtype(), b.dtype());
  if (float_only && !is_floating(dt)) dt = get_default_dtype();
  AG_CHECK(dt != kBool, name, "not defined for bool tensors");
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), name);
  Tensor out = make_tensor(shape, dt, a.device());
  backend(a.device(), name).binary(op, expand_raw(cast_raw(a, dt), shape),
                                   expand_raw(cast_raw(b, dt), shape), out);
  return out;
}

Tensor unary_forward(UnaryOp op, const Tensor& x, const char* name, bool float_only,
                     UnaryParams p = {}) {
  detail::check_defined(x, name, "input");
  DType dt = x.dtype();
  if (float_only && !is_floating(dt)) dt = get_default_dtype();
  AG_CHECK(dt != kBool, name, "not defined for bool tensors");
  Tensor xc = cast_raw(x, dt);
  Tensor out = make_tensor(xc.sizes(), dt, xc.device());
  backend(x.device(), name).unary(op, xc, out, p);
  return out;
}

Tensor scalar_like(Scalar s, const Tensor& t) {
  return scalar_tensor(s, TensorOptions().dtype(result_type(t.dtype(), s)).device(t.device()));
}

Tensor compare_forward(CompareOp op, const Tensor& a, const Tensor& b, const char* name) {
  detail::check_same_device(a, b, name);
  const DType dt = promote_types(a.dtype(), b.dtype());
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), name);
  Tensor out = make_tensor(shape, kBool, a.device());
  backend(a.device(), name).compare(op, expand_raw(cast_raw(a, dt), shape),
                                    expand_raw(cast_raw(b, dt), shape), out);
  return out;
}

// b * alpha outside the graph: add and sub record their own node, which applies alpha.
Tensor scaled_raw(const Tensor& b, Scalar alpha) {
  NoGradGuard no_grad;
  return mul(b, alpha);
}

// Saves t only when the gradient of `other` will need it.
SavedTensor save_if(const Tensor& t, bool needed) { return needed ? SavedTensor(t) : SavedTensor(); }

}  // namespace

// ---- binary arithmetic --------------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) {
  if (auto in = dispatch::autocast("add", a, b)) return add((*in)[0], (*in)[1], alpha);
  const bool scaled = alpha.to_double() != 1.0;
  Tensor out = binary_forward(BinaryOp::Add, a, scaled ? scaled_raw(b, alpha) : b, "add", false);
  if (any_requires_grad({&a, &b})) {
    const double al = alpha.to_double();
    record("add", {a, b}, {out}, [al, scaled](const TensorList& g, GradMask) -> TensorList {
      return {g[0], scaled ? mul(g[0], al) : g[0]};
    });
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha) {
  if (auto in = dispatch::autocast("sub", a, b)) return sub((*in)[0], (*in)[1], alpha);
  const bool scaled = alpha.to_double() != 1.0;
  Tensor out = binary_forward(BinaryOp::Sub, a, scaled ? scaled_raw(b, alpha) : b, "sub", false);
  if (any_requires_grad({&a, &b})) {
    const double al = alpha.to_double();
    record("sub", {a, b}, {out}, [al](const TensorList& g, GradMask need) -> TensorList {
      return {g[0], need[1] ? mul(g[0], -al) : Tensor()};
    });
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  if (auto in = dispatch::autocast("mul", a, b)) return mul((*in)[0], (*in)[1]);
  Tensor out = binary_forward(BinaryOp::Mul, a, b, "mul", false);
  if (any_requires_grad({&a, &b})) {
    record("mul", {a, b}, {out},
           [sa = save_if(a, b.requires_grad()), sb = save_if(b, a.requires_grad())](
               const TensorList& g, GradMask need) -> TensorList {
             return {need[0] ? mul(g[0], sb.get()) : Tensor(), need[1] ? mul(g[0], sa.get()) : Tensor()};
           });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  if (auto in = dispatch::autocast("div", a, b)) return div((*in)[0], (*in)[1]);
  Tensor out = binary_forward(BinaryOp::Div, a, b, "div", true);
  if (any_requires_grad({&a, &b})) {
    record("div", {a, b}, {out},
           [sb = SavedTensor(b), so = save_if(out, b.requires_grad())](
               const TensorList& g, GradMask need) -> TensorList {
             Tensor ga = div(g[0], sb.get());
             return {need[0] ? ga : Tensor(), need[1] ? neg(mul(ga, so.get())) : Tensor()};
           });
  }
  return out;
}

Tensor pow(const Tensor& a, const Tensor& b) {
  if (auto in = dispatch::autocast("pow", a, b)) return pow((*in)[0], (*in)[1]);
  Tensor out = binary_forward(BinaryOp::Pow, a, b, "pow", true);
  if (any_requires_grad({&a, &b})) {
    record("pow", {a, b}, {out},
           [sa = SavedTensor(a), sb = SavedTensor(b), so = save_if(out, b.requires_grad())](
               const TensorList& g, GradMask need) -> TensorList {
             Tensor ga, gb;
             if (need[0]) ga = mul(g[0], mul(sb.get(), pow(sa.get(), sub(sb.get(), 1))));
             if (need[1]) gb = mul(g[0], mul(so.get(), log(sa.get())));
             return {ga, gb};
           });
  }
  return out;
}

namespace {
// Gradient split of maximum/minimum: the winner gets it all, a tie splits it evenly.
TensorList extremum_backward(const Tensor& g, const Tensor& a, const Tensor& b, bool is_max,
                             GradMask need) {
  Tensor wins = is_max ? gt(a, b) : lt(a, b);
  Tensor ties = eq(a, b);
  Tensor half = mul(g, 0.5);
  Tensor zero = zeros_like(g);
  Tensor ga, gb;
  if (need[0]) ga = where(wins, g, where(ties, half, zero));
  if (need[1]) gb = where(logical_or(wins, ties), where(ties, half, zero), g);
  return {ga, gb};
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) {
  if (auto in = dispatch::autocast("maximum", a, b)) return maximum((*in)[0], (*in)[1]);
  Tensor out = binary_forward(BinaryOp::Maximum, a, b, "maximum", false);
  if (any_requires_grad({&a, &b}))
    record("maximum", {a, b}, {out},
           [sa = SavedTensor(a), sb = SavedTensor(b)](const TensorList& g, GradMask need) {
             return extremum_backward(g[0], sa.get(), sb.get(), true, need);
           });
  return out;
}

Tensor minimum(const Tensor& a, const Tensor& b) {
  if (auto in = dispatch::autocast("minimum", a, b)) return minimum((*in)[0], (*in)[1]);
  Tensor out = binary_forward(BinaryOp::Minimum, a, b, "minimum", false);
  if (any_requires_grad({&a, &b}))
    record("minimum", {a, b}, {out},
           [sa = SavedTensor(a), sb = SavedTensor(b)](const TensorList& g, GradMask need) {
             return extremum_backward(g[0], sa.get(), sb.get(), false, need);
           });
  return out;
}

Tensor add(const Tensor& a, Scalar b) { return add(a, scalar_like(b, a)); }
Tensor sub(const Tensor& a, Scalar b) { return sub(a, scalar_like(b, a)); }
Tensor rsub(const Tensor& a, Scalar b) { return sub(scalar_like(b, a), a); }
Tensor mul(const Tensor& a, Scalar b) { return mul(a, scalar_like(b, a)); }
Tensor div(const Tensor& a, Scalar b) { return div(a, scalar_like(b, a)); }
Tensor rdiv(const Tensor& a, Scalar b) { return div(scalar_like(b, a), a); }

Tensor pow(const Tensor& x, Scalar exponent) {
  if (auto in = dispatch::autocast("pow", x)) return pow((*in)[0], exponent);
  const double e = exponent.to_double();
  Tensor out = unary_forward(UnaryOp::PowScalar, x, "pow", true, {e, 0});
  if (any_requires_grad({&x}))
    record("pow", {x}, {out}, [sx = SavedTensor(x), e](const TensorList& g, GradMask) -> TensorList {
      if (e == 2.0) return {mul(g[0], mul(sx.get(), 2.0))};
      return {mul(g[0], mul(pow(sx.get(), e - 1), e))};
    });
  return out;
}

// ---- unary --------------------------------------------------------------------------------

namespace {
// A unary op whose gradient is a function of (grad, saved input, saved output).
template <class Backward>
Tensor unary_op(UnaryOp op, const Tensor& x, const char* name, bool float_only, bool save_x,
                bool save_y, Backward bw, UnaryParams p = {}) {
  Tensor out = unary_forward(op, x, name, float_only, p);
  if (any_requires_grad({&x}))
    record(name, {x}, {out},
           [sx = save_if(x, save_x), sy = save_if(out, save_y), bw](const TensorList& g,
                                                                     GradMask) -> TensorList {
             static const Tensor none;
             return {bw(g[0], sx.defined() ? sx.get() : none, sy.defined() ? sy.get() : none)};
           });
  return out;
}
}  // namespace

Tensor neg(const Tensor& x) {
  return unary_op(UnaryOp::Neg, x, "neg", false, false, false,
                  [](const Tensor& g, const Tensor&, const Tensor&) { return neg(g); });
}
Tensor abs(const Tensor& x) {
  return unary_op(UnaryOp::Abs, x, "abs", false, true, false,
                  [](const Tensor& g, const Tensor& x, const Tensor&) { return mul(g, sign(x)); });
}
Tensor sign(const Tensor& x) { return unary_forward(UnaryOp::Sign, x, "sign", false); }
Tensor square(const Tensor& x) {
  return unary_op(UnaryOp::Square, x, "square", false, true, false,
                  [](const Tensor& g, const Tensor& x, const Tensor&) { return mul(g, mul(x, 2.0)); });
}
Tensor sqrt(const Tensor& x) {
  return unary_op(UnaryOp::Sqrt, x, "sqrt", true, false, true,
                  [](const Tensor& g, const Tensor&, const Tensor& y) { return div(g, mul(y, 2.0)); });
}
Tensor rsqrt(const Tensor& x) {
  if (auto in = dispatch::autocast("rsqrt", x)) return rsqrt((*in)[0]);
  return unary_op(UnaryOp::Rsqrt, x, "rsqrt", true, false, true,
                  [](const Tensor& g, const Tensor&, const Tensor& y) {
                    return mul(g, mul(pow(y, 3.0), -0.5));
                  });
}
Tensor reciprocal(const Tensor& x) {
  if (auto in = dispatch::autocast("reciprocal", x)) return reciprocal((*in)[0]);
  return unary_op(UnaryOp::Reciprocal, x, "reciprocal", true, false, true,
                  [](const Tensor& g, const Tensor&, const Tensor& y) { return neg(mul(g, square(y))); });
}
Tensor exp(const Tensor& x) {
  if (auto in = dispatch::autocast("exp", x)) return exp((*in)[0]);
  return unary_op(UnaryOp::Exp, x, "exp", true, false, true,
                  [](const Tensor& g, const Tensor&, const Tensor& y) { return mul(g, y); });
}
Tensor log(const Tensor& x) {
  if (auto in = dispatch::autocast("log", x)) return log((*in)[0]);
  return unary_op(UnaryOp::Log, x, "log", true, true, false,
                  [](const Tensor& g, const Tensor& x, const Tensor&) { return div(g, x); });
}
Tensor log1p(const Tensor& x) {
  if (auto in = dispatch::autocast("log1p", x)) return log1p((*in)[0]);
  return unary_op(UnaryOp::Log1p, x, "log1p", true, true, false,
                  [](const Tensor& g, const Tensor& x, const Tensor&) { return div(g, add(x, 1.0)); });
}
Tensor tanh(const Tensor& x) {
  return unary_op(UnaryOp::Tanh, x, "tanh", true, false, true,
                  [](const Tensor& g, const Tensor&, const Tensor& y) {
                    return binary_raw(BinaryOp::TanhBackward, g, cast_raw(y, g.dtype()));
                  });
}
Tensor sigmoid(const Tensor& x) {
  return unary_op(UnaryOp::Sigmoid, x, "sigmoid", true, false, true,
                  [](const Tensor& g, const Tensor&, const Tensor& y) {
                    return binary_raw(BinaryOp::SigmoidBackward, g, cast_raw(y, g.dtype()));
                  });
}
Tensor relu(const Tensor& x) {
  return unary_op(UnaryOp::Relu, x, "relu", false, false, true,
                  [](const Tensor& g, const Tensor&, const Tensor& y) {
                    return binary_raw(BinaryOp::ReluBackward, g, cast_raw(y, g.dtype()));
                  });
}
Tensor gelu(const Tensor& x, std::string_view approximate) {
  AG_CHECK(approximate == "none" || approximate == "tanh", "gelu",
           "approximate must be 'none' or 'tanh', got '", approximate, "'");
  const bool tanh_form = approximate == "tanh";
  return unary_op(tanh_form ? UnaryOp::GeluTanh : UnaryOp::GeluErf, x, "gelu", true, true, false,
                  [tanh_form](const Tensor& g, const Tensor& x, const Tensor&) {
                    return binary_raw(tanh_form ? BinaryOp::GeluTanhBackward : BinaryOp::GeluErfBackward,
                                      g, cast_raw(x, g.dtype()));
                  });
}
Tensor silu(const Tensor& x) {
  return unary_op(UnaryOp::Silu, x, "silu", true, true, false,
                  [](const Tensor& g, const Tensor& x, const Tensor&) {
                    return binary_raw(BinaryOp::SiluBackward, g, cast_raw(x, g.dtype()));
                  });
}

Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max) {
  AG_CHECK(min || max, "clamp", "at least one of min and max must be given");
  const double lo = min ? min->to_double() : -INFINITY;
  const double hi = max ? max->to_double() : INFINITY;
  return unary_op(UnaryOp::Clamp, x, "clamp", false, true, false,
                  [lo, hi](const Tensor& g, const Tensor& x, const Tensor&) {
                    Tensor keep = logical_and(ge(x, lo), le(x, hi));
                    return where(keep, g, zeros_like(g));
                  },
                  {lo, hi});
}

// ---- comparisons and selection ---------------------------------------------------------------

Tensor eq(const Tensor& a, const Tensor& b) { return compare_forward(CompareOp::Eq, a, b, "eq"); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare_forward(CompareOp::Ne, a, b, "ne"); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare_forward(CompareOp::Lt, a, b, "lt"); }
Tensor le(const Tensor& a, const Tensor& b) { return compare_forward(CompareOp::Le, a, b, "le"); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare_forward(CompareOp::Gt, a, b, "gt"); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare_forward(CompareOp::Ge, a, b, "ge"); }
Tensor eq(const Tensor& a, Scalar b) { return eq(a, scalar_like(b, a)); }
Tensor ne(const Tensor& a, Scalar b) { return ne(a, scalar_like(b, a)); }
Tensor lt(const Tensor& a, Scalar b) { return lt(a, scalar_like(b, a)); }
Tensor le(const Tensor& a, Scalar b) { return le(a, scalar_like(b, a)); }
Tensor gt(const Tensor& a, Scalar b) { return gt(a, scalar_like(b, a)); }
Tensor ge(const Tensor& a, Scalar b) { return ge(a, scalar_like(b, a)); }
Tensor logical_and(const Tensor& a, const Tensor& b) {
  return compare_forward(CompareOp::LogicalAnd, a, b, "logical_and");
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  return compare_forward(CompareOp::LogicalOr, a, b, "logical_or");
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  if (auto in = dispatch::autocast("where", a, b)) return where(cond, (*in)[0], (*in)[1]);
  detail::check_defined(cond, "where", "condition");
  AG_CHECK(cond.dtype() == kBool, "where", "the condition must be bool, got ", dtype_name(cond.dtype()));
  detail::check_same_device(cond, a, "where");
  detail::check_same_device(a, b, "where");
  const DType dt = promote_types(a.dtype(), b.dtype());
  const Shape shape =
      broadcast_shapes(broadcast_shapes(cond.sizes(), a.sizes(), "where"), b.sizes(), "where");
  Tensor out = make_tensor(shape, dt, a.device());
  backend(a.device(), "where").where(expand_raw(cond, shape), expand_raw(cast_raw(a, dt), shape),
                                     expand_raw(cast_raw(b, dt), shape), out);
  if (any_requires_grad({&a, &b}))
    record("where", {a, b}, {out}, [sc = SavedTensor(cond)](const TensorList& g, GradMask need) -> TensorList {
      Tensor zero = zeros_like(g[0]);
      return {need[0] ? where(sc.get(), g[0], zero) : Tensor(),
              need[1] ? where(sc.get(), zero, g[0]) : Tensor()};
    });
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, Scalar b) { return where(cond, a, scalar_like(b, a)); }

Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value) {
  detail::check_defined(mask, "masked_fill", "mask");
  AG_CHECK(mask.dtype() == kBool, "masked_fill", "the mask must be bool, got ", dtype_name(mask.dtype()));
  Tensor v = scalar_tensor(value, TensorOptions().dtype(x.dtype()).device(x.device()));
  Tensor out = where(mask, v, x);
  AG_CHECK(out.sizes() == x.sizes(), "masked_fill", "mask of shape ", mask.sizes(),
           " does not broadcast to the input's shape ", x.sizes());
  return out;
}

Tensor to_dtype(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor out = make_tensor(x.sizes(), dtype, x.device());
  backend(x.device(), "to").copy(x, out);
  if (is_floating(dtype) && any_requires_grad({&x})) {
    auto node = record("to", {x}, {out}, [](const TensorList& g, GradMask) -> TensorList { return {g[0]}; });
    if (node) node->cast_output = dtype;
  }
  return out;
}

// ---- operators ------------------------------------------------------------------------------

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, Scalar b) { return add(a, b); }
Tensor operator-(const Tensor& a, Scalar b) { return sub(a, b); }
Tensor operator*(const Tensor& a, Scalar b) { return mul(a, b); }
Tensor operator/(const Tensor& a, Scalar b) { return div(a, b); }
Tensor operator+(Scalar a, const Tensor& b) { return add(b, a); }
Tensor operator-(Scalar a, const Tensor& b) { return rsub(b, a); }
Tensor operator*(Scalar a, const Tensor& b) { return mul(b, a); }
Tensor operator/(Scalar a, const Tensor& b) { return rdiv(b, a); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator==(const Tensor& a, const Tensor& b) { return eq(a, b); }
Tensor operator!=(const Tensor& a, const Tensor& b) { return ne(a, b); }
Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }
Tensor operator<(const Tensor& a, Scalar b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, Scalar b) { return le(a, b); }
Tensor operator>(const Tensor& a, Scalar b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, Scalar b) { return ge(a, b); }

}  // namespace ampgrad
