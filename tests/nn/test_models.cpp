// The shared models of nn/models.h checked by value, not only by shape: make_cnn() against
// the same architecture composed by hand from frontend ops in float64, TransformerBlock and
// GPT against plain float64 loops (no ampgrad ops), the GPT loss's gradient against finite
// differences, and GPT::generate run past block_size against a greedy decode of our own.
#include "ampgrad/reference/attention.h"
#include "ampgrad/reference/norm.h"
#include "support/testing.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

using namespace ag;

namespace {

using Vec = std::vector<double>;
using Params = std::map<std::string, Vec>;
using Dims = std::vector<int64_t>;

// ---- plain float64 references (std::vector loops, no ampgrad ops) -------------------------

// A module's parameters by dotted name (read after module.to(kFloat64), so exact).
Params values_of(const nn::Module& m) {
  Params out;
  for (const auto& [name, p] : m.named_parameters()) out[name] = p.to_vector<double>();
  return out;
}

// [rows, in] -> [rows, out]: x W^T + b with W [out, in] (b may be null).
Vec linear_ref(const Vec& x, int64_t rows, int64_t in, int64_t out, const Vec& w, const Vec* b) {
  Vec y(size_t(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b ? (*b)[size_t(o)] : 0.0;
      for (int64_t i = 0; i < in; ++i) s += x[size_t(r * in + i)] * w[size_t(o * in + i)];
      y[size_t(r * out + o)] = s;
    }
  return y;
}

// One pre-norm block on x [B, T, C] with H heads; its parameters are p[prefix + name].
Vec block_ref(const Vec& x, int64_t B, int64_t T, int64_t C, int64_t H, const Params& p,
              const std::string& prefix) {
  auto at = [&](const std::string& n) -> const Vec& { return p.at(prefix + n); };
  const int64_t N = B * T, D = C / H;
  // causal self-attention on ln1(x); q, k, v are the three C-wide thirds of qkv's output,
  // and head h owns columns [h*D, (h+1)*D) of each
  const Vec a = ampgrad::reference::layer_norm(x, N, C, at("ln1.weight"), at("ln1.bias"), 1e-5);
  const Vec qkv = linear_ref(a, N, C, 3 * C, at("attn.qkv.weight"), &at("attn.qkv.bias"));
  auto q = [&](int64_t b, int64_t t, int64_t h, int64_t d) { return qkv[size_t((b * T + t) * 3 * C + h * D + d)]; };
  auto k = [&](int64_t b, int64_t t, int64_t h, int64_t d) { return qkv[size_t((b * T + t) * 3 * C + C + h * D + d)]; };
  auto v = [&](int64_t b, int64_t t, int64_t h, int64_t d) { return qkv[size_t((b * T + t) * 3 * C + 2 * C + h * D + d)]; };
  // each head's q, k, v as [B * H, T, D], through the float64 reference, and back
  Vec qh(size_t(N * C)), kh(size_t(N * C)), vh(size_t(N * C));
  auto head_major = [&](int64_t b, int64_t t, int64_t h, int64_t d) { return size_t(((b * H + h) * T + t) * D + d); };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          qh[head_major(b, t, h, d)] = q(b, t, h, d);
          kh[head_major(b, t, h, d)] = k(b, t, h, d);
          vh[head_major(b, t, h, d)] = v(b, t, h, d);
        }
  const Vec yh = ampgrad::reference::attention(qh, kh, vh, {B * H, T, T, D, D},
                                               {.scale = 1 / std::sqrt(double(D)), .causal = true});
  Vec y(size_t(N * C));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) y[size_t((b * T + t) * C + h * D + d)] = yh[head_major(b, t, h, d)];
  const Vec att = linear_ref(y, N, C, C, at("attn.proj.weight"), &at("attn.proj.bias"));
  Vec out(x);
  for (size_t i = 0; i < out.size(); ++i) out[i] += att[i];
  // MLP on ln2(out): Linear(C, 4C), exact GELU, Linear(4C, C)
  const Vec m = ampgrad::reference::layer_norm(out, N, C, at("ln2.weight"), at("ln2.bias"), 1e-5);
  Vec u = linear_ref(m, N, C, 4 * C, at("mlp.0.weight"), &at("mlp.0.bias"));
  for (auto& e : u) e = agt::ref_gelu(e);
  const Vec mlp = linear_ref(u, N, 4 * C, C, at("mlp.2.weight"), &at("mlp.2.bias"));
  for (size_t i = 0; i < out.size(); ++i) out[i] += mlp[i];
  return out;
}

// GPT logits [B, T, vocab] for token ids idx [B, T].
Vec gpt_ref(const std::vector<int64_t>& idx, int64_t B, int64_t T, const nn::GPTConfig& c, const Params& p) {
  const int64_t C = c.width;
  const Vec &tok = p.at("tok.weight"), &pos = p.at("pos.weight");
  Vec h(size_t(B * T * C));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < C; ++e)
        h[size_t((b * T + t) * C + e)] = tok[size_t(idx[size_t(b * T + t)] * C + e)] + pos[size_t(t * C + e)];
  for (int64_t l = 0; l < c.layers; ++l) h = block_ref(h, B, T, C, c.heads, p, "block" + std::to_string(l) + ".");
  h = ampgrad::reference::layer_norm(h, B * T, C, p.at("ln_f.weight"), p.at("ln_f.bias"), 1e-5);
  return linear_ref(h, B * T, C, c.vocab_size, p.at("head.weight"), nullptr);
}

// Layer norms start at weight 1, bias 0; random affine values make the references see
// whether the module applies them at all.
void randomize_layer_norms(nn::Module& m) {
  NoGradGuard ng;
  for (const auto& [name, p] : m.named_parameters()) {
    if (name.find("ln") == std::string::npos) continue;
    const bool weight = name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0;
    Tensor t = p;
    t.copy_(rand_like(p) - 0.5 + (weight ? 1.0 : 0.0));
  }
}

nn::GPTConfig tiny_gpt(int64_t width = 8, int64_t layers = 2) {
  nn::GPTConfig c;
  c.vocab_size = 11;
  c.block_size = 8;
  c.layers = layers;
  c.heads = 2;
  c.width = width;
  return c;
}

// ---- the CNN ------------------------------------------------------------------------------

const std::vector<std::string> kCnnParams = {"0.weight", "0.bias", "3.weight", "3.bias",
                                             "7.weight", "7.bias", "9.weight", "9.bias"};

// make_cnn()'s documented architecture applied with frontend ops to p (kCnnParams order).
Tensor cnn_ref(const Tensor& x, const std::vector<Tensor>& p) {
  Tensor h = max_pool2d(relu(conv2d(x, p[0], p[1], {1, 1}, {1, 1})), {2, 2});
  h = max_pool2d(relu(conv2d(h, p[2], p[3], {1, 1}, {1, 1})), {2, 2});
  h = relu(linear(flatten(h, 1), p[4], p[5]));
  return linear(h, p[6], p[7]);
}

// Float64 leaf copies of the CNN's parameters, in kCnnParams order.
std::vector<Tensor> cnn_params64(const nn::Module& net) {
  std::map<std::string, Tensor> by_name;
  for (const auto& [n, p] : net.named_parameters()) by_name[n] = p;
  std::vector<Tensor> out;
  for (const auto& n : kCnnParams) out.push_back(by_name.at(n).detach().to(kFloat64).requires_grad_(true));
  return out;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector<double>()) m = std::max(m, std::fabs(v));
  return m;
}

}  // namespace

TEST(ModelsCnn, ParameterCountMatchesTheArchitecture) {
  manual_seed(1);
  auto net = nn::make_cnn();
  std::vector<std::string> names;
  int64_t total = 0;
  for (const auto& [n, p] : net->named_parameters()) {
    names.push_back(n);
    total += p.numel();
  }
  EXPECT_EQ(names, kCnnParams);  // conv, relu, pool, conv, relu, pool, flatten, linear, relu, linear
  const int64_t formula = 1 * 32 * 9 + 32 + 32 * 64 * 9 + 64 + 3136 * 128 + 128 + 128 * 10 + 10;
  EXPECT_EQ(net->num_parameters(), formula);
  EXPECT_EQ(total, formula);
}

TEST(ModelsCnn, ForwardMatchesFloat64Composition) {
  manual_seed(2);
  auto net = nn::make_cnn();
  const int64_t N = 4;
  Tensor x = rand({N, 1, 28, 28});
  Tensor y = net->forward(x);
  ASSERT_EQ(y.sizes(), (Dims{N, 10}));
  EXPECT_EQ(y.dtype(), kFloat32);
  NoGradGuard ng;
  Tensor ref = cnn_ref(x.to(kFloat64), cnn_params64(*net));
  // float32 sums of up to 3136 products: relative to the logits' scale
  const double scale = max_abs(ref);
  ASSERT_GT(scale, 1e-3);  // the logits are not all ~0, so the comparison means something
  EXPECT_TRUE(agt::allclose(y, ref, agt::tol_for(kFloat32).rtol, 1e-5 * scale));
  // the batch elements are computed independently: one image alone gives its own row
  EXPECT_TRUE(agt::allclose(net->forward(x.narrow(0, 2, 1)), y.narrow(0, 2, 1), 1e-5, 1e-6 * scale));
}

TEST(ModelsCnn, BackwardGivesEachParameterItsFloat64Gradient) {
  manual_seed(3);
  auto net = nn::make_cnn();
  Tensor x = rand({4, 1, 28, 28});
  Tensor target = randint(0, 10, {4});
  cross_entropy(net->forward(x), target).backward();
  // With oneDNN, float32 and float64 take different kernels; in the Eigen-only build they
  // share them, so a gradient bug common to both shows in the optimizer test's first-order
  // check instead.
  std::vector<Tensor> p64 = cnn_params64(*net);
  cross_entropy(cnn_ref(x.to(kFloat64), p64), target).backward();
  auto named = net->named_parameters();
  ASSERT_EQ(named.size(), p64.size());
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& [name, p] = named[i];
    const Tensor g = p.grad();
    ASSERT_TRUE(g.defined()) << name;
    EXPECT_EQ(g.sizes(), p.sizes()) << name;
    EXPECT_EQ(g.dtype(), kFloat32) << name;
    for (double v : g.to_vector<double>()) ASSERT_TRUE(std::isfinite(v)) << name;
    const double scale = max_abs(p64[i].grad());
    ASSERT_GT(scale, 0) << name << " gets no gradient in the reference";
    EXPECT_TRUE(agt::allclose(g, p64[i].grad(), 1e-4, 1e-5 * scale)) << name;
  }
}

TEST(ModelsCnn, OneOptimizerStepLowersTheLossOnItsBatch) {
  for (const std::string which : {"SGD", "AdamW"}) {
    SCOPED_TRACE(which);
    manual_seed(4);
    auto net = nn::make_cnn();
    Tensor x = rand({4, 1, 28, 28});
    Tensor target = randint(0, 10, {4});
    std::unique_ptr<optim::Optimizer> opt;
    if (which == "SGD")
      opt = std::make_unique<optim::SGD>(net->parameters(), optim::SGDOptions{.lr = 0.01});
    else
      opt = std::make_unique<optim::AdamW>(net->parameters(), optim::AdamWOptions{.lr = 1e-3});
    Tensor loss0 = cross_entropy(net->forward(x), target);
    loss0.backward();
    double grad_sq = 0;  // |g|^2: SGD's first-order decrease is lr * |g|^2
    for (const auto& p : net->parameters())
      for (double v : p.grad().to_vector<double>()) grad_sq += v * v;
    opt->step();
    NoGradGuard ng;
    const double before = loss0.item<double>(), after = cross_entropy(net->forward(x), target).item<double>();
    EXPECT_LT(after, before);
    if (which == "SGD") {
      // a small step moves the loss by about its first-order prediction
      EXPECT_NEAR((before - after) / (0.01 * grad_sq), 1.0, 0.25) << before << " -> " << after;
    }
  }
}

TEST(ModelsTransformer, BlockMatchesLoopReference) {
  manual_seed(5);
  const int64_t B = 2, T = 5, C = 8, H = 2;
  nn::TransformerBlock block(C, H, /*block_size=*/6);  // T < block_size: the mask is cropped
  block.to(kFloat64);
  randomize_layer_norms(block);
  Tensor x = randn({B, T, C}, kFloat64);
  Tensor y = block.forward(x);
  ASSERT_EQ(y.sizes(), (Dims{B, T, C}));
  const Vec ref = block_ref(x.to_vector<double>(), B, T, C, H, values_of(block), "");
  EXPECT_TRUE(agt::allclose(y, from_vector<double>(ref, {B, T, C}), agt::tol_for(kFloat64)));
  // causality: changing the last position leaves the earlier ones as they were
  Tensor x2 = x.clone();
  {
    NoGradGuard ng;
    x2.narrow(1, T - 1, 1).fill_(3.0);
  }
  Tensor y2 = block.forward(x2);
  EXPECT_TRUE(agt::allclose(y2.narrow(1, 0, T - 1), y.narrow(1, 0, T - 1), 0, 0));
  EXPECT_FALSE(agt::allclose(y2.narrow(1, T - 1, 1), y.narrow(1, T - 1, 1), 1e-3, 1e-3));
}

TEST(ModelsGpt, ForwardMatchesLoopReference) {
  manual_seed(6);
  const nn::GPTConfig c = tiny_gpt();
  nn::GPT gpt(c);
  gpt.to(kFloat64);
  randomize_layer_norms(gpt);
  const Params p = values_of(gpt);
  // the full block and a shorter sequence (position embedding and mask cropped)
  for (int64_t T : {c.block_size, int64_t(5)}) {
    SCOPED_TRACE("T = " + std::to_string(T));
    const int64_t B = 2;
    Tensor idx = randint(0, c.vocab_size, {B, T});
    Tensor logits = gpt.forward(idx);
    ASSERT_EQ(logits.sizes(), (Dims{B, T, c.vocab_size}));
    EXPECT_EQ(logits.dtype(), kFloat64);
    const Vec ref = gpt_ref(idx.to_vector<int64_t>(), B, T, c, p);
    EXPECT_TRUE(agt::allclose(logits, from_vector<double>(ref, {B, T, c.vocab_size}), agt::tol_for(kFloat64)));
  }
}

TEST(ModelsGpt, LossGradientMatchesFiniteDifferences) {
  manual_seed(7);
  const nn::GPTConfig c = tiny_gpt(/*width=*/8, /*layers=*/2);
  nn::GPT gpt(c);
  gpt.to(kFloat64);
  randomize_layer_norms(gpt);
  Tensor idx = randint(0, c.vocab_size, {2, 6});
  Tensor target = randint(0, c.vocab_size, {12});
  // every parameter is an input: gradcheck perturbs the module's own storage in place
  const std::vector<Tensor> params = gpt.parameters();
  ASSERT_EQ(params.size(), size_t(2 + 12 * c.layers + 3));
  for (const auto& p : params) ASSERT_EQ(p.dtype(), kFloat64);
  auto loss = [&](const std::vector<Tensor>&) {
    return cross_entropy(gpt.forward(idx).reshape({-1, c.vocab_size}), target);
  };
  EXPECT_TRUE(agt::gradcheck(loss, params));
}

namespace {

// Greedy decoding with our own context choice: the last block_size tokens (the model's
// rule) or, to show the test can tell them apart, the first block_size tokens.
// min_margin gets the smallest gap between the best and second-best logit seen.
std::vector<int64_t> greedy(nn::GPT& gpt, std::vector<int64_t> tokens, int64_t n, bool last_block,
                            double& min_margin) {
  NoGradGuard ng;
  const int64_t bs = gpt.config().block_size;
  min_margin = INFINITY;
  for (int64_t s = 0; s < n; ++s) {
    const int64_t size = int64_t(tokens.size());
    const int64_t begin = last_block ? std::max<int64_t>(0, size - bs) : 0;
    const int64_t end = last_block ? size : std::min(size, bs);
    const std::vector<int64_t> ctx(tokens.begin() + begin, tokens.begin() + end);
    Tensor logits = gpt.forward(from_vector<int64_t>(ctx, {1, int64_t(ctx.size())}));
    const Vec last = logits.select(1, int64_t(ctx.size()) - 1).to_vector<double>();
    const auto best = std::max_element(last.begin(), last.end());
    double second = -INFINITY;
    for (auto it = last.begin(); it != last.end(); ++it)
      if (it != best) second = std::max(second, *it);
    min_margin = std::min(min_margin, *best - second);
    tokens.push_back(int64_t(best - last.begin()));
  }
  return tokens;
}

}  // namespace

TEST(ModelsGpt, GeneratePastBlockSizeKeepsPromptAndIsSeeded) {
  manual_seed(8);
  const nn::GPTConfig c = tiny_gpt();
  nn::GPT gpt(c);
  const std::vector<int64_t> prompt = {1, 2, 3};
  const int64_t n = 2 * c.block_size + 3;
  std::vector<int64_t> out;
  ASSERT_NO_THROW(out = gpt.generate(prompt, n, 1.0, 42));
  ASSERT_EQ(int64_t(out.size()), int64_t(prompt.size()) + n);
  EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), out.begin()));
  for (int64_t t : out) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, c.vocab_size);
  }
  EXPECT_EQ(gpt.generate(prompt, n, 1.0, 42), out);  // same seed, same tokens
  EXPECT_NE(gpt.generate(prompt, n, 1.0, 43), out);  // the seed drives the sampling
  // a prompt longer than block_size is cropped too
  std::vector<int64_t> long_prompt(size_t(c.block_size + 2), 4);
  EXPECT_EQ(gpt.generate(long_prompt, 3, 1.0, 1).size(), long_prompt.size() + 3);
  // generate restores the training mode and leaves grad mode on
  EXPECT_TRUE(gpt.is_training());
  EXPECT_TRUE(GradMode::is_enabled());
}

TEST(ModelsGpt, GenerateAtLowTemperatureIsGreedyOnTheLastBlock) {
  manual_seed(9);
  const nn::GPTConfig c = tiny_gpt();
  nn::GPT gpt(c);
  const std::vector<int64_t> prompt = {1, 2, 3};
  const int64_t n = 2 * c.block_size + 3;
  // greedy in effect: the closest top-two logits in this decode are ~5e-3 apart, too close
  // for 1e-3
  const double temperature = 1e-6;
  double margin = 0, margin_first = 0;
  const auto expect = greedy(gpt, prompt, n, /*last_block=*/true, margin);
  const auto first_block = greedy(gpt, prompt, n, /*last_block=*/false, margin_first);
  // preconditions: at 1/temperature the runner-up has probability < e^-20 at every step,
  // and this model's greedy output depends on which tokens form the context
  ASSERT_GT(margin / temperature, 20.0) << "near-tie in the greedy decode; pick another seed";
  ASSERT_NE(expect, first_block) << "the decode does not depend on the context; pick another seed";
  EXPECT_EQ(gpt.generate(prompt, n, temperature, 5), expect);
  // temperature 0 is greedy outright (no division by zero, whatever the seed)
  EXPECT_EQ(gpt.generate(prompt, n, 0.0, 5), expect);
  EXPECT_EQ(gpt.generate(prompt, n, 0.0, 6), expect);
  EXPECT_AG_ERROR(gpt.generate(prompt, n, -1.0), "[GPT::generate] temperature must be finite and non-negative (0: greedy), got -1");
  EXPECT_AG_ERROR(gpt.generate(prompt, -2), "[GPT::generate] the number of tokens to generate must be non-negative, got -2");
}

TEST(ModelsGptPreset, NanoGptIsTheShakespeareCharacterModel) {
  const ag::nn::GPTConfig small = ag::nn::gpt_preset("small"), nano = ag::nn::gpt_preset("nanogpt");
  const ag::nn::GPTConfig defaults;
  EXPECT_EQ(small.layers, defaults.layers);
  EXPECT_EQ(small.width, defaults.width);
  EXPECT_EQ(small.block_size, defaults.block_size);
  EXPECT_EQ(nano.layers, 6);
  EXPECT_EQ(nano.heads, 6);
  EXPECT_EQ(nano.width, 384);
  EXPECT_EQ(nano.block_size, 256);
  // With nanoGPT's 65-character Shakespeare vocabulary: per block 12 C^2 weights plus 13 C
  // biases and norms; embeddings (65 + 256) x C, the final norm 2C, the head 65 C.
  ag::nn::GPTConfig c = nano;
  c.vocab_size = 65;
  const int64_t C = 384;
  const int64_t expected = 6 * (12 * C * C + 13 * C) + (65 + 256) * C + 2 * C + 65 * C;
  EXPECT_EQ(ag::nn::GPT(c).num_parameters(), expected);
  try {
    ag::nn::gpt_preset("gpt2");
    FAIL() << "expected an ag::Error";
  } catch (const ag::Error& e) {
    EXPECT_TRUE(agt::contains(e.what(), "[gpt_preset] unknown preset 'gpt2' (small, nanogpt)")) << e.what();
  }
}

// Under autocast a block's norms feed their products through layer_norm_to: the block's
// output and every parameter's gradient are those of the same modules run one by one (the
// norm in float32, the product's cast) bit for bit; a class derived from LayerNorm runs
// its own forward.
TEST(ModelsTransformer, NormsFeedTheirProductsIn16BitsUnderAutocast) {
  manual_seed(9);
  const int64_t B = 2, T = 16, C = 32, H = 4;
  nn::TransformerBlock block(C, H, T);
  randomize_layer_norms(block);
  const Tensor x0 = randn({B, T, C}), g = randn({B, T, C});
  auto grads = [&](bool as_modules) {
    block.zero_grad();
    Tensor x = x0.clone().requires_grad_(), y;
    {
      AutocastGuard ac(kCPU, kBFloat16);
      if (as_modules) {
        Tensor h = x + block.attn->forward(block.ln1->forward(x));
        y = h + block.mlp->forward(block.ln2->forward(h));
      } else {
        y = block.forward(x);
      }
    }
    y.backward(g.to(y.dtype()));
    std::vector<Tensor> out{y.detach(), x.grad()};
    for (const Tensor& p : block.parameters()) out.push_back(p.grad());
    return out;
  };
  const auto fused = grads(false), separate = grads(true);
  ASSERT_EQ(fused.size(), separate.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    ASSERT_EQ(fused[i].dtype(), separate[i].dtype()) << i;
    EXPECT_TRUE(agt::allclose(fused[i], separate[i], 0, 0)) << "result " << i;
  }
  {
    AutocastGuard ac(kCPU, kBFloat16);
    EXPECT_EQ(nn::norm_for_product(*block.ln1, x0, op::linear).dtype(), kBFloat16);
    struct MyNorm : nn::LayerNorm {
      using LayerNorm::LayerNorm;
    } mine(std::vector<int64_t>{C});
    EXPECT_EQ(nn::norm_for_product(mine, x0, op::linear).dtype(), kFloat32);
  }
  EXPECT_EQ(nn::norm_for_product(*block.ln1, x0, op::linear).dtype(), kFloat32);  // autocast off
}
