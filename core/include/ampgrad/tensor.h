// Tensor: a cheap handle (one shared_ptr) on a TensorImpl.
//
// A TensorImpl is a strided view of a Storage: sizes, strides and offset are in elements.
// Views (view, transpose, narrow, expand, ...) share the Storage and with it the version
// counter that every in-place op bumps; autograd uses it to refuse a backward pass that
// would read a saved tensor changed since it was saved. Autograd metadata is allocated only
// for tensors that take part in autograd, so a plain tensor costs three small allocations
// (impl, storage, data) and its sizes and strides live inline.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "ampgrad/checked.h"
#include "ampgrad/device.h"
#include "ampgrad/dtype.h"
#include "ampgrad/error.h"
#include "ampgrad/scalar.h"
#include "ampgrad/shape.h"
#include "ampgrad/stream.h"
#include "ampgrad/sync.h"

namespace ampgrad {

class Tensor;
struct Node;

class Backend;

/// Memory owned (or borrowed, for from_blob) by one or more tensors.
struct Storage {
  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  /// The backend that allocated `data` and frees it; null for from_blob memory.
  Backend* allocator = nullptr;
  /// Frees from_blob memory; empty for borrowed memory.
  std::function<void(void*)> deleter;
  /// Bumped by every in-place write through any view of this storage.
  uint64_t version = 0;
  /// The stream the memory was allocated on (its device's current stream then); the free
  /// is queued there.
  Stream stream;
  /// Other streams that use the memory (record_stream): the free waits for them.
  std::vector<Stream> stream_uses;
  /// Page-locked host memory from pin_memory, freed by allocator->deallocate_pinned.
  bool pinned = false;

  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();
};

/// Allocates storage for nbytes on a device, through that device's backend, on the
/// device's current stream.
std::shared_ptr<Storage> allocate_storage(size_t nbytes, Device device);
/// Allocates pinned host memory (see Tensor::pin_memory), counted as CPU memory.
std::shared_ptr<Storage> allocate_pinned_storage(size_t nbytes);

struct AutogradMeta;

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape sizes;
  Shape strides;
  int64_t offset = 0;
  DType dtype = kFloat32;
  std::unique_ptr<AutogradMeta> autograd;

  TensorImpl() = default;
  TensorImpl(std::shared_ptr<Storage> s, Shape sz, Shape st, int64_t off, DType dt)
      : storage(std::move(s)), sizes(std::move(sz)), strides(std::move(st)), offset(off), dtype(dt) {}
  ~TensorImpl();
  AutogradMeta& meta();  // creates it on first use
};

/// Options for factories: ag::TensorOptions().dtype(ag::kBFloat16).device("cpu").requires_grad(true).
class TensorOptions {
 public:
  TensorOptions() = default;
  TensorOptions(DType dt) : dtype_(dt) {}                      // NOLINT: implicit like LibTorch
  TensorOptions(Device d) : device_(d) {}                      // NOLINT
  TensorOptions(DeviceType d) : device_(d) {}                  // NOLINT
  TensorOptions dtype(DType dt) const { auto o = *this; o.dtype_ = dt; return o; }
  TensorOptions device(Device d) const { auto o = *this; o.device_ = d; return o; }
  TensorOptions requires_grad(bool r) const { auto o = *this; o.requires_grad_ = r; return o; }
  /// The dtype given, or the default floating dtype.
  DType dtype() const { return dtype_ ? *dtype_ : get_default_dtype(); }
  bool has_dtype() const { return dtype_.has_value(); }
  Device device() const { return device_; }
  bool requires_grad() const { return requires_grad_; }

 private:
  std::optional<DType> dtype_;
  Device device_;
  bool requires_grad_ = false;
};

/// A hook on a tensor's gradient: receives the gradient, returns a replacement or an
/// undefined tensor to keep it.
using GradHook = std::function<Tensor(const Tensor&)>;
/// A hook run after a leaf's gradient was accumulated: receives the leaf, whose grad() is
/// now complete for this backward pass.
using PostAccumulateHook = std::function<void(const Tensor&)>;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- metadata ----------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  int64_t dim() const { return int64_t(impl().sizes.size()); }
  int64_t numel() const { return impl().sizes.numel(); }
  const Shape& sizes() const { return impl().sizes; }
  const Shape& strides() const { return impl().strides; }
  /// Size of dim d (negative counts from the end).
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t storage_offset() const { return impl().offset; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device; }
  TensorOptions options() const { return TensorOptions().dtype(dtype()).device(device()); }
  size_t itemsize() const { return ampgrad::itemsize(dtype()); }
  size_t nbytes() const { return checked_nbytes(numel(), itemsize(), "nbytes"); }
  bool is_contiguous() const;
  /// True when the elements fill one block of memory, each once, in some order of the dims
  /// (a contiguous tensor, or a transpose or permutation of one): an in-place write then
  /// reaches every element exactly once. False for expanded views (stride 0), for views that
  /// skip elements (narrow, a step), and for geometries whose elements overlap.
  bool is_non_overlapping_and_dense() const;
  bool is_floating_point() const { return is_floating(dtype()); }
  /// Bumped by every in-place op on this tensor or any view sharing its storage.
  uint64_t version() const { return impl().storage->version; }
  /// True when both handles refer to the same storage.
  bool is_alias_of(const Tensor& o) const { return impl().storage == o.impl().storage; }
  TensorImpl* unsafe_impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  // ---- data access (CPU) -------------------------------------------------------------
  /// Pointer to the first element; T must be the tensor's C++ type.
  template <class T>
  T* data_ptr() const {
    AG_CHECK(dtype_of<T> == dtype(), "data_ptr", "requested ", dtype_name(dtype_of<T>),
             " from a tensor of dtype ", dtype_name(dtype()));
    return static_cast<T*>(raw_data());
  }
  void* raw_data() const {
    return static_cast<char*>(impl().storage->data) + impl().offset * int64_t(itemsize());
  }
  /// The single element, converted to T. Throws unless numel() == 1. A host sync.
  template <class T>
  T item() const {
    return static_cast<T>(item_double());
  }
  double item_double() const;
  /// All elements in row-major order, converted to T (copies to CPU if needed). A host sync.
  template <class T>
  std::vector<T> to_vector() const;

  // ---- autograd ----------------------------------------------------------------------
  bool requires_grad() const;
  Tensor& requires_grad_(bool r = true);
  /// The accumulated gradient; undefined if none was accumulated.
  Tensor grad() const;
  /// Replaces the gradient (e.g. an optimizer or a scaler writing unscaled grads).
  void set_grad(const Tensor& g) const;
  bool is_leaf() const;
  const std::shared_ptr<Node>& grad_fn() const;
  uint32_t output_nr() const;
  /// Backpropagates from this tensor. Without a gradient the tensor must hold one element.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  /// Registers a hook run on this tensor's gradient during backward.
  void register_hook(GradHook hook) const;
  /// Leaves only: registers a hook run once per backward pass, right after this tensor's
  /// gradient was accumulated into grad() (distributed training starts reducing the
  /// gradient there, while backward goes on with the rest of the graph).
  void register_post_accumulate_grad_hook(PostAccumulateHook hook) const;
  /// A new handle on the same data, outside the graph.
  Tensor detach() const;
  Tensor& detach_();

  // ---- views and copies --------------------------------------------------------------
  Tensor view(const std::vector<int64_t>& shape) const;
  Tensor reshape(const std::vector<int64_t>& shape) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const std::vector<int64_t>& shape) const;
  Tensor expand_as(const Tensor& other) const;
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dt) const;
  /// A copy on device d (this tensor when it is there already), made on the current stream
  /// of the device that is not the CPU. A copy from another device to the CPU is a counted
  /// host sync, non_blocking or not. non_blocking lets a copy to a device return before it
  /// finished: from pinned memory (pin_memory) the host then does not wait at all, and the
  /// pinned block is kept until the copy is done. On the CPU alone there is nothing to copy.
  Tensor to(Device d, bool non_blocking = false) const;
  Tensor to(DeviceType d, bool non_blocking = false) const { return to(Device(d), non_blocking); }
  /// A copy of this CPU tensor in pinned (page-locked) host memory, from which copies to a
  /// device are asynchronous; this tensor when it is pinned already. The memory comes from
  /// cudaHostAlloc when this build has CUDA and a device is present; otherwise (a CPU-only
  /// build, or no GPU) it is ordinary CPU memory marked pinned, so code and tests run the
  /// same. Throws for a tensor not on the CPU.
  Tensor pin_memory() const;
  /// True when the tensor's storage is pinned host memory.
  bool is_pinned() const { return impl().storage->pinned; }
  Tensor cpu() const { return to(Device(kCPU)); }
  std::vector<Tensor> split(int64_t split_size, int64_t dim = 0) const;
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;
  Tensor index_select(int64_t dim, const Tensor& index) const;
  Tensor gather(int64_t dim, const Tensor& index) const;
  Tensor masked_fill(const Tensor& mask, Scalar value) const;

  // ---- math (free functions in ops/*.h are the definitions) ---------------------------
  Tensor add(const Tensor& o) const;
  Tensor sub(const Tensor& o) const;
  Tensor mul(const Tensor& o) const;
  Tensor div(const Tensor& o) const;
  Tensor neg() const;
  Tensor abs() const;
  Tensor pow(Scalar e) const;
  Tensor sqrt() const;
  Tensor rsqrt() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor log1p() const;
  Tensor tanh() const;
  Tensor sigmoid() const;
  Tensor relu() const;
  Tensor matmul(const Tensor& o) const;
  Tensor sum() const;
  Tensor sum(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;

  // ---- in-place (bump the version; refuse leaves that require grad in grad mode) ------
  Tensor& add_(const Tensor& o, Scalar alpha = 1);
  Tensor& add_(Scalar s);
  Tensor& sub_(const Tensor& o);
  Tensor& sub_(Scalar s);
  Tensor& mul_(const Tensor& o);
  Tensor& mul_(Scalar s);
  Tensor& div_(const Tensor& o);
  Tensor& div_(Scalar s);
  Tensor& zero_();
  Tensor& fill_(Scalar v);
  /// Copies src (broadcast to this shape, any dtype) into this tensor's memory.
  Tensor& copy_(const Tensor& src);
  Tensor& clamp_(std::optional<Scalar> min, std::optional<Scalar> max);
  Tensor& masked_fill_(const Tensor& mask, Scalar value);
  Tensor& uniform_(double from = 0, double to = 1);
  Tensor& normal_(double mean = 0, double std = 1);

  std::string str() const;

 private:
  TensorImpl& impl() const {
    AG_CHECK(impl_ != nullptr, "tensor", "use of an undefined tensor");
    return *impl_;
  }
  std::shared_ptr<TensorImpl> impl_;
};

/// Autograd state of a tensor; allocated only for tensors that take part in autograd.
struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;  // null for leaves
  uint32_t output_nr = 0;
  std::weak_ptr<Node> grad_accumulator;  // leaves: the node that accumulates into grad
  std::vector<GradHook> hooks;           // leaves: run before accumulation
  std::vector<PostAccumulateHook> post_accumulate_hooks;  // leaves: run after it
  // Leaves: the cast shadow (ampgrad/cast_shadow.h), a 16-bit rounding of the value that an
  // optimizer step writes along with the update; valid while the tensor's storage is still
  // cast_shadow_of and its version cast_shadow_version.
  Tensor cast_shadow;
  std::weak_ptr<Storage> cast_shadow_of;
  uint64_t cast_shadow_version = 0;
  bool cast_shadow_valid = false;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

using TensorList = std::vector<Tensor>;

/// Makes a contiguous tensor without autograd state; the building block of factories. The
/// shape and byte count are checked (ampgrad/checked.h) before anything is allocated; an
/// error names `op`.
Tensor make_tensor(const Shape& sizes, DType dtype, Device device, const char* op = "empty");
/// Row-major strides of a shape.
Shape contiguous_strides(const Shape& sizes);

namespace detail {
/// t's values on the host, counted as one host sync (`what` names the reader): t itself
/// when it is on the CPU, else a copy.
Tensor host_values(const Tensor& t, const char* what);
/// Records an in-place write to t's memory: bumps the version counter that t shares with
/// every view of its storage, so that autograd refuses a saved tensor that changed. The one
/// place the counter moves; code that writes a tensor in place outside the ops (through
/// raw_data, or a backend entry such as scale_and_check) calls it.
void bump_version(const Tensor& t);
}  // namespace detail

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = detail::host_values(*this, "to_vector").to(dtype_of<T>).contiguous();
  const T* p = static_cast<const T*>(c.raw_data());
  return std::vector<T>(p, p + c.numel());
}

}  // namespace ampgrad
