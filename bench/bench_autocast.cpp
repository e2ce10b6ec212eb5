// Autocast benchmarks (issue 4).
//
// autocast_overhead/mlp3/{ampgrad,hand_cast}: forward + backward of a 3-layer MLP
// (784-1024-1024-10, batch 256) under CPU bfloat16 autocast, against the same network with
// its weights cast to bfloat16 by hand (no autocast, no casts in the step). The target is
// at most 10% slower (ratio >= 0.91).
// amp_step/mlp1024/{ampgrad,fp32}: one AdamW training step of the same MLP under bfloat16
// autocast against the float32 step: the speedup autocast buys on this CPU.
// Both sides run in this program, alternating under Google Benchmark's interleaving.
#include <benchmark/benchmark.h>

#include <ampgrad/ampgrad.h>

namespace {

constexpr int64_t kBatch = 256;

std::shared_ptr<ag::nn::Sequential> mlp() {
  return std::make_shared<ag::nn::Sequential>(std::vector<ag::nn::ModulePtr>{
      std::make_shared<ag::nn::Linear>(784, 1024), std::make_shared<ag::nn::ReLU>(),
      std::make_shared<ag::nn::Linear>(1024, 1024), std::make_shared<ag::nn::ReLU>(),
      std::make_shared<ag::nn::Linear>(1024, 10)});
}

void BM_overhead(benchmark::State& state, bool autocast) {
  try {
    ag::manual_seed(0);
    auto net = mlp();
    if (!autocast) net->to(ag::kBFloat16);
    const ag::Tensor x = autocast ? ag::randn({kBatch, 784}) : ag::randn({kBatch, 784}).to(ag::kBFloat16);
    const ag::Tensor y = ag::randint(0, 10, {kBatch});
    auto step = [&] {
      ag::Tensor loss;
      if (autocast) {
        ag::AutocastGuard g(ag::kCPU, ag::kBFloat16);
        loss = ag::cross_entropy(net->forward(x), y);
      } else {
        loss = ag::cross_entropy(net->forward(x), y);
      }
      net->zero_grad();
      loss.backward();
    };
    step();
    for (auto _ : state) step();
    state.counters["samples/s"] = benchmark::Counter(double(kBatch), benchmark::Counter::kIsIterationInvariantRate);
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

void BM_step(benchmark::State& state, bool autocast) {
  try {
    ag::manual_seed(0);
    auto net = mlp();
    ag::optim::AdamW opt(net->parameters(), {.lr = 1e-3});
    const ag::Tensor x = ag::randn({kBatch, 784});
    const ag::Tensor y = ag::randint(0, 10, {kBatch});
    auto step = [&] {
      ag::Tensor loss;
      {
        ag::AutocastGuard g(ag::kCPU, ag::kBFloat16, autocast);
        loss = ag::cross_entropy(net->forward(x), y);
      }
      opt.zero_grad();
      loss.backward();
      opt.step();
    };
    step();
    step();
    for (auto _ : state) step();
    state.counters["samples/s"] = benchmark::Counter(double(kBatch), benchmark::Counter::kIsIterationInvariantRate);
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

BENCHMARK_CAPTURE(BM_overhead, ampgrad, true)->Name("autocast_overhead/mlp3/ampgrad")->UseRealTime()->MinTime(0.5);
BENCHMARK_CAPTURE(BM_overhead, hand_cast, false)->Name("autocast_overhead/mlp3/hand_cast")->UseRealTime()->MinTime(0.5);
BENCHMARK_CAPTURE(BM_step, ampgrad, true)->Name("amp_step/mlp1024/ampgrad")->UseRealTime()->MinTime(0.5);
BENCHMARK_CAPTURE(BM_step, fp32, false)->Name("amp_step/mlp1024/fp32")->UseRealTime()->MinTime(0.5);

}  // namespace

BENCHMARK_MAIN();
