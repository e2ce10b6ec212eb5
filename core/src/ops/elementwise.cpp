// Elementwise ops: promotion and broadcasting, the kernel call, and the backward formula,
// side by side for each op. A C++ scalar operand (t * 2.0) reaches the kernel by value and
// never becomes a tensor; so does a 0-dim CPU tensor next to a tensor of another device.
#include "ampgrad/ops/elementwise.h"

#include <cmath>

#include "ampgrad/cast_shadow.h"
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
  checked_numel(out, op);  // two expanded views can broadcast to more elements than int64 holds
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

void check_mask(const Tensor& mask, const Shape& shape, const char* op) {
  check_defined(mask, op, "mask");
  AG_CHECK(mask.dtype() == kBool, op, "the mask must be bool, got ", dtype_name(mask.dtype()));
  AG_CHECK(broadcast_shapes(mask.sizes(), shape, op) == shape, op, "mask of shape ", mask.sizes(),
           " does not broadcast to the input's shape ", shape);
}

bool is_host_scalar(const Tensor& t) { return t.dim() == 0 && t.device().is_cpu(); }

Device common_device(const Tensor& a, const Tensor& b, const char* op) {
  if (a.device() == b.device()) return a.device();
  if (is_host_scalar(b)) return a.device();
  if (is_host_scalar(a)) return b.device();
  check_same_device(a, b, op);  // throws
  return a.device();
}

Operand host_scalar(const Tensor& t) {
  // The element itself, not item(): it is on the host already, so nothing waits (and no
  // host sync is counted).
  return dispatch_all(t.dtype(), "scalar", [&]<class T>() {
    const T v = *static_cast<const T*>(t.raw_data());
    if constexpr (std::is_integral_v<T>) return Operand::integer(int64_t(v));
    else if constexpr (is_float16_v<T>) return Operand::scalar(double(float(v)));
    else return Operand::scalar(double(v));
  });
}

Operand operand_on(const Tensor& t, Device device, DType dt, const Shape& shape, Tensor& hold) {
  if (t.device() != device) return host_scalar(t);
  hold = expand_raw(cast_raw(t, dt), shape);
  return hold;
}

Tensor unary_raw(UnaryOp op, const Tensor& x, UnaryParams p) {
  Tensor out = make_tensor(x.sizes(), x.dtype(), x.device());
  backend(x.device(), op_name(op)).unary(op, x, out, p);
  return out;
}

Tensor binary_raw(BinaryOp op, const Tensor& a, const Operand& b) {
  Backend& be = backend(a.device(), op_name(op));
  if (b.is_scalar()) {
    Tensor out = make_tensor(a.sizes(), a.dtype(), a.device());
    be.binary(op, a, b, out);
    return out;
  }
  const Shape shape = broadcast_shapes(a.sizes(), b.tensor().sizes(), op_name(op));
  Tensor out = make_tensor(shape, a.dtype(), a.device());
  be.binary(op, expand_raw(a, shape), expand_raw(b.tensor(), shape), out);
  return out;
}

// Whether two elements of t may share one memory location (non_overlapping, internal.h):
// an expanded view does. Views from slicing, transposing or permuting never overlap; writing
// in place through one that does would race and give an answer that depends on the order
// of the writes, which PyTorch refuses too.
bool may_overlap(const Tensor& t) {
  return !t.is_contiguous() && !non_overlapping(t.sizes(), t.strides());  // contiguous: no sort
}

void apply_inplace(Tensor& self, const char* op, bool needs_grad,
                   const std::function<Tensor()>& compute,
                   const std::function<void()>& write_into) {
  AG_CHECK(!may_overlap(self), op, "cannot write in place into a tensor whose elements overlap in memory (shape ",
           self.sizes(), ", strides ", self.strides(), ", as an expanded view has); clone() it first");
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
using detail::operand_on;
using detail::save_if;
using detail::unary_raw;

namespace {

// The dtype arithmetic computes in, given the operands' promoted dtype: floating-only
// math computes integral operands in the default floating dtype; bool has no arithmetic.
DType arithmetic_dtype(DType dt, bool float_only, const char* name) {
  if (float_only && !is_floating(dt)) dt = get_default_dtype();
  AG_CHECK(dt != kBool, name, "not defined for bool tensors");
  return dt;
}

// op(a, b) after promotion and broadcasting.
Tensor binary_forward(BinaryOp op, const Tensor& a, const Tensor& b, const char* name,
                      bool float_only) {
  detail::check_defined(a, name, "input");
  detail::check_defined(b, name, "other");
  const Device device = detail::common_device(a, b, name);
  const DType dt = arithmetic_dtype(promote_types(a.dtype(), b.dtype()), float_only, name);
  // Equal shapes (the common case) need no broadcast and no new shape vector.
  Shape broadcast;
  const Shape& shape = a.sizes() == b.sizes() ? a.sizes() : (broadcast = broadcast_shapes(a.sizes(), b.sizes(), name));
  Tensor out = make_tensor(shape, dt, device);
  Backend& be = backend(device, name);
  // A 16-bit operand of a float32 result goes in as it is where the backend widens it in
  // the loop (Backend::binary_widens): no cast pass over memory.
  const bool widen = dt == kFloat32 && (is_reduced_floating(a.dtype()) || is_reduced_floating(b.dtype())) &&
                     be.binary_widens(op);
  Tensor ha, hb;
  const auto operand = [&](const Tensor& t, Tensor& hold) {
    if (widen && t.device() == device && (t.dtype() == kFloat32 || is_reduced_floating(t.dtype()))) {
      hold = expand_raw(t, shape);
      return Operand(hold);
    }
    return operand_on(t, device, dt, shape, hold);
  };
  be.binary(op, operand(a, ha), operand(b, hb), out);
  return out;
}

// op(t, s), or op(s, t) when scalar_first. The scalar promotes as a Python scalar does
// (result_type: it never widens a tensor of its own category) and reaches the kernel by
// value.
Tensor binary_scalar_forward(BinaryOp op, const Tensor& t, Scalar s, bool scalar_first,
                             const char* name, bool float_only) {
  detail::check_defined(t, name, "input");
  const DType dt = arithmetic_dtype(result_type(t.dtype(), s), float_only, name);
  Tensor out = make_tensor(t.sizes(), dt, t.device());
  const Tensor tc = cast_raw(t, dt);
  const Operand sv = Operand::scalar(s.to_double());
  Backend& be = backend(t.device(), name);
  if (scalar_first) be.binary(op, sv, tc, out);
  else be.binary(op, tc, sv, out);
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

Tensor compare_forward(CompareOp op, const Tensor& a, const Tensor& b, const char* name) {
  detail::check_defined(a, name, "input");
  detail::check_defined(b, name, "other");
  const Device device = detail::common_device(a, b, name);
  const DType dt = promote_types(a.dtype(), b.dtype());
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), name);
  Tensor out = make_tensor(shape, kBool, device);
  Tensor ha, hb;
  backend(device, name).compare(op, operand_on(a, device, dt, shape, ha),
                                operand_on(b, device, dt, shape, hb), out);
  return out;
}

Tensor compare_scalar_forward(CompareOp op, const Tensor& t, Scalar s, const char* name) {
  detail::check_defined(t, name, "input");
  Tensor out = make_tensor(t.sizes(), kBool, t.device());
  backend(t.device(), name).compare(op, cast_raw(t, result_type(t.dtype(), s)),
                                    Operand::scalar(s.to_double()), out);
  return out;
}

// b * alpha outside the graph: add and sub record their own node, which applies alpha.
Tensor scaled_raw(const Tensor& b, Scalar alpha) {
  NoGradGuard no_grad;
  return mul(b, alpha);
}

}  // namespace

// ---- binary arithmetic --------------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) {
  if (auto in = dispatch::autocast(op::add, a, b)) return add((*in)[0], (*in)[1], alpha);
  const bool scaled = alpha.to_double() != 1.0;
  Tensor out = binary_forward(BinaryOp::Add, a, scaled ? scaled_raw(b, alpha) : b, op::add, false);
  if (any_requires_grad({&a, &b})) {
    const double al = alpha.to_double();
    record(op::add, {a, b}, {out}, [al, scaled](const TensorList& g, GradMask) -> TensorList {
      return {g[0], scaled ? mul(g[0], al) : g[0]};
    });
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha) {
  if (auto in = dispatch::autocast(op::sub, a, b)) return sub((*in)[0], (*in)[1], alpha);
  const bool scaled = alpha.to_double() != 1.0;
  Tensor out = binary_forward(BinaryOp::Sub, a, scaled ? scaled_raw(b, alpha) : b, op::sub, false);
  if (any_requires_grad({&a, &b})) {
    const double al = alpha.to_double();
    record(op::sub, {a, b}, {out}, [al](const TensorList& g, GradMask need) -> TensorList {
      return {g[0], need[1] ? mul(g[0], -al) : Tensor()};
    });
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  if (auto in = dispatch::autocast(op::mul, a, b)) return mul((*in)[0], (*in)[1]);
  Tensor out = binary_forward(BinaryOp::Mul, a, b, op::mul, false);
  if (any_requires_grad({&a, &b})) {
    record(op::mul, {a, b}, {out},
           [sa = save_if(a, b.requires_grad()), sb = save_if(b, a.requires_grad())](
               const TensorList& g, GradMask need) -> TensorList {
             return {need[0] ? mul(g[0], sb.get()) : Tensor(), need[1] ? mul(g[0], sa.get()) : Tensor()};
           });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  if (auto in = dispatch::autocast(op::div, a, b)) return div((*in)[0], (*in)[1]);
  Tensor out = binary_forward(BinaryOp::Div, a, b, op::div, true);
  if (any_requires_grad({&a, &b})) {
    record(op::div, {a, b}, {out},
           [sb = SavedTensor(b), so = save_if(out, b.requires_grad())](
               const TensorList& g, GradMask need) -> TensorList {
             Tensor ga = div(g[0], sb.get());
             return {need[0] ? ga : Tensor(), need[1] ? neg(mul(ga, so.get())) : Tensor()};
           });
  }
  return out;
}

Tensor pow(const Tensor& a, const Tensor& b) {
  if (auto in = dispatch::autocast(op::pow, a, b)) return pow((*in)[0], (*in)[1]);
  Tensor out = binary_forward(BinaryOp::Pow, a, b, op::pow, true);
  if (any_requires_grad({&a, &b})) {
    record(op::pow, {a, b}, {out},
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
  Tensor tie_share = where(ties, mul(g, 0.5), 0.0);
  Tensor ga, gb;
  if (need[0]) ga = where(wins, g, tie_share);
  if (need[1]) gb = where(logical_or(wins, ties), tie_share, g);
  return {ga, gb};
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) {
  if (auto in = dispatch::autocast(op::maximum, a, b)) return maximum((*in)[0], (*in)[1]);
  Tensor out = binary_forward(BinaryOp::Maximum, a, b, op::maximum, false);
  if (any_requires_grad({&a, &b}))
    record(op::maximum, {a, b}, {out},
           [sa = SavedTensor(a), sb = SavedTensor(b)](const TensorList& g, GradMask need) {
             return extremum_backward(g[0], sa.get(), sb.get(), true, need);
           });
  return out;
}

Tensor minimum(const Tensor& a, const Tensor& b) {
  if (auto in = dispatch::autocast(op::minimum, a, b)) return minimum((*in)[0], (*in)[1]);
  Tensor out = binary_forward(BinaryOp::Minimum, a, b, op::minimum, false);
  if (any_requires_grad({&a, &b}))
    record(op::minimum, {a, b}, {out},
           [sa = SavedTensor(a), sb = SavedTensor(b)](const TensorList& g, GradMask need) {
             return extremum_backward(g[0], sa.get(), sb.get(), false, need);
           });
  return out;
}

// ---- tensor with a scalar: the scalar goes to the kernel by value, and backward formulas
// capture it by value (nothing is saved for it) --------------------------------------------

Tensor add(const Tensor& a, Scalar b) {
  if (auto in = dispatch::autocast(op::add, a)) return add((*in)[0], b);
  Tensor out = binary_scalar_forward(BinaryOp::Add, a, b, false, op::add, false);
  if (any_requires_grad({&a}))
    record(op::add, {a}, {out}, [](const TensorList& g, GradMask) -> TensorList { return {g[0]}; });
  return out;
}

Tensor sub(const Tensor& a, Scalar b) {
  if (auto in = dispatch::autocast(op::sub, a)) return sub((*in)[0], b);
  Tensor out = binary_scalar_forward(BinaryOp::Sub, a, b, false, op::sub, false);
  if (any_requires_grad({&a}))
    record(op::sub, {a}, {out}, [](const TensorList& g, GradMask) -> TensorList { return {g[0]}; });
  return out;
}

Tensor rsub(const Tensor& a, Scalar b) {
  if (auto in = dispatch::autocast(op::sub, a)) return rsub((*in)[0], b);
  Tensor out = binary_scalar_forward(BinaryOp::Sub, a, b, true, op::sub, false);
  if (any_requires_grad({&a}))
    record(op::sub, {a}, {out}, [](const TensorList& g, GradMask) -> TensorList { return {mul(g[0], -1.0)}; });
  return out;
}

Tensor mul(const Tensor& a, Scalar b) {
  if (auto in = dispatch::autocast(op::mul, a)) return mul((*in)[0], b);
  Tensor out = binary_scalar_forward(BinaryOp::Mul, a, b, false, op::mul, false);
  if (any_requires_grad({&a}))
    record(op::mul, {a}, {out}, [b](const TensorList& g, GradMask) -> TensorList { return {mul(g[0], b)}; });
  return out;
}

Tensor div(const Tensor& a, Scalar b) {
  if (auto in = dispatch::autocast(op::div, a)) return div((*in)[0], b);
  Tensor out = binary_scalar_forward(BinaryOp::Div, a, b, false, op::div, true);
  if (any_requires_grad({&a}))
    record(op::div, {a}, {out}, [b](const TensorList& g, GradMask) -> TensorList { return {div(g[0], b)}; });
  return out;
}

Tensor rdiv(const Tensor& a, Scalar b) {
  if (auto in = dispatch::autocast(op::div, a)) return rdiv((*in)[0], b);
  Tensor out = binary_scalar_forward(BinaryOp::Div, a, b, true, op::div, true);
  if (any_requires_grad({&a}))  // d(b / a) = -(g / a) * out
    record(op::div, {a}, {out}, [sa = SavedTensor(a), so = SavedTensor(out)](const TensorList& g, GradMask) -> TensorList {
      return {neg(mul(div(g[0], sa.get()), so.get()))};
    });
  return out;
}

Tensor pow(const Tensor& x, Scalar exponent) {
  if (auto in = dispatch::autocast(op::pow, x)) return pow((*in)[0], exponent);
  const double e = exponent.to_double();
  Tensor out = unary_forward(UnaryOp::PowScalar, x, op::pow, true, {e, 0});
  if (any_requires_grad({&x}))
    record(op::pow, {x}, {out}, [sx = SavedTensor(x), e](const TensorList& g, GradMask) -> TensorList {
      if (e == 2.0) return {mul(g[0], mul(sx.get(), 2.0))};
      return {mul(g[0], mul(pow(sx.get(), e - 1), e))};
    });
  return out;
}

// ---- unary --------------------------------------------------------------------------------

namespace {
// One unary op's row: the kernel, and what its backward formula reads.
struct UnarySpec {
  UnaryOp op;
  const char* name;
  bool float_only = false;   // integral inputs compute in the default floating dtype
  bool save_input = false;   // the backward formula reads the input
  bool save_output = false;  // the backward formula reads the output
  UnaryParams params = {};
};

// A unary op whose gradient is bw(grad, saved input, saved output).
template <class Backward>
Tensor unary_op(const UnarySpec& spec, const Tensor& x, Backward bw) {
  Tensor out = unary_forward(spec.op, x, spec.name, spec.float_only, spec.params);
  if (any_requires_grad({&x}))
    record(spec.name, {x}, {out},
           [sx = save_if(x, spec.save_input), sy = save_if(out, spec.save_output), bw](
               const TensorList& g, GradMask) -> TensorList {
             static const Tensor none;
             return {bw(g[0], sx.defined() ? sx.get() : none, sy.defined() ? sy.get() : none)};
           });
  return out;
}
}  // namespace

Tensor neg(const Tensor& x) {
  return unary_op({.op = UnaryOp::Neg, .name = op::neg}, x,
                  [](const Tensor& g, const Tensor&, const Tensor&) { return neg(g); });
}
Tensor abs(const Tensor& x) {
  return unary_op({.op = UnaryOp::Abs, .name = op::abs, .save_input = true}, x,
                  [](const Tensor& g, const Tensor& x, const Tensor&) { return mul(g, sign(x)); });
}
Tensor sign(const Tensor& x) { return unary_forward(UnaryOp::Sign, x, op::sign, false); }
Tensor square(const Tensor& x) {
  return unary_op({.op = UnaryOp::Square, .name = op::square, .save_input = true}, x,
                  [](const Tensor& g, const Tensor& x, const Tensor&) { return mul(g, mul(x, 2.0)); });
}
Tensor sqrt(const Tensor& x) {
  return unary_op({.op = UnaryOp::Sqrt, .name = op::sqrt, .float_only = true, .save_output = true}, x,
                  [](const Tensor& g, const Tensor&, const Tensor& y) { return div(g, mul(y, 2.0)); });
}
Tensor rsqrt(const Tensor& x) {
  if (auto in = dispatch::autocast(op::rsqrt, x)) return rsqrt((*in)[0]);
  return unary_op({.op = UnaryOp::Rsqrt, .name = op::rsqrt, .float_only = true, .save_output = true}, x,
                  [](const Tensor& g, const Tensor&, const Tensor& y) {
                    return mul(g, mul(pow(y, 3.0), -0.5));
                  });
}
Tensor reciprocal(const Tensor& x) {
  if (auto in = dispatch::autocast(op::reciprocal, x)) return reciprocal((*in)[0]);
  return unary_op({.op = UnaryOp::Reciprocal, .name = op::reciprocal, .float_only = true, .save_output = true}, x,
                  [](const Tensor& g, const Tensor&, const Tensor& y) { return neg(mul(g, square(y))); });
}
Tensor exp(const Tensor& x) {
  if (auto in = dispatch::autocast(op::exp, x)) return exp((*in)[0]);
  return unary_op({.op = UnaryOp::Exp, .name = op::exp, .float_only = true, .save_output = true}, x,
                  [](const Tensor& g, const Tensor&, const Tensor& y) { return mul(g, y); });
}
Tensor log(const Tensor& x) {
  if (auto in = dispatch::autocast(op::log, x)) return log((*in)[0]);
  return unary_op({.op = UnaryOp::Log, .name = op::log, .float_only = true, .save_input = true}, x,
                  [](const Tensor& g, const Tensor& x, const Tensor&) { return div(g, x); });
}
Tensor log1p(const Tensor& x) {
  if (auto in = dispatch::autocast(op::log1p, x)) return log1p((*in)[0]);
  return unary_op({.op = UnaryOp::Log1p, .name = op::log1p, .float_only = true, .save_input = true}, x,
                  [](const Tensor& g, const Tensor& x, const Tensor&) { return div(g, add(x, 1.0)); });
}
Tensor tanh(const Tensor& x) {
  return unary_op({.op = UnaryOp::Tanh, .name = op::tanh, .float_only = true, .save_output = true}, x,
                  [](const Tensor& g, const Tensor&, const Tensor& y) {
                    return binary_raw(BinaryOp::TanhBackward, g, cast_raw(y, g.dtype()));
                  });
}
Tensor softplus(const Tensor& x) {
  return unary_op({.op = UnaryOp::Softplus, .name = op::softplus, .float_only = true, .save_input = true}, x,
                  [](const Tensor& g, const Tensor& x, const Tensor&) { return mul(g, sigmoid(x)); });
}
Tensor sigmoid(const Tensor& x) {
  return unary_op({.op = UnaryOp::Sigmoid, .name = op::sigmoid, .float_only = true, .save_output = true}, x,
                  [](const Tensor& g, const Tensor&, const Tensor& y) {
                    return binary_raw(BinaryOp::SigmoidBackward, g, cast_raw(y, g.dtype()));
                  });
}
Tensor relu(const Tensor& x) {
  return unary_op({.op = UnaryOp::Relu, .name = op::relu, .save_output = true}, x,
                  [](const Tensor& g, const Tensor&, const Tensor& y) {
                    return binary_raw(BinaryOp::ReluBackward, g, cast_raw(y, g.dtype()));
                  });
}
Tensor gelu(const Tensor& x, std::string_view approximate) {
  AG_CHECK(approximate == "none" || approximate == op::tanh, op::gelu,
           "approximate must be 'none' or 'tanh', got '", approximate, "'");
  const bool tanh_form = approximate == op::tanh;
  return unary_op({.op = tanh_form ? UnaryOp::GeluTanh : UnaryOp::GeluErf, .name = op::gelu, .float_only = true,
                   .save_input = true},
                  x, [tanh_form](const Tensor& g, const Tensor& x, const Tensor&) {
                    return binary_raw(tanh_form ? BinaryOp::GeluTanhBackward : BinaryOp::GeluErfBackward,
                                      g, cast_raw(x, g.dtype()));
                  });
}
Tensor silu(const Tensor& x) {
  return unary_op({.op = UnaryOp::Silu, .name = op::silu, .float_only = true, .save_input = true}, x,
                  [](const Tensor& g, const Tensor& x, const Tensor&) {
                    return binary_raw(BinaryOp::SiluBackward, g, cast_raw(x, g.dtype()));
                  });
}

Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max) {
  AG_CHECK(min || max, op::clamp, "at least one of min and max must be given");
  const double lo = min ? min->to_double() : -INFINITY;
  const double hi = max ? max->to_double() : INFINITY;
  return unary_op({.op = UnaryOp::Clamp, .name = op::clamp, .save_input = true, .params = {lo, hi}}, x,
                  [lo, hi](const Tensor& g, const Tensor& x, const Tensor&) {
                    return where(logical_and(ge(x, lo), le(x, hi)), g, 0.0);
                  });
}

// ---- comparisons and selection ---------------------------------------------------------------

Tensor eq(const Tensor& a, const Tensor& b) { return compare_forward(CompareOp::Eq, a, b, op::eq); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare_forward(CompareOp::Ne, a, b, op::ne); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare_forward(CompareOp::Lt, a, b, op::lt); }
Tensor le(const Tensor& a, const Tensor& b) { return compare_forward(CompareOp::Le, a, b, op::le); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare_forward(CompareOp::Gt, a, b, op::gt); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare_forward(CompareOp::Ge, a, b, op::ge); }
Tensor eq(const Tensor& a, Scalar b) { return compare_scalar_forward(CompareOp::Eq, a, b, op::eq); }
Tensor ne(const Tensor& a, Scalar b) { return compare_scalar_forward(CompareOp::Ne, a, b, op::ne); }
Tensor lt(const Tensor& a, Scalar b) { return compare_scalar_forward(CompareOp::Lt, a, b, op::lt); }
Tensor le(const Tensor& a, Scalar b) { return compare_scalar_forward(CompareOp::Le, a, b, op::le); }
Tensor gt(const Tensor& a, Scalar b) { return compare_scalar_forward(CompareOp::Gt, a, b, op::gt); }
Tensor ge(const Tensor& a, Scalar b) { return compare_scalar_forward(CompareOp::Ge, a, b, op::ge); }
Tensor logical_and(const Tensor& a, const Tensor& b) {
  return compare_forward(CompareOp::LogicalAnd, a, b, op::logical_and);
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  return compare_forward(CompareOp::LogicalOr, a, b, op::logical_or);
}

namespace {

// One value operand of where: a tensor, or (t null) a scalar.
struct WhereArg {
  WhereArg(const Tensor& tensor) : t(&tensor) {}  // NOLINT: implicit on purpose
  WhereArg(Scalar scalar) : s(scalar) {}          // NOLINT
  const Tensor* t = nullptr;
  Scalar s;
};

// cond ? a : b over tensors and scalars, and its node. The dtype is where's promotion
// (a scalar promotes as in binary ops) unless `dtype` is given (masked_fill keeps its
// input's).
Tensor where_op(const Tensor& cond, const WhereArg& a, const WhereArg& b,
                std::optional<DType> dtype = std::nullopt) {
  detail::check_defined(cond, op::where, "condition");
  AG_CHECK(cond.dtype() == kBool, op::where, "the condition must be bool, got ", dtype_name(cond.dtype()));
  if (a.t) detail::check_defined(*a.t, op::where, "input");
  if (b.t) detail::check_defined(*b.t, op::where, "other");
  const Tensor& first = a.t ? *a.t : *b.t;
  Device device = first.device();
  DType dt;
  if (a.t && b.t) {
    device = detail::common_device(*a.t, *b.t, op::where);
    dt = promote_types(a.t->dtype(), b.t->dtype());
  } else {
    dt = result_type(first.dtype(), a.t ? b.s : a.s);
  }
  if (dtype) dt = *dtype;
  AG_CHECK(cond.device() == device, op::where, "expected tensors on one device, got ", cond.device(),
           " and ", device);
  Shape shape = cond.sizes();
  if (a.t) shape = broadcast_shapes(shape, a.t->sizes(), op::where);
  if (b.t) shape = broadcast_shapes(shape, b.t->sizes(), op::where);
  Tensor out = make_tensor(shape, dt, device);
  Tensor ha, hb;
  auto operand = [&](const WhereArg& x, Tensor& hold) {
    return x.t ? operand_on(*x.t, device, dt, shape, hold) : Operand::scalar(x.s.to_double());
  };
  backend(device, op::where).where(expand_raw(cond, shape), operand(a, ha), operand(b, hb), out);
  // A tensor operand's gradient is g where it was picked, else 0; scalars have none.
  TensorList inputs;
  std::vector<bool> picked_when;  // per input: true for a (picked where cond holds)
  if (a.t) inputs.push_back(*a.t), picked_when.push_back(true);
  if (b.t) inputs.push_back(*b.t), picked_when.push_back(false);
  if (any_requires_grad(inputs))
    record(op::where, inputs, {out},
           [sc = SavedTensor(cond), picked_when](const TensorList& g, GradMask need) -> TensorList {
             TensorList grads;
             for (size_t i = 0; i < picked_when.size(); ++i)
               grads.push_back(!need[i]          ? Tensor()
                               : picked_when[i] ? where(sc.get(), g[0], 0.0)
                                                : where(sc.get(), 0.0, g[0]));
             return grads;
           });
  return out;
}

}  // namespace

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  if (auto in = dispatch::autocast(op::where, a, b)) return where(cond, (*in)[0], (*in)[1]);
  return where_op(cond, a, b);
}

Tensor where(const Tensor& cond, const Tensor& a, Scalar b) {
  if (auto in = dispatch::autocast(op::where, a)) return where(cond, (*in)[0], b);
  return where_op(cond, a, b);
}

Tensor where(const Tensor& cond, Scalar a, const Tensor& b) {
  if (auto in = dispatch::autocast(op::where, b)) return where(cond, a, (*in)[0]);
  return where_op(cond, a, b);
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value) {
  if (auto in = dispatch::autocast(op::where, x)) return masked_fill((*in)[0], mask, value);
  detail::check_defined(x, op::masked_fill, "input");
  detail::check_mask(mask, x.sizes(), op::masked_fill);
  return where_op(mask, value, x, x.dtype());
}

namespace {
// The autograd of a cast: the gradient passes through, and the engine converts it to the
// input's dtype (cast_output).
void record_cast(const Tensor& x, const Tensor& out) {
  if (is_floating(out.dtype()) && any_requires_grad({&x})) {
    auto node = record(op::to, {x}, {out}, [](const TensorList& g, GradMask) -> TensorList { return {g[0]}; });
    if (node) node->cast_output = out.dtype();
  }
}
}  // namespace

Tensor to_dtype(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor out = make_tensor(x.sizes(), dtype, x.device(), op::to);
  backend(x.device(), op::to).copy(x, out);
  record_cast(x, out);
  return out;
}

Tensor detail::cast_from_shadow(const Tensor& x, const Tensor& shadow) {
  record_cast(x, shadow);
  return shadow;
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
