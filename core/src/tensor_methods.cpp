// Tensor's methods: thin forwards to the free functions that define each op, and the
// in-place ops.
#include <atomic>
#include <cmath>
#include <functional>

#include "ampgrad/factories.h"
#include "ampgrad/ops/elementwise.h"
#include "ampgrad/ops/nn.h"
#include "ampgrad/ops/reduce.h"
#include "ampgrad/ops/shape.h"
#include "internal.h"

namespace ampgrad {

Tensor Tensor::view(const std::vector<int64_t>& s) const { return ampgrad::view(*this, s); }
Tensor Tensor::reshape(const std::vector<int64_t>& s) const { return ampgrad::reshape(*this, s); }
Tensor Tensor::flatten(int64_t a, int64_t b) const { return ampgrad::flatten(*this, a, b); }
Tensor Tensor::transpose(int64_t a, int64_t b) const { return ampgrad::transpose(*this, a, b); }
Tensor Tensor::t() const {
  AG_CHECK(dim() <= 2, "t", "expects a tensor of at most 2 dims, got ", dim());
  return dim() < 2 ? *this : ampgrad::transpose(*this, 0, 1);
}
Tensor Tensor::permute(const std::vector<int64_t>& d) const { return ampgrad::permute(*this, d); }
Tensor Tensor::narrow(int64_t d, int64_t s, int64_t l) const { return ampgrad::narrow(*this, d, s, l); }
Tensor Tensor::select(int64_t d, int64_t i) const { return ampgrad::select(*this, d, i); }
Tensor Tensor::expand(const std::vector<int64_t>& s) const { return ampgrad::expand(*this, s); }
Tensor Tensor::expand_as(const Tensor& o) const { return ampgrad::expand(*this, o.sizes().vec()); }
Tensor Tensor::squeeze() const { return ampgrad::squeeze(*this); }
Tensor Tensor::squeeze(int64_t d) const { return ampgrad::squeeze(*this, d); }
Tensor Tensor::unsqueeze(int64_t d) const { return ampgrad::unsqueeze(*this, d); }
Tensor Tensor::contiguous() const { return ampgrad::contiguous(*this); }
Tensor Tensor::clone() const { return ampgrad::clone(*this); }
Tensor Tensor::to(DType dt) const {
  detail::check_defined(*this, op::to, "input");
  return to_dtype(*this, dt);
}

namespace {
std::atomic<uint64_t> g_host_syncs{0};
thread_local std::function<void(const char*)> t_sync_observer;

// A copy of t on device d, counting nothing. The device that is not the CPU (the
// destination's, between devices) moves the bytes, on its current stream; only a copy to a
// device may be non-blocking.
Tensor copy_to_device(const Tensor& t, Device d, bool non_blocking) {
  Backend& dst_be = backend(d, op::to);
  Backend& src_be = backend(t.device(), op::to);
  Tensor src = detail::contiguous_raw(t);
  Tensor out = make_tensor(t.sizes(), t.dtype(), d, op::to);
  const Device mover_device = d.is_cpu() ? t.device() : d;
  Backend& mover = d.is_cpu() ? src_be : dst_be;
  const Stream stream = current_stream(mover_device);
  non_blocking = non_blocking && !d.is_cpu();
  mover.copy_bytes(out.raw_data(), d, src.raw_data(), t.device(), t.nbytes(), stream, non_blocking);
  // The copy may still be reading pinned memory: its block is held until the stream is done.
  if (non_blocking && src.is_pinned()) record_stream(src, stream);
  return out;
}
}  // namespace

uint64_t host_sync_count() { return g_host_syncs.load(std::memory_order_relaxed); }

void set_host_sync_observer(std::function<void(const char*)> observer) { t_sync_observer = std::move(observer); }

namespace {
std::atomic<bool> g_debug_sync{false};
}  // namespace
void set_debug_sync(bool on) { g_debug_sync.store(on, std::memory_order_relaxed); }
bool debug_sync() { return g_debug_sync.load(std::memory_order_relaxed); }

void detail::note_host_sync(const char* what) {
  g_host_syncs.fetch_add(1, std::memory_order_relaxed);
  if (t_sync_observer) t_sync_observer(what);
}

Tensor detail::host_values(const Tensor& t, const char* what) {
  note_host_sync(what);
  return t.device().is_cpu() ? t : copy_to_device(t, Device(kCPU), false);
}

Tensor Tensor::to(Device d, bool non_blocking) const {
  detail::check_defined(*this, op::to, "input");
  if (d == device()) return *this;
  if (d.is_cpu()) detail::note_host_sync("to(cpu)");
  Tensor out = copy_to_device(*this, d, non_blocking);
  if (any_requires_grad({this})) {
    const Device from = device();
    record(op::to, {*this}, {out}, [from](const TensorList& g, GradMask) -> TensorList { return {g[0].to(from)}; });
  }
  return out;
}

Tensor Tensor::pin_memory() const {
  AG_CHECK(device().is_cpu(), "pin_memory", "only CPU tensors can be pinned, got a tensor on ", device());
  if (is_pinned()) return *this;
  Tensor src = detail::contiguous_raw(*this);
  Tensor out(std::make_shared<TensorImpl>(allocate_pinned_storage(nbytes()), sizes(), contiguous_strides(sizes()),
                                          0, dtype()));
  cpu_backend().copy_bytes(out.raw_data(), kCPU, src.raw_data(), kCPU, nbytes(), current_stream(kCPU), false);
  if (any_requires_grad({this})) {
    record("pin_memory", {*this}, {out}, [](const TensorList& g, GradMask) -> TensorList { return {g[0]}; });
  }
  return out;
}

std::vector<Tensor> Tensor::split(int64_t s, int64_t d) const { return ampgrad::split(*this, s, d); }
std::vector<Tensor> Tensor::chunk(int64_t c, int64_t d) const { return ampgrad::chunk(*this, c, d); }
Tensor Tensor::index_select(int64_t d, const Tensor& i) const { return ampgrad::index_select(*this, d, i); }
Tensor Tensor::gather(int64_t d, const Tensor& i) const { return ampgrad::gather(*this, d, i); }
Tensor Tensor::masked_fill(const Tensor& m, Scalar v) const { return ampgrad::masked_fill(*this, m, v); }

Tensor Tensor::add(const Tensor& o) const { return ampgrad::add(*this, o); }
Tensor Tensor::sub(const Tensor& o) const { return ampgrad::sub(*this, o); }
Tensor Tensor::mul(const Tensor& o) const { return ampgrad::mul(*this, o); }
Tensor Tensor::div(const Tensor& o) const { return ampgrad::div(*this, o); }
Tensor Tensor::neg() const { return ampgrad::neg(*this); }
Tensor Tensor::abs() const { return ampgrad::abs(*this); }
Tensor Tensor::pow(Scalar e) const { return ampgrad::pow(*this, e); }
Tensor Tensor::sqrt() const { return ampgrad::sqrt(*this); }
Tensor Tensor::rsqrt() const { return ampgrad::rsqrt(*this); }
Tensor Tensor::exp() const { return ampgrad::exp(*this); }
Tensor Tensor::log() const { return ampgrad::log(*this); }
Tensor Tensor::log1p() const { return ampgrad::log1p(*this); }
Tensor Tensor::tanh() const { return ampgrad::tanh(*this); }
Tensor Tensor::sigmoid() const { return ampgrad::sigmoid(*this); }
Tensor Tensor::relu() const { return ampgrad::relu(*this); }
Tensor Tensor::matmul(const Tensor& o) const { return ampgrad::matmul(*this, o); }
Tensor Tensor::sum() const { return ampgrad::sum(*this); }
Tensor Tensor::sum(const std::vector<int64_t>& d, bool k) const { return ampgrad::sum(*this, d, k); }
Tensor Tensor::mean() const { return ampgrad::mean(*this); }
Tensor Tensor::mean(const std::vector<int64_t>& d, bool k) const { return ampgrad::mean(*this, d, k); }
Tensor Tensor::softmax(int64_t d) const { return ampgrad::softmax(*this, d); }
Tensor Tensor::log_softmax(int64_t d) const { return ampgrad::log_softmax(*this, d); }

// ---- in-place ------------------------------------------------------------------------------

namespace {

// self = op(self, other) for a tensor other (or, other_tensor null, the scalar
// other_scalar, passed to the kernel by value): writes straight into self when no graph is
// needed.
Tensor& binary_inplace(Tensor& self, const char* name, BinaryOp op, const Tensor* other_tensor,
                       Scalar other_scalar, const std::function<Tensor()>& compute) {
  if (other_tensor) {
    detail::check_defined(*other_tensor, name, "other");
    if (!detail::is_host_scalar(*other_tensor)) detail::check_same_device(self, *other_tensor, name);
  }
  const bool needs_grad = other_tensor ? any_requires_grad({&self, other_tensor}) : any_requires_grad({&self});
  detail::apply_inplace(self, name, needs_grad, compute, [&] {
    const Shape shape = other_tensor ? broadcast_shapes(self.sizes(), other_tensor->sizes(), name) : self.sizes();
    AG_CHECK(shape == self.sizes(), name, "the result's shape ", shape, " does not match the shape ",
             self.sizes(), " of the tensor modified in place");
    DType dt = other_tensor ? promote_types(self.dtype(), other_tensor->dtype())
                            : result_type(self.dtype(), other_scalar);
    if (op == BinaryOp::Div && !is_floating(dt)) dt = get_default_dtype();  // true division, as div
    AG_CHECK(is_floating(self.dtype()) || !is_floating(dt), name, "result dtype ", dtype_name(dt),
             " cannot be cast to the ", dtype_name(self.dtype()), " tensor modified in place");
    Tensor hold;
    const Operand other = other_tensor ? detail::operand_on(*other_tensor, self.device(), dt, shape, hold)
                                       : Operand::scalar(other_scalar.to_double());
    Backend& be = backend(self.device(), name);
    if (dt == self.dtype()) {
      be.binary(op, self, other, self);
    } else {
      Tensor r = make_tensor(shape, dt, self.device());
      be.binary(op, detail::cast_raw(self, dt), other, r);
      be.copy(r, self);
    }
  });
  return self;
}

}  // namespace

Tensor& Tensor::add_(const Tensor& o, Scalar alpha) {
  if (alpha.to_double() != 1.0) {
    Tensor scaled = ampgrad::mul(o, alpha);
    return binary_inplace(*this, op::add_, BinaryOp::Add, &scaled, {}, [&] { return ampgrad::add(*this, scaled); });
  }
  return binary_inplace(*this, op::add_, BinaryOp::Add, &o, {}, [&] { return ampgrad::add(*this, o); });
}
Tensor& Tensor::add_(Scalar s) {
  return binary_inplace(*this, op::add_, BinaryOp::Add, nullptr, s, [&] { return ampgrad::add(*this, s); });
}
Tensor& Tensor::sub_(const Tensor& o) {
  return binary_inplace(*this, op::sub_, BinaryOp::Sub, &o, {}, [&] { return ampgrad::sub(*this, o); });
}
Tensor& Tensor::sub_(Scalar s) {
  return binary_inplace(*this, op::sub_, BinaryOp::Sub, nullptr, s, [&] { return ampgrad::sub(*this, s); });
}
Tensor& Tensor::mul_(const Tensor& o) {
  // mul's backward reads this tensor for o's gradient, and the write changes it: a copy is
  // multiplied (PyTorch's in-place ops likewise save the original self).
  return binary_inplace(*this, op::mul_, BinaryOp::Mul, &o, {}, [&] {
    return ampgrad::mul(o.requires_grad() ? ampgrad::clone(*this) : *this, o);
  });
}
Tensor& Tensor::mul_(Scalar s) {
  return binary_inplace(*this, op::mul_, BinaryOp::Mul, nullptr, s, [&] { return ampgrad::mul(*this, s); });
}
Tensor& Tensor::div_(const Tensor& o) {
  return binary_inplace(*this, op::div_, BinaryOp::Div, &o, {}, [&] { return ampgrad::div(*this, o); });
}
Tensor& Tensor::div_(Scalar s) {
  return binary_inplace(*this, op::div_, BinaryOp::Div, nullptr, s, [&] { return ampgrad::div(*this, s); });
}

namespace {
Tensor& fill_as(Tensor& t, Scalar v, const char* op) {
  detail::apply_inplace(t, op, false, nullptr, [&] { backend(t.device(), op).fill(t, v.to_double()); });
  if (t.requires_grad() && !t.is_leaf()) t.unsafe_impl()->meta().grad_fn.reset();  // a constant now
  return t;
}
}  // namespace

Tensor& Tensor::zero_() { return fill_as(*this, 0, op::zero_); }
Tensor& Tensor::fill_(Scalar v) { return fill_as(*this, v, op::fill_); }

Tensor& Tensor::copy_(const Tensor& src) {
  detail::check_defined(src, op::copy_, "source");
  const bool needs_grad = any_requires_grad({this, &src});
  auto compute = [&] {
    Tensor r = ampgrad::to_dtype(ampgrad::expand(src.to(device()), sizes().vec()), dtype());
    return ampgrad::clone(r);
  };
  detail::apply_inplace(*this, op::copy_, needs_grad, compute, [&] {
    const Shape shape = broadcast_shapes(sizes(), src.sizes(), op::copy_);
    AG_CHECK(shape == sizes(), op::copy_, "source of shape ", src.sizes(), " does not broadcast to ",
             sizes());
    Tensor s = src.device() == device() ? src : src.detach().to(device());
    backend(device(), op::copy_).copy(detail::expand_raw(s, sizes()), *this);
  });
  return *this;
}

Tensor& Tensor::clamp_(std::optional<Scalar> min, std::optional<Scalar> max) {
  const bool needs_grad = any_requires_grad({this});
  // clamp's backward reads its input, which the write changes: a copy is clamped.
  detail::apply_inplace(*this, op::clamp_, needs_grad, [&] { return ampgrad::clamp(ampgrad::clone(*this), min, max); }, [&] {
    AG_CHECK(min || max, op::clamp_, "at least one of min and max must be given");
    backend(device(), op::clamp_).unary(UnaryOp::Clamp, *this, *this,
                                      {min ? min->to_double() : -INFINITY, max ? max->to_double() : INFINITY});
  });
  return *this;
}

Tensor& Tensor::masked_fill_(const Tensor& mask, Scalar value) {
  const bool needs_grad = any_requires_grad({this});
  detail::apply_inplace(*this, op::masked_fill_, needs_grad,
                        [&] { return ampgrad::masked_fill(*this, mask, value); }, [&] {
    detail::check_mask(mask, sizes(), op::masked_fill_);
    backend(device(), op::masked_fill_).where(detail::expand_raw(mask, sizes()), Operand::scalar(value.to_double()),
                                            *this, *this);
  });
  return *this;
}

Tensor& Tensor::uniform_(double from, double to) {
  AG_CHECK(is_floating_point(), "uniform_", "expected a floating tensor, got ", dtype_name(dtype()));
  AG_CHECK(std::isfinite(from) && std::isfinite(to) && from <= to, "uniform_",
           "expects a finite range from <= to, got from ", from, ", to ", to);
  detail::apply_inplace(*this, "uniform_", false, nullptr, [&] {
    auto [seed, offset] = generator_advance(uint64_t(numel()));
    backend(device(), "uniform_").uniform(*this, from, to, seed, offset);
  });
  return *this;
}

Tensor& Tensor::normal_(double mean, double std) {
  AG_CHECK(is_floating_point(), "normal_", "expected a floating tensor, got ", dtype_name(dtype()));
  AG_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0, "normal_",
           "expects a finite mean and a finite std >= 0, got mean ", mean, ", std ", std);
  detail::apply_inplace(*this, "normal_", false, nullptr, [&] {
    auto [seed, offset] = generator_advance(uint64_t(numel()));
    backend(device(), "normal_").normal(*this, mean, std, seed, offset);
  });
  return *this;
}

}  // namespace ampgrad
