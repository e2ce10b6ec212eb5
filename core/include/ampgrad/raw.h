// Tensors without autograd, for the backends and the op frontend: views of a storage with a
// given geometry, broadcasts, dtype casts and contiguous copies that run a kernel and record
// nothing. A backend uses these (never the ops of ops/*.h, which record on the tape and
// consult autocast); the frontend uses them for its own forward computations.
#pragma once

#include "ampgrad/shape.h"
#include "ampgrad/tensor.h"

namespace ampgrad::detail {

/// A view of base's storage with the given geometry.
Tensor make_view(const Tensor& base, Shape sizes, Shape strides, int64_t offset);
/// base broadcast to shape with stride-0 dims; shape must be compatible.
Tensor expand_raw(const Tensor& base, const Shape& shape);
/// base converted to dtype; base itself when it already has that dtype.
Tensor cast_raw(const Tensor& base, DType dtype);
/// A contiguous copy, or base itself when it is contiguous.
Tensor contiguous_raw(const Tensor& base);
/// A matrix [R, C] as a batch of one, [1, R, C] with its own strides: the operand shape of
/// Backend::matmul.
Tensor one_batch(const Tensor& m);

}  // namespace ampgrad::detail
