// Elementwise throughput and per-op overhead.
//
// add/float32/16M: ag::add(a, b), allocating its output as users call it, against its
// ceiling, a plain `#pragma omp parallel for` loop c[i] = a[i] + b[i] over preallocated
// float arrays. Both count 3 x 4 bytes per element in the "GB/s" rate counter and use
// wall-clock time (multi-threaded). Cases are named "<case>/<impl>" (impl: ampgrad or a
// peer) so that scripts/bench_table.py pairs them.
// tiny_add/*: a 1-element float32 add, with grad mode off and with one input requiring
// grad (a node is recorded). Only the forward call is measured, no backward; the result,
// and with it the recorded graph, is freed at the end of each iteration, so the time per
// iteration is the cost of creating and dropping one op's output (and node).
// tiny_scalar_mul/grad_off/*: a 1-element float32 `t * 2.0` (ours: the scalar goes to the
// kernel by value) against `t * t` (the tensor-tensor path, its ceiling) in the same run,
// grad mode off: a scalar operand must cost no more than a tensor one.
// cross_entropy/float32/<N>x<C>/*: one training-step use of the loss, forward and backward
// (class-index targets, Reduction::Mean, logits requiring grad, the gradient dropped after
// each iteration): ours is the fused op (one kernel each way), its peer the composition it
// replaced, log_softmax then nll_loss, in the same run.
// attention/float32/<B>x<H>x<T>x<D>/*: one training-step use of causal self-attention,
// forward and backward (q, k, v [B, H, T, D] requiring grad, a fixed output gradient, the
// gradients dropped after each iteration): ours is the fused scaled_dot_product_attention
// (one kernel each way), its peer the five ops it replaced in the GPT (matmul, scale,
// where-mask, softmax, matmul), in the same run. attention/bfloat16/*: the same with
// bfloat16 q, k, v and output gradient (the nanoGPT preset's attention under bf16-mixed).
// layer_norm_to/bfloat16/2048x384/*: the same norm in float32 feeding a bfloat16 product
// (autocast): layer_norm_to against layer_norm then .to(bfloat16), forward and backward.
// layer_norm/<dtype>/2048x384/*: one training-step use of layer norm over the nanoGPT
// preset's activations (8 x 256 tokens, width 384), forward and backward with weight and
// bias (the gradients dropped after each iteration); its ceiling, copy, makes the same
// passes over memory with plain elementwise ops: y = clone(x) forward, dx = dy + x back.
// transposed_copy/<dtype>/<shape>/*: x.t().contiguous() of a [2048, 1536] matrix and
// x.transpose(1, 2).contiguous() of a [16, 256, 384] batch (blocked transposes), against
// the ceiling copy, a plain contiguous copy (clone) of the same tensor; GB/s counts the
// bytes read and written once each.
// convert/<from>_to_<to>/256/ampgrad: ag::convert of one 256-element run, the chunk in which
// the CPU's loops over 16-bit tensors widen their inputs and round their results (operands
// in L1, 1024 calls per iteration, a calls/s counter), float32 to bfloat16 and float16 and
// back: the cost per call, dispatch included, that every such chunk pays.
// dropout/<dtype>/2048x384/ampgrad: the nanoGPT preset's dropout on one activation (its
// mask is a Philox uniform draw, compared and scaled), no gradient.
// gather_batch/float32/60000x784/*: the trainer's batch gather, index_select of 128 rows
// (3 KiB each) of a Fashion-MNIST-sized float32 tensor (188 MB, far beyond the caches):
// ours draws the rows at random, as a shuffled epoch does; its ceiling, contiguous_rows,
// copies 128 consecutive rows from a point that moves through the tensor (cold too).
// column_sum/bfloat16/2048x1536/*: a bias gradient, sum(g, {0}) of the nanoGPT preset's
// feed-forward gradient (8 x 256 tokens, width 1536) in bfloat16 into float32 sums; its
// ceiling, all, reads the same bytes in their memory order: sum(g) over every element.
// column_sum/float32/2048x384/*: the same for the float32 GPT small's qkv bias gradient.
// Any ag::Error becomes SkipWithError so the rest of the program still runs.
#include <benchmark/benchmark.h>

#include <ampgrad/ampgrad.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <vector>

namespace {

constexpr int64_t kAddN = int64_t(1) << 24;  // 16M elements

void set_bytes(benchmark::State& state, int64_t n) {
  state.counters["GB/s"] =
      benchmark::Counter(double(n) * 3 * sizeof(float) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_add_ampgrad(benchmark::State& state) {
  try {
    ag::NoGradGuard no_grad;
    ag::manual_seed(0);
    const ag::Tensor a = ag::randn({kAddN});
    const ag::Tensor b = ag::randn({kAddN});
    { ag::Tensor warm = ag::add(a, b); }
    for (auto _ : state) {
      ag::Tensor c = ag::add(a, b);
      benchmark::DoNotOptimize(c.raw_data());
    }
    set_bytes(state, kAddN);
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

// The residual add of a transformer under bfloat16 autocast: a float32 stream plus a
// bfloat16 branch ([8, 256, 384], nanoGPT's). `widened`: as ampgrad runs it (the kernel
// widens the branch in its loop); else the branch cast to float32 first, the former way.
void BM_add_widening(benchmark::State& state, bool widened) {
  try {
    ag::NoGradGuard no_grad;
    ag::manual_seed(0);
    const ag::Tensor a = ag::randn({8, 256, 384});
    const ag::Tensor b = ag::randn({8, 256, 384}).to(ag::kBFloat16);
    for (auto _ : state) {
      ag::Tensor c = widened ? a + b : a + b.to(ag::kFloat32);
      benchmark::DoNotOptimize(c.raw_data());
    }
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

// One batch gather per iteration; `shuffled` draws the rows at random, else consecutive.
void BM_gather_batch(benchmark::State& state, bool shuffled) {
  try {
    ag::NoGradGuard no_grad;
    ag::manual_seed(0);
    constexpr int64_t kRows = 60000, kCols = 784, kBatch = 128, kBatches = kRows / kBatch;
    const ag::Tensor data = ag::rand({kRows, kCols});
    std::vector<int64_t> order(static_cast<size_t>(kRows));
    for (int64_t i = 0; i < kRows; ++i) order[size_t(i)] = i;
    if (shuffled) order = ag::data::random_permutation(kRows);
    std::vector<ag::Tensor> batches;
    for (int64_t b = 0; b < kBatches; ++b)
      batches.push_back(ag::from_vector(std::vector<int64_t>(order.begin() + b * kBatch, order.begin() + (b + 1) * kBatch), {kBatch}));
    int64_t b = 0;
    for (auto _ : state) {
      ag::Tensor x = ag::index_select(data, 0, batches[size_t(b)]);
      benchmark::DoNotOptimize(x.raw_data());
      b = (b + 1) % kBatches;
    }
    state.counters["GB/s"] = benchmark::Counter(double(kBatch * kCols) * sizeof(float) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], FreeDeleter>;
Buffer make_buffer(int64_t n) {
  return Buffer(static_cast<float*>(std::aligned_alloc(64, size_t(n) * sizeof(float))));
}

void BM_add_omp(benchmark::State& state) {
  const int64_t n = kAddN;
  Buffer a = make_buffer(n), b = make_buffer(n), c = make_buffer(n);
  float *pa = a.get(), *pb = b.get(), *pc = c.get();
  // First touch by the threads that will use the pages, like the loop below.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    pa[i] = float(i % 1000) * 0.5f;
    pb[i] = float(i % 777) * 0.25f;
    pc[i] = 0.f;
  }
  for (auto _ : state) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) pc[i] = pa[i] + pb[i];
    benchmark::DoNotOptimize(pc);
    benchmark::ClobberMemory();
  }
  set_bytes(state, n);
}

void BM_tiny_add_nograd(benchmark::State& state) {
  try {
    ag::NoGradGuard no_grad;
    const ag::Tensor a = ag::ones({1});
    const ag::Tensor b = ag::ones({1});
    for (auto _ : state) {
      ag::Tensor c = ag::add(a, b);
      benchmark::DoNotOptimize(c.unsafe_impl());
    }
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

void BM_tiny_add_record(benchmark::State& state) {
  try {
    ag::EnableGradGuard grad;
    const ag::Tensor a = ag::ones({1}, ag::TensorOptions().requires_grad(true));
    const ag::Tensor b = ag::ones({1});
    {
      ag::Tensor c = ag::add(a, b);
      if (!c.grad_fn()) state.SkipWithError("[tiny_add] no node was recorded for an input requiring grad");
    }
    for (auto _ : state) {
      ag::Tensor c = ag::add(a, b);  // records AddBackward; freed with c at the end of the body
      benchmark::DoNotOptimize(c.unsafe_impl());
    }
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

void BM_tiny_mul_scalar(benchmark::State& state) {
  try {
    ag::NoGradGuard no_grad;
    const ag::Tensor t = ag::ones({1});
    for (auto _ : state) {
      ag::Tensor c = t * 2.0;
      benchmark::DoNotOptimize(c.unsafe_impl());
    }
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

void BM_tiny_mul_tensor(benchmark::State& state) {
  try {
    ag::NoGradGuard no_grad;
    const ag::Tensor t = ag::ones({1});
    for (auto _ : state) {
      ag::Tensor c = t * t;
      benchmark::DoNotOptimize(c.unsafe_impl());
    }
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

void BM_cross_entropy(benchmark::State& state, bool fused, int64_t n, int64_t c) {
  try {
    ag::EnableGradGuard grad;
    ag::manual_seed(0);
    const ag::Tensor x = ag::randn({n, c}).requires_grad_(true);
    const ag::Tensor t = ag::randint(0, c, {n});
    auto step = [&] {
      const ag::Tensor loss = fused ? ag::cross_entropy(x, t) : ag::nll_loss(ag::log_softmax(x, 1), t);
      loss.backward();
      benchmark::DoNotOptimize(x.grad().raw_data());
      x.set_grad(ag::Tensor());
    };
    step();  // warm the allocator's cache
    for (auto _ : state) step();
    state.counters["rows/s"] = benchmark::Counter(double(n), benchmark::Counter::kIsIterationInvariantRate);
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

void BM_layer_norm(benchmark::State& state, bool ours, ag::DType dt) {
  try {
    ag::EnableGradGuard grad;
    ag::manual_seed(0);
    const int64_t rows = 2048, width = 384;
    const ag::Tensor x = ag::randn({rows, width}).to(dt).requires_grad_(true);
    const ag::Tensor w = ag::randn({width}).to(dt).requires_grad_(true), b = ag::randn({width}).to(dt).requires_grad_(true);
    const ag::Tensor g = ag::randn({rows, width}).to(dt);
    auto step = [&] {
      if (ours) {
        ag::layer_norm(x, {width}, w, b).backward(g);
        benchmark::DoNotOptimize(x.grad().raw_data());
        for (const ag::Tensor* t : {&x, &w, &b}) t->set_grad(ag::Tensor());
      } else {
        ag::NoGradGuard off;
        const ag::Tensor y = x.clone(), dx = ag::add(g, x);
        benchmark::DoNotOptimize(y.raw_data());
        benchmark::DoNotOptimize(dx.raw_data());
      }
    };
    step();  // warm the allocator's cache
    for (auto _ : state) step();
    state.counters["rows/s"] = benchmark::Counter(double(rows), benchmark::Counter::kIsIterationInvariantRate);
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

// The norm feeding a bfloat16 product under autocast: float32 x, weight and bias, a
// bfloat16 output gradient; layer_norm_to (one pass each way) against the two ops.
void BM_layer_norm_to(benchmark::State& state, bool fused) {
  try {
    ag::EnableGradGuard grad;
    ag::manual_seed(0);
    const int64_t rows = 2048, width = 384;
    const ag::Tensor x = ag::randn({rows, width}).requires_grad_(true);
    const ag::Tensor w = ag::randn({width}).requires_grad_(true), b = ag::randn({width}).requires_grad_(true);
    const ag::Tensor g = ag::randn({rows, width}).to(ag::kBFloat16);
    auto step = [&] {
      const ag::Tensor y = fused ? ag::layer_norm_to(x, {width}, w, b, 1e-5, ag::kBFloat16)
                                 : ag::layer_norm(x, {width}, w, b).to(ag::kBFloat16);
      y.backward(g);
      benchmark::DoNotOptimize(x.grad().raw_data());
      for (const ag::Tensor* t : {&x, &w, &b}) t->set_grad(ag::Tensor());
    };
    step();  // warm the allocator's cache
    for (auto _ : state) step();
    state.counters["rows/s"] = benchmark::Counter(double(rows), benchmark::Counter::kIsIterationInvariantRate);
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

void BM_column_sum(benchmark::State& state, ag::DType dt, int64_t cols, bool ours) {
  try {
    ag::NoGradGuard no_grad;
    ag::manual_seed(0);
    const ag::Tensor g = ag::randn({2048, cols}).to(dt);
    for (auto _ : state) {
      const ag::Tensor s = ours ? ag::sum(g, {0}) : ag::sum(g);
      benchmark::DoNotOptimize(s.raw_data());
    }
    state.counters["GB/s"] = benchmark::Counter(double(g.nbytes()) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

void BM_transposed_copy(benchmark::State& state, ag::DType dt, bool batched, bool transposed) {
  try {
    ag::NoGradGuard no_grad;
    ag::manual_seed(0);
    const ag::Tensor x = batched ? ag::randn({16, 256, 384}).to(dt) : ag::randn({2048, 1536}).to(dt);
    for (auto _ : state) {
      const ag::Tensor y = !transposed ? x.clone() : batched ? x.transpose(1, 2).contiguous() : x.t().contiguous();
      benchmark::DoNotOptimize(y.raw_data());
    }
    state.counters["GB/s"] = benchmark::Counter(2.0 * double(x.nbytes()) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

template <class H>
void convert_runs(benchmark::State& state, bool narrow) {
  constexpr size_t kRun = 256, kCalls = 1024;
  std::vector<float> f(kRun), g(kRun);
  std::vector<H> h(kRun);
  for (size_t i = 0; i < kRun; ++i) f[i] = std::sin(float(i)) * 3.0f;
  ag::convert(f.data(), h.data(), kRun);
  for (auto _ : state) {
    for (size_t c = 0; c < kCalls; ++c) {
      if (narrow) ag::convert(f.data(), h.data(), kRun);
      else ag::convert(h.data(), g.data(), kRun);
      benchmark::ClobberMemory();
    }
  }
  state.counters["calls/s"] = benchmark::Counter(double(kCalls), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_convert(benchmark::State& state, ag::DType dt, bool narrow) {
  if (dt == ag::kBFloat16) convert_runs<ag::BFloat16>(state, narrow);
  else convert_runs<ag::Half>(state, narrow);
}

void BM_dropout(benchmark::State& state, ag::DType dt) {
  try {
    ag::NoGradGuard no_grad;
    ag::manual_seed(0);
    const ag::Tensor x = ag::randn({2048, 384}).to(dt);
    for (auto _ : state) {
      const ag::Tensor y = ag::dropout(x, 0.2, true);
      benchmark::DoNotOptimize(y.raw_data());
    }
    state.counters["elements/s"] = benchmark::Counter(double(x.numel()), benchmark::Counter::kIsIterationInvariantRate);
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

void BM_attention(benchmark::State& state, bool fused, int64_t B, int64_t H, int64_t T, int64_t D,
                  ag::DType dt = ag::kFloat32) {
  try {
    ag::EnableGradGuard grad;
    ag::manual_seed(0);
    const std::vector<int64_t> shape = {B, H, T, D};
    const ag::Tensor q = ag::randn(shape).to(dt).requires_grad_(true), k = ag::randn(shape).to(dt).requires_grad_(true),
                     v = ag::randn(shape).to(dt).requires_grad_(true);
    const ag::Tensor g = ag::randn(shape).to(dt);
    const ag::Tensor allowed = ag::ge(ag::arange(T).unsqueeze(1), ag::arange(T).unsqueeze(0));
    const double scale = 1.0 / std::sqrt(double(D));
    auto step = [&] {
      ag::Tensor y;
      if (fused) {
        ag::AttentionOptions o;
        o.is_causal = true;
        y = ag::scaled_dot_product_attention(q, k, v, o);
      } else {
        const ag::Tensor att = ag::matmul(q, k.transpose(-2, -1)) * scale;
        y = ag::matmul(ag::softmax(ag::where(allowed, att, -INFINITY), -1), v);
      }
      y.backward(g);
      benchmark::DoNotOptimize(q.grad().raw_data());
      for (const ag::Tensor* t : {&q, &k, &v}) t->set_grad(ag::Tensor());
    };
    step();  // warm the allocator's cache and oneDNN's primitives
    for (auto _ : state) step();
    state.counters["heads/s"] = benchmark::Counter(double(B * H), benchmark::Counter::kIsIterationInvariantRate);
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

}  // namespace

BENCHMARK_CAPTURE(BM_attention, fused_32x4x64x32, true, 32, 4, 64, 32)
    ->Name("attention/float32/32x4x64x32/ampgrad")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_attention, composed_32x4x64x32, false, 32, 4, 64, 32)
    ->Name("attention/float32/32x4x64x32/composed")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_attention, fused_16x4x128x64, true, 16, 4, 128, 64)
    ->Name("attention/float32/16x4x128x64/ampgrad")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_attention, composed_16x4x128x64, false, 16, 4, 128, 64)
    ->Name("attention/float32/16x4x128x64/composed")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_attention, fused_16x6x256x64, true, 16, 6, 256, 64)
    ->Name("attention/float32/16x6x256x64/ampgrad")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_attention, composed_16x6x256x64, false, 16, 6, 256, 64)
    ->Name("attention/float32/16x6x256x64/composed")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_attention, fused_bf16_8x6x256x64, true, 8, 6, 256, 64, ag::kBFloat16)
    ->Name("attention/bfloat16/8x6x256x64/ampgrad")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_attention, composed_bf16_8x6x256x64, false, 8, 6, 256, 64, ag::kBFloat16)
    ->Name("attention/bfloat16/8x6x256x64/composed")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_cross_entropy, fused_2048x65, true, 2048, 65)
    ->Name("cross_entropy/float32/2048x65/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_cross_entropy, composed_2048x65, false, 2048, 65)
    ->Name("cross_entropy/float32/2048x65/composed")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_cross_entropy, fused_512x8192, true, 512, 8192)
    ->Name("cross_entropy/float32/512x8192/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_cross_entropy, composed_512x8192, false, 512, 8192)
    ->Name("cross_entropy/float32/512x8192/composed")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_column_sum, ours, ag::kBFloat16, 1536, true)
    ->Name("column_sum/bfloat16/2048x1536/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_column_sum, all, ag::kBFloat16, 1536, false)
    ->Name("column_sum/bfloat16/2048x1536/all")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_column_sum, ours32, ag::kFloat32, 384, true)
    ->Name("column_sum/float32/2048x384/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_column_sum, all32, ag::kFloat32, 384, false)
    ->Name("column_sum/float32/2048x384/all")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_convert, f32_bf16, ag::kBFloat16, true)
    ->Name("convert/float32_to_bfloat16/256/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_convert, bf16_f32, ag::kBFloat16, false)
    ->Name("convert/bfloat16_to_float32/256/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_convert, f32_f16, ag::kFloat16, true)
    ->Name("convert/float32_to_float16/256/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_convert, f16_f32, ag::kFloat16, false)
    ->Name("convert/float16_to_float32/256/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_transposed_copy, float32_m_ampgrad, ag::kFloat32, false, true)
    ->Name("transposed_copy/float32/2048x1536/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_transposed_copy, float32_m_copy, ag::kFloat32, false, false)
    ->Name("transposed_copy/float32/2048x1536/copy")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_transposed_copy, float32_b_ampgrad, ag::kFloat32, true, true)
    ->Name("transposed_copy/float32/16x256x384/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_transposed_copy, float32_b_copy, ag::kFloat32, true, false)
    ->Name("transposed_copy/float32/16x256x384/copy")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_transposed_copy, bfloat16_m_ampgrad, ag::kBFloat16, false, true)
    ->Name("transposed_copy/bfloat16/2048x1536/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_transposed_copy, bfloat16_m_copy, ag::kBFloat16, false, false)
    ->Name("transposed_copy/bfloat16/2048x1536/copy")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_transposed_copy, bfloat16_b_ampgrad, ag::kBFloat16, true, true)
    ->Name("transposed_copy/bfloat16/16x256x384/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_transposed_copy, bfloat16_b_copy, ag::kBFloat16, true, false)
    ->Name("transposed_copy/bfloat16/16x256x384/copy")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_transposed_copy, float64_m_ampgrad, ag::kFloat64, false, true)
    ->Name("transposed_copy/float64/2048x1536/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_transposed_copy, float64_m_copy, ag::kFloat64, false, false)
    ->Name("transposed_copy/float64/2048x1536/copy")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_transposed_copy, float64_b_ampgrad, ag::kFloat64, true, true)
    ->Name("transposed_copy/float64/16x256x384/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_transposed_copy, float64_b_copy, ag::kFloat64, true, false)
    ->Name("transposed_copy/float64/16x256x384/copy")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_layer_norm, float32, true, ag::kFloat32)
    ->Name("layer_norm/float32/2048x384/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_layer_norm, float32_copy, false, ag::kFloat32)
    ->Name("layer_norm/float32/2048x384/copy")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_layer_norm_to, fused, true)
    ->Name("layer_norm_to/bfloat16/2048x384/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_layer_norm_to, two_ops, false)
    ->Name("layer_norm_to/bfloat16/2048x384/two_ops")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_layer_norm, bfloat16, true, ag::kBFloat16)
    ->Name("layer_norm/bfloat16/2048x384/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_layer_norm, bfloat16_copy, false, ag::kBFloat16)
    ->Name("layer_norm/bfloat16/2048x384/copy")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_dropout, float32, ag::kFloat32)
    ->Name("dropout/float32/2048x384/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_dropout, bfloat16, ag::kBFloat16)
    ->Name("dropout/bfloat16/2048x384/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_gather_batch, shuffled, true)->Name("gather_batch/float32/60000x784/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_gather_batch, consecutive, false)->Name("gather_batch/float32/60000x784/contiguous_rows")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_add_widening, widened, true)->Name("add/float32+bfloat16/8x256x384/ampgrad")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_add_widening, cast_first, false)->Name("add/float32+bfloat16/8x256x384/cast_first")->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK(BM_add_ampgrad)->Name("add/float32/16M/ampgrad")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.2);
BENCHMARK(BM_add_omp)->Name("add/float32/16M/omp_loop")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.2);
BENCHMARK(BM_tiny_add_nograd)->Name("tiny_add/grad_off/ampgrad")->UseRealTime()->Unit(benchmark::kNanosecond)->MinTime(0.2);
BENCHMARK(BM_tiny_add_record)->Name("tiny_add/recording/ampgrad")->UseRealTime()->Unit(benchmark::kNanosecond)->MinTime(0.2);
BENCHMARK(BM_tiny_mul_scalar)->Name("tiny_scalar_mul/grad_off/ampgrad")->UseRealTime()->Unit(benchmark::kNanosecond)->MinTime(0.2);
BENCHMARK(BM_tiny_mul_tensor)->Name("tiny_scalar_mul/grad_off/tensor_operand")->UseRealTime()->Unit(benchmark::kNanosecond)->MinTime(0.2);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("cpu_model", ag::hw::cpu_features().model_name);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
