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
void CudaBackend::reduce(ReduceOp op, const Tensor& x, const Shape& dims, const Tensor& out, ReduceParams p) { Backend::reduce(op, x, dims, out, p); }
void CudaBackend::max_min_dim(bool is_max, const Tensor& x, int64_t dim, const Tensor& values, const Tensor& indices) { Backend::max_min_dim(is_max, x, dim, values, indices); }
void CudaBackend::uniform(const Tensor& out, double low, double high, uint64_t seed, uint64_t offset) { Backend::uniform(out, low, high, seed, offset); }
void CudaBackend::normal(const Tensor& out, double mean, double std, uint64_t seed, uint64_t offset) { Backend::normal(out, mean, std, seed, offset); }
void CudaBackend::index_select(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) { Backend::index_select(x, dim, index, out); }
void CudaBackend::index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) { Backend::index_add(out, dim, index, src); }
void CudaBackend::gather(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) { Backend::gather(x, dim, index, out); }
void CudaBackend::scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) { Backend::scatter_add(out, dim, index, src); }
void CudaBackend::softmax(const Tensor& x, int64_t dim, bool log, const Tensor& out) { Backend::softmax(x, dim, log, out); }
void CudaBackend::softmax_backward(const Tensor& grad_out, const Tensor& y, int64_t dim, bool log, const Tensor& grad_in) { Backend::softmax_backward(grad_out, y, dim, log, grad_in); }
void CudaBackend::layer_norm(const Tensor& x, int64_t inner, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y, const Tensor& mean, const Tensor& rstd) { Backend::layer_norm(x, inner, weight, bias, eps, y, mean, rstd); }
void CudaBackend::layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight, const Tensor& grad_in, const Tensor& grad_w, const Tensor& grad_b) { Backend::layer_norm_backward(grad_out, x, mean, rstd, weight, grad_in, grad_w, grad_b); }

}  // namespace ampgrad::cuda
