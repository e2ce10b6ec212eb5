// CPU memory, copies and fills, events, and the backend object.
//
// Allocation caches freed blocks of 64 KiB and more (up to kMaxCached bytes in all), keyed
// by their page-rounded size: a training step frees and reallocates the same large
// buffers every iteration, and fresh pages from the OS cost a page fault each, which
// would otherwise dominate memory-bound ops. Blocks of up to 4 KiB are kept too, per
// thread and per 64-byte size class (at most kSmallPerClass each, no lock): glibc's
// aligned_alloc and free of a tiny block cost about a third of a tiny op's whole time.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <type_traits>

#include "cpu/cpu_backend.h"
#include "cpu/isa.h"
#include "cpu/loops.h"
#include "cpu/parallel.h"
#include "cpu/transpose16.h"
#include "cpu/vec.h"
#include "ampgrad/raw.h"

namespace ampgrad::cpu {
namespace {

constexpr size_t kAlign = 64;
constexpr size_t kCacheMin = size_t(64) << 10;
constexpr size_t kMaxCached = size_t(2) << 30;
constexpr size_t kPage = 4096;
constexpr size_t kSmallMax = 4096;
constexpr size_t kSmallClasses = kSmallMax / kAlign;
// Under AddressSanitizer small blocks are not kept: a use after free of a small tensor,
// the fuzzers' usual case, must reach ASan's poisoned memory rather than a reused block.
#if defined(__SANITIZE_ADDRESS__)
constexpr int kSmallPerClass = 0;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr int kSmallPerClass = 0;
#else
constexpr int kSmallPerClass = 16;
#endif
#else
constexpr int kSmallPerClass = 16;
#endif

// Bytes in all threads' small caches, for cached_bytes.
std::atomic<size_t> g_small_cached{0};

// One thread's small blocks. Plain data, so that it stays readable until the thread ends,
// after the reaper below has emptied it (a storage freed by a later thread_local destructor
// then goes to std::free).
struct SmallCache {
  void* slot[kSmallClasses][kSmallPerClass > 0 ? kSmallPerClass : 1];
  int count[kSmallClasses];
};
thread_local SmallCache* tl_small = nullptr;
thread_local bool tl_small_dead = false;

void clear_small(SmallCache& c) {
  size_t bytes = 0;
  for (size_t k = 0; k < kSmallClasses; ++k) {
    for (int i = 0; i < c.count[k]; ++i) std::free(c.slot[k][i]);
    bytes += size_t(c.count[k]) * (k + 1) * kAlign;
    c.count[k] = 0;
  }
  g_small_cached.fetch_sub(bytes, std::memory_order_relaxed);
}

struct SmallReaper {
  ~SmallReaper() {
    if (tl_small) {
      clear_small(*tl_small);
      delete tl_small;
      tl_small = nullptr;
    }
    tl_small_dead = true;
  }
};
thread_local SmallReaper tl_small_reaper;

SmallCache* small_cache() {
  if (!tl_small && !tl_small_dead) {
    (void)&tl_small_reaper;  // constructs this thread's reaper, which frees the cache at exit
    tl_small = new SmallCache();
  }
  return tl_small;
}

class BlockCache {
 public:
  void* get(size_t nbytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(nbytes);
    if (it == free_.end()) return nullptr;
    void* p = it->second;
    free_.erase(it);
    cached_ -= nbytes;
    return p;
  }
  bool put(void* p, size_t nbytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (cached_ + nbytes > kMaxCached) return false;
    free_.emplace(nbytes, p);
    cached_ += nbytes;
    return true;
  }
  size_t cached() {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [n, p] : free_) std::free(p);
    free_.clear();
    cached_ = 0;
  }
  ~BlockCache() { clear(); }

 private:
  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  size_t cached_ = 0;
};

BlockCache& block_cache() {
  static BlockCache* cache = new BlockCache();  // outlives static tensors at exit
  return *cache;
}

size_t block_size(size_t nbytes) {
  if (nbytes >= kCacheMin) return (nbytes + kPage - 1) / kPage * kPage;
  return (std::max<size_t>(nbytes, 1) + kAlign - 1) / kAlign * kAlign;
}

}  // namespace

// CPU work is done when the call returns, so a block freed on any stream is free for all.
Backend::Allocation CpuBackend::allocate(size_t nbytes, Stream) {
  const size_t n = block_size(nbytes);
  if (n >= kCacheMin) {
    if (void* p = block_cache().get(n)) return {p, true};
  } else if (n <= kSmallMax) {
    if (SmallCache* c = small_cache(); c && c->count[n / kAlign - 1] > 0) {
      g_small_cached.fetch_sub(n, std::memory_order_relaxed);
      return {c->slot[n / kAlign - 1][--c->count[n / kAlign - 1]], true};
    }
  }
  void* p = std::aligned_alloc(kAlign, n);
  AG_CHECK(p != nullptr, "allocate", "out of memory allocating ", nbytes, " bytes on cpu");
  return {p, false};
}

void CpuBackend::deallocate(void* p, size_t nbytes, Stream) {
  if (!p) return;
  const size_t n = block_size(nbytes);
  if (n >= kCacheMin) {
    if (block_cache().put(p, n)) return;
  } else if (n <= kSmallMax) {
    if (SmallCache* c = small_cache(); c && c->count[n / kAlign - 1] < kSmallPerClass) {
      c->slot[n / kAlign - 1][c->count[n / kAlign - 1]++] = p;
      g_small_cached.fetch_add(n, std::memory_order_relaxed);
      return;
    }
  }
  std::free(p);
}

size_t CpuBackend::cached_bytes(int) {
  return block_cache().cached() + g_small_cached.load(std::memory_order_relaxed);
}
// Other threads' small blocks (16 per size class at most) go back when those threads end.
void CpuBackend::empty_cache(int) {
  block_cache().clear();
  if (tl_small) clear_small(*tl_small);
}

void CpuBackend::copy_bytes(void* dst, Device, const void* src, Device, size_t n, Stream, bool) {
  if (n < size_t(kGrain) * 8) {
    std::memcpy(dst, src, n);
    return;
  }
  parallel_for(0, int64_t(n), kGrain * 8, [&](int64_t b, int64_t e) {
    std::memcpy(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b, size_t(e - b));
  });
}

namespace {
template <class D, class S>
void copy_loop(const Tensor& src, const Tensor& dst) {
  for_each_strided<2>({&dst, &src}, [&](char** p, const int64_t* s, int64_t n) {
    if constexpr (std::is_same_v<D, S>) {
      if (s[0] == sizeof(D) && s[1] == sizeof(S)) {
        std::memcpy(p[0], p[1], size_t(n) * sizeof(D));
        return;
      }
    } else if constexpr (is_float16_v<D> && std::is_same_v<S, float>) {
      if (s[0] == sizeof(D) && s[1] == sizeof(S)) {
        convert(reinterpret_cast<const float*>(p[1]), reinterpret_cast<D*>(p[0]), size_t(n));
        return;
      }
    } else if constexpr (is_float16_v<S> && std::is_same_v<D, float>) {
      if (s[0] == sizeof(D) && s[1] == sizeof(S)) {
        convert(reinterpret_cast<const S*>(p[1]), reinterpret_cast<float*>(p[0]), size_t(n));
        return;
      }
    }
    for (int64_t i = 0; i < n; ++i)
      *reinterpret_cast<D*>(p[0] + i * s[0]) = cast<D>(*reinterpret_cast<const S*>(p[1] + i * s[1]));
  });
}

// A copy whose source runs down the destination's columns: a transposed matrix
// (x.t().contiguous()), a batch of them (transpose(-2, -1)), or a permute that moves the
// innermost dim (NCHW to NHWC). Element by element that is a strided gather, a cache miss
// per read once a column outgrows the cache, many times slower than a plain copy. In
// the coalesced layout (make_layout: dim 0 innermost) dim 0 is unit-stride in dst and dim 1
// in src; each plane of those two dims is copied in kTile x kTile blocks, which both sides
// hold in L1, the blocks' rows spread over the threads. Full blocks of 16-, 32- and 64-bit
// elements go through AVX-512 registers (transpose32x32_16, transpose16, transpose8x8_64)
// where the CPU has them, faster than the scalar tile loop (bench_ops' transposed_copy rows
// time the copy against a plain one).
// Bits are moved, never converted. False where the copy is not of
// this kind.
constexpr int64_t kTile = 32;

// d[r * ldd + c] = s[c * lds + r] for r < rows, c < cols; W is an unsigned word of the
// element's size. Through two L1 buffers: the rows of either side may lie a multiple of
// 4 KiB apart, where a tile's 32 of them share one L1 set and evict each other (a
// [2048, 1536] bfloat16 transpose written in place, tile by tile, took longer than element
// by element); read and written as whole segments, each line is touched once.
template <class W>
void transpose_tile(const W* s, int64_t lds, W* d, int64_t ldd, int64_t rows, int64_t cols) {
  W in[kTile * kTile], out[kTile * kTile];
  for (int64_t c = 0; c < cols; ++c) std::memcpy(in + c * kTile, s + c * lds, size_t(rows) * sizeof(W));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * kTile + c] = in[c * kTile + r];
  for (int64_t r = 0; r < rows; ++r) std::memcpy(d + r * ldd, out + r * kTile, size_t(cols) * sizeof(W));
}

// A full kTile x kTile tile of 16-, 32- or 64-bit words through AVX-512 registers at the
// kernels' level avx512 (16-bit words also need an even ldd); false where not, for
// transpose_tile.
template <class W>
bool transpose_tile_registers(const W* s, int64_t lds, W* d, int64_t ldd) {
#if defined(__x86_64__)
  if constexpr (sizeof(W) == 1) {
    return false;
  } else if constexpr (sizeof(W) == 2) {
    if (!use_avx512() || ldd % 2 != 0) return false;
    transpose32x32_16(s, lds, d, ldd);
  } else {
    if (!use_avx512()) return false;
    constexpr int64_t B = sizeof(W) == 4 ? 16 : 8;  // transpose16's or transpose8x8_64's block
    using F = std::conditional_t<sizeof(W) == 4, float, double>;
    for (int64_t i = 0; i < kTile; i += B)
      for (int64_t j = 0; j < kTile; j += B) {
        const F* sb = reinterpret_cast<const F*>(s + j * lds + i);
        F* db = reinterpret_cast<F*>(d + i * ldd + j);
        if constexpr (sizeof(W) == 4) transpose16(sb, lds, db, ldd);
        else transpose8x8_64(sb, lds, db, ldd);
      }
  }
  return true;
#else
  (void)s, (void)lds, (void)d, (void)ldd;
  return false;
#endif
}

// Rows r0..r1 of a plane of C columns, tile by tile.
template <class W>
void transpose_plane_rows(const W* s, int64_t lds, W* d, int64_t ldd, int64_t r0, int64_t r1, int64_t C) {
  for (int64_t rb = r0; rb < r1; rb += kTile) {
    const int64_t rows = std::min(kTile, r1 - rb);
    for (int64_t cb = 0; cb < C; cb += kTile) {
      const int64_t cols = std::min(kTile, C - cb);
      const W* st = s + cb * lds + rb;
      W* dt = d + rb * ldd + cb;
      if (rows < kTile || cols < kTile || !transpose_tile_registers(st, lds, dt, ldd))
        transpose_tile(st, lds, dt, ldd, rows, cols);
    }
  }
}

template <class W>
void copy_planes(const StridedLayout<2>& L) {
  constexpr int64_t sz = int64_t(sizeof(W));
  const int64_t C = L.sizes[0], R = L.sizes[1], lds = L.strides[1][0] / sz, ldd = L.strides[0][1] / sz;
  int64_t batches = 1;
  for (int d = 2; d < L.ndim; ++d) batches *= L.sizes[d];
  const int64_t blocks = (R + kTile - 1) / kTile, units = batches * blocks;
  parallel_for(0, units, std::max<int64_t>(1, kGrain / (kTile * C)), [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1;) {
      const int64_t b = u / blocks, k0 = u % blocks, k1 = std::min(blocks, k0 + (u1 - u));
      char* dp = L.base[0];
      const char* sp = L.base[1];
      for (int64_t d = 2, i = b; d < L.ndim; ++d) {
        dp += (i % L.sizes[d]) * L.strides[0][d];
        sp += (i % L.sizes[d]) * L.strides[1][d];
        i /= L.sizes[d];
      }
      transpose_plane_rows(reinterpret_cast<const W*>(sp), lds, reinterpret_cast<W*>(dp), ldd, k0 * kTile,
                           std::min(R, k1 * kTile), C);
      u += k1 - k0;
    }
  });
}

bool copy_transposed(const Tensor& src, const Tensor& dst) {
  const int64_t sz = int64_t(src.itemsize());
  if (src.dtype() != dst.dtype() || (sz != 1 && sz != 2 && sz != 4 && sz != 8) || src.is_alias_of(dst))
    return false;
  const StridedLayout<2> L = make_layout<2>({&dst, &src});
  // dim 0 unit-stride in dst, dim 1 in src, positive strides that keep the words aligned,
  // and planes big enough that the generic loop's misses matter
  if (L.ndim < 2 || L.strides[0][0] != sz || L.strides[1][1] != sz || L.strides[1][0] <= 0 || L.strides[0][1] <= 0 ||
      L.strides[1][0] % sz != 0 || L.strides[0][1] % sz != 0 || L.sizes[0] < 16 || L.sizes[1] < 16)
    return false;
  for (int k = 0; k < 2; ++k)
    if (reinterpret_cast<uintptr_t>(L.base[k]) % uintptr_t(sz) != 0) return false;
  switch (sz) {
    case 1: copy_planes<uint8_t>(L); break;
    case 2: copy_planes<uint16_t>(L); break;
    case 4: copy_planes<uint32_t>(L); break;
    default: copy_planes<uint64_t>(L); break;
  }
  return true;
}

}  // namespace

void CpuBackend::copy(const Tensor& src, const Tensor& dst) {
  if (copy_transposed(src, dst)) return;
  dispatch_all(dst.dtype(), "copy", [&]<class D>() {
    dispatch_all(src.dtype(), "copy", [&]<class S>() { copy_loop<D, S>(src, dst); });
  });
}

void CpuBackend::fill(const Tensor& dst, double value) {
  dispatch_all(dst.dtype(), "fill", [&]<class T>() {
    const T v = cast<T>(value);
    for_each_strided<1>({&dst}, [&](char** p, const int64_t* s, int64_t n) {
      if (s[0] == sizeof(T)) {
        T* o = reinterpret_cast<T*>(p[0]);
        for (int64_t i = 0; i < n; ++i) o[i] = v;
      } else {
        for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
      }
    });
  });
}

// ---- the gradient of linear_act: one GEMM, then one fused pass and the bias sum ---------------

// For GELU the CPU keeps act'(h) instead of h (Backend::linear_act lets a backend choose):
// the forward's pass computes the slope next to the value from one erfc, and the backward
// is then the product alone, scaled by the slope in its epilogue, with no pass of GELU's
// gradient over [M, N]. ReLU keeps nothing and reads out, as composed.
Tensor CpuBackend::linear_act_with_slope(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                                         const Tensor& out) {
  Tensor slope = make_tensor(out.sizes(), out.dtype(), out.device());
  linear(x, weight, bias, slope);        // h
  activation_with_slope(act, slope, out);  // out = act(h), slope = act'(h)
  return slope;
}

void CpuBackend::linear_act_backward(const Tensor& g, const Tensor& next_weight, const Tensor& out,
                                     const Tensor& saved, Activation act, const Tensor& grad_pre,
                                     const Tensor& grad_bias) {
  if (activation_grad_reads_output(act))
    return linear_act_backward_composed(g, next_weight, out, saved, act, grad_pre, grad_bias);
  AG_CHECK(saved.defined(), op::linear, "the gradient of ", activation_name(act),
           " needs the slope the forward kept, which was not kept");
  const int64_t N = grad_pre.size(1);
  if (next_weight.defined()) {
    matmul_times(detail::one_batch(g), detail::one_batch(next_weight), detail::one_batch(saved),
                 detail::one_batch(grad_pre));
  } else {
    binary(BinaryOp::Mul, g, saved, grad_pre);
  }
  if (grad_bias.defined())
    reduce(ReduceOp::Sum, grad_pre, Shape{0}, detail::make_view(grad_bias, {1, N}, {N, 1}, grad_bias.storage_offset()),
           {});
}

// ---- events: the steady clock at record time ---------------------------------------------

namespace {
struct CpuEvent {
  std::chrono::steady_clock::time_point at;
};
}  // namespace

CpuBackend::CpuBackend() { (void)kernel_isa(); }

void* CpuBackend::create_event(int, bool) { return new CpuEvent{}; }
void CpuBackend::destroy_event(int, void* event) { delete static_cast<CpuEvent*>(event); }
void CpuBackend::record_event(void* event, Stream) { static_cast<CpuEvent*>(event)->at = std::chrono::steady_clock::now(); }
double CpuBackend::event_elapsed_ms(void* start, void* end) {
  const auto d = static_cast<CpuEvent*>(end)->at - static_cast<CpuEvent*>(start)->at;
  return std::chrono::duration<double, std::milli>(d).count();
}

}  // namespace ampgrad::cpu

namespace ampgrad {
Backend& cpu_backend() {
  static cpu::CpuBackend* b = new cpu::CpuBackend();
  return *b;
}
bool built_with_onednn() {
#ifdef AMPGRAD_WITH_ONEDNN
  return true;
#else
  return false;
#endif
}
}  // namespace ampgrad

