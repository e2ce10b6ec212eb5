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
// conv2d_block is Backend's composition of the three entries above (no blocked layouts here).
}  // namespace ampgrad::cpu
