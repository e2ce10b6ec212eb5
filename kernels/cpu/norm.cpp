// Softmax and layer norm (placeholder until the kernels land).
#include "cpu/cpu_backend.h"

namespace ampgrad::cpu {
void CpuBackend::softmax(const Tensor&, int64_t, bool, const Tensor&) { AG_ERROR("softmax", "not implemented yet"); }
void CpuBackend::softmax_backward(const Tensor&, const Tensor&, int64_t, bool, const Tensor&) {
  AG_ERROR("softmax", "not implemented yet");
}
void CpuBackend::layer_norm(const Tensor&, int64_t, const Tensor&, const Tensor&, double, const Tensor&,
                            const Tensor&, const Tensor&) {
  AG_ERROR("layer_norm", "not implemented yet");
}
void CpuBackend::layer_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                     const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  AG_ERROR("layer_norm", "not implemented yet");
}
}  // namespace ampgrad::cpu
