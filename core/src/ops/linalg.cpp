// Matrix products (placeholder until the frontend lands).
#include "ampgrad/ops/nn.h"

namespace ampgrad {
Tensor matmul(const Tensor&, const Tensor&) { AG_ERROR("matmul", "not implemented yet"); }
}  // namespace ampgrad
