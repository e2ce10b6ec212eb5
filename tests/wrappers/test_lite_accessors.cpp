// What Lite reports about itself (devices, plugin, strategy), LiteModule::module, and
// is_mixed. Decisions come from fake hardware profiles, so a CUDA machine is described
// without one (Lite's constructor under "single" asks nothing of the devices).
#include "support/testing.h"

#include <string_view>

using namespace ag;
namespace prof = ag::hw::profiles;

namespace {

const hw::HardwareProfile& amx() {
  static const hw::HardwareProfile p = prof::cpu_amx();
  return p;
}

// An H200 as cuda:0 and a T4 as cuda:1: the weaker T4 decides "auto" (16-mixed).
const hw::HardwareProfile& h200_and_t4() {
  static const hw::HardwareProfile p = [] {
    hw::HardwareProfile h = prof::h200();  // eight of them: keep one
    h.cuda.resize(1);
    hw::CudaDevice t4 = prof::t4().cuda.at(0);
    t4.index = 1;
    h.cuda.push_back(t4);
    return h;
  }();
  return p;
}

}  // namespace

TEST(LiteAccessors, DevicesAreTheDecisionsInTheOrderAsked) {
  Lite cpu({.accelerator = "cpu", .precision = "32-true", .profile = &amx()});
  EXPECT_EQ(cpu.devices(), std::vector<Device>{Device(kCPU)});

  Lite two({.accelerator = "cuda:1,0", .precision = "auto", .profile = &h200_and_t4()});
  EXPECT_EQ(two.devices(), (std::vector<Device>{Device(kCUDA, 1), Device(kCUDA, 0)}));
  EXPECT_EQ(two.device(), Device(kCUDA, 1));  // the first of them
  EXPECT_EQ(two.precision(), Precision::Mixed16) << two.precision_reason();
  Lite all({.accelerator = "cuda", .precision = "32-true", .profile = &h200_and_t4()});
  EXPECT_EQ(all.devices(), (std::vector<Device>{Device(kCUDA, 0), Device(kCUDA, 1)}));
  Lite repeated({.accelerator = "cuda:1,1", .precision = "32-true", .profile = &h200_and_t4()});
  EXPECT_EQ(repeated.devices(), std::vector<Device>{Device(kCUDA, 1)});
}

// The plugin is the one Lite works through: of its precision and device type, with the
// scaler options given to Lite, and the scale Lite reports is that scaler's.
TEST(LiteAccessors, PluginIsTheOneLiteUses) {
  for (const char* ps : {"32-true", "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"}) {
    SCOPED_TRACE(ps);
    Lite lite({.accelerator = "cpu", .precision = ps, .profile = &amx()});
    PrecisionPlugin& plugin = lite.plugin();
    EXPECT_EQ(&plugin, &lite.plugin());
    EXPECT_EQ(plugin.precision(), lite.precision());
    EXPECT_EQ(plugin.device_type(), kCPU);
    EXPECT_EQ(plugin.scales_loss(), lite.precision() == Precision::Mixed16);
    EXPECT_EQ(plugin.scaler() != nullptr, lite.precision() == Precision::Mixed16);
    EXPECT_EQ(plugin.forward_context().active(), is_mixed(lite.precision()));
  }
  Lite lite({.accelerator = "cuda:1", .precision = "16-mixed", .scaler = {.init_scale = 512.0},
             .profile = &h200_and_t4()});
  EXPECT_EQ(lite.plugin().device_type(), kCUDA);
  ASSERT_NE(lite.plugin().scaler(), nullptr);
  EXPECT_EQ(lite.plugin().scaler()->options().init_scale, 512.0);
  EXPECT_EQ(lite.loss_scale(), 512.0);
  lite.plugin().scaler()->update(64.0);
  EXPECT_EQ(lite.loss_scale(), 64.0);
  EXPECT_EQ(lite.plugin().loss_scale(), 64.0);
}

TEST(LiteAccessors, StrategyIsTheOneAskedFor) {
  EXPECT_EQ(Lite({.accelerator = "cpu", .precision = "32-true", .profile = &amx()}).strategy(), "single");
  EXPECT_EQ(Lite({.accelerator = "cpu", .precision = "32-true", .strategy = "single", .profile = &amx()}).strategy(),
            "single");
  EXPECT_AG_ERROR(Lite({.accelerator = "cpu", .precision = "32-true", .strategy = "fsdp", .profile = &amx()}),
                  "[Lite] unknown strategy \"fsdp\" (single, ddp)");
  // "ddp" is tested under mpirun (tests/dist/test_dist.cpp, LiteDdp.AccessorsDescribeTheJob).
}

// module() is the module handed to setup, converted in place; the wrapper runs that same
// module around its own conversions.
TEST(LiteAccessors, ModuleIsTheWrappedModuleItself) {
  manual_seed(7);
  auto net = std::make_shared<nn::Linear>(3, 2);
  Lite lite({.accelerator = "cpu", .precision = "bf16-true", .profile = &amx()});
  LiteModule<nn::Linear> model = lite.setup_module(net);
  EXPECT_EQ(&model.module(), net.get());
  EXPECT_EQ(model.module_ptr(), net);
  EXPECT_EQ(model.operator->(), net.get());
  EXPECT_EQ(model.module().weight.dtype(), kBFloat16);

  const Tensor x = randn({4, 3});
  const Tensor y = model(x);
  EXPECT_EQ(y.dtype(), kFloat32);  // to-default
  EXPECT_TRUE(agt::same_bits(y, model.module().forward(x.to(kBFloat16)).to(kFloat32)));
  {
    NoGradGuard ng;
    model.module().weight.fill_(0.0);
    model.module().bias.fill_(1.5);
  }
  EXPECT_TRUE(agt::same_bits(model(x), full({4, 2}, 1.5)));
}

// The two mixed precisions, and only they, compute in another dtype than they keep the
// parameters in.
TEST(LiteAccessors, IsMixedIsTrueForTheMixedPrecisionsOnly) {
  for (Precision p : {Precision::True32, Precision::True64, Precision::Mixed16, Precision::MixedBF16,
                      Precision::True16, Precision::TrueBF16}) {
    const std::string_view name = precision_name(p);
    SCOPED_TRACE(std::string(name));
    const bool mixed = name.size() > 6 && name.substr(name.size() - 6) == "-mixed";
    EXPECT_EQ(is_mixed(p), mixed);
    EXPECT_EQ(is_mixed(p), compute_dtype(p) != parameter_dtype(p));
  }
  EXPECT_TRUE(is_mixed(Precision::Mixed16));
  EXPECT_TRUE(is_mixed(Precision::MixedBF16));
}
