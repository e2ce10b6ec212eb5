// The hardware profile and its verdicts. Verdicts are checked on the fake profiles (a T4,
// an A100, an H200, CPUs without AVX-512, with AVX512-BF16, with AMX), so every branch runs
// on any machine; query() is checked only for what holds everywhere (cached, consistent
// with cpu_features(), no throw without a GPU).
#include <ampgrad/ampgrad.h>

#include <thread>

#include "support/testing.h"

namespace hw = ag::hw;
using hw::Support;

namespace {

bool contains(const std::string& s, const std::string& sub) {
  return s.find(sub) != std::string::npos;
}

Support support(const hw::HardwareProfile& p, ag::Device d, ag::DType dt) {
  return hw::verdict(p, d, dt).support;
}

}  // namespace

TEST(HwProfile, QueryIsCachedAndConsistentWithCpuFeatures) {
  const hw::HardwareProfile* a = nullptr;
  std::thread t([&] { a = &hw::query(); });
  const hw::HardwareProfile* b = &hw::query();
  t.join();
  EXPECT_EQ(a, b);
  EXPECT_EQ(&hw::query(), b);
  EXPECT_EQ(b->cpu, hw::cpu_features());
  EXPECT_EQ(b->built_with_cuda, ag::built_with_cuda());
  EXPECT_EQ(b->built_with_onednn, ag::built_with_onednn());
  EXPECT_FALSE(b->onednn_isa.empty());
  if (!ag::built_with_onednn()) {
    EXPECT_EQ(b->onednn_isa, "none (built without oneDNN)");
  }
}

TEST(HwProfile, NoCudaIsAnEmptyListNotAnError) {
  std::vector<hw::CudaDevice> devs;
  EXPECT_NO_THROW(devs = hw::detail::query_cuda_devices());
  if (!ag::built_with_cuda()) {
    EXPECT_TRUE(devs.empty());
  }
  EXPECT_EQ(devs, hw::query().cuda);
  for (size_t i = 0; i < devs.size(); ++i) {
    EXPECT_EQ(devs[i].index, int(i));
    EXPECT_FALSE(devs[i].name.empty());
    EXPECT_GT(devs[i].major, 0);
    EXPECT_GT(devs[i].total_memory, 0u);
    EXPECT_GT(devs[i].sm_count, 0);
  }
  // Whatever this machine has, every verdict is an answer with a reason, never a throw.
  for (auto dt : {ag::kFloat32, ag::kFloat16, ag::kBFloat16, ag::kFloat64})
    for (ag::Device d : {ag::Device(ag::kCPU), ag::Device(ag::kCUDA, 0)}) {
      hw::Verdict v{Support::Unsupported, ""};
      EXPECT_NO_THROW(v = hw::verdict(hw::query(), d, dt));
      EXPECT_FALSE(v.reason.empty());
    }
  if (hw::query().cuda.empty()) {
    EXPECT_EQ(support(hw::query(), ag::Device(ag::kCUDA, 0), ag::kFloat32), Support::Unsupported);
  }
}

TEST(HwProfile, SupportNames) {
  EXPECT_STREQ(hw::support_name(Support::Native), "native");
  EXPECT_STREQ(hw::support_name(Support::Emulated), "emulated");
  EXPECT_STREQ(hw::support_name(Support::Unsupported), "unsupported");
}

TEST(HwProfile, DerivedCudaFeatures) {
  auto dev = [](int major, int minor) { return hw::CudaDevice{0, "x", major, minor, 1, 1}; };
  EXPECT_FALSE(dev(6, 1).fp16_tensor_cores());
  EXPECT_TRUE(dev(7, 0).fp16_tensor_cores());
  EXPECT_FALSE(dev(7, 5).bf16_native());
  EXPECT_FALSE(dev(7, 5).tf32());
  EXPECT_TRUE(dev(8, 0).bf16_native());
  EXPECT_TRUE(dev(8, 0).tf32());
  EXPECT_FALSE(dev(8, 0).fp8());
  EXPECT_FALSE(dev(8, 6).fp8());
  EXPECT_TRUE(dev(8, 9).fp8());  // Ada: L4, L40, RTX 4090
  EXPECT_TRUE(dev(9, 0).fp8());
  EXPECT_EQ(dev(7, 5).compute_capability(), "7.5");
}

TEST(HwProfileFake, T4) {
  const auto p = hw::profiles::t4();
  ASSERT_EQ(p.cuda.size(), 1u);
  const auto& d = p.cuda[0];
  EXPECT_EQ(d.name, "Tesla T4");
  EXPECT_EQ(d.major * 10 + d.minor, 75);
  EXPECT_EQ(d.sm_count, 40);
  EXPECT_NEAR(double(d.total_memory) / 1e9, 16.0, 0.5);
  EXPECT_TRUE(d.fp16_tensor_cores());
  EXPECT_FALSE(d.bf16_native());
  EXPECT_FALSE(d.tf32());
  EXPECT_FALSE(d.fp8());

  const ag::Device cuda0(ag::kCUDA, 0);
  EXPECT_EQ(support(p, cuda0, ag::kFloat16), Support::Native);
  EXPECT_EQ(support(p, cuda0, ag::kFloat32), Support::Native);
  EXPECT_EQ(support(p, cuda0, ag::kFloat64), Support::Native);
  const auto bf16 = hw::verdict(p, cuda0, ag::kBFloat16);
  EXPECT_EQ(bf16.support, Support::Emulated);  // not "supported" as is_bf16_supported() says
  EXPECT_TRUE(contains(bf16.reason, "compute capability 7.5")) << bf16.reason;
  EXPECT_TRUE(contains(bf16.reason, "float32")) << bf16.reason;
}

TEST(HwProfileFake, A100AndH200) {
  for (const auto& [p, name, cc, sms, fp8] :
       {std::tuple{hw::profiles::a100(), "A100", 80, 108, false},
        std::tuple{hw::profiles::h200(), "H200", 90, 132, true}}) {
    SCOPED_TRACE(name);
    ASSERT_FALSE(p.cuda.empty());
    EXPECT_TRUE(p.built_with_cuda);
    for (size_t i = 0; i < p.cuda.size(); ++i) {
      const auto& d = p.cuda[i];
      EXPECT_EQ(d.index, int(i));
      EXPECT_TRUE(contains(d.name, name));
      EXPECT_EQ(d.major * 10 + d.minor, cc);
      EXPECT_EQ(d.sm_count, sms);
      EXPECT_TRUE(d.fp16_tensor_cores());
      EXPECT_TRUE(d.bf16_native());
      EXPECT_TRUE(d.tf32());
      EXPECT_EQ(d.fp8(), fp8);
      for (auto dt : {ag::kFloat32, ag::kFloat16, ag::kBFloat16, ag::kFloat64})
        EXPECT_EQ(support(p, ag::Device(ag::kCUDA, int(i)), dt), Support::Native) << dt;
    }
  }
  EXPECT_NEAR(double(hw::profiles::a100().cuda[0].total_memory) / (1 << 30), 80.0, 1.0);
  EXPECT_NEAR(double(hw::profiles::h200().cuda[0].total_memory) / 1e9, 141.0, 12.0);
}

TEST(HwProfileFake, CpuWithoutAvx512) {
  const auto p = hw::profiles::cpu_without_avx512();
  EXPECT_FALSE(p.cpu.avx512f);
  EXPECT_TRUE(p.cpu.avx2);
  EXPECT_TRUE(p.cuda.empty());
  EXPECT_EQ(support(p, ag::kCPU, ag::kFloat32), Support::Native);
  EXPECT_EQ(support(p, ag::kCPU, ag::kFloat64), Support::Native);
  const auto bf16 = hw::verdict(p, ag::kCPU, ag::kBFloat16);
  EXPECT_EQ(bf16.support, Support::Emulated);
  EXPECT_TRUE(contains(bf16.reason, "computed through float32")) << bf16.reason;
  const auto fp16 = hw::verdict(p, ag::kCPU, ag::kFloat16);
  EXPECT_EQ(fp16.support, Support::Emulated);
  EXPECT_TRUE(contains(fp16.reason, "F16C")) << fp16.reason;
}

TEST(HwProfileFake, CpuAvx512Bf16) {
  const auto p = hw::profiles::cpu_avx512_bf16();
  const auto bf16 = hw::verdict(p, ag::kCPU, ag::kBFloat16);
  EXPECT_EQ(bf16.support, Support::Native);
  EXPECT_TRUE(contains(bf16.reason, "AVX512-BF16")) << bf16.reason;
  EXPECT_EQ(support(p, ag::kCPU, ag::kFloat16), Support::Emulated);
}

TEST(HwProfileFake, CpuAmx) {
  const auto p = hw::profiles::cpu_amx();
  EXPECT_TRUE(p.cpu.amx_bf16);
  const auto bf16 = hw::verdict(p, ag::kCPU, ag::kBFloat16);
  EXPECT_EQ(bf16.support, Support::Native);
  EXPECT_TRUE(contains(bf16.reason, "AMX")) << bf16.reason;

  // AMX-BF16 alone (no AVX512-BF16) is still native, and says it is AMX.
  auto amx_only = p;
  amx_only.cpu.avx512_bf16 = false;
  const auto v = hw::verdict(amx_only, ag::kCPU, ag::kBFloat16);
  EXPECT_EQ(v.support, Support::Native);
  EXPECT_TRUE(contains(v.reason, "AMX-BF16")) << v.reason;

  // float16 follows AVX512-FP16 / AMX-FP16.
  auto no_fp16 = p;
  no_fp16.cpu.avx512_fp16 = no_fp16.cpu.amx_fp16 = false;
  EXPECT_EQ(support(no_fp16, ag::kCPU, ag::kFloat16), Support::Emulated);
  no_fp16.cpu.amx_fp16 = true;
  EXPECT_EQ(support(no_fp16, ag::kCPU, ag::kFloat16), Support::Native);
}

// What float32 products compute under each set_float32_matmul_precision value.
TEST(HwProfileFake, Float32Products) {
  using P = ag::Float32MatmulPrecision;
  using M = hw::Float32Math;
  const auto math = [](const hw::HardwareProfile& p, ag::Device d, P prec) { return hw::float32_products(p, d, prec).math; };
  const ag::Device cpu(ag::kCPU), gpu(ag::kCUDA, 0);
  // CPUs: bfloat16 operands under "medium" only where bfloat16 is native; never TF32.
  for (const auto& p : {hw::profiles::cpu_amx(), hw::profiles::cpu_avx512_bf16()}) {
    EXPECT_EQ(math(p, cpu, P::Highest), M::Float32);
    EXPECT_EQ(math(p, cpu, P::High), M::Float32);
    const auto v = hw::float32_products(p, cpu, P::Medium);
    EXPECT_EQ(v.support, Support::Native);
    EXPECT_EQ(v.math, M::BFloat16);
    EXPECT_TRUE(contains(v.reason, hw::verdict(p, cpu, ag::kBFloat16).reason)) << v.reason;
  }
  const auto old = hw::float32_products(hw::profiles::cpu_without_avx512(), cpu, P::Medium);
  EXPECT_EQ(old.math, M::Float32);
  EXPECT_TRUE(contains(old.reason, "not native")) << old.reason;
  EXPECT_TRUE(contains(hw::float32_products(hw::profiles::cpu_amx(), cpu, P::High).reason, "no TF32"));
  auto eigen_only = hw::profiles::cpu_amx();
  eigen_only.built_with_onednn = false;
  const auto e = hw::float32_products(eigen_only, cpu, P::Medium);
  EXPECT_EQ(e.math, M::Float32);
  EXPECT_TRUE(contains(e.reason, "without oneDNN")) << e.reason;
  // CUDA: TF32 under "high" and "medium" from compute capability 8.0.
  for (const auto& p : {hw::profiles::a100(), hw::profiles::h200()}) {
    EXPECT_EQ(math(p, gpu, P::Highest), M::Float32);
    EXPECT_EQ(math(p, gpu, P::High), M::TF32);
    EXPECT_EQ(math(p, gpu, P::Medium), M::TF32);
  }
  const auto t4 = hw::float32_products(hw::profiles::t4(), gpu, P::Medium);
  EXPECT_EQ(t4.math, M::Float32);
  EXPECT_TRUE(contains(t4.reason, "7.5")) << t4.reason;
  // A device that does not compute: unsupported, with verdict's reason.
  const auto missing = hw::float32_products(hw::profiles::a100(), ag::Device(ag::kCUDA, 8), P::Medium);
  EXPECT_EQ(missing.support, Support::Unsupported);
  EXPECT_EQ(missing.reason, hw::verdict(hw::profiles::a100(), ag::Device(ag::kCUDA, 8), ag::kFloat32).reason);
  EXPECT_EQ(hw::float32_products(hw::profiles::cpu_amx(), gpu, P::High).support, Support::Unsupported);
  EXPECT_STREQ(hw::float32_math_name(M::TF32), "tf32");
  EXPECT_STREQ(hw::float32_math_name(M::BFloat16), "bfloat16");
  EXPECT_STREQ(ag::float32_matmul_precision_name(P::High), "high");
}

TEST(HwProfileFake, CudaUnsupportedWithReason) {
  // Built without CUDA.
  const auto cpu = hw::profiles::cpu_amx();
  const auto v = hw::verdict(cpu, ag::Device(ag::kCUDA, 0), ag::kFloat32);
  EXPECT_EQ(v.support, Support::Unsupported);
  EXPECT_TRUE(contains(v.reason, "built without CUDA")) << v.reason;

  // Built with CUDA, no device.
  auto no_gpu = cpu;
  no_gpu.built_with_cuda = true;
  const auto w = hw::verdict(no_gpu, ag::Device(ag::kCUDA, 0), ag::kFloat16);
  EXPECT_EQ(w.support, Support::Unsupported);
  EXPECT_TRUE(contains(w.reason, "no CUDA device")) << w.reason;

  // An index that does not exist.
  const auto t4 = hw::profiles::t4();
  const auto x = hw::verdict(t4, ag::Device(ag::kCUDA, 3), ag::kFloat16);
  EXPECT_EQ(x.support, Support::Unsupported);
  EXPECT_TRUE(contains(x.reason, "cuda:3 does not exist")) << x.reason;
}

TEST(HwProfileFake, IntegerDtypesAreNotComputeDtypes) {
  for (const auto& name : hw::profiles::names()) {
    const auto p = hw::profiles::by_name(name);
    ASSERT_TRUE(p.has_value()) << name;
    for (auto dt : {ag::kInt64, ag::kInt32, ag::kUInt8, ag::kBool}) {
      for (ag::Device d : {ag::Device(ag::kCPU), ag::Device(ag::kCUDA, 0)}) {
        const auto v = hw::verdict(*p, d, dt);
        EXPECT_EQ(v.support, Support::Unsupported) << name << " " << d << " " << dt;
        EXPECT_FALSE(v.reason.empty());
      }
    }
  }
  const auto v = hw::verdict(hw::profiles::h200(), ag::Device(ag::kCUDA, 0), ag::kInt32);
  EXPECT_TRUE(contains(v.reason, "int32")) << v.reason;
}

TEST(HwProfileFake, ByName) {
  EXPECT_EQ(hw::profiles::by_name("t4"), hw::profiles::t4());
  EXPECT_EQ(hw::profiles::by_name("cpu_amx"), hw::profiles::cpu_amx());
  EXPECT_EQ(hw::profiles::by_name("cpu-without-avx512"), hw::profiles::cpu_without_avx512());
  EXPECT_FALSE(hw::profiles::by_name("v100").has_value());
  EXPECT_EQ(hw::profiles::names().size(), 6u);
}
