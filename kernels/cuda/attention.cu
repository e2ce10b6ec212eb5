// Scaled dot-product attention on CUDA: no kernel of its own yet. Both entries run
// Backend's composed form (core/src/backend.cpp), which materialises the [N, Tq, Tk] scores
// and probabilities with this backend's matmul (cuBLASLt), elementwise, reduce and
// softmax_backward kernels, and draws the same dropout mask as the CPU's fused kernel.
//
// Reference: kernels/reference/include/ampgrad/reference/attention.h (float64, the specification).
#include "cuda/cuda_backend.h"

namespace ampgrad::cuda {

void CudaBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                            const AttentionParams& p, const Tensor& out, const Tensor& lse) {
  attention_composed(q, k, v, mask, p, out, lse);
}

void CudaBackend::attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& mask, const Tensor& out, const Tensor& lse,
                                     const AttentionParams& p, const Tensor& grad_q, const Tensor& grad_k,
                                     const Tensor& grad_v) {
  attention_backward_composed(grad_out, q, k, v, mask, out, lse, p, grad_q, grad_k, grad_v);
}

}  // namespace ampgrad::cuda
