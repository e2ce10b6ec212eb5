// The Lite wrappers: the dtype grid (precision x input dtype x output conversion, nested
// outputs), 16-mixed end to end on the CPU, schedulers, clipping, several optimizers, the
// backward guard and checkpoints.
#include "support/testing.h"

#include <cmath>
#include <functional>

using namespace ag;
namespace prof = ag::hw::profiles;

namespace {

// All tests decide from a fake Sapphire Rapids (AMX, AVX512-FP16): every precision native,
// so no warnings; the arithmetic still runs on this machine's CPU.
const hw::HardwareProfile& amx() {
  static const hw::HardwareProfile p = prof::cpu_amx();
  return p;
}

LiteOptions opts(const char* precision, OutputConversion oc = OutputConversion::ToDefault) {
  return {.accelerator = "cpu", .precision = precision, .output_conversion = oc, .profile = &amx()};
}

// Records the dtype its forward receives; returns a nest of outputs: a matmul (lower
// precision under autocast), the converted input, an int64 argmax, and a map.
struct Probe : nn::Module {
  Tensor w;
  DType seen = kUInt8;
  Probe() : Module("Probe") { w = register_parameter("w", randn({3, 4})); }
  Tensor forward(const Tensor& x) override { return std::get<0>(forward(x, 0)); }
  std::tuple<Tensor, std::vector<Tensor>, std::map<std::string, Tensor>> forward(const Tensor& x, int tag) {
    seen = x.dtype();
    const Tensor f = x.is_floating_point() ? x : x.to(w.dtype());
    const Tensor y = matmul(f, w);
    return {y, {f, argmax(y, 1)}, {{"y2", y * 2.0f}, {"tag", full({1}, tag, TensorOptions().dtype(kInt64))}}};
  }
};

Tensor input_of(DType dt) {
  if (dt == kBool) return gt(randn({2, 3}), 0.0f);
  if (dt == kInt64) return randint(0, 3, {2, 3});
  return randn({2, 3}).to(dt);
}

}  // namespace

// The grid Lightning tests its precision plugins with: what the inner module receives and
// what comes out, for every precision, input dtype and output conversion.
TEST(LiteGrid, PrecisionTimesInputDtypeTimesOutputConversion) {
  const char* precisions[] = {"32-true", "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"};
  const DType inputs[] = {kFloat32, kFloat64, kFloat16, kBFloat16, kInt64, kBool};
  const OutputConversion modes[] = {OutputConversion::ToDefault, OutputConversion::ToInputDType, OutputConversion::None};
  int cases = 0;
  for (const char* ps : precisions)
    for (DType in : inputs)
      for (OutputConversion oc : modes) {
        SCOPED_TRACE(std::string(ps) + " / " + dtype_name(in) + " / " + output_conversion_name(oc));
        manual_seed(0);
        Lite lite(opts(ps, oc));
        const Precision p = lite.precision();
        auto model = lite.setup_module(std::make_shared<Probe>());
        auto [y, list, map] = model(input_of(in), 7);
        // What the inner module received: floating inputs in the parameter dtype.
        EXPECT_EQ(model->seen, is_floating(in) ? parameter_dtype(p) : in);
        // What it returned, before conversion.
        const DType raw_y = compute_dtype(p), raw_f = parameter_dtype(p);
        DType want;  // floating outputs after conversion
        if (oc == OutputConversion::ToDefault) want = kFloat32;
        else if (oc == OutputConversion::ToInputDType) want = is_floating(in) ? in : kFloat32;
        else want = raw_y;
        EXPECT_EQ(y.dtype(), want);
        EXPECT_EQ(map.at("y2").dtype(), want);
        EXPECT_EQ(list[0].dtype(), oc == OutputConversion::None ? raw_f : want);
        EXPECT_EQ(list[1].dtype(), kInt64);       // integers untouched
        EXPECT_EQ(map.at("tag").dtype(), kInt64);
        EXPECT_EQ(map.at("tag").item<int64_t>(), 7);  // non-tensor arguments pass through
        ++cases;
      }
  EXPECT_EQ(cases, 6 * 6 * 3);
}

TEST(LiteGrid, ToInputDTypeWithSeveralInputDtypesNamesThem) {
  struct Two : nn::Module {
    Two() : Module("Two") {}
    Tensor forward(const Tensor& x) override { return x; }
    Tensor forward(const std::map<std::string, Tensor>& in) { return in.at("a") + in.at("b").to(kFloat32); }
  };
  Lite lite(opts("32-true", OutputConversion::ToInputDType));
  auto model = lite.setup_module(std::make_shared<Two>());
  const std::map<std::string, Tensor> mixed{{"a", randn({2})}, {"b", randn({2}).to(kFloat64)}};
  EXPECT_AG_ERROR(model(mixed), "needs one floating dtype among the inputs, got float32, float64");
  // Integer tensors do not count: one floating dtype (float64) among them.
  const std::map<std::string, Tensor> one{{"a", randn({2}).to(kFloat64)}, {"b", arange(2)}};
  EXPECT_EQ(model(one).dtype(), kFloat64);
}

TEST(LiteGrid, NestedWalkerKeepsShapesAndKeys) {
  using Nest = std::tuple<Tensor, std::vector<std::pair<std::string, Tensor>>, std::optional<Tensor>, int,
                          std::map<int, std::vector<Tensor>>>;
  const Nest n{randn({1}), {{"a", randn({2})}, {"b", arange(3)}}, std::nullopt, 5, {{1, {randn({3}), randn({4})}}}};
  int count = 0;
  for_each_tensor(n, [&](const Tensor&) { ++count; });
  EXPECT_EQ(count, 5);
  const Nest h = apply_to_tensors(n, [](const Tensor& t) { return t.is_floating_point() ? t.to(kFloat16) : t; });
  EXPECT_EQ(std::get<0>(h).dtype(), kFloat16);
  EXPECT_EQ(std::get<1>(h)[0].first, "a");
  EXPECT_EQ(std::get<1>(h)[1].second.dtype(), kInt64);
  EXPECT_FALSE(std::get<2>(h).has_value());
  EXPECT_EQ(std::get<3>(h), 5);
  EXPECT_EQ(std::get<4>(h).at(1)[1].sizes().vec(), std::vector<int64_t>{4});
  EXPECT_EQ(std::get<4>(h).at(1)[1].dtype(), kFloat16);
}

// ---- 16-mixed end to end -------------------------------------------------------------------

namespace {

std::shared_ptr<nn::Sequential> small_mlp() {
  return std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(6, 8), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(8, 3)});
}

std::vector<Tensor> snapshot(const nn::Module& m) {
  std::vector<Tensor> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

bool same(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!agt::allclose(a[i], b[i], 0, 0)) return false;
  return true;
}

}  // namespace

TEST(LiteMixed16, LossScalingIsVisibleBeforeUnscaleAndClippingUnscalesFirst) {
  manual_seed(1);
  auto net = small_mlp();
  auto ref = small_mlp();
  ref->load_state_dict(net->state_dict());
  const Tensor x = randn({5, 6}), y = randint(0, 3, {5});
  // Reference gradients: the same float16 autocast forward, unscaled.
  {
    Tensor loss;
    {
      AutocastGuard g(kCPU, kFloat16);
      loss = cross_entropy(ref->forward(x), y);
    }
    loss.backward();
  }
  optim::SGD sgd(net->parameters(), {.lr = 0.1});
  Lite lite({.accelerator = "cpu", .precision = "16-mixed", .scaler = {.init_scale = 1024.0}, .profile = &amx()});
  auto [model, opt] = lite.setup(net, sgd);
  lite.backward(cross_entropy(model(x), y));
  EXPECT_EQ(lite.loss_scale(), 1024.0);
  const auto params = net->parameters(), refs = ref->parameters();
  for (size_t i = 0; i < params.size(); ++i)  // scaled by 1024 before unscale
    EXPECT_TRUE(agt::allclose(params[i].grad() / 1024.0f, refs[i].grad(), 1e-3, 1e-5)) << i;
  // clip_gradients unscales first: the norm it reports is the true one.
  double ref_sq = 0;
  for (const Tensor& r : refs) ref_sq += sum(r.grad() * r.grad()).item<double>();
  const double norm = lite.clip_gradients(model, opt, 1e9).item<double>();
  EXPECT_NEAR(norm, std::sqrt(ref_sq), 1e-3 * std::sqrt(ref_sq));
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(agt::allclose(params[i].grad(), refs[i].grad(), 1e-3, 1e-5));
  // ... and step() does not unscale a second time: p - lr * g.
  const auto before = snapshot(*net);
  EXPECT_TRUE(opt.step());
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(agt::allclose(params[i].detach(), before[i] - refs[i].grad() * 0.1f, 1e-3, 1e-5)) << i;
  EXPECT_EQ(lite.loss_scale(), 1024.0);  // one clean iteration: no growth yet
}

TEST(LiteMixed16, ForcedInfSkipsTheStepHalvesTheScaleAndHoldsTheScheduler) {
  manual_seed(2);
  auto net = small_mlp();
  optim::SGD sgd(net->parameters(), {.lr = 0.1});
  Lite lite({.accelerator = "cpu", .precision = "16-mixed", .scaler = {.init_scale = 256.0}, .profile = &amx()});
  auto [model, opt] = lite.setup(net, sgd);
  LiteScheduler sched = lite.setup_scheduler(opt, optim::StepDecay({.step_size = 1, .gamma = 0.5}));
  const Tensor x = randn({4, 6}), y = randint(0, 3, {4});

  // A clean step: the scheduler advances.
  opt.zero_grad();
  lite.backward(cross_entropy(model(x), y));
  EXPECT_TRUE(opt.step());
  sched.step();
  EXPECT_EQ(sched.last_step(), 1);  // the scheduler advanced
  EXPECT_DOUBLE_EQ(sgd.lr(), 0.05);

  // A poisoned step: an infinite gradient on purpose.
  const auto before = snapshot(*net);
  opt.zero_grad();
  Tensor loss = cross_entropy(model(x), y);
  net->parameters()[0].register_hook([](const Tensor& g) { return g * std::numeric_limits<float>::infinity(); });
  lite.backward(loss);
  EXPECT_FALSE(opt.step());
  EXPECT_TRUE(same(before, snapshot(*net)));  // parameters unchanged
  EXPECT_EQ(lite.loss_scale(), 128.0);        // halved, once
  EXPECT_EQ(lite.skipped_steps(), 1);
  EXPECT_EQ(opt.steps_skipped(), 1);
  EXPECT_EQ(opt.steps_taken(), 1);
  sched.step();
  EXPECT_EQ(sched.last_step(), 1);  // the schedule holds on a skipped step
  EXPECT_DOUBLE_EQ(sgd.lr(), 0.05);
}

TEST(LiteMixed16, TwoOptimizersEachSkipOnTheirOwnAndTheScaleUpdatesOnce) {
  manual_seed(3);
  auto a = std::make_shared<nn::Linear>(4, 4), b = std::make_shared<nn::Linear>(4, 2);
  optim::SGD sa(a->parameters(), {.lr = 0.1}), sb(b->parameters(), {.lr = 0.1});
  Lite lite({.accelerator = "cpu", .precision = "16-mixed", .scaler = {.init_scale = 64.0, .growth_interval = 1},
             .profile = &amx()});
  auto [ma, oa] = lite.setup(a, sa);
  auto [mb, ob] = lite.setup(b, sb);
  const Tensor x = randn({3, 4});
  // Iteration 1, clean: both step; growth_interval 1 doubles the scale exactly once.
  lite.backward(sum(mb(ma(x))));
  EXPECT_TRUE(oa.step());
  EXPECT_EQ(lite.loss_scale(), 64.0);  // not yet: b has not stepped
  EXPECT_TRUE(ob.step());
  EXPECT_EQ(lite.loss_scale(), 128.0);
  // Iteration 2: only b's gradient overflows; a steps, b skips, the scale halves once.
  oa.zero_grad();
  ob.zero_grad();
  b->parameters()[0].register_hook([](const Tensor& g) { return g * std::numeric_limits<float>::quiet_NaN(); });
  const auto a_before = snapshot(*a), b_before = snapshot(*b);
  lite.backward(sum(mb(ma(x))));
  EXPECT_TRUE(oa.step());
  EXPECT_FALSE(ob.step());
  EXPECT_FALSE(same(a_before, snapshot(*a)));
  EXPECT_TRUE(same(b_before, snapshot(*b)));
  EXPECT_EQ(lite.loss_scale(), 64.0);
}

TEST(LiteMixed16, PlainBackwardOnAWrappedOutputIsRefused) {
  auto net = small_mlp();
  optim::SGD sgd(net->parameters(), {.lr = 0.1});
  Lite lite(opts("16-mixed"));
  auto [model, opt] = lite.setup(net, sgd);
  Tensor loss = cross_entropy(model(randn({2, 6})), randint(0, 3, {2}));
  EXPECT_AG_ERROR(loss.backward(), "call lite.backward(loss) instead of loss.backward()");
  for (const Tensor& p : net->parameters()) EXPECT_FALSE(p.grad().defined());
  // Other precisions need no scale: a plain backward is fine there.
  auto net2 = small_mlp();
  Lite bf16(opts("bf16-mixed"));
  auto m2 = bf16.setup_module(net2);
  cross_entropy(m2(randn({2, 6})), randint(0, 3, {2})).backward();
  EXPECT_TRUE(net2->parameters()[0].grad().defined());
}

TEST(LiteTrue, Bf16TrueKeepsFloat32MasterWeightsFromTheOriginalValues) {
  manual_seed(4);
  auto net = small_mlp();
  const auto original = snapshot(*net);
  optim::AdamW adamw(net->parameters(), {.lr = 1e-3});
  Lite lite(opts("bf16-true"));
  auto [model, opt] = lite.setup(net, adamw);
  for (const Tensor& p : net->parameters()) EXPECT_EQ(p.dtype(), kBFloat16);
  const auto sd = adamw.state_dict();
  for (size_t i = 0; i < original.size(); ++i) {
    const auto it = sd.find("state.0." + std::to_string(i) + ".master");
    ASSERT_NE(it, sd.end()) << i;
    EXPECT_TRUE(agt::allclose(it->second, original[i], 0, 0)) << i;  // not the bf16-rounded values
  }
  Tensor y = model(randn({2, 6}));
  EXPECT_EQ(y.dtype(), kFloat32);  // to-default
  lite.backward(sum(y));
  EXPECT_TRUE(opt.step());
}

TEST(LiteMisc, DescribeToDeviceDataLoaderAndAutocast) {
  Lite lite(opts("auto"));
  EXPECT_EQ(lite.precision(), Precision::MixedBF16);
  EXPECT_TRUE(agt::contains(lite.precision_reason(), "AMX-BF16"));
  EXPECT_EQ(lite.device(), Device(kCPU));
  EXPECT_TRUE(agt::contains(lite.describe(), "precision: bf16-mixed")) << lite.describe();
  EXPECT_TRUE(agt::contains(lite.describe(), "cpu bfloat16: native")) << lite.describe();
  EXPECT_TRUE(agt::contains(lite.describe(), "device   : cpu (the CPU was requested)")) << lite.describe();
  {
    ForwardContext ctx = lite.autocast();
    EXPECT_TRUE(autocast::is_enabled(kCPU));
    EXPECT_EQ(matmul(randn({2, 2}), randn({2, 2})).dtype(), kBFloat16);
  }
  EXPECT_FALSE(autocast::is_enabled(kCPU));
  const Tensor t = randn({2});
  EXPECT_EQ(lite.to_device(t).unsafe_impl(), t.unsafe_impl());  // already there: no copy
  auto ds = std::make_shared<data::TensorDataset>(randn({10, 3}), arange(10));
  auto loader = lite.setup_dataloader(data::DataLoader(ds, {.batch_size = 4}));
  int64_t n = 0;
  for (const auto& b : loader) {
    EXPECT_EQ(b.input.device(), Device(kCPU));
    n += b.input.size(0);
  }
  EXPECT_EQ(n, 10);
  EXPECT_EQ(loader.num_batches(), 3);
  lite.seed_everything(5);
  const Tensor r1 = randn({3});
  lite.seed_everything(5);
  EXPECT_TRUE(agt::allclose(randn({3}), r1, 0, 0));
}

TEST(LiteMisc, WrappersThatWereNeverSetUpSaySo) {
  LiteModule<nn::Sequential> model;
  EXPECT_AG_ERROR(model(randn({2, 6})), "not set up");
  LiteOptimizer opt;
  EXPECT_AG_ERROR(opt.step(), "not set up");
  EXPECT_AG_ERROR(opt.zero_grad(), "not set up");
  EXPECT_AG_ERROR(parse_output_conversion("float32"), "allowed: \"to-default\", \"to-input-dtype\", \"none\"");
}

TEST(LiteMisc, InitModuleBuildsInTheParameterDtype) {
  Lite lite(opts("bf16-true"));
  std::shared_ptr<nn::Linear> net;
  {
    auto ctx = lite.init_module();
    net = std::make_shared<nn::Linear>(3, 2);
  }
  EXPECT_EQ(net->parameters()[0].dtype(), kBFloat16);
  EXPECT_EQ(get_default_dtype(), kFloat32);
}

// ---- checkpoints ---------------------------------------------------------------------------

namespace {

// A run of `steps` iterations with dropout (so the generator matters), continuing from
// whatever state the objects hold.
struct TrainRun {
  std::shared_ptr<nn::Sequential> net;
  optim::AdamW adamw;
  Lite lite;
  LiteOptimizer opt;  // before the module: bf16-true masters come from the float32 values
  LiteModule<nn::Sequential> model;
  LiteScheduler sched;
  int64_t step = 0;
  explicit TrainRun(const char* precision, UpdateRounding rounding = UpdateRounding::Master)
      : net(std::make_shared<nn::Sequential>(
            std::vector<nn::ModulePtr>{std::make_shared<nn::Linear>(6, 16), std::make_shared<nn::ReLU>(),
                                       std::make_shared<nn::Dropout>(0.2), std::make_shared<nn::Linear>(16, 3)})),
        adamw(net->parameters(), {.lr = 1e-2}),
        lite({.accelerator = "cpu",
              .precision = precision,
              .update_rounding = rounding,
              .scaler = {.init_scale = 8.0, .growth_interval = 2},
              .profile = &amx()}),
        opt(lite.setup_optimizer(adamw)),
        model(lite.setup_module(net)),
        sched(lite.setup_scheduler(opt, optim::CosineAnnealing({.t_max = 20}))) {}
  void train(int n) {
    for (int i = 0; i < n; ++i, ++step) {
      const Tensor x = randn({8, 6}), y = randint(0, 3, {8});
      opt.zero_grad();
      lite.backward(cross_entropy(model(x), y));
      opt.step();
      sched.step();
    }
  }
  LiteState state() { return {{"model", model}, {"optimizer", opt}, {"scheduler", sched}, {"step", step}}; }
};

}  // namespace

TEST(LiteCheckpoint, ResumedRunEqualsUninterruptedRunBitForBit) {
  const std::pair<const char*, UpdateRounding> runs[] = {
      {"16-mixed", UpdateRounding::Master},       {"bf16-mixed", UpdateRounding::Master},
      {"bf16-true", UpdateRounding::Master},      {"bf16-true", UpdateRounding::Stochastic},
      {"bf16-true", UpdateRounding::Compensated}, {"bf16-true", UpdateRounding::Nearest},
      {"32-true", UpdateRounding::Master}};
  for (const auto& [precision, rounding] : runs) {
    SCOPED_TRACE(std::string(precision) + " " + update_rounding_name(rounding));
    agt::TempDir dir;
    const std::string path = (dir.path() / "ckpt.safetensors").string();
    manual_seed(11);
    TrainRun a(precision, rounding);
    a.train(4);
    a.lite.save(path, a.state());
    a.train(5);

    manual_seed(999);  // fresh objects, other initial values and generator position (and rounding seed)
    TrainRun b(precision, rounding);
    b.lite.load(path, b.state());
    EXPECT_EQ(b.step, 4);
    EXPECT_EQ(b.sched.last_step(), a.sched.last_step() - 5);
    EXPECT_EQ(b.lite.loss_scale(), 0.0 + (std::string(precision) == "16-mixed" ? 32.0 : 1.0));
    b.train(5);
    EXPECT_TRUE(same(snapshot(*a.net), snapshot(*b.net)));
    EXPECT_EQ(a.lite.loss_scale(), b.lite.loss_scale());
    EXPECT_DOUBLE_EQ(a.adamw.lr(), b.adamw.lr());
  }
}

TEST(LiteCheckpoint, FileIsSafetensorsWithTheScalerAndMissingItemsAreNamed) {
  agt::TempDir dir;
  const std::string path = (dir.path() / "ckpt.safetensors").string();
  manual_seed(12);
  TrainRun a("16-mixed");
  a.train(1);
  double best = 0.75;
  std::string note = "first";
  LiteState st = a.state();
  st.emplace("best", best);
  st.emplace("note", note);
  a.lite.save(path, st);
  nn::Metadata meta;
  const nn::StateDict all = nn::load(path, &meta);
  EXPECT_TRUE(all.count("model.0.weight"));
  EXPECT_TRUE(all.count("optimizer.state.0.0.buf1"));
  EXPECT_TRUE(all.count("lite.precision_state.scale"));
  EXPECT_EQ(all.at("lite.precision_state.scale").item<double>(), 8.0);
  EXPECT_EQ(all.at("step").item<int64_t>(), 1);
  EXPECT_EQ(meta.at("note"), "first");
  EXPECT_EQ(meta.at("lite.precision"), "16-mixed");

  TrainRun b("16-mixed");
  double best2 = 0;
  std::string note2;
  LiteState st2 = b.state();
  st2.emplace("best", best2);
  st2.emplace("note", note2);
  b.lite.load(path, st2);
  EXPECT_EQ(best2, 0.75);
  EXPECT_EQ(note2, "first");
  LiteState more = b.state();
  more.emplace("ema", b.model);
  EXPECT_AG_ERROR(b.lite.load(path, more), "has no module \"ema\"");
  TrainRun c("bf16-mixed");
  EXPECT_AG_ERROR(c.lite.load(path, c.state()), "holds grad-scaler state (saved under 16-mixed), but this Lite runs bf16-mixed");
  EXPECT_AG_ERROR(a.lite.save(path, {{"lite.x", a.step}}), "reserved");
}

// Every number in a checkpoint passes the rules the constructors apply, and every key
// belongs to something: a bad item is refused naming the file and the key (the optimizer
// and the scaler check everything before they change anything).
TEST(LiteCheckpoint, EveryNumberAndKeyIsValidated) {
  agt::TempDir dir;
  const std::string good = (dir.path() / "good.safetensors").string();
  manual_seed(13);
  TrainRun a("16-mixed");
  a.train(3);
  a.lite.save(good, a.state());
  nn::Metadata meta0;
  const nn::StateDict t0 = nn::load(good, &meta0);
  const double nan = std::nan(""), inf = INFINITY;
  const auto f64 = [](double v) { return scalar_tensor(v, TensorOptions(kFloat64)); };
  const auto i64 = [](int64_t v) { return scalar_tensor(v, TensorOptions(kInt64)); };
  struct Case {
    std::string name;
    std::function<void(nn::StateDict&, nn::Metadata&)> edit;
    std::string problem;
  };
  const std::vector<Case> cases = {
      // the optimizer: learning rates, step counters, buffers, unknown keys
      {"lr-negative", [&](auto& t, auto&) { t["optimizer.param_groups.0.lr"] = f64(-0.1); },
       "\"optimizer\": 'param_groups.0.lr' must be a finite non-negative learning rate, got -0.1"},
      {"lr-nan", [&](auto& t, auto&) { t["optimizer.param_groups.0.lr"] = f64(nan); }, "'param_groups.0.lr' must be a finite"},
      {"lr-inf", [&](auto& t, auto&) { t["optimizer.param_groups.0.lr"] = f64(inf); }, "'param_groups.0.lr' must be a finite"},
      {"lr-two", [&](auto& t, auto&) { t["optimizer.param_groups.0.lr"] = zeros({2}, kFloat64); },
       "'param_groups.0.lr' must hold one number, got shape [2]"},
      {"steps-fraction", [&](auto& t, auto&) { t["optimizer.steps"] = f64(2.5); }, "'steps' must be an integer in [0, 9223372036854775807], got 2.5"},
      {"steps-negative", [&](auto& t, auto&) { t["optimizer.steps"] = i64(-3); }, "'steps' must be an integer in [0, 9223372036854775807], got -3"},
      {"steps-huge", [&](auto& t, auto&) { t["optimizer.steps"] = f64(1e19); }, "'steps' must be an integer"},
      {"param-step-nan", [&](auto& t, auto&) { t["optimizer.state.0.0.step"] = f64(nan); }, "'state.0.0.step' must be an integer"},
      {"size-fraction", [&](auto& t, auto&) { t["optimizer.param_groups.0.size"] = f64(4.5); }, "'param_groups.0.size' must be an integer"},
      {"buffer-int", [&](auto& t, auto&) { t["optimizer.state.0.0.buf1"] = t.at("optimizer.state.0.0.buf1").to(kInt64); },
       "state 'state.0.0.buf1' must be a floating tensor, got int64"},
      {"optimizer-unknown", [&](auto& t, auto&) { t["optimizer.state.0.99.buf1"] = zeros({1}); }, "unexpected key 'state.0.99.buf1'"},
      // the grad scaler's state
      {"tracker-past-interval", [&](auto& t, auto&) { t["lite.precision_state.growth_tracker"] = i64(2); },
       "grad-scaler state (lite.precision_state.*): 'growth_tracker' must be an integer in [0, 1], got 2"},
      {"tracker-negative", [&](auto& t, auto&) { t["lite.precision_state.growth_tracker"] = i64(-1); }, "'growth_tracker' must be an integer in [0, 1]"},
      {"interval-fraction", [&](auto& t, auto&) { t["lite.precision_state.growth_interval"] = f64(2.5); }, "'growth_interval' must be an integer"},
      {"interval-huge", [&](auto& t, auto&) { t["lite.precision_state.growth_interval"] = f64(1e300); }, "'growth_interval' must be an integer"},
      {"skipped-negative", [&](auto& t, auto&) { t["lite.precision_state.skipped_steps"] = i64(-5); }, "'skipped_steps' must be an integer in [0"},
      {"overflow-step", [&](auto& t, auto&) { t["lite.precision_state.last_overflow_step"] = i64(-2); }, "'last_overflow_step' must be an integer in [-1"},
      {"scale-nan", [&](auto& t, auto&) { t["lite.precision_state.scale"] = f64(nan); }, "\"scale\" must be a positive normal float32 number, in [2^-126, 3.4e38], got nan"},
      {"scale-tiny", [&](auto& t, auto&) { t["lite.precision_state.scale"] = f64(1e-300); }, "grad-scaler state (lite.precision_state.*): load_state_dict(): \"scale\" must be a positive normal float32 number, in [2^-126, 3.4e38], got 1e-300"},
      {"scaler-unknown", [&](auto& t, auto&) { t["lite.precision_state.bogus"] = f64(1); }, "unexpected key \"bogus\""},
      // the scheduler, a counter, the generator's position
      {"last-step-negative", [&](auto& t, auto&) { t["scheduler.last_step"] = i64(-1); }, "'scheduler.last_step' must be an integer in [0"},
      {"last-step-fraction", [&](auto& t, auto&) { t["scheduler.last_step"] = f64(0.5); }, "'scheduler.last_step' must be an integer"},
      {"scheduler-unknown", [&](auto& t, auto&) { t["scheduler.extra"] = i64(1); }, "unexpected key 'scheduler.extra' for scheduler"},
      {"counter-fraction", [&](auto& t, auto&) { t["step"] = f64(3.25); }, "'step' must be an integer"},
      {"counter-nan", [&](auto& t, auto&) { t["step"] = f64(nan); }, "'step' must be an integer"},
      {"counter-two", [&](auto& t, auto&) { t["step"] = zeros({2}, kInt64); }, "'step' must hold one number"},
      {"seed-negative", [&](auto&, auto& m) { m["lite.rng_seed"] = "-1"; }, "'lite.rng_seed' must be a decimal number in [0, 2^64), got \"-1\""},
      {"seed-junk", [&](auto&, auto& m) { m["lite.rng_seed"] = "12x"; }, "'lite.rng_seed' must be a decimal number"},
      {"seed-empty", [&](auto&, auto& m) { m["lite.rng_seed"] = ""; }, "'lite.rng_seed' must be a decimal number"},
      {"seed-overflow", [&](auto&, auto& m) { m["lite.rng_seed"] = "18446744073709551616"; }, "'lite.rng_seed' must be a decimal number"},
      {"offset-space", [&](auto&, auto& m) { m["lite.rng_offset"] = " 7"; }, "'lite.rng_offset' must be a decimal number"},
      {"offset-missing", [&](auto&, auto& m) { m.erase("lite.rng_offset"); }, "has only one of lite.rng_seed and lite.rng_offset"},
      // keys that belong to no item
      {"unknown-tensor", [&](auto& t, auto&) { t["extra"] = zeros({1}); }, "unexpected keys that belong to no item of the state: \"extra\""},
      {"unknown-meta", [&](auto&, auto& m) { m["note"] = "x"; }, "\"note (metadata)\""},
      {"module-unknown", [&](auto& t, auto&) { t["model.9.weight"] = zeros({1}); }, "unexpected keys: 9.weight"},
      // a weight of another kind of number, a precision that does not exist
      {"weight-bool", [&](auto& t, auto&) { t["model.0.weight"] = ne(t.at("model.0.weight"), 0.0); },
       "\"model\": the state dict does not match the Sequential: dtypes of another kind: 0.weight: checkpoint bool vs model float32"},
      {"bias-int", [&](auto& t, auto&) { t["model.0.bias"] = t.at("model.0.bias").to(kInt64); },
       "0.bias: checkpoint int64 vs model float32"},
      {"precision-made-up", [&](auto&, auto& m) { m["lite.precision"] = "fp8-magic"; },
       ": metadata \"lite.precision\" is \"fp8-magic\", which is not a precision"},
      {"precision-auto", [&](auto&, auto& m) { m["lite.precision"] = "auto"; }, "is \"auto\", which is not a precision"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    nn::StateDict t = t0;
    nn::Metadata m = meta0;
    c.edit(t, m);
    const std::string path = (dir.path() / (c.name + ".safetensors")).string();
    nn::save(path, t, m);
    manual_seed(99);
    TrainRun b("16-mixed");
    const double lr_before = b.adamw.lr();
    const std::string msg = agt::error_of([&] { b.lite.load(path, b.state()); });
    EXPECT_TRUE(agt::contains(msg, "[Lite::load] " + path)) << msg;
    EXPECT_TRUE(agt::contains(msg, c.problem)) << msg << "\nexpected: " << c.problem;
    if (c.name.rfind("lr-", 0) == 0 || c.name.rfind("steps-", 0) == 0) {  // the optimizer is left as it was
      EXPECT_EQ(b.adamw.lr(), lr_before);
      EXPECT_EQ(b.adamw.steps(), 0);
    }
  }
  // strict = false ignores keys that belong to no item, and still checks the items
  {
    nn::StateDict t = t0;
    nn::Metadata m = meta0;
    t["extra"] = zeros({1});
    m["note"] = "x";
    const std::string path = (dir.path() / "loose.safetensors").string();
    nn::save(path, t, m);
    TrainRun b("16-mixed");
    b.lite.load(path, b.state(), /*strict=*/false);
    EXPECT_EQ(b.step, 3);
    EXPECT_AG_ERROR(b.lite.load(path, b.state()), "unexpected keys");
  }
  // an integer stored as an integral float is fine (PyTorch keeps some counters so)
  {
    nn::StateDict t = t0;
    nn::Metadata m = meta0;
    t["optimizer.steps"] = f64(3);
    t["lite.precision_state.growth_tracker"] = f64(1);
    t["step"] = f64(3);
    const std::string path = (dir.path() / "floats.safetensors").string();
    nn::save(path, t, m);
    TrainRun b("16-mixed");
    b.lite.load(path, b.state());
    EXPECT_EQ(b.step, 3);
    EXPECT_EQ(b.adamw.steps(), 3);
  }
}

TEST(LiteMisc, ClipGradientsWorksUnderEveryPrecision) {
  manual_seed(5);
  const Tensor x = randn({4, 6});
  // The reference: the same model's gradient norm in float64, without Lite.
  manual_seed(6);
  auto ref = small_mlp();
  ref->to(kFloat64);
  sum(ref->forward(x.to(kFloat64)) * 100.0).backward();
  double ref_sq = 0;
  for (const Tensor& t : ref->parameters()) ref_sq += sum(t.grad() * t.grad()).item<double>();
  const double ref_norm = std::sqrt(ref_sq);
  ASSERT_GT(ref_norm, 5.0);  // far above max_norm, so clipping acts
  for (const char* p : {"32-true", "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"}) {
    SCOPED_TRACE(p);
    manual_seed(6);
    auto net = small_mlp();
    optim::SGD sgd(net->parameters(), {.lr = 0.1});
    LiteOptions o = opts(p);
    o.scaler.init_scale = 64;  // 100 * 65536 would overflow float16: a (correctly) skipped step
    Lite lite(o);
    auto [model, opt] = lite.setup(net, sgd);
    lite.backward(sum(model(x) * 100.0f));
    const double norm = lite.clip_gradients(model, opt, 0.5).item<double>();
    // the true norm, before clipping (unscaled under 16-mixed); 16-bit weights, inputs and
    // gradients each round by up to 2^-8 (bfloat16) of their size
    const std::string ps = p;
    // (the norm is summed and returned in float32, 64-true too)
    const double rel = ps.find("bf16") == 0 ? 0.03 : ps.find("16") == 0 ? 0.005 : 1e-5;
    EXPECT_NEAR(norm, ref_norm, rel * ref_norm);
    double sq = 0;
    for (const Tensor& t : net->parameters()) sq += sum(t.grad().to(kFloat64) * t.grad().to(kFloat64)).item<double>();
    EXPECT_NEAR(std::sqrt(sq), 0.5, 0.5 * 0.02);  // clipped to max_norm (16-bit gradients round)
    EXPECT_TRUE(opt.step());
  }
}
