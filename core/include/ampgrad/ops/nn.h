// Neural-network ops: matrix products, normalisation, embedding, dropout, convolution and
// pooling (NCHW). Products accumulate in float32 for float16/bfloat16 inputs.
#pragma once

#include <vector>

#include "ampgrad/backend.h"
#include "ampgrad/tensor.h"

namespace ampgrad {

/// torch.matmul semantics: 1-D to N-D with broadcasting of the batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);
/// x @ weight^T + bias; weight [out, in], bias [out] or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
/// Normalises over the trailing dims given by normalized_shape.
Tensor layer_norm(const Tensor& x, const std::vector<int64_t>& normalized_shape,
                  const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                  double eps = 1e-5);
/// Rows of weight [num, dim] picked by int64 indices.
Tensor embedding(const Tensor& indices, const Tensor& weight);
/// Zeroes elements with probability p and scales the rest by 1/(1-p) when training.
Tensor dropout(const Tensor& x, double p, bool training = true);
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              std::vector<int64_t> stride = {1, 1}, std::vector<int64_t> padding = {0, 0},
              std::vector<int64_t> dilation = {1, 1}, int64_t groups = 1);
Tensor max_pool2d(const Tensor& x, std::vector<int64_t> kernel_size,
                  std::vector<int64_t> stride = {}, std::vector<int64_t> padding = {0, 0},
                  std::vector<int64_t> dilation = {1, 1}, bool ceil_mode = false);
Tensor avg_pool2d(const Tensor& x, std::vector<int64_t> kernel_size,
                  std::vector<int64_t> stride = {}, std::vector<int64_t> padding = {0, 0},
                  bool ceil_mode = false, bool count_include_pad = true);

}  // namespace ampgrad
