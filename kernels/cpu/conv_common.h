// The convolution and pooling code both CPU builds use (onednn_conv.cpp and eigen_conv.cpp);
// always compiled.
//
// - The eigen_conv2d functions are convolution by im2col + the Eigen GEMM (gemm_common.h).
//   The Eigen build uses them for every dtype; the oneDNN build uses them for float64,
//   which oneDNN does not compute. float16/bfloat16 are widened to float32 buffers,
//   computed, and narrowed once.
// - The pooling loops serve both builds: they follow PyTorch's window rules exactly
//   (ceil_mode, count_include_pad, NaN propagation in max) that oneDNN's pooling does not
//   all express. max_pool2d saves the int64 index of each maximum within its input plane.
#pragma once

#include <cstdint>

#include "ampgrad/backend.h"
#include "ampgrad/tensor.h"

namespace ampgrad::cpu {

// ---- im2col convolution -------------------------------------------------------------------
void eigen_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                  const Conv2dParams& p);
void eigen_conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Tensor& grad_in,
                                 const Conv2dParams& p);
void eigen_conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Tensor& grad_w,
                                  const Tensor& grad_bias, const Conv2dParams& p);

// ---- pooling loops (NCHW, contiguous x and grad_out; grad_in is fully overwritten) ------
/// Returns the int64 index (h * W + w) of each output's maximum in its input plane.
Tensor pool_max_forward(const Tensor& x, const Tensor& out, const Pool2dParams& p);
void pool_max_backward(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_in);
void pool_avg_forward(const Tensor& x, const Tensor& out, const Pool2dParams& p);
void pool_avg_backward(const Tensor& grad_out, const Tensor& grad_in, const Pool2dParams& p);

/// grad_bias[c] = sum of grad_out [N, C, H, W] over N, H, W (float accumulation).
void conv_bias_grad(const Tensor& grad_out, const Tensor& grad_bias);

}  // namespace ampgrad::cpu
