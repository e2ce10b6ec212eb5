// Calls that used to return a wrong answer without an error: in-place writes through
// overlapping views, true division written into an integer tensor, integer overflow
// (undefined in C++, wrapping in PyTorch), max pooling over windows of -inf, and a state
// dict holding an undefined tensor.
#include "support/testing.h"

#include <cstdint>
#include <limits>

using namespace ag;

namespace {

TEST(Refusals, InPlaceWritesThroughOverlappingViewsAreRefused) {
  Tensor base = zeros({1, 4});
  Tensor e = base.expand({3, 4});  // three rows on one row of memory
  const char* what = "cannot write in place into a tensor whose elements overlap in memory";
  EXPECT_AG_ERROR(e.add_(1.0), std::string("[add_] ") + what);
  EXPECT_AG_ERROR(e.mul_(ones({3, 4})), std::string("[mul_] ") + what);
  EXPECT_AG_ERROR(e.copy_(ones({3, 4})), std::string("[copy_] ") + what);
  EXPECT_AG_ERROR(e.fill_(2.0), std::string("[fill_] ") + what);
  EXPECT_AG_ERROR(e.clamp_(0.0, 1.0), std::string("[clamp_] ") + what);
  EXPECT_AG_ERROR(e.add_(1.0), "shape [3, 4], strides [0, 1]");
  EXPECT_TRUE(agt::allclose(base, zeros({1, 4}), 0, 0)) << "a refused write must not write";

  // Views without overlap still write in place: a transpose, a strided slice, a size-1 dim
  // with stride 0.
  Tensor x = arange(12, kFloat32).reshape({3, 4});
  x.t().add_(1.0);
  EXPECT_TRUE(agt::allclose(x, arange(12, kFloat32).reshape({3, 4}) + 1.0, 0, 0));
  Tensor y = zeros({4, 6});
  y.narrow(1, 1, 3).mul_(0.0).add_(5.0);
  EXPECT_EQ(y.sum().item<double>(), 4 * 3 * 5.0);
  Tensor z = zeros({4}).expand({1, 4});
  z.add_(1.0);
  EXPECT_EQ(z.sum().item<double>(), 4.0);
}

TEST(Refusals, TrueDivisionIntoAnIntegerTensorIsRefused) {
  Tensor i = arange(6, kInt64);
  EXPECT_AG_ERROR(i.div_(2), "[div_] result dtype float32 cannot be cast to the int64 tensor modified in place");
  EXPECT_AG_ERROR(i.div_(full({6}, 0, TensorOptions(kInt64))), "[div_] result dtype float32 cannot be cast");
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  // Out of place it is true division, as torch.div: 1 / 0 is inf, 0 / 0 NaN.
  Tensor q = div(from_vector<int64_t>({1, 0, -3}, {3}), from_vector<int64_t>({0, 0, 2}, {3}));
  EXPECT_EQ(q.dtype(), kFloat32);
  const auto v = q.to_vector<float>();
  EXPECT_TRUE(std::isinf(v[0]) && v[0] > 0);
  EXPECT_TRUE(std::isnan(v[1]));
  EXPECT_EQ(v[2], -1.5f);
}

TEST(Refusals, IntegerOverflowWrapsAsInPyTorch) {
  constexpr int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  const Tensor big = from_vector<int64_t>({hi, lo, 3}, {3});
  EXPECT_EQ(add(big, 1).to_vector<int64_t>(), (std::vector<int64_t>{lo, lo + 1, 4}));
  EXPECT_EQ(sub(big, 1).to_vector<int64_t>(), (std::vector<int64_t>{hi - 1, hi, 2}));
  EXPECT_EQ(mul(big, 2).to_vector<int64_t>(), (std::vector<int64_t>{-2, 0, 6}));
  EXPECT_EQ(neg(big).to_vector<int64_t>(), (std::vector<int64_t>{-hi, lo, -3}));
  EXPECT_EQ(abs(big).to_vector<int64_t>(), (std::vector<int64_t>{hi, lo, 3}));
  EXPECT_EQ(square(big).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 9}));
  const Tensor i32 = from_vector<int32_t>({std::numeric_limits<int32_t>::max(), 65536}, {2});
  EXPECT_EQ(add(i32, i32).to_vector<int32_t>(), (std::vector<int32_t>{-2, 131072}));
  EXPECT_EQ(mul(i32, i32).to_vector<int32_t>(), (std::vector<int32_t>{1, 0}));
  // in place too
  Tensor t = from_vector<int64_t>({hi}, {1});
  t.add_(1);
  EXPECT_EQ(t.item<int64_t>(), lo);
}

// oneDNN's max pooling starts each window at the lowest finite value; a window of -inf
// (and padding) must still give -inf, in every floating dtype.
TEST(Refusals, MaxPoolOverWindowsOfMinusInfinityGivesMinusInfinity) {
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dt : {kFloat32, kBFloat16, kFloat16, kFloat64}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = full({1, 2, 4, 4}, -inf, TensorOptions(dt));
    // one finite value in the second plane's top-left window
    x.select(1, 1).select(1, 0).select(1, 0).fill_(-3.0);
    x.requires_grad_(true);
    Tensor y = max_pool2d(x, {2, 2}, {2, 2}, {1, 1});
    ASSERT_EQ(y.sizes(), std::vector<int64_t>({1, 2, 3, 3}));
    const auto v = y.to(kFloat64).to_vector<double>();
    for (size_t i = 0; i < v.size(); ++i) {
      const double expect = i == 9 ? -3.0 : -inf;  // plane 1, window (0, 0)
      EXPECT_EQ(v[i], expect) << "output " << i;
    }
    // Every window has a tap inside the input, so each routes its gradient to one element.
    y.sum().backward();
    EXPECT_EQ(x.grad().to(kFloat64).sum().item<double>(), 18.0);
  }
}

TEST(Refusals, LoadStateDictNamesTheUndefinedTensor) {
  nn::Linear l(3, 2);
  nn::StateDict d = l.state_dict();
  d["weight"] = Tensor();
  EXPECT_AG_ERROR(l.load_state_dict(d), "[load_state_dict] the state dict's tensor 'weight' is undefined");
}

}  // namespace
