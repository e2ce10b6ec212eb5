// Numbers read back from saved state (optimizer, grad scaler and Lite checkpoints): one
// element each, checked as strictly as the constructors check what the user passes. An
// integer may be stored in a floating dtype (PyTorch keeps some counters as floats); then
// it must be integral and in range, never truncated or wrapped.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "ampgrad/tensor.h"

namespace ampgrad::detail {

/// The one element of `t` as an integer in [lo, hi]; otherwise throws
/// "[op] <key> must be an integer in [lo, hi], got <value>".
int64_t state_int(const Tensor& t, const char* op, const std::string& key, int64_t lo = 0,
                  int64_t hi = std::numeric_limits<int64_t>::max());

/// The one element of `t` (any real dtype) as a double; throws unless there is exactly one.
double state_double(const Tensor& t, const char* op, const std::string& key);

/// A decimal unsigned 64-bit number written by a saver (a seed in checkpoint metadata):
/// digits only, no sign, no spaces, no overflow; otherwise throws naming the key and the text.
uint64_t parse_u64(const std::string& text, const char* op, const std::string& key);

}  // namespace ampgrad::detail
