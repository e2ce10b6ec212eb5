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
#include <vector>

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
/// The environment variable AMPGRAD_VMATH sets the initial value.
std::string vector_math_isa();
/// The widest set this build and CPU can run (what vector_math_isa() starts as).
std::string best_vector_math_isa();
/// Switches the set for the whole process (for before/after measurements and tests): one of
/// the names above that this build and CPU run, else an ag::Error naming what they run.
/// Not meant to be called while kernels run on other threads.
void set_vector_math_isa(std::string_view name);

/// The instruction-set level of the CPU kernels' own variants: the row work of attention,
/// softmax, layer norm and cross entropy, the Adam step, the random fills, the reductions'
/// four-row sums, the transposes, conv2d_block's pooling, tile_gemm's small float kernel and
/// the bfloat16 products (AVX512-BF16 dot products, AMX tiles). Levels, narrowest first,
/// each running every variant of the ones before it:
///   "baseline"     the build's own flags (x86-64: SSE2); the only level off x86-64
///   "avx2"         + attention's row work for AVX2 with FMA
///   "avx512"       + the AVX-512 (F, BW, VL, DQ) variants of all of the above
///   "avx512_bf16"  + bfloat16 products on VDPBF16PS (attention's bfloat16 inputs)
///   "amx"          + those products on AMX-BF16 tiles
/// A level below the CPU's widest runs what a CPU of that class runs (for tests and
/// before/after measurements): "avx512" on an AMX machine turns the bfloat16 products off
/// too, and attention then multiplies bfloat16 inputs widened to float. oneDNN chooses its
/// own (ONEDNN_MAX_CPU_ISA), and the dtype conversions theirs (convert.h's ConvertPath).
///
/// A switch of its own, not the vector math's above, though the names they share mean the
/// same instructions: the vector math's sets depend on the build (SLEEF; its "none" is the
/// scalar functors, the only set of a build without SLEEF), while these variants are
/// compiled into every x86-64 build by target attributes, so one switch would pin them to
/// the baseline in a build without SLEEF; and these have levels past AVX-512 that the
/// vector math has no use for. To run the CPU backend as a machine without AVX-512 would,
/// set both (AMPGRAD_VMATH=avx2 AMPGRAD_KERNEL_ISA=avx2).
///
/// The environment variable AMPGRAD_KERNEL_ISA sets the initial value (read with the first
/// CPU tensor; a level this CPU lacks, or an unknown name, is an ag::Error then).
std::string kernel_isa();
/// Every level's name, narrowest first (the list above).
std::vector<std::string> kernel_isas();
/// The widest level this CPU runs (what kernel_isa() starts as).
std::string best_kernel_isa();
/// Switches the level for the whole process: one of the names above that this CPU runs,
/// else an ag::Error naming what it lacks and the levels it runs. The kernels read the level
/// at each call (a relaxed load of one byte): not meant to be called while kernels run on
/// other threads.
void set_kernel_isa(std::string_view name);

}  // namespace ampgrad::hw
