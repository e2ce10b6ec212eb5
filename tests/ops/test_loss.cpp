// Losses: cross_entropy, nll_loss, mse_loss and binary_cross_entropy_with_logits against
// the float64 reference (kernels/reference: every reduction, ignore_index, label smoothing,
// spatial targets) and the frontend ops (soft targets), numerical stability, 16-bit logits
// against float32 and against the reference, gradients by finite differences and
// (cross_entropy's fused kernels) against the reference's backward, the error messages,
// and each instruction-set variant of cross entropy's rows (hw::set_kernel_isa) against the
// reference, forward and backward.
#include <cmath>
#include <limits>

#include "ampgrad/reference/loss.h"
#include "support/testing.h"

namespace {

using ag::Reduction;
using ag::Tensor;

namespace ref = ampgrad::reference;

// The [N, C, S] view of logits [N, C, S...] (or [C]).
struct NCS {
  int64_t N, C, S;
};
NCS ncs_of(const Tensor& logits) {
  const bool unbatched = logits.dim() == 1;
  const int64_t N = unbatched ? 1 : logits.size(0), C = logits.size(unbatched ? 0 : 1);
  return {N, C, logits.numel() / (N * C)};
}

ref::Reduction ref_reduction(Reduction r) {
  return r == Reduction::None ? ref::Reduction::None : r == Reduction::Sum ? ref::Reduction::Sum : ref::Reduction::Mean;
}

// Cross entropy by the float64 reference: logits [N, C, S...] (or [C]), class targets
// [N, S...]. From log-probabilities when `from_log_probs` (nll_loss).
Tensor ref_cross_entropy(const Tensor& logits, const Tensor& target, Reduction red, int64_t ignore,
                         double smoothing, bool from_log_probs = false) {
  const auto x = logits.to_vector<double>();
  const auto t = target.to_vector<int64_t>();
  const auto [N, C, S] = ncs_of(logits);
  const std::vector<double> loss =
      from_log_probs ? ref::nll_loss(x, t, N, C, S, ignore) : ref::cross_entropy(x, t, N, C, S, {ignore, smoothing});
  const std::vector<double> out = ref::reduce_loss(loss, t, ignore, ref_reduction(red));
  if (red != Reduction::None) return ag::scalar_tensor(out[0], ag::kFloat64);
  return ag::from_vector<double>(out, target.sizes().vec());
}

// d(sum of per-position losses)/d logits by the float64 reference: softmax - (1 - ls)
// onehot - ls / C, zero for ignored positions. Same layouts as ref_cross_entropy.
Tensor ref_cross_entropy_grad(const Tensor& logits, const Tensor& target, int64_t ignore, double smoothing) {
  const auto x = logits.to_vector<double>();
  const auto t = target.to_vector<int64_t>();
  const auto [N, C, S] = ncs_of(logits);
  const std::vector<double> ones(t.size(), 1.0);
  return ag::from_vector<double>(ref::cross_entropy_backward(x, t, ones, N, C, S, {ignore, smoothing}),
                                 logits.sizes().vec());
}

Tensor random_targets(const std::vector<int64_t>& shape, int64_t C, int64_t ignore = -100, double p_ignore = 0) {
  Tensor t = ag::randint(0, C, shape);
  if (p_ignore > 0) t = ag::where(ag::lt(ag::rand(shape), p_ignore), ag::full(shape, ignore, ag::kInt64), t);
  return t;
}

const Reduction kReductions[] = {Reduction::None, Reduction::Sum, Reduction::Mean};

}  // namespace

TEST(LossTest, CrossEntropyMatchesReference) {
  ag::manual_seed(21);
  struct S {
    std::vector<int64_t> logits, target;
  };
  for (const S& s : {S{{6, 5}, {6}}, S{{3, 4, 2, 3}, {3, 2, 3}}, S{{7}, {}}})
    for (Reduction r : kReductions)
      for (double smoothing : {0.0, 0.1})
        for (int64_t ignore : {int64_t(-100), int64_t(1)}) {
          SCOPED_TRACE("rank " + std::to_string(s.logits.size()) + " reduction " + std::to_string(int(r)) +
                       " smoothing " + std::to_string(smoothing) + " ignore " + std::to_string(ignore));
          const Tensor x = ag::mul(ag::randn(s.logits, ag::kFloat64), 2.0);
          const int64_t C = s.logits.size() == 1 ? s.logits[0] : s.logits[1];
          Tensor t = random_targets(s.target, C);
          if (s.target.empty()) t = ag::scalar_tensor(int64_t(3), ag::kInt64);
          const Tensor got = ag::cross_entropy(x, t, r, ignore, smoothing);
          EXPECT_TRUE(agt::allclose(got, ref_cross_entropy(x, t, r, ignore, smoothing), 1e-12, 1e-12));
          const Tensor got32 = ag::cross_entropy(x.to(ag::kFloat32), t.to(ag::kInt32), r, ignore, smoothing);
          EXPECT_EQ(got32.dtype(), ag::kFloat32);
          EXPECT_TRUE(agt::allclose(got32, ref_cross_entropy(x, t, r, ignore, smoothing), 1e-5, 1e-5));
        }
}

TEST(LossTest, CrossEntropyIgnoreIndexAndMeanCount) {
  // Mean divides by the number of counted targets, not by N.
  const Tensor x = ag::from_vector<double>({0, 0, 0, 1, 2, 3, 5, 5, 5}, {3, 3});
  const Tensor t = ag::from_vector<int64_t>({0, -100, 2}, {3});
  const double l0 = std::log(3.0);  // rows 0 and 2 are uniform; row 1 is ignored
  EXPECT_NEAR(ag::cross_entropy(x, t).item<double>(), l0, 1e-12);
  EXPECT_NEAR(ag::cross_entropy(x, t, Reduction::Sum).item<double>(), 2 * l0, 1e-12);
  EXPECT_EQ(ag::cross_entropy(x, t, Reduction::None).to_vector<double>()[1], 0.0);
  // all targets ignored: the mean is 0 / 0 = NaN, like PyTorch
  EXPECT_TRUE(std::isnan(ag::cross_entropy(x, ag::full({3}, -100, ag::kInt64)).item<double>()));
  // gradients of ignored rows are zero
  Tensor xg = x.detach().requires_grad_();
  ag::cross_entropy(xg, t).backward();
  const auto g = xg.grad().to_vector<double>();
  EXPECT_EQ(g[3], 0.0);
  EXPECT_EQ(g[4], 0.0);
  EXPECT_EQ(g[5], 0.0);
  EXPECT_NEAR(g[0], (1.0 / 3 - 1) / 2, 1e-12);  // (softmax - onehot) / count
}

TEST(LossTest, CrossEntropyIsStableAndSoftTargets) {
  const Tensor x = ag::from_vector<float>({1000, -1000, 0, 500}, {2, 2});
  const Tensor t = ag::from_vector<int64_t>({1, 0}, {2});
  const auto l = ag::cross_entropy(x, t, Reduction::None).to_vector<double>();
  EXPECT_NEAR(l[0], 2000, 1e-3);
  EXPECT_NEAR(l[1], 500, 1e-3);
  // probability targets: -sum p log softmax
  ag::manual_seed(22);
  const Tensor logits = ag::randn({4, 5}, ag::kFloat64);
  const Tensor p = ag::softmax(ag::randn({4, 5}, ag::kFloat64), 1);
  const Tensor expected = ag::neg(ag::sum(ag::mul(p, ag::log_softmax(logits, 1)), {1}));
  EXPECT_TRUE(agt::allclose(ag::cross_entropy(logits, p, Reduction::None), expected, 1e-12, 1e-12));
  EXPECT_NEAR(ag::cross_entropy(logits, p).item<double>(), ag::mean(expected).item<double>(), 1e-12);
  const Tensor ps = ag::add(ag::mul(p, 0.8), 0.2 / 5);
  EXPECT_NEAR(ag::cross_entropy(logits, p, Reduction::Sum, -100, 0.2).item<double>(),
              ag::sum(ag::neg(ag::mul(ps, ag::log_softmax(logits, 1)))).item<double>(), 1e-12);
  EXPECT_TRUE(agt::gradcheck(
      [&](const std::vector<Tensor>& in) { return ag::cross_entropy(in[0], in[1], Reduction::None, -100, 0.1); },
      {agt::rand64({4, 5}), agt::rand64({4, 5}, 0, 1)}));
}

TEST(LossTest, CrossEntropyHalfWithinToleranceOfFloat32) {
  ag::manual_seed(23);
  for (ag::DType dt : {ag::kFloat16, ag::kBFloat16}) {
    const Tensor xh = ag::randn({64, 10}, ag::kFloat32).to(dt);
    const Tensor t = random_targets({64}, 10, -100, 0.2);
    for (Reduction r : kReductions) {
      const Tensor got = ag::cross_entropy(xh, t, r, -100, 0.05);
      EXPECT_EQ(got.dtype(), dt);
      EXPECT_TRUE(agt::allclose(got, ag::cross_entropy(xh.to(ag::kFloat32), t, r, -100, 0.05), agt::tol_for(dt)));
    }
    Tensor a = xh.detach().requires_grad_(), b = xh.to(ag::kFloat32).detach().requires_grad_();
    ag::cross_entropy(a, t).backward();
    ag::cross_entropy(b, t).backward();
    EXPECT_EQ(a.grad().dtype(), dt);
    EXPECT_TRUE(agt::allclose(a.grad(), b.grad(), agt::tol_for(dt).rtol * 2, agt::tol_for(dt).atol * 0.1));
  }
}

TEST(LossTest, CrossEntropyGradcheck) {
  ag::manual_seed(24);
  for (Reduction r : kReductions)
    for (double smoothing : {0.0, 0.2}) {
      SCOPED_TRACE("reduction " + std::to_string(int(r)) + " smoothing " + std::to_string(smoothing));
      const Tensor t = ag::from_vector<int64_t>({0, 3, -100, 2, 4}, {5});
      EXPECT_TRUE(agt::gradcheck(
          [&](const std::vector<Tensor>& in) { return ag::cross_entropy(in[0], t, r, -100, smoothing); },
          {agt::rand64({5, 5}, -2, 2)}));
      const Tensor ts = random_targets({2, 3, 2}, 4, 1, 0.3);
      EXPECT_TRUE(agt::gradcheck(
          [&](const std::vector<Tensor>& in) { return ag::cross_entropy(in[0], ts, r, 1, smoothing); },
          {agt::rand64({2, 4, 3, 2}, -2, 2)}));
      // non-contiguous logits
      EXPECT_TRUE(agt::gradcheck(
          [&](const std::vector<Tensor>& in) { return ag::cross_entropy(in[0], t, r, -100, smoothing); },
          {agt::non_contiguous(agt::rand64({5, 5}, -2, 2))}));
    }
  // broadcast logits built in the graph
  const Tensor t = ag::from_vector<int64_t>({1, 0, 2}, {3});
  EXPECT_TRUE(agt::gradcheck(
      [&](const std::vector<Tensor>& in) { return ag::cross_entropy(ag::add(in[0], in[1]), t); },
      {agt::rand64({3, 4}), agt::rand64({1, 4})}));
}

// The fused kernels (Backend::cross_entropy / cross_entropy_backward) on both of their
// layouts, rows (inner == 1, including rows longer than one 256-element chunk) and blocks of
// positions (inner > 1, including a partial block), against the reference.
TEST(LossTest, CrossEntropyFusedAgainstLoops) {
  ag::manual_seed(28);
  struct S {
    std::vector<int64_t> logits, target;
  };
  for (const S& s : {S{{9, 7}, {9}}, S{{5, 700}, {5}}, S{{3, 5, 2, 4}, {3, 2, 4}}, S{{2, 6, 19}, {2, 19}}, S{{11}, {}}})
    for (Reduction r : kReductions)
      for (double smoothing : {0.0, 0.15, 1.0}) {
        SCOPED_TRACE("rank " + std::to_string(s.logits.size()) + " C " + std::to_string(s.logits[s.logits.size() == 1 ? 0 : 1]) +
                     " reduction " + std::to_string(int(r)) + " smoothing " + std::to_string(smoothing));
        const int64_t C = s.logits.size() == 1 ? s.logits[0] : s.logits[1];
        const Tensor x = ag::mul(ag::randn(s.logits, ag::kFloat64), 3.0);
        const Tensor t = s.target.empty() ? ag::scalar_tensor(int64_t(4), ag::kInt64)
                                          : random_targets(s.target, C, -100, 0.25);
        EXPECT_TRUE(agt::allclose(ag::cross_entropy(x, t, r, -100, smoothing), ref_cross_entropy(x, t, r, -100, smoothing),
                                  1e-12, 1e-12));
        const Tensor x32 = x.to(ag::kFloat32);
        EXPECT_TRUE(agt::allclose(ag::cross_entropy(x32, t, r, -100, smoothing),
                                  ref_cross_entropy(x32.to(ag::kFloat64), t, r, -100, smoothing), 1e-5, 1e-5));
        if (r != Reduction::Sum) continue;
        // the gradient of the summed loss against the reference, float64 and float32
        for (ag::DType dt : {ag::kFloat64, ag::kFloat32}) {
          Tensor xg = x.to(dt).detach().requires_grad_();
          ag::cross_entropy(xg, t, r, -100, smoothing).backward();
          EXPECT_EQ(xg.grad().dtype(), dt);
          EXPECT_TRUE(agt::allclose(xg.grad(), ref_cross_entropy_grad(x.to(dt).to(ag::kFloat64), t, -100, smoothing),
                                    dt == ag::kFloat64 ? 1e-12 : 1e-5, dt == ag::kFloat64 ? 1e-12 : 1e-5));
        }
      }
}

// A confident model's probabilities divided by the batch (mean reduction) fall below the
// smallest normal float; the gradient flushes those to zero, since denormal operands slow
// every product that reads it by 20-170x. Logits of -85 next to 0 give probabilities of
// about 1e-37, times 1/64 a denormal; logits of -80, about 3e-37 after the division, stay.
// Checked against float64 for both layouts (classes innermost, and [N, C, L]) and bfloat16.
TEST(LossTest, CrossEntropyGradientFlushesDenormals) {
  const float tiny = std::numeric_limits<float>::min();
  for (ag::DType dt : {ag::kFloat32, ag::kBFloat16}) {
    for (bool spatial : {false, true}) {
      SCOPED_TRACE(std::string(ag::dtype_name(dt)) + (spatial ? " [N, C, L]" : " [N, C]"));
      const int64_t N = 64, C = 96, L = spatial ? 3 : 1;
      // logits[n][c][l]: 0 at class n % C, -85 or -80 (alternating classes) elsewhere
      std::vector<double> lv(size_t(N * C * L));
      std::vector<int64_t> tv(size_t(N * L));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t l = 0; l < L; ++l) {
          tv[size_t(n * L + l)] = (n + l) % C;
          for (int64_t c = 0; c < C; ++c) lv[size_t((n * C + c) * L + l)] = c == (n + l) % C ? 0.0 : c % 2 ? -85.0 : -80.0;
        }
      const std::vector<int64_t> shape = spatial ? std::vector<int64_t>{N, C, L} : std::vector<int64_t>{N, C};
      const Tensor x = ag::from_vector<double>(lv, shape).to(dt).requires_grad_();
      const Tensor t = ag::from_vector<int64_t>(tv, spatial ? std::vector<int64_t>{N, L} : std::vector<int64_t>{N});
      ag::cross_entropy(x, t).backward();
      const std::vector<double> gv = x.grad().to(ag::kFloat64).to_vector<double>();
      int64_t denormal = 0, wrong = 0, kept = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t l = 0; l < L; ++l) {
          double sum = 0;  // the row's softmax in float64
          for (int64_t c = 0; c < C; ++c) sum += std::exp(lv[size_t((n * C + c) * L + l)]);
          for (int64_t c = 0; c < C; ++c) {
            const size_t i = size_t((n * C + c) * L + l);
            const double want = (std::exp(lv[i]) / sum - (c == tv[size_t(n * L + l)])) / double(N * L);
            const double got = gv[i];
            denormal += got != 0 && std::abs(got) < tiny;
            if (std::abs(want) < tiny) {
              wrong += got != 0;
            } else {
              kept += 1;
              wrong += std::abs(got - want) > (dt == ag::kFloat32 ? 1e-5 : 1e-2) * std::abs(want);
            }
          }
        }
      EXPECT_EQ(denormal, 0);
      EXPECT_EQ(wrong, 0);
      EXPECT_GE(kept, N * L * (C / 2 - 1));  // the -80 logits and the targets are still there
    }
  }
}

TEST(LossTest, CrossEntropyRecordsOneNode) {
  const Tensor x = agt::rand64({4, 6});
  const Tensor t = ag::from_vector<int64_t>({0, 5, -100, 2}, {4});
  const Tensor loss = ag::cross_entropy(x, t, Reduction::None, -100, 0.1);
  ASSERT_TRUE(loss.grad_fn());
  EXPECT_EQ(loss.grad_fn()->name(), "CrossEntropyBackward");
  ASSERT_EQ(loss.grad_fn()->next_edges.size(), 1u);  // the logits, straight to their accumulator
  EXPECT_EQ(loss.grad_fn()->next_edges[0].fn->name(), "AccumulateGrad");
}

TEST(LossTest, CrossEntropyGradcheckFused) {
  ag::manual_seed(29);
  for (Reduction r : kReductions)
    for (double smoothing : {0.0, 0.3}) {
      SCOPED_TRACE("reduction " + std::to_string(int(r)) + " smoothing " + std::to_string(smoothing));
      // [C] with a 0-dim target
      const Tensor t0 = ag::scalar_tensor(int64_t(2), ag::kInt64);
      EXPECT_TRUE(agt::gradcheck(
          [&](const std::vector<Tensor>& in) { return ag::cross_entropy(in[0], t0, r, -100, smoothing); },
          {agt::rand64({6}, -2, 2)}));
      // [N, C, d1, d2] with ignored positions
      const Tensor ts = random_targets({2, 3, 5}, 4, -100, 0.3);
      EXPECT_TRUE(agt::gradcheck(
          [&](const std::vector<Tensor>& in) { return ag::cross_entropy(in[0], ts, r, -100, smoothing); },
          {agt::rand64({2, 4, 3, 5}, -2, 2)}));
    }
}

TEST(LossTest, CrossEntropyHalfAgainstFloat64Reference) {
  ag::manual_seed(30);
  struct S {
    std::vector<int64_t> logits, target;
  };
  for (ag::DType dt : {ag::kFloat16, ag::kBFloat16})
    for (const S& s : {S{{48, 33}, {48}}, S{{4, 9, 3, 5}, {4, 3, 5}}, S{{300}, {}}})
      for (double smoothing : {0.0, 0.1}) {
        SCOPED_TRACE(std::string(ag::dtype_name(dt)) + " rank " + std::to_string(s.logits.size()) + " smoothing " +
                     std::to_string(smoothing));
        const int64_t C = s.logits.size() == 1 ? s.logits[0] : s.logits[1];
        const Tensor xh = ag::mul(ag::randn(s.logits, ag::kFloat32), 2.0).to(dt);
        const Tensor x64 = xh.to(ag::kFloat64);  // the reference sees the same rounded logits
        const Tensor t = s.target.empty() ? ag::scalar_tensor(int64_t(7), ag::kInt64)
                                          : random_targets(s.target, C, -100, 0.2);
        for (Reduction r : kReductions) {
          const Tensor got = ag::cross_entropy(xh, t, r, -100, smoothing);
          EXPECT_EQ(got.dtype(), dt);
          EXPECT_TRUE(agt::allclose(got, ref_cross_entropy(x64, t, r, -100, smoothing), agt::tol_for(dt)));
        }
        Tensor xg = xh.detach().requires_grad_();
        ag::cross_entropy(xg, t, Reduction::Sum, -100, smoothing).backward();
        EXPECT_EQ(xg.grad().dtype(), dt);
        EXPECT_TRUE(agt::allclose(xg.grad(), ref_cross_entropy_grad(x64, t, -100, smoothing), agt::tol_for(dt)));
      }
}

TEST(LossTest, CrossEntropyFusedErrorsAndAllIgnored) {
  const Tensor x = ag::zeros({4, 10});
  EXPECT_AG_ERROR(ag::cross_entropy(x, ag::from_vector<int64_t>({0, 12, 1, 2}, {4})),
                  "[cross_entropy] target 12 is out of range for 10 classes (expected [0, 9] or ignore_index -100)");
  EXPECT_AG_ERROR(ag::cross_entropy(x, ag::from_vector<int64_t>({0, 1, -3, 2}, {4})),
                  "[cross_entropy] target -3 is out of range for 10 classes (expected [0, 9] or ignore_index -100)");
  // the first bad target in order is named; -100 is bad when it is not ignore_index
  EXPECT_AG_ERROR(ag::cross_entropy(x, ag::from_vector<int64_t>({-100, 10, 11, 3}, {4}), Reduction::Mean, 3),
                  "[cross_entropy] target -100 is out of range for 10 classes (expected [0, 9] or ignore_index 3)");
  // the layout with inner > 1, and int32 targets
  EXPECT_AG_ERROR(ag::cross_entropy(ag::zeros({2, 3, 4}), ag::from_vector<int32_t>({0, 1, 2, 0, 1, 2, 3, 0}, {2, 4}),
                                    Reduction::Sum),
                  "[cross_entropy] target 3 is out of range for 3 classes (expected [0, 2] or ignore_index -100)");
  // Mean over no counted target is NaN (0 / 0), in both layouts and dtypes; Sum is 0
  for (ag::DType dt : {ag::kFloat32, ag::kFloat64, ag::kBFloat16}) {
    EXPECT_TRUE(std::isnan(ag::cross_entropy(ag::randn({3, 5}, dt), ag::full({3}, -100, ag::kInt64)).item<double>()));
    EXPECT_TRUE(std::isnan(ag::cross_entropy(ag::randn({2, 5, 3}, dt), ag::full({2, 3}, 7, ag::kInt64), Reduction::Mean, 7)
                               .item<double>()));
    EXPECT_EQ(ag::cross_entropy(ag::randn({3, 5}, dt), ag::full({3}, -100, ag::kInt64), Reduction::Sum).item<double>(), 0.0);
  }
  // and the gradient of an all-ignored Sum is zero
  Tensor xg = agt::rand64({3, 5});
  ag::cross_entropy(xg, ag::full({3}, -100, ag::kInt64), Reduction::Sum).backward();
  EXPECT_TRUE(agt::allclose(xg.grad(), ag::zeros({3, 5}, ag::kFloat64), 0, 0));
}

TEST(LossTest, NllLoss) {
  ag::manual_seed(25);
  const Tensor lp = ag::log_softmax(ag::randn({6, 4}, ag::kFloat64), 1);
  const Tensor t = ag::from_vector<int64_t>({0, 3, 3, -100, 1, 2}, {6});
  for (Reduction r : kReductions)
    EXPECT_TRUE(agt::allclose(ag::nll_loss(lp, t, r), ref_cross_entropy(lp, t, r, -100, 0, true), 1e-12, 1e-12));
  const Tensor t2 = ag::from_vector<int32_t>({0, 3, 3, 2, 1, 2}, {6});
  EXPECT_TRUE(agt::allclose(ag::nll_loss(lp, t2, Reduction::Sum, 3),
                            ref_cross_entropy(lp, t2.to(ag::kInt64), Reduction::Sum, 3, 0, true), 1e-12, 1e-12));
  for (Reduction r : kReductions)
    EXPECT_TRUE(agt::gradcheck([&](const std::vector<Tensor>& in) { return ag::nll_loss(in[0], t, r); },
                               {agt::rand64({6, 4})}));
  // spatial
  const Tensor lp2 = agt::rand64({2, 3, 4});
  const Tensor t3 = random_targets({2, 4}, 3);
  EXPECT_TRUE(agt::allclose(ag::nll_loss(lp2, t3), ref_cross_entropy(lp2, t3, Reduction::Mean, -100, 0, true), 1e-12, 1e-12));
  EXPECT_TRUE(agt::gradcheck([&](const std::vector<Tensor>& in) { return ag::nll_loss(in[0], t3, Reduction::Sum); }, {lp2}));
}

TEST(LossTest, MseLoss) {
  const Tensor a = ag::from_vector<double>({1, 2, 3, 4}, {2, 2}), b = ag::from_vector<double>({0, 2, 5, 1}, {2, 2});
  EXPECT_EQ(ag::mse_loss(a, b).item<double>(), (1 + 0 + 4 + 9) / 4.0);
  EXPECT_EQ(ag::mse_loss(a, b, Reduction::Sum).item<double>(), 14.0);
  EXPECT_EQ(ag::mse_loss(a, b, Reduction::None).to_vector<double>(), (std::vector<double>{1, 0, 4, 9}));
  ag::manual_seed(26);
  for (Reduction r : kReductions)
    EXPECT_TRUE(agt::gradcheck([&](const std::vector<Tensor>& in) { return ag::mse_loss(in[0], in[1], r); },
                               {agt::rand64({3, 4}), agt::non_contiguous(agt::rand64({3, 4}))}));
  for (ag::DType dt : {ag::kFloat16, ag::kBFloat16}) {
    const Tensor x = ag::randn({100}, ag::kFloat32).to(dt), y = ag::randn({100}, ag::kFloat32).to(dt);
    EXPECT_TRUE(agt::allclose(ag::mse_loss(x, y), ag::mse_loss(x.to(ag::kFloat32), y.to(ag::kFloat32)), agt::tol_for(dt)));
  }
}

TEST(LossTest, BinaryCrossEntropyWithLogits) {
  // Against log(1 + exp(x)) - x y evaluated in double, including large |x| where the
  // naive form overflows.
  const std::vector<double> xs = {-100, -3, -0.5, 0, 0.7, 4, 100}, ys = {0, 1, 0.3, 1, 0, 0.5, 1};
  const Tensor x = ag::from_vector<double>(xs, {7}), y = ag::from_vector<double>(ys, {7});
  std::vector<double> ref;
  for (size_t i = 0; i < xs.size(); ++i)
    ref.push_back(std::max(xs[i], 0.0) - xs[i] * ys[i] + std::log1p(std::exp(-std::fabs(xs[i]))));
  EXPECT_TRUE(agt::allclose(ag::binary_cross_entropy_with_logits(x, y, Reduction::None), ag::from_vector<double>(ref, {7}),
                            1e-12, 1e-12));
  double total = 0;
  for (double v : ref) total += v;
  EXPECT_NEAR(ag::binary_cross_entropy_with_logits(x, y).item<double>(), total / 7, 1e-12);
  EXPECT_NEAR(ag::binary_cross_entropy_with_logits(x, y, Reduction::Sum).item<double>(), total, 1e-12);
  const auto l32 = ag::binary_cross_entropy_with_logits(x.to(ag::kFloat32), y.to(ag::kFloat32), Reduction::None)
                       .to_vector<double>();
  for (double v : l32) EXPECT_TRUE(std::isfinite(v));
  // the gradient is sigmoid(x) - y everywhere, including the kink of |x| at 0
  Tensor xg = x.detach().requires_grad_();
  ag::binary_cross_entropy_with_logits(xg, y, Reduction::Sum).backward();
  const auto g = xg.grad().to_vector<double>();
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_NEAR(g[i], 1 / (1 + std::exp(-xs[i])) - ys[i], 1e-12);
  ag::manual_seed(27);
  for (Reduction r : kReductions)
    EXPECT_TRUE(agt::gradcheck(
        [&](const std::vector<Tensor>& in) { return ag::binary_cross_entropy_with_logits(in[0], in[1], r); },
        {agt::rand64({3, 5}, -3, 3), agt::non_contiguous(agt::rand64({3, 5}, 0, 1))}));
  for (ag::DType dt : {ag::kFloat16, ag::kBFloat16}) {
    const Tensor xh = ag::randn({200}, ag::kFloat32).to(dt), yh = ag::rand({200}, ag::kFloat32).to(dt);
    EXPECT_TRUE(agt::allclose(ag::binary_cross_entropy_with_logits(xh, yh),
                              ag::binary_cross_entropy_with_logits(xh.to(ag::kFloat32), yh.to(ag::kFloat32)),
                              agt::tol_for(dt)));
  }
}

TEST(LossTest, Errors) {
  const Tensor x = ag::zeros({4, 5});
  EXPECT_AG_ERROR(ag::cross_entropy(x, ag::from_vector<int64_t>({0, 5, 1, 2}, {4})),
                  "[cross_entropy] target 5 is out of range for 5 classes");
  EXPECT_AG_ERROR(ag::cross_entropy(x, ag::from_vector<int64_t>({0, -1, 1, 2}, {4})),
                  "[cross_entropy] target -1 is out of range for 5 classes");
  EXPECT_AG_ERROR(ag::cross_entropy(x, ag::from_vector<int64_t>({0, 1, 2}, {3})),
                  "[cross_entropy] target of shape [3] does not match the input of shape [4, 5] (expected a target of shape [4])");
  EXPECT_AG_ERROR(ag::cross_entropy(x, ag::zeros({4})), "[cross_entropy] a probability target must have the input's shape [4, 5], got [4]");
  EXPECT_AG_ERROR(ag::cross_entropy(x, ag::zeros({4}, ag::kInt64), Reduction::Mean, -100, 1.5),
                  "[cross_entropy] label_smoothing must be in [0, 1], got 1.5");
  EXPECT_AG_ERROR(ag::cross_entropy(ag::zeros({4, 5}, ag::kInt64), ag::zeros({4}, ag::kInt64)),
                  "[cross_entropy] input must be floating, got int64");
  EXPECT_AG_ERROR(ag::nll_loss(x, ag::from_vector<int64_t>({0, 9, 1, 2}, {4})), "[nll_loss] target 9 is out of range for 5 classes");
  EXPECT_AG_ERROR(ag::nll_loss(x, ag::zeros({4}, ag::kUInt8)), "[nll_loss] target must hold class indices as int64 or int32, got uint8");
  EXPECT_AG_ERROR(ag::mse_loss(x, ag::zeros({5})), "[mse_loss] input of shape [4, 5] and target of shape [5] must have one shape");
  EXPECT_AG_ERROR(ag::binary_cross_entropy_with_logits(x, ag::zeros({4, 1})),
                  "[binary_cross_entropy_with_logits] target of shape [4, 1] must have the input's shape [4, 5]");
}

// Cross entropy's rows (classes innermost; float32, and 16-bit logits widened to float) have
// an AVX-512 variant and the baseline one (loss.cpp); each level this CPU runs is forced in
// turn. Per-position losses and the gradient for a random incoming gradient per position
// against the reference on the same rounded logits, and against the baseline variant
// bit for bit (the variants do the same arithmetic). Class counts go around the 16-lane
// vectors and the 256-logit chunks of the exponentials; a quarter of the targets ignored.
class LossEachIsa : public agt::EachKernelIsa {};

TEST_P(LossEachIsa, CrossEntropyForwardAndBackwardAgainstFloat64) {
  ag::manual_seed(83);
  const int64_t N = 6;
  for (ag::DType dt : {ag::kFloat32, ag::kBFloat16})
    for (int64_t C : {1, 15, 16, 17, 255, 256, 257, 1000})
      for (double smoothing : {0.0, 0.1}) {
        SCOPED_TRACE(::testing::Message() << ag::dtype_name(dt) << " C " << C << " smoothing " << smoothing);
        const Tensor x = ag::mul(ag::randn({N, C}, ag::kFloat64), 3.0).to(dt);
        const Tensor t = random_targets({N}, C, -100, 0.25);
        const Tensor g = ag::randn({N}, ag::kFloat64).to(dt);
        const auto run = [&] {
          Tensor xg = x.detach().requires_grad_();
          const Tensor loss = ag::cross_entropy(xg, t, Reduction::None, -100, smoothing);
          loss.backward(g);
          return std::vector<Tensor>{loss.detach(), xg.grad()};
        };
        const std::vector<Tensor> got = run();
        const Tensor x64 = x.to(ag::kFloat64);
        const agt::Tol tol = dt == ag::kFloat32 ? agt::fp32_tol(C) : agt::tol_for(dt);
        EXPECT_TRUE(agt::allclose(got[0], ref_cross_entropy(x64, t, Reduction::None, -100, smoothing), tol)) << "losses";
        const Tensor grad = ag::mul(ref_cross_entropy_grad(x64, t, -100, smoothing), g.to(ag::kFloat64).unsqueeze(1));
        EXPECT_TRUE(agt::allclose(got[1], grad, tol)) << "gradient";
        const std::vector<Tensor> base = agt::at_kernel_isa("baseline", run);
        EXPECT_TRUE(agt::same_bits(got[0], base[0])) << "losses against the baseline variant";
        EXPECT_TRUE(agt::same_bits(got[1], base[1])) << "gradient against the baseline variant";
      }
}

AGT_EACH_KERNEL_ISA(LossEachIsa);
