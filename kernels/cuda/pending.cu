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


}  // namespace ampgrad::cuda
