// The process group's collectives, run by tests/dist/run.sh under mpirun (2 ranks; every
// test also holds for 1). Values are built from the rank, so each rank can check what the
// others sent. The failure cases (a rank that hangs, one that dies) run only when
// AMPGRAD_DIST_CASE names them, each in its own mpirun, since they end the job.
#include "support/testing.h"

#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <limits>
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

// In their own type: an average divides first (60000 / n + 50000 / n stays in range), and
// the values come back in float16 and bfloat16 rounding.
TEST(Dist, HalfPrecisionReducesInHalfOnRequest) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  const int r = pg().rank(), n = pg().size();
  for (DType dt : {kFloat16, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor t = full({5}, 60000.0 - 10000.0 * r, dt);
    pg().all_reduce(t, dist::ReduceOp::Avg, /*reduce_in_half=*/true);
    EXPECT_EQ(t.dtype(), dt);
    EXPECT_TRUE(agt::allclose(t, full({5}, 60000.0 - 10000.0 * (n - 1) / 2.0), agt::tol_for(dt)));
    Tensor s = full({3}, r + 1.0, dt), mx = s.clone(), mn = s.clone();
    pg().all_reduce(s, dist::ReduceOp::Sum, true);
    pg().all_reduce(mx, dist::ReduceOp::Max, true);
    pg().all_reduce(mn, dist::ReduceOp::Min, true);
    EXPECT_EQ(s.to_vector<double>(), std::vector<double>(3, n * (n + 1) / 2.0));
    EXPECT_EQ(mx.to_vector<double>(), std::vector<double>(3, double(n)));
    EXPECT_EQ(mn.to_vector<double>(), std::vector<double>(3, 1.0));
  }
}

// Reductions started together finish in order, each with its own result, while the
// caller goes on; a float16 one is rounded only by wait().
TEST(Dist, AsyncReductionsOverlapTheCaller) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  const int r = pg().rank(), n = pg().size();
  std::vector<Tensor> ts;
  std::vector<dist::Work> works;
  for (int i = 0; i < 6; ++i) {
    ts.push_back(full({1000 * (i + 1)}, double(r + i), i % 2 ? kFloat16 : kFloat32));
    works.push_back(pg().all_reduce_async(ts.back(), dist::ReduceOp::Sum));
  }
  Tensor busy = randn({64, 64});
  for (int k = 0; k < 10; ++k) busy = matmul(busy, busy).tanh();  // the caller's own work meanwhile
  for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();  // any order of waiting
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(works[size_t(i)].completed());
    EXPECT_EQ(ts[size_t(i)].to_vector<double>(), std::vector<double>(size_t(1000 * (i + 1)), n * (n - 1) / 2.0 + n * i))
        << "reduction " << i;
  }
}

// The reducer starts a bucket during backward as soon as its gradients are in (the last
// layer's, before the first layer's gradient arrives), and its averages are the ranks'.
TEST(Dist, GradReducerStartsBucketsDuringBackward) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  const int r = pg().rank();
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlap" : "after backward");
    manual_seed(5);
    nn::Linear l1(6, 5), l2(5, 3);
    const std::vector<Tensor> params = {l1.weight, l1.bias, l2.weight, l2.bias};
    dist::GradReducer reducer(pg(), {.bucket_bytes = 1, .overlap = overlap});
    size_t started_before_first = 99;
    l1.weight.register_hook([&](const Tensor& g) {  // runs before the reducer hears of l1.weight
      started_before_first = reducer.buckets_started();
      return g;
    });
    reducer.add_parameters(params);
    reducer.add_parameters({l2.weight});  // known already: no new bucket
    ASSERT_EQ(reducer.num_parameters(), 4u);
    ASSERT_EQ(reducer.num_buckets(), 4u);
    manual_seed(30 + uint64_t(r));
    const Tensor x = randn({4, 6});
    auto loss = [&] { return l2.forward(relu(l1.forward(x))).pow(2).sum(); };
    loss().backward();  // not prepared: the hooks stand by, and this rank's own gradients stay
    std::vector<Tensor> want;
    for (const Tensor& p : params) {
      want.push_back(p.grad().clone());
      p.set_grad(Tensor());
    }
    reducer.prepare();
    loss().backward();
    reducer.finish();
    if (overlap) {  // l2's two buckets at least (l1.bias's too if it came first)
      EXPECT_GE(started_before_first, 2u);
      EXPECT_LT(started_before_first, 4u);
    } else {
      EXPECT_EQ(started_before_first, 0u);
    }
    EXPECT_EQ(reducer.buckets_started(), 4u);
    for (size_t i = 0; i < params.size(); ++i) {
      // want holds this rank's gradient: average it here, the plain way
      pg().all_reduce(want[i], dist::ReduceOp::Avg);
      EXPECT_TRUE(agt::allclose(params[i].grad(), want[i], 0, 1e-7)) << "parameter " << i;
    }
  }
}

// A gradient the user replaced with a view (here an expanded one, from a post-accumulate
// hook that runs before the reducer's): the averaged values are written back into memory the
// gradient owns, not through the view (whose elements share memory).
TEST(Dist, GradReducerWritesBackIntoAGradientSetToAView) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  const int r = pg().rank(), n = pg().size();
  for (int64_t bucket_bytes : {int64_t(1), int64_t(1) << 20}) {  // a bucket each, or one for all
    SCOPED_TRACE(bucket_bytes);
    Tensor a = zeros({3, 4}).requires_grad_(), b = zeros({4}).requires_grad_();
    const Tensor row = from_vector<float>({1, 2, 3, 4}, {1, 4}) * float(r + 1);
    a.register_post_accumulate_grad_hook([&](const Tensor& p) { p.set_grad(row.expand({3, 4})); });
    dist::GradReducer reducer(pg(), {.bucket_bytes = bucket_bytes});
    reducer.add_parameters({a, b});
    reducer.prepare();
    (a.sum() + (b * 2.0).sum()).backward();
    reducer.finish();
    const double mean_factor = double(n + 1) / 2;  // the average of r + 1 over the ranks
    std::vector<double> want;
    for (int i = 0; i < 3; ++i)
      for (double v : {1.0, 2.0, 3.0, 4.0}) want.push_back(v * mean_factor);
    EXPECT_EQ(a.grad().to_vector<double>(), want);
    EXPECT_TRUE(a.grad().is_non_overlapping_and_dense());
    EXPECT_EQ(row.to_vector<double>(), (std::vector<double>{1.0 * (r + 1), 2.0 * (r + 1), 3.0 * (r + 1), 4.0 * (r + 1)}));
    EXPECT_EQ(b.grad().to_vector<double>(), std::vector<double>(4, 2.0));
  }
}

// ReducerOptions::reduce_in_half: 16-bit gradients averaged in their own type (each rank's
// share k / n rounded to the type, then the shares summed) or widened to float32, averaged
// and rounded once. Gradients of a few times u, the type's smallest subnormal (2^-24 for
// float16, 2^-133 for bfloat16), make both exact integer arithmetic in steps of u: a share
// or a mean that falls halfway between two steps goes to the even one. With 2 ranks, k = 1
// on both averages to 0 in half (each half rounds to 0) and to 1 in float32.
TEST(Dist, GradReducerReducesHalfGradientsInTheirOwnTypeOnRequest) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  const int r = pg().rank(), n = pg().size();
  // k / n rounded half to even
  auto steps_of = [](int64_t k, int64_t n) {
    const int64_t q = k / n, twice_rem = 2 * (k % n);
    return twice_rem > n || (twice_rem == n && q % 2 == 1) ? q + 1 : q;
  };
  // Rank q's gradient in steps of u, per element: two parameters of 3 elements, one bucket.
  auto k_of = [](int q) { return std::vector<int64_t>{1, 1 + 4 * q, 3, 2 + 2 * q, 7 + 2 * q, 6}; };
  std::vector<double> in_half(6, 0), widened(6, 0);
  for (size_t i = 0; i < 6; ++i) {
    int64_t sum = 0;
    for (int q = 0; q < n; ++q) {
      in_half[i] += double(steps_of(k_of(q)[i], n));
      sum += k_of(q)[i];
    }
    widened[i] = double(steps_of(sum, n));
  }
  if (n == 2) {  // the first three elements tell the two apart
    EXPECT_EQ(in_half, (std::vector<double>{0, 2, 4, 3, 8, 6}));
    EXPECT_EQ(widened, (std::vector<double>{1, 3, 3, 3, 8, 6}));
  }
  for (DType dt : {kFloat16, kBFloat16}) {
    const double u = std::ldexp(1.0, dt == kFloat16 ? -24 : -133);
    for (bool half : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (half ? ", reduce_in_half" : ", in float32"));
      const Tensor a = ones({3}, dt).requires_grad_(), b = ones({3}, dt).requires_grad_();
      dist::GradReducer reducer(pg(), {.reduce_in_half = half});
      reducer.add_parameters({a, b});
      ASSERT_EQ(reducer.num_buckets(), 1u);
      std::vector<double> mine;
      for (int64_t k : k_of(r)) mine.push_back(double(k) * u);
      const Tensor g = from_vector(mine, {6}).to(dt);  // exact: whole steps of u
      reducer.prepare();
      ((a * narrow(g, 0, 0, 3)).sum() + (b * narrow(g, 0, 3, 3)).sum()).backward();
      reducer.finish();
      std::vector<double> got = a.grad().to_vector<double>(), got_b = b.grad().to_vector<double>();
      got.insert(got.end(), got_b.begin(), got_b.end());
      for (double& v : got) v /= u;
      EXPECT_EQ(a.grad().dtype(), dt);
      EXPECT_EQ(got, half ? in_half : widened);
    }
  }
}

// A parameter that gets no gradient is named (on every rank alike, here), and the reducer
// is usable again for the next pass.
TEST(Dist, GradReducerNamesAParameterWithoutGradient) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  Tensor a = ones({2}).requires_grad_(), unused = ones({3}).requires_grad_();
  dist::GradReducer reducer(pg(), {.bucket_bytes = 1});
  reducer.add_parameters({a, unused});
  reducer.prepare();
  (a * 2.0).sum().backward();
  EXPECT_AG_ERROR(reducer.finish(), "[GradReducer] parameter 1 (shape [3]) got no gradient on rank " +
                                        std::to_string(pg().rank()) + " in this backward pass");
  a.set_grad(Tensor());
  reducer.prepare();
  ((a * 3.0).sum() + unused.sum()).backward();
  reducer.finish();
  EXPECT_EQ(a.grad().to_vector<double>(), std::vector<double>(2, 3.0));
  EXPECT_EQ(unused.grad().to_vector<double>(), std::vector<double>(3, 1.0));
  EXPECT_AG_ERROR(reducer.add_parameters({a * 2.0}), "[GradReducer] parameters must be leaves that require grad");
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
void expect_ddp_matches_one_process(const MakeOpt& make_opt, double tol, const std::string& precision = "32-true",
                                    dist::ReducerOptions ddp = {}) {
  const int r = pg().rank(), n = pg().size();
  const int64_t B = 6;
  manual_seed(1000 + uint64_t(r));  // a different initialisation on every rank: setup must broadcast rank 0's
  auto net = make_mlp();
  auto opt = make_opt(net->parameters());
  Lite lite({.accelerator = "cpu", .precision = precision, .strategy = "ddp", .ddp = ddp});
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
  Lite single({.accelerator = "cpu", .precision = precision});
  auto [ref_model, ref_o] = single.setup(ref, *ref_opt);
  for (int step = 0; step < 20; ++step) {
    manual_seed(77 + uint64_t(step));  // the same global batch on every rank
    const Tensor x = randn({n * B, 8}), y = randint(0, 4, {n * B});
    o.zero_grad();
    lite.backward(cross_entropy(model(narrow(x, 0, r * B, B)), narrow(y, 0, r * B, B)));
    o.step();
    ref_o.zero_grad();
    single.backward(cross_entropy(ref_model(x), y));
    ref_o.step();
  }
  const auto got = net->parameters(), want = ref->parameters();
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(agt::allclose(got[i], want[i], 0, tol)) << "parameter " << i;
    worst = std::max(worst, ag::max((got[i] - want[i]).abs()).item<double>());
  }
  ::testing::Test::RecordProperty("max_abs_difference", std::to_string(worst));
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

// bf16-mixed: the products round to bfloat16 differently when the batch is split (each
// rank's weight gradient is a sum over B samples, not 2B), so the parameters agree to
// within 5e-3 after 20 steps (measured on 2 ranks: 1.2e-3 with SGD and momentum, 2e-4
// with AdamW, on parameters of about 0.3; fp32 gives 1e-7), and the ranks still hold
// equal values.
TEST(LiteDdp, Bf16MixedMatchesOneProcessWithinTolerance) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  expect_ddp_matches_one_process(
      [](std::vector<Tensor> p) { return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = 0.1, .momentum = 0.9}); },
      5e-3, "bf16-mixed");
  expect_ddp_matches_one_process(
      [](std::vector<Tensor> p) { return std::make_unique<optim::AdamW>(p, optim::AdamWOptions{.lr = 1e-2}); }, 5e-3,
      "bf16-mixed");
}

// bf16-true keeps float32 master weights in the optimizer: they are made after setup has
// broadcast rank 0's parameters, so the ranks (initialised differently) stay equal.
TEST(LiteDdp, MasterWeightsStartFromRank0) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  const int r = pg().rank();
  manual_seed(200 + uint64_t(r));
  auto net = make_mlp();
  optim::AdamW adamw(net->parameters(), {.lr = 1e-2});
  Lite lite({.accelerator = "cpu", .precision = "bf16-true", .strategy = "ddp"});
  auto [model, o] = lite.setup(net, adamw);
  for (int step = 0; step < 3; ++step) {
    manual_seed(300 + uint64_t(step) * 10 + uint64_t(r));
    o.zero_grad();
    lite.backward(cross_entropy(model(randn({4, 8}).to(kBFloat16)), randint(0, 4, {4})));
    o.step();
  }
  for (const Tensor& p : net->parameters()) {
    EXPECT_EQ(p.dtype(), kBFloat16);
    Tensor mx = p.detach().to(kFloat32), mn = mx.clone();
    pg().all_reduce(mx, dist::ReduceOp::Max);
    pg().all_reduce(mn, dist::ReduceOp::Min);
    EXPECT_TRUE(agt::allclose(mx, mn, 0, 0));
  }
}

// Precision "auto:measure" under ddp: rank 0 measures, and every rank runs its choice.
TEST(LiteDdp, AutoMeasureRunsRank0sChoiceOnEveryRank) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  const int r = pg().rank();
  manual_seed(500);
  auto net = make_mlp();
  Lite lite({.accelerator = "cpu", .precision = "auto:measure", .strategy = "ddp"});
  TrialOptions o;
  o.steps = 2;
  o.include_emulated = true;  // more candidates than the hardware runs natively, to choose among
  const auto make_opt = [](nn::Module& m) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::AdamW>(m.parameters());
  };
  const auto loss = [](nn::Module& m, const data::Batch& b) { return cross_entropy(m.forward(b.input), b.target); };
  manual_seed(600 + uint64_t(r));  // different batches on each rank: only rank 0's count
  const TrialReport rep = lite.measure_precision(*net, make_opt, loss, {{randn({8, 8}), randint(0, 4, {8})}}, o);
  set_float32_matmul_precision("highest");
  const int64_t mine = int64_t(lite.precision()) * 2 + int64_t(rep.chosen().medium_matmul);
  Tensor mx = scalar_tensor(mine), mn = scalar_tensor(mine);
  pg().all_reduce(mx, dist::ReduceOp::Max);
  pg().all_reduce(mn, dist::ReduceOp::Min);
  EXPECT_EQ(mx.item<int64_t>(), mn.item<int64_t>()) << "the ranks run different precisions";
  EXPECT_EQ(lite.precision_record().how, "auto (trial)");
  if (r == 0) EXPECT_GE(rep.rows.size(), 2u);
  else EXPECT_EQ(rep.rows.size(), 1u);
}

// Gradient accumulation: a backward under no_backward_sync runs no collective, and the
// next one averages the sum of both micro-batches' gradients.
TEST(LiteDdp, NoBackwardSyncAccumulatesThenAverages) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  const int r = pg().rank();
  manual_seed(4);
  auto net = make_mlp(), copy = make_mlp();
  optim::SGD sgd(net->parameters(), {.lr = 0.1});
  Lite lite({.accelerator = "cpu", .precision = "32-true", .strategy = "ddp"});
  auto [model, o] = lite.setup(net, sgd);
  {
    NoGradGuard ng;
    for (size_t i = 0; i < net->parameters().size(); ++i) Tensor(copy->parameters()[i]).copy_(net->parameters()[i]);
  }
  manual_seed(60 + uint64_t(r));
  const Tensor x1 = randn({3, 8}), y1 = randint(0, 4, {3}), x2 = randn({3, 8}), y2 = randint(0, 4, {3});
  o.zero_grad();
  const int64_t calls = pg().calls();
  {
    auto skip = lite.no_backward_sync();
    lite.backward(cross_entropy(model(x1), y1));
  }
  EXPECT_EQ(pg().calls(), calls);  // nothing reduced yet
  lite.backward(cross_entropy(model(x2), y2));
  EXPECT_GT(pg().calls(), calls);
  // the reference: this rank's two gradients summed, averaged over the ranks by hand
  cross_entropy(copy->forward(x1), y1).backward();
  cross_entropy(copy->forward(x2), y2).backward();
  for (size_t i = 0; i < net->parameters().size(); ++i) {
    Tensor want = copy->parameters()[i].grad().clone();
    pg().all_reduce(want, dist::ReduceOp::Avg);
    EXPECT_TRUE(agt::allclose(net->parameters()[i].grad(), want, 0, 1e-6)) << "parameter " << i;
  }
}

// The reducer's options: buckets of one parameter each, reduced after backward, give the
// same result as the defaults.
TEST(LiteDdp, ReducerOptionsKeepTheResult) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  expect_ddp_matches_one_process(
      [](std::vector<Tensor> p) { return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = 0.1, .momentum = 0.9}); },
      1e-6, "32-true", {.bucket_bytes = 1, .overlap = false});
}

// 16-mixed: an overflow on rank 1 alone makes every rank skip the step (the inf flag's
// maximum over the ranks), so parameters and scales stay equal everywhere.
TEST(LiteDdp, OverflowOnOneRankSkipsTheStepOnAll) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  const int r = pg().rank(), n = pg().size();
  manual_seed(3);
  auto net = make_mlp();
  optim::SGD sgd(net->parameters(), {.lr = 0.1});
  Lite lite({.accelerator = "cpu", .precision = "16-mixed", .strategy = "ddp", .scaler = {.init_scale = 1024.0}});
  auto [model, o] = lite.setup(net, sgd);
  auto snapshot = [&] {
    std::vector<Tensor> v;
    for (const Tensor& p : net->parameters()) v.push_back(p.detach().clone());
    return v;
  };
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    manual_seed(50 + uint64_t(step) * 10 + uint64_t(r));
    const auto before = snapshot();
    o.zero_grad();
    const uint64_t syncs = host_sync_count();
    lite.backward(cross_entropy(model(randn({4, 8})), randint(0, 4, {4})));
    // after the averaging: rank 1's gradient alone overflows on step 1
    if (step == 1 && r == 1) Tensor(net->parameters().front().grad()).fill_(std::numeric_limits<double>::infinity());
    o.step();
    EXPECT_EQ(host_sync_count(), syncs);  // the flag is reduced where it lies: nothing read back
    const auto after = snapshot();
    bool changed = false;
    for (size_t i = 0; i < after.size(); ++i) changed = changed || !agt::allclose(after[i], before[i], 0, 0);
    EXPECT_EQ(changed, step != 1 || n == 1) << "rank " << r;
    for (const Tensor& p : after) {  // equal on every rank
      Tensor mx = p.clone(), mn = p.clone();
      pg().all_reduce(mx, dist::ReduceOp::Max);
      pg().all_reduce(mn, dist::ReduceOp::Min);
      EXPECT_TRUE(agt::allclose(mx, mn, 0, 0));
    }
  }
  EXPECT_EQ(lite.skipped_steps(), n > 1 ? 1 : 0);
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

// What a "ddp" Lite reports: its strategy, its one CPU device, its plugin, and the module
// it set up (rank 0's values, broadcast into the module handed to it).
TEST(LiteDdp, AccessorsDescribeTheJob) {
  if (!failure_case().empty()) GTEST_SKIP() << "a failure case runs alone";
  Lite lite({.accelerator = "cpu", .precision = "32-true", .strategy = "ddp"});
  EXPECT_EQ(lite.strategy(), "ddp");
  EXPECT_EQ(lite.devices(), std::vector<Device>{Device(kCPU)});
  EXPECT_EQ(lite.plugin().precision(), Precision::True32);
  manual_seed(400 + uint64_t(pg().rank()));
  auto net = make_mlp();
  auto model = lite.setup_module(net);
  EXPECT_EQ(&model.module(), net.get());
  for (const Tensor& p : model.module().parameters()) {
    Tensor mx = p.detach().clone(), mn = p.detach().clone();
    pg().all_reduce(mx, dist::ReduceOp::Max);
    pg().all_reduce(mn, dist::ReduceOp::Min);
    EXPECT_TRUE(agt::allclose(mx, mn, 0, 0));
  }
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

// ---- CUDA tensors through NCCL (the GPU machine runs these: scripts/gpu-check) ------------

#include "dist/nccl_cases.h"

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
