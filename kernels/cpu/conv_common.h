// Code shared by the two CPU implementations of the products, convolution and pooling
// (onednn_*.cpp and eigen_*.cpp); always compiled.
//
// - MatmulGeom reads a [B, M, K] x [B, K, N] problem off the tensors' strides: each matrix
//   is row-major or column-major with a leading dimension (so transposed views are used in
//   place), a batch stride of 0 is a broadcast operand, and a broadcast right operand whose
//   left operand stacks its batches row after row is folded into one [B*M, K] x [K, N].
// - The eigen_* functions are the Eigen implementation: GEMM on mapped strided matrices,
//   convolution by im2col + GEMM. The Eigen build uses them for every dtype; the oneDNN
//   build uses them for float64, which oneDNN does not compute. float16/bfloat16 are
//   widened to float32 buffers, computed, and narrowed once.
// - The pooling loops serve both builds: they follow PyTorch's window rules exactly
//   (ceil_mode, count_include_pad, NaN propagation in max) that oneDNN's pooling does not
//   all express. max_pool2d saves the int64 index of each maximum within its input plane.
#pragma once

#include <cstdint>

#include "ampgrad/backend.h"
#include "ampgrad/tensor.h"

namespace ampgrad::cpu {

/// One matrix operand: element strides of its rows and columns (one of them is 1 unless
/// needs_copy) and of its batches (0 when broadcast or when there is one batch).
struct MatLayout {
  int64_t bs = 0, rs = 0, cs = 1;
  bool row_major() const { return cs == 1; }
  /// Leading dimension: the stride of the non-unit dim.
  int64_t ld() const { return cs == 1 ? rs : cs; }
};

struct MatmulGeom {
  int64_t B = 1, M = 0, K = 0, N = 0;
  MatLayout a, w;
};

/// t itself when its two matrix dims form a BLAS-style layout (one unit stride, the other
/// not overlapping), else a contiguous copy. Works on the last two dims of any rank.
Tensor gemm_operand(const Tensor& t);
/// The geometry of out = a @ w for a [B, M, K], w [B, K, N] (operands from gemm_operand)
/// and contiguous out [B, M, N].
MatmulGeom matmul_geom(const Tensor& a, const Tensor& w);
/// t [B, R, C] converted to dt, each batch contiguous in t's order (row-major, or
/// column-major where t is a transposed view, so the copy reads t in order); a broadcast
/// batch (stride 0) is converted once and stays broadcast. A gemm_operand as it is.
Tensor operand_copy(const Tensor& t, DType dt);

// ---- the Eigen implementation ----------------------------------------------------------
/// out [B, M, N] = a [B, M, K] @ w [B, K, N] (+ bias [N]), any operand strides.
void eigen_matmul(const Tensor& a, const Tensor& w, const Tensor& out, const Tensor& bias = Tensor());
void eigen_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out);

/// linear as one batched product: x [M, K] -> [1, M, K], weight [N, K] read transposed in
/// place as [1, K, N], out [M, N] -> [1, M, N]; views, no copies.
struct LinearAsMatmul {
  Tensor a, w, out;
  LinearAsMatmul(const Tensor& x, const Tensor& weight, const Tensor& out);
};
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
