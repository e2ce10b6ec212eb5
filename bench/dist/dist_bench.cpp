// Data-parallel costs, run under mpirun by scripts/bench (2 ranks; rank 0 reports):
//   allreduce/f32/<size>/ampgrad        ProcessGroup::all_reduce (sum) of a float32 tensor
//   allreduce/f32/<size>/mpi            MPI_Iallreduce on the same bytes, polled by hand on
//                                       the calling thread: the ceiling of the group's own
//                                       work (its queue, driver thread and deadline)
//   ddp_overlap/mlp/ampgrad             one Lite "ddp" training step, buckets reduced during
//                                       backward (the default)
//   ddp_overlap/mlp/after_backward      the same step, every bucket reduced after backward
//   ddp_comm/mlp/ampgrad                the default step again, against
//   ddp_comm/mlp/no_comm                the same step of one process (Lite "single"): what
//                                       the communication costs
// The MLP has 8.4M float32 parameters (34 MB of gradients) in buckets of 4 MB, a batch of
// 32 per rank. Every case runs a fixed number of iterations and starts with a barrier, so
// that the ranks run the same collectives in the same order (the same command line on
// every rank: no random interleaving). On one machine with 2 cores this measures the
// mechanism, not scaling: docs/distributed.md has the figures and what they mean.
#include <benchmark/benchmark.h>

#include <ampgrad/ampgrad.h>
#include <mpi.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

ag::dist::ProcessGroup& pg() { return ag::dist::ProcessGroup::world(); }

int64_t iterations_for(int64_t bytes) { return std::clamp<int64_t>((int64_t(256) << 20) / bytes, 5, 2000); }

void BM_allreduce(benchmark::State& state, int64_t bytes) {
  ag::Tensor t = ag::ones({bytes / 4});
  pg().barrier();
  for (auto _ : state) pg().all_reduce(t, ag::dist::ReduceOp::Sum);
  state.counters["bytes/s"] = benchmark::Counter(double(state.iterations() * bytes), benchmark::Counter::kIsRate);
}

void BM_mpi(benchmark::State& state, int64_t bytes) {
  std::vector<float> v(static_cast<size_t>(bytes / 4), 1.0f);
  pg().barrier();
  for (auto _ : state) {
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, v.data(), int(v.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
    for (int done = 0; !done;) MPI_Test(&r, &done, MPI_STATUS_IGNORE);
  }
  state.counters["bytes/s"] = benchmark::Counter(double(state.iterations() * bytes), benchmark::Counter::kIsRate);
}

// kind: 0 ddp with overlap, 1 ddp reducing after backward, 2 one process (no communication)
void BM_ddp_step(benchmark::State& state, int kind) {
  const int64_t batch = 32;
  ag::manual_seed(1);
  auto net = std::make_shared<ag::nn::Sequential>(std::vector<ag::nn::ModulePtr>{
      std::make_shared<ag::nn::Linear>(1024, 2048), std::make_shared<ag::nn::ReLU>(),
      std::make_shared<ag::nn::Linear>(2048, 2048), std::make_shared<ag::nn::ReLU>(),
      std::make_shared<ag::nn::Linear>(2048, 1024)});
  ag::optim::SGD sgd(net->parameters(), {.lr = 1e-3});
  ag::Lite lite({.accelerator = "cpu",
                 .precision = "32-true",
                 .strategy = kind == 2 ? "single" : "ddp",
                 .ddp = {.bucket_bytes = int64_t(4) << 20, .overlap = kind == 0}});
  auto [model, opt] = lite.setup(net, sgd);
  const ag::Tensor x = ag::randn({batch, 1024}), y = ag::randint(0, 1024, {batch});
  auto step = [&] {
    opt.zero_grad();
    lite.backward(ag::cross_entropy(model(x), y));
    opt.step();
  };
  step();  // warm: buffers, oneDNN primitives
  pg().barrier();
  for (auto _ : state) step();
  pg().barrier();
  state.counters["samples/s"] = benchmark::Counter(double(state.iterations() * batch * pg().size()),
                                                   benchmark::Counter::kIsRate);
}

void register_all() {
  for (int64_t bytes : {int64_t(4) << 10, int64_t(256) << 10, int64_t(4) << 20, int64_t(64) << 20}) {
    const std::string size = bytes >= (1 << 20) ? std::to_string(bytes >> 20) + "MB" : std::to_string(bytes >> 10) + "KB";
    benchmark::RegisterBenchmark(("allreduce/f32/" + size + "/ampgrad").c_str(), BM_allreduce, bytes)
        ->Iterations(iterations_for(bytes))->UseRealTime();
    benchmark::RegisterBenchmark(("allreduce/f32/" + size + "/mpi").c_str(), BM_mpi, bytes)
        ->Iterations(iterations_for(bytes))->UseRealTime();
  }
  const int64_t steps = 10;
  benchmark::RegisterBenchmark("ddp_overlap/mlp/ampgrad", BM_ddp_step, 0)->Iterations(steps)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("ddp_overlap/mlp/after_backward", BM_ddp_step, 1)->Iterations(steps)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("ddp_comm/mlp/ampgrad", BM_ddp_step, 0)->Iterations(steps)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("ddp_comm/mlp/no_comm", BM_ddp_step, 2)->Iterations(steps)->UseRealTime()->Unit(benchmark::kMillisecond);
}

// The other ranks run the same cases and report nothing.
class Silent : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  const bool zero = pg().is_global_zero();
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i)  // only rank 0 writes --benchmark_out
    if (zero || std::strncmp(argv[i], "--benchmark_out", 15) != 0) args.push_back(argv[i]);
  int n = int(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  register_all();
  Silent silent;
  if (zero) benchmark::RunSpecifiedBenchmarks();
  else benchmark::RunSpecifiedBenchmarks(&silent);
  benchmark::Shutdown();
  return 0;
}
