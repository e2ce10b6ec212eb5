// Views, copies and joins. Views share storage (and so the version counter); each records
// a backward that maps the gradient back to the input's geometry.
#include "ampgrad/ops/shape.h"

#include <algorithm>
#include <numeric>

#include "ampgrad/dispatch.h"
#include "ampgrad/factories.h"
#include "ampgrad/ops/elementwise.h"
#include "ampgrad/ops/reduce.h"
#include "internal.h"

namespace ampgrad {

int64_t wrap_dim(int64_t dim, int64_t rank, const char* op) {
  const int64_t r = std::max<int64_t>(rank, 1);
  AG_CHECK(dim >= -r && dim < r, op, "dim ", dim, " is out of range for a tensor of ", rank,
           " dims (expected [", -r, ", ", r - 1, "])");
  return dim < 0 ? dim + r : dim;
}

namespace detail {

Tensor make_view(const Tensor& base, Shape sizes, Shape strides, int64_t offset) {
  const TensorImpl* b = base.unsafe_impl();
  return Tensor(std::make_shared<TensorImpl>(b->storage, std::move(sizes), std::move(strides),
                                             offset, b->dtype));
}

Tensor expand_raw(const Tensor& base, const Shape& shape) {
  if (base.sizes() == shape) return base;
  const size_t n = shape.size(), lead = n - base.sizes().size();
  Shape strides(n, 0);
  for (size_t i = 0; i < base.sizes().size(); ++i)
    strides[lead + i] = base.sizes()[i] == 1 && shape[lead + i] != 1 ? 0 : base.strides()[i];
  return make_view(base, shape, std::move(strides), base.storage_offset());
}

Tensor cast_raw(const Tensor& base, DType dtype) {
  if (base.dtype() == dtype) return base;
  Tensor out = make_tensor(base.sizes(), dtype, base.device(), op::to);
  backend(base.device(), op::to).copy(base, out);
  return out;
}

Tensor contiguous_raw(const Tensor& base) {
  if (base.is_contiguous()) return base;
  Tensor out = make_tensor(base.sizes(), base.dtype(), base.device(), op::contiguous);
  backend(base.device(), op::contiguous).copy(base, out);
  return out;
}

Tensor one_batch(const Tensor& m) {
  return make_view(m, {1, m.size(0), m.size(1)}, {0, m.stride(0), m.stride(1)}, m.storage_offset());
}

namespace {

// The dims of a geometry from the largest stride to the smallest (ties: the earlier dim
// first, as in a contiguous layout).
std::vector<size_t> by_stride(const Shape& strides) {
  std::vector<size_t> order(strides.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return strides[a] > strides[b]; });
  return order;
}

}  // namespace

bool non_overlapping(const Shape& sizes, const Shape& strides) {
  int64_t span = 1;  // elements reached by the dims inside the current one, plus one
  const std::vector<size_t> order = by_stride(strides);
  for (size_t k = order.size(); k-- > 0;) {
    const int64_t n = sizes[order[k]], st = strides[order[k]];
    if (n == 0) return true;
    if (n == 1) continue;
    if (st < span) return false;
    span = st * (n - 1) + span;
  }
  return true;
}

Tensor empty_in_order(const Shape& sizes, const Shape& strides, DType dtype, Device device, const char* op) {
  const std::vector<size_t> order = by_stride(strides);
  Shape mem = sizes;
  for (size_t k = 0; k < order.size(); ++k) mem[k] = sizes[order[k]];
  const Tensor base = make_tensor(mem, dtype, device, op);
  Shape st = sizes;
  for (size_t k = 0; k < order.size(); ++k) st[order[k]] = base.strides()[k];
  return make_view(base, sizes, std::move(st), 0);
}

}  // namespace detail

using detail::make_view;

namespace {

// A view op: records a backward that maps the gradient back through `bw`.
template <class Bw>
Tensor view_op(const char* name, const Tensor& x, Tensor out, Bw bw) {
  if (any_requires_grad({&x}))
    record(name, {x}, {out}, [bw](const TensorList& g, GradMask) -> TensorList { return {bw(g[0])}; });
  return out;
}

Shape infer_shape(const std::vector<int64_t>& shape, int64_t numel, const char* op) {
  Shape out(shape);
  int64_t known = 1, infer = -1;  // known: the product of the given nonzero sizes
  bool has_zero = false;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      AG_CHECK(infer < 0, op, "only one dimension can be inferred in shape ", shape);
      infer = int64_t(i);
    } else {
      AG_CHECK(out[i] >= 0, op, "invalid dimension ", out[i], " in shape ", shape);
      if (out[i] == 0) has_zero = true;
      else if (__builtin_mul_overflow(known, out[i], &known)) [[unlikely]]
        AG_ERROR(op, "the shape ", shape,
                 std::count(shape.begin(), shape.end(), 0) != 0
                     ? " is too large: the product of its nonzero sizes overflows int64"
                     : " has more elements than int64 can hold");
    }
  }
  if (infer >= 0) {
    AG_CHECK(!has_zero && numel % known == 0, op, "shape ", shape, " is invalid for input of size ", numel);
    out[size_t(infer)] = numel / known;
  }
  AG_CHECK(checked_numel(out, op) == numel, op, "shape ", shape, " is invalid for input of size ", numel);
  return out;
}

// Strides for viewing (sizes, strides) as new_sizes without copying, if possible
// (the algorithm of PyTorch's computeStride): each run of merged old dims must be
// contiguous within itself.
bool view_strides(const Shape& sizes, const Shape& strides, const Shape& new_sizes, Shape& out) {
  out = Shape(new_sizes.size());
  if (sizes.numel() == 0 || sizes.empty()) {
    out = contiguous_strides(new_sizes);
    return true;
  }
  int64_t view_d = int64_t(new_sizes.size()) - 1;
  int64_t chunk_base_stride = strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = int64_t(sizes.size()) - 1; d >= 0; --d) {
    tensor_numel *= sizes[size_t(d)];
    if (d == 0 || (sizes[size_t(d - 1)] != 1 && strides[size_t(d - 1)] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_sizes[size_t(view_d)] == 1)) {
        out[size_t(view_d)] = view_numel * chunk_base_stride;
        view_numel *= new_sizes[size_t(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = strides[size_t(d - 1)];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

}  // namespace

Tensor view(const Tensor& x, const std::vector<int64_t>& shape) {
  detail::check_defined(x, op::view, "input");
  Shape sizes = infer_shape(shape, x.numel(), op::view);
  Shape strides;
  AG_CHECK(view_strides(x.sizes(), x.strides(), sizes, strides), op::view, "a tensor of shape ",
           x.sizes(), " and strides ", x.strides(), " cannot be viewed as shape ", sizes,
           " without a copy; use reshape");
  const Shape in = x.sizes();
  return view_op(op::view, x, make_view(x, sizes, strides, x.storage_offset()),
                 [in](const Tensor& g) { return reshape(g, in.vec()); });
}

Tensor reshape(const Tensor& x, const std::vector<int64_t>& shape) {
  detail::check_defined(x, op::reshape, "input");
  Shape sizes = infer_shape(shape, x.numel(), op::reshape);
  Shape strides;
  if (view_strides(x.sizes(), x.strides(), sizes, strides)) return view(x, sizes.vec());
  return view(contiguous(x), sizes.vec());
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  detail::check_defined(x, op::flatten, "input");
  if (x.dim() == 0) return reshape(x, {1});
  const int64_t s = wrap_dim(start_dim, x.dim(), op::flatten), e = wrap_dim(end_dim, x.dim(), op::flatten);
  AG_CHECK(s <= e, op::flatten, "start_dim ", start_dim, " comes after end_dim ", end_dim);
  std::vector<int64_t> shape;
  for (int64_t i = 0; i < s; ++i) shape.push_back(x.sizes()[size_t(i)]);
  int64_t m = 1;
  for (int64_t i = s; i <= e; ++i) m = checked_mul(m, x.sizes()[size_t(i)], op::flatten, "the flattened size");
  shape.push_back(m);
  for (int64_t i = e + 1; i < x.dim(); ++i) shape.push_back(x.sizes()[size_t(i)]);
  return reshape(x, shape);
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  detail::check_defined(x, op::transpose, "input");
  if (x.dim() == 0) return x;
  d0 = wrap_dim(d0, x.dim(), op::transpose);
  d1 = wrap_dim(d1, x.dim(), op::transpose);
  Shape sizes = x.sizes(), strides = x.strides();
  std::swap(sizes[size_t(d0)], sizes[size_t(d1)]);
  std::swap(strides[size_t(d0)], strides[size_t(d1)]);
  return view_op(op::transpose, x, make_view(x, sizes, strides, x.storage_offset()),
                 [d0, d1](const Tensor& g) { return transpose(g, d0, d1); });
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  detail::check_defined(x, op::permute, "input");
  AG_CHECK(int64_t(dims.size()) == x.dim(), op::permute, "got ", dims.size(), " dims ", dims,
           " for a tensor of ", x.dim(), " dims");
  Shape sizes(dims.size()), strides(dims.size());
  std::vector<int64_t> inverse(dims.size(), -1);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], x.dim(), op::permute);
    AG_CHECK(inverse[size_t(d)] < 0, op::permute, "dim ", dims[i], " repeats in ", dims);
    inverse[size_t(d)] = int64_t(i);
    sizes[i] = x.sizes()[size_t(d)];
    strides[i] = x.strides()[size_t(d)];
  }
  return view_op(op::permute, x, make_view(x, sizes, strides, x.storage_offset()),
                 [inverse](const Tensor& g) { return permute(g, inverse); });
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  detail::check_defined(x, op::narrow, "input");
  AG_CHECK(x.dim() > 0, op::narrow, "cannot narrow a 0-dim tensor");
  dim = wrap_dim(dim, x.dim(), op::narrow);
  const int64_t n = x.sizes()[size_t(dim)];
  if (start < 0) start += n;
  // length <= n - start rather than start + length <= n, which can overflow.
  AG_CHECK(start >= 0 && start <= n && length >= 0 && length <= n - start, op::narrow, "start ", start,
           " and length ", length, " are out of range for dim ", dim, " of size ", n);
  Shape sizes = x.sizes();
  sizes[size_t(dim)] = length;
  const int64_t off = x.storage_offset() + start * x.strides()[size_t(dim)];
  const Shape in = x.sizes();
  return view_op(op::narrow, x, make_view(x, sizes, x.strides(), off), [in, dim, start, length](const Tensor& g) {
    Tensor out = zeros(in.vec(), g.options());
    narrow(out, dim, start, length).copy_(g);
    return out;
  });
}

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  detail::check_defined(x, op::select, "input");
  AG_CHECK(x.dim() > 0, op::select, "cannot select from a 0-dim tensor");
  dim = wrap_dim(dim, x.dim(), op::select);
  const int64_t n = x.sizes()[size_t(dim)];
  AG_CHECK(index >= -n && index < n, op::select, "index ", index, " is out of range for dim ", dim,
           " of size ", n);
  if (index < 0) index += n;
  Shape sizes = x.sizes(), strides = x.strides();
  const int64_t off = x.storage_offset() + index * strides[size_t(dim)];
  sizes.erase(size_t(dim));
  strides.erase(size_t(dim));
  const Shape in = x.sizes();
  return view_op(op::select, x, make_view(x, sizes, strides, off), [in, dim, index](const Tensor& g) {
    Tensor out = zeros(in.vec(), g.options());
    select(out, dim, index).copy_(g);
    return out;
  });
}

Tensor expand(const Tensor& x, const std::vector<int64_t>& shape) {
  detail::check_defined(x, op::expand, "input");
  AG_CHECK(shape.size() >= size_t(x.dim()), op::expand, "cannot expand shape ", x.sizes(), " to ",
           shape, " (fewer dims)");
  Shape target(shape);
  const size_t lead = shape.size() - size_t(x.dim());
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t cur = i < lead ? 1 : x.sizes()[i - lead];
    if (target[i] == -1) {
      AG_CHECK(i >= lead, op::expand, "-1 is not allowed for a new leading dim in ", shape);
      target[i] = cur;
    }
    AG_CHECK(target[i] >= 0, op::expand, "invalid size ", target[i], " in dim ", i, " of ", shape);
    AG_CHECK(cur == target[i] || cur == 1, op::expand, "cannot expand shape ", x.sizes(), " to ", shape,
             " (dim ", i, ": ", cur, " vs ", target[i], ")");
  }
  checked_numel(target, op::expand);  // a view of no storage of its own, but its numel must fit
  const Shape in = x.sizes();
  // A new view also for x's own shape (expand_raw gives x itself): the node is recorded on
  // the output, which must not be x (a leaf would become its own ExpandBackward's output).
  Tensor out = target == in ? make_view(x, in, x.strides(), x.storage_offset()) : detail::expand_raw(x, target);
  return view_op(op::expand, x, std::move(out), [in](const Tensor& g) { return sum_to(g, in); });
}

Tensor squeeze(const Tensor& x) {
  detail::check_defined(x, op::squeeze, "input");
  std::vector<int64_t> shape;
  for (int64_t s : x.sizes())
    if (s != 1) shape.push_back(s);
  return reshape(x, shape);
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  detail::check_defined(x, op::squeeze, "input");
  if (x.dim() == 0) return x;
  dim = wrap_dim(dim, x.dim(), op::squeeze);
  if (x.sizes()[size_t(dim)] != 1) return x;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.erase(shape.begin() + dim);
  return reshape(x, shape);
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  detail::check_defined(x, op::unsqueeze, "input");
  dim = wrap_dim(dim, x.dim() + 1, op::unsqueeze);
  Shape sizes = x.sizes(), strides = x.strides();
  const int64_t st =
      size_t(dim) < sizes.size() ? checked_mul(sizes[size_t(dim)], strides[size_t(dim)], op::unsqueeze, "the new stride") : 1;
  sizes.insert(size_t(dim), 1);
  strides.insert(size_t(dim), st);
  return view_op(op::unsqueeze, x, make_view(x, sizes, strides, x.storage_offset()),
                 [dim](const Tensor& g) { return squeeze(g, dim); });
}

Tensor contiguous(const Tensor& x) {
  detail::check_defined(x, op::contiguous, "input");
  if (x.is_contiguous()) return x;
  return clone(x);
}

Tensor clone(const Tensor& x) {
  detail::check_defined(x, op::clone, "input");
  Tensor out = make_tensor(x.sizes(), x.dtype(), x.device(), op::clone);
  backend(x.device(), op::clone).copy(x, out);
  return view_op(op::clone, x, out, [](const Tensor& g) { return g; });
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  if (auto in = dispatch::autocast(op::cat, tensors)) return cat(*in, dim);
  AG_CHECK(!tensors.empty(), op::cat, "expected a non-empty list of tensors");
  const Tensor& first = tensors[0];
  for (const Tensor& t : tensors) detail::check_defined(t, op::cat, "an input");
  AG_CHECK(first.dim() > 0, op::cat, "zero-dimensional tensors cannot be concatenated");
  dim = wrap_dim(dim, first.dim(), op::cat);
  DType dt = first.dtype();
  Shape out_shape = first.sizes();
  out_shape[size_t(dim)] = 0;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const Tensor& t = tensors[k];
    detail::check_same_device(first, t, op::cat);
    AG_CHECK(t.dim() == first.dim(), op::cat, "tensor ", k, " has ", t.dim(), " dims, tensor 0 has ",
             first.dim());
    for (int64_t d = 0; d < t.dim(); ++d)
      AG_CHECK(d == dim || t.sizes()[size_t(d)] == first.sizes()[size_t(d)], op::cat, "sizes of tensors must match except in dim ",
               dim, ": tensor 0 has shape ", first.sizes(), ", tensor ", k, " has shape ", t.sizes());
    out_shape[size_t(dim)] = checked_add(out_shape[size_t(dim)], t.sizes()[size_t(dim)], op::cat, "the joined size");
    dt = promote_types(dt, t.dtype());
  }
  Tensor out = make_tensor(out_shape, dt, first.device(), op::cat);
  std::vector<int64_t> lengths;
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    const int64_t len = t.sizes()[size_t(dim)];
    Shape sz = out.sizes();
    sz[size_t(dim)] = len;
    Tensor slice = make_view(out, sz, out.strides(), offset * out.strides()[size_t(dim)]);
    backend(out.device(), op::cat).copy(t, slice);
    offset += len;
    lengths.push_back(len);
  }
  if (any_requires_grad(tensors))
    record(op::cat, tensors, {out}, [lengths, dim](const TensorList& g, GradMask need) {
      TensorList grads;
      int64_t off = 0;
      for (size_t i = 0; i < lengths.size(); ++i) {
        grads.push_back(need[i] ? narrow(g[0], dim, off, lengths[i]) : Tensor());
        off += lengths[i];
      }
      return grads;
    });
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  if (auto in = dispatch::autocast(op::stack, tensors)) return stack(*in, dim);
  AG_CHECK(!tensors.empty(), op::stack, "expected a non-empty list of tensors");
  dim = wrap_dim(dim, tensors[0].dim() + 1, op::stack);
  std::vector<Tensor> parts;
  for (size_t k = 0; k < tensors.size(); ++k) {
    AG_CHECK(tensors[k].sizes() == tensors[0].sizes(), op::stack, "all tensors must have one shape: tensor 0 has ",
             tensors[0].sizes(), ", tensor ", k, " has ", tensors[k].sizes());
    parts.push_back(unsqueeze(tensors[k], dim));
  }
  return cat(parts, dim);
}

namespace {

// The pieces g as one tensor of shape `in` without a copy, when every piece is defined and
// they are consecutive slices along dim of one buffer (same storage, dtype and strides,
// each starting where the one before ends) whose union does not overlap itself; else
// undefined.
Tensor joined_slices(const TensorList& g, int64_t dim, const Shape& in) {
  if (g.empty() || !g[0].defined()) return Tensor();
  const Tensor& first = g[0];
  const int64_t step = first.strides()[size_t(dim)];
  int64_t offset = first.storage_offset();
  for (const Tensor& t : g) {
    if (!t.defined() || !t.is_alias_of(first) || t.dtype() != first.dtype() || t.strides() != first.strides() ||
        t.storage_offset() != offset)
      return Tensor();
    offset += t.sizes()[size_t(dim)] * step;
  }
  if (!detail::non_overlapping(in, first.strides())) return Tensor();
  return make_view(first, in, first.strides(), first.storage_offset());
}

}  // namespace

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  detail::check_defined(x, op::split, "input");
  AG_CHECK(split_size > 0, op::split, "split_size must be positive, got ", split_size);
  dim = wrap_dim(dim, x.dim(), op::split);
  const int64_t n = x.sizes()[size_t(dim)];
  std::vector<Tensor> out;
  std::vector<int64_t> lengths;
  // Steps of min(split_size, what is left), so that s never passes n (nor overflows).
  for (int64_t s = 0; s < n || (n == 0 && out.empty()); s += std::min(split_size, n - s)) {
    const int64_t len = std::min(split_size, n - s);
    Shape sizes = x.sizes();
    sizes[size_t(dim)] = len;
    out.push_back(make_view(x, sizes, x.strides(), x.storage_offset() + s * x.strides()[size_t(dim)]));
    lengths.push_back(len);
  }
  // One node for all the pieces, whose backward writes the input's gradient once (a cat)
  // rather than a zero-filled input-sized tensor per piece that the engine then adds up
  // (the attention's q, k, v split of one projection is in every transformer layer).
  // Pieces that already are adjacent slices of one buffer (attention's gradients of such a
  // split are made so) are joined without a copy.
  if (any_requires_grad({&x})) {
    const Shape in = x.sizes();
    record(op::split, {x}, out, [in, dim, lengths](const TensorList& g, GradMask) -> TensorList {
      if (Tensor joined = joined_slices(g, dim, in); joined.defined()) return {joined};
      TensorOptions opts;
      for (const Tensor& gi : g)
        if (gi.defined()) opts = gi.options();
      std::vector<Tensor> parts;
      for (size_t i = 0; i < g.size(); ++i) {
        if (g[i].defined()) {
          parts.push_back(g[i]);
        } else {
          Shape piece = in;
          piece[size_t(dim)] = lengths[i];
          parts.push_back(zeros(piece.vec(), opts));
        }
      }
      return {parts.size() == 1 ? parts[0] : cat(parts, dim)};
    });
  }
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  detail::check_defined(x, op::chunk, "input");
  AG_CHECK(chunks > 0, op::chunk, "chunks must be positive, got ", chunks);
  dim = wrap_dim(dim, x.dim(), op::chunk);
  const int64_t n = x.sizes()[size_t(dim)];
  return split(x, std::max<int64_t>(1, n / chunks + (n % chunks != 0)), dim);
}

namespace {
void check_index(const Tensor& index, const char* op) {
  detail::check_defined(index, op, "index");
  AG_CHECK(index.dtype() == kInt64 || index.dtype() == kInt32, op, "index must be int64 or int32, got ",
           dtype_name(index.dtype()));
}

// Every index of idx (int64, contiguous) in [0, n), when the host holds them; a device's
// indices are checked by its kernels, which report at the next sync.
void check_index_range(const Tensor& idx, int64_t n, int64_t dim, const char* op) {
  if (!idx.device().is_cpu()) return;
  const int64_t* ip = idx.data_ptr<int64_t>();
  for (int64_t i = 0; i < idx.numel(); ++i)
    AG_CHECK(ip[i] >= 0 && ip[i] < n, op, "index ", ip[i], " is out of range for dim ", dim, " of size ", n,
             " (indices are in [0, size), as in PyTorch)");
}
}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  detail::check_defined(x, op::index_select, "input");
  check_index(index, op::index_select);
  AG_CHECK(index.dim() <= 1, op::index_select, "index must be 1-D, got shape ", index.sizes());
  dim = wrap_dim(dim, x.dim(), op::index_select);
  Tensor idx = detail::contiguous_raw(detail::cast_raw(index.dim() == 0 ? index.view({1}) : index, kInt64));
  check_index_range(idx, x.sizes()[size_t(dim)], dim, op::index_select);
  Shape shape = x.sizes();
  shape[size_t(dim)] = idx.numel();
  Tensor out = make_tensor(shape, x.dtype(), x.device(), op::index_select);
  backend(x.device(), op::index_select).index_select(x, dim, idx, out);
  if (any_requires_grad({&x})) {
    const Shape in = x.sizes();
    record(op::index_select, {x}, {out}, [in, dim, idx](const TensorList& g, GradMask) -> TensorList {
      Tensor gx = zeros(in.vec(), g[0].options());
      backend(gx.device(), op::index_select).index_add(gx, dim, idx, detail::contiguous_raw(g[0]));
      return {gx};
    });
  }
  return out;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  detail::check_defined(x, op::gather, "input");
  check_index(index, op::gather);
  AG_CHECK(index.dim() == x.dim(), op::gather, "index has ", index.dim(), " dims but the input has ",
           x.dim());
  dim = wrap_dim(dim, x.dim(), op::gather);
  for (int64_t d = 0; d < x.dim(); ++d)
    AG_CHECK(d == dim || index.sizes()[size_t(d)] <= x.sizes()[size_t(d)], op::gather, "index shape ",
             index.sizes(), " exceeds the input shape ", x.sizes(), " in dim ", d);
  Tensor idx = detail::contiguous_raw(detail::cast_raw(index, kInt64));
  check_index_range(idx, x.sizes()[size_t(dim)], dim, op::gather);
  Tensor out = make_tensor(idx.sizes(), x.dtype(), x.device());
  backend(x.device(), op::gather).gather(x, dim, idx, out);
  if (any_requires_grad({&x})) {
    const Shape in = x.sizes();
    record(op::gather, {x}, {out}, [in, dim, idx](const TensorList& g, GradMask) -> TensorList {
      Tensor gx = zeros(in.vec(), g[0].options());
      backend(gx.device(), op::gather).scatter_add(gx, dim, idx, detail::contiguous_raw(g[0]));
      return {gx};
    });
  }
  return out;
}

}  // namespace ampgrad
