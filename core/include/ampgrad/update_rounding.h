// How an optimizer step stores a float16 or bfloat16 parameter's new value (the
// update_rounding option of ag::optim's SGD, Adam and AdamW; OptimizerLists::rounding).
#pragma once

#include <string>
#include <string_view>

namespace ampgrad {

/// The update is computed in float32 in every mode; the modes differ in what is stored.
/// Float32 and float64 parameters ignore the mode (their update is stored as computed).
enum class UpdateRounding {
  /// The new value rounded to nearest (ties to even), as a cast rounds. An update smaller
  /// than half a 16-bit ulp of the weight is lost.
  Nearest,
  /// Rounded up or down at random, with probability proportional to the distance
  /// (ampgrad/stochastic_round.h): unbiased, so small updates survive on average.
  Stochastic,
  /// Kahan summation with a compensation buffer of the parameter's dtype (2 bytes per
  /// element): y = update + c, w' = round(w + y), c = round(y - (w' - w)).
  Compensated,
  /// A float32 master copy (4 bytes per element) is updated and the parameter receives
  /// its rounding to nearest (the optimizers' master_weights).
  Master,
};

/// "nearest", "stochastic", "compensated" or "master".
const char* update_rounding_name(UpdateRounding r);
/// The mode of one of update_rounding_name's names; ag::Error naming the value and the
/// allowed names otherwise.
UpdateRounding parse_update_rounding(std::string_view name);

}  // namespace ampgrad
