// Consistency checks for ampgrad/hw/cpu.h. They cannot assume a particular
// CPU, so they check implications that every correct detection satisfies, and
// cross-check against what the kernel reports in /proc/cpuinfo where present.
// The kernels' instruction-set level (hw::kernel_isa): its levels against the flags, the
// switch, its refusals, AMPGRAD_KERNEL_ISA, and run_variant's choice by the level.
#include "support/testing.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ampgrad/hw/cpu.h"
#include "ampgrad/hw/profile.h"
#include "cpu/isa.h"

namespace {

using ampgrad::hw::cpu_features;
using ampgrad::hw::CpuFeatures;
using ampgrad::hw::detect_cpu_features;

constexpr bool kX86 =
#if defined(__x86_64__) || defined(__i386__)
    true;
#else
    false;
#endif

TEST(CpuFeatures, CachedEqualsFreshDetection) {
  const CpuFeatures& a = cpu_features();
  EXPECT_EQ(&a, &cpu_features()) << "cpu_features() must return one cached object";
  EXPECT_TRUE(a == detect_cpu_features());
}

TEST(CpuFeatures, BasicFields) {
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(f.logical_cores, static_cast<int>(std::thread::hardware_concurrency()));
  if (!kX86) {
    EXPECT_FALSE(f.sse42 || f.avx || f.avx512f || f.amx_tile);
    AGT_SKIP_HARDWARE() << "non-x86 build: no cpuid";
  }
  std::cout << "[ info     ] " << f.vendor << " / " << f.model_name << " / " << f.logical_cores
            << " threads; avx2=" << f.avx2 << " f16c=" << f.f16c << " avx512f=" << f.avx512f
            << " avx512_bf16=" << f.avx512_bf16 << " avx512_fp16=" << f.avx512_fp16
            << " amx_tile=" << f.amx_tile << "\n";
  EXPECT_EQ(f.vendor.size(), 12u) << "vendor '" << f.vendor << "'";
  EXPECT_FALSE(f.model_name.empty());
  if (!f.model_name.empty()) {
    EXPECT_NE(f.model_name.front(), ' ') << "not trimmed: '" << f.model_name << "'";
    EXPECT_NE(f.model_name.back(), ' ') << "not trimmed: '" << f.model_name << "'";
    EXPECT_EQ(f.model_name.find('\0'), std::string::npos);
  }
}

TEST(CpuFeatures, Implications) {
  const CpuFeatures& f = cpu_features();
  auto implies = [](bool a, bool b) { return !a || b; };
  EXPECT_TRUE(implies(f.avx2, f.avx));
  EXPECT_TRUE(implies(f.fma, f.avx));
  EXPECT_TRUE(implies(f.f16c, f.avx));
  EXPECT_TRUE(implies(f.avx512f, f.avx2)) << "every AVX-512 CPU has AVX2 (and the OS must enable YMM)";
  for (bool sub : {f.avx512bw, f.avx512vl, f.avx512dq, f.avx512_bf16, f.avx512_fp16})
    EXPECT_TRUE(implies(sub, f.avx512f));
  EXPECT_TRUE(implies(f.avx512_fp16, f.avx512bw && f.avx512vl));
  EXPECT_TRUE(implies(f.amx_bf16, f.amx_tile));
  EXPECT_TRUE(implies(f.amx_fp16, f.amx_tile));
}

// /proc/cpuinfo lists what the CPU and kernel support; our flags additionally
// need OS state (XCR0) and, for AMX, a per-process permission, so each of our
// flags must appear there, and on a normal Linux system the converse holds
// for the non-AMX ones as well.
TEST(CpuFeatures, AgreesWithProcCpuinfo) {
  if (!kX86) AGT_SKIP_HARDWARE() << "non-x86 build: no cpuid";
  std::ifstream in("/proc/cpuinfo");
  std::string line, vendor, model, flags_line;
  while (std::getline(in, line)) {
    if (vendor.empty() && line.rfind("vendor_id", 0) == 0) vendor = line.substr(line.find(':') + 2);
    if (model.empty() && line.rfind("model name", 0) == 0) model = line.substr(line.find(':') + 2);
    if (flags_line.empty() && line.rfind("flags", 0) == 0) flags_line = line.substr(line.find(':') + 1);
  }
  if (flags_line.empty()) AGT_SKIP_HARDWARE() << "no flags line in /proc/cpuinfo to compare with";
  std::set<std::string> flags;
  std::istringstream ss(flags_line);
  for (std::string w; ss >> w;) flags.insert(w);
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(f.vendor, vendor);
  if (!model.empty() && model != "unknown") {
    EXPECT_EQ(f.model_name, model);  // Linux trims the brand string too
  }
  const struct {
    bool ours;
    const char* name;
  } pairs[] = {{f.sse42, "sse4_2"},         {f.avx, "avx"},
               {f.avx2, "avx2"},            {f.fma, "fma"},
               {f.f16c, "f16c"},            {f.avx512f, "avx512f"},
               {f.avx512bw, "avx512bw"},    {f.avx512vl, "avx512vl"},
               {f.avx512dq, "avx512dq"},    {f.avx512_bf16, "avx512_bf16"},
               {f.avx512_fp16, "avx512_fp16"}};
  for (const auto& p : pairs) EXPECT_EQ(p.ours, flags.count(p.name) == 1) << p.name;
  EXPECT_TRUE(!f.amx_tile || flags.count("amx_tile"));
  EXPECT_TRUE(!f.amx_bf16 || flags.count("amx_bf16"));
  EXPECT_TRUE(!f.amx_fp16 || flags.count("amx_fp16"));
}

// Concurrent first use must be safe and give one object (run under TSan/ASan).
TEST(CpuFeatures, ThreadSafeAccess) {
  std::vector<std::thread> threads;
  std::vector<const CpuFeatures*> seen(8);
  for (size_t i = 0; i < seen.size(); ++i) threads.emplace_back([&, i] { seen[i] = &cpu_features(); });
  for (auto& t : threads) t.join();
  for (auto* p : seen) EXPECT_EQ(p, &cpu_features());
}

// ---- the kernels' instruction-set level ---------------------------------------------

constexpr bool kX86_64 =
#if defined(__x86_64__)
    true;
#else
    false;
#endif

// What each level needs beyond the one before it, as the refusals say it.
const std::pair<const char*, const char*> kLevels[] = {{"baseline", ""},
                                                       {"avx2", "AVX2 and FMA"},
                                                       {"avx512", "AVX-512 F, BW, VL and DQ"},
                                                       {"avx512_bf16", "AVX512-BF16"},
                                                       {"amx", "AMX-TILE and AMX-BF16"}};

// The number of levels this CPU runs, from its flags: each level needs what the ones before
// it need (the variants exist on x86-64 only).
size_t levels_run() {
  const CpuFeatures& f = cpu_features();
  const bool step[] = {true, kX86_64 && f.avx2 && f.fma, f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq,
                       f.avx512_bf16, f.amx_tile && f.amx_bf16};
  size_t n = 0;
  while (n < std::size(step) && step[n]) ++n;
  return n;
}

TEST(KernelIsa, LevelsFollowTheCpuFeatures) {
  std::vector<std::string> names;
  for (const auto& l : kLevels) names.push_back(l.first);
  EXPECT_EQ(ampgrad::hw::kernel_isas(), names);
  EXPECT_EQ(ampgrad::hw::best_kernel_isa(), names[levels_run() - 1]);
}

// Every level the CPU runs is taken and reported back; a wider one is refused with what the
// CPU lacks and the levels it runs, and changes nothing; so is a name that is no level.
TEST(KernelIsa, SwitchesToTheLevelsTheCpuRunsAndRefusesTheOthers) {
  namespace hw = ampgrad::hw;
  const std::string before = hw::kernel_isa();
  const size_t run = levels_run();
  std::string runs;
  for (size_t i = 0; i < run; ++i) runs += (i ? ", " : "") + std::string(kLevels[i].first);
  for (size_t i = 0; i < std::size(kLevels); ++i) {
    const std::string name = kLevels[i].first;
    if (i < run) {
      hw::set_kernel_isa(name);
      EXPECT_EQ(hw::kernel_isa(), name);
      continue;
    }
    hw::set_kernel_isa("baseline");
    EXPECT_AG_ERROR(hw::set_kernel_isa(name), "[kernel ISA] " + name + ": this CPU lacks " + kLevels[run].second);
    EXPECT_AG_ERROR(hw::set_kernel_isa(name), "(it runs " + runs + ")");
    EXPECT_EQ(hw::kernel_isa(), "baseline");
  }
  for (const char* bad : {"avx1024", "none", "AVX512", ""})
    EXPECT_AG_ERROR(hw::set_kernel_isa(bad), std::string("[kernel ISA] ") + bad +
                                                 " is not one of baseline, avx2, avx512, avx512_bf16, amx (this CPU runs " +
                                                 runs + ")");
  hw::set_kernel_isa(before);
}

// The initial level from the environment variable's value: unset or empty is the widest.
TEST(KernelIsa, EnvironmentValues) {
  namespace cpu = ampgrad::cpu;
  EXPECT_EQ(cpu::kernel_isa_from_env(nullptr), cpu::best_kernel_isa());
  EXPECT_EQ(cpu::kernel_isa_from_env(""), cpu::best_kernel_isa());
  EXPECT_EQ(cpu::kernel_isa_from_env("baseline"), cpu::KernelIsa::Baseline);
  EXPECT_AG_ERROR(cpu::kernel_isa_from_env("avx-512"), "[kernel ISA] AMPGRAD_KERNEL_ISA=avx-512 is not one of");
  if (levels_run() < std::size(kLevels))
    EXPECT_AG_ERROR(cpu::kernel_isa_from_env("amx"), "[kernel ISA] AMPGRAD_KERNEL_ISA=amx: this CPU lacks");
}

// The level in force: AMPGRAD_KERNEL_ISA's, else the widest (every test that switches it
// switches it back). The next test runs this one in a child process with the variable set.
TEST(KernelIsa, StartsAtTheEnvironmentsLevel) {
  const char* env = std::getenv("AMPGRAD_KERNEL_ISA");
  EXPECT_EQ(ampgrad::hw::kernel_isa(), env && *env ? std::string(env) : ampgrad::hw::best_kernel_isa());
}

TEST(KernelIsa, EnvironmentVariableSetsTheLevelOrIsRefused) {
  const auto child = [](const std::string& value, int& status) {
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();  // this test binary
    const std::string cmd =
        "AMPGRAD_KERNEL_ISA=" + value + " '" + self + "' --gtest_filter=KernelIsa.StartsAtTheEnvironmentsLevel 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    while (p && std::fgets(buf, sizeof buf, p)) out += buf;
    status = p ? pclose(p) : -1;
    return out;
  };
  int status = -1;
  const std::string ok = child("baseline", status);
  EXPECT_EQ(status, 0) << ok;
  EXPECT_TRUE(agt::contains(ok, "[  PASSED  ] 1 test")) << ok;
  const std::string bad = child("avx-512", status);
  EXPECT_NE(status, 0) << bad;
  EXPECT_TRUE(agt::contains(bad, "[kernel ISA] AMPGRAD_KERNEL_ISA=avx-512 is not one of baseline, avx2")) << bad;
}

// run_variant, the kernels' one choice between a generic function and its AVX-512 twin,
// follows the level that the CPU's features give: a CPU reported without AVX-512 (the fake
// profiles' AVX2 machine, or this CPU with AVX-512 F cleared) runs the generic function, one
// with it the twin. Plain functions stand in for the two variants.
const char* g_ran = nullptr;
int g_arg = 0;
void generic_variant(int x) { g_ran = "generic", g_arg = x; }
void avx512_variant(int x) { g_ran = "avx512", g_arg = x; }
int generic_plus_one(int x) { return x + 1; }
int avx512_plus_two(int x) { return x + 2; }

std::string ran_at(ampgrad::cpu::KernelIsa level) {
  g_ran = nullptr, g_arg = 0;
  ampgrad::cpu::run_variant_at<generic_variant, avx512_variant>(level, 7);
  EXPECT_EQ(g_arg, 7) << "the arguments reach the variant";
  return g_ran ? g_ran : "neither";
}

TEST(KernelIsa, RunVariantRunsTheGenericFunctionWhereAvx512IsReportedMissing) {
  namespace cpu = ampgrad::cpu;
  namespace hw = ampgrad::hw;
  CpuFeatures this_without_avx512f = cpu_features();
  this_without_avx512f.avx512f = false;
  for (const CpuFeatures& f : {hw::profiles::cpu_without_avx512().cpu, this_without_avx512f}) {
    const cpu::KernelIsa level = cpu::best_kernel_isa(f);
    SCOPED_TRACE(f.model_name + " at " + cpu::kernel_isa_name(level));
    EXPECT_LT(level, cpu::KernelIsa::Avx512);
    EXPECT_EQ(ran_at(level), "generic");
  }
  for (const hw::HardwareProfile& p : {hw::profiles::cpu_avx512_bf16(), hw::profiles::cpu_amx()}) {
    const cpu::KernelIsa level = cpu::best_kernel_isa(p.cpu);
    SCOPED_TRACE(p.cpu.model_name + " at " + cpu::kernel_isa_name(level));
    // Off x86-64 every CPU is at the baseline: the twins are compiled for x86-64 only.
    EXPECT_EQ(ran_at(level), kX86_64 ? "avx512" : "generic");
  }
  for (cpu::KernelIsa level : cpu::kKernelIsas)
    EXPECT_EQ(ran_at(level), level >= cpu::KernelIsa::Avx512 ? "avx512" : "generic") << cpu::kernel_isa_name(level);
  EXPECT_EQ((cpu::run_variant_at<generic_plus_one, avx512_plus_two>(cpu::KernelIsa::Avx2, 1)), 2);
  EXPECT_EQ((cpu::run_variant_at<generic_plus_one, avx512_plus_two>(cpu::KernelIsa::Avx512, 1)), 3);
}

// run_variant reads the level in force at each call, so hw::set_kernel_isa switches it: the
// generic function at the baseline (which every CPU runs), the twin at avx512.
TEST(KernelIsa, RunVariantFollowsTheLevelInForce) {
  namespace cpu = ampgrad::cpu;
  const auto ran = [] {
    g_ran = nullptr;
    cpu::run_variant<generic_variant, avx512_variant>(1);
    return std::string(g_ran ? g_ran : "neither");
  };
  EXPECT_EQ(agt::at_kernel_isa("baseline", ran), "generic");
  if (!cpu::kernel_isa_supported(cpu::KernelIsa::Avx512))
    AGT_SKIP_HARDWARE() << "this CPU lacks AVX-512 F, BW, VL and DQ: the level avx512 cannot be put in force";
  EXPECT_EQ(agt::at_kernel_isa("avx512", ran), "avx512");
  EXPECT_EQ(ran(), cpu::kernel_isa() >= cpu::KernelIsa::Avx512 ? "avx512" : "generic");
}

}  // namespace
