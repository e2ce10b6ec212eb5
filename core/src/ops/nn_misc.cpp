// Embedding and dropout, composed of other ops (their backward comes from those ops).
//
// embedding is index_select on the flattened indices, reshaped to indices.shape + [dim];
// its gradient is index_select's (index_add of the rows). dropout multiplies by a mask
// drawn from the seeded generator and already scaled by 1/(1-p), so the saved mask is all
// backward needs; eval mode and p = 0 return the input itself.
#include "ampgrad/factories.h"
#include "ampgrad/ops/elementwise.h"
#include "ampgrad/ops/nn.h"
#include "ampgrad/ops/shape.h"
#include "internal.h"

namespace ampgrad {

Tensor embedding(const Tensor& indices, const Tensor& weight) {
  detail::check_defined(indices, op::embedding, "indices");
  detail::check_defined(weight, op::embedding, "weight");
  detail::check_same_device(indices, weight, op::embedding);
  AG_CHECK(indices.dtype() == kInt64 || indices.dtype() == kInt32, op::embedding,
           "indices must be int64 or int32, got ", dtype_name(indices.dtype()));
  AG_CHECK(weight.dim() == 2, op::embedding, "weight must be 2-D [num_embeddings, embedding_dim], got shape ",
           weight.sizes());
  const int64_t rows = weight.size(0);
  const Tensor flat = detail::contiguous_raw(detail::cast_raw(indices, kInt64)).reshape({indices.numel()});
  if (flat.device().is_cpu()) {
    const int64_t* ip = flat.data_ptr<int64_t>();
    for (int64_t i = 0; i < flat.numel(); ++i)
      AG_CHECK(ip[i] >= 0 && ip[i] < rows, op::embedding, "index ", ip[i], " is out of range for an embedding of ",
               rows, " rows (weight shape ", weight.sizes(), ")");
  }
  std::vector<int64_t> shape = indices.sizes().vec();
  shape.push_back(weight.size(1));
  return reshape(index_select(weight, 0, flat), shape);
}

Tensor dropout(const Tensor& x, double p, bool training) {
  detail::check_defined(x, op::dropout, "input");
  AG_CHECK(p >= 0 && p <= 1, op::dropout, "p must be in [0, 1], got ", p);
  if (!training || p == 0) return x;
  AG_CHECK(x.is_floating_point(), op::dropout, "expected a floating input, got ", dtype_name(x.dtype()));
  if (p == 1) return mul(x, 0.0);  // all dropped; keeps the graph, gradient zero
  Tensor mask;
  {
    NoGradGuard no_grad;
    mask = mul(bernoulli(x.sizes().vec(), 1 - p, x.options()), 1.0 / (1.0 - p));
  }
  return mul(x, mask);
}

}  // namespace ampgrad
