// Reductions (placeholder until the reduction kernels land).
#include "cpu/cpu_backend.h"

namespace ampgrad::cpu {
void CpuBackend::reduce(ReduceOp op, const Tensor&, const Shape&, const Tensor&, ReduceParams) {
  AG_ERROR(op_name(op), "not implemented yet");
}
void CpuBackend::max_min_dim(bool, const Tensor&, int64_t, const Tensor&, const Tensor&) {
  AG_ERROR("max", "not implemented yet");
}
}  // namespace ampgrad::cpu
