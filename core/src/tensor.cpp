// Tensor metadata and printing (storage allocation is in memory.cpp).
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "ampgrad/autograd.h"
#include "ampgrad/backend.h"
#include "ampgrad/ops/shape.h"

namespace ampgrad {

TensorImpl::~TensorImpl() = default;

AutogradMeta& TensorImpl::meta() {
  if (!autograd) autograd = std::make_unique<AutogradMeta>();
  return *autograd;
}

Shape contiguous_strides(const Shape& sizes) {
  Shape st(sizes.size());
  int64_t acc = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    st[i] = acc;
    acc = checked_mul(acc, std::max<int64_t>(sizes[i], 1), "contiguous_strides", "a stride");
  }
  return st;
}

Tensor make_tensor(const Shape& sizes, DType dtype, Device device, const char* op) {
  // Both checks come before the allocation: a shape whose sizes wrap never reaches it.
  const size_t nbytes = checked_nbytes(checked_numel(sizes, op), itemsize(dtype), op);
  std::shared_ptr<Storage> storage;
  try {
    storage = allocate_storage(nbytes, device);
  } catch (const Error& e) {  // "out of memory" under the op that asked, with what it asked for
    AG_ERROR(op, "cannot allocate a tensor of shape ", sizes, " (", dtype_name(dtype), "): ", e.message());
  }
  return Tensor(std::make_shared<TensorImpl>(std::move(storage), sizes, contiguous_strides(sizes),
                                             0, dtype));
}

int64_t Tensor::size(int64_t d) const { return sizes()[size_t(wrap_dim(d, dim(), "size"))]; }
int64_t Tensor::stride(int64_t d) const { return strides()[size_t(wrap_dim(d, dim(), "stride"))]; }

bool Tensor::is_contiguous() const {
  const auto& sz = sizes();
  const auto& st = strides();
  int64_t expected = 1;
  for (size_t i = sz.size(); i-- > 0;) {
    if (sz[i] == 1) continue;
    if (st[i] != expected) return false;
    expected *= sz[i];
  }
  return true;
}

bool Tensor::is_non_overlapping_and_dense() const {
  if (is_contiguous() || numel() == 0) return true;
  // Ordered by stride, each dim of size > 1 must step over exactly the block the dims
  // inside it fill.
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t d = 0; d < dim(); ++d)
    if (size(d) > 1) dims.push_back({stride(d), size(d)});
  std::sort(dims.begin(), dims.end());
  int64_t block = 1;
  for (const auto& [st, n] : dims) {
    if (st != block) return false;
    block *= n;
  }
  return true;
}

void detail::bump_version(const Tensor& t) { ++t.unsafe_impl()->storage->version; }

double Tensor::item_double() const {
  AG_CHECK(numel() == 1, "item", "a tensor with ", numel(), " elements (shape ", sizes(),
           ") cannot be converted to a scalar");
  Tensor c = detail::host_values(*this, "item");
  return dispatch_all(c.dtype(), "item", [&]<class T>() -> double {
    const T v = *static_cast<const T*>(c.raw_data());
    if constexpr (is_float16_v<T>) return double(float(v));
    else return static_cast<double>(v);
  });
}

// ---- printing -----------------------------------------------------------------------------

namespace {

constexpr int64_t kSummarizeAbove = 1000;
constexpr int64_t kEdgeItems = 3;

struct Printer {
  std::ostream& os;
  const Tensor& t;  // contiguous, CPU, float64 or int64 or bool
  bool floating, integral_valued, summarize;
  int width;
  int precision = 4;
  bool sci = false;

  std::string fmt(double v) const {
    std::ostringstream s;
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    if (t.dtype() == kBool) return v != 0 ? "True" : "False";
    if (!floating) {
      s << int64_t(v);
    } else if (sci) {
      s << std::scientific << std::setprecision(precision) << v;
    } else if (integral_valued) {
      s << std::fixed << std::setprecision(0) << v << '.';
    } else {
      s << std::fixed << std::setprecision(precision) << v;
    }
    return s.str();
  }

  void rec(const double* data, int64_t dim, int indent) {
    const auto& sz = t.sizes();
    const auto& st = t.strides();
    if (dim == t.dim()) {
      os << std::setw(width) << fmt(*data);
      return;
    }
    os << '[';
    const int64_t n = sz[size_t(dim)];
    for (int64_t i = 0; i < n; ++i) {
      if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) {
        os << "...";
        i = n - kEdgeItems - 1;
        os << (dim + 1 == t.dim() ? ", " : ",\n" + std::string(size_t(indent + 1), ' '));
        continue;
      }
      rec(data + i * st[size_t(dim)], dim + 1, indent + 1);
      if (i + 1 < n) {
        if (dim + 1 == t.dim()) os << ", ";
        else os << ',' << std::string(size_t(t.dim() - dim - 1), '\n') << std::string(size_t(indent + 1), ' ');
      }
    }
    os << ']';
  }
};

}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  Tensor c;
  {
    NoGradGuard ng;
    c = detail::host_values(t.detach(), "print").to(kFloat64).contiguous();
  }
  const double* d = static_cast<const double*>(c.raw_data());
  const int64_t n = c.numel();
  bool integral_valued = true;
  double maxabs = 0, minabs = INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(d[i])) continue;
    if (d[i] != std::floor(d[i])) integral_valued = false;
    maxabs = std::max(maxabs, std::fabs(d[i]));
    if (d[i] != 0) minabs = std::min(minabs, std::fabs(d[i]));
  }
  Printer p{os, c, t.is_floating_point(), integral_valued, n > kSummarizeAbove, 0};
  p.sci = p.floating && n > 0 && (maxabs >= 1e8 || (minabs < 1e-4 && minabs != INFINITY && !integral_valued));
  size_t w = 0;
  for (int64_t i = 0; i < n; ++i) w = std::max(w, p.fmt(d[i]).size());
  p.width = int(w);
  os << "tensor(";
  if (t.dim() == 0) os << p.fmt(d[0]);
  else p.rec(d, 0, 7);
  os << ", shape=" << t.sizes() << ", dtype=" << dtype_name(t.dtype());
  os << ", device=" << t.device();
  if (t.grad_fn()) os << ", grad_fn=<" << t.grad_fn()->name() << '>';
  else if (t.requires_grad()) os << ", requires_grad=True";
  return os << ')';
}

std::string Tensor::str() const {
  std::ostringstream os;
  os << *this;
  return os.str();
}

}  // namespace ampgrad
