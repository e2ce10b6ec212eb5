// The distributions of what ampgrad draws: the DataLoader's shuffle (every element reaches
// every position equally often, every order of a small set is equally likely) and GPT
// sampling at a temperature (tokens drawn as often as softmax(logits / T) says).
//
// Each test draws from a fixed range of seeds, so it is deterministic: the significance
// below is the chance that a correct generator would have failed for the seeds picked.
#include "support/testing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

using namespace ag;

namespace {

constexpr double kAlpha = 1e-3;

// One epoch's order from a loader over agt::numbered(n) with batch_size n.
std::vector<int64_t> order_of(const data::DataLoader& loader) { return agt::flat(agt::epoch(loader)); }

bool is_permutation_of_n(std::vector<int64_t> order, int64_t n) {
  std::sort(order.begin(), order.end());
  std::vector<int64_t> iota(static_cast<size_t>(n));
  std::iota(iota.begin(), iota.end(), 0);
  return order == iota;
}

// Every element at every position, as often as uniform permutations put it there.
//
// The n x n table of counts (element, position) over N orders has every row and column
// summing to N, so its cells are not the independent cells of one multinomial: for uniform
// permutations Pearson's sum over the n^2 cells tends to n / (n - 1) times a chi-square
// variable with (n - 1)^2 degrees of freedom (the count vector's covariance is N / (n - 1)
// on the (n - 1)^2 dimensions orthogonal to the row and column sums and zero on those
// sums, by the table's symmetry under relabelling elements and positions). So the sum is
// scaled by (n - 1) / n and compared with the chi-square critical value for (n - 1)^2
// degrees of freedom: 49 for n = 8, about 85.35 at significance 0.001.
void expect_uniform_positions(const std::vector<std::vector<int64_t>>& orders, int64_t n, const std::string& what) {
  SCOPED_TRACE(what);
  std::vector<double> counts(size_t(n * n), 0.0);
  for (const auto& o : orders) {
    ASSERT_TRUE(is_permutation_of_n(o, n)) << "an epoch's order is not a permutation of [0, " << n << ")";
    for (int64_t pos = 0; pos < n; ++pos) counts[size_t(o[size_t(pos)] * n + pos)] += 1;
  }
  for (int64_t e = 0; e < n; ++e)
    for (int64_t pos = 0; pos < n; ++pos)
      EXPECT_GT(counts[size_t(e * n + pos)], 0) << "element " << e << " never reached position " << pos;
  const std::vector<double> expected(counts.size(), double(orders.size()) / double(n));
  const double q = agt::chi_square(counts, expected) * double(n - 1) / double(n);
  const int df = int((n - 1) * (n - 1));
  EXPECT_LT(q, agt::chi_square_critical(df, kAlpha))
      << "positions are not uniform over " << orders.size() << " orders: chi-square " << q << " with " << df
      << " degrees of freedom";
}

}  // namespace

// The loader's shuffle, seeded (shuffle_seed: 1000 seeds, 8 epochs each) and from the
// global generator (8000 epochs after one manual_seed).
TEST(ShuffleDistribution, EveryElementReachesEveryPositionUniformly) {
  const int64_t n = 8;
  const auto ds = agt::numbered(n);
  std::vector<std::vector<int64_t>> orders;
  for (uint64_t seed = 0; seed < 1000; ++seed) {
    data::DataLoader loader(ds, {.batch_size = n, .shuffle = true, .prefetch = false, .shuffle_seed = seed});
    for (int e = 0; e < 8; ++e) orders.push_back(order_of(loader));
  }
  expect_uniform_positions(orders, n, "shuffle_seed 0..999, epochs 0..7");

  orders.clear();
  manual_seed(20240);
  data::DataLoader loader(ds, {.batch_size = n, .shuffle = true, .prefetch = false});
  for (int e = 0; e < 8000; ++e) orders.push_back(order_of(loader));
  expect_uniform_positions(orders, n, "the global generator, 8000 epochs");
}

// All 24 orders of 4 elements equally often: Pearson's statistic over the 24 counts of
// 6000 orders (shuffle_seed 0..749, 8 epochs each) against the chi-square critical value
// for 23 degrees of freedom, about 49.73 at significance 0.001.
TEST(ShuffleDistribution, EveryOrderOfFourElementsIsEquallyLikely) {
  const int64_t n = 4;
  const auto ds = agt::numbered(n);
  std::vector<std::vector<int64_t>> all;  // the 24 orders, lexicographic
  std::vector<int64_t> p = {0, 1, 2, 3};
  do all.push_back(p);
  while (std::next_permutation(p.begin(), p.end()));
  std::vector<double> counts(all.size(), 0.0);
  int64_t total = 0;
  for (uint64_t seed = 0; seed < 750; ++seed) {
    data::DataLoader loader(ds, {.batch_size = n, .shuffle = true, .prefetch = false, .shuffle_seed = seed});
    for (int e = 0; e < 8; ++e) {
      const std::vector<int64_t> o = order_of(loader);
      const auto it = std::find(all.begin(), all.end(), o);
      ASSERT_NE(it, all.end()) << "an epoch's order is not a permutation of [0, 4)";
      counts[size_t(it - all.begin())] += 1;
      ++total;
    }
  }
  for (size_t i = 0; i < all.size(); ++i)
    EXPECT_GT(counts[i], 0) << "order " << ::testing::PrintToString(all[i]) << " never drawn";
  const std::vector<double> expected(all.size(), double(total) / double(all.size()));
  const double q = agt::chi_square(counts, expected);
  EXPECT_LT(q, agt::chi_square_critical(23, kAlpha)) << "chi-square " << q << " with 23 degrees of freedom";
}

namespace {

Tensor parameter(const nn::Module& m, const std::string& name) {
  for (const auto& [n, t] : m.named_parameters())
    if (n == name) return t;
  ADD_FAILURE() << "no parameter " << name;
  return Tensor();
}

// Makes `gpt` give `logits` at every position whatever the context: the final norm's
// weight is zero and its bias the first unit vector, so every row the head sees is e_0,
// and the head's first column is the logits (exact in float32: one product by 1, the rest
// by 0).
void fix_logits(nn::GPT& gpt, const std::vector<float>& logits) {
  const int64_t V = int64_t(logits.size()), W = gpt.config().width;
  std::vector<float> e0(size_t(W), 0.0f), head(size_t(V * W), 0.0f);
  e0[0] = 1.0f;
  for (int64_t v = 0; v < V; ++v) head[size_t(v * W)] = logits[size_t(v)];
  NoGradGuard ng;
  parameter(gpt, "ln_f.weight").zero_();
  parameter(gpt, "ln_f.bias").copy_(from_vector<float>(e0, {W}));
  parameter(gpt, "head.weight").copy_(from_vector<float>(head, {V, W}));
}

}  // namespace

// With fixed logits, 3000 tokens drawn at each temperature against softmax(logits / T) in
// float64: Pearson's statistic over the 6 tokens' counts against the chi-square critical
// value for 5 degrees of freedom, about 20.52 at significance 0.001.
TEST(GptSampling, FrequenciesFollowTheSoftmaxAtTheTemperature) {
  const std::vector<float> logits = {0.75f, 0.25f, 0.0f, -0.5f, -1.0f, 1.25f};
  const int64_t V = int64_t(logits.size()), draws = 3000;
  manual_seed(6);
  nn::GPT gpt(nn::GPTConfig{.vocab_size = V, .block_size = 4, .layers = 1, .heads = 1, .width = 4});
  fix_logits(gpt, logits);
  {
    NoGradGuard ng;
    const Tensor out = gpt.forward(from_vector<int64_t>({3, 1, 4, 1}, {1, 4}));
    for (int64_t t = 0; t < 4; ++t)
      ASSERT_EQ(out.select(1, t).squeeze(0).to_vector<float>(), logits) << "the logits at position " << t;
  }
  uint64_t seed = 100;
  for (double T : {0.5, 1.0, 2.0}) {
    SCOPED_TRACE("temperature " + std::to_string(T));
    std::vector<double> p(static_cast<size_t>(V));
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += p[size_t(v)] = std::exp(double(logits[size_t(v)]) / T);
    std::vector<double> expected(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v) expected[size_t(v)] = double(draws) * p[size_t(v)] / z;
    // Pearson's approximation wants every expected count at 5 or more.
    ASSERT_GE(*std::min_element(expected.begin(), expected.end()), 5.0);
    const std::vector<int64_t> tokens = gpt.generate({0}, draws, T, seed++);
    ASSERT_EQ(int64_t(tokens.size()), draws + 1);
    std::vector<double> counts(size_t(V), 0.0);
    for (size_t i = 1; i < tokens.size(); ++i) {
      ASSERT_TRUE(tokens[i] >= 0 && tokens[i] < V) << tokens[i];
      counts[size_t(tokens[i])] += 1;
    }
    const double q = agt::chi_square(counts, expected);
    EXPECT_LT(q, agt::chi_square_critical(int(V - 1), kAlpha))
        << "chi-square " << q << " with " << V - 1 << " degrees of freedom; counts "
        << ::testing::PrintToString(counts) << ", expected " << ::testing::PrintToString(expected);
  }
}

// The critical values against the printed tables (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.4).
TEST(ChiSquare, CriticalValuesMatchTheTables) {
  EXPECT_NEAR(agt::chi_square_critical(1, 0.05), 3.841, 1e-3);
  EXPECT_NEAR(agt::chi_square_critical(2, 0.05), 5.991, 1e-3);
  EXPECT_NEAR(agt::chi_square_critical(5, 0.001), 20.515, 1e-3);
  EXPECT_NEAR(agt::chi_square_critical(10, 0.01), 23.209, 1e-3);
  EXPECT_NEAR(agt::chi_square_critical(23, 0.001), 49.728, 1e-3);
  EXPECT_NEAR(agt::chi_square_critical(49, 0.001), 85.351, 1e-3);
  EXPECT_DOUBLE_EQ(agt::chi_square({3, 5}, {4, 4}), 0.5);
}
