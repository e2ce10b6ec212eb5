// Factories and the global generator state.
#include "ampgrad/factories.h"

#include <cmath>
#include <cstring>
#include <mutex>

#include "ampgrad/autograd.h"
#include "ampgrad/backend.h"
#include "ampgrad/ops/elementwise.h"
#include "internal.h"

namespace ampgrad {

namespace {

Tensor finish(Tensor t, const TensorOptions& opts) {
  if (opts.requires_grad()) t.requires_grad_(true);
  return t;
}

Tensor filled(const std::vector<int64_t>& shape, double v, const TensorOptions& opts, const char* op) {
  Tensor t = make_tensor(Shape(shape), opts.dtype(), opts.device(), op);
  backend(opts.device(), op).fill(t, v);
  return t;
}

struct GeneratorState {
  std::mutex mu;
  uint64_t seed = 67280421310721ull;
  uint64_t offset = 0;
};
GeneratorState& generator() {
  static GeneratorState g;
  return g;
}

}  // namespace

Tensor empty(const std::vector<int64_t>& shape, TensorOptions opts) {
  return finish(make_tensor(Shape(shape), opts.dtype(), opts.device(), "empty"), opts);
}
Tensor zeros(const std::vector<int64_t>& shape, TensorOptions opts) { return finish(filled(shape, 0, opts, "zeros"), opts); }
Tensor ones(const std::vector<int64_t>& shape, TensorOptions opts) { return finish(filled(shape, 1, opts, "ones"), opts); }
Tensor full(const std::vector<int64_t>& shape, Scalar value, TensorOptions opts) {
  if (!opts.has_dtype())
    opts = opts.dtype(value.kind == Scalar::Kind::Floating ? get_default_dtype()
                      : value.kind == Scalar::Kind::Bool   ? kBool
                                                           : kInt64);
  return finish(filled(shape, value.to_double(), opts, "full"), opts);
}
Tensor empty_like(const Tensor& t) { return make_tensor(t.sizes(), t.dtype(), t.device()); }
Tensor zeros_like(const Tensor& t) { return zeros(t.sizes().vec(), t.options()); }
Tensor ones_like(const Tensor& t) { return ones(t.sizes().vec(), t.options()); }
Tensor full_like(const Tensor& t, Scalar value) { return full(t.sizes().vec(), value, t.options()); }

Tensor scalar_tensor(Scalar v, TensorOptions opts) {
  if (!opts.has_dtype()) return full({}, v, opts);
  return finish(filled({}, v.to_double(), opts, "full"), opts);
}

Tensor arange(Scalar end, TensorOptions opts) { return arange(0, end, 1, opts); }

Tensor arange(Scalar start, Scalar end, Scalar step, TensorOptions opts) {
  const double s = start.to_double(), e = end.to_double(), st = step.to_double();
  AG_CHECK(st != 0, "arange", "step must be nonzero");
  AG_CHECK(std::isfinite(s) && std::isfinite(e), "arange", "bounds must be finite, got ", s, " and ", e);
  AG_CHECK(std::isfinite(st), "arange", "step must be finite, got ", st);
  AG_CHECK((st > 0 && e >= s) || (st < 0 && e <= s), "arange", "upper bound ", e,
           " and lower bound ", s, " are inconsistent with step sign ", st);
  if (!opts.has_dtype()) {
    const bool fl = start.is_floating() || end.is_floating() || step.is_floating();
    opts = opts.dtype(fl ? get_default_dtype() : kInt64);
  }
  // The count is checked as a double before it becomes an integer: a tiny step or a huge
  // range makes it non-finite or past int64 (2^63 is exact in double).
  const double count = std::ceil((e - s) / st);
  AG_CHECK(std::isfinite(count) && count < 9223372036854775808.0, "arange", "the range [", s, ", ", e,
           ") with step ", st, " has ", count, " elements, more than int64 can hold");
  const int64_t n = int64_t(count);
  Tensor t = make_tensor(Shape{n}, kFloat64, kCPU, "arange");
  double* p = t.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) p[i] = s + double(i) * st;
  return finish(detail::cast_raw(t, opts.dtype()).to(opts.device()), opts);
}

Tensor linspace(double start, double end, int64_t steps, TensorOptions opts) {
  AG_CHECK(steps >= 0, "linspace", "number of steps must be non-negative, got ", steps);
  Tensor t = make_tensor(Shape{steps}, kFloat64, kCPU, "linspace");
  double* p = t.data_ptr<double>();
  const double step = steps > 1 ? (end - start) / double(steps - 1) : 0;
  // Fill symmetrically from both ends, as PyTorch does, so that the last value is `end`.
  for (int64_t i = 0; i < steps; ++i)
    p[i] = i < steps / 2 ? start + step * double(i) : end - step * double(steps - 1 - i);
  return finish(detail::cast_raw(t, opts.dtype()).to(opts.device()), opts);
}

Tensor eye(int64_t n, TensorOptions opts) { return eye(n, n, opts); }
Tensor eye(int64_t n, int64_t m, TensorOptions opts) {
  AG_CHECK(n >= 0 && m >= 0, "eye", "sizes must be non-negative, got ", n, " and ", m);
  const int64_t nm = checked_mul(n, m, "eye", "the element count n * m");
  Tensor t = make_tensor(Shape{n, m}, kFloat64, kCPU, "eye");
  double* p = t.data_ptr<double>();
  for (int64_t i = 0; i < nm; ++i) p[i] = (i / m == i % m) ? 1.0 : 0.0;
  return finish(detail::cast_raw(t, opts.dtype()).to(opts.device()), opts);
}

namespace detail {
Tensor from_vector_impl(const void* data, DType src_dtype, int64_t count,
                        const std::vector<int64_t>& shape, TensorOptions opts, const char* op) {
  const Shape sz(shape);
  const int64_t numel = checked_numel(sz, op);
  AG_CHECK(numel == count, op, "shape ", sz, " holds ", numel, " elements but ", count, " values were given");
  // Wrap the caller's values (no copy), then convert/copy into a fresh tensor.
  Tensor src(std::make_shared<TensorImpl>(std::make_shared<Storage>(), sz, contiguous_strides(sz), 0, src_dtype));
  src.unsafe_impl()->storage->data = const_cast<void*>(data);
  src.unsafe_impl()->storage->nbytes = checked_nbytes(count, itemsize(src_dtype), op);
  Tensor cpu = make_tensor(sz, opts.dtype(), kCPU, op);
  cpu_backend().copy(src, cpu);
  return finish(cpu.to(opts.device()), opts);
}
}  // namespace detail

Tensor from_blob(void* data, const std::vector<int64_t>& shape, TensorOptions opts,
                 std::function<void(void*)> deleter) {
  checked_numel(Shape(shape), "from_blob");  // before the strides are computed from it
  return from_blob(data, shape, contiguous_strides(Shape(shape)).vec(), opts, std::move(deleter));
}

Tensor from_blob(void* data, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                 TensorOptions opts, std::function<void(void*)> deleter) {
  AG_CHECK(data != nullptr || checked_numel(Shape(shape), "from_blob") == 0, "from_blob", "data is a null pointer");
  AG_CHECK(shape.size() == strides.size(), "from_blob", "shape ", shape, " and strides ", strides,
           " differ in length");
  AG_CHECK(opts.device().is_cpu(), "from_blob", "only CPU memory can be wrapped, got device ",
           opts.device());
  int64_t extent = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    AG_CHECK(shape[i] >= 0 && strides[i] >= 0, "from_blob", "negative size or stride in shape ",
             shape, " strides ", strides);
    if (shape[i] == 0) extent = 0;
    else if (extent)
      extent = checked_add(extent, checked_mul(shape[i] - 1, strides[i], "from_blob", "the memory extent"),
                           "from_blob", "the memory extent");
  }
  checked_numel(Shape(shape), "from_blob");
  auto storage = std::make_shared<Storage>();
  storage->data = data;
  storage->nbytes = checked_nbytes(extent, itemsize(opts.dtype()), "from_blob");
  storage->device = opts.device();
  storage->deleter = std::move(deleter);
  return finish(Tensor(std::make_shared<TensorImpl>(std::move(storage), Shape(shape), Shape(strides), 0,
                                                    opts.dtype())),
                opts);
}

// ---- random ------------------------------------------------------------------------------------

void manual_seed(uint64_t seed) {
  auto& g = generator();
  std::lock_guard<std::mutex> lock(g.mu);
  g.seed = seed;
  g.offset = 0;
}

std::pair<uint64_t, uint64_t> generator_state() {
  auto& g = generator();
  std::lock_guard<std::mutex> lock(g.mu);
  return {g.seed, g.offset};
}

void set_generator_state(uint64_t seed, uint64_t offset) {
  auto& g = generator();
  std::lock_guard<std::mutex> lock(g.mu);
  g.seed = seed;
  g.offset = offset;
}

std::pair<uint64_t, uint64_t> generator_advance(uint64_t n) {
  auto& g = generator();
  std::lock_guard<std::mutex> lock(g.mu);
  const uint64_t off = g.offset;
  g.offset += n;
  return {g.seed, off};
}

namespace {
void check_random_dtype(const TensorOptions& opts, const char* op) {
  AG_CHECK(is_floating(opts.dtype()), op, "expects a floating dtype, got ", dtype_name(opts.dtype()));
}
}  // namespace

Tensor rand(const std::vector<int64_t>& shape, TensorOptions opts) {
  check_random_dtype(opts, "rand");
  Tensor t = make_tensor(Shape(shape), opts.dtype(), opts.device(), "rand");
  {
    NoGradGuard ng;
    t.uniform_(0.0, 1.0);
  }
  return finish(t, opts);
}

Tensor randn(const std::vector<int64_t>& shape, TensorOptions opts) {
  check_random_dtype(opts, "randn");
  Tensor t = make_tensor(Shape(shape), opts.dtype(), opts.device(), "randn");
  {
    NoGradGuard ng;
    t.normal_(0.0, 1.0);
  }
  return finish(t, opts);
}

Tensor randint(int64_t low, int64_t high, const std::vector<int64_t>& shape, TensorOptions opts) {
  AG_CHECK(low < high, "randint", "low ", low, " must be below high ", high);
  if (!opts.has_dtype()) opts = opts.dtype(kInt64);
  Tensor u = make_tensor(Shape(shape), kFloat64, opts.device(), "randint");
  {
    NoGradGuard ng;
    u.uniform_(double(low), double(high));
  }
  Tensor f = detail::unary_raw(UnaryOp::Clamp, u, {double(low), double(high) - 1});
  // floor via conversion: values are within [low, high), truncation toward zero differs
  // from floor only for negatives, so shift to non-negative first.
  Tensor shifted = detail::binary_raw(BinaryOp::Sub, f, Operand::scalar(double(low)));
  Tensor ints = detail::cast_raw(shifted, kInt64);
  Tensor out = detail::binary_raw(BinaryOp::Add, ints, Operand::integer(low));
  return detail::cast_raw(out, opts.dtype());
}

namespace {
// 1 where a uniform draw of u's shape falls below p (a tensor or a scalar), in u's dtype.
Tensor draw_below(Tensor u, const Operand& p) {
  {
    NoGradGuard ng;
    u.uniform_(0.0, 1.0);
  }
  Tensor hit = make_tensor(u.sizes(), kBool, u.device());
  backend(u.device(), op::bernoulli).compare(CompareOp::Lt, u, p, hit);
  return detail::cast_raw(hit, u.dtype());
}
}  // namespace

Tensor bernoulli(const Tensor& p) {
  AG_CHECK(p.is_floating_point(), op::bernoulli, "probabilities must be floating, got ", dtype_name(p.dtype()));
  return draw_below(make_tensor(p.sizes(), p.dtype(), p.device()), p);
}

Tensor bernoulli(const std::vector<int64_t>& shape, double p, TensorOptions opts) {
  AG_CHECK(p >= 0 && p <= 1, op::bernoulli, "p must be in [0, 1], got ", p);
  AG_CHECK(is_floating(opts.dtype()), op::bernoulli, "probabilities must be floating, got ", dtype_name(opts.dtype()));
  return draw_below(make_tensor(Shape(shape), opts.dtype(), opts.device(), op::bernoulli), Operand::scalar(p));
}

Tensor rand_like(const Tensor& t) { return rand(t.sizes().vec(), t.options()); }
Tensor randn_like(const Tensor& t) { return randn(t.sizes().vec(), t.options()); }

}  // namespace ampgrad
