// Convolution and pooling with Eigen alone (the AMPGRAD_ONEDNN=OFF build).
//
// Convolution is im2col + Eigen GEMM per image and group (conv_common.cpp, shared with the
// oneDNN build's float64 path); pooling uses the shared loops that follow PyTorch's window
// rules. max_pool2d saves the int64 index of each maximum for its backward.
#include "cpu/conv_common.h"
#include "cpu/cpu_backend.h"

namespace ampgrad::cpu {
void CpuBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                        const Conv2dParams& p) {
  eigen_conv2d(x, w, bias, out, p);
}
void CpuBackend::conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Tensor& grad_in,
                                       const Conv2dParams& p) {
  eigen_conv2d_backward_input(grad_out, w, grad_in, p);
}
void CpuBackend::conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Tensor& grad_w,
                                        const Tensor& grad_bias, const Conv2dParams& p) {
  eigen_conv2d_backward_weight(grad_out, x, grad_w, grad_bias, p);
}
Tensor CpuBackend::max_pool2d(const Tensor& x, const Tensor& out, const Pool2dParams& p) {
  return pool_max_forward(x, out, p);
}
void CpuBackend::max_pool2d_backward(const Tensor& grad_out, const Tensor&, const Tensor& saved,
                                     const Tensor& grad_in, const Pool2dParams&) {
  pool_max_backward(grad_out, saved, grad_in);
}
void CpuBackend::avg_pool2d(const Tensor& x, const Tensor& out, const Pool2dParams& p) {
  pool_avg_forward(x, out, p);
}
void CpuBackend::avg_pool2d_backward(const Tensor& grad_out, const Tensor& grad_in, const Pool2dParams& p) {
  pool_avg_backward(grad_out, grad_in, p);
}
// No blocked layouts here: the block is the three ops.
TensorList CpuBackend::conv2d_block(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                                    const Conv2dParams& p, Activation act, const Pool2dParams& pool) {
  return conv2d_block_composed(x, w, bias, out, p, act, pool);
}
void CpuBackend::conv2d_block_backward(const Tensor& g, const Tensor& x, const Tensor& w, const TensorList& saved,
                                       const Conv2dParams& p, Activation act, const Pool2dParams& pool,
                                       const Tensor& grad_x, const Tensor& grad_w, const Tensor& grad_bias) {
  conv2d_block_backward_composed(g, x, w, saved, p, act, pool, grad_x, grad_w, grad_bias);
}
}  // namespace ampgrad::cpu
