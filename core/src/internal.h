// Helpers shared by the op frontend (core/src/ops); not installed, and not for the backends
// (kernels/ sees core/include only; what they share with the frontend is ampgrad/raw.h).
//
// The *_raw functions run a kernel without recording autograd: ops call them for their
// forward computation and record their own node, and backward formulas use them for
// fused gradient kernels.
#pragma once

#include "ampgrad/autograd.h"
#include "ampgrad/backend.h"
#include "ampgrad/op_ids.h"
#include "ampgrad/op_kinds.h"
#include "ampgrad/raw.h"
#include "ampgrad/tensor.h"

namespace ampgrad::detail {

/// True when no two indices of the geometry reach one element: with its dims ordered by
/// stride, each stride is at least the span of the dims inside it (gaps allowed). Size-1
/// and empty geometries qualify; a stride-0 dim of size > 1 does not.
bool non_overlapping(const Shape& sizes, const Shape& strides);
/// A new tensor of the given geometry whose memory order is that of `strides` (dims
/// ordered by stride, ties by position), dense: a layout-preserving empty_like.
Tensor empty_in_order(const Shape& sizes, const Shape& strides, DType dtype, Device device, const char* op);

void check_same_device(const Tensor& a, const Tensor& b, const char* op);
void check_defined(const Tensor& t, const char* op, const char* what);
/// A masked fill's mask: defined, bool, and broadcasting to `shape` (the input's).
void check_mask(const Tensor& mask, const Shape& shape, const char* op);

/// t saved for backward when `needed` (a gradient that reads it is wanted), else nothing.
inline SavedTensor save_if(const Tensor& t, bool needed) { return needed ? SavedTensor(t) : SavedTensor(); }

/// A 0-dim CPU tensor: next to a tensor of another device it acts as a scalar.
bool is_host_scalar(const Tensor& t);
/// The device an op on a and b runs on: theirs, or the other one's when one of them is a
/// host scalar; any other mix of devices throws naming `op` and both devices.
Device common_device(const Tensor& a, const Tensor& b, const char* op);
/// The value of a host scalar as a by-value operand (read in place: no host sync).
Operand host_scalar(const Tensor& t);
/// t as an operand of a kernel on `device` that computes in dt over `shape`: a host scalar
/// from another device by value, else t cast and broadcast into `hold`, which the operand
/// refers to (so `hold` must outlive the kernel call).
Operand operand_on(const Tensor& t, Device device, DType dt, const Shape& shape, Tensor& hold);

Tensor unary_raw(UnaryOp op, const Tensor& x, UnaryParams p = {});
/// op(a, b) in a's dtype; a tensor b must have it too, and is broadcast with a.
Tensor binary_raw(BinaryOp op, const Tensor& a, const Operand& b);

/// Runs an in-place op on self. Without autograd the kernel writes into self directly
/// (write_into); with autograd, compute() builds the out-of-place result, which is copied
/// into self, and self takes over its history. Either way self's version is bumped
/// (bump_version, tensor.h). Leaves that require grad are refused in grad mode.
void apply_inplace(Tensor& self, const char* op, bool needs_grad,
                   const std::function<Tensor()>& compute,
                   const std::function<void()>& write_into);

}  // namespace ampgrad::detail
