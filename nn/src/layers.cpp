#include "ampgrad/nn/layers.h"

#include <cmath>
#include <typeinfo>

#include "ampgrad/autocast/autocast.h"
#include "ampgrad/factories.h"
#include "ampgrad/nn/init.h"
#include "ampgrad/ops/elementwise.h"
#include "ampgrad/ops/nn.h"
#include "ampgrad/ops/shape.h"

namespace ampgrad::nn {

namespace {
// PyTorch's default for Linear and Conv2d: kaiming_uniform(a = sqrt(5)) for the weight and
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the bias.
void default_init(const Tensor& weight, const Tensor& bias) {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const double bound = 1.0 / std::sqrt(double(init::fan_in_and_fan_out(weight).first));
    init::uniform_(bias, -bound, bound);
  }
}
}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias) : Module("Linear") {
  AG_CHECK(in_features > 0 && out_features > 0, "Linear", "features must be positive, got ",
           in_features, " and ", out_features);
  weight = register_parameter("weight", empty({out_features, in_features}));
  if (with_bias) bias = register_parameter("bias", empty({out_features}));
  default_init(weight, bias);
}

Tensor Linear::forward(const Tensor& x) { return linear(x, weight, bias); }

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t k, Conv2dOptions opts)
    : Module("Conv2d"), options(opts) {
  AG_CHECK(in_channels > 0 && out_channels > 0 && k > 0 && opts.groups > 0, "Conv2d",
           "channels, kernel size and groups must be positive");
  AG_CHECK(in_channels % opts.groups == 0 && out_channels % opts.groups == 0, "Conv2d",
           "channels ", in_channels, " -> ", out_channels, " are not divisible by groups ", opts.groups);
  weight = register_parameter("weight", empty({out_channels, in_channels / opts.groups, k, k}));
  if (opts.bias) bias = register_parameter("bias", empty({out_channels}));
  default_init(weight, bias);
}

Tensor Conv2d::forward(const Tensor& x) {
  const auto& o = options;
  return conv2d(x, weight, bias, {o.stride, o.stride}, {o.padding, o.padding},
                {o.dilation, o.dilation}, o.groups);
}

MaxPool2d::MaxPool2d(int64_t k, int64_t s, int64_t p)
    : Module("MaxPool2d"), kernel_size(k), stride(s ? s : k), padding(p) {}
Tensor MaxPool2d::forward(const Tensor& x) {
  return max_pool2d(x, {kernel_size, kernel_size}, {stride, stride}, {padding, padding});
}

AvgPool2d::AvgPool2d(int64_t k, int64_t s, int64_t p)
    : Module("AvgPool2d"), kernel_size(k), stride(s ? s : k), padding(p) {}
Tensor AvgPool2d::forward(const Tensor& x) {
  return avg_pool2d(x, {kernel_size, kernel_size}, {stride, stride}, {padding, padding});
}

Flatten::Flatten(int64_t s, int64_t e) : Module("Flatten"), start_dim(s), end_dim(e) {}
Tensor Flatten::forward(const Tensor& x) { return flatten(x, start_dim, end_dim); }

Tensor ReLU::forward(const Tensor& x) { return relu(x); }
GELU::GELU(std::string a) : Module("GELU"), approximate(std::move(a)) {}
Tensor GELU::forward(const Tensor& x) { return gelu(x, approximate); }
Tensor SiLU::forward(const Tensor& x) { return silu(x); }
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }

Dropout::Dropout(double prob) : Module("Dropout"), p(prob) {
  AG_CHECK(p >= 0 && p <= 1, "Dropout", "probability must be in [0, 1], got ", p);
}
Tensor Dropout::forward(const Tensor& x) { return dropout(x, p, is_training()); }

LayerNorm::LayerNorm(std::vector<int64_t> shape, double e, bool affine)
    : Module("LayerNorm"), normalized_shape(std::move(shape)), eps(e) {
  if (affine) {
    weight = register_parameter("weight", ones(normalized_shape));
    bias = register_parameter("bias", zeros(normalized_shape));
  }
}
Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, normalized_shape, weight, bias, eps); }

Tensor norm_for_product(LayerNorm& ln, const Tensor& x, OpName op) {
  const DeviceType type = x.device().type;
  const auto f32 = [](const Tensor& t) { return !t.defined() || t.dtype() == kFloat32; };
  if (typeid(ln) == typeid(LayerNorm) && autocast::is_enabled(type) &&
      autocast::policy(op, type) == CastPolicy::LowerPrecision && x.dtype() == kFloat32 && f32(ln.weight) &&
      f32(ln.bias))
    return layer_norm_to(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps, autocast::get_dtype(type));
  return ln.forward(x);
}

Embedding::Embedding(int64_t num, int64_t dim) : Module("Embedding") {
  AG_CHECK(num > 0 && dim > 0, "Embedding", "sizes must be positive, got ", num, " and ", dim);
  weight = register_parameter("weight", empty({num, dim}));
  init::normal_(weight);
}
Tensor Embedding::forward(const Tensor& x) { return embedding(x, weight); }

CausalSelfAttention::CausalSelfAttention(int64_t e, int64_t h, int64_t b, double drop)
    : Module("CausalSelfAttention"), embed_dim(e), num_heads(h), block_size(b) {
  AG_CHECK(h > 0 && e % h == 0, "CausalSelfAttention", "embed_dim ", e,
           " is not divisible by num_heads ", h);
  qkv = register_module("qkv", std::make_shared<Linear>(e, 3 * e));
  proj = register_module("proj", std::make_shared<Linear>(e, e));
  attn_drop = register_module("attn_drop", std::make_shared<Dropout>(drop));
  resid_drop = register_module("resid_drop", std::make_shared<Dropout>(drop));
  Tensor rows = arange(b).unsqueeze(1), cols = arange(b).unsqueeze(0);
  mask = register_buffer("mask", ge(rows, cols));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  AG_CHECK(x.dim() == 3 && x.size(2) == embed_dim, "CausalSelfAttention", "expected input [batch, time, ",
           embed_dim, "], got shape ", x.sizes());
  const int64_t B = x.size(0), T = x.size(1), C = embed_dim, H = num_heads, D = C / H;
  AG_CHECK(T <= block_size, "CausalSelfAttention", "sequence length ", T, " exceeds block_size ", block_size);
  auto parts = qkv->forward(x).split(C, 2);
  auto heads = [&](const Tensor& t) { return t.view({B, T, H, D}).transpose(1, 2); };  // [B, H, T, D]
  Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  // One fused op with the causal rule built in (the `mask` buffer is kept only so that
  // state_dict keys and checkpoints stay as they were); attn_drop's probability drops
  // attention probabilities in training mode, as the separate dropout op did.
  AttentionOptions opts;
  opts.is_causal = true;
  opts.dropout_p = is_training() ? attn_drop->p : 0.0;
  Tensor y = scaled_dot_product_attention(q, k, v, opts);
  y = y.transpose(1, 2).reshape({B, T, C});  // a view: y is laid out [B, T, H, D]
  return resid_drop->forward(proj->forward(y));
}

TransformerBlock::TransformerBlock(int64_t e, int64_t h, int64_t b, double drop, int64_t ratio)
    : Module("TransformerBlock") {
  ln1 = register_module("ln1", std::make_shared<LayerNorm>(std::vector<int64_t>{e}));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(e, h, b, drop));
  ln2 = register_module("ln2", std::make_shared<LayerNorm>(std::vector<int64_t>{e}));
  mlp = register_module("mlp", std::make_shared<Sequential>(std::vector<ModulePtr>{
                                   std::make_shared<Linear>(e, ratio * e), std::make_shared<GELU>(),
                                   std::make_shared<Linear>(ratio * e, e), std::make_shared<Dropout>(drop)}));
}

Tensor TransformerBlock::forward(const Tensor& x) {
  // Both norms feed a product (attention's qkv, the MLP's first linear).
  Tensor h = x + attn->forward(norm_for_product(*ln1, x, op::linear));
  return h + mlp->forward(norm_for_product(*ln2, h, mlp->fusion() ? op::feed_forward : op::linear));
}

}  // namespace ampgrad::nn
