// The kernels' instruction-set level (cpu/isa.h) and its public face in ampgrad/hw/cpu.h.
#include "cpu/isa.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "ampgrad/error.h"
#include "ampgrad/hw/cpu.h"

namespace ampgrad::cpu {
namespace {

// What a level adds to the one before it, in words (the error's "this CPU lacks ...").
const char* level_needs(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::Baseline: return "nothing";
    case KernelIsa::Avx2: return "AVX2 and FMA";
    case KernelIsa::Avx512: return "AVX-512 F, BW, VL and DQ";
    case KernelIsa::Avx512Bf16: return "AVX512-BF16";
    case KernelIsa::Amx: return "AMX-TILE and AMX-BF16 (with the OS's permission)";
  }
  return "?";
}

// Whether a CPU with the features `f` has what `isa` adds to the level before it.
bool has_step(KernelIsa isa, const hw::CpuFeatures& f) {
  switch (isa) {
    case KernelIsa::Baseline: return true;
    case KernelIsa::Avx2: return f.avx2 && f.fma;
    case KernelIsa::Avx512: return f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
    case KernelIsa::Avx512Bf16: return f.avx512_bf16;
    case KernelIsa::Amx: return f.amx_tile && f.amx_bf16;  // cpu.h: only once the OS granted the tiles
  }
  return false;
}

// The levels' names, all of them or those this CPU runs, as a list for a message.
std::string names(bool supported_only) {
  std::string s;
  for (KernelIsa isa : kKernelIsas)
    if (!supported_only || kernel_isa_supported(isa)) s += (s.empty() ? "" : ", ") + std::string(kernel_isa_name(isa));
  return s;
}

}  // namespace

const char* kernel_isa_name(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::Baseline: return "baseline";
    case KernelIsa::Avx2: return "avx2";
    case KernelIsa::Avx512: return "avx512";
    case KernelIsa::Avx512Bf16: return "avx512_bf16";
    case KernelIsa::Amx: return "amx";
  }
  return "?";
}

bool kernel_isa_supported(KernelIsa isa, const hw::CpuFeatures& f) {
#if defined(__x86_64__)
  for (KernelIsa step : kKernelIsas) {
    if (step > isa) break;
    if (!has_step(step, f)) return false;
  }
  return true;
#else
  (void)f;
  return isa == KernelIsa::Baseline;  // the variants are compiled for x86-64 only
#endif
}
bool kernel_isa_supported(KernelIsa isa) { return kernel_isa_supported(isa, hw::cpu_features()); }

KernelIsa best_kernel_isa(const hw::CpuFeatures& f) {
  KernelIsa best = KernelIsa::Baseline;
  for (KernelIsa isa : kKernelIsas)
    if (kernel_isa_supported(isa, f)) best = isa;
  return best;
}
KernelIsa best_kernel_isa() { return best_kernel_isa(hw::cpu_features()); }

KernelIsa parse_kernel_isa(std::string_view name, const char* source) {
  for (KernelIsa isa : kKernelIsas) {
    if (name != kernel_isa_name(isa)) continue;
    if (!kernel_isa_supported(isa)) {
#if defined(__x86_64__)
      KernelIsa missing = isa;
      for (KernelIsa step : kKernelIsas)
        if (step <= isa && !has_step(step, hw::cpu_features())) {
          missing = step;
          break;
        }
      AG_ERROR("kernel ISA", source, name, ": this CPU lacks ", level_needs(missing), " (it runs ", names(true), ")");
#else
      AG_ERROR("kernel ISA", source, name, ": a build off x86-64 has only the baseline kernels");
#endif
    }
    return isa;
  }
  AG_ERROR("kernel ISA", source, name, " is not one of ", names(false), " (this CPU runs ", names(true), ")");
}

KernelIsa kernel_isa_from_env(const char* value) {
  return value == nullptr || *value == '\0' ? best_kernel_isa() : parse_kernel_isa(value, "AMPGRAD_KERNEL_ISA=");
}

namespace isa_internal {

constinit std::atomic<uint8_t> kernel_isa_now{kKernelIsaUnset};

KernelIsa init_kernel_isa() {
  const KernelIsa isa = kernel_isa_from_env(std::getenv("AMPGRAD_KERNEL_ISA"));
  // A set_kernel_isa that came in between wins.
  uint8_t expected = kKernelIsaUnset;
  kernel_isa_now.compare_exchange_strong(expected, uint8_t(isa), std::memory_order_relaxed);
  return KernelIsa(kernel_isa_now.load(std::memory_order_relaxed));
}

}  // namespace isa_internal
}  // namespace ampgrad::cpu

namespace ampgrad::hw {

std::vector<std::string> kernel_isas() {
  std::vector<std::string> names;
  for (cpu::KernelIsa isa : cpu::kKernelIsas) names.emplace_back(cpu::kernel_isa_name(isa));
  return names;
}
std::string kernel_isa() { return cpu::kernel_isa_name(cpu::kernel_isa()); }
std::string best_kernel_isa() { return cpu::kernel_isa_name(cpu::best_kernel_isa()); }
void set_kernel_isa(std::string_view name) {
  cpu::isa_internal::kernel_isa_now.store(uint8_t(cpu::parse_kernel_isa(name, "")), std::memory_order_relaxed);
}

}  // namespace ampgrad::hw
