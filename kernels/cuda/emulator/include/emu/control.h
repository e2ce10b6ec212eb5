// The CUDA emulator's own controls, beyond the CUDA API: for its tests, the test binary's
// set-up and a learner in gdb. Each has an environment variable (docs/cuda-emulator.md).
#pragma once

#include <cstdint>
#include <string>

#include "emu/stream.h"

namespace ampgrad::emu {

/// Strict mode (AMPGRAD_CUDA_EMULATOR_STRICT=1; the test binary turns it on): queued work
/// runs only when something waits for it (a stream, event or device synchronize, an event
/// or stream query, a copy to pageable host memory), so work on one stream never runs early
/// for another that forgot to wait. Otherwise every operation runs when it is queued.
bool strict();
/// Turning strict mode off first runs everything queued.
void set_strict(bool on);

/// The order in which the threads of a block run between two barriers
/// (AMPGRAD_CUDA_EMULATOR_SCHEDULE): increasing threadIdx, decreasing, or increasing in
/// even-numbered blocks and decreasing in odd ones (the default), so that a missing barrier
/// between a writer and a reader shows in one of them whichever comes first in the source.
enum class Schedule { Forward, Reverse, Alternate };
Schedule schedule();
void set_schedule(Schedule s);

/// OS threads that run blocks (AMPGRAD_CUDA_EMULATOR_THREADS; 1 keeps everything on the
/// thread that waits for the work).
int worker_threads();

/// The 16-bit pattern that fills fresh and freed device memory (and fresh pinned memory,
/// and each block's dynamic shared memory): a NaN as float16, bfloat16, float32 (0x7FF47FF4)
/// and float64 (0x7FF47FF47FF47FF4, a signalling NaN). No pattern is a signalling NaN in
/// all four: a float64 NaN needs the exponent bits that make the narrower ones quiet.
inline constexpr uint16_t kPoison16 = 0x7FF4;

/// The operations queued on a stream (nullptr: the legacy default stream) that have not run
/// yet, or -1 for an unknown stream: in strict mode, what a test reads to see which streams
/// a wait made run.
int64_t queued(cudaStream_t stream);

/// The message of the last error inside a kernel (also printed to stderr), or "".
std::string last_fault();
/// The sticky error (a cudaError_t: a fault inside a kernel), or 0.
int sticky_error();
/// Clears a sticky error (a fault inside a kernel), which on a GPU ends the process's use
/// of the device; the emulator's tests provoke faults and go on. last_fault() keeps its
/// message.
void clear_sticky_error();

/// Prints the state of every thread of the block the calling fiber runs (where each waits,
/// which have exited) to stderr: `call ampgrad::emu::print_block()` in gdb.
void print_block();

}  // namespace ampgrad::emu
