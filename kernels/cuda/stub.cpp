// The CUDA backend of a build without CUDA: every use names the op and says so, and the
// hardware profile sees no CUDA device.
#include "ampgrad/backend.h"
#include "ampgrad/hw/profile.h"

namespace ampgrad {
Backend& cuda_backend(const char* op) { AG_ERROR(op, "ampgrad was built without CUDA"); }
bool built_with_cuda() { return false; }
bool cuda_emulated() { return false; }
namespace hw::detail {
std::vector<CudaDevice> query_cuda_devices() { return {}; }
}  // namespace hw::detail
}  // namespace ampgrad
