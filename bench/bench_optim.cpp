// The fused multi-tensor AdamW step over the GPT model's parameters (bench_train's GPT:
// vocab 96, block 64, 2 layers, 4 heads, width 128; 29 parameter tensors), against the
// per-parameter loop it replaced: the same backend kernel called once per parameter; and
// the step over the MLP's parameters (nn::make_mlp(), 535 thousand) against one pass over
// the same bytes.
//
// optim_step/gpt_adamw/ampgrad: optim::AdamW::step() (one backend call per group, device
// and dtype). optim_step/gpt_adamw/per_param: one adam_step call per parameter with
// one-element lists, as the optimizer did before. Target: ratio >= 1 (no slower).
// optim_step/mlp_adamw/ampgrad: AdamW's step on the MLP; optim_step/mlp_adamw/memory_pass:
// the floor, a parallel loop that reads parameters, gradients and both moments and writes
// parameters and moments as the update does, with multiplies and adds only (no square root
// or division). The update's two per-element divisions and square root used to bound it
// (bench_train's float32 MLP step spent a tenth of its time there).
#include <benchmark/benchmark.h>
#include <omp.h>

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

void BM_mlp_adamw(benchmark::State& state) {
  ag::manual_seed(0);
  auto mlp = ag::nn::make_mlp();
  ag::optim::AdamW opt(mlp->parameters(), {.lr = 1e-3});
  int64_t n = 0;
  for (auto& p : mlp->parameters()) {
    p.set_grad(ag::randn(p.sizes().vec()) * 1e-2);
    n += p.numel();
  }
  opt.step();
  for (auto _ : state) opt.step();
  state.counters["params/s"] = benchmark::Counter(double(n), benchmark::Counter::kIsIterationInvariantRate);
}

#if defined(__x86_64__)
#define AG_BENCH_AVX512 __attribute__((target("avx512f")))
#else
#define AG_BENCH_AVX512
#endif

// The update's memory traffic without its square root and division, on elements [b, e)
// of one parameter, in AVX-512 where the CPU has it (as adam_step).
[[gnu::always_inline]] inline void pass_loop(float* p, const float* g, float* m1, float* m2, int64_t b, int64_t e) {
#pragma omp simd
  for (int64_t i = b; i < e; ++i) {
    const float a = 0.9f * m1[i] + 0.1f * g[i], v = 0.999f * m2[i] + 0.001f * g[i] * g[i];
    m1[i] = a;
    m2[i] = v;
    p[i] -= 1e-3f * a * v;
  }
}
AG_BENCH_AVX512 void pass_avx512(float* p, const float* g, float* m1, float* m2, int64_t b, int64_t e) {
  pass_loop(p, g, m1, m2, b, e);
}
void pass_baseline(float* p, const float* g, float* m1, float* m2, int64_t b, int64_t e) {
  pass_loop(p, g, m1, m2, b, e);
}

void BM_mlp_memory_pass(benchmark::State& state) {
  ag::manual_seed(0);
  auto mlp = ag::nn::make_mlp();
  struct Piece {
    ag::Tensor p, g, m1, m2;
  };
  std::vector<Piece> pieces;
  int64_t n = 0;
  for (auto& p : mlp->parameters()) {
    ag::NoGradGuard ng;
    pieces.push_back({p, ag::randn(p.sizes().vec()) * 1e-2, ag::zeros(p.sizes().vec()), ag::zeros(p.sizes().vec())});
    n += p.numel();
  }
#if defined(__x86_64__)
  const bool avx512 = __builtin_cpu_supports("avx512f");
#else
  const bool avx512 = false;
#endif
  const auto pass = avx512 ? pass_avx512 : pass_baseline;
  for (auto _ : state) {
#pragma omp parallel
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      for (auto& c : pieces) {
        const int64_t len = c.p.numel();
        pass(c.p.data_ptr<float>(), c.g.data_ptr<float>(), c.m1.data_ptr<float>(), c.m2.data_ptr<float>(),
             len * t / nt, len * (t + 1) / nt);
      }
    }
  }
  state.counters["params/s"] = benchmark::Counter(double(n), benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(BM_fused)->Name("optim_step/gpt_adamw/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.3);
BENCHMARK(BM_per_param)->Name("optim_step/gpt_adamw/per_param")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.3);

BENCHMARK(BM_mlp_adamw)->Name("optim_step/mlp_adamw/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.3);
BENCHMARK(BM_mlp_memory_pass)->Name("optim_step/mlp_adamw/memory_pass")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.3);

BENCHMARK_MAIN();
