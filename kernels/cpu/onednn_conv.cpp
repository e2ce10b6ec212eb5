// Convolution and pooling (placeholder until the kernels land).
#include "cpu/cpu_backend.h"

namespace ampgrad::cpu {
void CpuBackend::conv2d(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&) {
  AG_ERROR("conv2d", "not implemented yet");
}
void CpuBackend::conv2d_backward_input(const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&) {
  AG_ERROR("conv2d", "not implemented yet");
}
void CpuBackend::conv2d_backward_weight(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                        const Conv2dParams&) {
  AG_ERROR("conv2d", "not implemented yet");
}
Tensor CpuBackend::max_pool2d(const Tensor&, const Tensor&, const Pool2dParams&) {
  AG_ERROR("max_pool2d", "not implemented yet");
}
void CpuBackend::max_pool2d_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                     const Pool2dParams&) {
  AG_ERROR("max_pool2d", "not implemented yet");
}
void CpuBackend::avg_pool2d(const Tensor&, const Tensor&, const Pool2dParams&) {
  AG_ERROR("avg_pool2d", "not implemented yet");
}
void CpuBackend::avg_pool2d_backward(const Tensor&, const Tensor&, const Pool2dParams&) {
  AG_ERROR("avg_pool2d", "not implemented yet");
}
}  // namespace ampgrad::cpu
