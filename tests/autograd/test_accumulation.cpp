// Gradients that meet in one slot: a tensor used by several ops gets the sum of their
// gradients, whatever layout the first one to arrive has. The backward of a reduction or
// a broadcast hands out an expanded view (stride 0), that of transpose and permute a
// strided view; the engine may sum into the first gradient in place only when it owns dense
// memory (core/src/autograd.cpp, accumulate).
#include "support/testing.h"

#include <string>
#include <utility>
#include <vector>

using namespace ag;

namespace {

// One use of a [2, 3, 4] tensor, named for the test's message.
struct Use {
  const char* name;
  Tensor (*f)(const Tensor&);
};

// Each use's backward gives the slot a gradient of its own layout (with a plain .sum() on
// top, the gradient reaching each use is itself an expanded view of the scalar's).
const std::vector<Use>& uses() {
  static const std::vector<Use> u = {
      {"identity", [](const Tensor& x) { return x; }},
      {"expand", [](const Tensor& x) { return x.unsqueeze(0).expand({2, 2, 3, 4}); }},
      {"broadcast", [](const Tensor& x) { return x + from_vector<double>({0.5, -1.0, 2.0}, {1, 3, 1}); }},
      {"broadcast_mul", [](const Tensor& x) { return x * from_vector<double>({0.5, -1.0, 2.0, 3.0}, {4}); }},
      {"transpose", [](const Tensor& x) { return x.transpose(0, 2); }},
      {"permute", [](const Tensor& x) { return x.permute({2, 0, 1}); }},
      {"narrow", [](const Tensor& x) { return x.narrow(1, 1, 2); }},
      {"select", [](const Tensor& x) { return x.select(2, 3); }},
      {"sum_dims", [](const Tensor& x) { return sum(x, {0, 2}, false); }},
      {"sum_keepdim", [](const Tensor& x) { return sum(x, {1}, true); }},
      {"mean_dims", [](const Tensor& x) { return mean(x, {1}, false); }},
      {"mean_keepdim", [](const Tensor& x) { return mean(x, {0, 2}, true); }},
      {"sum_all", [](const Tensor& x) { return x.sum(); }},
      {"reshape", [](const Tensor& x) { return x.reshape({6, 4}); }},
  };
  return u;
}

// A scalar from an op's output: a plain sum (the gradient is an expanded view) or a sum
// weighted by fixed values (the gradient is a dense tensor, then viewed by the op's backward).
Tensor reduce_output(const Tensor& y, bool weighted) {
  if (!weighted) return y.sum();
  std::vector<double> w(size_t(y.numel()));
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.25 + 0.125 * double(i % 7);
  return (y * from_vector<double>(w, y.sizes().vec())).sum();
}

}  // namespace

// The case as a user first met it: a reduction over some dims and a mean with keepdim.
TEST(GradAccumulation, ReductionAndMeanOfOneTensor) {
  Tensor X = randn({2, 3, 4}, kFloat64);
  X.requires_grad_(true);
  Tensor z = sum(X, {0, 2}, false);
  Tensor y = mean(X, {1}, true);
  (z.sum() + y.sum()).backward();
  // d/dX of sum(z) is 1 everywhere, of sum(y) 1/3.
  for (double g : X.grad().to_vector<double>()) EXPECT_DOUBLE_EQ(g, 1.0 + 1.0 / 3.0);
  EXPECT_TRUE(X.grad().is_contiguous());
}

// Every ordered pair of uses, so that each layout arrives first (the op recorded last runs
// its backward first), into a leaf's slot and into an op's, with plain and weighted sums,
// against central finite differences.
TEST(GradAccumulation, EveryLayoutArrivingFirst) {
  for (bool through_op : {false, true})
    for (bool weighted : {false, true})
      for (const Use& second : uses())
        for (const Use& first : uses()) {
          SCOPED_TRACE(std::string(first.name) + " arrives before " + second.name +
                       (through_op ? ", into an op's input" : ", into a leaf") +
                       (weighted ? ", weighted sums" : ", plain sums"));
          Tensor X = agt::rand64({2, 3, 4});
          auto f = [&](const std::vector<Tensor>& in) {
            // Non-leaf: both uses meet in the buffer of MulBackward's input.
            const Tensor x = through_op ? in[0] * 1.5 : in[0];
            const Tensor a = reduce_output(second.f(x), weighted);
            const Tensor b = reduce_output(first.f(x), weighted);  // recorded last: runs first
            return a * 0.75 + b;
          };
          EXPECT_TRUE(agt::gradcheck(f, {X}));
        }
}

// Three and four uses: the sum of two views, then more arriving into it.
TEST(GradAccumulation, FanOutOfThreeAndFour) {
  Tensor X = agt::rand64({2, 3, 4});
  auto f = [](const std::vector<Tensor>& in) {
    const Tensor& x = in[0];
    return sum(x, {1}, true).sum() + x.transpose(0, 1).sum() * 2.0 + mean(x, {0, 2}, false).sum() * 3.0 +
           (x * x).sum();
  };
  EXPECT_TRUE(agt::gradcheck(f, {X}));
  auto g = [](const std::vector<Tensor>& in) {
    const Tensor x = in[0].permute({1, 2, 0});  // every use through one strided view
    return (x.sum({0}, false) * 2.0).sum() + x.mean() + x.narrow(2, 0, 1).sum() * 5.0;
  };
  EXPECT_TRUE(agt::gradcheck(g, {X}));
}

// Across backward calls: .grad takes the sum in place when it owns dense memory (a handle
// the user holds sees it, as in PyTorch), and a new tensor when it was set to a view.
TEST(GradAccumulation, LeafGradAcrossBackwardCalls) {
  Tensor x = agt::rand64({3, 4});
  sum(x, {0}, true).sum().backward();
  Tensor held = x.grad();
  EXPECT_TRUE(held.is_contiguous());
  x.sum().backward();
  EXPECT_TRUE(x.grad().is_alias_of(held));
  for (double g : held.to_vector<double>()) EXPECT_DOUBLE_EQ(g, 2.0);

  // A .grad set to an expanded view: summing into it in place would write each element
  // several times.
  Tensor one = from_vector<double>({1.0, 2.0, 3.0, 4.0}, {1, 4});
  x.set_grad(one.expand({3, 4}));
  (x * 2.0).sum().backward();
  EXPECT_FALSE(x.grad().is_alias_of(one));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5, 6}));
  EXPECT_EQ(one.to_vector<double>(), (std::vector<double>{1, 2, 3, 4}));

  // A transposed .grad owns dense memory: the sum goes into it, element by element.
  Tensor t = zeros({4, 3}, kFloat64);
  x.set_grad(t.t());
  x.sum().backward();
  EXPECT_TRUE(x.grad().is_alias_of(t));
  for (double g : t.to_vector<double>()) EXPECT_DOUBLE_EQ(g, 1.0);
}

// A hook that hands back a tensor the user keeps: the engine must not write into it.
TEST(GradAccumulation, HookResultIsNotWrittenInPlace) {
  Tensor x = agt::rand64({2, 3});
  Tensor kept = ones({2, 3}, kFloat64);
  x.register_hook([&](const Tensor&) { return kept; });
  x.sum().backward();
  x.sum().backward();
  EXPECT_EQ(kept.to_vector<double>(), std::vector<double>(6, 1.0));
  EXPECT_EQ(x.grad().to_vector<double>(), std::vector<double>(6, 2.0));
}

TEST(TensorLayout, NonOverlappingAndDense) {
  const Tensor a = zeros({2, 3, 4});
  EXPECT_TRUE(a.is_non_overlapping_and_dense());
  EXPECT_TRUE(a.transpose(0, 2).is_non_overlapping_and_dense());
  EXPECT_TRUE(a.permute({1, 2, 0}).is_non_overlapping_and_dense());
  EXPECT_TRUE(a.unsqueeze(1).is_non_overlapping_and_dense());
  EXPECT_FALSE(a.narrow(1, 0, 2).is_non_overlapping_and_dense());  // skips elements
  EXPECT_FALSE(a.select(2, 0).is_non_overlapping_and_dense());
  EXPECT_FALSE(a.unsqueeze(0).expand({5, 2, 3, 4}).is_non_overlapping_and_dense());
  EXPECT_TRUE(a.narrow(0, 1, 1).is_non_overlapping_and_dense());  // one whole block
  EXPECT_TRUE(zeros({0, 3}).is_non_overlapping_and_dense());
}
