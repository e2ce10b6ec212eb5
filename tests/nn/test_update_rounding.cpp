// Update rounding of 16-bit parameters (ag::optim's update_rounding: nearest, stochastic,
// compensated, master) and the stalled-update counter. The shared stochastic rounding
// (ampgrad/stochastic_round.h) and the fused steps are checked against the float64
// specification (ampgrad/reference/optim.h): round_stochastic with the same uniform draw,
// kahan_update; unbiasedness by the mean of many roundings against its standard error; the
// Kahan sum against the float64 sum where nearest rounding freezes; the stalled counts (per
// parameter and per group) on constructed cases; state dicts that resume bit for bit.
#include "support/testing.h"

#include <omp.h>

#include <cmath>
#include <cstring>

#include "ampgrad/philox.h"
#include "ampgrad/reference/optim.h"
#include "ampgrad/stochastic_round.h"

using namespace ag;
namespace ref = ampgrad::reference;
using optim::UpdateRounding;

namespace {

ref::Format16 format_of(DType dt) { return dt == kBFloat16 ? ref::kBFloat16Format : ref::kHalfFormat; }

// The 16-bit value of bits b as a double.
double value_of_bits(uint16_t b, DType dt) {
  return dt == kBFloat16 ? double(float(BFloat16::from_bits(b))) : double(float(Half::from_bits(b)));
}

// The float32 value w_new = w - lr * g as the fused SGD step computes it (no momentum, no
// weight decay: d = g + 0 * w = g).
float sgd_value(float w, float g, float lr) {
  const float step = lr * g;
  return w - step;
}

// The reference's stochastic rounding of w with element i's draw of parameter `id` at step
// `step` under `seed` (backend.h's OptimizerLists::rounding).
double ref_stochastic(float w, DType dt, uint64_t seed, int64_t i, int64_t id, int64_t step) {
  const uint32_t r = kernels::rounding_draw(seed, i, id, step);
  return ref::round_stochastic(double(w), format_of(dt), double(kernels::uniform01(r)));
}

// The neighbours of x in the format: the values toward and away from zero.
std::pair<double, double> neighbours(double x, DType dt) {
  const double tz = ref::round_stochastic(x, format_of(dt), 1.0);  // u = 1 never rounds away
  const double az = ref::round_stochastic(x, format_of(dt), 0.0);  // u = 0 does unless exact
  return {tz, az};
}

Tensor param_of(const std::vector<double>& v, DType dt) {
  return from_vector<double>(v, {int64_t(v.size())}).to(dt).requires_grad_();
}

}  // namespace

TEST(UpdateRounding, NamesParseAndPrint) {
  for (UpdateRounding r :
       {UpdateRounding::Nearest, UpdateRounding::Stochastic, UpdateRounding::Compensated, UpdateRounding::Master})
    EXPECT_EQ(optim::parse_update_rounding(optim::update_rounding_name(r)), r);
  EXPECT_STREQ(optim::update_rounding_name(UpdateRounding::Stochastic), "stochastic");
  EXPECT_AG_ERROR(optim::parse_update_rounding("Stochastic"), "unknown update rounding 'Stochastic'");
  EXPECT_AG_ERROR(optim::parse_update_rounding("kahan"), "(expected nearest, stochastic, compensated or master)");
}

// The shared kernel helpers against the specification, for values across every range of
// both formats (float16 subnormals, bfloat16 subnormals, near the largest finite values,
// representable values, NaN and infinity) and random draws.
TEST(UpdateRounding, StochasticHelpersMatchTheReference) {
  const Tensor mags = agt::rand64({4000}, 0, 1, false);
  const std::vector<double> m = mags.to_vector<double>();
  std::vector<float> values = {0.0f,     -0.0f,     1.0f, 65504.0f, 65519.0f, 65520.0f, 70000.0f, 3.3895e38f, 3.39e38f,
                               INFINITY, -INFINITY, NAN,  6.0e-8f,  5.96e-8f, 1e-40f,   -1e-41f,  6.1e-5f};
  for (size_t i = 0; i < m.size(); ++i) {
    // exponents from 2^-140 to 2^17, either sign
    const int e = -140 + int(i % 158);
    values.push_back(float(std::ldexp(1 + m[i], e) * (i % 2 ? -1 : 1)));
  }
  for (DType dt : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    int mismatches = 0;
    for (size_t i = 0; i < values.size(); ++i)
      for (uint32_t k = 0; k < 8; ++k) {
        const uint32_t r = kernels::Philox4x32(7, i * 8 + k).out[0];
        const float w = values[i];
        const uint16_t bits =
            dt == kBFloat16 ? kernels::stochastic_bf16_bits(w, r) : kernels::stochastic_half_bits(w, r);
        const double got = value_of_bits(bits, dt);
        const double want = ref::round_stochastic(double(w), format_of(dt), double(kernels::uniform01(r)));
        const bool same = std::isnan(want) ? std::isnan(got) : got == want && std::signbit(got) == std::signbit(want);
        if (!same && ++mismatches < 5)
          ADD_FAILURE() << "w = " << w << " r = " << r << ": got " << got << ", want " << want;
      }
    EXPECT_EQ(mismatches, 0);
  }
}

// The reference's own rules on values worked out by hand: exact values stay, a value a
// quarter of the way to its upper neighbour rounds up for u < 0.25 only.
TEST(UpdateRounding, ReferenceRoundingByHand) {
  const double ulp = std::ldexp(1.0, -7);  // bfloat16 in [1, 2)
  EXPECT_EQ(ref::round_stochastic(1.0 + ulp, ref::kBFloat16Format, 0.0), 1.0 + ulp);
  EXPECT_EQ(ref::round_stochastic(1.0 + ulp / 4, ref::kBFloat16Format, 0.2499), 1.0 + ulp);
  EXPECT_EQ(ref::round_stochastic(1.0 + ulp / 4, ref::kBFloat16Format, 0.25), 1.0);
  EXPECT_EQ(ref::round_stochastic(-(1.0 + ulp / 4), ref::kBFloat16Format, 0.1), -(1.0 + ulp));
  EXPECT_EQ(ref::round_nearest(1.0 + ulp / 2, ref::kBFloat16Format), 1.0);  // tie to even
  EXPECT_EQ(ref::round_nearest(1.0 + 1.5 * ulp, ref::kBFloat16Format), 1.0 + 2 * ulp);
  EXPECT_EQ(ref::round_nearest(65520.0, ref::kHalfFormat), INFINITY);
  EXPECT_EQ(ref::round_nearest(65519.0, ref::kHalfFormat), 65504.0);
  // float16 subnormals: ulp 2^-24
  EXPECT_EQ(ref::round_stochastic(std::ldexp(2.5, -24), ref::kHalfFormat, 0.49), std::ldexp(3.0, -24));
  EXPECT_EQ(ref::round_stochastic(std::ldexp(2.5, -24), ref::kHalfFormat, 0.5), std::ldexp(2.0, -24));
  // Kahan: updates of a quarter ulp are kept in c until their sum rounds w up (the second,
  // a tie, rounds to the even 1); c then holds what w took too much.
  double c = 0, w = 1.0;
  for (int i = 0; i < 2; ++i) w = ref::kahan_update(w, ulp / 4, c, ref::kBFloat16Format);
  EXPECT_EQ(w, 1.0);
  EXPECT_EQ(c, ulp / 2);
  w = ref::kahan_update(w, ulp / 4, c, ref::kBFloat16Format);
  EXPECT_EQ(w, 1.0 + ulp);
  EXPECT_EQ(c, -ulp / 4);
  w = ref::kahan_update(w, ulp / 4, c, ref::kBFloat16Format);
  EXPECT_EQ(w, 1.0 + ulp);  // four quarters: one ulp, exactly
  EXPECT_EQ(c, 0.0);
}

// One SGD step through the fused kernel, element by element the reference's rounding of the
// float32 value with the documented draw; the second parameter draws with id 1, and the
// second step with the parameter's step 1.
TEST(UpdateRounding, FusedStochasticSgdMatchesTheReference) {
  for (DType dt : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t n = 40000;  // more than one piece of the CPU step
    Tensor a = (agt::rand64({n}, -2, 2, false)).to(dt).requires_grad_();
    Tensor b = (agt::rand64({300}, -1e-3, 1e-3, false)).to(dt).requires_grad_();
    const float lr = 0.01f;
    optim::SGD opt({a, b}, {.lr = lr, .update_rounding = UpdateRounding::Stochastic});
    opt.set_rounding_seed(0x1234567887654321ull);
    for (int64_t step = 0; step < 2; ++step) {
      const std::vector<Tensor> ps = {a, b};
      std::vector<std::vector<double>> want(2);
      for (int64_t id = 0; id < 2; ++id) {
        const Tensor g = agt::rand64({ps[id].numel()}, -1, 1, false).to(dt);
        ps[id].set_grad(g);
        const std::vector<float> w = ps[id].detach().to(kFloat32).to_vector<float>(),
                                 gv = g.to(kFloat32).to_vector<float>();
        for (size_t i = 0; i < w.size(); ++i)
          want[id].push_back(ref_stochastic(sgd_value(w[i], gv[i], lr), dt, opt.rounding_seed(), int64_t(i), id, step));
      }
      opt.step();
      for (int64_t id = 0; id < 2; ++id)
        EXPECT_EQ(ps[id].detach().to(kFloat64).to_vector<double>(), want[id])
            << "parameter " << id << ", step " << step;
    }
  }
}

// Adam and AdamW's stochastic step against the reference: a master-weights run from the
// same 16-bit values computes the same float32 value in its first step (its master starts
// as the exact widening of the parameter) and keeps it, and the stochastic run stores that
// value's rounding with the documented draw.
TEST(UpdateRounding, FusedStochasticAdamMatchesTheReference) {
  for (bool decoupled : {false, true}) {
    SCOPED_TRACE(decoupled ? "AdamW" : "Adam");
    const int64_t n = 30000;
    const Tensor init = agt::rand64({n}, -1, 1, false).to(kBFloat16), g = agt::rand64({n}, -1, 1, false).to(kBFloat16);
    Tensor a = init.clone().requires_grad_(), b = init.clone().requires_grad_();
    auto make = [&](Tensor p, UpdateRounding r) -> std::unique_ptr<optim::Optimizer> {
      if (decoupled)
        return std::make_unique<optim::AdamW>(
            std::vector<Tensor>{p}, optim::AdamWOptions{.lr = 1e-3, .weight_decay = 0.1, .update_rounding = r});
      return std::make_unique<optim::Adam>(std::vector<Tensor>{p},
                                           optim::AdamOptions{.lr = 1e-3, .weight_decay = 0.1, .update_rounding = r});
    };
    auto master = make(a, UpdateRounding::Master), stochastic = make(b, UpdateRounding::Stochastic);
    a.set_grad(g);
    b.set_grad(g);
    master->step();
    stochastic->step();
    const std::vector<float> w = master->state_dict().at("state.0.0.master").to_vector<float>();
    std::vector<double> want;
    for (size_t i = 0; i < w.size(); ++i)
      want.push_back(ref_stochastic(w[i], kBFloat16, stochastic->rounding_seed(), int64_t(i), 0, 0));
    EXPECT_EQ(b.detach().to(kFloat64).to_vector<double>(), want);
  }
}

// The mean of many stochastic roundings of one value is that value, within 5 standard
// errors (each rounding is lo or hi with P(hi) = (x - lo) / (hi - lo)); a representable
// value stays exact; both neighbours occur (the draws differ across elements); the pattern
// differs from one step to the next; a seed reproduces it, at any thread count.
TEST(UpdateRounding, StochasticIsUnbiasedExactAndReproducible) {
  const int64_t n = 60000;
  for (DType dt : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    for (double frac : {0.3, 0.9}) {
      SCOPED_TRACE(frac);
      // w = 1 - frac * ulp below 1 (ulp = 2^-8 for bfloat16, 2^-11 for float16), reached
      // from 1 with the gradient 1 and lr = frac * ulp.
      const double ulp_below = dt == kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
      const float lr = float(frac * ulp_below);
      const float x = sgd_value(1.0f, 1.0f, lr);
      const auto [lo, hi] = neighbours(double(x), dt);
      const double p_away = (double(x) - lo) / (hi - lo);  // lo: toward zero, hi: away
      const double se = std::abs(hi - lo) * std::sqrt(p_away * (1 - p_away) / double(n));
      Tensor w = ones({n}, dt).requires_grad_();
      optim::SGD opt({w}, {.lr = lr, .update_rounding = UpdateRounding::Stochastic});
      w.set_grad(ones({n}, dt));
      opt.step();
      const std::vector<double> v = w.detach().to(kFloat64).to_vector<double>();
      double mean = 0;
      int64_t n_lo = 0, n_hi = 0;
      for (double e : v) {
        mean += e / double(n);
        n_lo += e == lo;
        n_hi += e == hi;
      }
      EXPECT_EQ(n_lo + n_hi, n) << "every element is one of the two neighbours";
      EXPECT_GT(n_lo, 0);
      EXPECT_GT(n_hi, 0);
      EXPECT_LT(std::abs(mean - double(x)), 5 * se) << "mean " << mean << " of " << x << ", standard error " << se;
      // Nearest would give the same value everywhere: the mean would be off by ~frac ulp.
      EXPECT_GT(std::abs(double(float(x)) - ref::round_nearest(double(x), format_of(dt))), 20 * se);

      // The next step from the same values draws anew.
      const Tensor first = w.detach().clone();
      Tensor(w).detach().fill_(1.0);
      w.set_grad(ones({n}, dt));
      opt.step();
      EXPECT_FALSE(agt::same_bits(w.detach(), first)) << "step 2 repeats step 1's draws";

      // Same seed, one thread: the same bits as the first step.
      const int threads = omp_get_max_threads();
      omp_set_num_threads(1);
      Tensor w1 = ones({n}, dt).requires_grad_();
      optim::SGD again({w1}, {.lr = lr, .update_rounding = UpdateRounding::Stochastic});
      again.set_rounding_seed(opt.rounding_seed());
      w1.set_grad(ones({n}, dt));
      again.step();
      omp_set_num_threads(threads);
      EXPECT_TRUE(agt::same_bits(w1.detach(), first));
      // Another seed: other bits.
      Tensor w2 = ones({n}, dt).requires_grad_();
      optim::SGD other({w2}, {.lr = lr, .update_rounding = UpdateRounding::Stochastic});
      other.set_rounding_seed(opt.rounding_seed() + 1);
      w2.set_grad(ones({n}, dt));
      other.step();
      EXPECT_FALSE(agt::same_bits(w2.detach(), first));
    }
    // A representable new value is stored exactly, every element.
    Tensor w = ones({n}, dt).requires_grad_();
    optim::SGD opt({w}, {.lr = 0.5, .update_rounding = UpdateRounding::Stochastic});
    w.set_grad(ones({n}, dt));
    opt.step();
    EXPECT_EQ(w.detach().to(kFloat64).to_vector<double>(), std::vector<double>(size_t(n), 0.5));
  }
}

// The rounding seed comes from the global generator: manual_seed decides it, and two
// optimizers made in a row differ.
TEST(UpdateRounding, SeedComesFromTheGlobalGenerator) {
  const Tensor p = ones({4}, kBFloat16).requires_grad_();
  manual_seed(5);
  const uint64_t s1 = optim::SGD({p}, {}).rounding_seed(), s2 = optim::SGD({p}, {}).rounding_seed();
  manual_seed(5);
  EXPECT_EQ(optim::SGD({p}, {}).rounding_seed(), s1);
  EXPECT_NE(s1, s2);
}

// A bfloat16 weight of 1 with 6000 steps of 1e-4 (a twentieth of the half ulp below 1):
// nearest rounding never moves it; Kahan's compensation follows the float64 sum 1 - 0.6
// within 2% of the distance travelled (the bfloat16 compensation rounds too: a few ulps of
// 2^-9 at the end), where nearest misses all of it; Adam too (its step is lr for a
// constant gradient).
TEST(UpdateRounding, CompensatedTracksTheFloat64SumWhereNearestFreezes) {
  constexpr int kSteps = 6000;
  constexpr double kLr = 1e-4;
  auto run = [&](UpdateRounding r, bool adam) {
    Tensor w = ones({3}, kBFloat16).requires_grad_();
    std::unique_ptr<optim::Optimizer> opt;
    if (adam)
      opt = std::make_unique<optim::Adam>(std::vector<Tensor>{w}, optim::AdamOptions{.lr = kLr, .update_rounding = r});
    else opt = std::make_unique<optim::SGD>(std::vector<Tensor>{w}, optim::SGDOptions{.lr = kLr, .update_rounding = r});
    for (int i = 0; i < kSteps; ++i) {
      w.set_grad(ones({3}, kBFloat16));
      opt->step();
    }
    return w.detach().to(kFloat64).to_vector<double>();
  };
  const double want = 1 - kSteps * kLr;
  const double bound = 0.02 * kSteps * kLr;
  for (bool adam : {false, true}) {
    SCOPED_TRACE(adam ? "Adam" : "SGD");
    EXPECT_EQ(run(UpdateRounding::Nearest, adam), std::vector<double>(3, 1.0));
    for (double v : run(UpdateRounding::Compensated, adam)) EXPECT_NEAR(v, want, bound);
  }
}

// The fused compensated SGD step against the reference's kahan_update, step by step: lr a
// power of two and bfloat16 gradients, so the float32 sums the kernel forms are exact and
// the results agree bit for bit (parameter and compensation).
TEST(UpdateRounding, FusedCompensatedSgdMatchesTheReference) {
  for (DType dt : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t n = 20000;
    const double lr = std::ldexp(1.0, -10);
    Tensor w = agt::rand64({n}, 0.5, 1, false).to(dt).requires_grad_();
    std::vector<double> rw = w.detach().to(kFloat64).to_vector<double>(), rc(size_t(n), 0.0);
    optim::SGD opt({w}, {.lr = lr, .update_rounding = UpdateRounding::Compensated});
    for (int step = 0; step < 5; ++step) {
      const Tensor g = agt::rand64({n}, -1, 1, false).to(dt);
      const std::vector<double> gv = g.to(kFloat64).to_vector<double>();
      for (size_t i = 0; i < rw.size(); ++i) rw[i] = ref::kahan_update(rw[i], -lr * gv[i], rc[i], format_of(dt));
      w.set_grad(g);
      opt.step();
      EXPECT_EQ(w.detach().to(kFloat64).to_vector<double>(), rw) << "step " << step;
      const auto sd = opt.state_dict();
      ASSERT_TRUE(sd.count("state.0.0.comp"));
      EXPECT_EQ(sd.at("state.0.0.comp").dtype(), dt);
      EXPECT_EQ(sd.at("state.0.0.comp").to(kFloat64).to_vector<double>(), rc) << "step " << step;
    }
  }
}

// Float32 and float64 parameters ignore the mode: the same bits as nearest, no compensation.
TEST(UpdateRounding, WideParametersIgnoreTheMode) {
  for (DType dt : {kFloat32, kFloat64}) {
    const Tensor init = agt::rand64({1000}, -1, 1, false).to(dt), g = agt::rand64({1000}, -1, 1, false).to(dt);
    Tensor a = init.clone().requires_grad_(), b = init.clone().requires_grad_(), c = init.clone().requires_grad_();
    optim::AdamW oa({a}, {.lr = 1e-3}), ob({b}, {.lr = 1e-3, .update_rounding = UpdateRounding::Stochastic}),
        oc({c}, {.lr = 1e-3, .update_rounding = UpdateRounding::Compensated});
    for (int i = 0; i < 3; ++i) {
      for (auto* p : {&a, &b, &c}) p->set_grad(g);
      oa.step();
      ob.step();
      oc.step();
    }
    EXPECT_TRUE(agt::same_bits(b.detach(), a.detach()));
    EXPECT_TRUE(agt::same_bits(c.detach(), a.detach()));
    EXPECT_EQ(oc.state_dict().count("state.0.0.comp"), 0u);
  }
}

// Bytes of state per mode, per bfloat16 parameter element: SGD without momentum keeps
// nothing under nearest and stochastic, 2 bytes under compensated, 4 under master; Adam
// adds its two float32 moments.
TEST(UpdateRounding, StateBytesPerMode) {
  const int64_t n = 1000;
  const std::vector<std::pair<UpdateRounding, size_t>> kinds = {{UpdateRounding::Nearest, 0},
                                                                {UpdateRounding::Stochastic, 0},
                                                                {UpdateRounding::Compensated, 2},
                                                                {UpdateRounding::Master, 4}};
  for (const auto& [mode, bytes] : kinds) {
    SCOPED_TRACE(optim::update_rounding_name(mode));
    Tensor a = ones({n}, kBFloat16).requires_grad_(), b = ones({n}, kBFloat16).requires_grad_();
    optim::SGD sgd({a}, {.lr = 0.1, .update_rounding = mode});
    optim::Adam adam({b}, {.lr = 0.1, .update_rounding = mode});
    EXPECT_EQ(sgd.state_bytes(), 0u);  // made at the first step
    a.set_grad(ones({n}, kBFloat16));
    b.set_grad(ones({n}, kBFloat16));
    sgd.step();
    adam.step();
    EXPECT_EQ(sgd.state_bytes(), bytes * n);
    EXPECT_EQ(sgd.state_bytes(0), bytes * n);
    EXPECT_EQ(adam.state_bytes(), (bytes + 8) * n);
  }
}

// A constructed case: a bfloat16 parameter of ones (more than one piece of the CPU step),
// element i with gradient 0 (i % 3 == 0: no update), 1 (an update of 1e-4, below the half
// ulp 2^-9: stalled under nearest) or 100 (an update of 1e-2: moves). Nearest counts the
// second kind exactly; master counts none (the float32 master moves); a float32 group adds
// nothing; off, nothing is counted; a skipped step counts nothing.
TEST(UpdateRounding, StalledCounterCountsExactly) {
  const int64_t n = 50000;
  std::vector<double> gv(static_cast<size_t>(n));
  int64_t tiny = 0;
  for (int64_t i = 0; i < n; ++i) {
    gv[size_t(i)] = i % 3 == 0 ? 0.0 : i % 3 == 1 ? 1.0 : 100.0;
    tiny += i % 3 == 1;
  }
  const Tensor g = from_vector<double>(gv, {n});
  for (UpdateRounding mode : {UpdateRounding::Nearest, UpdateRounding::Master}) {
    SCOPED_TRACE(optim::update_rounding_name(mode));
    Tensor w = ones({n}, kBFloat16).requires_grad_(), f = ones({n}, kFloat32).requires_grad_();
    optim::SGD opt(std::vector<optim::SGD::ParamGroup>{{{w}, {.lr = 1e-4, .update_rounding = mode}},
                                                       {{f}, {.lr = 1e-12, .update_rounding = mode}}});
    auto step = [&](const Tensor& found_inf = Tensor()) {
      w.set_grad(g.to(kBFloat16));
      f.set_grad(g.to(kFloat32));
      opt.step(found_inf);
    };
    step();
    EXPECT_EQ(opt.stalled_count().item<int64_t>(), 0) << "off";
    opt.set_count_stalled(true);
    step();
    const int64_t want = mode == UpdateRounding::Nearest ? tiny : 0;
    EXPECT_EQ(opt.stalled_count().item<int64_t>(), want);
    EXPECT_EQ(opt.stalled_count(0).item<int64_t>(), want);
    EXPECT_EQ(opt.stalled_count(1).item<int64_t>(), 0) << "float32 parameters are not counted";
    EXPECT_DOUBLE_EQ(opt.stalled_fraction(0), double(want) / double(n));
    EXPECT_EQ(opt.stalled_fraction(1), 0.0);
    step(ones({1}, kFloat32));  // skipped
    EXPECT_EQ(opt.stalled_count().item<int64_t>(), 0) << "a skipped step";
    step();
    EXPECT_EQ(opt.stalled_count().item<int64_t>(), want);
    opt.set_count_stalled(false);
  }
}

// Per-parameter counts: 16-bit parameters of ones whose elements get the gradient 1 (an
// update of 1e-4 at lr 1e-4: below the half ulp of 1 in bfloat16 and in float16, stalled)
// at a rate of their own, else 100 (an update of 1e-2: moves). Group 0 interleaves a
// float32 parameter, so its bfloat16 parameters are slots 0 and 2 of the group and the
// float16 one slot 3; in group 1 the last parameter has no gradient. Each count is the
// number of gradients of 1 (the first parameter spans several pieces of the CPU step);
// the float32 slot and the slot without a gradient stay 0; the group's count is their sum;
// a skipped step counts nothing.
TEST(UpdateRounding, StalledCountsArePerParameter) {
  struct P {
    int64_t n;
    DType dt;
    int every;  // element i stalls where i % every == 0 (0: float32, not counted)
  };
  const std::vector<std::vector<P>> groups = {
      {{60000, kBFloat16, 4}, {3000, kFloat32, 0}, {5000, kBFloat16, 5}, {4000, kFloat16, 2}},
      {{2000, kBFloat16, 7}, {3000, kBFloat16, 1}, {1000, kBFloat16, 1}}};
  std::vector<std::vector<Tensor>> params(groups.size()), grads(groups.size());
  std::vector<std::vector<int64_t>> want(groups.size());
  std::vector<optim::SGD::ParamGroup> pgs;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const P& p : groups[g]) {
      std::vector<double> gv(static_cast<size_t>(p.n));
      int64_t stalled = 0;
      for (int64_t i = 0; i < p.n; ++i) {
        const bool tiny = p.every > 0 && i % p.every == 0;
        gv[size_t(i)] = tiny || p.every == 0 ? 1.0 : 100.0;
        stalled += tiny;
      }
      params[g].push_back(ones({p.n}, p.dt).requires_grad_());
      grads[g].push_back(from_vector<double>(gv, {p.n}).to(p.dt));
      want[g].push_back(stalled);
    }
    pgs.push_back({params[g], {.lr = 1e-4}});
  }
  want[1][2] = 0;  // no gradient
  optim::SGD opt(pgs);
  opt.set_count_stalled(true);
  for (size_t g = 0; g < groups.size(); ++g)
    EXPECT_EQ(opt.stalled_counts(g).to_vector<int64_t>(), std::vector<int64_t>(groups[g].size(), 0)) << "before a step";
  auto step = [&](const Tensor& found_inf = Tensor()) {
    for (size_t g = 0; g < groups.size(); ++g)
      for (size_t j = 0; j < params[g].size(); ++j) params[g][j].set_grad(g == 1 && j == 2 ? Tensor() : grads[g][j]);
    opt.step(found_inf);
  };
  step();
  int64_t total = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    SCOPED_TRACE("group " + std::to_string(g));
    const Tensor& counts = opt.stalled_counts(g);
    EXPECT_EQ(counts.dtype(), kInt64);
    EXPECT_EQ(counts.sizes(), (std::vector<int64_t>{int64_t(groups[g].size())}));
    EXPECT_EQ(counts.to_vector<int64_t>(), want[g]);
    int64_t sum = 0;
    std::vector<double> fractions;
    for (size_t j = 0; j < want[g].size(); ++j) {
      sum += want[g][j];
      fractions.push_back(groups[g][j].every == 0 ? 0.0 : double(want[g][j]) / double(groups[g][j].n));
    }
    EXPECT_EQ(opt.stalled_count(g).item<int64_t>(), sum);
    EXPECT_EQ(opt.stalled_fractions(g), fractions);
    total += sum;
  }
  EXPECT_EQ(opt.stalled_count().item<int64_t>(), total);
  // the worst parameter of group 0: the float16 one (1 in 2 stalled)
  const std::vector<double> f0 = opt.stalled_fractions(0);
  EXPECT_EQ(std::max_element(f0.begin(), f0.end()) - f0.begin(), 3);
  step(ones({1}, kFloat32));  // skipped
  for (size_t g = 0; g < groups.size(); ++g) {
    EXPECT_EQ(opt.stalled_counts(g).to_vector<int64_t>(), std::vector<int64_t>(groups[g].size(), 0))
        << "a skipped step, group " << g;
    EXPECT_EQ(opt.stalled_fractions(g), std::vector<double>(groups[g].size(), 0.0));
  }
  EXPECT_EQ(opt.stalled_count().item<int64_t>(), 0);
  step();
  EXPECT_EQ(opt.stalled_counts(0).to_vector<int64_t>(), want[0]) << "counted again";
  EXPECT_AG_ERROR(opt.stalled_counts(2), "group 2 does not exist");
}

// The backend refuses a counts tensor without one element per parameter.
TEST(UpdateRounding, StalledCountsOfTheWrongShapeAreRefused) {
  OptimizerLists l;
  l.params = {ones({4}, kBFloat16), ones({3}, kBFloat16)};
  l.grads = {ones({4}, kBFloat16), ones({3}, kBFloat16)};
  l.masters = {Tensor(), Tensor()};
  l.steps = {zeros({}, kInt64), zeros({}, kInt64)};
  l.lr = {0.1, Tensor()};
  l.stalled = zeros({}, kInt64);
  EXPECT_AG_ERROR(backend(kCPU, "test").sgd_step(l, {}),
                  "[SGD] the stalled counts must be a contiguous 1-D int64 tensor of 2 elements");
  l.stalled = zeros({2}, kInt32);
  EXPECT_AG_ERROR(backend(kCPU, "test").sgd_step(l, {}), "got int32 [2]");
  EXPECT_TRUE(agt::same_bits(l.params[0], ones({4}, kBFloat16))) << "nothing was written";
}

// Adam and AdamW: with a constant gradient the step is lr (1e-4, lost at 1 in bfloat16)
// wherever the gradient is nonzero; a zero gradient updates nothing without decoupled decay
// and shrinks w with it (also lost): AdamW counts every element.
TEST(UpdateRounding, StalledCounterOfAdamCountsTheDecay) {
  const int64_t n = 3000;
  std::vector<double> gv(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) gv[size_t(i)] = i % 2 ? 1.0 : 0.0;
  const Tensor g = from_vector<double>(gv, {n}).to(kBFloat16);
  Tensor a = ones({n}, kBFloat16).requires_grad_(), b = ones({n}, kBFloat16).requires_grad_();
  optim::Adam adam({a}, {.lr = 1e-4});
  optim::AdamW adamw({b}, {.lr = 1e-4, .weight_decay = 0.01});
  adam.set_count_stalled(true);
  adamw.set_count_stalled(true);
  a.set_grad(g);
  b.set_grad(g);
  adam.step();
  adamw.step();
  EXPECT_EQ(adam.stalled_count().item<int64_t>(), n / 2);
  EXPECT_EQ(adamw.stalled_count().item<int64_t>(), n);
}

// N steps straight, or N/2, a state dict, a fresh optimizer (with another seed) that loads
// it, and N/2 more: the same bits, for each mode, SGD with momentum and AdamW, through a
// grad scaler's skipped step.
TEST(UpdateRounding, ResumedRunContinuesBitForBit) {
  constexpr int kSteps = 8;
  const Tensor init = agt::rand64({5000}, -1, 1, false).to(kBFloat16);
  std::vector<Tensor> grads;
  for (int i = 0; i < kSteps; ++i) grads.push_back(agt::rand64({5000}, -1e-2, 1e-2, false).to(kBFloat16));
  for (UpdateRounding mode : {UpdateRounding::Stochastic, UpdateRounding::Compensated, UpdateRounding::Master}) {
    for (int which = 0; which < 2; ++which) {
      SCOPED_TRACE(std::string(optim::update_rounding_name(mode)) + (which ? " AdamW" : " SGD"));
      auto make = [&](Tensor p) -> std::unique_ptr<optim::Optimizer> {
        if (which == 0)
          return std::make_unique<optim::SGD>(std::vector<Tensor>{p},
                                              optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .update_rounding = mode});
        return std::make_unique<optim::AdamW>(std::vector<Tensor>{p},
                                              optim::AdamWOptions{.lr = 1e-3, .update_rounding = mode});
      };
      auto run = [&](optim::Optimizer& opt, Tensor p, int from, int to) {
        for (int i = from; i < to; ++i) {
          p.set_grad(grads[size_t(i)]);
          opt.step(i == 2 ? ones({1}, kFloat32) : zeros({1}, kFloat32));
        }
      };
      Tensor straight = init.clone().requires_grad_();
      auto o1 = make(straight);
      run(*o1, straight, 0, kSteps);

      Tensor resumed = init.clone().requires_grad_();
      auto o2 = make(resumed);
      o2->set_rounding_seed(o1->rounding_seed());
      run(*o2, resumed, 0, kSteps / 2);
      nn::StateDict sd;
      for (const auto& [k, v] : o2->state_dict()) sd[k] = v.clone();
      const Tensor half_way = resumed.detach().clone();
      Tensor again = half_way.clone().requires_grad_();
      auto o3 = make(again);
      EXPECT_NE(o3->rounding_seed(), o2->rounding_seed());
      o3->load_state_dict(sd);
      EXPECT_EQ(o3->rounding_seed(), o2->rounding_seed());
      run(*o3, again, kSteps / 2, kSteps);
      EXPECT_TRUE(agt::same_bits(again.detach(), straight.detach()));
      EXPECT_FALSE(agt::same_bits(again.detach(), half_way)) << "the second half moved the weights";
    }
  }
}

TEST(UpdateRounding, LoadStateDictChecksTheCompensation) {
  Tensor w = ones({6}, kBFloat16).requires_grad_();
  optim::SGD opt({w}, {.lr = 1e-4, .update_rounding = UpdateRounding::Compensated});
  w.set_grad(ones({6}, kBFloat16));
  opt.step();
  auto sd = opt.state_dict();
  ASSERT_TRUE(sd.count("state.0.0.comp"));
  auto bad = sd;
  bad["state.0.0.comp"] = sd.at("state.0.0.comp").to(kFloat32);
  EXPECT_AG_ERROR(opt.load_state_dict(bad), "state 'state.0.0.comp' must be a bfloat16 tensor like its parameter");
  bad["state.0.0.comp"] = zeros({3}, kBFloat16);
  EXPECT_AG_ERROR(opt.load_state_dict(bad), "state 'state.0.0.comp' has shape [3] but the parameter has shape [6]");
  bad = sd;
  bad["state.0.0.kahan"] = sd.at("state.0.0.comp");
  EXPECT_AG_ERROR(opt.load_state_dict(bad), "unexpected key 'state.0.0.kahan'");
  // An older dict without the seed keeps the optimizer's.
  const uint64_t seed = opt.rounding_seed();
  sd.erase("rounding_seed");
  opt.load_state_dict(sd);
  EXPECT_EQ(opt.rounding_seed(), seed);
}

// set_master_weights and update_rounding are one setting.
TEST(UpdateRounding, MasterWeightsIsTheMasterMode) {
  Tensor a = ones({4}, kBFloat16).requires_grad_(), b = ones({4}, kBFloat16).requires_grad_();
  optim::AdamW opt(
      std::vector<optim::AdamW::ParamGroup>{{{a}, {}}, {{b}, {.update_rounding = UpdateRounding::Stochastic}}});
  opt.set_master_weights(true);
  EXPECT_EQ(opt.update_rounding(0), UpdateRounding::Master);
  EXPECT_EQ(opt.update_rounding(1), UpdateRounding::Master);
  opt.set_master_weights(false);
  EXPECT_EQ(opt.update_rounding(1), UpdateRounding::Nearest);
  opt.set_update_rounding(1, UpdateRounding::Compensated);
  opt.set_master_weights(false);  // not master: unchanged
  EXPECT_EQ(opt.update_rounding(1), UpdateRounding::Compensated);
  opt.set_update_rounding(UpdateRounding::Stochastic);
  EXPECT_EQ(opt.update_rounding(0), UpdateRounding::Stochastic);
  EXPECT_AG_ERROR(opt.set_update_rounding(2, UpdateRounding::Nearest), "group 2 does not exist (2 groups)");
}
