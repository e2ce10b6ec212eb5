#include "ampgrad/hw/cpu.h"

#include <cstdint>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace ampgrad::hw {

namespace {

#if defined(__x86_64__) || defined(__i386__)

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned subleaf = 0) {
  Regs r;
  // Returns 0 (leaving r zeroed) when the leaf is beyond the maximum supported.
  if (!__get_cpuid_count(leaf, subleaf, &r.a, &r.b, &r.c, &r.d)) r = Regs{};
  return r;
}

bool bit(unsigned reg, int n) { return (reg >> n) & 1u; }

// Inline asm rather than _xgetbv() so this file needs no -mxsave flag or target attribute.
uint64_t xgetbv0() {
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

std::string trim(std::string s) {
  const char* ws = " \t\n\r\f\v";
  const auto first = s.find_first_not_of(ws);
  if (first == std::string::npos) return {};
  return s.substr(first, s.find_last_not_of(ws) - first + 1);
}

// Linux keeps AMX tile data disabled per process until requested.
bool request_amx_permission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return true;  // other OSes enable XCR0 state globally; XCR0 was already checked
#endif
}

void detect_x86(CpuFeatures& f) {
  const Regs l0 = cpuid(0);
  const unsigned max_leaf = l0.a;
  {
    char v[13] = {};
    const unsigned parts[3] = {l0.b, l0.d, l0.c};
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j) v[i * 4 + j] = static_cast<char>((parts[i] >> (8 * j)) & 0xFF);
    f.vendor = v;
  }
  if (cpuid(0x80000000u).a >= 0x80000004u) {
    std::string brand;
    for (unsigned leaf = 0x80000002u; leaf <= 0x80000004u; ++leaf) {
      const Regs r = cpuid(leaf);
      for (unsigned reg : {r.a, r.b, r.c, r.d})
        for (int j = 0; j < 4; ++j) brand += static_cast<char>((reg >> (8 * j)) & 0xFF);
    }
    f.model_name = trim(brand.substr(0, brand.find('\0')));
  }
  if (max_leaf < 1) return;

  const Regs l1 = cpuid(1);
  f.sse42 = bit(l1.c, 20);

  uint64_t xcr0 = 0;
  if (bit(l1.c, 27)) xcr0 = xgetbv0();  // OSXSAVE: XGETBV is usable
  const bool os_avx = (xcr0 & 0x6) == 0x6;               // XMM | YMM
  const bool os_avx512 = os_avx && (xcr0 & 0xE0) == 0xE0;  // opmask | ZMM_Hi256 | Hi16_ZMM
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;        // XTILECFG | XTILEDATA

  f.avx = os_avx && bit(l1.c, 28);
  f.fma = f.avx && bit(l1.c, 12);
  f.f16c = f.avx && bit(l1.c, 29);

  if (max_leaf < 7) return;
  const Regs l7 = cpuid(7, 0);
  const Regs l7s1 = l7.a >= 1 ? cpuid(7, 1) : Regs{};

  f.avx2 = f.avx && bit(l7.b, 5);
  f.avx512f = os_avx512 && bit(l7.b, 16);
  f.avx512dq = f.avx512f && bit(l7.b, 17);
  f.avx512bw = f.avx512f && bit(l7.b, 30);
  f.avx512vl = f.avx512f && bit(l7.b, 31);
  f.avx512_fp16 = f.avx512f && bit(l7.d, 23);
  f.avx512_bf16 = f.avx512f && bit(l7s1.a, 5);

  const bool cpu_amx = bit(l7.d, 24);
  if (cpu_amx && os_amx && request_amx_permission()) {
    f.amx_tile = true;
    f.amx_bf16 = bit(l7.d, 22);
    f.amx_fp16 = bit(l7s1.a, 21);
  }
}

#endif  // x86

}  // namespace

CpuFeatures detect_cpu_features() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  detect_x86(f);
#endif
  f.logical_cores = static_cast<int>(std::thread::hardware_concurrency());
  return f;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect_cpu_features();
  return features;
}

}  // namespace ampgrad::hw
