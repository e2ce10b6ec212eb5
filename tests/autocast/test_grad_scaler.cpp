// GradScaler tests: the update rule driven through scripted sequences of clean and
// overflowing iterations (one table, expected scale and tracker after each), every misuse
// error, several optimizers per iteration, the state_dict round trip, the fused CPU kernel
// for each dtype, and float16 training of a small MLP whose poisoned step is skipped.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ampgrad/reference/grad_scaler.h"
#include "support/testing.h"

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

enum class Grad { Clean, Inf, NaN };

// One parameter of 4 float32 zeros under SGD(lr = 1); each iteration gives it the gradient
// scale * 0.5 (clean) or one with an inf / NaN element.
struct Rig {
  ag::Tensor p = ag::zeros({4}, ag::kFloat32).requires_grad_();
  ag::optim::SGD opt{{p}, {.lr = 1.0}};

  void set_grad(Grad kind, double scale) {
    std::vector<float> g(4, float(0.5 * scale));
    if (kind == Grad::Inf) g[2] = kInf;
    if (kind == Grad::NaN) g[3] = kNaN;
    p.set_grad(ag::from_vector(g, {4}));
  }
};

struct Event {
  Grad grad;
  double scale_after;
  int64_t tracker_after;
};

struct ScriptCase {
  const char* name;
  ag::GradScalerOptions options;
  std::vector<Event> script;
};

const double kBig = std::ldexp(1.0, 127);  // the largest power of two a float holds

const std::vector<ScriptCase> kScripts = {
    {"grows after growth_interval clean steps",
     {.init_scale = 8, .growth_interval = 3},
     {{Grad::Clean, 8, 1}, {Grad::Clean, 8, 2}, {Grad::Clean, 16, 0}, {Grad::Clean, 16, 1}}},
    {"overflow backs off and restarts the count",
     {.init_scale = 8, .growth_interval = 3},
     {{Grad::Clean, 8, 1}, {Grad::Clean, 8, 2}, {Grad::Inf, 4, 0}, {Grad::Clean, 4, 1},
      {Grad::Clean, 4, 2}, {Grad::Clean, 8, 0}}},
    {"consecutive overflows, inf and NaN",
     {.init_scale = 16, .growth_interval = 2},
     {{Grad::Inf, 8, 0}, {Grad::NaN, 4, 0}, {Grad::Inf, 2, 0}, {Grad::Clean, 2, 1},
      {Grad::Clean, 4, 0}}},
    {"growth_interval 1 grows every clean step",
     {.init_scale = 1, .growth_interval = 1},
     {{Grad::Clean, 2, 0}, {Grad::Clean, 4, 0}, {Grad::Inf, 2, 0}, {Grad::Clean, 4, 0}}},
    {"custom factors",
     {.init_scale = 100, .growth_factor = 3, .backoff_factor = 0.25, .growth_interval = 2},
     {{Grad::Clean, 100, 1}, {Grad::Clean, 300, 0}, {Grad::NaN, 75, 0}}},
    {"growth_factor 1 keeps a static scale",
     {.init_scale = 4, .growth_factor = 1, .backoff_factor = 1, .growth_interval = 1},
     {{Grad::Clean, 4, 0}, {Grad::Inf, 4, 0}, {Grad::Clean, 4, 0}}},
    {"min_scale floors the backoff",
     {.init_scale = 4, .growth_interval = 2, .min_scale = 2},
     {{Grad::Inf, 2, 0}, {Grad::Inf, 2, 0}, {Grad::Clean, 2, 1}, {Grad::Clean, 4, 0}}},
    {"max_scale caps the growth",
     {.init_scale = 4, .growth_interval = 1, .max_scale = 6},
     {{Grad::Clean, 6, 0}, {Grad::Clean, 6, 0}, {Grad::Inf, 3, 0}, {Grad::Clean, 6, 0}}},
    {"growth past float32 is refused and the tracker restarts",
     {.init_scale = kBig, .growth_interval = 2},
     {{Grad::Clean, kBig, 1}, {Grad::Clean, kBig, 0}, {Grad::Clean, kBig, 1},
      {Grad::Inf, kBig / 2, 0}}},
};

TEST(GradScalerScript, TableOfScriptedSequences) {
  for (const ScriptCase& c : kScripts) {
    SCOPED_TRACE(c.name);
    Rig rig;
    ag::GradScaler scaler(c.options);
    int64_t skipped = 0, last_overflow = -1;
    for (size_t i = 0; i < c.script.size(); ++i) {
      const Event& e = c.script[i];
      SCOPED_TRACE("iteration " + std::to_string(i));
      const std::vector<float> before = rig.p.to_vector<float>();
      rig.set_grad(e.grad, scaler.get_scale());
      const bool stepped = bool(scaler.step(rig.opt));
      EXPECT_EQ(stepped, e.grad == Grad::Clean);
      const std::vector<float> after = rig.p.to_vector<float>();
      for (size_t k = 0; k < after.size(); ++k) {
        // A clean step applies the unscaled gradient 0.5; a skipped one changes nothing.
        EXPECT_EQ(after[k], stepped ? before[k] - 0.5f : before[k]) << "element " << k;
      }
      if (!stepped) {
        ++skipped;
        last_overflow = int64_t(i);
      }
      scaler.update();
      EXPECT_EQ(scaler.get_scale(), e.scale_after);
      EXPECT_EQ(scaler.get_growth_tracker(), e.tracker_after);
      EXPECT_EQ(scaler.skipped_steps(), skipped);
      EXPECT_EQ(scaler.last_overflow_step(), last_overflow);
      EXPECT_EQ(scaler.num_updates(), int64_t(i + 1));
    }
  }
}

TEST(GradScalerScript, UnscaleBeforeStepExposesTrueGradients) {
  Rig rig;
  ag::GradScaler scaler({.init_scale = 1024});
  rig.set_grad(Grad::Clean, 1024);
  scaler.unscale_(rig.opt);
  // Clipping or inspecting here sees the unscaled gradient.
  for (float g : rig.p.grad().to_vector<float>()) EXPECT_EQ(g, 0.5f);
  EXPECT_TRUE(scaler.step(rig.opt));  // no second unscale
  for (float w : rig.p.to_vector<float>()) EXPECT_EQ(w, -0.5f);
  scaler.update();
}

TEST(GradScalerScript, ScaledLossGivesScaledGradients) {
  ag::GradScaler scaler({.init_scale = 256});
  ag::Tensor w = ag::from_vector<float>({1, 2, 3}, {3}).requires_grad_();
  ag::Tensor loss = w.mul(w).sum();  // d/dw = 2w
  ag::Tensor scaled = scaler.scale(loss);
  EXPECT_EQ(scaled.dtype(), ag::kFloat32);
  EXPECT_EQ(scaled.item<double>(), 14.0 * 256);
  scaled.backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{512, 1024, 1536}));

  // 16-bit losses are scaled in float32; float64 stays float64.
  ag::Tensor l16 = ag::full({}, 3.0, ag::kFloat16);
  EXPECT_EQ(scaler.scale(l16).dtype(), ag::kFloat32);
  EXPECT_EQ(scaler.scale(l16).item<double>(), 768.0);
  EXPECT_EQ(scaler.scale(ag::full({}, 3.0, ag::kBFloat16)).dtype(), ag::kFloat32);
  EXPECT_EQ(scaler.scale(ag::full({}, 3.0, ag::kFloat64)).dtype(), ag::kFloat64);
}

TEST(GradScalerScript, DisabledIsAPassThrough) {
  Rig rig;
  ag::GradScaler scaler({.init_scale = 1024, .enabled = false});
  EXPECT_FALSE(scaler.is_enabled());
  EXPECT_EQ(scaler.get_scale(), 1.0);
  ag::Tensor loss = ag::full({}, 2.0);
  EXPECT_EQ(scaler.scale(loss).unsafe_impl(), loss.unsafe_impl());
  rig.set_grad(Grad::Clean, 1);
  scaler.unscale_(rig.opt);  // no-op: the gradient stays as it was
  for (float g : rig.p.grad().to_vector<float>()) EXPECT_EQ(g, 0.5f);
  EXPECT_TRUE(scaler.step(rig.opt));
  EXPECT_TRUE(scaler.step(rig.opt));  // no state machine when disabled
  scaler.update();
  for (float w : rig.p.to_vector<float>()) EXPECT_EQ(w, -1.0f);
  EXPECT_TRUE(scaler.state_dict().empty());
  scaler.load_state_dict({});  // ignored when disabled
}

// ---- errors ------------------------------------------------------------------------------

TEST(GradScalerErrors, UnscaleTwiceBeforeUpdate) {
  Rig rig;
  ag::GradScaler scaler;
  rig.set_grad(Grad::Clean, scaler.get_scale());
  scaler.unscale_(rig.opt);
  EXPECT_AG_ERROR(scaler.unscale_(rig.opt),
                  "[GradScaler] unscale_() has already been called on this optimizer since the "
                  "last update()");
  // The failed call changed nothing: the step still goes through with the true gradient.
  EXPECT_TRUE(scaler.step(rig.opt));
  for (float w : rig.p.to_vector<float>()) EXPECT_EQ(w, -0.5f);
  scaler.update();
  scaler.unscale_(rig.opt);  // allowed again after update()
}

TEST(GradScalerErrors, UnscaleAfterStep) {
  Rig rig;
  ag::GradScaler scaler;
  rig.set_grad(Grad::Clean, scaler.get_scale());
  scaler.step(rig.opt);
  EXPECT_AG_ERROR(scaler.unscale_(rig.opt), "[GradScaler] unscale_() is being called after step()");
}

TEST(GradScalerErrors, StepTwice) {
  Rig rig;
  ag::GradScaler scaler;
  rig.set_grad(Grad::Clean, scaler.get_scale());
  scaler.step(rig.opt);
  EXPECT_AG_ERROR(scaler.step(rig.opt),
                  "[GradScaler] step() has already been called on this optimizer since the last "
                  "update()");
  for (float w : rig.p.to_vector<float>()) EXPECT_EQ(w, -0.5f);  // stepped once only
}

TEST(GradScalerErrors, UpdateWithoutInfChecks) {
  ag::GradScaler scaler;
  EXPECT_AG_ERROR(scaler.update(),
                  "[GradScaler] update(): no inf checks were recorded since the last update()");
  // An optimizer whose parameters have no gradients records no check either.
  Rig rig;
  scaler.unscale_(rig.opt);
  EXPECT_AG_ERROR(scaler.update(), "no inf checks were recorded since the last update()");
  // And after a full iteration, the next update() needs new checks.
  Rig rig2;
  rig2.set_grad(Grad::Clean, scaler.get_scale());
  scaler.step(rig2.opt);
  scaler.update();
  EXPECT_AG_ERROR(scaler.update(), "no inf checks were recorded since the last update()");
  EXPECT_EQ(scaler.get_growth_tracker(), 1);
}

TEST(GradScalerErrors, StepWithoutGradients) {
  Rig rig;
  ag::GradScaler scaler;
  EXPECT_AG_ERROR(scaler.step(rig.opt),
                  "[GradScaler] step(): no inf checks were recorded for this optimizer");
}

TEST(GradScalerErrors, Float16Gradients) {
  ag::Tensor p = ag::zeros({4}, ag::kFloat16).requires_grad_();
  ag::optim::SGD opt({p}, {.lr = 1.0});
  p.set_grad(ag::ones({4}, ag::kFloat16));
  ag::GradScaler scaler;
  EXPECT_AG_ERROR(scaler.unscale_(opt),
                  "[GradScaler] unscale_(): attempting to unscale float16 gradients");
  EXPECT_AG_ERROR(scaler.step(opt), "attempting to unscale float16 gradients");
  for (float w : p.to_vector<float>()) EXPECT_EQ(w, 0.0f);

  // Mixed with a float32 parameter listed first: the refusal comes before any unscaling.
  ag::Tensor q = ag::zeros({2}, ag::kFloat32).requires_grad_();
  ag::optim::SGD mixed({q, p}, {.lr = 1.0});
  q.set_grad(ag::full({2}, 4.0, ag::kFloat32));
  EXPECT_AG_ERROR(scaler.step(mixed), "attempting to unscale float16 gradients");
  for (float g : q.grad().to_vector<float>()) EXPECT_EQ(g, 4.0f);
}

TEST(GradScalerErrors, BadOptionsAndArguments) {
  EXPECT_AG_ERROR(ag::GradScaler({.init_scale = 0}), "[GradScaler] init_scale must be a positive normal float32 number");
  // zero in float32: the loss would be multiplied by 0
  EXPECT_AG_ERROR(ag::GradScaler({.init_scale = 1e-300}), "init_scale must be a positive normal float32 number, in [2^-126, 3.4e38], within [min_scale, max_scale] = [0, inf], got 1e-300");
  EXPECT_AG_ERROR(ag::GradScaler({.init_scale = 1e39}), "got 1e+39");
  EXPECT_AG_ERROR(ag::GradScaler({.init_scale = 1, .max_scale = 0.5}),
                  "within [min_scale, max_scale] = [0, 0.5], got 1");
  EXPECT_AG_ERROR(ag::GradScaler({.growth_factor = 0.5}), "growth_factor must be >= 1, got 0.5");
  EXPECT_AG_ERROR(ag::GradScaler({.backoff_factor = 2}), "backoff_factor must be in (0, 1], got 2");
  EXPECT_AG_ERROR(ag::GradScaler({.growth_interval = 0}), "growth_interval must be >= 1, got 0");
  EXPECT_AG_ERROR(ag::GradScaler({.min_scale = 4, .max_scale = 2}),
                  "expected 0 <= min_scale <= max_scale");
  ag::GradScaler scaler;
  EXPECT_AG_ERROR(scaler.scale(ag::ones({2}, ag::kInt64)), "scale(): expected a floating loss, got int64");
  EXPECT_AG_ERROR(scaler.update(-1.0), "update(new_scale): the scale must be a positive normal float32 number");
  EXPECT_AG_ERROR(scaler.update(1e-40), "update(new_scale): the scale must be a positive normal float32 number, in [2^-126, 3.4e38], got 1e-40");
  EXPECT_AG_ERROR(scaler.load_state_dict({}), "load_state_dict(): the state dict is empty");
  auto d = scaler.state_dict();
  d.erase("growth_tracker");
  EXPECT_AG_ERROR(scaler.load_state_dict(d), "load_state_dict(): missing key \"growth_tracker\"");
}

// A loaded state passes the constructor's rules: integral counters, the growth tracker
// within its interval, no unknown keys; a refused dict leaves the scaler as it was.
TEST(GradScalerState, LoadValidatesEveryNumberAndKey) {
  ag::GradScaler src({.init_scale = 16, .growth_interval = 3});
  const auto d = src.state_dict();
  auto f64 = [](double v) { return ag::scalar_tensor(v, ag::TensorOptions(ag::kFloat64)); };
  auto i64 = [](int64_t v) { return ag::scalar_tensor(v, ag::TensorOptions(ag::kInt64)); };
  const struct {
    const char* key;
    ag::Tensor value;
    const char* problem;
  } cases[] = {
      {"growth_tracker", i64(3), "'growth_tracker' must be an integer in [0, 2], got 3"},
      {"growth_tracker", f64(1.5), "'growth_tracker' must be an integer in [0, 2], got 1.5"},
      {"growth_interval", f64(0), "'growth_interval' must be an integer in [1, 9223372036854775807], got 0"},
      {"growth_interval", f64(std::nan("")), "'growth_interval' must be an integer"},
      {"growth_interval", f64(1e30), "'growth_interval' must be an integer"},
      {"num_updates", i64(-1), "'num_updates' must be an integer in [0"},
      {"skipped_steps", f64(0.5), "'skipped_steps' must be an integer"},
      {"last_overflow_step", i64(-7), "'last_overflow_step' must be an integer in [-1"},
      {"scale", ag::zeros({2}, ag::kFloat64), "'scale' must hold one number, got shape [2]"},
      {"scale", f64(INFINITY), "load_state_dict(): \"scale\" must be a positive normal float32 number, in [2^-126, 3.4e38], got inf"},
      {"scale", f64(1e-300), "load_state_dict(): \"scale\" must be a positive normal float32 number, in [2^-126, 3.4e38], got 1e-300"},
      {"scale", f64(0), "\"scale\" must be a positive normal float32 number"},
      {"growth_factor", f64(0.5), "growth_factor must be >= 1"},
      {"scale_", f64(1), "load_state_dict(): unexpected key \"scale_\""},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.key);
    auto bad = d;
    bad[c.key] = c.value;
    ag::GradScaler dst({.init_scale = 2, .growth_interval = 5});
    EXPECT_AG_ERROR(dst.load_state_dict(bad), c.problem);
    EXPECT_EQ(dst.get_scale(), 2);
    EXPECT_EQ(dst.options().growth_interval, 5);
  }
}

// ---- several optimizers ------------------------------------------------------------------

TEST(GradScalerMulti, EachOptimizerSkipsOnItsOwnGradients) {
  Rig a, b;
  ag::GradScaler scaler({.init_scale = 64, .growth_interval = 2});
  a.set_grad(Grad::Clean, 64);
  b.set_grad(Grad::Inf, 64);
  EXPECT_TRUE(scaler.step(a.opt));
  EXPECT_FALSE(scaler.step(b.opt));
  for (float w : a.p.to_vector<float>()) EXPECT_EQ(w, -0.5f);
  for (float w : b.p.to_vector<float>()) EXPECT_EQ(w, 0.0f);
  scaler.update();  // once for the iteration: one backoff, not two
  EXPECT_EQ(scaler.get_scale(), 32);
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_EQ(scaler.last_overflow_step(), 0);

  // Two clean optimizers count as one clean iteration.
  a.set_grad(Grad::Clean, 32);
  b.set_grad(Grad::Clean, 32);
  scaler.unscale_(b.opt);  // mixing unscale_ + step with plain step
  EXPECT_TRUE(scaler.step(a.opt));
  EXPECT_TRUE(scaler.step(b.opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32);
  EXPECT_EQ(scaler.get_growth_tracker(), 1);

  // An overflow seen only through unscale_ (that optimizer not stepped) still backs off.
  a.set_grad(Grad::Clean, 32);
  b.set_grad(Grad::NaN, 32);
  EXPECT_TRUE(scaler.step(a.opt));
  scaler.unscale_(b.opt);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 16);
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_EQ(scaler.last_overflow_step(), 2);
}

// The found_inf reduction (what ddp sets to a maximum over the ranks) sees each
// optimizer's flag before the step and decides it: raising a clean flag skips the step
// and backs the scale off, as another rank's overflow does.
TEST(GradScalerMulti, FoundInfReductionDecidesTheStep) {
  Rig a;
  ag::GradScaler scaler({.init_scale = 64, .growth_interval = 2});
  std::vector<float> seen;
  bool other_rank_overflowed = false;
  scaler.set_found_inf_reduction([&](const ag::Tensor& flag) {
    seen.push_back(flag.item<float>());
    if (other_rank_overflowed) ag::Tensor(flag).fill_(1.0);
  });
  a.set_grad(Grad::Clean, 64);
  EXPECT_TRUE(scaler.step(a.opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 64);
  other_rank_overflowed = true;
  a.set_grad(Grad::Clean, 64);
  scaler.unscale_(a.opt);  // the reduction runs where the flag is raised: once per iteration
  EXPECT_FALSE(scaler.step(a.opt));
  for (float w : a.p.to_vector<float>()) EXPECT_EQ(w, -0.5f);  // the first step only
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_EQ(seen, (std::vector<float>{0.0f, 0.0f}));  // this rank's own flags were clean
}

// ---- state_dict --------------------------------------------------------------------------

TEST(GradScalerStateDict, RoundTrip) {
  Rig rig;
  ag::GradScaler a({.init_scale = 512, .growth_factor = 4, .backoff_factor = 0.25,
                    .growth_interval = 3, .min_scale = 1, .max_scale = 1 << 20});
  for (Grad g : {Grad::Clean, Grad::Inf, Grad::Clean, Grad::Clean}) {
    rig.set_grad(g, a.get_scale());
    a.step(rig.opt);
    a.update();
  }
  const auto d = a.state_dict();
  for (const char* key : {"scale", "growth_factor", "backoff_factor", "growth_interval",
                          "growth_tracker", "min_scale", "max_scale", "skipped_steps",
                          "num_updates", "last_overflow_step"})
    EXPECT_EQ(d.count(key), 1u) << key;
  EXPECT_EQ(d.at("scale").item<double>(), 128);
  EXPECT_EQ(d.at("growth_tracker").item<int64_t>(), 2);

  ag::GradScaler b;  // different options: all come from the dict
  b.load_state_dict(d);
  EXPECT_EQ(b.get_scale(), 128);
  EXPECT_EQ(b.get_growth_tracker(), 2);
  EXPECT_EQ(b.options().growth_factor, 4);
  EXPECT_EQ(b.options().backoff_factor, 0.25);
  EXPECT_EQ(b.options().growth_interval, 3);
  EXPECT_EQ(b.options().min_scale, 1);
  EXPECT_EQ(b.options().max_scale, 1 << 20);
  EXPECT_EQ(b.skipped_steps(), 1);
  EXPECT_EQ(b.num_updates(), 4);
  EXPECT_EQ(b.last_overflow_step(), 1);

  // Both continue identically: the next clean step completes the interval on both.
  Rig ra, rb;
  for (auto [s, r] : {std::pair{&a, &ra}, std::pair{&b, &rb}}) {
    r->set_grad(Grad::Clean, s->get_scale());
    s->step(r->opt);
    s->update();
    EXPECT_EQ(s->get_scale(), 512);
    EXPECT_EQ(s->get_growth_tracker(), 0);
  }

  // PyTorch's five keys alone are enough; the counters keep their values.
  auto five = d;
  for (const char* k : {"min_scale", "max_scale", "skipped_steps", "num_updates", "last_overflow_step"})
    five.erase(k);
  ag::GradScaler c({.init_scale = 2});
  c.load_state_dict(five);
  EXPECT_EQ(c.get_scale(), 128);
  EXPECT_EQ(c.skipped_steps(), 0);
  EXPECT_EQ(c.last_overflow_step(), -1);
}

// ---- the fused kernel --------------------------------------------------------------------

namespace {
// One gradient through the multi-tensor kernel the scaler uses, with a host factor.
void unscale(const ag::Tensor& g, double factor, const ag::Tensor& found) {
  ag::cpu_backend().scale_and_check({g}, ag::full({}, factor, ag::kFloat64), found);
}
}  // namespace

TEST(GradScalerKernel, UnscaleAndCheckEveryDtype) {
  // Large enough to run on several threads (kernels/cpu/parallel.h kGrain = 32768).
  const int64_t n = 100003;
  for (ag::DType dt : {ag::kFloat32, ag::kFloat64, ag::kBFloat16, ag::kFloat16}) {
    SCOPED_TRACE(ag::dtype_name(dt));
    ag::Backend& be = ag::cpu_backend();
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = float((i % 64) - 32);  // exact in every dtype
    const ag::Tensor g = ag::from_vector(v, {n}, dt);
    ag::Tensor found = ag::zeros({1}, ag::kFloat32);
    unscale(g, 1.0 / 8, found);
    EXPECT_EQ(found.item<float>(), 0.0f);
    const std::vector<float> got = g.to_vector<float>();
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], v[i] / 8) << "element " << i;
    // the reference (scale 8, its reciprocal the kernel's factor) agrees exactly here
    std::vector<double> want(v.begin(), v.end());
    EXPECT_FALSE(ampgrad::reference::unscale_and_check(want, 8));
    EXPECT_TRUE(agt::allclose(g, ag::from_vector(want, {n}), 0, 0));

    for (float bad : {kInf, -kInf, kNaN}) {
      for (int64_t at : {int64_t(0), n / 2 + 7, n - 1}) {
        SCOPED_TRACE("bad value " + std::to_string(bad) + " at " + std::to_string(at));
        std::vector<float> w(n, 1.0f);
        w[at] = bad;
        const ag::Tensor h = ag::from_vector(w, {n}, dt);
        ag::Tensor f = ag::zeros({1}, ag::kFloat32);
        unscale(h, 0.5, f);
        EXPECT_EQ(f.item<float>(), 1.0f);
        std::vector<double> want(w.begin(), w.end());
        EXPECT_TRUE(ampgrad::reference::unscale_and_check(want, 2));
        EXPECT_EQ(h.to_vector<float>()[at == 0 ? 1 : 0], 0.5f);  // still unscaled
      }
    }
    // The flag is only ever set: a clean gradient leaves a raised flag raised.
    ag::Tensor raised = ag::ones({1}, ag::kFloat32);
    unscale(ag::ones({8}, dt), 1.0, raised);
    EXPECT_EQ(raised.item<float>(), 1.0f);
  }
}

TEST(GradScalerKernel, LargeFiniteValuesAreNotOverflow) {
  // Checked before scaling: a finite float32 max is clean even with inv_scale > 1.
  ag::Tensor g = ag::full({3}, double(std::numeric_limits<float>::max()), ag::kFloat32);
  ag::Tensor f = ag::zeros({1}, ag::kFloat32);
  unscale(g, 2.0, f);
  EXPECT_EQ(f.item<float>(), 0.0f);
  EXPECT_EQ(g.to_vector<float>()[0], kInf);  // the product overflows; the input did not
  std::vector<double> want(3, double(std::numeric_limits<float>::max()));
  EXPECT_FALSE(ampgrad::reference::unscale_and_check(want, 0.5));  // the reference's rule too
  EXPECT_AG_ERROR(unscale(g, 1.0, ag::zeros({2}, ag::kFloat32)),
                  "[scale_and_check] found_inf must be a float32 tensor of one element");
  EXPECT_AG_ERROR(unscale(ag::ones({2}, ag::kInt32), 1.0, f),
                  "[scale_and_check] expected a floating dtype, got int32");
}

TEST(GradScalerKernel, ScalerHandlesNonContiguousAndBFloat16Grads) {
  ag::Tensor p = ag::zeros({2, 3}, ag::kFloat32).requires_grad_();
  ag::Tensor q = ag::zeros({4}, ag::kBFloat16).requires_grad_();
  ag::optim::SGD opt({p, q}, {.lr = 1.0});
  p.set_grad(ag::full({3, 2}, 8.0, ag::kFloat32).t());  // a transposed view
  q.set_grad(ag::full({4}, 8.0, ag::kBFloat16));
  ag::GradScaler scaler({.init_scale = 16});
  EXPECT_TRUE(scaler.step(opt));
  for (float w : p.to_vector<float>()) EXPECT_EQ(w, -0.5f);
  for (float w : q.to_vector<float>()) EXPECT_EQ(w, -0.5f);
  scaler.update();
}

// ---- float16 training of a small MLP ------------------------------------------------------

TEST(GradScalerTraining, Float16MlpSkipsThePoisonedStep) {
  ag::manual_seed(7);
  // float32 master parameters; the forward computes in float16 by explicit casts, so the
  // gradients come back float32 through the casts' backward.
  ag::Tensor w1 = ag::randn({8, 16}).mul_(0.3).requires_grad_();
  ag::Tensor b1 = ag::zeros({16}).requires_grad_();
  ag::Tensor w2 = ag::randn({16, 1}).mul_(0.3).requires_grad_();
  ag::Tensor b2 = ag::zeros({1}).requires_grad_();
  ag::optim::SGD opt({w1, b1, w2, b2}, {.lr = 0.05});
  ag::GradScaler scaler({.init_scale = 1024, .growth_interval = 5, .max_scale = 4096});

  const ag::Tensor x = ag::randn({32, 8});
  const ag::Tensor y = x.narrow(1, 0, 1).mul(x.narrow(1, 1, 1)).add(x.narrow(1, 2, 1));
  auto forward = [&] {
    ag::Tensor h = x.to(ag::kFloat16).matmul(w1.to(ag::kFloat16)).add(b1.to(ag::kFloat16)).relu();
    ag::Tensor out = h.matmul(w2.to(ag::kFloat16)).add(b2.to(ag::kFloat16));
    return ag::mse_loss(out.to(ag::kFloat32), y);  // the loss in float32, as autocast does
  };

  double first = 0, last = 0;
  for (int it = 0; it < 60; ++it) {
    opt.zero_grad();
    ag::Tensor loss = forward();
    if (it == 0) first = loss.item<double>();
    last = loss.item<double>();
    scaler.scale(loss).backward();
    for (const ag::Tensor& t : {w1, b1, w2, b2}) EXPECT_EQ(t.grad().dtype(), ag::kFloat32);

    if (it == 30) {
      // Poison one gradient: the step must be skipped and no parameter may move.
      w2.grad().narrow(0, 3, 1).fill_(std::numeric_limits<double>::infinity());
      std::vector<std::vector<float>> before;
      for (const ag::Tensor& t : {w1, b1, w2, b2}) before.push_back(t.to_vector<float>());
      const double scale_before = scaler.get_scale();
      EXPECT_FALSE(scaler.step(opt));
      scaler.update();
      size_t k = 0;
      for (const ag::Tensor& t : {w1, b1, w2, b2}) EXPECT_EQ(t.to_vector<float>(), before[k++]);
      EXPECT_EQ(scaler.get_scale(), scale_before / 2);
      EXPECT_EQ(scaler.last_overflow_step(), 30);
      continue;
    }
    EXPECT_TRUE(scaler.step(opt)) << "iteration " << it;
    scaler.update();
  }
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_LT(last, 0.5 * first) << "first loss " << first << ", last " << last;
  EXPECT_EQ(scaler.get_scale(), 4096);  // grew back to the cap after the backoff
}

}  // namespace

// ---- PyTorch's sequence, on the device, through a checkpoint ------------------------------

namespace {
// PyTorch's _amp_update_scale_ (no floor, no cap): the float64 reference for the device kernel.
void torch_update(double& scale, int64_t& tracker, bool found_inf, double growth, double backoff, int64_t interval) {
  ampgrad::reference::update_scale(scale, tracker, found_inf,
                                   {.growth_factor = growth, .backoff_factor = backoff, .growth_interval = interval});
}
}  // namespace

// growth_interval 3 and an inf every 4th step, 16 iterations: the scale and tracker after
// each update follow PyTorch's rule; a scaler restored from a checkpoint saved after the
// 6th iteration continues the sequence bit for bit.
TEST(GradScalerDevice, FollowsPyTorchsSequenceAndResumesFromACheckpoint) {
  const ag::GradScalerOptions o{.init_scale = 1024, .growth_factor = 2, .backoff_factor = 0.5, .growth_interval = 3};
  Rig rig, rig2;
  ag::GradScaler scaler(o), resumed(o);
  double ref_scale = o.init_scale;
  int64_t ref_tracker = 0;
  agt::TempDir dir;
  bool restored = false;
  for (int it = 1; it <= 16; ++it) {
    SCOPED_TRACE("iteration " + std::to_string(it));
    const bool inf = it % 4 == 0;
    rig.set_grad(inf ? Grad::Inf : Grad::Clean, ref_scale);
    const ag::StepResult r = scaler.step(rig.opt);
    EXPECT_TRUE(r.on_device());
    scaler.update();
    torch_update(ref_scale, ref_tracker, inf, 2, 0.5, 3);
    EXPECT_EQ(bool(r), !inf);
    EXPECT_EQ(scaler.get_scale(), ref_scale);
    EXPECT_EQ(scaler.get_growth_tracker(), ref_tracker);
    if (it == 6) {
      ag::nn::StateDict sd;
      for (auto& [k, v] : scaler.state_dict()) sd[k] = v;
      ag::nn::save(dir.file("scaler.safetensors"), sd);
      const ag::nn::StateDict back = ag::nn::load(dir.file("scaler.safetensors"));
      resumed.load_state_dict(std::map<std::string, ag::Tensor>(back.begin(), back.end()));
      restored = true;
      continue;
    }
    if (restored) {
      rig2.set_grad(inf ? Grad::Inf : Grad::Clean, resumed.get_scale());
      resumed.step(rig2.opt);
      resumed.update();
      EXPECT_EQ(resumed.get_scale(), scaler.get_scale());
      EXPECT_EQ(resumed.get_growth_tracker(), scaler.get_growth_tracker());
      EXPECT_EQ(resumed.skipped_steps(), scaler.skipped_steps());
      EXPECT_EQ(resumed.last_overflow_step(), scaler.last_overflow_step());
      EXPECT_EQ(resumed.num_updates(), scaler.num_updates());
    }
  }
  EXPECT_EQ(scaler.skipped_steps(), 4);
  EXPECT_EQ(scaler.last_overflow_step(), 15);  // the 16th update, 0-based
}
