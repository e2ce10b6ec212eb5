// Reductions over any set of dims (negative dims count from the end; an empty list means
// all dims), with keepdim. Floating inputs accumulate in float32 (float64 for float64),
// whatever their storage dtype; the result has the input's dtype.
#pragma once

#include <utility>
#include <vector>

#include "ampgrad/tensor.h"

namespace ampgrad {

Tensor sum(const Tensor& x);
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
/// Variance with Bessel's correction by default (correction = 1), like PyTorch.
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1,
           bool keepdim = false);
Tensor std(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1,
           bool keepdim = false);
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// Max over all elements.
Tensor max(const Tensor& x);
Tensor min(const Tensor& x);
/// Max along dim: (values, int64 indices of the first maximum).
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
/// p-norm, (sum |x|^p)^(1/p); p = 2 by default.
Tensor norm(const Tensor& x, double p = 2, const std::vector<int64_t>& dims = {},
            bool keepdim = false);

}  // namespace ampgrad
