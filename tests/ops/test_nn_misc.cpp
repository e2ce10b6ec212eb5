// embedding and dropout: values, gradients, the seeded generator, and error messages.
#include "support/testing.h"

#include <cmath>

using namespace ag;
using TL = std::vector<Tensor>;

TEST(NnMisc, EmbeddingPicksRows) {
  manual_seed(41);
  Tensor w = rand({5, 3});
  Tensor idx = from_vector<int64_t>({4, 0, 4, 2, 1, 3}, {2, 3});
  Tensor e = embedding(idx, w);
  EXPECT_EQ(e.sizes(), std::vector<int64_t>({2, 3, 3}));
  const auto wv = w.to_vector<float>(), ev = e.to_vector<float>();
  const auto iv = idx.to_vector<int64_t>();
  for (size_t i = 0; i < iv.size(); ++i)
    for (size_t j = 0; j < 3; ++j) EXPECT_EQ(ev[i * 3 + j], wv[size_t(iv[i]) * 3 + j]);
  // int32 indices, a 0-dim index, bfloat16 weights
  EXPECT_TRUE(agt::allclose(embedding(idx.to(kInt32), w), e, 0, 0));
  EXPECT_EQ(embedding(scalar_tensor(2, kInt64), w).sizes(), std::vector<int64_t>({3}));
  EXPECT_TRUE(agt::allclose(embedding(idx, w.to(kBFloat16)), e.to(kBFloat16), 0, 0));
}

TEST(NnMisc, EmbeddingGradientSumsRepeatedRows) {
  manual_seed(42);
  Tensor w = agt::rand64({6, 4});
  Tensor idx = from_vector<int64_t>({1, 5, 1, 0, 5, 1}, {3, 2});
  EXPECT_TRUE(agt::gradcheck([&](const TL& in) { return embedding(idx, in[0]); }, {w}));
  w.set_grad(Tensor());
  embedding(idx, w).backward(ones({3, 2, 4}, kFloat64));
  const auto g = w.grad().to_vector<double>();
  const double counts[6] = {1, 3, 0, 0, 0, 2};
  for (int r = 0; r < 6; ++r)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(g[size_t(r * 4 + j)], counts[r]);
}

TEST(NnMisc, EmbeddingErrors) {
  Tensor w = zeros({5, 3});
  EXPECT_AG_ERROR(embedding(from_vector<int64_t>({1, 5}, {2}), w),
                  "[embedding] index 5 is out of range for an embedding of 5 rows (weight shape [5, 3])");
  EXPECT_AG_ERROR(embedding(from_vector<int64_t>({-1}, {1}), w), "[embedding] index -1 is out of range");
  EXPECT_AG_ERROR(embedding(zeros({2}), w), "[embedding] indices must be int64 or int32, got float32");
  EXPECT_AG_ERROR(embedding(zeros({2}, kInt64), zeros({5})), "[embedding] weight must be 2-D [num_embeddings, embedding_dim], got shape [5]");
}

TEST(NnMisc, DropoutKeepsOrZeroesAndScales) {
  manual_seed(43);
  Tensor x = rand({200, 500}) + 1.0;  // no zeros in the input
  const double p = 0.3;
  Tensor y = dropout(x, p, true);
  const auto xv = x.to_vector<float>(), yv = y.to_vector<float>();
  size_t dropped = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    if (yv[i] == 0) {
      ++dropped;
    } else {
      EXPECT_NEAR(yv[i], xv[i] / (1 - p), 1e-6 * xv[i] / (1 - p) * 4) << i;
      if (std::fabs(yv[i] - xv[i] / (1 - p)) > 1e-5) break;
    }
  }
  // 100000 Bernoulli(0.3) draws: the fraction is within 0.3 +- 0.006 (4 standard deviations)
  EXPECT_NEAR(double(dropped) / double(xv.size()), p, 0.006);
  // the seeded generator reproduces the mask
  manual_seed(43);
  Tensor x2 = rand({200, 500}) + 1.0;
  EXPECT_TRUE(agt::allclose(dropout(x2, p, true), y, 0, 0));
}

TEST(NnMisc, DropoutGradientIsTheScaledMask) {
  manual_seed(44);
  Tensor x = (rand({64, 32}) + 1.0).requires_grad_();
  Tensor y = dropout(x, 0.5, true);
  y.backward(ones({64, 32}));
  const auto yv = y.to_vector<float>(), xv = x.detach().to_vector<float>(), g = x.grad().to_vector<float>();
  for (size_t i = 0; i < yv.size(); ++i) EXPECT_FLOAT_EQ(g[i], yv[i] == 0 ? 0.0f : 2.0f) << i;
  (void)xv;
}

TEST(NnMisc, DropoutSpecialCases) {
  manual_seed(45);
  Tensor x = rand({8, 8}).requires_grad_();
  // eval mode and p = 0 return the input itself
  EXPECT_EQ(dropout(x, 0.5, false).unsafe_impl(), x.unsafe_impl());
  EXPECT_EQ(dropout(x, 0.0, true).unsafe_impl(), x.unsafe_impl());
  // p = 1 drops everything, and the gradient is zero
  Tensor y = dropout(x, 1.0, true);
  EXPECT_TRUE(agt::allclose(y, zeros({8, 8}), 0, 0));
  y.backward(ones({8, 8}));
  EXPECT_TRUE(agt::allclose(x.grad(), zeros({8, 8}), 0, 0));
  // 16-bit inputs keep their dtype
  Tensor h = dropout(rand({16, 16}, kBFloat16), 0.25, true);
  EXPECT_EQ(h.dtype(), kBFloat16);
  EXPECT_AG_ERROR(dropout(x, 1.5, true), "[dropout] p must be in [0, 1], got 1.5");
  EXPECT_AG_ERROR(dropout(x, -0.1, false), "[dropout] p must be in [0, 1], got -0.1");
}
