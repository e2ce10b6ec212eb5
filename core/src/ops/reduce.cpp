// Reductions (placeholder until the frontend lands).
#include "ampgrad/ops/reduce.h"

namespace ampgrad {
Tensor sum(const Tensor&) { AG_ERROR("sum", "not implemented yet"); }
Tensor sum(const Tensor&, const std::vector<int64_t>&, bool) { AG_ERROR("sum", "not implemented yet"); }
Tensor mean(const Tensor&) { AG_ERROR("mean", "not implemented yet"); }
Tensor mean(const Tensor&, const std::vector<int64_t>&, bool) { AG_ERROR("mean", "not implemented yet"); }
}  // namespace ampgrad
