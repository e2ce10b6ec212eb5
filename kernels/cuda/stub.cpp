// The CUDA backend of a build without CUDA: every use names the op and says so.
#include "ampgrad/backend.h"

namespace ampgrad {
Backend& cuda_backend(const char* op) { AG_ERROR(op, "ampgrad was built without CUDA"); }
bool built_with_cuda() { return false; }
}  // namespace ampgrad
