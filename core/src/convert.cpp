#include "ampgrad/convert.h"

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "ampgrad/hw/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#define AG_CONVERT_X86 1
#include <immintrin.h>
#endif

namespace ampgrad {

namespace {

template <class Src, class Dst>
void convert_portable(const Src* src, Dst* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<Dst>(static_cast<float>(src[i]));
}

#if AG_CONVERT_X86

// GCC 12 warns about the deliberately undefined pass-through operands inside
// its own AVX-512 intrinsic headers (GCC bug 105593); nothing here is uninitialised.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// Target attributes instead of -m flags: the rest of the library stays
// baseline x86-64 and these are only called after the cpuid check.
#define AG_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define AG_TARGET_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define AG_TARGET_F16C __attribute__((target("avx,f16c")))

// Lanes [0, min(rest, 16)) set. Masked loads never fault on disabled lanes,
// so a tail may be read past n.
inline __mmask16 lane_mask16(size_t rest) {
  return rest >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << rest) - 1u);
}

// The narrowing conversions: Block(v) converts 16 floats, run over full blocks stored
// unmasked, then at most one masked tail. Masked 16-bit stores are several times slower
// than plain ones on some cores (AMD Zen 4), while the masked 32-bit stores of the widening
// loops measured as fast as plain ones, so those keep one loop. The loop is a macro, not a
// template taking the block as a callable: a template instantiated without the target
// attribute cannot inline a callee that has it, and a call per 16 elements would dominate a
// short chunk's conversion (bench_ops' convert/*/256 rows time one call).
#define AG_NARROW16_LOOP(src, dst, n, block)                                                     \
  do {                                                                                           \
    size_t i_ = 0;                                                                               \
    for (; i_ + 16 <= (n); i_ += 16)                                                             \
      _mm256_storeu_si256(reinterpret_cast<__m256i*>((dst) + i_), block(_mm512_loadu_ps((src) + i_))); \
    if (i_ < (n)) {                                                                              \
      const __mmask16 m_ = lane_mask16((n) - i_);                                                \
      _mm256_mask_storeu_epi16((dst) + i_, m_, block(_mm512_maskz_loadu_ps(m_, (src) + i_)));   \
    }                                                                                            \
  } while (0)

AG_TARGET_AVX512 inline __m256i f32_to_f16_block(__m512 v) {
  return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

AG_TARGET_AVX512 void f32_to_f16_avx512(const float* src, Half* dst, size_t n) {
  AG_NARROW16_LOOP(src, dst, n, f32_to_f16_block);
}

AG_TARGET_AVX512 void f16_to_f32_avx512(const Half* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = lane_mask16(n - i);
    const __m256i h = _mm256_maskz_loadu_epi16(m, src + i);
    _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(h));
  }
}

AG_TARGET_AVX512_BF16 inline __m256i f32_to_bf16_block(__m512 v) {
  __m256i r = (__m256i)_mm512_cvtneps_pbh(v);
  // VCVTNEPS2BF16 treats fp32 subnormals as (signed) zero regardless of
  // MXCSR; redo those lanes with integer RNE, which is what the scalar path
  // does for every non-NaN input. Rare in practice, hence the branch.
  const __m512i u = _mm512_castps_si512(v);
  const __mmask16 sub = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7F800000)) &
                        _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x7FFFFFFF));
  if (sub) {
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb)), 16);
    r = _mm256_mask_mov_epi16(r, sub, _mm512_cvtepi32_epi16(rounded));
  }
  return r;
}

AG_TARGET_AVX512_BF16 void f32_to_bf16_avx512(const float* src, BFloat16* dst, size_t n) {
  AG_NARROW16_LOOP(src, dst, n, f32_to_bf16_block);
}
#undef AG_NARROW16_LOOP

AG_TARGET_AVX512 void bf16_to_f32_avx512(const BFloat16* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = lane_mask16(n - i);
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src + i));
    _mm512_mask_storeu_ps(dst + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
  }
}

// AVX has 32-bit masked loads/stores but no 16-bit ones, so the 16-bit side of
// a tail goes through a small buffer.
constexpr int32_t kMaskTable[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

AG_TARGET_F16C inline __m256i lane_mask8(size_t rest) {  // rest in [1, 7]
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMaskTable + 8 - rest));
}

AG_TARGET_F16C void f32_to_f16_f16c(const float* src, Half* dst, size_t n) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), kRound));
  if (const size_t rest = n - i) {
    uint16_t tmp[8];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(tmp),
                     _mm256_cvtps_ph(_mm256_maskload_ps(src + i, lane_mask8(rest)), kRound));
    std::memcpy(dst + i, tmp, rest * sizeof(uint16_t));
  }
}

AG_TARGET_F16C void f16_to_f32_f16c(const Half* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  if (const size_t rest = n - i) {
    uint16_t tmp[8] = {};
    std::memcpy(tmp, src + i, rest * sizeof(uint16_t));
    _mm256_maskstore_ps(dst + i, lane_mask8(rest),
                        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tmp))));
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif  // AG_CONVERT_X86

[[noreturn]] void unavailable(const char* what) {
  throw std::runtime_error(std::string("[convert] vectorized ") + what +
                           " conversion requested, but this CPU lacks the required instructions");
}

template <class Src, class Dst>
void run_half_isa(const Src* src, Dst* dst, size_t n, detail::HalfIsa isa) {
  if (!detail::half_isa_available(isa)) unavailable("fp16");
#if AG_CONVERT_X86
  constexpr bool to_half = std::is_same_v<Dst, Half>;
  if (isa == detail::HalfIsa::Avx512) {
    if constexpr (to_half) f32_to_f16_avx512(src, dst, n);
    else f16_to_f32_avx512(src, dst, n);
  } else {
    if constexpr (to_half) f32_to_f16_f16c(src, dst, n);
    else f16_to_f32_f16c(src, dst, n);
  }
#else
  (void)src, (void)dst, (void)n;
#endif
}

// The kernel for these types on this path: portable, or the vectorized one this CPU runs
// (throws when the path asks for one it lacks). Chosen once per call, or once per matrix
// for convert_rows.
template <class Src, class Dst>
auto kernel_for(ConvertPath path) -> void (*)(const Src*, Dst*, size_t) {
  constexpr bool bf16 = std::is_same_v<Src, BFloat16> || std::is_same_v<Dst, BFloat16>;
  const bool vec = path == ConvertPath::Vectorized ||
                   (path == ConvertPath::Auto && vectorized_convert_available(bf16));
  if (!vec) return &convert_portable<Src, Dst>;
#if AG_CONVERT_X86
  constexpr bool narrow = std::is_same_v<Src, float>;
  if constexpr (bf16) {
    if (vectorized_convert_available(true)) {
      if constexpr (narrow) return &f32_to_bf16_avx512;
      else return &bf16_to_f32_avx512;
    }
  } else {
    const detail::HalfIsa isa = detail::half_vector_isa();
    if (isa == detail::HalfIsa::Avx512) {
      if constexpr (narrow) return &f32_to_f16_avx512;
      else return &f16_to_f32_avx512;
    }
    if (isa == detail::HalfIsa::F16C256) {
      if constexpr (narrow) return &f32_to_f16_f16c;
      else return &f16_to_f32_f16c;
    }
  }
#endif
  unavailable(bf16 ? "bf16" : "fp16");
}

template <class Src, class Dst>
void dispatch(const Src* src, Dst* dst, size_t n, ConvertPath path) {
  if (path == ConvertPath::Auto) {  // the common call, once per chunk of a 16-bit loop: resolved once
    static const auto kernel = kernel_for<Src, Dst>(ConvertPath::Auto);
    return kernel(src, dst, n);
  }
  kernel_for<Src, Dst>(path)(src, dst, n);
}

template <class Src>
void widen_rows(const Src* src, size_t ld, float* dst, size_t rows, size_t cols, ConvertPath path) {
  if (rows == 0 || cols == 0) return;
  const auto k = kernel_for<Src, float>(path);
  for (size_t r = 0; r < rows; ++r) k(src + r * ld, dst + r * cols, cols);
}

}  // namespace

void convert(const float* src, Half* dst, size_t n, ConvertPath path) { dispatch(src, dst, n, path); }
void convert(const Half* src, float* dst, size_t n, ConvertPath path) { dispatch(src, dst, n, path); }
void convert(const float* src, BFloat16* dst, size_t n, ConvertPath path) { dispatch(src, dst, n, path); }
void convert(const BFloat16* src, float* dst, size_t n, ConvertPath path) { dispatch(src, dst, n, path); }
void convert_rows(const Half* src, size_t src_ld, float* dst, size_t rows, size_t cols, ConvertPath path) {
  widen_rows(src, src_ld, dst, rows, cols, path);
}
void convert_rows(const BFloat16* src, size_t src_ld, float* dst, size_t rows, size_t cols, ConvertPath path) {
  widen_rows(src, src_ld, dst, rows, cols, path);
}

bool vectorized_convert_available(bool bfloat16) {
  // Asked on every conversion call (per chunk of a 16-bit loop): decided once.
  static const bool half = detail::half_vector_isa() != detail::HalfIsa::None;
  static const bool bf16 = [] {
    const auto& f = hw::cpu_features();
    return f.avx512f && f.avx512bw && f.avx512vl && f.avx512_bf16;
  }();
  return bfloat16 ? bf16 : half;
}

namespace detail {

bool half_isa_available(HalfIsa isa) {
  const auto& f = hw::cpu_features();
  switch (isa) {
    case HalfIsa::Avx512: return f.avx512f && f.avx512bw && f.avx512vl;
    case HalfIsa::F16C256: return f.avx && f.f16c;
    case HalfIsa::None: break;
  }
  return false;
}

HalfIsa half_vector_isa() {
  static const HalfIsa best = [] {
    if (half_isa_available(HalfIsa::Avx512)) return HalfIsa::Avx512;
    if (half_isa_available(HalfIsa::F16C256)) return HalfIsa::F16C256;
    return HalfIsa::None;
  }();
  return best;
}

void convert_half_isa(const float* src, Half* dst, size_t n, HalfIsa isa) { run_half_isa(src, dst, n, isa); }
void convert_half_isa(const Half* src, float* dst, size_t n, HalfIsa isa) { run_half_isa(src, dst, n, isa); }

}  // namespace detail

}  // namespace ampgrad
