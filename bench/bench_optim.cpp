// The fused multi-tensor AdamW step over the GPT model's parameters (bench_train's GPT:
// vocab 96, block 64, 2 layers, 4 heads, width 128; 29 parameter tensors), against the
// per-parameter loop it replaced: the same backend kernel called once per parameter.
//
// optim_step/gpt_adamw/ampgrad: optim::AdamW::step() (one backend call per group, device
// and dtype). optim_step/gpt_adamw/per_param: one adam_step call per parameter with
// one-element lists, as the optimizer did before. Target: ratio >= 1 (no slower).
#include <benchmark/benchmark.h>

#include <ampgrad/ampgrad.h>

namespace {

const ag::nn::GPTConfig kGpt{.vocab_size = 96, .block_size = 64, .layers = 2, .heads = 4, .width = 128};

void BM_fused(benchmark::State& state) {
  ag::manual_seed(0);
  ag::nn::GPT gpt(kGpt);
  ag::optim::AdamW opt(gpt.parameters(), {.lr = 1e-3});
  for (auto& p : gpt.parameters()) p.set_grad(ag::randn(p.sizes().vec()) * 1e-2);
  opt.step();  // state made
  for (auto _ : state) opt.step();
  state.counters["params/s"] = benchmark::Counter(double(gpt.num_parameters()), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_per_param(benchmark::State& state) {
  ag::manual_seed(0);
  ag::nn::GPT gpt(kGpt);
  struct One {
    ag::OptimizerLists lists;
  };
  std::vector<One> each;
  for (auto& p : gpt.parameters()) {
    ag::NoGradGuard ng;
    One o;
    o.lists.params = {p};
    o.lists.grads = {ag::randn(p.sizes().vec()) * 1e-2};
    o.lists.buf1 = {ag::zeros(p.sizes().vec())};
    o.lists.buf2 = {ag::zeros(p.sizes().vec())};
    o.lists.masters = {ag::Tensor()};
    o.lists.steps = {ag::zeros({}, ag::kInt64)};
    o.lists.lr = {1e-3, ag::Tensor()};
    each.push_back(o);
  }
  const ag::AdamParams hp{.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-2, .decoupled = true};
  ag::Backend& be = ag::cpu_backend();
  for (auto& o : each) be.adam_step(o.lists, hp);
  for (auto _ : state)
    for (auto& o : each) be.adam_step(o.lists, hp);
  state.counters["params/s"] = benchmark::Counter(double(gpt.num_parameters()), benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(BM_fused)->Name("optim_step/gpt_adamw/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.3);
BENCHMARK(BM_per_param)->Name("optim_step/gpt_adamw/per_param")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.3);

BENCHMARK_MAIN();
