#include "ampgrad/nn/models.h"

#include <cmath>

#include "ampgrad/autograd.h"
#include "ampgrad/error.h"
#include "ampgrad/factories.h"
#include "ampgrad/ops/elementwise.h"
#include "ampgrad/ops/nn.h"
#include "ampgrad/ops/reduce.h"
#include "ampgrad/ops/shape.h"

namespace ampgrad::nn {

std::shared_ptr<Sequential> make_mlp() {
  return std::make_shared<Sequential>(std::vector<ModulePtr>{
      std::make_shared<Flatten>(), std::make_shared<Linear>(784, 512), std::make_shared<ReLU>(),
      std::make_shared<Linear>(512, 256), std::make_shared<ReLU>(), std::make_shared<Linear>(256, 10)});
}

std::shared_ptr<Sequential> make_cnn() {
  return std::make_shared<Sequential>(std::vector<ModulePtr>{
      std::make_shared<Conv2d>(1, 32, 3, Conv2dOptions{.padding = 1}), std::make_shared<ReLU>(),
      std::make_shared<MaxPool2d>(2), std::make_shared<Conv2d>(32, 64, 3, Conv2dOptions{.padding = 1}),
      std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2), std::make_shared<Flatten>(),
      std::make_shared<Linear>(3136, 128), std::make_shared<ReLU>(), std::make_shared<Linear>(128, 10)});
}

GPTConfig gpt_preset(std::string_view name) {
  if (name == "small") return GPTConfig{};
  if (name == "nanogpt") return GPTConfig{.block_size = 256, .layers = 6, .heads = 6, .width = 384};
  AG_ERROR("gpt_preset", "unknown preset '", name, "' (small, nanogpt)");
}

GPT::GPT(GPTConfig c) : Module("GPT"), config_(c) {
  AG_CHECK(c.vocab_size > 0 && c.block_size > 0 && c.layers > 0 && c.width > 0, "GPT",
           "vocab_size, block_size, layers and width must be positive");
  tok_ = register_module("tok", std::make_shared<Embedding>(c.vocab_size, c.width));
  pos_ = register_module("pos", std::make_shared<Embedding>(c.block_size, c.width));
  for (int64_t i = 0; i < c.layers; ++i)
    blocks_.push_back(register_module("block" + std::to_string(i),
                                      std::make_shared<TransformerBlock>(c.width, c.heads, c.block_size, c.dropout)));
  ln_f_ = register_module("ln_f", std::make_shared<LayerNorm>(std::vector<int64_t>{c.width}));
  head_ = register_module("head", std::make_shared<Linear>(c.width, c.vocab_size, false));
}

Tensor GPT::forward(const Tensor& idx) {
  AG_CHECK(idx.dim() == 2, "GPT", "expected token ids [batch, time], got shape ", idx.sizes());
  const int64_t T = idx.size(1);
  AG_CHECK(T <= config_.block_size, "GPT", "sequence length ", T, " exceeds block_size ", config_.block_size);
  Tensor h = tok_->forward(idx) + pos_->forward(arange(T, TensorOptions(kInt64).device(idx.device())));
  for (auto& b : blocks_) h = b->forward(h);
  return head_->forward(norm_for_product(*ln_f_, h, op::linear));
}

std::vector<int64_t> GPT::generate(std::vector<int64_t> tokens, int64_t n, double temperature, uint64_t seed) {
  AG_CHECK(!tokens.empty(), "GPT::generate", "the prompt is empty");
  AG_CHECK(n >= 0, "GPT::generate", "the number of tokens to generate must be non-negative, got ", n);
  AG_CHECK(temperature >= 0 && std::isfinite(temperature), "GPT::generate",
           "temperature must be finite and non-negative (0: greedy), got ", temperature);
  NoGradGuard ng;
  const bool was_training = is_training();
  eval();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t start = std::max<int64_t>(0, int64_t(tokens.size()) - config_.block_size);
    std::vector<int64_t> ctx(tokens.begin() + start, tokens.end());
    Tensor logits = forward(from_vector<int64_t>(ctx, {1, int64_t(ctx.size())}));
    Tensor last = logits.select(1, int64_t(ctx.size()) - 1).squeeze(0);
    if (temperature == 0) {  // greedy: the most likely token, without drawing
      tokens.push_back(argmax(last, 0).item<int64_t>());
      continue;
    }
    const auto p = softmax(last.to(kFloat64) * (1.0 / temperature), -1).to_vector<double>();
    double r = u(rng), acc = 0;
    int64_t pick = int64_t(p.size()) - 1;
    for (size_t i = 0; i < p.size(); ++i) {
      acc += p[i];
      if (r < acc) {
        pick = int64_t(i);
        break;
      }
    }
    tokens.push_back(pick);
  }
  train(was_training);
  return tokens;
}

}  // namespace ampgrad::nn
