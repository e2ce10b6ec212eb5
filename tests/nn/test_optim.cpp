// Optimizers against the float64 references of PyTorch's documented update rules
// (kernels/reference: torch.optim.SGD / Adam / AdamW pseudo-code), parameter groups,
// float32 state and master weights for 16-bit parameters, state dict round trips and
// argument errors.
#include "ampgrad/reference/optim.h"
#include "support/testing.h"

#include <cmath>

using namespace ag;
using Vec = std::vector<double>;

namespace {

const Vec kP0{1.0, -0.5, 0.25, 2.0, -3.0, 0.0625};
// Gradients of the three steps; mixed signs and magnitudes (tiny ones make eps matter).
const std::vector<Vec> kGrads{
    {0.5, -1.0, 2e-5, 3.0, -0.25, 0.125},
    {-0.75, 0.5, -1e-5, 2.0, 0.5, 0.0},
    {0.25, 1.5, 3e-5, -1.0, 0.125, -4.0},
};

Tensor make_param(DType dt = kFloat32) {
  return from_vector<double>(kP0, {2, 3}, dt).requires_grad_();
}

void set_grad(const Tensor& p, const Vec& g) { p.set_grad(from_vector<double>(g, p.sizes().vec(), p.dtype())); }

// The values the float32 parameter actually starts from.
Vec start_values(const Tensor& p) { return p.to_vector<double>(); }

// The float64 references (ampgrad/reference/optim.h) with their state, stepping a vector.
struct SgdRef {
  double lr, momentum = 0, dampening = 0, wd = 0;
  bool nesterov = false;
  ampgrad::reference::SgdState state;
  void step(Vec& p, const Vec& g) {
    ampgrad::reference::sgd_step(p, g, state, {lr, momentum, dampening, wd, nesterov});
  }
};

struct AdamRef {
  double lr, b1, b2, eps, wd;
  bool decoupled;
  ampgrad::reference::AdamState state;
  void step(Vec& p, const Vec& g) { ampgrad::reference::adam_step(p, g, state, {lr, b1, b2, eps, wd, decoupled}); }
};

::testing::AssertionResult close_to(const Tensor& got, const Vec& ref, double rtol = 1e-6, double atol = 1e-7) {
  return agt::allclose(got, from_vector<double>(ref, got.sizes().vec()), rtol, atol);
}

template <class Opt, class Ref>
void run_and_compare(Opt& opt, const Tensor& p, Ref& ref, const char* what) {
  Vec pr = start_values(p);
  for (size_t t = 0; t < kGrads.size(); ++t) {
    set_grad(p, kGrads[t]);
    opt.step();
    ref.step(pr, kGrads[t]);
    EXPECT_TRUE(close_to(p, pr)) << what << ", step " << t + 1;
  }
  EXPECT_EQ(opt.steps(), int64_t(kGrads.size()));
}

}  // namespace

TEST(OptimSGD, PlainMatchesReference) {
  Tensor p = make_param();
  optim::SGD opt({p}, {.lr = 0.1});
  SgdRef ref{.lr = 0.1};
  run_and_compare(opt, p, ref, "plain");
}

TEST(OptimSGD, MomentumMatchesReference) {
  Tensor p = make_param();
  optim::SGD opt({p}, {.lr = 0.1, .momentum = 0.9});
  SgdRef ref{.lr = 0.1, .momentum = 0.9};
  run_and_compare(opt, p, ref, "momentum");
}

TEST(OptimSGD, DampeningMatchesReference) {
  Tensor p = make_param();
  optim::SGD opt({p}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.3});
  SgdRef ref{.lr = 0.1, .momentum = 0.9, .dampening = 0.3};
  run_and_compare(opt, p, ref, "dampening");
}

TEST(OptimSGD, NesterovMatchesReference) {
  Tensor p = make_param();
  optim::SGD opt({p}, {.lr = 0.05, .momentum = 0.8, .nesterov = true});
  SgdRef ref{.lr = 0.05, .momentum = 0.8, .nesterov = true};
  run_and_compare(opt, p, ref, "nesterov");
}

TEST(OptimSGD, WeightDecayMatchesReference) {
  Tensor p = make_param();
  optim::SGD opt({p}, {.lr = 0.1, .weight_decay = 0.2});
  SgdRef ref{.lr = 0.1, .wd = 0.2};
  run_and_compare(opt, p, ref, "weight decay");
  Tensor q = make_param();
  optim::SGD opt2({q}, {.lr = 0.1, .momentum = 0.7, .dampening = 0.1, .weight_decay = 0.2, .nesterov = false});
  SgdRef ref2{.lr = 0.1, .momentum = 0.7, .dampening = 0.1, .wd = 0.2};
  run_and_compare(opt2, q, ref2, "weight decay + momentum + dampening");
  Tensor r = make_param();
  optim::SGD opt3({r}, {.lr = 0.1, .momentum = 0.7, .weight_decay = 0.2, .nesterov = true});
  SgdRef ref3{.lr = 0.1, .momentum = 0.7, .wd = 0.2, .nesterov = true};
  run_and_compare(opt3, r, ref3, "weight decay + nesterov");
}

TEST(OptimAdam, MatchesReference) {
  Tensor p = make_param();
  optim::Adam opt({p}, {.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-4});
  AdamRef ref{0.01, 0.8, 0.95, 1e-4, 0, false};
  run_and_compare(opt, p, ref, "adam");
  Tensor q = make_param();
  optim::Adam def({q});  // defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8
  AdamRef dref{1e-3, 0.9, 0.999, 1e-8, 0, false};
  run_and_compare(def, q, dref, "adam defaults");
}

TEST(OptimAdam, L2WeightDecayMatchesReference) {
  Tensor p = make_param();
  optim::Adam opt({p}, {.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-4, .weight_decay = 0.1});
  AdamRef ref{0.01, 0.8, 0.95, 1e-4, 0.1, false};
  run_and_compare(opt, p, ref, "adam L2");
}

TEST(OptimAdamW, DecoupledWeightDecayMatchesReference) {
  Tensor p = make_param();
  optim::AdamW opt({p}, {.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-4, .weight_decay = 0.1});
  AdamRef ref{0.01, 0.8, 0.95, 1e-4, 0.1, true};
  run_and_compare(opt, p, ref, "adamw");
  // large decay makes the difference from Adam's L2 form obvious
  Tensor q = make_param(), r = make_param();
  optim::AdamW w({q}, {.lr = 0.1, .weight_decay = 2.0});
  optim::Adam l2({r}, {.lr = 0.1, .weight_decay = 2.0});
  AdamRef wref{0.1, 0.9, 0.999, 1e-8, 2.0, true};
  run_and_compare(w, q, wref, "adamw, decay 2");
  for (auto& g : kGrads) {
    set_grad(r, g);
    l2.step();
  }
  EXPECT_FALSE(agt::allclose(q, r, 1e-3, 1e-3));
  // default decay 1e-2
  Tensor s = make_param();
  optim::AdamW d({s});
  AdamRef dref{1e-3, 0.9, 0.999, 1e-8, 1e-2, true};
  run_and_compare(d, s, dref, "adamw defaults");
}

TEST(OptimSGD, Float64ParameterMatchesReference) {
  Tensor p = make_param(kFloat64);
  optim::SGD opt({p}, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
  SgdRef ref{.lr = 0.1, .momentum = 0.9, .wd = 0.01};
  run_and_compare(opt, p, ref, "float64");
}

TEST(OptimGroups, EachGroupHasItsOwnOptions) {
  Tensor a = make_param(), b = make_param();
  optim::SGD opt(std::vector<optim::SGD::ParamGroup>{{{a}, {.lr = 0.1}}, {{b}, {.lr = 0.01, .momentum = 0.9}}});
  EXPECT_EQ(opt.num_groups(), 2u);
  EXPECT_DOUBLE_EQ(opt.lr(0), 0.1);
  EXPECT_DOUBLE_EQ(opt.lr(1), 0.01);
  EXPECT_EQ(opt.parameters().size(), 2u);
  SgdRef ra{.lr = 0.1}, rb{.lr = 0.01, .momentum = 0.9};
  Vec pa = start_values(a), pb = start_values(b);
  for (size_t t = 0; t < kGrads.size(); ++t) {
    set_grad(a, kGrads[t]);
    set_grad(b, kGrads[t]);
    opt.step();
    ra.step(pa, kGrads[t]);
    rb.step(pb, kGrads[t]);
    EXPECT_TRUE(close_to(a, pa)) << t;
    EXPECT_TRUE(close_to(b, pb)) << t;
  }
  // set_lr on one group, then on all
  opt.set_lr(1, 0.5);
  EXPECT_DOUBLE_EQ(opt.lr(0), 0.1);
  EXPECT_DOUBLE_EQ(opt.lr(1), 0.5);
  opt.set_lr(0.25);
  EXPECT_DOUBLE_EQ(opt.lr(0), 0.25);
  EXPECT_DOUBLE_EQ(opt.lr(1), 0.25);
  EXPECT_AG_ERROR(opt.lr(2), "group 2 does not exist (2 groups)");

  Tensor c = make_param(), d = make_param();
  optim::AdamW aw(std::vector<optim::AdamW::ParamGroup>{{{c}, {.lr = 0.01, .weight_decay = 0}},
                                                        {{d}, {.lr = 0.001, .beta1 = 0.5}}});
  AdamRef rc{0.01, 0.9, 0.999, 1e-8, 0, true}, rd{0.001, 0.5, 0.999, 1e-8, 1e-2, true};
  Vec pc = start_values(c), pd = start_values(d);
  for (size_t t = 0; t < kGrads.size(); ++t) {
    set_grad(c, kGrads[t]);
    set_grad(d, kGrads[t]);
    aw.step();
    rc.step(pc, kGrads[t]);
    rd.step(pd, kGrads[t]);
  }
  EXPECT_TRUE(close_to(c, pc));
  EXPECT_TRUE(close_to(d, pd));
}

TEST(OptimGroups, ParametersWithoutGradientAreSkipped) {
  Tensor a = make_param(), b = make_param();
  optim::Adam opt({a, b}, {.lr = 0.1});
  set_grad(a, kGrads[0]);
  opt.step();
  EXPECT_EQ(b.to_vector<double>(), start_values(make_param()));
  EXPECT_FALSE(agt::allclose(a, make_param(), 1e-3, 1e-3));
  auto sd = opt.state_dict();
  EXPECT_TRUE(sd.count("state.0.0.buf1"));
  EXPECT_FALSE(sd.count("state.0.1.buf1"));
  // b's first update later gets step 1 bias correction: equal to a fresh Adam's first step
  set_grad(b, kGrads[1]);
  a.set_grad(Tensor());
  opt.step();
  Tensor c = make_param();
  optim::Adam fresh({c}, {.lr = 0.1});
  set_grad(c, kGrads[1]);
  fresh.step();
  EXPECT_TRUE(agt::allclose(b, c, 0, 0));
  // zero_grad drops them
  opt.zero_grad();
  EXPECT_FALSE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
}

TEST(OptimState, Float32StateForBFloat16Parameters) {
  Tensor p = make_param(kBFloat16);
  optim::Adam adam({p}, {.lr = 0.01});
  set_grad(p, kGrads[0]);
  adam.step();
  EXPECT_EQ(p.dtype(), kBFloat16);
  auto sd = adam.state_dict();
  ASSERT_TRUE(sd.count("state.0.0.buf1") && sd.count("state.0.0.buf2"));
  EXPECT_EQ(sd.at("state.0.0.buf1").dtype(), kFloat32);
  EXPECT_EQ(sd.at("state.0.0.buf2").dtype(), kFloat32);
  EXPECT_EQ(sd.at("state.0.0.buf1").sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_FALSE(sd.count("state.0.0.master"));
  // the first moment after one step is (1 - beta1) g, kept at float32 precision
  Vec m1(6);
  Vec g_bf16 = from_vector<double>(kGrads[0], {6}, kBFloat16).to_vector<double>();
  for (size_t i = 0; i < m1.size(); ++i) m1[i] = 0.1 * g_bf16[i];
  EXPECT_TRUE(close_to(sd.at("state.0.0.buf1"), m1, 1e-6, 1e-12));

  Tensor q = make_param(kFloat16);
  optim::SGD sgd({q}, {.lr = 0.01, .momentum = 0.9, .update_rounding = optim::UpdateRounding::Master});
  set_grad(q, kGrads[0]);
  sgd.step();
  auto ssd = sgd.state_dict();
  ASSERT_TRUE(ssd.count("state.0.0.buf1"));
  EXPECT_EQ(ssd.at("state.0.0.buf1").dtype(), kFloat32);
  ASSERT_TRUE(ssd.count("state.0.0.master"));
  EXPECT_EQ(ssd.at("state.0.0.master").dtype(), kFloat32);
  EXPECT_EQ(q.dtype(), kFloat16);
  // master weights are not kept for float32 parameters
  Tensor r = make_param();
  optim::SGD f32({r}, {.lr = 0.01, .update_rounding = optim::UpdateRounding::Master});
  set_grad(r, kGrads[0]);
  f32.step();
  EXPECT_FALSE(f32.state_dict().count("state.0.0.master"));
}

// The steps flush denormals to zero: a second moment of (1 - beta2) g^2 = 1e-43 (a
// denormal) is stored as 0, and a first moment decaying under zero gradients reaches 0
// instead of lingering in the denormal range, where each operation costs a microcode
// assist. Normal values are untouched.
TEST(OptimState, MomentsFlushDenormalsToZero) {
  for (bool decoupled : {false, true}) {
    SCOPED_TRACE(decoupled ? "AdamW" : "Adam");
    Tensor p = from_vector<double>({1.0, 1.0}, {2}, kFloat32).requires_grad_();
    std::unique_ptr<optim::Optimizer> opt;
    if (decoupled) opt = std::make_unique<optim::AdamW>(std::vector<Tensor>{p}, optim::AdamWOptions{.lr = 0.01});
    else opt = std::make_unique<optim::Adam>(std::vector<Tensor>{p}, optim::AdamOptions{.lr = 0.01});
    p.set_grad(from_vector<double>({1e-20, 1.0}, {2}, kFloat32));
    opt->step();
    auto sd = opt->state_dict();
    const Vec m2 = sd.at("state.0.0.buf2").to_vector<double>();
    EXPECT_EQ(m2[0], 0.0);           // 1e-3 * 1e-40: denormal, flushed
    EXPECT_NEAR(m2[1], 1e-3, 1e-9);  // normal: kept
    EXPECT_NEAR(sd.at("state.0.0.buf1").to_vector<double>()[0], 1e-21, 1e-27);  // (1 - beta1) g: normal
    // zero gradients from here: m1 = 1e-21 * 0.9^n crosses FLT_MIN after about 400 steps
    p.set_grad(zeros({2}));
    for (int i = 0; i < 420; ++i) opt->step();
    const float m1 = float(opt->state_dict().at("state.0.0.buf1").to_vector<double>()[0]);
    EXPECT_TRUE(m1 == 0.0f || std::fpclassify(m1) == FP_NORMAL) << m1;
  }
}

TEST(OptimState, MasterWeightsAccumulateTinyUpdates) {
  const int steps = 100;
  for (bool sgd : {false, true}) {
    Tensor with = ones({4}, kBFloat16).requires_grad_();
    Tensor without = ones({4}, kBFloat16).requires_grad_();
    std::unique_ptr<optim::Optimizer> a, b;
    if (sgd) {
      a = std::make_unique<optim::SGD>(std::vector<Tensor>{with},
                                       optim::SGDOptions{.lr = 1e-4, .update_rounding = optim::UpdateRounding::Master});
      b = std::make_unique<optim::SGD>(std::vector<Tensor>{without}, optim::SGDOptions{.lr = 1e-4});
    } else {
      a = std::make_unique<optim::Adam>(
          std::vector<Tensor>{with}, optim::AdamOptions{.lr = 1e-4, .update_rounding = optim::UpdateRounding::Master});
      b = std::make_unique<optim::Adam>(std::vector<Tensor>{without}, optim::AdamOptions{.lr = 1e-4});
    }
    for (int i = 0; i < steps; ++i) {
      with.set_grad(ones({4}, kBFloat16));
      without.set_grad(ones({4}, kBFloat16));
      a->step();
      b->step();
    }
    const char* name = sgd ? "SGD" : "Adam";
    // 1 - 1e-4 rounds back to 1 in bfloat16 (spacing 2^-8 below 1): no progress at all
    EXPECT_EQ(without.to_vector<double>(), Vec(4, 1.0)) << name;
    // the float32 copy holds 1 - 100 * 1e-4 and the parameter its rounding
    auto sd = a->state_dict();
    ASSERT_TRUE(sd.count("state.0.0.master")) << name;
    EXPECT_TRUE(close_to(sd.at("state.0.0.master"), Vec(4, 1 - steps * 1e-4), 1e-5, 1e-6)) << name;
    EXPECT_TRUE(close_to(with, Vec(4, 0.98828125), 0, 0)) << name;  // nearest bfloat16 to 0.99
  }
}

TEST(OptimState, StateDictRoundTripContinuesIdentically) {
  auto check = [](DType dt, bool master, double lr) {
    Tensor pa = make_param(dt), pb = make_param(dt);
    optim::AdamW a({pa}, {.lr = lr,
                          .weight_decay = 0.05,
                          .update_rounding = master ? optim::UpdateRounding::Master : optim::UpdateRounding::Nearest});
    std::vector<Vec> grads;
    for (int t = 0; t < 6; ++t) grads.push_back(kGrads[size_t(t) % 3]);
    for (int t = 0; t < 6; ++t) {
      set_grad(pa, grads[size_t(t)]);
      a.step();
    }
    optim::StateDict saved;
    {
      optim::AdamW b1({pb},
                      {.lr = lr,
                       .weight_decay = 0.05,
                       .update_rounding = master ? optim::UpdateRounding::Master : optim::UpdateRounding::Nearest});
      for (int t = 0; t < 3; ++t) {
        set_grad(pb, grads[size_t(t)]);
        b1.step();
      }
      saved = b1.state_dict();
    }
    // the learning rate comes from the state dict; the other options from the constructor
    optim::AdamW b2({pb}, {.lr = 0.5,
                           .weight_decay = 0.05,
                           .update_rounding = master ? optim::UpdateRounding::Master : optim::UpdateRounding::Nearest});
    b2.load_state_dict(saved);
    EXPECT_EQ(b2.steps(), 3);
    EXPECT_DOUBLE_EQ(b2.lr(), lr);
    for (int t = 3; t < 6; ++t) {
      set_grad(pb, grads[size_t(t)]);
      b2.step();
    }
    EXPECT_EQ(b2.steps(), 6);
    EXPECT_EQ(pb.to_vector<double>(), pa.to_vector<double>()) << dtype_name(dt) << " master " << master;
    // and the whole state (moments, master copy, step counts) agrees
    auto sa = a.state_dict(), sb = b2.state_dict();
    ASSERT_EQ(sa.size(), sb.size());
    EXPECT_EQ(sa.count("state.0.0.master"), master ? 1u : 0u);
    for (auto& [k, v] : sa) {
      ASSERT_TRUE(sb.count(k)) << k;
      if (k == "rounding_seed") continue;  // each optimizer draws its own when it is made (b2 has b1's)
      EXPECT_EQ(sb.at(k).to_vector<double>(), v.to_vector<double>()) << k;
    }
  };
  check(kFloat32, false, 0.01);
  check(kBFloat16, true, 1e-4);

  // SGD with momentum, and a schedule's lr carried through
  Tensor pa = make_param(), pb = make_param();
  optim::SGD a({pa}, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
  optim::SGD b({pb}, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
  for (int t = 0; t < 2; ++t) {
    set_grad(pa, kGrads[size_t(t)]);
    set_grad(pb, kGrads[size_t(t)]);
    a.step();
    b.step();
  }
  a.set_lr(0.03);
  auto sd = a.state_dict();
  EXPECT_EQ(sd.at("steps").item<int64_t>(), 2);
  EXPECT_DOUBLE_EQ(sd.at("param_groups.0.lr").item<double>(), 0.03);
  optim::SGD b2({pb}, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
  b2.load_state_dict(sd);
  set_grad(pa, kGrads[2]);
  set_grad(pb, kGrads[2]);
  a.step();
  b2.step();
  EXPECT_EQ(pb.to_vector<double>(), pa.to_vector<double>());
}

// The numbers of a state dict pass the constructor's rules, and every key is known;
// a refused dict changes nothing.
TEST(OptimState, LoadStateDictValidatesNumbersAndKeys) {
  Tensor a = make_param();
  optim::Adam src({a}, {.lr = 0.01});
  set_grad(a, kGrads[0]);
  src.step();
  const auto sd = src.state_dict();
  auto f64 = [](double v) { return scalar_tensor(v, TensorOptions(kFloat64)); };
  const struct {
    const char* key;
    Tensor value;
    const char* problem;
  } cases[] = {
      {"param_groups.0.lr", f64(-1), "'param_groups.0.lr' must be a finite non-negative learning rate, got -1"},
      {"param_groups.0.lr", f64(std::nan("")), "'param_groups.0.lr' must be a finite non-negative learning rate, got nan"},
      {"steps", f64(1.5), "'steps' must be an integer in [0, 9223372036854775807], got 1.5"},
      {"steps", scalar_tensor(int64_t(-1), TensorOptions(kInt64)), "'steps' must be an integer in [0, 9223372036854775807], got -1"},
      {"state.0.0.step", f64(1e300), "'state.0.0.step' must be an integer"},
      {"param_groups.0.size", f64(1.25), "'param_groups.0.size' must be an integer"},
      {"state.0.0.momentum", zeros({3}), "unexpected key 'state.0.0.momentum'"},
      {"state.1.0.buf1", zeros({3}), "unexpected key 'state.1.0.buf1'"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.key);
    auto bad = sd;
    bad[c.key] = c.value;
    optim::Adam dst({make_param()}, {.lr = 0.5});
    EXPECT_AG_ERROR(dst.load_state_dict(bad), std::string("[Optimizer::load_state_dict] ") + c.problem);
    EXPECT_EQ(dst.lr(), 0.5);
    EXPECT_EQ(dst.steps(), 0);
  }
  // an integral float is an integer
  auto ok = sd;
  ok["steps"] = f64(1);
  optim::Adam dst({make_param()});
  dst.load_state_dict(ok);
  EXPECT_EQ(dst.steps(), 1);
}

TEST(OptimState, LoadStateDictLayoutErrors) {
  Tensor a = make_param(), b = make_param();
  optim::Adam two({a, b});
  set_grad(a, kGrads[0]);
  set_grad(b, kGrads[0]);
  two.step();
  Tensor c = make_param();
  optim::Adam one({c});
  EXPECT_AG_ERROR(one.load_state_dict(two.state_dict()), "group 0 has 1 parameters but the state dict has 2");
  Tensor d = zeros({3}).requires_grad_(), e = zeros({3}).requires_grad_();
  optim::Adam shapes({d, e});
  EXPECT_AG_ERROR(shapes.load_state_dict(two.state_dict()), "but the parameter has shape [3]");
  optim::Adam groups(std::vector<optim::Adam::ParamGroup>{{{a}, {}}, {{b}, {}}});
  EXPECT_AG_ERROR(groups.load_state_dict(one.state_dict()), "missing key 'param_groups.1.size'");
  auto sd = two.state_dict();
  sd.erase("steps");
  optim::Adam ok({make_param(), make_param()});
  EXPECT_AG_ERROR(ok.load_state_dict(sd), "missing key 'steps'");
  EXPECT_AG_ERROR(one.load_state_dict(groups.state_dict()), "more than 1 groups");
}

TEST(OptimErrors, BadArgumentsNamed) {
  Tensor p = make_param();
  EXPECT_AG_ERROR(optim::SGD({p}, {.lr = -0.1}), "[SGD] learning rate must be finite and non-negative, got -0.1");
  EXPECT_AG_ERROR(optim::Adam({p}, {.lr = -1}), "[Adam] learning rate must be finite and non-negative");
  EXPECT_AG_ERROR(optim::AdamW({p}, {.lr = NAN}), "[AdamW] learning rate must be finite");
  EXPECT_AG_ERROR(optim::Adam({p}, {.beta1 = 1.0}), "[Adam] betas must be in [0, 1), got 1 and 0.999");
  EXPECT_AG_ERROR(optim::Adam({p}, {.beta2 = -0.5}), "betas must be in [0, 1)");
  EXPECT_AG_ERROR(optim::AdamW({p}, {.beta2 = 1.5}), "[AdamW] betas must be in [0, 1)");
  EXPECT_AG_ERROR(optim::SGD({p}, {.nesterov = true}), "nesterov momentum requires a momentum and zero dampening");
  EXPECT_AG_ERROR(optim::SGD({p}, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}),
                  "nesterov momentum requires");
  EXPECT_AG_ERROR(optim::SGD({p}, {.momentum = -0.9}), "momentum and weight_decay must be non-negative");
  EXPECT_AG_ERROR(optim::Adam({p}, {.weight_decay = -1}), "weight_decay must be non-negative");
  Tensor nonleaf = p * 2.0;
  EXPECT_AG_ERROR(optim::SGD({nonleaf}), "[SGD] parameter 0 of group 0 is not a leaf tensor (shape [2, 3])");
  EXPECT_AG_ERROR(optim::AdamW({p, nonleaf}), "[AdamW] parameter 1 of group 0 is not a leaf tensor");
  EXPECT_AG_ERROR(optim::Adam({zeros({2}, kInt64)}), "parameters must be floating, got int64");
  EXPECT_AG_ERROR(optim::SGD({Tensor()}), "parameter 0 of group 0 is undefined");
}

// A parameter given twice would be stepped twice per step (an SGD step with lr 1 would
// move it by 2 gradients); an optimizer without parameters steps nothing, silently.
TEST(OptimErrors, DuplicateAndMissingParameters) {
  Tensor p = make_param(), q = make_param();
  EXPECT_AG_ERROR(optim::SGD({p, q, p}, {.lr = 1}),
                  "[SGD] parameter 2 of group 0 (shape [2, 3]) is parameter 0 of group 0: each parameter may appear once");
  EXPECT_AG_ERROR(optim::AdamW(std::vector<optim::AdamW::ParamGroup>{{{p}, {}}, {{q, p}, {}}}),
                  "[AdamW] parameter 1 of group 1 (shape [2, 3]) is parameter 0 of group 0");
  // another handle on the same memory, and a view that shares part of it
  Tensor flat = zeros({12}).requires_grad_();
  Tensor a, b, c;
  {
    NoGradGuard ng;
    a = flat.narrow(0, 0, 6).detach().requires_grad_();
    b = flat.narrow(0, 4, 6).detach().requires_grad_();
    c = flat.narrow(0, 6, 6).detach().requires_grad_();
  }
  EXPECT_AG_ERROR(optim::Adam({a, b}), "[Adam] parameter 1 of group 0 (shape [6]) is parameter 0 of group 0 or shares memory with it");
  EXPECT_AG_ERROR(optim::SGD({p, p.detach().requires_grad_()}), "or shares memory with it");
  optim::SGD disjoint({a, c}, {.lr = 1});  // two halves of one buffer are two parameters
  EXPECT_EQ(disjoint.parameters().size(), 2u);

  EXPECT_AG_ERROR(optim::SGD(std::vector<Tensor>{}), "[SGD] got an empty parameter list (1 groups, no parameter)");
  EXPECT_AG_ERROR(optim::AdamW(std::vector<Tensor>{}), "[AdamW] got an empty parameter list");
  EXPECT_AG_ERROR(optim::Adam(std::vector<optim::Adam::ParamGroup>{}), "[Adam] got an empty parameter list (0 groups");

  // a step with lr 1 moves a parameter listed once by exactly one gradient
  optim::SGD once({p}, {.lr = 1});
  const std::vector<double> before = p.to_vector<double>();
  p.set_grad(ones({2, 3}));
  once.step();
  const std::vector<double> after = p.to_vector<double>();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_DOUBLE_EQ(after[i], before[i] - 1.0);
}
