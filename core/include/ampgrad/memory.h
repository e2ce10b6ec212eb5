// Allocation statistics per device, for tests and benchmarks that must prove a path
// allocates nothing:
//
//   const uint64_t before = ag::memory_stats(ag::kCPU).allocations;
//   ag::Tensor y = ag::mul(t, 2.0);   // the output, and nothing for the scalar
//   EXPECT_EQ(ag::memory_stats(ag::kCPU).allocations, before + 1);
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
};

/// The statistics of one device (all indices of a device type share one counter set per
/// index), counted by every thread since the process started.
MemoryStats memory_stats(Device device);

}  // namespace ampgrad
