// The one interface between the emulated CUDA runtime and the emulated libraries (cuBLASLt,
// cuDNN): a library call queues its work on a stream, as the real libraries do, and the
// runtime runs it in that stream's order (at once, or, in strict mode, when something waits
// for the stream). Device memory is host memory: a device pointer is an ordinary pointer.
#pragma once

#include <functional>

struct CUstream_st;
/// A stream handle; nullptr is the legacy default stream.
typedef CUstream_st* cudaStream_t;

namespace ampgrad::emu {

/// Queues f on `stream`, after everything queued there before it.
void enqueue(cudaStream_t stream, std::function<void()> f);

}  // namespace ampgrad::emu
