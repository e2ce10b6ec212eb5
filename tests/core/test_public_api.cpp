// Tensor methods no other suite reaches: detach_ (in place, outside the graph) and
// expand_as (a broadcast view to another tensor's shape).
#include "support/testing.h"

using namespace ag;

// A non-leaf leaves the graph in place: no grad_fn, no gradient required, the same handle
// and the same data; every handle on it sees that, and ops on it record nothing. A leaf
// that required grad stops requiring it.
TEST(PublicApi, DetachInPlaceLeavesTheGraph) {
  Tensor x = from_vector<double>({1, -2, 3}, {3}).requires_grad_();
  Tensor y = x * 2.0;
  const Tensor other = y;  // a second handle on the same tensor
  ASSERT_TRUE(y.requires_grad());
  ASSERT_FALSE(y.is_leaf());
  const void* data = y.raw_data();

  Tensor& r = y.detach_();
  EXPECT_EQ(&r, &y);
  for (const Tensor* t : {static_cast<const Tensor*>(&y), &other}) {
    EXPECT_FALSE(t->requires_grad());
    EXPECT_TRUE(t->is_leaf());
    EXPECT_EQ(t->grad_fn(), nullptr);
  }
  EXPECT_EQ(y.raw_data(), data);
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{2, -4, 6}));
  EXPECT_FALSE((y * 3.0).requires_grad());
  EXPECT_AG_ERROR((y * 3.0).sum().backward(), "does not require grad and has no grad_fn");

  x.detach_();
  EXPECT_FALSE(x.requires_grad());
  EXPECT_TRUE(x.is_leaf());
  EXPECT_FALSE((x * 2.0).requires_grad());
  // A tensor that was never in the graph is left as it is.
  Tensor plain = ones({2});
  EXPECT_FALSE(plain.detach_().requires_grad());
}

// expand_as(o) is expand(o's shape): a view of the same storage with stride 0 along the
// broadcast dims (leading ones included), whose gradient sums over them.
TEST(PublicApi, ExpandAsIsABroadcastViewToTheOtherShape) {
  const Tensor b = from_vector<double>({1, 2, 3}, {3, 1});
  const Tensor target = zeros({2, 3, 4}, kFloat32);  // only its shape matters
  const Tensor e = b.expand_as(target);
  EXPECT_EQ(e.sizes(), target.sizes());
  EXPECT_EQ(e.dtype(), kFloat64);
  EXPECT_TRUE(e.is_alias_of(b));
  EXPECT_EQ(e.strides(), (std::vector<int64_t>{0, 1, 0}));
  const auto v = e.to_vector<double>();
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(v[size_t((i * 3 + j) * 4 + k)], double(j + 1)) << i << j << k;
  // The same shape: the same values, still a view.
  EXPECT_TRUE(b.expand_as(zeros({3, 1})).is_alias_of(b));
  EXPECT_EQ(b.expand_as(zeros({3, 1})).to_vector<double>(), b.to_vector<double>());
  // Gradients: each element's is the sum over the copies it was broadcast to.
  EXPECT_TRUE(agt::gradcheck([&](const std::vector<Tensor>& in) { return in[0].expand_as(target) * in[1]; },
                             {agt::rand64({3, 1}), agt::rand64({2, 3, 4})}));
  EXPECT_AG_ERROR(b.expand_as(zeros({3, 2, 2})), "[expand] cannot expand shape [3, 1] to [3, 2, 2]");
}
