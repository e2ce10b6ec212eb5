// Kernel entries the CUDA backend does not implement yet: each forwards to Backend's
// default, which throws "[op] not implemented on cuda". A family's file takes its entries
// out of here as it implements them; the harness (tests/cuda) fails for any left.
#include "cuda/cuda_backend.h"

namespace ampgrad::cuda {

void CudaBackend::copy(const Tensor& src, const Tensor& dst) { Backend::copy(src, dst); }
void CudaBackend::fill(const Tensor& dst, double value) { Backend::fill(dst, value); }
void CudaBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out, UnaryParams p) { Backend::unary(op, x, out, p); }
void CudaBackend::binary(BinaryOp op, const Operand& a, const Operand& b, const Tensor& out) { Backend::binary(op, a, b, out); }
void CudaBackend::compare(CompareOp op, const Operand& a, const Operand& b, const Tensor& out) { Backend::compare(op, a, b, out); }
void CudaBackend::where(const Tensor& cond, const Operand& a, const Operand& b, const Tensor& out) { Backend::where(cond, a, b, out); }
void CudaBackend::uniform(const Tensor& out, double low, double high, uint64_t seed, uint64_t offset) { Backend::uniform(out, low, high, seed, offset); }
void CudaBackend::normal(const Tensor& out, double mean, double std, uint64_t seed, uint64_t offset) { Backend::normal(out, mean, std, seed, offset); }
void CudaBackend::index_select(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) { Backend::index_select(x, dim, index, out); }
void CudaBackend::index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) { Backend::index_add(out, dim, index, src); }
void CudaBackend::gather(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) { Backend::gather(x, dim, index, out); }
void CudaBackend::scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) { Backend::scatter_add(out, dim, index, src); }
void CudaBackend::matmul(const Tensor& a, const Tensor& w, const Tensor& out) { Backend::matmul(a, w, out); }
void CudaBackend::linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) { Backend::linear(x, weight, bias, out); }
void CudaBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out, const Conv2dParams& p) { Backend::conv2d(x, w, bias, out, p); }
void CudaBackend::conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Tensor& grad_in, const Conv2dParams& p) { Backend::conv2d_backward_input(grad_out, w, grad_in, p); }
void CudaBackend::conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Tensor& grad_w, const Tensor& grad_bias, const Conv2dParams& p) { Backend::conv2d_backward_weight(grad_out, x, grad_w, grad_bias, p); }
Tensor CudaBackend::max_pool2d(const Tensor& x, const Tensor& out, const Pool2dParams& p) { return Backend::max_pool2d(x, out, p); }
void CudaBackend::max_pool2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& saved, const Tensor& grad_in, const Pool2dParams& p) { Backend::max_pool2d_backward(grad_out, x, saved, grad_in, p); }
void CudaBackend::avg_pool2d(const Tensor& x, const Tensor& out, const Pool2dParams& p) { Backend::avg_pool2d(x, out, p); }
void CudaBackend::avg_pool2d_backward(const Tensor& grad_out, const Tensor& grad_in, const Pool2dParams& p) { Backend::avg_pool2d_backward(grad_out, grad_in, p); }
void CudaBackend::sgd_step(const OptimizerLists& lists, const SgdParams& p) { Backend::sgd_step(lists, p); }
void CudaBackend::adam_step(const OptimizerLists& lists, const AdamParams& p) { Backend::adam_step(lists, p); }
void CudaBackend::scale_and_check(const TensorList& xs, const Tensor& factor, const Tensor& found_inf) { Backend::scale_and_check(xs, factor, found_inf); }
void CudaBackend::sum_of_squares(const TensorList& xs, const Tensor& out) { Backend::sum_of_squares(xs, out); }
void CudaBackend::update_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf, const ScaleUpdateRule& rule) { Backend::update_scale(scale, growth_tracker, found_inf, rule); }

}  // namespace ampgrad::cuda
