// Shape ops. view, reshape (when possible), flatten, transpose, permute, narrow, select,
// expand, squeeze and unsqueeze return views that share storage; the rest copy.
#pragma once

#include <vector>

#include "ampgrad/tensor.h"

namespace ampgrad {

/// Normalises a possibly negative dim against a rank; throws naming `op` if out of range.
int64_t wrap_dim(int64_t dim, int64_t rank, const char* op);

Tensor view(const Tensor& x, const std::vector<int64_t>& shape);
Tensor reshape(const Tensor& x, const std::vector<int64_t>& shape);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor select(const Tensor& x, int64_t dim, int64_t index);
Tensor expand(const Tensor& x, const std::vector<int64_t>& shape);
Tensor squeeze(const Tensor& x);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor contiguous(const Tensor& x);
Tensor clone(const Tensor& x);

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
/// Indices (int64 or int32) lie in [0, size of dim), as in PyTorch: a negative index is an
/// error, not a count from the end.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);

}  // namespace ampgrad
