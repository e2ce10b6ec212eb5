// GPU benchmarks, each next to its ceiling measured in the same run on the same GPU:
//
// gemm/{bf16,f16}/{4096,8192}/{ampgrad,cublaslt}: ag::matmul of two n x n device tensors
//   against one bare cublasLtMatmul call on the same shapes (row-major via the transposed
//   problem, fp32 accumulation, the heuristic's first algorithm, a 32 MiB workspace).
//   Target: ampgrad >= 0.95 of cublaslt.
// memory/{add,cast,gelu,softmax,layer_norm,cross_entropy}/{ampgrad,copy}: 256M-element
//   elementwise ops (bf16, cast float32 -> bf16) and row ops (bf16, rows of 4096) as bytes
//   read and written per second, each next to cudaMemcpy device to device (copy), the
//   ceiling. Targets: elementwise >= 0.85 of copy, row ops >= 0.8.
// gpt2_step/{32-true,16-mixed,bf16-mixed}/ampgrad: a GPT-2-small-shaped training step (12 layers,
//   12 heads, width 768, context 1024, vocab 50304, batch 8, synthetic tokens) through
//   ag::Lite with AdamW, tokens/s; bench/peers/gpt_cuda_peer.py is PyTorch's side.
//   Targets: bf16-mixed >= 3x 32-true and >= PyTorch's bf16 autocast.
//
// Timing is by CUDA events around the iterations (manual time), so the host's launch
// overhead counts only where it keeps the GPU waiting. Without a CUDA device every case
// skips with the reason. Names end in the side, "<case>/<ampgrad or ceiling>", as
// scripts/bench_table.py pairs them.
#include <benchmark/benchmark.h>
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <ampgrad/ampgrad.h>

#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <utility>

namespace {

const ag::Device kGpu(ag::kCUDA, 0);

bool no_gpu(benchmark::State& state) {
  if (!ag::hw::query().cuda.empty()) return false;
  state.SkipWithError("skipped: no CUDA device");
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
void BM_gemm_ampgrad(benchmark::State& state, ag::DType dt, int64_t n) {
  if (no_gpu(state)) return;
  try {
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
void BM_gemm_cublaslt(benchmark::State& state, ag::DType dt, int64_t n) {
  if (no_gpu(state)) return;
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
  if (found == 0) {  // heur.algo is then not an algorithm
    state.SkipWithError("cuBLASLt has no algorithm for this product");
    return;
  }
  const float alpha = 1, beta = 0;
  const cudaStream_t stream = static_cast<cudaStream_t>(ag::stream_handle(ag::current_stream(kGpu)));
  // One checked call first: the timed ones cannot report a failure.
  BENCH_LT_CHECK(cublasLtMatmul(lt, op, &alpha, b.raw_data(), lb, a.raw_data(), la, &beta, c.raw_data(), lc,
                                c.raw_data(), lc, &heur.algo, workspace.raw_data(), ws, stream));
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

// Registered by name so that each ends in its side: gemm/bf16/4096/ampgrad next to
// gemm/bf16/4096/cublaslt, memory/add/ampgrad next to memory/add/copy.
[[maybe_unused]] const bool kRegistered = [] {
  const auto gpu = [](benchmark::internal::Benchmark* b) { b->UseManualTime()->Unit(benchmark::kMillisecond); };
  for (const auto& [dt, type] : {std::pair{ag::kBFloat16, "bf16"}, std::pair{ag::kFloat16, "f16"}})
    for (const int64_t n : {4096, 8192}) {
      const std::string c = std::string("gemm/") + type + "/" + std::to_string(n);
      gpu(benchmark::RegisterBenchmark((c + "/ampgrad").c_str(), BM_gemm_ampgrad, dt, n));
      gpu(benchmark::RegisterBenchmark((c + "/cublaslt").c_str(), BM_gemm_cublaslt, dt, n));
    }
  const char* ops[] = {"add", "cast", "gelu", "softmax", "layer_norm", "cross_entropy"};  // BM_memory_op's order
  for (int op = 0; op < int(std::size(ops)); ++op) {
    const std::string c = std::string("memory/") + ops[op];
    gpu(benchmark::RegisterBenchmark((c + "/ampgrad").c_str(), BM_memory_op, op));
    gpu(benchmark::RegisterBenchmark((c + "/copy").c_str(), BM_copy));
  }
  for (const char* p : {"32-true", "16-mixed", "bf16-mixed"})
    gpu(benchmark::RegisterBenchmark((std::string("gpt2_step/") + p + "/ampgrad").c_str(), BM_gpt2_step, p)
            ->Iterations(5));
  return true;
}();

BENCHMARK_MAIN();
