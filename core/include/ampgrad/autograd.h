// Autograd: a dynamic graph of Nodes recorded by ops, and the engine that runs it backward.
//
// An op that has an input requiring grad records one Node whose next_edges point at the
// nodes that produced its inputs (or at the AccumulateGrad node of a leaf). backward()
// counts dependencies from the root, then runs nodes newest-first, summing the gradients
// that reach each node before it runs. The engine, not each op, sums a gradient down to
// its input's shape (broadcasting) and casts it to its input's dtype (promotion), so
// backward formulas stay short.
//
// Saved tensors are detached aliases plus the version they had when saved: reading one
// whose storage was since modified in place throws. Without retain_graph a node frees what
// it saved after it runs, and running it again throws.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ampgrad/tensor.h"

namespace ampgrad {

/// Thread-local grad mode: when off, ops record nothing.
struct GradMode {
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

/// Disables gradient recording in its scope (restores the previous mode on exit).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

/// Enables gradient recording in its scope.
class EnableGradGuard {
 public:
  EnableGradGuard() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(true); }
  ~EnableGradGuard() { GradMode::set_enabled(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;
  bool valid() const { return fn != nullptr; }
};

/// What the engine knows about each input of a node, to shape the gradient it sends there.
struct InputMeta {
  Shape sizes;
  DType dtype = kFloat32;
  Device device;
  /// A second dtype the gradient may arrive in unchanged (see gradient_dtype); any other
  /// dtype is cast to `dtype`.
  std::optional<DType> wide_dtype;
};

struct Node {
  Node();
  virtual ~Node() = default;
  /// "MulBackward", "AccumulateGrad", ...
  virtual std::string name() const = 0;
  /// Gradients for each input (one per next_edge; undefined where an input needs none),
  /// given the gradients of each output (undefined where none arrived).
  virtual TensorList apply(TensorList&& grad_outputs) = 0;
  /// Frees saved tensors after a backward pass without retain_graph.
  virtual void release() {}

  std::vector<Edge> next_edges;
  std::vector<InputMeta> input_meta;  // parallel to next_edges
  uint32_t num_outputs = 1;
  uint64_t sequence_nr = 0;
  /// Hooks registered on non-leaf outputs: (output_nr, hook), run before apply.
  std::vector<std::pair<uint32_t, GradHook>> pre_hooks;
  /// Set on the node of a dtype cast (`to`): the dtype it casts to. Its incoming gradient
  /// may be wider (see gradient_dtype); hooks still see it in this dtype.
  std::optional<DType> cast_output;
};

/// Which inputs of a node need a gradient; lets a backward formula skip work.
class GradMask {
 public:
  explicit GradMask(const std::vector<Edge>& edges) : edges_(&edges) {}
  bool operator[](size_t i) const { return i < edges_->size() && (*edges_)[i].valid(); }

 private:
  const std::vector<Edge>* edges_;
};

/// A tensor saved for backward: a detached alias and the version it had when saved.
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t);  // NOLINT: implicit on purpose
  /// The saved tensor; throws if it was modified in place since it was saved.
  const Tensor& get() const;
  bool defined() const { return data_.defined(); }
  void reset() { data_ = Tensor(); }

 private:
  Tensor data_;
  uint64_t version_ = 0;
};

using BackwardFn = std::function<TensorList(const TensorList& grad_outputs, GradMask needs)>;

/// The node most ops record: a name and a backward formula that captures what it saved.
class FunctionNode : public Node {
 public:
  FunctionNode(std::string name, BackwardFn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string name() const override { return name_; }
  TensorList apply(TensorList&& grad_outputs) override;
  void release() override;

 private:
  std::string name_;
  BackwardFn fn_;
  bool released_ = false;
};

/// Accumulates the gradient arriving at a leaf into leaf.grad(), after the leaf's hooks.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(Tensor leaf);
  std::string name() const override { return "AccumulateGrad"; }
  TensorList apply(TensorList&& grad_outputs) override;
  const Tensor& leaf() const { return leaf_; }

 private:
  Tensor leaf_;
};

/// True when grad mode is on and any input requires grad: the op must record a node.
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);
bool any_requires_grad(const TensorList& inputs);

/// Records `fn` as the node producing `outputs` from `inputs`. `name` is the forward op's
/// name ("mul"); the node is called "MulBackward". Inputs that do not require grad get no
/// edge. No-op when grad mode is off or no input requires grad.
/// Returns the node, or null when nothing was recorded.
std::shared_ptr<Node> record(const char* name, const TensorList& inputs, const TensorList& outputs,
                             BackwardFn fn);

/// The dtype in which a backward formula may return the gradient for input `t`. Usually
/// t.dtype(). For a float16/bfloat16 tensor that is a cast of a float32 one (what autocast
/// makes of a float32 weight), float32: the cast's backward would widen the gradient to
/// float32 anyway, so a formula that can produce it in float32 directly (a matmul writing
/// a float32 result from 16-bit operands) skips rounding to 16 bits and widening again,
/// and the gradient keeps float32 precision. Formulas that cannot simply return t.dtype().
DType gradient_dtype(const Tensor& t);

/// The edge through which a gradient reaches `t` (its grad_fn, or its leaf accumulator).
Edge gradient_edge(const Tensor& t);

/// Runs backward from `roots` with the given gradients (undefined: ones, allowed only for
/// single-element roots).
void run_backward(const TensorList& roots, const TensorList& grad_roots, bool retain_graph);

/// The gradients of `params` (those that have one), grouped by device in the order of
/// their first parameter, for multi-tensor backend calls (one per device). A
/// non-contiguous gradient is replaced by a contiguous copy first (set_grad).
std::vector<std::pair<Device, TensorList>> gradients_by_device(const std::vector<Tensor>& params);

/// Sums `g` over the broadcast dims so that it has `shape` (the reverse of expand).
Tensor sum_to(const Tensor& g, const Shape& shape);

}  // namespace ampgrad
