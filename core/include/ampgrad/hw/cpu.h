// ampgrad/hw/cpu.h — x86 CPU feature detection.
//
// A feature is reported only when the CPU advertises it (cpuid) AND the
// operating system has enabled the register state it needs (XGETBV/XCR0):
//   AVX, AVX2, FMA, F16C        need XMM|YMM state
//   AVX-512 (incl. BF16/FP16)   additionally need opmask|ZMM_Hi256|Hi16_ZMM
//   AMX                         need XTILECFG|XTILEDATA, and on Linux the
//                               process must obtain permission via
//                               arch_prctl(ARCH_REQ_XCOMP_PERM); if that is
//                               refused the AMX flags stay false.
// So a `true` flag means "instructions of this kind can be executed now".
// On non-x86 builds every flag is false (vendor/model empty, cores still set).
#pragma once

#include <string>

namespace ampgrad::hw {

struct CpuFeatures {
  std::string vendor;      ///< cpuid leaf 0, e.g. "GenuineIntel", "AuthenticAMD"
  std::string model_name;  ///< brand string (leaves 0x80000002-4), whitespace-trimmed
  int logical_cores = 0;   ///< std::thread::hardware_concurrency()

  bool sse42 = false, avx = false, avx2 = false, fma = false, f16c = false,
       avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false,
       avx512_bf16 = false, avx512_fp16 = false, amx_tile = false, amx_bf16 = false,
       amx_fp16 = false;

  bool operator==(const CpuFeatures&) const = default;
};

/// Features of the executing CPU, detected once (thread-safe) and cached.
const CpuFeatures& cpu_features();

/// Runs the detection again, uncached (for tests and diagnostics).
CpuFeatures detect_cpu_features();

}  // namespace ampgrad::hw
