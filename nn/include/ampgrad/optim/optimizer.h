// Optimizers: SGD, Adam, AdamW, with PyTorch's update rules, parameter groups, and state
// that is always float32.
//
// Options are plain structs filled with designated initializers:
//   ag::optim::AdamW opt(net->parameters(), {.lr = 1e-3, .weight_decay = 0.01});
// Each step is one fused pass per parameter (kernels/*/optim), so the optimizer costs one
// read and write of the parameter, gradient and moments. With master_weights, a float16 or
// bfloat16 parameter is updated through a float32 copy kept in the state, and the
// parameter receives its rounding (the float32 copy is what accumulates small updates).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ampgrad/nn/module.h"
#include "ampgrad/tensor.h"

namespace ampgrad::optim {

/// Parameters, gradients and moments in a checkpointable form: tensors by name
/// ("param_groups.0.lr", "state.3.exp_avg", ...).
using StateDict = nn::StateDict;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// Performs one update of every parameter that has a gradient.
  virtual void step() = 0;
  /// Drops every parameter's gradient (PyTorch's set_to_none).
  void zero_grad();
  /// Turns float32 master weights for float16/bfloat16 parameters on or off in every group
  /// (the master_weights option). Masters already made are kept while on.
  virtual void set_master_weights(bool on) = 0;
  /// Makes the float32 master copy of every parameter now, from its current value: called
  /// before a model is converted to 16 bits, the masters keep the full float32 values.
  void init_master_weights();
  size_t num_groups() const { return groups_.size(); }
  double lr(size_t group = 0) const;
  void set_lr(size_t group, double lr);
  /// Sets every group's learning rate.
  void set_lr(double lr);
  std::vector<Tensor> parameters() const;
  /// Steps taken so far.
  int64_t steps() const { return steps_; }
  /// Learning rates, step counts and state. Like PyTorch's, the state tensors are live
  /// views: clone them (or save the dict) before stepping on if you need a snapshot.
  /// Betas, eps and weight decay are not included; they come from the constructor.
  StateDict state_dict() const;
  /// Restores learning rates, step count and per-parameter state; the parameter layout
  /// (groups and shapes) must match, else ag::Error names the difference.
  void load_state_dict(const StateDict& dict);

 protected:
  struct Group {
    std::vector<Tensor> params;
    double lr;
  };
  struct ParamState {
    Tensor buf1, buf2;  // momentum, or (exp_avg, exp_avg_sq); float32
    Tensor master;      // float32 copy of a 16-bit parameter, when master_weights
    int64_t step = 0;   // updates applied to this parameter (Adam's bias correction)
  };
  void add_group(std::vector<Tensor> params, double lr, const char* who);
  /// State of parameter j of group g, created on first use.
  ParamState& state(size_t g, size_t j);
  /// Calls f(group, param, grad, state) for every parameter that has a gradient.
  template <class F>
  void for_each_param_with_grad(F&& f) {
    for (size_t g = 0; g < groups_.size(); ++g)
      for (size_t j = 0; j < groups_[g].params.size(); ++j) {
        const Tensor& p = groups_[g].params[j];
        const Tensor grad = p.grad();
        if (grad.defined()) f(g, p, grad, state(g, j));
      }
  }
  /// The float32 copy to update, or undefined when the parameter itself is updated.
  Tensor master_for(ParamState& s, const Tensor& param, bool master_weights);

  std::vector<Group> groups_;
  std::vector<std::vector<ParamState>> state_;
  int64_t steps_ = 0;
};

struct SGDOptions {
  double lr = 1e-2;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool master_weights = false;
};

class SGD : public Optimizer {
 public:
  struct ParamGroup {
    std::vector<Tensor> params;
    SGDOptions options;
  };
  SGD(std::vector<Tensor> params, SGDOptions options = {});
  SGD(std::vector<ParamGroup> groups);
  void step() override;
  void set_master_weights(bool on) override;

 private:
  std::vector<SGDOptions> options_;
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;  // L2 penalty added to the gradient
  bool master_weights = false;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // decoupled: param *= 1 - lr * weight_decay
  bool master_weights = false;
};

class Adam : public Optimizer {
 public:
  struct ParamGroup {
    std::vector<Tensor> params;
    AdamOptions options;
  };
  Adam(std::vector<Tensor> params, AdamOptions options = {});
  Adam(std::vector<ParamGroup> groups);
  void step() override;
  void set_master_weights(bool on) override;

 protected:
  explicit Adam(bool decoupled) : decoupled_(decoupled) {}
  void add_groups(std::vector<ParamGroup> groups);
  std::vector<AdamOptions> options_;
  bool decoupled_ = false;
};

class AdamW : public Adam {
 public:
  struct ParamGroup {
    std::vector<Tensor> params;
    AdamWOptions options;
  };
  AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  AdamW(std::vector<ParamGroup> groups);
};

}  // namespace ampgrad::optim
