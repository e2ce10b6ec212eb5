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
/// act(x @ weight^T + bias) as one op: the activation runs in the product's epilogue where
/// the backend has one (oneDNN post-ops, cuBLASLt epilogues), and the backward reads the
/// output (ReLU) or the pre-activation (GELU) that the forward kept. Autocast treats it as
/// linear. Activation::None is plain linear.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act);
/// linear(act(linear(x, w1, b1)), w2, b2) as one op, the transformer's feed-forward block
/// (w1 [hidden, in], w2 [out, hidden]). Its backward computes act'(pre) * (g @ w2) as one
/// product with the activation's gradient and the first bias's gradient in the epilogue
/// (cuBLASLt DRELU_BGRAD / DGELU_BGRAD), which separate ops cannot do. nn::Sequential runs
/// a Linear, an activation and a Linear in a row through it.
Tensor feed_forward(const Tensor& x, const Tensor& w1, const Tensor& b1, Activation act, const Tensor& w2,
                    const Tensor& b2 = Tensor());
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
