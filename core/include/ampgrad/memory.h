// Allocation statistics per device, for tests and benchmarks that must prove a path
// allocates nothing:
//
//   const uint64_t before = ag::memory_stats(ag::kCPU).allocations;
//   ag::Tensor y = ag::mul(t, 2.0);   // the output, and nothing for the scalar
//   EXPECT_EQ(ag::memory_stats(ag::kCPU).allocations, before + 1);
//
// Pinned host memory (Tensor::pin_memory) is CPU memory and counts there.
#pragma once

#include <cstdint>

#include "ampgrad/device.h"

namespace ampgrad {

struct MemoryStats {
  /// Tensor storages allocated on the device (every size; a block served from a cache counts).
  uint64_t allocations = 0;
  /// Tensor storages freed.
  uint64_t frees = 0;
  /// Bytes held by live storages.
  uint64_t bytes_in_use = 0;

  /// Of the allocations, those the backend served from blocks it kept from earlier frees
  /// (the CPU keeps blocks of 64 KiB and more in one cache, and blocks of up to 4 KiB per
  /// thread, at most 16 of each 64-byte size, except under AddressSanitizer). CUDA's
  /// stream-ordered pools reuse memory inside the driver, unseen here, so on CUDA this
  /// stays 0.
  uint64_t cache_hits = 0;
  /// Of the allocations, those that asked the system for memory: allocations - cache_hits.
  uint64_t system_allocations = 0;
  /// The most bytes_in_use reached since the process started or reset_peak_memory_stats.
  uint64_t peak_bytes_in_use = 0;
  /// Bytes in freed blocks the backend keeps for reuse (in no storage; empty_cache returns
  /// them to the system: on the CPU the large blocks and the calling thread's small ones;
  /// another thread's small blocks go back when that thread ends).
  uint64_t bytes_cached = 0;
  /// Frees of storages used on other streams too (record_stream), which waited for an
  /// event on each of those streams before their block was released.
  uint64_t deferred_frees = 0;
  /// Of those, blocks still held now: not yet checked, or an event they wait for had not
  /// completed. Held blocks are checked at the device's next allocation, at synchronize and
  /// at empty_cache (on the CPU, where events complete when recorded, the first check
  /// releases them).
  uint64_t pending_frees = 0;
};

/// The statistics of one device (all indices of a device type share one counter set per
/// index), counted by every thread since the process started. Never throws: a device type
/// this build lacks has all zeros.
MemoryStats memory_stats(Device device);

/// Starts peak_bytes_in_use again from the current bytes_in_use.
void reset_peak_memory_stats(Device device);

/// Releases held blocks whose streams have finished with them, then returns the blocks the
/// backend keeps for reuse to the system.
void empty_cache(Device device);

namespace cuda {
/// The memory of one CUDA device in PyTorch's terms (torch.cuda.memory_allocated, ...).
struct MemoryStats {
  /// Bytes held by live tensor storages.
  uint64_t allocated = 0;
  /// Bytes the device's stream-ordered pool holds: allocated plus freed blocks kept for
  /// reuse. Flat from one training step to the next once the steady state is reached: the
  /// step then calls neither cudaMalloc nor cudaFree.
  uint64_t reserved = 0;
  /// The most bytes allocated since the process started or reset_peak_memory_stats.
  uint64_t peak = 0;
};
/// The statistics of cuda:`device` (all zeros in a build without CUDA or without a GPU).
MemoryStats memory_stats(int device = 0);
void reset_peak_memory_stats(int device = 0);
}  // namespace cuda

}  // namespace ampgrad
