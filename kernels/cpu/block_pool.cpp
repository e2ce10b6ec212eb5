// conv2d_block's max pooling over the convolution's own layout (block_pool.h).
//
// Two forms of each kernel: 16 channels per AVX-512 vector at the kernels' level avx512
// (cpu/isa.h; BW and VL give the bfloat16 lanes), and plain loops below it
// (hw::set_kernel_isa("avx2") selects them on an AVX-512 CPU, for tests and before/after
// measurements). The forward reads each activation element once and writes
// the pooled output in NCHW through a small per-row buffer; the backward writes every tap
// of every window (the pooled gradient at the saved position, 0 elsewhere), so that where
// the windows tile the activation exactly (stride = kernel, no padding or dilation, sizes
// divisible) the gradient needs no zero fill first.
#include "cpu/block_pool.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/isa.h"
#include "cpu/parallel.h"

#if defined(__x86_64__)
// GCC 12's AVX-512 headers start masked conversions from an "undefined" vector, which its
// -Wmaybe-uninitialized reports at every use.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#endif

namespace ampgrad::cpu {
namespace {

// A float32 or a bfloat16 (its bits) as float, and back; the maximum is one of the inputs
// or 0, so the way back is exact.
template <class U>
inline float load_f(U u) {
  if constexpr (sizeof(U) == 4) return std::bit_cast<float>(u);
  else return std::bit_cast<float>(uint32_t(u) << 16);
}
template <class U>
inline U store_f(float f) {
  if constexpr (sizeof(U) == 4) return std::bit_cast<U>(f);
  else return U(std::bit_cast<uint32_t>(f) >> 16);
}

// Rows of the work: (n, channel block, oh).
struct Row {
  int64_t n, blk, oh;
  Row(int64_t r, const BlockLayout& L, int64_t OH) : n(r / OH / L.blocks), blk((r / OH) % L.blocks), oh(r % OH) {}
};

int64_t row_grain(const BlockLayout& L, int64_t OW, const PoolDim& ph, const PoolDim& pw) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, OW * L.cb * ph.k * pw.k));
}

// Whether the windows cover every activation element exactly once.
bool tiles_exactly(const PoolDim& d, int64_t out) { return d.d == 1 && d.p == 0 && d.s == d.k && out * d.k == d.in; }

// A window position inside the activation: its number in the window (kh * kw_size + kw)
// and its offset in y's layout, the channel aside.
struct Tap {
  uint8_t id;
  int64_t offset;
};
// The positions of window (oh, ow) inside the activation in row-major order (padding and
// dilation steps outside it skipped); taps holds ph.k * pw.k. Returns their count.
int window_taps(const BlockLayout& L, const PoolDim& ph, const PoolDim& pw, int64_t oh, int64_t ow, Tap* taps) {
  int n = 0;
  for (int64_t kh = 0; kh < ph.k; ++kh) {
    const int64_t ih = ph.start(oh) + kh * ph.d;
    if (ih < 0 || ih >= ph.in) continue;
    for (int64_t kw = 0; kw < pw.k; ++kw) {
      const int64_t iw = pw.start(ow) + kw * pw.d;
      if (iw >= 0 && iw < pw.in) taps[n++] = {uint8_t(kh * pw.k + kw), ih * L.sh + iw * L.sw};
    }
  }
  return n;
}

// The activation's gradient zeroed, on the team.
void zero_fill(void* p, size_t bytes) {
  char* z = static_cast<char*>(p);
  parallel_for(0, int64_t(bytes), kGrain * 16, [&](int64_t b, int64_t e) { std::memset(z + b, 0, size_t(e - b)); });
}

// ---- plain loops ----------------------------------------------------------------------------

template <class U>
void forward_loops(const U* y, const BlockLayout& L, const PoolDim& ph, const PoolDim& pw, int64_t N, int64_t OH,
                   int64_t OW, bool relu, U* out, uint8_t* arg) {
  parallel_for(0, N * L.blocks * OH, row_grain(L, OW, ph, pw), [&](int64_t rb, int64_t re) {
    std::vector<Tap> taps(size_t(ph.k * pw.k));
    for (int64_t r = rb; r < re; ++r) {
      const Row w(r, L, OH);
      const int64_t c0 = w.blk * L.cb, lanes = std::min(L.cb, L.C - c0);
      const U* yb = y + w.n * L.sn + w.blk * L.sc;
      for (int64_t ow = 0; ow < OW; ++ow) {
        const int nt = window_taps(L, ph, pw, w.oh, ow, taps.data());
        for (int64_t l = 0; l < lanes; ++l) {
          float best = -std::numeric_limits<float>::infinity();
          // a window of -inf routes to its first tap; one with no tap inside, nowhere
          uint8_t bi = nt > 0 ? taps[0].id : kNoGradient;
          for (int t = 0; t < nt; ++t) {
            const float v = load_f(yb[taps[size_t(t)].offset + l]);
            if (v > best || v != v) {  // as max_pool2d: a larger value or a NaN takes over
              best = v;
              bi = taps[size_t(t)].id;
            }
          }
          const int64_t o = ((w.n * L.C + c0 + l) * OH + w.oh) * OW + ow;
          // ReLU after the max (it is monotone; -0 and NaN stay); its gradient flows where y > 0.
          out[o] = store_f<U>(relu && best < 0 ? 0.f : best);
          arg[o] = relu && !(best > 0) ? kNoGradient : bi;
        }
      }
    }
  });
}

template <class U>
void backward_loops(const U* g, const uint8_t* arg, const BlockLayout& L, const PoolDim& ph, const PoolDim& pw,
                    int64_t N, int64_t OH, int64_t OW, U* gy, size_t gy_bytes) {
  zero_fill(gy, gy_bytes);
  parallel_for(0, N * L.blocks * OH, row_grain(L, OW, ph, pw), [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      const Row w(r, L, OH);
      const int64_t c0 = w.blk * L.cb, lanes = std::min(L.cb, L.C - c0);
      U* gb = gy + w.n * L.sn + w.blk * L.sc;
      for (int64_t l = 0; l < lanes; ++l) {
        const int64_t o0 = ((w.n * L.C + c0 + l) * OH + w.oh) * OW;
        for (int64_t ow = 0; ow < OW; ++ow) {
          const uint8_t a = arg[o0 + ow];
          if (a == kNoGradient) continue;
          const int64_t ih = ph.start(w.oh) + (a / pw.k) * ph.d, iw = pw.start(ow) + (a % pw.k) * pw.d;
          gb[ih * L.sh + iw * L.sw + l] = g[o0 + ow];
        }
      }
    }
  });
}

// ---- AVX-512: 16 channels per vector ----------------------------------------------------------

#if defined(__x86_64__)
#define AG_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

template <class U>
AG_AVX512 inline __m512 load16(const U* p, __mmask16 m) {
  if constexpr (sizeof(U) == 4) return _mm512_maskz_loadu_ps(m, p);
  else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

inline __mmask16 lane_mask(int64_t lanes) { return lanes >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << lanes) - 1); }

// Rows rb..re of the forward (a function of its own: a lambda would not inherit the
// target attribute).
template <class U>
AG_AVX512 void forward_rows_avx512(int64_t rb, int64_t re, const U* y, const BlockLayout& L, const PoolDim& ph,
                                   const PoolDim& pw, int64_t OH, int64_t OW, bool relu, U* out, uint8_t* arg) {
  std::vector<float> vals(size_t(16 * OW));
  std::vector<uint8_t> args(size_t(16 * OW));
  std::vector<Tap> taps(size_t(ph.k * pw.k));
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t r = rb; r < re; ++r) {
    const Row w(r, L, OH);
    const int64_t c0 = w.blk * L.cb;
    for (int64_t l0 = 0; l0 < L.cb && c0 + l0 < L.C; l0 += 16) {
      const __mmask16 lm = lane_mask(L.cb - l0);
      const U* yb = y + w.n * L.sn + w.blk * L.sc + l0;
      for (int64_t ow = 0; ow < OW; ++ow) {
        const int nt = window_taps(L, ph, pw, w.oh, ow, taps.data());
        __m512 best = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
        // a window of -inf routes to its first tap; one with no tap inside, nowhere
        __m512i bi = _mm512_set1_epi32(nt > 0 ? taps[0].id : kNoGradient);
        for (int t = 0; t < nt; ++t) {
          const __m512 v = load16(yb + taps[size_t(t)].offset, lm);
          const __mmask16 take = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
          best = _mm512_mask_mov_ps(best, take, v);
          bi = _mm512_mask_mov_epi32(bi, take, _mm512_set1_epi32(taps[size_t(t)].id));
        }
        if (relu) {
          best = _mm512_mask_mov_ps(best, _mm512_cmp_ps_mask(best, zero, _CMP_LT_OQ), zero);
          bi = _mm512_mask_mov_epi32(bi, __mmask16(~_mm512_cmp_ps_mask(best, zero, _CMP_GT_OQ)),
                                     _mm512_set1_epi32(kNoGradient));
        }
        _mm512_storeu_ps(vals.data() + 16 * ow, best);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(args.data() + 16 * ow), _mm512_cvtepi32_epi8(bi));
      }
      const int64_t lanes = std::min<int64_t>({16, L.cb - l0, L.C - c0 - l0});
      for (int64_t l = 0; l < lanes; ++l) {
        const int64_t o0 = ((w.n * L.C + c0 + l0 + l) * OH + w.oh) * OW;
        for (int64_t ow = 0; ow < OW; ++ow) {
          out[o0 + ow] = store_f<U>(vals[size_t(16 * ow + l)]);
          arg[o0 + ow] = args[size_t(16 * ow + l)];
        }
      }
    }
  }
}

template <class U>
AG_AVX512 void backward_rows_avx512(int64_t rb, int64_t re, const U* g, const uint8_t* arg, const BlockLayout& L,
                                    const PoolDim& ph, const PoolDim& pw, int64_t OH, int64_t OW, U* gy) {
  std::vector<U> grads(size_t(16 * OW));
  std::vector<uint8_t> args(size_t(16 * OW));
  std::vector<Tap> taps(size_t(ph.k * pw.k));
  for (int64_t r = rb; r < re; ++r) {
    const Row w(r, L, OH);
    const int64_t c0 = w.blk * L.cb;
    // every chunk of the block, padding lanes included: they get zeros
    for (int64_t l0 = 0; l0 < L.cb; l0 += 16) {
      const __mmask16 lm = lane_mask(L.cb - l0);
      const int64_t lanes = std::clamp<int64_t>(L.C - c0 - l0, 0, 16);
      std::fill(args.begin(), args.end(), kNoGradient);
      for (int64_t l = 0; l < lanes; ++l) {
        const int64_t o0 = ((w.n * L.C + c0 + l0 + l) * OH + w.oh) * OW;
        for (int64_t ow = 0; ow < OW; ++ow) {
          grads[size_t(16 * ow + l)] = g[o0 + ow];
          args[size_t(16 * ow + l)] = arg[o0 + ow];
        }
      }
      U* gb = gy + w.n * L.sn + w.blk * L.sc + l0;
      for (int64_t ow = 0; ow < OW; ++ow) {
        const __m512i at = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(args.data() + 16 * ow)));
        const int nt = window_taps(L, ph, pw, w.oh, ow, taps.data());
        for (int t = 0; t < nt; ++t) {
          const __mmask16 hit = _mm512_cmpeq_epi32_mask(at, _mm512_set1_epi32(taps[size_t(t)].id));
          U* dst = gb + taps[size_t(t)].offset;
          if constexpr (sizeof(U) == 4) {
            const __m512i gv = _mm512_loadu_si512(grads.data() + 16 * ow);
            _mm512_mask_storeu_epi32(dst, lm, _mm512_maskz_mov_epi32(hit, gv));
          } else {
            const __m256i gv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(grads.data() + 16 * ow));
            _mm256_mask_storeu_epi16(dst, lm, _mm256_maskz_mov_epi16(hit, gv));
          }
        }
      }
    }
  }
}

template <class U>
void forward_avx512(const U* y, const BlockLayout& L, const PoolDim& ph, const PoolDim& pw, int64_t N, int64_t OH,
                    int64_t OW, bool relu, U* out, uint8_t* arg) {
  parallel_for(0, N * L.blocks * OH, row_grain(L, OW, ph, pw), [&](int64_t rb, int64_t re) {
    forward_rows_avx512(rb, re, y, L, ph, pw, OH, OW, relu, out, arg);
  });
}

template <class U>
void backward_avx512(const U* g, const uint8_t* arg, const BlockLayout& L, const PoolDim& ph, const PoolDim& pw,
                     int64_t N, int64_t OH, int64_t OW, U* gy, size_t gy_bytes) {
  if (!tiles_exactly(ph, OH) || !tiles_exactly(pw, OW)) zero_fill(gy, gy_bytes);
  parallel_for(0, N * L.blocks * OH, row_grain(L, OW, ph, pw), [&](int64_t rb, int64_t re) {
    backward_rows_avx512(rb, re, g, arg, L, ph, pw, OH, OW, gy);
  });
}
#else
template <class U>
void forward_avx512(const U*, const BlockLayout&, const PoolDim&, const PoolDim&, int64_t, int64_t, int64_t, bool, U*,
                    uint8_t*) {}
template <class U>
void backward_avx512(const U*, const uint8_t*, const BlockLayout&, const PoolDim&, const PoolDim&, int64_t, int64_t,
                     int64_t, U*, size_t) {}
#endif

}  // namespace

namespace {
// f.operator()<U>() with U the bits of one element: uint16_t for bfloat16, uint32_t for
// float32 (the kernels move and compare bits; they widen bfloat16 to float themselves).
template <class F>
void on_bits(DType dtype, const F& f) {
  if (dtype == kBFloat16) f.template operator()<uint16_t>();
  else f.template operator()<uint32_t>();
}
}  // namespace

void block_pool_forward(DType dtype, const void* y, const BlockLayout& L, const PoolDim& ph, const PoolDim& pw,
                        int64_t N, int64_t OH, int64_t OW, bool relu, void* out, uint8_t* arg) {
  on_bits(dtype, [&]<class U>() {
    const U* yu = static_cast<const U*>(y);
    run_variant<forward_loops<U>, forward_avx512<U>>(yu, L, ph, pw, N, OH, OW, relu, static_cast<U*>(out), arg);
  });
}

void block_pool_backward(DType dtype, const void* g, const uint8_t* arg, const BlockLayout& L, const PoolDim& ph,
                         const PoolDim& pw, int64_t N, int64_t OH, int64_t OW, void* gy, size_t gy_bytes) {
  on_bits(dtype, [&]<class U>() {
    const U* gu = static_cast<const U*>(g);
    run_variant<backward_loops<U>, backward_avx512<U>>(gu, arg, L, ph, pw, N, OH, OW, static_cast<U*>(gy), gy_bytes);
  });
}

}  // namespace ampgrad::cpu

#if defined(__x86_64__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
