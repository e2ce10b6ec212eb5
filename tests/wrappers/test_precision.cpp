// Precision strings, accelerator resolution and the "auto" precision table over fake
// hardware profiles (no GPU needed: resolve_precision is a pure function).
#include "support/testing.h"

#include <cstdlib>
#include <set>
#include <typeinfo>

using namespace ag;
namespace prof = ag::hw::profiles;

namespace {

// Sets an environment variable for the scope of a test.
struct EnvVar {
  EnvVar(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~EnvVar() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST(PrecisionParse, EveryValueAndTheOldSpellings) {
  const std::pair<const char*, Precision> names[] = {
      {"32-true", Precision::True32},   {"64-true", Precision::True64},      {"16-mixed", Precision::Mixed16},
      {"bf16-mixed", Precision::MixedBF16}, {"16-true", Precision::True16}, {"bf16-true", Precision::TrueBF16}};
  for (auto [s, p] : names) {
    const PrecisionRequest r = parse_precision(s);
    ASSERT_TRUE(r.precision.has_value()) << s;
    EXPECT_EQ(*r.precision, p);
    EXPECT_STREQ(precision_name(p), s);
    EXPECT_TRUE(r.warning.empty());
  }
  EXPECT_FALSE(parse_precision("auto").precision.has_value());
  const std::pair<const char*, const char*> old[] = {
      {"32", "32-true"}, {"64", "64-true"}, {"16", "16-mixed"}, {"bf16", "bf16-mixed"}};
  for (auto [s, now] : old) {
    const PrecisionRequest r = parse_precision(s);
    EXPECT_STREQ(precision_name(*r.precision), now);
    EXPECT_TRUE(agt::contains(r.warning, "deprecated")) << r.warning;
    EXPECT_TRUE(agt::contains(r.warning, now)) << r.warning;
    EXPECT_EQ(r.warning.find('\n'), std::string::npos);  // one line
  }
}

TEST(PrecisionParse, UnknownValueListsEveryAllowedValue) {
  const std::string msg = agt::error_of([] { parse_precision("fp16"); });
  for (const char* v : {"\"fp16\"", "32-true", "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "auto",
                        "\"bf16\""})
    EXPECT_TRUE(agt::contains(msg, v)) << v << " missing from: " << msg;
}

TEST(PrecisionParse, EnvironmentVariableIsTheDefault) {
  {
    EnvVar e("AMPGRAD_PRECISION", nullptr);
    EXPECT_EQ(default_precision_string(), "32-true");
  }
  {
    EnvVar e("AMPGRAD_PRECISION", "bf16-mixed");
    EXPECT_EQ(default_precision_string(), "bf16-mixed");
    const hw::HardwareProfile p = prof::cpu_amx();
    Lite lite({.accelerator = "cpu", .profile = &p});  // no precision given: the variable decides
    EXPECT_EQ(lite.precision(), Precision::MixedBF16);
    Lite explicit_one({.accelerator = "cpu", .precision = "64-true", .profile = &p});  // the program wins
    EXPECT_EQ(explicit_one.precision(), Precision::True64);
  }
}

TEST(Accelerator, CpuCudaAndAuto) {
  const auto cpu = prof::cpu_avx512_bf16(), h200 = prof::h200();
  EXPECT_EQ(resolve_accelerator("cpu", h200).devices, std::vector<Device>{Device(kCPU)});
  EXPECT_EQ(resolve_accelerator("auto", cpu).devices, std::vector<Device>{Device(kCPU)});
  EXPECT_TRUE(agt::contains(resolve_accelerator("auto", cpu).reason, "built without CUDA"));
  EXPECT_EQ(resolve_accelerator("auto", h200).devices, std::vector<Device>{Device(kCUDA, 0)});
  EXPECT_EQ(resolve_accelerator("cuda", h200).devices.size(), 8u);
  EXPECT_EQ(resolve_accelerator("gpu", h200).devices.size(), 8u);
  EXPECT_EQ(resolve_accelerator("cuda:3", h200).devices, std::vector<Device>{Device(kCUDA, 3)});
  EXPECT_EQ(resolve_accelerator("cuda:1,5", h200).devices, (std::vector<Device>{Device(kCUDA, 1), Device(kCUDA, 5)}));
  hw::HardwareProfile built_no_gpu = cpu;
  built_no_gpu.built_with_cuda = true;
  EXPECT_TRUE(agt::contains(resolve_accelerator("auto", built_no_gpu).reason, "no CUDA device"));
}

TEST(Accelerator, CudaWithoutADeviceFailsClearly) {
  const auto cpu = prof::cpu_avx512_bf16();
  EXPECT_AG_ERROR(resolve_accelerator("cuda", cpu), "accelerator \"cuda\" was requested, but ampgrad was built without CUDA");
  hw::HardwareProfile built_no_gpu = cpu;
  built_no_gpu.built_with_cuda = true;
  EXPECT_AG_ERROR(resolve_accelerator("cuda", built_no_gpu), "no CUDA device was found");
  EXPECT_AG_ERROR(resolve_accelerator("cuda:1", prof::t4()), "cuda:1 does not exist (1 CUDA device found)");
  EXPECT_AG_ERROR(resolve_accelerator("cuda:x", prof::t4()), "bad CUDA device list");
  EXPECT_AG_ERROR(resolve_accelerator("tpu", cpu), "unknown accelerator \"tpu\"");
  EXPECT_AG_ERROR(Lite({.accelerator = "cuda", .precision = "32-true", .profile = &cpu}), "built without CUDA");
}

// A malformed device list is a mistake in the string on every machine: it is named as a
// parse error before the hardware is asked (it said "built without CUDA" or "no CUDA device").
TEST(Accelerator, MalformedDeviceListsAreParseErrors) {
  const auto cpu = prof::cpu_avx512_bf16(), h200 = prof::h200();
  hw::HardwareProfile built_no_gpu = cpu;
  built_no_gpu.built_with_cuda = true;
  const struct {
    const char* acc;
    const char* problem;
  } cases[] = {
      {"cuda:-1", "\"-1\" is not a device index"},   {"cuda:0,,x", "an empty item"},
      {"cuda:", "an empty item"},                      {"cuda:1x", "\"1x\" is not a device index"},
      {"cuda:0,", "an empty item"},                    {"cuda:,0", "an empty item"},
      {"cuda: 1", "\" 1\" is not a device index"},   {"cuda:+1", "\"+1\" is not a device index"},
      {"cuda:99999999999", "is not a device index"},  {"cuda:0,x", "\"x\" is not a device index"},
  };
  for (const auto& c : cases)
    for (const hw::HardwareProfile* p : {&cpu, static_cast<const hw::HardwareProfile*>(&built_no_gpu), &h200}) {
      SCOPED_TRACE(c.acc);
      const std::string msg = agt::error_of([&] { resolve_accelerator(c.acc, *p); });
      EXPECT_TRUE(agt::contains(msg, std::string("[accelerator] bad CUDA device list in \"") + c.acc + "\": ")) << msg;
      EXPECT_TRUE(agt::contains(msg, c.problem)) << msg;
      EXPECT_FALSE(agt::contains(msg, "CUDA device was found") || agt::contains(msg, "built without CUDA")) << msg;
    }
  EXPECT_AG_ERROR(Lite({.accelerator = "cuda:-1", .precision = "32-true", .profile = &cpu}), "bad CUDA device list in \"cuda:-1\"");
  // well-formed lists still resolve, or name what is missing
  EXPECT_EQ(resolve_accelerator("cuda:7,0,7", h200).devices, (std::vector<Device>{Device(kCUDA, 7), Device(kCUDA, 0)}));
  EXPECT_AG_ERROR(resolve_accelerator("cuda:0", cpu), "accelerator \"cuda:0\" was requested, but ampgrad was built without CUDA");
  EXPECT_AG_ERROR(resolve_accelerator("cuda:8", h200), "cuda:8 does not exist (8 CUDA devices found)");
}

// The "auto" table of docs/precision.md, row by row.
TEST(PrecisionAuto, ResolutionTable) {
  struct Row {
    const char* profile;
    const char* accelerator;
    Precision expect;
    const char* reason_has;
  };
  const Row rows[] = {
      {"h200", "auto", Precision::MixedBF16, "native bfloat16 (8.0+)"},
      {"a100", "cuda", Precision::MixedBF16, "NVIDIA A100-SXM4-80GB, compute capability 8.0"},
      {"t4", "auto", Precision::Mixed16, "float16 tensor cores but no native bfloat16"},
      {"t4", "cuda:0", Precision::Mixed16, "grad scaler"},
      {"cpu-amx", "auto", Precision::MixedBF16, "AMX-BF16"},
      {"cpu-avx512-bf16", "auto", Precision::MixedBF16, "AVX512-BF16"},
      {"cpu-without-avx512", "auto", Precision::True32, "neither AMX-BF16 nor AVX512-BF16"},
      {"t4", "cpu", Precision::True32, "neither AMX-BF16 nor AVX512-BF16"},  // Skylake host
      {"a100", "cpu", Precision::True32, "neither AMX-BF16 nor AVX512-BF16"},  // Zen 2 host
      {"h200", "cpu", Precision::MixedBF16, "AMX-BF16"},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(std::string(r.profile) + " / " + r.accelerator);
    const hw::HardwareProfile p = *prof::by_name(r.profile);
    const PrecisionDecision d = resolve_precision("auto", r.accelerator, p);
    EXPECT_STREQ(precision_name(d.precision), precision_name(r.expect));
    EXPECT_TRUE(agt::contains(d.reason, r.reason_has)) << d.reason;
    EXPECT_TRUE(agt::contains(d.reason, "auto:")) << d.reason;
    EXPECT_TRUE(d.warning.empty()) << d.warning;
  }
}

TEST(PrecisionAuto, BuildWithoutOneDnnOnlyEmulatesBFloat16SoAutoStaysFloat32) {
  hw::HardwareProfile p = prof::cpu_amx();
  p.built_with_onednn = false;
  p.onednn_isa = "none (built without oneDNN)";
  const hw::Verdict v = hw::verdict(p, Device(kCPU), kBFloat16);
  EXPECT_EQ(v.support, hw::Support::Emulated);
  EXPECT_TRUE(agt::contains(v.reason, "built without oneDNN")) << v.reason;
  const PrecisionDecision d = resolve_precision("auto", "cpu", p);
  EXPECT_EQ(d.precision, Precision::True32);
  EXPECT_TRUE(agt::contains(d.reason, "built without oneDNN")) << d.reason;
  EXPECT_TRUE(agt::contains(resolve_precision("bf16-mixed", "cpu", p).warning, "emulated")) << d.reason;
  EXPECT_EQ(hw::verdict(p, Device(kCPU), kFloat32).support, hw::Support::Native);
}

TEST(PrecisionAuto, OldCudaDeviceFallsBackToFloat32WithTheReason) {
  hw::HardwareProfile p = prof::t4();
  p.cuda[0].name = "Tesla P100-PCIE-16GB";
  p.cuda[0].major = 6;
  p.cuda[0].minor = 0;
  const PrecisionDecision d = resolve_precision("auto", "cuda", p);
  EXPECT_EQ(d.precision, Precision::True32);
  EXPECT_TRUE(agt::contains(d.reason, "no float16 tensor cores (7.0+) and no native bfloat16 (8.0+)")) << d.reason;
}

TEST(PrecisionAuto, SeveralGpusTheWeakestInUseDecides) {
  hw::HardwareProfile p = prof::a100();  // eight A100s; make cuda:5 a T4
  p.cuda[5].name = "Tesla T4";
  p.cuda[5].major = 7;
  p.cuda[5].minor = 5;
  EXPECT_EQ(resolve_precision("auto", "cuda:0,1", p).precision, Precision::MixedBF16);
  const PrecisionDecision all = resolve_precision("auto", "cuda", p);
  EXPECT_EQ(all.precision, Precision::Mixed16);
  EXPECT_TRUE(agt::contains(all.reason, "cuda:5 (Tesla T4")) << all.reason;
  EXPECT_TRUE(agt::contains(all.reason, "the weakest of the 8 in use")) << all.reason;
  EXPECT_EQ(resolve_precision("auto", "cuda:0,5", p).precision, Precision::Mixed16);
}

TEST(PrecisionExplicit, NativeChoicesCarryNoWarning) {
  const auto h200 = prof::h200();
  for (const char* s : {"32-true", "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"}) {
    const PrecisionDecision d = resolve_precision(s, "cuda", h200);
    EXPECT_STREQ(precision_name(d.precision), s);
    EXPECT_TRUE(d.warning.empty()) << s << ": " << d.warning;
    EXPECT_TRUE(agt::contains(d.reason, "\"auto\" would pick \"bf16-mixed\"")) << d.reason;
  }
}

TEST(PrecisionExplicit, EmulatedChoicesRunWithOneWarningLine) {
  // float16 on a Zen 4 CPU (no AVX512-FP16): computed through float32.
  const auto zen4 = prof::cpu_avx512_bf16();
  const PrecisionDecision d = resolve_precision("16-mixed", "cpu", zen4);
  EXPECT_EQ(d.precision, Precision::Mixed16);
  EXPECT_TRUE(agt::contains(d.warning, "runs emulated and slower")) << d.warning;
  EXPECT_TRUE(agt::contains(d.warning, "no AVX512-FP16")) << d.warning;
  EXPECT_EQ(d.warning.find('\n'), std::string::npos);
  // bfloat16 on a T4 (7.5): PyTorch's is_bf16_supported() says yes there; this says emulated.
  const PrecisionDecision t4 = resolve_precision("bf16-mixed", "cuda", prof::t4());
  EXPECT_TRUE(agt::contains(t4.warning, "cuda:0: compute capability 7.5 has no bfloat16 arithmetic")) << t4.warning;
  // The Lite prints it once, through its warning sink.
  std::vector<std::string> lines;
  Lite lite({.accelerator = "cpu", .precision = "16-mixed", .profile = &zen4,
             .warn = [&](const std::string& l) { lines.push_back(l); }});
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], d.warning);
  // A deprecated spelling on emulated hardware: both in the one line.
  const PrecisionDecision old = resolve_precision("16", "cpu", zen4);
  EXPECT_TRUE(agt::contains(old.warning, "deprecated") && agt::contains(old.warning, "emulated")) << old.warning;
}

TEST(PrecisionExplicit, AMissingDeviceIsRefusedByTheAccelerator) {
  // Today's verdict calls a floating dtype unsupported only where the device itself is
  // missing (no CUDA build, no driver, no such index), and resolve_accelerator refuses
  // those first, naming the device.
  const auto cpu = prof::cpu_amx();
  EXPECT_AG_ERROR(resolve_precision("16-mixed", "cuda:2", prof::t4()), "cuda:2 does not exist");
  EXPECT_AG_ERROR(resolve_precision("bf16-mixed", "cuda", cpu), "ampgrad was built without CUDA");
  EXPECT_AG_ERROR(resolve_precision("nope", "cpu", cpu), "unknown precision \"nope\"");
}

TEST(PrecisionPlugins, DtypesAndHooksPerPrecision) {
  struct Row {
    Precision p;
    DType param, compute;
    bool autocast, scales;
  };
  const Row rows[] = {{Precision::True32, kFloat32, kFloat32, false, false},
                      {Precision::True64, kFloat64, kFloat64, false, false},
                      {Precision::Mixed16, kFloat32, kFloat16, true, true},
                      {Precision::MixedBF16, kFloat32, kBFloat16, true, false},
                      {Precision::True16, kFloat16, kFloat16, false, false},
                      {Precision::TrueBF16, kBFloat16, kBFloat16, false, false}};
  std::set<std::string> classes;  // one plugin class per precision
  for (const Row& r : rows) {
    SCOPED_TRACE(precision_name(r.p));
    EXPECT_EQ(parameter_dtype(r.p), r.param);
    EXPECT_EQ(compute_dtype(r.p), r.compute);
    auto plugin = make_precision_plugin(r.p, kCPU);
    EXPECT_EQ(plugin->precision(), r.p);
    const auto& object = *plugin;  // dereferenced outside typeid: clang's -Wpotentially-evaluated-expression
    classes.insert(typeid(object).name());
    {
      ForwardContext ctx = plugin->forward_context();
      EXPECT_EQ(ctx.active(), r.autocast);
      EXPECT_EQ(autocast::is_enabled(kCPU), r.autocast);
      if (r.autocast) EXPECT_EQ(autocast::get_dtype(kCPU), r.compute);
    }
    EXPECT_FALSE(autocast::is_enabled(kCPU));
    EXPECT_EQ(plugin->scales_loss(), r.scales);
    EXPECT_EQ(plugin->scaler() != nullptr, r.scales);
    EXPECT_EQ(plugin->state_dict().empty(), !r.scales);
    {
      auto ctx = plugin->module_init_context();
      EXPECT_EQ(get_default_dtype(), r.param);
      EXPECT_EQ(randn({2}).dtype(), r.param);  // a model built here gets this dtype
    }
    EXPECT_EQ(get_default_dtype(), kFloat32);
    EXPECT_EQ(plugin->convert_input(randn({2})).dtype(), r.param);
    EXPECT_EQ(plugin->convert_input(arange(3)).dtype(), kInt64);
    auto net = std::make_shared<nn::Linear>(3, 2);
    plugin->convert_module(*net);
    EXPECT_EQ(net->parameters()[0].dtype(), r.param);
  }
  EXPECT_EQ(classes.size(), 6u);
}
