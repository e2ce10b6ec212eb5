// ampgrad/convert.h — bulk conversions between float and the 16-bit types.
//
// Every path produces exactly the bits of the scalar conversions in half.h
// (round to nearest even, no flush to zero, quiet NaNs; see there), so results
// never depend on which path ran, on the CPU, or on the MXCSR FTZ/DAZ flags.
//
//   Portable    element-wise scalar code, any CPU.
//   Vectorized  SIMD code chosen at run time from hw::cpu_features():
//                 fp16: AVX-512 VCVTPS2PH/VCVTPH2PS (needs AVX512F+BW+VL), else
//                       the 256-bit F16C forms (needs AVX+F16C);
//                 bf16: AVX512-BF16 VCVTNEPS2BF16 (needs AVX512F+BW+VL+BF16),
//                       with fp32-subnormal lanes fixed up in integer code
//                       because the instruction treats them as zero; bf16->float
//                       is a 16-bit shift (same requirement, kept symmetric).
//               Throws std::runtime_error("[convert] ...") if the CPU lacks them.
//   Auto        Vectorized when available, else Portable.
//
// Conventions: `src` and `dst` must not overlap; n == 0 is a no-op (pointers may
// then be null); no alignment is required. The calls are single-threaded —
// callers parallelise over large buffers themselves.
#pragma once

#include <cstddef>

#include "ampgrad/half.h"

namespace ampgrad {

enum class ConvertPath { Auto, Portable, Vectorized };

void convert(const float* src, Half* dst, size_t n, ConvertPath path = ConvertPath::Auto);
void convert(const Half* src, float* dst, size_t n, ConvertPath path = ConvertPath::Auto);
void convert(const float* src, BFloat16* dst, size_t n, ConvertPath path = ConvertPath::Auto);
void convert(const BFloat16* src, float* dst, size_t n, ConvertPath path = ConvertPath::Auto);

/// Widens a rows x cols matrix whose rows start src_ld elements apart (any src_ld: rows may
/// overlap, 0 repeats one row) into dst, row-major and dense: the per-row conversions above, with the path chosen once for
/// the whole matrix (the rows of a strided view, an attention head's, are often short).
void convert_rows(const Half* src, size_t src_ld, float* dst, size_t rows, size_t cols,
                  ConvertPath path = ConvertPath::Auto);
void convert_rows(const BFloat16* src, size_t src_ld, float* dst, size_t rows, size_t cols,
                  ConvertPath path = ConvertPath::Auto);

/// Whether ConvertPath::Vectorized works on this CPU for fp16 (false) or bf16 (true).
bool vectorized_convert_available(bool bfloat16);

namespace detail {

/// The fp16 SIMD kernels. Exposed so tests can cover the 256-bit F16C kernel
/// on machines where Vectorized would pick AVX-512.
enum class HalfIsa { None, F16C256, Avx512 };

/// The kernel ConvertPath::Vectorized uses for fp16 on this CPU (None if unavailable).
HalfIsa half_vector_isa();

/// Whether `isa`'s kernel can run here (None: never).
bool half_isa_available(HalfIsa isa);

/// Runs one specific fp16 kernel; throws std::runtime_error("[convert] ...")
/// if it cannot run on this CPU.
void convert_half_isa(const float* src, Half* dst, size_t n, HalfIsa isa);
void convert_half_isa(const Half* src, float* dst, size_t n, HalfIsa isa);

}  // namespace detail

}  // namespace ampgrad
