// Matmul throughput: ag::matmul against a raw oneDNN matmul primitive, the ceiling on CPU;
// a weight gradient's transposed product (BM_weight_grad); and the feed-forward block fused
// against module by module (see BM_feed_forward).
//
// Cases are named "matmul/<dtype>/<N>/<impl>" (impl: ampgrad or onednn) so that
// scripts/bench_table.py pairs each ampgrad case with its peer. Square N x N row-major
// operands are made once, outside the timing loop, and both sides multiply the same
// tensors. ag::matmul runs under NoGradGuard and allocates its output, as users call it;
// the oneDNN primitive is created once and writes into a preallocated plain buffer of the
// same dtype (bf16 x bf16 -> bf16). Each side runs once untimed before timing (first-touch,
// JIT). Time is wall-clock (UseRealTime: the work is multi-threaded); the rate counter is
// "GFLOP/s" counting 2*N^3 flops. Without oneDNN (AMPGRAD_WITH_ONEDNN unset) the peer is
// skipped (SkipWithError) and only ampgrad's numbers show. Any ag::Error (e.g. an op not
// implemented yet) becomes SkipWithError so the rest of the program still runs.
#include <benchmark/benchmark.h>

#include <ampgrad/ampgrad.h>

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#if defined(AMPGRAD_WITH_ONEDNN)
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace {

constexpr int64_t kSizes[] = {256, 512, 1024, 2048};
constexpr ag::DType kDTypes[] = {ag::kFloat32, ag::kBFloat16};

void set_flops(benchmark::State& state, int64_t n) {
  const double flops = 2.0 * double(n) * double(n) * double(n);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_matmul_ampgrad(benchmark::State& state, ag::DType dt, int64_t n) {
  try {
    ag::NoGradGuard no_grad;
    ag::manual_seed(0);
    const ag::Tensor a = ag::randn({n, n}, dt);
    const ag::Tensor b = ag::randn({n, n}, dt);
    { ag::Tensor warm = ag::matmul(a, b); }
    for (auto _ : state) {
      ag::Tensor c = ag::matmul(a, b);
      benchmark::DoNotOptimize(c.raw_data());
    }
    set_flops(state, n);
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

#if defined(AMPGRAD_WITH_ONEDNN)
dnnl::memory::data_type dnnl_type(ag::DType dt) {
  return dt == ag::kBFloat16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

// A oneDNN matmul primitive for a @ b -> c (the descriptor API differs before oneDNN 3).
dnnl::matmul make_matmul(const dnnl::engine& eng, const dnnl::memory::desc& a, const dnnl::memory::desc& b,
                         const dnnl::memory::desc& c) {
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::matmul(dnnl::matmul::primitive_desc(eng, a, b, c));
#else
  return dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), eng));
#endif
}

void BM_matmul_onednn(benchmark::State& state, ag::DType dt, int64_t n) {
  try {
    ag::manual_seed(0);
    const ag::Tensor a = ag::randn({n, n}, dt);
    const ag::Tensor b = ag::randn({n, n}, dt);
    const ag::Tensor c = ag::empty({n, n}, dt);
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream strm(eng);
    const dnnl::memory::desc md({n, n}, dnnl_type(dt), dnnl::memory::format_tag::ab);
    const dnnl::matmul prim = make_matmul(eng, md, md, md);
    dnnl::memory ma(md, eng, a.raw_data()), mb(md, eng, b.raw_data()), mc(md, eng, c.raw_data());
    const std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
    prim.execute(strm, args);
    strm.wait();
    for (auto _ : state) {
      prim.execute(strm, args);
      strm.wait();
      benchmark::ClobberMemory();
    }
    set_flops(state, n);
  } catch (const dnnl::error& e) {
    state.SkipWithError((std::string("[onednn] ") + e.what()).c_str());
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}
#else
void BM_matmul_onednn(benchmark::State& state, ag::DType, int64_t) {
  state.SkipWithError("[onednn] skipped: bench built without oneDNN (AMPGRAD_ONEDNN=OFF)");
  for (auto _ : state) {
  }
}
#endif

// A linear's weight gradient, dW [out, in] = dY^T X over a batch of 2048 rows, as the
// small GPT's backward computes it: ag::matmul on the transposed view of dY, against a
// raw oneDNN matmul primitive reading the same transposed operand (what ampgrad ran before
// it took sgemm for this form). Rows "weight_grad/float32/<out>x2048x<in>/<impl>".
void BM_weight_grad(benchmark::State& state, int64_t out, int64_t in, bool ours) {
  try {
    ag::NoGradGuard no_grad;
    ag::manual_seed(0);
    const int64_t rows = 2048;
    const ag::Tensor dy = ag::randn({rows, out}), x = ag::randn({rows, in});
    std::function<void()> run;
#if defined(AMPGRAD_WITH_ONEDNN)
    const ag::Tensor dw = ag::empty({out, in});
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream strm(eng);
    using md = dnnl::memory::desc;
    const md a_md({out, rows}, dnnl::memory::data_type::f32, dnnl::memory::dims{1, out});
    const md b_md({rows, in}, dnnl::memory::data_type::f32, dnnl::memory::dims{in, 1});
    const md c_md({out, in}, dnnl::memory::data_type::f32, dnnl::memory::dims{in, 1});
    const dnnl::matmul prim = make_matmul(eng, a_md, b_md, c_md);
    const std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, dnnl::memory(a_md, eng, dy.raw_data())},
                                                     {DNNL_ARG_WEIGHTS, dnnl::memory(b_md, eng, x.raw_data())},
                                                     {DNNL_ARG_DST, dnnl::memory(c_md, eng, dw.raw_data())}};
    if (!ours)
      run = [&] {
        prim.execute(strm, args);
        strm.wait();
      };
#else
    if (!ours) return state.SkipWithError("[onednn] skipped: bench built without oneDNN (AMPGRAD_ONEDNN=OFF)");
#endif
    if (ours)
      run = [&] {
        ag::Tensor g = ag::matmul(dy.t(), x);
        benchmark::DoNotOptimize(g.raw_data());
      };
    run();
    for (auto _ : state) run();
    state.counters["GFLOP/s"] =
        benchmark::Counter(2e-9 * double(rows * out * in), benchmark::Counter::kIsIterationInvariantRate);
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

// A transformer feed-forward block, forward and backward, as nn::Sequential runs it: fused
// (one feed_forward op) or module by module (set_fusion(false)), on the same parameters and
// input. Rows: [2048, 256] -> 1024 -> 256 (the small GPT preset's tokens per batch) with
// GELU, and the trainer MLP's 784 -> 512 -> 256 with ReLU on a batch of 128.
void BM_feed_forward(benchmark::State& state, ag::DType dt, bool gelu, bool fused) {
  try {
    ag::manual_seed(0);
    const int64_t rows = gelu ? 2048 : 128, in = gelu ? 256 : 784, hidden = gelu ? 1024 : 512, out = 256;
    ag::nn::ModulePtr act = gelu ? ag::nn::ModulePtr(std::make_shared<ag::nn::GELU>()) : std::make_shared<ag::nn::ReLU>();
    auto block = std::make_shared<ag::nn::Sequential>(std::vector<ag::nn::ModulePtr>{
        std::make_shared<ag::nn::Linear>(in, hidden), act, std::make_shared<ag::nn::Linear>(hidden, out)});
    block->to(dt);
    block->set_fusion(fused);
    const ag::Tensor x = ag::randn({rows, in}, dt);
    auto step = [&] {
      block->zero_grad();
      ag::Tensor y = block->forward(x);
      y.sum().backward();
    };
    step();
    for (auto _ : state) step();
    const double flops = 3 * 2.0 * double(rows) * double(in * hidden + hidden * out);  // forward + two backward GEMMs
    state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  } catch (const ag::Error& e) {
    state.SkipWithError(e.what());
  }
}

void register_all() {
  for (ag::DType dt : kDTypes)
    for (bool gelu : {true, false})
      for (bool fused : {true, false}) {
        const std::string name = std::string("feed_forward/") + ag::dtype_name(dt) + (gelu ? "/gelu_2048x256x1024" : "/relu_128x784x512") +
                                 (fused ? "/fused" : "/modules");
        benchmark::RegisterBenchmark(name.c_str(), [dt, gelu, fused](benchmark::State& st) { BM_feed_forward(st, dt, gelu, fused); })
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond)
            ->MinTime(0.2);
      }
  for (const auto& [out, in] : {std::pair<int64_t, int64_t>{128, 512}, {512, 128}})
    for (bool ours : {true, false}) {
      const std::string name = "weight_grad/float32/" + std::to_string(out) + "x2048x" + std::to_string(in) +
                               (ours ? "/ampgrad" : "/onednn");
      benchmark::RegisterBenchmark(name.c_str(), [out, in, ours](benchmark::State& st) { BM_weight_grad(st, out, in, ours); })
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.2);
    }
  for (ag::DType dt : kDTypes) {
    for (int64_t n : kSizes) {
      const std::string base = std::string("matmul/") + ag::dtype_name(dt) + "/" + std::to_string(n);
      for (int impl = 0; impl < 2; ++impl) {
        auto* fn = impl == 0 ? BM_matmul_ampgrad : BM_matmul_onednn;
        auto* b = benchmark::RegisterBenchmark((base + (impl == 0 ? "/ampgrad" : "/onednn")).c_str(),
                                               [fn, dt, n](benchmark::State& s) { fn(s, dt, n); });
        b->UseRealTime()->Unit(benchmark::kMillisecond);
        // Keep the whole run short: a 2048 product takes tens of milliseconds on a few
        // cores, and a slow kernel still runs just once per repetition.
        b->MinTime(n >= 2048 ? 0.1 : 0.2);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("cpu_model", ag::hw::cpu_features().model_name);
#if defined(AMPGRAD_WITH_ONEDNN)
  const dnnl_version_t* v = dnnl_version();
  benchmark::AddCustomContext("onednn", std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                                            std::to_string(v->patch));
#else
  benchmark::AddCustomContext("onednn", "off");
#endif
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
