// The execution model of the CUDA emulator, as kernel code sees it: the built-in index
// variables, __syncthreads and its variants, the warp collectives (shuffles, votes,
// __syncwarp, matches and reductions), atomics, __shared__ and the function qualifiers.
//
// Each CUDA thread of a block is a fiber (its own stack) on one OS thread; fibers switch
// only inside the functions declared here (a barrier, a warp collective) and when a thread
// ends, so everything between two of those runs as ordinary C++. threadIdx, blockIdx,
// blockDim and gridDim are thread_local variables of that OS thread which the scheduler
// sets before it resumes a fiber: in gdb, `print threadIdx` names the CUDA thread you are
// in. Misuse that a GPU answers with a hang or undefined results (a divergent barrier, a
// lane outside a collective's mask, a lane the mask names that has exited) ends the launch
// with an error that names the barrier or collective by file and line (docs/cuda-emulator.md).
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "emu/types.h"

// ---- qualifiers ------------------------------------------------------------------------------
// Device code is host code here: the qualifiers vanish. __CUDACC__ and __CUDA_ARCH__ stay
// undefined (the project's own guard is AMPGRAD_CUDA_DEVICE_CODE, kernels/cuda/launch.cuh).
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __launch_bounds__(...)
/// Static shared memory: one copy per OS thread, and an OS thread runs one block at a time
/// (all of that block's threads), so each block has its own. Write `extern __shared__`
/// arrays as ampgrad::cuda::dynamic_shared<T>() (launch.cuh) instead.
#define __shared__ static thread_local

// ---- built-in variables ----------------------------------------------------------------------
/// The CUDA thread the calling fiber runs, and its block; set by the scheduler.
extern thread_local constinit uint3 threadIdx;
extern thread_local constinit uint3 blockIdx;
extern thread_local constinit dim3 blockDim;
extern thread_local constinit dim3 gridDim;
inline constexpr int warpSize = 32;

namespace ampgrad::emu {

/// Where a barrier or collective is written: barriers are told apart by it.
struct Site {
  const char* file;
  int line;
};
#define AMPGRAD_EMU_SITE (::ampgrad::emu::Site{__FILE__, __LINE__})

/// The warp collectives (what a lane waits at).
enum class Collective : int {
  SyncWarp,
  Shfl,
  ShflUp,
  ShflDown,
  ShflXor,
  Ballot,
  Any,
  All,
  MatchAny,
  MatchAll,
  ReduceAddU,
  ReduceMinU,
  ReduceMaxU,
  ReduceAddS,
  ReduceMinS,
  ReduceMaxS,
  ReduceAnd,
  ReduceOr,
  ReduceXor,
};

/// A barrier's predicate reduction (__syncthreads_count / _and / _or).
enum class BarrierOp : int { None, Count, And, Or };

namespace detail {
// Implemented by src/exec.cpp; each blocks the calling CUDA thread until its partners
// arrive (switching to the block's other fibers), or ends the launch with an error.
int barrier(Site site, BarrierOp op, int predicate);
unsigned long long warp_collective(Site site, Collective kind, unsigned mask, unsigned long long value, int arg,
                                   int width);
unsigned active_mask();
void* dynamic_shared_memory();
[[noreturn]] void trap(Site site, const char* what);
long long clock_ticks();
}  // namespace detail

/// Keeps the compiler from caching memory in registers across a point where other CUDA
/// threads run: every barrier and collective is one (a call alone would not do for shared
/// memory, whose static variables never escape their function).
inline void memory_clobber() { asm volatile("" ::: "memory"); }

inline void syncthreads(Site s) {
  memory_clobber();
  detail::barrier(s, BarrierOp::None, 0);
  memory_clobber();
}
inline int syncthreads_op(Site s, BarrierOp op, int predicate) {
  memory_clobber();
  const int r = detail::barrier(s, op, predicate);
  memory_clobber();
  return r;
}

template <class T>
inline unsigned long long to_lane_bits(const T& v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "a warp collective moves at most 8 bytes");
  unsigned long long b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
inline T from_lane_bits(unsigned long long b) {
  T v;
  std::memcpy(static_cast<void*>(&v), &b, sizeof(T));
  return v;
}

inline unsigned long long collective(Site s, Collective k, unsigned mask, unsigned long long value, int arg,
                                     int width = warpSize) {
  memory_clobber();
  const unsigned long long r = detail::warp_collective(s, k, mask, value, arg, width);
  memory_clobber();
  return r;
}

template <class T>
inline T shfl(Site s, Collective k, unsigned mask, T var, int arg, int width) {
  return from_lane_bits<T>(collective(s, k, mask, to_lane_bits(var), arg, width));
}

/// __reduce_*_sync's operand: unsigned and int (sm_80 and later).
template <class T>
inline T reduce(Site s, Collective unsigned_kind, Collective signed_kind, unsigned mask, T v) {
  static_assert(sizeof(T) == 4 && std::is_integral_v<T>, "__reduce_*_sync takes unsigned or int");
  const Collective k = std::is_signed_v<T> ? signed_kind : unsigned_kind;
  return T(collective(s, k, mask, to_lane_bits(v), 0));
}

// ---- atomics ---------------------------------------------------------------------------------
// std::atomic_ref on the operand; the emulator runs blocks on several OS threads, so these
// are real atomics. The 16-bit floats go through a compare-and-swap of their bits.
template <class T>
inline std::atomic_ref<T> atomic_at(T* p) {
  return std::atomic_ref<T>(*p);
}

}  // namespace ampgrad::emu

// ---- barriers and collectives ------------------------------------------------------------------
// Macros so that each call carries its file and line (a barrier is told apart by it).
#define __syncthreads() ::ampgrad::emu::syncthreads(AMPGRAD_EMU_SITE)
#define __syncthreads_count(p) \
  ::ampgrad::emu::syncthreads_op(AMPGRAD_EMU_SITE, ::ampgrad::emu::BarrierOp::Count, (p) ? 1 : 0)
#define __syncthreads_and(p) \
  ::ampgrad::emu::syncthreads_op(AMPGRAD_EMU_SITE, ::ampgrad::emu::BarrierOp::And, (p) ? 1 : 0)
#define __syncthreads_or(p) ::ampgrad::emu::syncthreads_op(AMPGRAD_EMU_SITE, ::ampgrad::emu::BarrierOp::Or, (p) ? 1 : 0)
#define __syncwarp(...) ::ampgrad::emu::syncwarp(AMPGRAD_EMU_SITE __VA_OPT__(, ) __VA_ARGS__)
#define __shfl_sync(...) ::ampgrad::emu::shfl_sync(AMPGRAD_EMU_SITE, __VA_ARGS__)
#define __shfl_up_sync(...) ::ampgrad::emu::shfl_up_sync(AMPGRAD_EMU_SITE, __VA_ARGS__)
#define __shfl_down_sync(...) ::ampgrad::emu::shfl_down_sync(AMPGRAD_EMU_SITE, __VA_ARGS__)
#define __shfl_xor_sync(...) ::ampgrad::emu::shfl_xor_sync(AMPGRAD_EMU_SITE, __VA_ARGS__)
#define __ballot_sync(mask, p) ::ampgrad::emu::ballot_sync(AMPGRAD_EMU_SITE, (mask), (p) ? 1 : 0)
#define __any_sync(mask, p) ::ampgrad::emu::any_sync(AMPGRAD_EMU_SITE, (mask), (p) ? 1 : 0)
#define __all_sync(mask, p) ::ampgrad::emu::all_sync(AMPGRAD_EMU_SITE, (mask), (p) ? 1 : 0)
#define __match_any_sync(...) ::ampgrad::emu::match_any_sync(AMPGRAD_EMU_SITE, __VA_ARGS__)
#define __match_all_sync(...) ::ampgrad::emu::match_all_sync(AMPGRAD_EMU_SITE, __VA_ARGS__)
#define __reduce_add_sync(mask, v)                                                 \
  ::ampgrad::emu::reduce(AMPGRAD_EMU_SITE, ::ampgrad::emu::Collective::ReduceAddU, \
                         ::ampgrad::emu::Collective::ReduceAddS, (mask), (v))
#define __reduce_min_sync(mask, v)                                                 \
  ::ampgrad::emu::reduce(AMPGRAD_EMU_SITE, ::ampgrad::emu::Collective::ReduceMinU, \
                         ::ampgrad::emu::Collective::ReduceMinS, (mask), (v))
#define __reduce_max_sync(mask, v)                                                 \
  ::ampgrad::emu::reduce(AMPGRAD_EMU_SITE, ::ampgrad::emu::Collective::ReduceMaxU, \
                         ::ampgrad::emu::Collective::ReduceMaxS, (mask), (v))
#define __reduce_and_sync(mask, v) \
  ::ampgrad::emu::reduce_bits(AMPGRAD_EMU_SITE, ::ampgrad::emu::Collective::ReduceAnd, (mask), (v))
#define __reduce_or_sync(mask, v) \
  ::ampgrad::emu::reduce_bits(AMPGRAD_EMU_SITE, ::ampgrad::emu::Collective::ReduceOr, (mask), (v))
#define __reduce_xor_sync(mask, v) \
  ::ampgrad::emu::reduce_bits(AMPGRAD_EMU_SITE, ::ampgrad::emu::Collective::ReduceXor, (mask), (v))
#define __trap() ::ampgrad::emu::detail::trap(AMPGRAD_EMU_SITE, "__trap()")

namespace ampgrad::emu {

inline void syncwarp(Site s, unsigned mask = 0xffffffffu) { collective(s, Collective::SyncWarp, mask, 0, 0); }

template <class T>
inline T shfl_sync(Site s, unsigned mask, T var, int src_lane, int width = warpSize) {
  return shfl(s, Collective::Shfl, mask, var, src_lane, width);
}
template <class T>
inline T shfl_up_sync(Site s, unsigned mask, T var, unsigned delta, int width = warpSize) {
  return shfl(s, Collective::ShflUp, mask, var, int(delta), width);
}
template <class T>
inline T shfl_down_sync(Site s, unsigned mask, T var, unsigned delta, int width = warpSize) {
  return shfl(s, Collective::ShflDown, mask, var, int(delta), width);
}
template <class T>
inline T shfl_xor_sync(Site s, unsigned mask, T var, int lane_mask, int width = warpSize) {
  return shfl(s, Collective::ShflXor, mask, var, lane_mask, width);
}
inline unsigned ballot_sync(Site s, unsigned mask, int p) {
  return unsigned(collective(s, Collective::Ballot, mask, unsigned(p), 0));
}
inline int any_sync(Site s, unsigned mask, int p) { return int(collective(s, Collective::Any, mask, unsigned(p), 0)); }
inline int all_sync(Site s, unsigned mask, int p) { return int(collective(s, Collective::All, mask, unsigned(p), 0)); }
template <class T>
inline unsigned match_any_sync(Site s, unsigned mask, T value) {
  static_assert(std::is_integral_v<T> || std::is_floating_point_v<T>, "__match_any_sync takes a 32- or 64-bit value");
  return unsigned(collective(s, Collective::MatchAny, mask, to_lane_bits(value), 0));
}
/// The mask when every lane of it holds the same value (and *pred = 1), else 0 (*pred = 0).
template <class T>
inline unsigned match_all_sync(Site s, unsigned mask, T value, int* pred) {
  static_assert(std::is_integral_v<T> || std::is_floating_point_v<T>, "__match_all_sync takes a 32- or 64-bit value");
  const unsigned long long r = collective(s, Collective::MatchAll, mask, to_lane_bits(value), 0);
  *pred = int(r >> 32);
  return unsigned(r);
}
template <class T>
inline T reduce_bits(Site s, Collective k, unsigned mask, T v) {
  static_assert(sizeof(T) == 4 && std::is_integral_v<T>, "__reduce_*_sync takes unsigned or int");
  return T(collective(s, k, mask, to_lane_bits(v), 0));
}

}  // namespace ampgrad::emu

/// The lanes of the warp that have not exited (the emulator does not track convergence:
/// a GPU may report fewer, the lanes that are converged at the call).
inline unsigned __activemask() { return ::ampgrad::emu::detail::active_mask(); }

// ---- memory fences and clocks ------------------------------------------------------------------
inline void __threadfence() {
  ::ampgrad::emu::memory_clobber();
  std::atomic_thread_fence(std::memory_order_seq_cst);
}
inline void __threadfence_block() { __threadfence(); }
inline void __threadfence_system() { __threadfence(); }
/// A steady clock's nanoseconds (no cycle counter): differences mean elapsed time.
inline long long clock64() { return ::ampgrad::emu::detail::clock_ticks(); }
inline long clock() { return long(::ampgrad::emu::detail::clock_ticks()); }
inline void __nanosleep(unsigned) {}
/// Read-only loads through the texture path: a plain load here.
template <class T>
inline T __ldg(const T* p) {
  return *p;
}

// ---- atomics ---------------------------------------------------------------------------------
// The types CUDA provides each for (sm_80/sm_90); each returns the old value.
#define AMPGRAD_EMU_ATOMIC_ADD_SUB(T)                                                 \
  inline T atomicAdd(T* p, T v) { return ::ampgrad::emu::atomic_at(p).fetch_add(v); } \
  inline T atomicSub(T* p, T v) { return ::ampgrad::emu::atomic_at(p).fetch_sub(v); }
AMPGRAD_EMU_ATOMIC_ADD_SUB(int)
AMPGRAD_EMU_ATOMIC_ADD_SUB(unsigned int)
#undef AMPGRAD_EMU_ATOMIC_ADD_SUB
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return ::ampgrad::emu::atomic_at(p).fetch_add(v);
}
inline float atomicAdd(float* p, float v) { return ::ampgrad::emu::atomic_at(p).fetch_add(v); }
inline double atomicAdd(double* p, double v) { return ::ampgrad::emu::atomic_at(p).fetch_add(v); }

#define AMPGRAD_EMU_ATOMIC_EXCH_CAS(T)                                                \
  inline T atomicExch(T* p, T v) { return ::ampgrad::emu::atomic_at(p).exchange(v); } \
  inline T atomicCAS(T* p, T compare, T v) {                                          \
    ::ampgrad::emu::atomic_at(p).compare_exchange_strong(compare, v);                 \
    return compare;                                                                   \
  }
AMPGRAD_EMU_ATOMIC_EXCH_CAS(int)
AMPGRAD_EMU_ATOMIC_EXCH_CAS(unsigned int)
AMPGRAD_EMU_ATOMIC_EXCH_CAS(unsigned long long)
AMPGRAD_EMU_ATOMIC_EXCH_CAS(unsigned short)
#undef AMPGRAD_EMU_ATOMIC_EXCH_CAS
inline float atomicExch(float* p, float v) { return ::ampgrad::emu::atomic_at(p).exchange(v); }

#define AMPGRAD_EMU_ATOMIC_MIN_MAX(T)                     \
  inline T atomicMin(T* p, T v) {                         \
    auto a = ::ampgrad::emu::atomic_at(p);                \
    T old = a.load();                                     \
    while (v < old && !a.compare_exchange_weak(old, v)) { \
    }                                                     \
    return old;                                           \
  }                                                       \
  inline T atomicMax(T* p, T v) {                         \
    auto a = ::ampgrad::emu::atomic_at(p);                \
    T old = a.load();                                     \
    while (v > old && !a.compare_exchange_weak(old, v)) { \
    }                                                     \
    return old;                                           \
  }
AMPGRAD_EMU_ATOMIC_MIN_MAX(int)
AMPGRAD_EMU_ATOMIC_MIN_MAX(unsigned int)
AMPGRAD_EMU_ATOMIC_MIN_MAX(long long)
AMPGRAD_EMU_ATOMIC_MIN_MAX(unsigned long long)
#undef AMPGRAD_EMU_ATOMIC_MIN_MAX

#define AMPGRAD_EMU_ATOMIC_BITS(T)                                                    \
  inline T atomicAnd(T* p, T v) { return ::ampgrad::emu::atomic_at(p).fetch_and(v); } \
  inline T atomicOr(T* p, T v) { return ::ampgrad::emu::atomic_at(p).fetch_or(v); }   \
  inline T atomicXor(T* p, T v) { return ::ampgrad::emu::atomic_at(p).fetch_xor(v); }
AMPGRAD_EMU_ATOMIC_BITS(int)
AMPGRAD_EMU_ATOMIC_BITS(unsigned int)
AMPGRAD_EMU_ATOMIC_BITS(unsigned long long)
#undef AMPGRAD_EMU_ATOMIC_BITS

/// ((old >= v) ? 0 : old + 1), as CUDA's atomicInc.
inline unsigned int atomicInc(unsigned int* p, unsigned int v) {
  auto a = ::ampgrad::emu::atomic_at(p);
  unsigned int old = a.load();
  while (!a.compare_exchange_weak(old, old >= v ? 0u : old + 1u)) {
  }
  return old;
}
/// (((old == 0) || (old > v)) ? v : old - 1), as CUDA's atomicDec.
inline unsigned int atomicDec(unsigned int* p, unsigned int v) {
  auto a = ::ampgrad::emu::atomic_at(p);
  unsigned int old = a.load();
  while (!a.compare_exchange_weak(old, (old == 0u || old > v) ? v : old - 1u)) {
  }
  return old;
}
