// Neural-network ops: matrix products, normalisation, embedding, dropout, convolution and
// pooling (NCHW). Products accumulate in float32 for float16/bfloat16 inputs.
#pragma once

#include <optional>
#include <vector>

#include "ampgrad/backend.h"
#include "ampgrad/tensor.h"

namespace ampgrad {

/// torch.matmul semantics: 1-D to N-D with broadcasting of the batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);
/// x @ weight^T + bias; weight [out, in], bias [out] or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
/// act(x @ weight^T + bias) as one op: the activation runs in the product's epilogue where
/// the backend has one (oneDNN post-ops, cuBLASLt epilogues), and the backward reads what
/// the forward kept: the output (ReLU), or for GELU the pre-activation (CUDA) or its slope
/// (the CPU). Autocast treats it as linear. Activation::None is plain linear.
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
/// layer_norm(x, ...) computed in float32 and then .to(out_dtype) (float16 or bfloat16):
/// what a layer norm feeding a 16-bit product under autocast does (its row is float32, the
/// product casts its input). Where the backend can (Backend::layer_norm_narrows) it is one
/// pass each way, the norm writing the 16-bit output and its backward reading the 16-bit
/// gradient; the values and gradients are those of the two ops bit for bit. x, weight and
/// bias are cast to float32 first, as autocast's float32 row casts them; float64 stays.
Tensor layer_norm_to(const Tensor& x, const std::vector<int64_t>& normalized_shape, const Tensor& weight,
                     const Tensor& bias, double eps, DType out_dtype);
/// Rows of weight [num, dim] picked by int64 indices.
Tensor embedding(const Tensor& indices, const Tensor& weight);
/// Zeroes elements with probability p and scales the rest by 1/(1-p) when training.
Tensor dropout(const Tensor& x, double p, bool training = true);
/// The options of scaled_dot_product_attention, as in PyTorch's F.scaled_dot_product_attention;
/// written with designated initializers: `{.is_causal = true, .dropout_p = 0.1}`.
struct AttentionOptions {
  /// Query i sees key j only when j <= i (a lower-triangular mask aligned at the top left,
  /// as PyTorch's is_causal). An error together with attn_mask.
  bool is_causal = false;
  /// Undefined, or broadcastable to [batch..., Tq, Tk]: bool (true: the query attends to
  /// the key) or floating (added to the scores; -inf hides a key). It gets no gradient:
  /// a mask that requires grad is refused while grad mode is on.
  Tensor attn_mask;
  /// Probability in [0, 1) of zeroing each attention probability (the rest are scaled by
  /// 1 / (1 - dropout_p)). Applied whenever it is above 0, like PyTorch's functional form:
  /// a module passes 0 in eval mode.
  double dropout_p = 0.0;
  /// The factor of q k^T; 1 / sqrt(D) when unset (1 for D = 0). Must be finite.
  std::optional<double> scale;
};

/// softmax(q k^T * scale + mask) v over the last two dims: q [batch..., Tq, D],
/// k [batch..., Tk, D], v [batch..., Tk, Dv] of one floating dtype and one batch shape
/// (any number of batch dims, no broadcasting between them), giving [batch..., Tq, Dv].
/// With two or more batch dims the output is laid out as [batch'..., Tq, H, Dv] in memory
/// (H the last batch dim, the heads), like PyTorch's CPU flash attention: not contiguous
/// for H > 1, and y.transpose(-3, -2).reshape(..., H * Dv) merges the heads without a copy.
/// One op with one backward node, computed in float32 (float64 for float64 inputs). On the
/// CPU it is one fused kernel each way (kernels/cpu/attention.cpp): tiles of keys with an
/// online softmax, so no [Tq, Tk] matrix is materialised; it saves q, k, v, the output and
/// a float32 log-sum-exp per query, and its backward recomputes the probabilities. CUDA
/// runs the composed form (Backend::attention_composed).
/// A query that sees no key at all (its mask row is all false or -inf) gets output 0 and
/// gradient 0 (PyTorch's math form gives NaN there). Dropout draws from the seeded
/// generator (manual_seed) once per call, N * Tq * Tk counters; the backward regenerates
/// the same mask, and the CPU kernel and the composed form drop the same elements.
/// Autocast runs it in the lower precision (float16/bfloat16), as PyTorch does.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& opts = {});
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              std::vector<int64_t> stride = {1, 1}, std::vector<int64_t> padding = {0, 0},
              std::vector<int64_t> dilation = {1, 1}, int64_t groups = 1);
Tensor max_pool2d(const Tensor& x, std::vector<int64_t> kernel_size,
                  std::vector<int64_t> stride = {}, std::vector<int64_t> padding = {0, 0},
                  std::vector<int64_t> dilation = {1, 1}, bool ceil_mode = false);
Tensor avg_pool2d(const Tensor& x, std::vector<int64_t> kernel_size,
                  std::vector<int64_t> stride = {}, std::vector<int64_t> padding = {0, 0},
                  bool ceil_mode = false, bool count_include_pad = true);

/// conv2d's arguments, for conv2d_block.
struct Conv2dArgs {
  std::vector<int64_t> stride = {1, 1}, padding = {0, 0}, dilation = {1, 1};
  int64_t groups = 1;
};
/// max_pool2d's arguments, for conv2d_block (stride empty: kernel_size).
struct MaxPool2dArgs {
  std::vector<int64_t> kernel_size = {2, 2}, stride = {}, padding = {0, 0}, dilation = {1, 1};
  bool ceil_mode = false;
};
/// max_pool2d(act(conv2d(x, weight, bias, conv)), pool) as one op with one backward node,
/// act None or Relu: a CNN's conv block (nn::Sequential runs Conv2d, ReLU, MaxPool2d
/// through it). Same values, gradients and errors as the three ops (errors name
/// conv2d_block), and the same autocast row as conv2d. On the CPU with oneDNN the
/// full-size activation stays in oneDNN's blocked layout from the convolution to the
/// pooling and back, so only the smaller pooled tensor and the input are reordered; where
/// the activation holds a NaN (or -inf without the ReLU), pooling takes the loops that let
/// it win its window, as max_pool2d does. Other backends compose the three.
Tensor conv2d_block(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dArgs& conv,
                    Activation act, const MaxPool2dArgs& pool = {});

}  // namespace ampgrad
