// The dispatch hook's state: the installed autocast hook and this thread's flags.
#include "ampgrad/dispatch.h"

#include <atomic>

namespace ampgrad::dispatch {

namespace detail {
thread_local constinit uint8_t t_autocast_flags = 0;
}  // namespace detail

namespace {
std::atomic<InputHook> g_autocast_hook{nullptr};
}  // namespace

void set_autocast_hook(InputHook hook) { g_autocast_hook.store(hook, std::memory_order_release); }

void set_autocast_enabled(bool enabled) {
  if (enabled) detail::t_autocast_flags |= detail::kAutocastEnabled;
  else detail::t_autocast_flags &= uint8_t(~detail::kAutocastEnabled);
}

std::optional<std::vector<Tensor>> detail::call_autocast_hook(OpId op, const std::vector<Tensor>& inputs) {
  const InputHook hook = g_autocast_hook.load(std::memory_order_acquire);
  return hook ? hook(op, inputs) : std::nullopt;
}

ExcludeAutocastGuard::ExcludeAutocastGuard() : prev_(autocast_excluded()) {
  detail::t_autocast_flags |= detail::kAutocastExcluded;
}

ExcludeAutocastGuard::~ExcludeAutocastGuard() {
  if (!prev_) detail::t_autocast_flags &= uint8_t(~detail::kAutocastExcluded);
}

}  // namespace ampgrad::dispatch
