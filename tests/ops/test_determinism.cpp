// The same inputs give the same bits, wherever the allocator put the buffers.
//
// A loop the compiler vectorizes keeps a scalar twin for its tail and for operands that
// might overlap, chosen at run time from the addresses; with fused multiply-adds formed in
// one twin and not the other, a kernel's result depended on the allocator's state (layer
// norm's input gradient changed in the last bit from one call to the next, and a training
// run resumed from a checkpoint drifted from the uninterrupted one). The library is now
// compiled without contraction (CMakeLists.txt). Each case here computes its outputs and
// gradients again and again with the allocator's caches in a different state each time
// (tensors of assorted sizes kept alive in between) and compares the bits with the first.
#include <gtest/gtest.h>
#include <ampgrad/ampgrad.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "support/testing.h"

namespace {

using ag::Tensor;

// Kernels also take small buffers of their own from the heap (a widened weight row, the
// column sums' scratch rows), and whether two of those lie next to each other decides
// which twin of a loop runs: before each repetition, runs of heap blocks of several sizes
// are taken and given back in an order that changes with the repetition, so that the next
// small allocations come back adjacent, apart, or in reverse.
void expect_same_bits_under_churn(const char* what, const std::function<std::vector<Tensor>()>& f) {
  const std::vector<Tensor> first = f();
  std::vector<Tensor> keep;
  std::mt19937 rng(1);
  for (int rep = 0; rep < 100; ++rep) {
    for (int i = 0; i <= rep % 7; ++i) keep.push_back(ag::empty({int64_t(1 + (rep * 13 + i * 5) % 97)}));
    if (rep % 5 == 4) keep.erase(keep.begin(), keep.begin() + ptrdiff_t(keep.size() / 2));
    {
      std::vector<std::unique_ptr<char[]>> blocks;
      for (size_t bytes : {16, 32, 48, 64, 80, 96, 128, 160, 1536})
        for (int i = 0; i < 6; ++i) blocks.push_back(std::make_unique<char[]>(bytes));
      if (rep % 3 == 1) std::reverse(blocks.begin(), blocks.end());
      if (rep % 3 == 2) std::shuffle(blocks.begin(), blocks.end(), rng);
    }  // given back in that order
    const std::vector<Tensor> got = f();
    ASSERT_EQ(got.size(), first.size());
    for (size_t k = 0; k < got.size(); ++k)
      ASSERT_TRUE(agt::same_bits(got[k], first[k])) << what << ": result " << k << " at repetition " << rep;
  }
}

// Output and the gradients of x, weight and bias for a random output gradient.
std::vector<Tensor> layer_norm_case(int64_t rows, int64_t width) {
  ag::manual_seed(7);
  const Tensor x = ag::randn({rows, width}).requires_grad_(true);
  const Tensor w = ag::randn({width}).requires_grad_(true), b = ag::randn({width}).requires_grad_(true);
  const Tensor g = ag::randn({rows, width});
  const Tensor y = ag::layer_norm(x, {width}, w, b);
  y.backward(g);
  return {y, x.grad(), w.grad(), b.grad()};
}

}  // namespace

TEST(Determinism, LayerNormWhereverItsBuffersLie) {
  for (int64_t width : {8, 20, 384})
    expect_same_bits_under_churn("layer_norm", [width] { return layer_norm_case(16, width); });
  // The case that first showed it: a module's norm under a loss of its own output.
  ag::manual_seed(1);
  ag::nn::LayerNorm ln({8});
  ag::manual_seed(3);
  const Tensor x0 = ag::randn({2, 4, 8});
  std::vector<Tensor> grads;  // kept, as a loop collecting them would
  expect_same_bits_under_churn("LayerNorm module", [&] {
    const Tensor x = x0.clone().requires_grad_(true);
    const Tensor y = ln.forward(x);
    (y * y).sum().backward();
    grads.push_back(x.grad());
    return std::vector<Tensor>{y, x.grad()};
  });
}

TEST(Determinism, SoftmaxCrossEntropyAndAttentionWhereverTheirBuffersLie) {
  expect_same_bits_under_churn("softmax and log_softmax", [] {
    ag::manual_seed(8);
    const Tensor x = ag::randn({12, 33}).requires_grad_(true);
    const Tensor y = ag::softmax(x, 1), z = ag::log_softmax(x, 1);
    (y * ag::randn({12, 33})).sum().backward();
    (z * ag::randn({12, 33})).sum().backward();
    return std::vector<Tensor>{y, z, x.grad()};
  });
  expect_same_bits_under_churn("cross_entropy", [] {
    ag::manual_seed(9);
    const Tensor logits = ag::randn({10, 7}).requires_grad_(true);
    const Tensor loss = ag::cross_entropy(logits, ag::from_vector<int64_t>({0, 1, 2, 3, 4, 5, 6, 0, 1, 2}, {10}));
    loss.backward();
    return std::vector<Tensor>{loss, logits.grad()};
  });
  expect_same_bits_under_churn("scaled_dot_product_attention", [] {
    ag::manual_seed(10);
    const Tensor q = ag::randn({2, 2, 5, 8}).requires_grad_(true), k = ag::randn({2, 2, 5, 8}).requires_grad_(true),
                 v = ag::randn({2, 2, 5, 8}).requires_grad_(true);
    const Tensor o = ag::scaled_dot_product_attention(q, k, v, {.is_causal = true});
    o.backward(ag::randn({2, 2, 5, 8}));
    return std::vector<Tensor>{o, q.grad(), k.grad(), v.grad()};
  });
}
