// Autocast: per-op casting of inputs for mixed precision, like PyTorch's autocast.
//
// Inside an AutocastGuard for a device type, each op looks up its cast policy in one table
// (autocast/src/policy.cpp; docs/autocast.md shows the same table and a test keeps the two
// equal) and casts its floating inputs before autograd records the op, so the casts are
// part of the graph: gradients of float32 parameters come back float32, and backward runs
// in the dtypes the forward used.
//
// Only floating tensors of the guarded device type are cast, never float64 ones; integer
// tensors, float64 tensors and tensors of another device pass untouched; in-place ops are
// never cast. Casting the same float32 leaf parameter that requires grad twice within the
// outermost region returns the same half tensor (the cast cache); the cache key holds the
// parameter's version and the grad mode, so an in-place update or a first pass under
// NoGradGuard can never hand a stale or graph-less copy to a later pass.
#pragma once

#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "ampgrad/op_ids.h"
#include "ampgrad/tensor.h"

namespace ampgrad {

enum class CastPolicy {
  LowerPrecision,  // cast floating inputs to the autocast dtype (matmul, linear, conv2d)
  Float32,         // cast floating inputs to float32 (losses, and on CUDA exp, softmax, sums, ...)
  Promote,         // run in the widest floating input dtype (cat, stack, ...)
  PassThrough,     // leave the inputs alone
};

const char* cast_policy_name(CastPolicy p);

namespace autocast {

/// The policy of `op` on a device type (PassThrough for ops the table does not list).
CastPolicy policy(OpName op, DeviceType device_type);
/// The same by the op's name (ampgrad/op_ids.h); PassThrough for a name no op has.
CastPolicy policy(std::string_view op, DeviceType device_type);
/// Every row of a device type's table, in table order. Rows are keyed on the op's id, so a
/// misspelled row does not compile.
const std::vector<std::pair<OpName, CastPolicy>>& policy_table(DeviceType device_type);

bool is_enabled(DeviceType device_type);
DType get_dtype(DeviceType device_type);
bool is_cache_enabled(DeviceType device_type);
/// Nesting depth of autocast guards (enabled or not) for a device type on this thread.
int depth(DeviceType device_type);
/// Number of casts held by this thread's cast cache.
size_t cache_size();

/// The decision alone, without tensors or a device: the dtype each input of `op` would
/// have under autocast to `autocast_dtype` on a device type (inputs given by dtype;
/// integral and float64 inputs keep theirs).
std::vector<DType> cast_dtypes(OpName op, DeviceType device_type, DType autocast_dtype,
                               const std::vector<DType>& inputs);

/// True when autocast is enabled for any device type on this thread. Inside the engine's
/// backward pass (dispatch::ExcludeAutocastGuard) it is off, as is_enabled is.
bool any_enabled();

/// The inputs an op computes with under the current autocast state: each one unchanged
/// or cast (through autograd) according to the op's policy. Undefined tensors pass.
std::vector<Tensor> cast_inputs(OpName op, std::vector<Tensor> inputs);

/// The hook that core's ops call first, through dispatch::autocast (ampgrad/dispatch.h),
/// while autocast is enabled on the thread: the cast inputs when autocast changes any of
/// them, else nullopt. An op then calls itself with the cast inputs; casting is
/// idempotent, so that call proceeds. AutocastGuard installs it.
std::optional<std::vector<Tensor>> cast_if_needed(OpId op, const std::vector<Tensor>& inputs);

}  // namespace autocast

/// Enables (or disables) autocast for a device type in its scope; restores the previous
/// state exactly on exit, also when nested and when an exception leaves the scope. A
/// dtype the hardware verdict calls unsupported throws, naming the device and suggesting
/// a supported choice; an emulated one runs.
class AutocastGuard {
 public:
  AutocastGuard(DeviceType device_type, DType dtype, bool enabled = true, bool cache_enabled = true);
  /// Keeps the current dtype (bfloat16 on CPU, float16 on CUDA by default).
  explicit AutocastGuard(DeviceType device_type, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DeviceType type_;
  bool prev_enabled_, prev_cache_;
  DType prev_dtype_;
};

}  // namespace ampgrad
