// The process group's collectives, run by tests/dist/run.sh under mpirun (2 ranks; every
// test also holds for 1). Values are built from the rank, so each rank can check what the
// others sent. The failure cases (a rank that hangs, one that dies) run only when
// AMPGRAD_DIST_CASE names them, each in its own mpirun, since they end the job.
#include "support/testing.h"

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

using namespace ag;
namespace dist = ag::dist;

namespace {

dist::ProcessGroup& pg() { return dist::ProcessGroup::world(); }

std::string failure_case() {
  const char* c = std::getenv("AMPGRAD_DIST_CASE");
  return c ? c : "";
}

}  // namespace

TEST(Dist, RanksComeFromTheLauncher) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  const char* env = std::getenv("OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(dist::launched_by_mpi(), env != nullptr);
  if (env) EXPECT_EQ(pg().size(), std::atoi(env));
  EXPECT_GE(pg().rank(), 0);
  EXPECT_LT(pg().rank(), pg().size());
  EXPECT_EQ(pg().is_global_zero(), pg().rank() == 0);
  // one machine: every rank is local
  EXPECT_EQ(pg().local_size(), pg().size());
  EXPECT_EQ(pg().local_rank(), pg().rank());
}

TEST(Dist, AllReduceEveryOpAndDType) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  const int r = pg().rank(), n = pg().size();
  // rank r holds [r + 1, -(r + 1), r * 10]: sums, maxima and minima are known in closed form
  const double sum1 = n * (n + 1) / 2.0;
  for (DType dt : {kFloat32, kFloat64, kBFloat16, kFloat16, kInt64, kInt32}) {
    SCOPED_TRACE(dtype_name(dt));
    auto mine = [&] { return from_vector(std::vector<double>{r + 1.0, -(r + 1.0), r * 10.0}, {3}).to(dt); };
    Tensor s = mine(), mx = mine(), mn = mine();
    pg().all_reduce(s, dist::ReduceOp::Sum);
    pg().all_reduce(mx, dist::ReduceOp::Max);
    pg().all_reduce(mn, dist::ReduceOp::Min);
    EXPECT_EQ(s.dtype(), dt);
    EXPECT_EQ(s.to_vector<double>(), (std::vector<double>{sum1, -sum1, 10.0 * (n - 1) * n / 2}));
    EXPECT_EQ(mx.to_vector<double>(), (std::vector<double>{double(n), -1.0, 10.0 * (n - 1)}));
    EXPECT_EQ(mn.to_vector<double>(), (std::vector<double>{1.0, -double(n), 0.0}));
    if (is_floating(dt)) {
      Tensor a = mine();
      pg().all_reduce(a, dist::ReduceOp::Avg);
      EXPECT_TRUE(agt::allclose(a, from_vector(std::vector<double>{sum1 / n, -sum1 / n, 5.0 * (n - 1)}, {3}),
                                agt::tol_for(dt)));
    }
  }
  // bool: sum and max are "any", min is "all"
  Tensor any = from_vector(std::vector<double>{double(r == 0), 0, 1}, {3}).to(kBool), all = any.clone();
  pg().all_reduce(any, dist::ReduceOp::Max);
  pg().all_reduce(all, dist::ReduceOp::Min);
  EXPECT_EQ(any.to_vector<double>(), (std::vector<double>{1, 0, 1}));
  EXPECT_EQ(all.to_vector<double>(), (std::vector<double>{n == 1 ? 1.0 : 0.0, 0, 1}));
}

// float16 is reduced in float32: the mean of 60000 and 50000 is 55000 although their sum
// is past float16's largest value (65504).
TEST(Dist, HalfPrecisionReducesInFloat32) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  const int n = pg().size();
  Tensor t = full({4}, 60000.0 - 10000.0 * pg().rank(), kFloat16);
  pg().all_reduce(t, dist::ReduceOp::Avg);
  const double mean = 60000.0 - 10000.0 * (n - 1) / 2.0;
  EXPECT_TRUE(agt::allclose(t, full({4}, mean), agt::tol_for(kFloat16)));
}

TEST(Dist, BroadcastFromEveryRank) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  for (int src = 0; src < pg().size(); ++src) {
    Tensor t = full({2, 3}, 100.0 * pg().rank() + 7);
    Tensor leaf = full({5}, double(pg().rank()), kFloat64).requires_grad_();
    pg().broadcast(t, src);
    pg().broadcast(leaf, src);
    EXPECT_EQ(t.to_vector<double>(), std::vector<double>(6, 100.0 * src + 7));
    EXPECT_EQ(leaf.to_vector<double>(), std::vector<double>(5, double(src)));
  }
}

TEST(Dist, AllGatherConcatenatesInRankOrder) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  const int r = pg().rank(), n = pg().size();
  Tensor t = from_vector(std::vector<double>{double(r), r + 0.5}, {1, 2});
  Tensor g = pg().all_gather(t);
  ASSERT_EQ(g.sizes(), Shape({n, 2}));
  std::vector<double> expect;
  for (int i = 0; i < n; ++i) expect.insert(expect.end(), {double(i), i + 0.5});
  EXPECT_EQ(g.to_vector<double>(), expect);
  Tensor s = pg().all_gather(scalar_tensor(int64_t(r) * 3));
  ASSERT_EQ(s.sizes(), Shape({n}));
  for (int i = 0; i < n; ++i) EXPECT_EQ(s.to_vector<int64_t>()[size_t(i)], 3 * i);
}

TEST(Dist, BadArgumentsNameTheCollective) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  Tensor m = zeros({3, 4});
  EXPECT_AG_ERROR(pg().all_reduce(m.transpose(0, 1), dist::ReduceOp::Sum),
                  "[all_reduce] expected a contiguous tensor, got shape [4, 3]");
  EXPECT_AG_ERROR(pg().all_reduce(zeros({2}, kInt64), dist::ReduceOp::Avg),
                  "[all_reduce] avg needs a floating tensor, got int64");
  EXPECT_AG_ERROR(pg().broadcast(m, pg().size()), "[broadcast] the source rank must be in [0, ");
  EXPECT_AG_ERROR(pg().set_timeout(std::chrono::milliseconds(0)), "the timeout must be positive");
  pg().barrier();  // every rank still in step after the refusals (none reached MPI)
}

// ---- Lite with strategy "ddp" -------------------------------------------------------------

namespace {

std::shared_ptr<nn::Sequential> make_mlp() {
  return std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(16, 4)});
}

// 20 steps on rank r's B samples of a global batch of size * B, against one process that
// trains a copy of rank 0's initial model on all size * B samples: the same parameters.
template <class MakeOpt>
void expect_ddp_matches_one_process(const MakeOpt& make_opt, double tol) {
  const int r = pg().rank(), n = pg().size();
  const int64_t B = 6;
  manual_seed(1000 + uint64_t(r));  // a different initialisation on every rank: setup must broadcast rank 0's
  auto net = make_mlp();
  auto opt = make_opt(net->parameters());
  Lite lite({.accelerator = "cpu", .precision = "32-true", .strategy = "ddp"});
  EXPECT_EQ(lite.rank(), r);
  EXPECT_EQ(lite.world_size(), n);
  auto [model, o] = lite.setup(net, *opt);
  // The reference: rank 0's initial parameters (every rank holds them now), one process.
  auto ref = make_mlp();
  {
    NoGradGuard ng;
    const auto src = net->parameters();
    const auto dst = ref->parameters();
    for (size_t i = 0; i < src.size(); ++i) Tensor(dst[i]).copy_(src[i]);
  }
  auto ref_opt = make_opt(ref->parameters());
  for (int step = 0; step < 20; ++step) {
    manual_seed(77 + uint64_t(step));  // the same global batch on every rank
    const Tensor x = randn({n * B, 8}), y = randint(0, 4, {n * B});
    o.zero_grad();
    lite.backward(cross_entropy(model(narrow(x, 0, r * B, B)), narrow(y, 0, r * B, B)));
    o.step();
    ref_opt->zero_grad();
    cross_entropy(ref->forward(x), y).backward();
    ref_opt->step();
  }
  const auto got = net->parameters(), want = ref->parameters();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(agt::allclose(got[i], want[i], 0, tol)) << "parameter " << i;
  // and every rank holds the same values
  for (const Tensor& p : got) {
    Tensor mx = p.detach().clone(), mn = p.detach().clone();
    pg().all_reduce(mx, dist::ReduceOp::Max);
    pg().all_reduce(mn, dist::ReduceOp::Min);
    EXPECT_TRUE(agt::allclose(mx, mn, 0, 0));
  }
}

}  // namespace

TEST(LiteDdp, SgdMatchesOneProcessWithTheWholeBatch) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  expect_ddp_matches_one_process(
      [](std::vector<Tensor> p) { return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = 0.1, .momentum = 0.9}); },
      1e-6);
}

TEST(LiteDdp, AdamWMatchesOneProcessWithTheWholeBatch) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  expect_ddp_matches_one_process(
      [](std::vector<Tensor> p) { return std::make_unique<optim::AdamW>(p, optim::AdamWOptions{.lr = 1e-2}); }, 1e-6);
}

TEST(LiteDdp, CollectivesRank0OnlyPrintAndSave) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  Lite lite({.accelerator = "cpu", .precision = "32-true", .strategy = "ddp"});
  EXPECT_EQ(lite.is_global_zero(), pg().rank() == 0);
  Tensor t = full({3}, double(lite.rank() + 1));
  lite.all_reduce(t, dist::ReduceOp::Sum);
  EXPECT_EQ(t.to_vector<double>(), std::vector<double>(3, lite.world_size() * (lite.world_size() + 1) / 2.0));
  EXPECT_EQ(lite.all_gather(scalar_tensor(double(lite.rank()))).sizes(), Shape({lite.world_size()}));
  // save: rank 0 writes the one file (a name per job, so that ranks agree on it), every
  // rank then reads it
  Tensor job = scalar_tensor(int64_t(::getpid()));
  lite.broadcast(job, 0);
  const std::string path = ::testing::TempDir() + "ddp-" + std::to_string(job.item<int64_t>()) + ".safetensors";
  int64_t counter = 40 + lite.rank();  // differs by rank: only rank 0's value is written
  lite.save(path, {{"counter", counter}});
  int64_t back = -1;
  lite.load(path, {{"counter", back}});
  EXPECT_EQ(back, 40);
  lite.barrier();
  if (lite.is_global_zero()) std::remove(path.c_str());
  EXPECT_AG_ERROR(Lite({.accelerator = "cpu", .strategy = "fsdp"}), "[Lite] unknown strategy \"fsdp\" (single, ddp)");
}

// Every sample once per epoch across the ranks (and the padding when the size does not
// divide), each epoch in a new order that the ranks agree on.
TEST(LiteDdp, DataLoaderGivesEachRankItsShard) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  Lite lite({.accelerator = "cpu", .precision = "32-true", .strategy = "ddp"});
  const int n = lite.world_size();
  for (int64_t size : {int64_t(12), int64_t(13)}) {
    SCOPED_TRACE("dataset of " + std::to_string(size));
    manual_seed(9 + uint64_t(lite.rank()));  // ranks' generators differ: the shared seed must not
    auto ds = std::make_shared<data::TensorDataset>(arange(0, double(size)).reshape({size, 1}), zeros({size}, kInt64));
    auto loader = lite.setup_dataloader(data::DataLoader(ds, {.batch_size = 4, .shuffle = true}));
    const int64_t per = (size + n - 1) / n;
    EXPECT_EQ(loader.loader().shard_size(), per);
    std::vector<std::vector<int64_t>> epochs;
    for (int e = 0; e < 2; ++e) {
      std::vector<double> mine;
      for (const auto& b : loader)
        for (double v : b.input.to_vector<double>()) mine.push_back(v);
      ASSERT_EQ(int64_t(mine.size()), per);
      const auto all = lite.all_gather(from_vector(mine, {per})).to_vector<double>();
      std::vector<int64_t> count(size_t(size), 0);
      for (double v : all) ++count[size_t(v)];
      int64_t twice = 0;
      for (int64_t c : count) {
        EXPECT_GE(c, 1);
        twice += c - 1;
      }
      EXPECT_EQ(twice, per * n - size);  // the padding, and nothing else, repeats
      epochs.emplace_back(all.begin(), all.end());
    }
    if (size > 2) EXPECT_NE(epochs[0], epochs[1]);  // reshuffled per epoch
  }
}

// Rank 1 stops calling the collectives: rank 0's all_reduce ends after the timeout with an
// error naming rank 1 (run.sh then checks that the job ended rather than hung).
TEST(DistFailure, HungRankIsNamed) {
  if (failure_case() != "hang") GTEST_SKIP() << "runs alone, from tests/dist/run.sh";
  ASSERT_GE(pg().size(), 2);
  pg().barrier();
  if (pg().rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(30));  // never calls all_reduce
    return;
  }
  pg().set_timeout(std::chrono::milliseconds(2000));
  Tensor t = ones({4});
  const std::string err = agt::error_of([&] { pg().all_reduce(t, dist::ReduceOp::Sum); });
  EXPECT_TRUE(agt::contains(err, "[all_reduce] rank 0 of 2 waited 2 s in all_reduce (collective 2) for rank 1, "
                                 "which never reached it"))
      << err;
  EXPECT_AG_ERROR(pg().barrier(), "the process group is unusable after an earlier error");
}

// Rank 1 dies: the job ends (the launcher or rank 0's timeout), naming rank 1.
TEST(DistFailure, DeadRankEndsTheJob) {
  if (failure_case() != "dead") GTEST_SKIP() << "runs alone, from tests/dist/run.sh";
  ASSERT_GE(pg().size(), 2);
  pg().barrier();
  if (pg().rank() == 1) std::raise(SIGKILL);
  pg().set_timeout(std::chrono::milliseconds(5000));
  Tensor t = ones({4});
  pg().all_reduce(t, dist::ReduceOp::Sum);  // never completes
  ADD_FAILURE() << "all_reduce completed without rank 1";
}
