// Factories and the seeded random generator.
//
// Random numbers come from a counter-based generator (Philox 4x32-10): a draw of n numbers
// takes the counters [offset, offset + n) of the global seed and advances the offset, so a
// result depends only on the seed and the order of draws, never on the thread count or the
// backend. ag::manual_seed(s) resets seed and offset.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ampgrad/tensor.h"

namespace ampgrad {

Tensor empty(const std::vector<int64_t>& shape, TensorOptions opts = {});
Tensor zeros(const std::vector<int64_t>& shape, TensorOptions opts = {});
Tensor ones(const std::vector<int64_t>& shape, TensorOptions opts = {});
Tensor full(const std::vector<int64_t>& shape, Scalar value, TensorOptions opts = {});
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, Scalar value);
/// A 0-dim tensor holding v.
Tensor scalar_tensor(Scalar v, TensorOptions opts = {});
/// [start, end) by step; int64 unless a bound is floating or opts give a dtype.
Tensor arange(Scalar end, TensorOptions opts = {});
Tensor arange(Scalar start, Scalar end, Scalar step = 1, TensorOptions opts = {});
Tensor linspace(double start, double end, int64_t steps, TensorOptions opts = {});
Tensor eye(int64_t n, TensorOptions opts = {});
Tensor eye(int64_t n, int64_t m, TensorOptions opts = {});

/// Copies the values into a new tensor of `shape` (dtype from T unless opts give one).
template <class T>
Tensor from_vector(const std::vector<T>& values, const std::vector<int64_t>& shape,
                   TensorOptions opts = {});
/// Wraps existing CPU memory without copying; `deleter`, if given, frees it when the last
/// tensor using it goes. Contiguous strides unless given.
Tensor from_blob(void* data, const std::vector<int64_t>& shape, TensorOptions opts = {},
                 std::function<void(void*)> deleter = {});
Tensor from_blob(void* data, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                 TensorOptions opts = {}, std::function<void(void*)> deleter = {});

// ---- random -------------------------------------------------------------------------
void manual_seed(uint64_t seed);
/// The global generator's (seed, offset), e.g. to store in a checkpoint, and its restore.
std::pair<uint64_t, uint64_t> generator_state();
void set_generator_state(uint64_t seed, uint64_t offset);
/// Reserves n counters of the global generator: returns (seed, offset).
std::pair<uint64_t, uint64_t> generator_advance(uint64_t n);

/// Uniform on [0, 1).
Tensor rand(const std::vector<int64_t>& shape, TensorOptions opts = {});
/// Standard normal.
Tensor randn(const std::vector<int64_t>& shape, TensorOptions opts = {});
/// Integers uniform on [low, high), int64 unless opts give a dtype.
Tensor randint(int64_t low, int64_t high, const std::vector<int64_t>& shape, TensorOptions opts = {});
/// 1 with probability p (elementwise), else 0; the result has p's dtype.
Tensor bernoulli(const Tensor& p);
Tensor bernoulli(const std::vector<int64_t>& shape, double p, TensorOptions opts = {});
Tensor rand_like(const Tensor& t);
Tensor randn_like(const Tensor& t);

// ---- implementation of the template -----------------------------------------------
namespace detail {
Tensor from_vector_impl(const void* data, DType src_dtype, int64_t count,
                        const std::vector<int64_t>& shape, TensorOptions opts, const char* op);
}
template <class T>
Tensor from_vector(const std::vector<T>& values, const std::vector<int64_t>& shape,
                   TensorOptions opts) {
  if (!opts.has_dtype()) opts = opts.dtype(dtype_of<T>);
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<uint8_t> bytes(values.begin(), values.end());
    return detail::from_vector_impl(bytes.data(), kBool, int64_t(bytes.size()), shape, opts,
                                    "from_vector");
  } else {
    return detail::from_vector_impl(values.data(), dtype_of<T>, int64_t(values.size()), shape,
                                    opts, "from_vector");
  }
}

}  // namespace ampgrad
