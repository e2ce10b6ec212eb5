// The op frontend's dispatch hook: what an op does before its own checks and kernel.
//
// Core knows that a layer above it may want to change the inputs of an op before the op
// runs (autocast casts them), but not what that layer is: the layer registers a hook here
// and raises a thread-local flag while it may act, as PyTorch's dispatcher does with its
// Autocast key. Every op with an autocast policy starts with
//
//   if (auto in = dispatch::autocast(op::add, a, b)) return add((*in)[0], (*in)[1], alpha);
//
// which is one thread-local read while the flag is down (the tensors are not even put in
// a vector), and otherwise calls the hook: it returns the inputs to use when it changed
// any of them (the op then calls itself with them; casting is idempotent, so that call
// proceeds), else nullopt.
//
// The autograd engine runs backward inside an ExcludeAutocastGuard: ops there never call
// the hook, whatever guards a gradient hook opens.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ampgrad/op_ids.h"
#include "ampgrad/tensor.h"

namespace ampgrad::dispatch {

/// The inputs `op` computes with when the hook changes any of `inputs`, else nullopt.
using InputHook = std::optional<std::vector<Tensor>> (*)(OpId op, const std::vector<Tensor>& inputs);

/// Installs the autocast hook (autocast does so each time it enables itself, so the hook
/// is in place whenever the flag can be up; nothing depends on static registration).
void set_autocast_hook(InputHook hook);

/// Raises or lowers this thread's flag: autocast is enabled for some device type.
void set_autocast_enabled(bool enabled);

namespace detail {
inline constexpr uint8_t kAutocastEnabled = 1;   // set by autocast
inline constexpr uint8_t kAutocastExcluded = 2;  // set by ExcludeAutocastGuard
/// The thread's flags; constinit, so reading it is a plain thread-local load.
extern thread_local constinit uint8_t t_autocast_flags;
std::optional<std::vector<Tensor>> call_autocast_hook(OpId op, const std::vector<Tensor>& inputs);
}  // namespace detail

/// True when ops on this thread must call the autocast hook: enabled and not excluded.
inline bool autocast_active() { return detail::t_autocast_flags == detail::kAutocastEnabled; }
/// True inside an ExcludeAutocastGuard (the engine's backward pass).
inline bool autocast_excluded() { return (detail::t_autocast_flags & detail::kAutocastExcluded) != 0; }

/// What ops call first (see the file comment).
template <class... Ts>
inline std::optional<std::vector<Tensor>> autocast(OpName op, const Ts&... inputs) {
  if (!autocast_active()) [[likely]]
    return std::nullopt;
  return detail::call_autocast_hook(op.id, std::vector<Tensor>{inputs...});
}
inline std::optional<std::vector<Tensor>> autocast(OpName op, const std::vector<Tensor>& inputs) {
  if (!autocast_active()) [[likely]]
    return std::nullopt;
  return detail::call_autocast_hook(op.id, inputs);
}

/// Keeps the autocast hook from running in its scope, on this thread (restores on exit).
class ExcludeAutocastGuard {
 public:
  ExcludeAutocastGuard();
  ~ExcludeAutocastGuard();
  ExcludeAutocastGuard(const ExcludeAutocastGuard&) = delete;
  ExcludeAutocastGuard& operator=(const ExcludeAutocastGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace ampgrad::dispatch
