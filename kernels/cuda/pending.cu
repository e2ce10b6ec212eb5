// Kernel entries the CUDA backend does not implement yet: each forwards to Backend's
// default, which throws "[op] not implemented on cuda". A family's file takes its entries
// out of here as it implements them; the harness (tests/cuda) fails for any left.
#include "cuda/cuda_backend.h"

namespace ampgrad::cuda {

void CudaBackend::reduce(ReduceOp op, const Tensor& x, const Shape& dims, const Tensor& out, ReduceParams p) { Backend::reduce(op, x, dims, out, p); }
void CudaBackend::max_min_dim(bool is_max, const Tensor& x, int64_t dim, const Tensor& values, const Tensor& indices) { Backend::max_min_dim(is_max, x, dim, values, indices); }
void CudaBackend::matmul(const Tensor& a, const Tensor& w, const Tensor& out) { Backend::matmul(a, w, out); }
void CudaBackend::linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) { Backend::linear(x, weight, bias, out); }
void CudaBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out, const Conv2dParams& p) { Backend::conv2d(x, w, bias, out, p); }
void CudaBackend::conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Tensor& grad_in, const Conv2dParams& p) { Backend::conv2d_backward_input(grad_out, w, grad_in, p); }
void CudaBackend::conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Tensor& grad_w, const Tensor& grad_bias, const Conv2dParams& p) { Backend::conv2d_backward_weight(grad_out, x, grad_w, grad_bias, p); }
Tensor CudaBackend::max_pool2d(const Tensor& x, const Tensor& out, const Pool2dParams& p) { return Backend::max_pool2d(x, out, p); }
void CudaBackend::max_pool2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& saved, const Tensor& grad_in, const Pool2dParams& p) { Backend::max_pool2d_backward(grad_out, x, saved, grad_in, p); }
void CudaBackend::avg_pool2d(const Tensor& x, const Tensor& out, const Pool2dParams& p) { Backend::avg_pool2d(x, out, p); }
void CudaBackend::avg_pool2d_backward(const Tensor& grad_out, const Tensor& grad_in, const Pool2dParams& p) { Backend::avg_pool2d_backward(grad_out, grad_in, p); }
void CudaBackend::softmax(const Tensor& x, int64_t dim, bool log, const Tensor& out) { Backend::softmax(x, dim, log, out); }
void CudaBackend::softmax_backward(const Tensor& grad_out, const Tensor& y, int64_t dim, bool log, const Tensor& grad_in) { Backend::softmax_backward(grad_out, y, dim, log, grad_in); }
void CudaBackend::layer_norm(const Tensor& x, int64_t inner, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y, const Tensor& mean, const Tensor& rstd) { Backend::layer_norm(x, inner, weight, bias, eps, y, mean, rstd); }
void CudaBackend::layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight, const Tensor& grad_in, const Tensor& grad_w, const Tensor& grad_b) { Backend::layer_norm_backward(grad_out, x, mean, rstd, weight, grad_in, grad_w, grad_b); }
void CudaBackend::sgd_step(const OptimizerLists& lists, const SgdParams& p) { Backend::sgd_step(lists, p); }
void CudaBackend::adam_step(const OptimizerLists& lists, const AdamParams& p) { Backend::adam_step(lists, p); }
void CudaBackend::scale_and_check(const TensorList& xs, const Tensor& factor, const Tensor& found_inf) { Backend::scale_and_check(xs, factor, found_inf); }
void CudaBackend::sum_of_squares(const TensorList& xs, const Tensor& out) { Backend::sum_of_squares(xs, out); }
void CudaBackend::update_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf, const ScaleUpdateRule& rule) { Backend::update_scale(scale, growth_tracker, found_inf, rule); }

}  // namespace ampgrad::cuda
