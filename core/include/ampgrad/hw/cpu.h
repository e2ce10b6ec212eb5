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
#include <string_view>

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

/// The instruction set that the CPU elementwise kernels' float32 math (exp, log, log1p,
/// tanh, sigmoid, GELU, SiLU, pow and the activation gradients, on float32, bfloat16 and
/// float16 tensors) runs with: "avx512", "avx2" or "sse2" (SLEEF's vector functions, chosen
/// at run time), or "none" (the scalar functors; a build without SLEEF or off x86-64).
/// conv2d_block's pooling follows it too: AVX-512 with "avx512", plain loops otherwise.
/// The environment variable AMPGRAD_VMATH sets the initial value.
std::string vector_math_isa();
/// The widest set this build and CPU can run (what vector_math_isa() starts as).
std::string best_vector_math_isa();
/// Switches the set for the whole process (for before/after measurements and tests): one of
/// the names above that this build and CPU run, else an ag::Error naming what they run.
/// Not meant to be called while kernels run on other threads.
void set_vector_math_isa(std::string_view name);

}  // namespace ampgrad::hw
