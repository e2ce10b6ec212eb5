// Layers, with PyTorch's default initialisations drawn from the seeded generator
// (ag::manual_seed makes a model's initial weights reproducible).
//
// Linear and Conv2d: weight ~ kaiming-uniform with a = sqrt(5), i.e. U(-1/sqrt(fan_in),
// 1/sqrt(fan_in)), and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)). Embedding: N(0, 1).
// LayerNorm: weight 1, bias 0.
#pragma once

#include <string>
#include <vector>

#include "ampgrad/op_ids.h"
#include "ampgrad/nn/module.h"

namespace ampgrad::nn {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  Tensor weight;  // [out, in]
  Tensor bias;    // [out] or undefined
};

struct Conv2dOptions {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};

class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, Conv2dOptions opts = {});
  Tensor forward(const Tensor& x) override;
  Tensor weight;  // [out, in / groups, k, k]
  Tensor bias;
  Conv2dOptions options;
};

class MaxPool2d : public Module {
 public:
  /// stride defaults to kernel_size.
  explicit MaxPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0);
  Tensor forward(const Tensor& x) override;
  int64_t kernel_size, stride, padding;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0);
  Tensor forward(const Tensor& x) override;
  int64_t kernel_size, stride, padding;
};

class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1);
  Tensor forward(const Tensor& x) override;
  int64_t start_dim, end_dim;
};

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override;
};

class GELU : public Module {
 public:
  /// approximate: "none" (erf) or "tanh".
  explicit GELU(std::string approximate = "none");
  Tensor forward(const Tensor& x) override;
  std::string approximate;
};

class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor forward(const Tensor& x) override;
};

class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor forward(const Tensor& x) override;
};

class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  double p;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::vector<int64_t> normalized_shape, double eps = 1e-5,
                     bool elementwise_affine = true);
  Tensor forward(const Tensor& x) override;
  std::vector<int64_t> normalized_shape;
  double eps;
  Tensor weight, bias;
};

/// ln(x) for a product op ("linear", "feed_forward") that runs on it next. Under autocast,
/// where that op's row on x's device is lower precision and x and ln's parameters are
/// float32, the norm writes the product's 16-bit input itself (layer_norm_to: the same bits
/// and gradients as ln's float32 output cast by the product, one pass fewer each way).
/// Anything else, a class derived from LayerNorm included, is ln.forward(x).
Tensor norm_for_product(LayerNorm& ln, const Tensor& x, OpName op);

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  /// x: int64 indices of any shape; returns [..., embedding_dim].
  Tensor forward(const Tensor& x) override;
  Tensor weight;  // [num, dim]
};

/// Multi-head self-attention with a causal mask (each position sees itself and the past),
/// through the fused scaled_dot_product_attention with is_causal; `dropout` drops attention
/// probabilities there (training mode only) and the projection's output (resid_drop).
/// Input and output [batch, time, embed_dim]; time <= block_size.
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t embed_dim, int64_t num_heads, int64_t block_size, double dropout = 0.0);
  Tensor forward(const Tensor& x) override;
  int64_t embed_dim, num_heads, block_size;
  std::shared_ptr<Linear> qkv, proj;
  std::shared_ptr<Dropout> attn_drop, resid_drop;
  // [block_size, block_size] bool buffer, true where attention is allowed. forward no longer
  // reads it (scaled_dot_product_attention applies the causal rule itself); it stays a
  // buffer so that state_dict keys, and the checkpoints written with them, are unchanged.
  Tensor mask;
};

/// A GPT-style pre-norm block: x + attn(ln1(x)), then x + mlp(ln2(x)) with a GELU MLP of
/// width mlp_ratio * embed_dim.
class TransformerBlock : public Module {
 public:
  TransformerBlock(int64_t embed_dim, int64_t num_heads, int64_t block_size, double dropout = 0.0,
                   int64_t mlp_ratio = 4);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<LayerNorm> ln1, ln2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<Sequential> mlp;
};

}  // namespace ampgrad::nn
