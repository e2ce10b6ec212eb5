// GPU benchmarks, each next to its ceiling measured in the same run on the same GPU:
//
// gemm/{bf16,f16}/{4096,8192}/{ampgrad,cublaslt}: ag::matmul of two n x n device tensors
//   against one bare cublasLtMatmul call on the same shapes (row-major via the transposed
//   problem, fp32 accumulation, the heuristic's first algorithm, a 32 MiB workspace).
//   Target: ampgrad >= 0.95 of cublaslt.
// memory/{copy,add,cast,gelu,softmax,layer_norm,cross_entropy}: 256M-element elementwise
//   ops (bf16, cast float32 -> bf16) and row ops (bf16, rows of 4096) as bytes read and
//   written per second; memory/copy is cudaMemcpy device to device, the ceiling.
//   Targets: elementwise >= 0.85 of copy, row ops >= 0.8.
// gpt2_step/{32-true,16-mixed,bf16-mixed}: a GPT-2-small-shaped training step (12 layers,
//   12 heads, width 768, context 1024, vocab 50304, batch 8, synthetic tokens) through
//   ag::Lite with AdamW, tokens/s; bench/peers/gpt_cuda_peer.py is PyTorch's side.
//   Targets: bf16-mixed >= 3x 32-true and >= PyTorch's bf16 autocast.
//
// Timing is by CUDA events around the iterations (manual time), so the host's launch
// overhead counts only where it keeps the GPU waiting. Without a CUDA device every case
// skips with the reason.
#include <benchmark/benchmark.h>
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <ampgrad/ampgrad.h>

#include <memory>
#include <string>

namespace {

const ag::Device kGpu(ag::kCUDA, 0);

bool no_gpu(benchmark::State& state) {
  if (!ag::hw::query().cuda.empty()) return false;
  state.SkipWithError("no CUDA device");
  return true;
}

// Times `body` per iteration with events on the current stream; `warmup` untimed calls first.
template <class Body>
void time_on_gpu(benchmark::State& state, const Body& body, int warmup = 2) {
  for (int i = 0; i < warmup; ++i) body();
  ag::synchronize(kGpu);
  for (auto _ : state) {
    ag::Event start(kGpu), stop(kGpu);
    start.record();
    body();
    stop.record();
    stop.synchronize();
    state.SetIterationTime(start.elapsed_time(stop) / 1e3);
  }
}

// ---- GEMM --------------------------------------------------------------------------------------
void BM_gemm_ampgrad(benchmark::State& state, ag::DType dt) {
  if (no_gpu(state)) return;
  try {
    const int64_t n = state.range(0);
    const ag::Tensor a = ag::randn({n, n}, ag::TensorOptions(dt).device(kGpu));
    const ag::Tensor b = ag::randn({n, n}, ag::TensorOptions(dt).device(kGpu));
    ag::NoGradGuard no_grad;
    time_on_gpu(state, [&] { benchmark::DoNotOptimize(ag::matmul(a, b).unsafe_impl()); });
    state.counters["TFLOP/s"] = benchmark::Counter(2.0 * double(n) * double(n) * double(n) / 1e12,
                                                   benchmark::Counter::kIsIterationInvariantRate);
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

#define BENCH_LT_CHECK(call)                                                         \
  do {                                                                               \
    if ((call) != CUBLAS_STATUS_SUCCESS) {                                           \
      state.SkipWithError(#call " failed");                                          \
      return;                                                                        \
    }                                                                                \
  } while (0)

// The ceiling: one cublasLtMatmul, C = A B for row-major n x n matrices (computed as the
// column-major C^T = B^T A^T).
void BM_gemm_cublaslt(benchmark::State& state, ag::DType dt) {
  if (no_gpu(state)) return;
  const int64_t n = state.range(0);
  const cudaDataType_t type = dt == ag::kBFloat16 ? CUDA_R_16BF : CUDA_R_16F;
  const ag::Tensor a = ag::randn({n, n}, ag::TensorOptions(dt).device(kGpu));
  const ag::Tensor b = ag::randn({n, n}, ag::TensorOptions(dt).device(kGpu));
  const ag::Tensor c = ag::empty({n, n}, ag::TensorOptions(dt).device(kGpu));
  const ag::Tensor workspace = ag::empty({32 << 20}, ag::TensorOptions(ag::kUInt8).device(kGpu));
  cublasLtHandle_t lt;
  BENCH_LT_CHECK(cublasLtCreate(&lt));
  cublasLtMatmulDesc_t op;
  BENCH_LT_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasLtMatrixLayout_t la, lb, lc;
  BENCH_LT_CHECK(cublasLtMatrixLayoutCreate(&la, type, uint64_t(n), uint64_t(n), n));
  BENCH_LT_CHECK(cublasLtMatrixLayoutCreate(&lb, type, uint64_t(n), uint64_t(n), n));
  BENCH_LT_CHECK(cublasLtMatrixLayoutCreate(&lc, type, uint64_t(n), uint64_t(n), n));
  cublasLtMatmulPreference_t pref;
  BENCH_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = 32 << 20;
  BENCH_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  BENCH_LT_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, lb, la, lc, lc, pref, 1, &heur, &found));
  const float alpha = 1, beta = 0;
  const cudaStream_t stream = static_cast<cudaStream_t>(ag::stream_handle(ag::current_stream(kGpu)));
  time_on_gpu(state, [&] {
    cublasLtMatmul(lt, op, &alpha, b.raw_data(), lb, a.raw_data(), la, &beta, c.raw_data(), lc, c.raw_data(), lc,
                   &heur.algo, workspace.raw_data(), ws, stream);
  });
  state.counters["TFLOP/s"] = benchmark::Counter(2.0 * double(n) * double(n) * double(n) / 1e12,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
}

// ---- memory-bound ops ----------------------------------------------------------------------------
constexpr int64_t kElems = int64_t(1) << 28;  // 256M
constexpr int64_t kRow = 4096;

void set_bytes(benchmark::State& state, double bytes) {
  state.counters["GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_copy(benchmark::State& state) {
  if (no_gpu(state)) return;
  const ag::Tensor a = ag::empty({kElems}, ag::TensorOptions(ag::kBFloat16).device(kGpu));
  const ag::Tensor b = ag::empty({kElems}, ag::TensorOptions(ag::kBFloat16).device(kGpu));
  const cudaStream_t stream = static_cast<cudaStream_t>(ag::stream_handle(ag::current_stream(kGpu)));
  time_on_gpu(state, [&] { cudaMemcpyAsync(b.raw_data(), a.raw_data(), size_t(kElems) * 2, cudaMemcpyDeviceToDevice, stream); });
  set_bytes(state, 2.0 * 2 * double(kElems));
}

// op: 0 add, 1 cast float32 -> bf16, 2 gelu, 3 softmax, 4 layer_norm, 5 cross_entropy.
void BM_memory_op(benchmark::State& state, int op) {
  if (no_gpu(state)) return;
  try {
    ag::NoGradGuard no_grad;
    const auto bf16 = ag::TensorOptions(ag::kBFloat16).device(kGpu);
    const ag::Tensor x = ag::randn({kElems / kRow, kRow}, op == 1 ? ag::TensorOptions(ag::kFloat32).device(kGpu) : bf16);
    const ag::Tensor y = ag::randn({kElems / kRow, kRow}, bf16);
    const ag::Tensor labels = ag::randint(0, kRow, {kElems / kRow}, ag::TensorOptions(ag::kInt64).device(kGpu));
    double bytes = 0;
    std::function<void()> body;
    switch (op) {
      case 0: body = [&] { benchmark::DoNotOptimize((x + y).unsafe_impl()); }; bytes = 3 * 2.0 * double(kElems); break;
      case 1: body = [&] { benchmark::DoNotOptimize(x.to(ag::kBFloat16).unsafe_impl()); }; bytes = 6.0 * double(kElems); break;
      case 2: body = [&] { benchmark::DoNotOptimize(ag::gelu(x).unsafe_impl()); }; bytes = 2 * 2.0 * double(kElems); break;
      case 3: body = [&] { benchmark::DoNotOptimize(ag::softmax(x, -1).unsafe_impl()); }; bytes = 2 * 2.0 * double(kElems); break;
      case 4: body = [&] { benchmark::DoNotOptimize(ag::layer_norm(x, {kRow}).unsafe_impl()); }; bytes = 2 * 2.0 * double(kElems); break;
      default: body = [&] { benchmark::DoNotOptimize(ag::cross_entropy(x, labels).unsafe_impl()); }; bytes = 2.0 * double(kElems); break;
    }
    time_on_gpu(state, body);
    set_bytes(state, bytes);
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

// ---- GPT-2-small training step -------------------------------------------------------------------
void BM_gpt2_step(benchmark::State& state, const char* precision) {
  if (no_gpu(state)) return;
  try {
    ag::EnableGradGuard grad;
    ag::manual_seed(0);
    constexpr int64_t B = 8, T = 1024;
    auto net = std::make_shared<ag::nn::GPT>(
        ag::nn::GPTConfig{.vocab_size = 50304, .block_size = T, .layers = 12, .heads = 12, .width = 768});
    net->train();
    ag::optim::AdamW adamw(net->parameters(), {.lr = 3e-4});
    ag::Lite lite({.accelerator = "cuda", .precision = precision});
    auto [model, opt] = lite.setup(net, adamw);
    const ag::Tensor idx = ag::randint(0, 50304, {B, T}, ag::TensorOptions(ag::kInt64).device(kGpu));
    const ag::Tensor tgt = ag::randint(0, 50304, {B, T}, ag::TensorOptions(ag::kInt64).device(kGpu));
    auto step = [&] {
      opt.zero_grad();
      ag::Tensor logits = model(idx);
      ag::Tensor loss = ag::cross_entropy(logits.reshape({B * T, 50304}), tgt.reshape({B * T}));
      lite.backward(loss);
      opt.step();
    };
    step();
    // host syncs of one step, outside the timing (whose event wait is one): the target is 0
    const uint64_t syncs = ag::host_sync_count();
    step();
    const double step_syncs = double(ag::host_sync_count() - syncs);
    time_on_gpu(state, step, 1);
    state.counters["tokens/s"] = benchmark::Counter(double(B * T), benchmark::Counter::kIsIterationInvariantRate);
    state.counters["host_syncs/step"] = step_syncs;
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

}  // namespace

BENCHMARK_CAPTURE(BM_gemm_ampgrad, bf16, ag::kBFloat16)->Name("gemm/bf16/ampgrad")->Arg(4096)->Arg(8192)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_gemm_cublaslt, bf16, ag::kBFloat16)->Name("gemm/bf16/cublaslt")->Arg(4096)->Arg(8192)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_gemm_ampgrad, f16, ag::kFloat16)->Name("gemm/f16/ampgrad")->Arg(4096)->Arg(8192)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_gemm_cublaslt, f16, ag::kFloat16)->Name("gemm/f16/cublaslt")->Arg(4096)->Arg(8192)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_copy)->Name("memory/copy")->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_memory_op, add, 0)->Name("memory/add")->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_memory_op, cast, 1)->Name("memory/cast")->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_memory_op, gelu, 2)->Name("memory/gelu")->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_memory_op, softmax, 3)->Name("memory/softmax")->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_memory_op, layer_norm, 4)->Name("memory/layer_norm")->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_memory_op, cross_entropy, 5)->Name("memory/cross_entropy")->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_gpt2_step, fp32, "32-true")->Name("gpt2_step/32-true")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK_CAPTURE(BM_gpt2_step, fp16, "16-mixed")->Name("gpt2_step/16-mixed")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK_CAPTURE(BM_gpt2_step, bf16, "bf16-mixed")->Name("gpt2_step/bf16-mixed")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);

BENCHMARK_MAIN();
