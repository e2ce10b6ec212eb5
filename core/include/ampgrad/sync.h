// Host syncs: every place where the framework makes the host wait for a tensor's values.
//
// On an asynchronous device (CUDA) reading a value on the host (item, to_vector, printing,
// a copy to the CPU, synchronize, the bool of a device flag) stalls the host until the
// device has finished everything queued before it. ampgrad routes each such read through
// one function, detail::note_host_sync, which counts it. The CPU counts the very same
// calls, although there nothing waits, so a test on the CPU proves that a training step
// makes no host sync on any device:
//
//   const uint64_t before = ag::host_sync_count();
//   train_one_iteration();
//   EXPECT_EQ(ag::host_sync_count(), before);
#pragma once

#include <cstdint>
#include <functional>

namespace ampgrad {

/// Host syncs counted so far in this process, by every thread.
uint64_t host_sync_count();

/// Calls `observer(what)` on every host sync of the calling thread until reset (pass an
/// empty function): what made the sync ("item", "to_vector", "print", ...). For finding
/// the sync a test counted.
void set_host_sync_observer(std::function<void(const char* what)> observer);

/// With debug sync on, an accelerator waits after every kernel and reports its errors (an
/// index out of range found on the device, a failed launch) at the op that caused them,
/// rather than at the next host sync. Slow; for finding a bug. Off by default. The waits
/// are not counted as host syncs.
void set_debug_sync(bool on);
bool debug_sync();

namespace detail {
/// Counts one host sync; `what` names the reason. The one place a sync is counted.
void note_host_sync(const char* what);
}  // namespace detail

}  // namespace ampgrad
