// One full training step, as ampgrad-train runs it: forward, cross_entropy, zero_grad,
// backward, AdamW step, on fixed random data made once outside the timing loop.
//
// train_step/mlp/ampgrad: nn::make_mlp() on float32 [128, 1, 28, 28] inputs, int64 labels
// in [0, 10). train_step/cnn/ampgrad: nn::make_cnn() on the same data.
// train_step/gpt/ampgrad: nn::GPT {vocab 96, block 64, layers 2, heads 4, width 128} on
// int64 tokens [32, 64] with int64 targets [32, 64] (loss over B*T positions).
// train_step/gpt_nanogpt/ampgrad: nn::gpt_preset("nanogpt") (6 layers, 6 heads, width 384,
// context 256) with vocab 96 on tokens [8, 256].
// train_step/gpt_w256/ampgrad: nn::GPT {vocab 96, block 128, layers 4, heads 4, width 256}
// on tokens [16, 128]: the GPT on which the float32 step was first measured against
// PyTorch 2.15 (docs/performance-history.md), in size between the two presets.
// Each case builds its model and optimizer, runs two untimed steps (AdamW state, allocator
// and first-touch warm-up), then times steps. Wall-clock time (UseRealTime: the ops are
// multi-threaded, threads from OMP_NUM_THREADS). The rate counter is "samples/s" (MLP,
// CNN) or "tokens/s" (GPT, B*T per step), also reported as items_per_second. No peer
// lives here: bench/torch_train.py is the PyTorch side and scripts/bench-vs-torch prints
// both; scripts/bench shows these rows against the fp32 throughput targets.
// amp_train_step/{mlp,cnn,gpt,gpt_w256,gpt_nanogpt}/ampgrad: the same step in bf16-mixed
// through ag::Lite (setup, lite.backward, the wrapped optimizer's step):
// scripts/bench-vs-torch puts it next to PyTorch's CPU autocast and Lightning Fabric
// running the same loop.
// train_step_medium/{mlp,gpt,gpt_w256,gpt_nanogpt}/ampgrad: the float32 step under
// ag::set_float32_matmul_precision("medium") (bfloat16 products where the CPU runs bfloat16
// natively; the same as train_step elsewhere): bench/torch_train.py --matmul-precision
// medium is its peer.
// Every training-step row reports flops_per_item, the model FLOPs per sample or token (see
// mlp_flops below).
// lite_overhead/{mlp,mlp16}/{ampgrad,hand_loop}: the Lite step against the same loop
// written by hand with AutocastGuard (and, for 16-mixed, GradScaler): what the wrappers
// cost (target: under 3%, ratio >= 0.97).
// Every Lite step also reports its host syncs per step (counter host_syncs/step; ampgrad/sync.h),
// which must be 0: nothing in a step reads a value back from the device.
// Any ag::Error becomes SkipWithError so the rest of the program still runs.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <ampgrad/ampgrad.h>

#include <memory>
#include <string>

namespace {

constexpr int64_t kImageBatch = 128;
constexpr int64_t kGptBatch = 32;
const ag::nn::GPTConfig kGptConfig{.vocab_size = 96, .block_size = 64, .layers = 2, .heads = 4, .width = 128};
constexpr int64_t kGptW256Batch = 16;
const ag::nn::GPTConfig kGptW256Config{.vocab_size = 96, .block_size = 128, .layers = 4, .heads = 4, .width = 256};
constexpr int64_t kNanoGptBatch = 8;
const ag::nn::GPTConfig kNanoGptConfig = [] {
  ag::nn::GPTConfig c = ag::nn::gpt_preset("nanogpt");
  c.vocab_size = 96;
  return c;
}();

// Model FLOPs of one training step per sample (MLP, CNN) or token (GPT): three times the
// forward's multiply-adds counted as 2 FLOPs each (forward, input gradient, weight
// gradient), the usual convention; the GPT's is nanoGPT's estimate_mfu, 6 per matmul
// weight plus 12 * layers * width * context for attention (the full T x T scores, though
// causal attention needs half). scripts/bench-vs-torch divides rate * FLOPs by raw
// oneDNN's GEMM rate (bench_matmul) to show the distance to the hardware; the peers run the
// same models, so the same count applies to them.
double mlp_flops() { return 3.0 * 2 * (784 * 512 + 512 * 256 + 256 * 10); }
double cnn_flops() {
  const double conv1 = 2.0 * 32 * 1 * 9 * 28 * 28, conv2 = 2.0 * 64 * 32 * 9 * 14 * 14;
  return 3.0 * (conv1 + conv2 + 2.0 * (3136 * 128 + 128 * 10));
}
double gpt_flops(const ag::nn::GPTConfig& c) {
  const double L = double(c.layers), w = double(c.width);
  const double weights = L * 12 * w * w + w * double(c.vocab_size);
  return 6 * weights + 12 * L * w * double(c.block_size);
}

// Runs `step` twice untimed, then once per iteration; `items` samples (or tokens) per step,
// `flops` model FLOPs per item (counter flops_per_item).
template <class Step>
void run_steps(benchmark::State& state, Step&& step, int64_t items, const char* counter, double flops) {
  step();
  step();
  for (auto _ : state) step();
  state.SetItemsProcessed(int64_t(state.iterations()) * items);
  state.counters[counter] = benchmark::Counter(double(items), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["flops_per_item"] = flops;
}

// Sets the float32 product precision for one benchmark case, and restores the default.
struct MatmulPrecision {
  explicit MatmulPrecision(const char* p) { ag::set_float32_matmul_precision(p); }
  ~MatmulPrecision() { ag::set_float32_matmul_precision("highest"); }
};

void BM_train_image(benchmark::State& state, bool cnn, const char* matmul_precision) {
  try {
    MatmulPrecision precision(matmul_precision);
    ag::EnableGradGuard grad;
    ag::manual_seed(0);
    std::shared_ptr<ag::nn::Module> model =
        cnn ? std::shared_ptr<ag::nn::Module>(ag::nn::make_cnn()) : ag::nn::make_mlp();
    model->train();
    ag::optim::AdamW opt(model->parameters(), {.lr = 1e-3});
    const ag::Tensor x = ag::randn({kImageBatch, 1, 28, 28});
    const ag::Tensor y = ag::randint(0, 10, {kImageBatch});
    auto step = [&] {
      ag::Tensor loss = ag::cross_entropy(model->forward(x), y);
      opt.zero_grad();
      loss.backward();
      opt.step();
      benchmark::DoNotOptimize(loss.unsafe_impl());
    };
    run_steps(state, step, kImageBatch, "samples/s", cnn ? cnn_flops() : mlp_flops());
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

void BM_train_gpt(benchmark::State& state, const ag::nn::GPTConfig& config, int64_t batch,
                  const char* matmul_precision) {
  try {
    MatmulPrecision precision(matmul_precision);
    ag::EnableGradGuard grad;
    ag::manual_seed(0);
    auto model = std::make_shared<ag::nn::GPT>(config);
    model->train();
    ag::optim::AdamW opt(model->parameters(), {.lr = 1e-3});
    const int64_t B = batch, T = config.block_size, V = config.vocab_size;
    const ag::Tensor idx = ag::randint(0, V, {B, T});
    const ag::Tensor target = ag::randint(0, V, {B, T});
    auto step = [&] {
      ag::Tensor logits = model->forward(idx);
      ag::Tensor loss = ag::cross_entropy(logits.view({-1, V}), target.view({-1}));
      opt.zero_grad();
      loss.backward();
      opt.step();
      benchmark::DoNotOptimize(loss.unsafe_impl());
    };
    run_steps(state, step, B * T, "tokens/s", gpt_flops(config));
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

std::shared_ptr<ag::nn::Module> image_model(bool cnn) {
  return cnn ? std::shared_ptr<ag::nn::Module>(ag::nn::make_cnn()) : ag::nn::make_mlp();
}

// One training step through Lite with the given precision.
void BM_lite_step(benchmark::State& state, bool cnn, const char* precision) {
  try {
    ag::EnableGradGuard grad;
    ag::manual_seed(0);
    auto net = image_model(cnn);
    net->train();
    ag::optim::AdamW adamw(net->parameters(), {.lr = 1e-3});
    ag::Lite lite({.accelerator = "cpu", .precision = precision});
    auto [model, opt] = lite.setup(net, adamw);
    const ag::Tensor x = ag::randn({kImageBatch, 1, 28, 28});
    const ag::Tensor y = ag::randint(0, 10, {kImageBatch});
    auto step = [&] {
      opt.zero_grad();
      ag::Tensor loss = ag::cross_entropy(model(x), y);
      lite.backward(loss);
      opt.step();
      benchmark::DoNotOptimize(loss.unsafe_impl());
    };
    const uint64_t syncs = ag::host_sync_count();
    run_steps(state, step, kImageBatch, "samples/s", cnn ? cnn_flops() : mlp_flops());
    // host syncs per step (the two warm-up steps included): the target is 0
    state.counters["host_syncs/step"] = double(ag::host_sync_count() - syncs) / double(state.iterations() + 2);
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

// The same step written by hand: autocast guard around forward and loss, and for float16
// the grad scaler (scale, step, update).
void BM_hand_step(benchmark::State& state, bool cnn, ag::DType dtype) {
  try {
    ag::EnableGradGuard grad;
    ag::manual_seed(0);
    auto net = image_model(cnn);
    net->train();
    ag::optim::AdamW opt(net->parameters(), {.lr = 1e-3});
    ag::GradScaler scaler({.enabled = dtype == ag::kFloat16});
    const ag::Tensor x = ag::randn({kImageBatch, 1, 28, 28});
    const ag::Tensor y = ag::randint(0, 10, {kImageBatch});
    auto step = [&] {
      opt.zero_grad();
      ag::Tensor loss;
      {
        ag::AutocastGuard g(ag::kCPU, dtype);
        loss = ag::cross_entropy(net->forward(x), y);
      }
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
      benchmark::DoNotOptimize(loss.unsafe_impl());
    };
    run_steps(state, step, kImageBatch, "samples/s", cnn ? cnn_flops() : mlp_flops());
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

// The GPT step in bf16-mixed through Lite, as BM_lite_step.
void BM_lite_gpt(benchmark::State& state, const ag::nn::GPTConfig& config, int64_t batch) {
  try {
    ag::EnableGradGuard grad;
    ag::manual_seed(0);
    auto net = std::make_shared<ag::nn::GPT>(config);
    net->train();
    ag::optim::AdamW adamw(net->parameters(), {.lr = 1e-3});
    ag::Lite lite({.accelerator = "cpu", .precision = "bf16-mixed"});
    auto [model, opt] = lite.setup(net, adamw);
    const int64_t B = batch, T = config.block_size, V = config.vocab_size;
    const ag::Tensor idx = ag::randint(0, V, {B, T});
    const ag::Tensor target = ag::randint(0, V, {B, T});
    auto step = [&] {
      opt.zero_grad();
      ag::Tensor loss = ag::cross_entropy(model(idx).view({-1, V}), target.view({-1}));
      lite.backward(loss);
      opt.step();
      benchmark::DoNotOptimize(loss.unsafe_impl());
    };
    const uint64_t syncs = ag::host_sync_count();
    run_steps(state, step, B * T, "tokens/s", gpt_flops(config));
    state.counters["host_syncs/step"] = double(ag::host_sync_count() - syncs) / double(state.iterations() + 2);
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

}  // namespace

BENCHMARK_CAPTURE(BM_lite_step, mlp, false, "bf16-mixed")->Name("amp_train_step/mlp/ampgrad")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_lite_step, cnn, true, "bf16-mixed")->Name("amp_train_step/cnn/ampgrad")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_lite_gpt, small, kGptConfig, kGptBatch)
    ->Name("amp_train_step/gpt/ampgrad")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_lite_gpt, w256, kGptW256Config, kGptW256Batch)
    ->Name("amp_train_step/gpt_w256/ampgrad")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_lite_gpt, nanogpt, kNanoGptConfig, kNanoGptBatch)
    ->Name("amp_train_step/gpt_nanogpt/ampgrad")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_lite_step, lite_bf16, false, "bf16-mixed")->Name("lite_overhead/mlp/ampgrad")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_hand_step, hand_bf16, false, ag::kBFloat16)->Name("lite_overhead/mlp/hand_loop")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_lite_step, lite_f16, false, "16-mixed")->Name("lite_overhead/mlp16/ampgrad")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_hand_step, hand_f16, false, ag::kFloat16)->Name("lite_overhead/mlp16/hand_loop")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);

BENCHMARK_CAPTURE(BM_train_image, mlp, false, "highest")->Name("train_step/mlp/ampgrad")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_train_image, cnn, true, "highest")->Name("train_step/cnn/ampgrad")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_train_gpt, small, kGptConfig, kGptBatch, "highest")
    ->Name("train_step/gpt/ampgrad")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_train_gpt, w256, kGptW256Config, kGptW256Batch, "highest")
    ->Name("train_step/gpt_w256/ampgrad")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_train_gpt, nanogpt, kNanoGptConfig, kNanoGptBatch, "highest")
    ->Name("train_step/gpt_nanogpt/ampgrad")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_train_image, mlp_medium, false, "medium")->Name("train_step_medium/mlp/ampgrad")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_train_gpt, small_medium, kGptConfig, kGptBatch, "medium")
    ->Name("train_step_medium/gpt/ampgrad")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_train_gpt, w256_medium, kGptW256Config, kGptW256Batch, "medium")
    ->Name("train_step_medium/gpt_w256/ampgrad")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_train_gpt, nanogpt_medium, kNanoGptConfig, kNanoGptBatch, "medium")
    ->Name("train_step_medium/gpt_nanogpt/ampgrad")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("cpu_model", ag::hw::cpu_features().model_name);
  benchmark::AddCustomContext("omp_threads", std::to_string(omp_get_max_threads()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
