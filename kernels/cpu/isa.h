// The instruction-set level of the CPU kernels' own variants (hw::kernel_isa, ampgrad/hw/cpu.h).
//
// The library is built for baseline x86-64; the kernels' hot loops are also compiled for
// wider sets by target attributes (AG_AVX512_TARGET in avx512.h, attention's AVX2 row work,
// tile_gemm_small.cpp, tile_gemm_bf16.cpp, transpose16.h) and each call site picks a variant
// from the level here (run_variant, for a function and its AVX-512 twin): one process-wide
// value, read with a relaxed atomic load (no string, no cpuid on the hot path), set from
// AMPGRAD_KERNEL_ISA at first use or by hw::set_kernel_isa. The levels are cumulative, each
// a class of real machines.
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>
#include <utility>

namespace ampgrad::hw {
struct CpuFeatures;
}

namespace ampgrad::cpu {

/// Narrowest first; each level has every variant of the levels before it.
///   Baseline    the build's own flags (x86-64: SSE2); every machine, and the only level
///               off x86-64
///   Avx2        attention's row work for AVX2 with FMA
///   Avx512      the AVX-512 (F, BW, VL, DQ) variants: row work, layer norm, softmax, cross
///               entropy, Adam, the random fills, the four-row sums of the reductions, the
///               transposes, conv2d_block's pooling, tile_gemm's small kernel
///   Avx512Bf16  bfloat16 products on VDPBF16PS (tile_gemm_bf16; attention's bfloat16 path)
///   Amx         the same products on AMX-BF16 tiles
enum class KernelIsa : uint8_t { Baseline, Avx2, Avx512, Avx512Bf16, Amx };
inline constexpr KernelIsa kKernelIsas[] = {KernelIsa::Baseline, KernelIsa::Avx2, KernelIsa::Avx512,
                                            KernelIsa::Avx512Bf16, KernelIsa::Amx};

/// "baseline", "avx2", "avx512", "avx512_bf16", "amx".
const char* kernel_isa_name(KernelIsa isa);
/// True when this CPU runs every instruction the level needs (and so every level below it).
bool kernel_isa_supported(KernelIsa isa);
/// The same for a CPU with the features `f` (hw::cpu_features() is this one's).
bool kernel_isa_supported(KernelIsa isa, const hw::CpuFeatures& f);
/// The widest level this CPU runs.
KernelIsa best_kernel_isa();
/// The widest level a CPU with the features `f` runs.
KernelIsa best_kernel_isa(const hw::CpuFeatures& f);
/// The level called `name`, or an ag::Error that names it and says why not (unknown, or
/// what this CPU lacks, with the levels it runs). `source` prefixes the name in the message
/// ("AMPGRAD_KERNEL_ISA=" for the environment's value).
KernelIsa parse_kernel_isa(std::string_view name, const char* source);
/// The initial level for the environment variable's value: best_kernel_isa() when it is
/// unset (null) or empty, else parse_kernel_isa(value, "AMPGRAD_KERNEL_ISA=").
KernelIsa kernel_isa_from_env(const char* value);

namespace isa_internal {
inline constexpr uint8_t kKernelIsaUnset = 0xFF;
/// The level in force, kKernelIsaUnset until the first read (constant-initialized, so any
/// static initializer may read it).
extern std::atomic<uint8_t> kernel_isa_now;
/// Sets kernel_isa_now from AMPGRAD_KERNEL_ISA if still unset, and returns the level.
KernelIsa init_kernel_isa();
}  // namespace isa_internal

/// The level in force. The first read takes AMPGRAD_KERNEL_ISA (and throws for a bad value);
/// CpuBackend's constructor makes it, so that it never happens first inside a parallel region.
inline KernelIsa kernel_isa() {
  const uint8_t v = isa_internal::kernel_isa_now.load(std::memory_order_relaxed);
  return v != isa_internal::kKernelIsaUnset ? KernelIsa(v) : isa_internal::init_kernel_isa();
}

/// Whether the kernels run their AG_AVX512_TARGET variants (level Avx512 or wider).
inline bool use_avx512() { return kernel_isa() >= KernelIsa::Avx512; }

/// run_variant at the level `level` rather than the one in force: Avx512(args...) at avx512
/// or wider, else Generic(args...).
template <auto Generic, auto Avx512, class... Args>
[[gnu::always_inline]] inline decltype(auto) run_variant_at(KernelIsa level, Args&&... args) {
  if (level >= KernelIsa::Avx512) return Avx512(std::forward<Args>(args)...);
  return Generic(std::forward<Args>(args)...);
}

/// How a kernel runs the variant of the level in force: Avx512(args...), its twin compiled
/// with AG_AVX512_TARGET (avx512.h), where use_avx512(), else Generic(args...). The level is
/// read at each call, never kept (hw::set_kernel_isa takes effect at the next call); the two
/// functions are template arguments, so both calls are direct and the generic one inlines.
/// Off x86-64 the level is always baseline and the twin is never called.
template <auto Generic, auto Avx512, class... Args>
[[gnu::always_inline]] inline decltype(auto) run_variant(Args&&... args) {
  return run_variant_at<Generic, Avx512>(kernel_isa(), std::forward<Args>(args)...);
}

}  // namespace ampgrad::cpu
