// Modules: the building blocks of models, held by std::shared_ptr.
//
// A module owns named parameters (tensors that require grad), named buffers (state that is
// saved but not trained, e.g. a causal mask) and named child modules, each registered in
// its constructor. Names are stable and dotted ("0.weight", "blocks.1.attn.qkv.bias") and
// follow registration order. to(dtype) / to(device) convert parameters in place: every
// handle to a parameter (a member, an optimizer) sees the converted tensor.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ampgrad/tensor.h"

namespace ampgrad::nn {

using StateDict = std::map<std::string, Tensor>;

class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// The module's computation on one input.
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }

  /// "Linear", "Sequential", ...
  const std::string& type_name() const { return type_name_; }

  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<std::shared_ptr<Module>> children() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  /// This module and all its descendants, depth first, with dotted names ("" for this one).
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules();

  /// Training mode (dropout active); recursive.
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  /// Converts parameters and buffers in place (buffers only if floating, for dtype).
  Module& to(DType dtype);
  Module& to(Device device);
  /// Drops every parameter's gradient.
  void zero_grad();

  /// Parameters and buffers by dotted name (detached aliases of the live tensors).
  StateDict state_dict() const;
  /// Copies values into the parameters and buffers, converting the dtype within its kind
  /// (floating, integer, bool: float64 into float32 converts, bool into float32 does not
  /// match). Strict: every key must match and every shape and kind agree; the error lists
  /// missing and unexpected keys, shape mismatches and dtypes of another kind. Non-strict
  /// loads what matches by name, shape and kind.
  void load_state_dict(const StateDict& dict, bool strict = true);

  /// Total number of parameter elements.
  int64_t num_parameters() const;

 protected:
  /// Registers a parameter (made a leaf that requires grad) and returns the stored handle.
  Tensor register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  void check_new_name(const std::string& name) const;
  void collect(const std::string& prefix, bool recurse, bool buffers,
               std::vector<std::pair<std::string, Tensor>>& out) const;

  std::string type_name_;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

using ModulePtr = std::shared_ptr<Module>;

/// Runs its children in order; they are named "0", "1", ...
///
/// Fusion (on by default): a Linear followed by a ReLU or GELU runs as one
/// linear-with-activation op, and Linear, activation, Linear (not followed by another
/// activation) as one feed_forward op, and Conv2d, ReLU (optional), MaxPool2d as one
/// conv2d_block op (ops/nn.h). Only modules of exactly those types are
/// fused (a subclass may change forward); parameters, names and results are the same as
/// running the modules one by one, within rounding. set_fusion(false) runs every module's
/// own forward.
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  Sequential(std::initializer_list<ModulePtr> modules);
  explicit Sequential(const std::vector<ModulePtr>& modules);
  /// Appends a module named by its position.
  void push_back(ModulePtr m);
  size_t size() const { return modules_.size(); }
  const ModulePtr& operator[](size_t i) const { return modules_.at(i); }
  Tensor forward(const Tensor& x) override;
  void set_fusion(bool on) { fusion_ = on; }
  bool fusion() const { return fusion_; }

 private:
  std::vector<ModulePtr> modules_;
  bool fusion_ = true;
};

/// Replaces the data of `param` in place with `value` (a tensor of any shape, dtype and
/// device), keeping its autograd identity; every handle on param sees the new data.
void set_data(const Tensor& param, const Tensor& value);

/// Scales the gradients of params so that their global 2-norm is at most max_norm, on the
/// device: one multi-tensor reduction and one multi-tensor scale per device, no host
/// branch. Returns the norm before clipping, a 0-dim float32 tensor on the gradients'
/// device (as PyTorch); reading it is a host sync. max_norm must be non-negative
/// (infinity leaves the gradients as they are and only measures).
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);

}  // namespace ampgrad::nn
