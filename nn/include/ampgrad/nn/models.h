// The models the trainer, the benchmarks and the tests share.
#pragma once

#include <memory>
#include <random>
#include <string>

#include "ampgrad/nn/layers.h"

namespace ampgrad::nn {

/// Fashion-MNIST MLP: flatten, 784-512-256-10 with ReLU.
std::shared_ptr<Sequential> make_mlp();
/// Fashion-MNIST CNN: conv(1->32, 3x3, pad 1), ReLU, maxpool 2, conv(32->64, 3x3, pad 1),
/// ReLU, maxpool 2, flatten, Linear(3136->128), ReLU, Linear(128->10).
std::shared_ptr<Sequential> make_cnn();

struct GPTConfig {
  int64_t vocab_size = 256;
  int64_t block_size = 64;
  int64_t layers = 2;
  int64_t heads = 4;
  int64_t width = 128;
  double dropout = 0.0;
};

/// Named GPT sizes, for the trainer (--preset) and the benchmarks; vocab_size and dropout
/// keep their defaults (the data set decides the vocabulary):
///   "small":   2 layers, 4 heads, width 128, context 64 (the defaults; 0.4M parameters
///              with a 96-character vocabulary)
///   "nanogpt": 6 layers, 6 heads, width 384, context 256: nanoGPT's Shakespeare
///              character model (10.7M parameters)
/// Any other name throws an ag::Error that lists these.
GPTConfig gpt_preset(std::string_view name);

/// A character-level GPT: token and position embeddings, pre-norm transformer blocks, a
/// final layer norm and a linear head. forward: int64 [B, T] -> logits [B, T, vocab].
class GPT : public Module {
 public:
  explicit GPT(GPTConfig config);
  Tensor forward(const Tensor& idx) override;
  /// Extends `prompt` by `n` tokens sampled from the softmax at `temperature` (0: the most
  /// likely token each time), with a generator seeded by `seed`; the context is the last
  /// block_size tokens.
  std::vector<int64_t> generate(std::vector<int64_t> prompt, int64_t n, double temperature = 1.0,
                                uint64_t seed = 0);
  const GPTConfig& config() const { return config_; }

 private:
  GPTConfig config_;
  std::shared_ptr<Embedding> tok_, pos_;
  std::vector<std::shared_ptr<TransformerBlock>> blocks_;
  std::shared_ptr<LayerNorm> ln_f_;
  std::shared_ptr<Linear> head_;
};

}  // namespace ampgrad::nn
