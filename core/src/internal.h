// Helpers shared by the op frontend (core/src/ops); not installed.
//
// The *_raw functions run a kernel without recording autograd: ops call them for their
// forward computation and record their own node, and backward formulas use them for
// fused gradient kernels.
#pragma once

#include "ampgrad/autograd.h"
#include "ampgrad/backend.h"
#include "ampgrad/op_kinds.h"
#include "ampgrad/tensor.h"

namespace ampgrad::detail {

/// A view of base's storage with the given geometry (no autograd).
Tensor make_view(const Tensor& base, Shape sizes, Shape strides, int64_t offset);
/// base broadcast to shape with stride-0 dims (no autograd); shape must be compatible.
Tensor expand_raw(const Tensor& base, const Shape& shape);
/// base converted to dtype (no autograd); base itself when it already has that dtype.
Tensor cast_raw(const Tensor& base, DType dtype);
/// A contiguous copy or base itself (no autograd).
Tensor contiguous_raw(const Tensor& base);

void check_same_device(const Tensor& a, const Tensor& b, const char* op);
void check_defined(const Tensor& t, const char* op, const char* what);

Tensor unary_raw(UnaryOp op, const Tensor& x, UnaryParams p = {});
/// a and b must share a dtype; they are broadcast together.
Tensor binary_raw(BinaryOp op, const Tensor& a, const Tensor& b);

/// Runs an in-place op on self. Without autograd the kernel writes into self directly
/// (write_into); with autograd, compute() builds the out-of-place result, which is copied
/// into self, and self takes over its history. Either way self's version is bumped.
/// Leaves that require grad are refused in grad mode.
void apply_inplace(Tensor& self, const char* op, bool needs_grad,
                   const std::function<Tensor()>& compute,
                   const std::function<void()>& write_into);
void bump_version(const Tensor& t);

/// Number of oneDNN primitives cached by the CPU backend (matmul, linear, conv); 0 in a
/// build without oneDNN. Tests use it to check that repeated shapes create none.
size_t cpu_primitive_cache_size();

}  // namespace ampgrad::detail
