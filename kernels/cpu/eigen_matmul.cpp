// Matrix products (placeholder until the kernels land).
#include "cpu/cpu_backend.h"

namespace ampgrad::cpu {
void CpuBackend::matmul(const Tensor&, const Tensor&, const Tensor&) { AG_ERROR("matmul", "not implemented yet"); }
void CpuBackend::linear(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  AG_ERROR("linear", "not implemented yet");
}
}  // namespace ampgrad::cpu
