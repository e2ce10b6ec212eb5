// What the tests of the emulated cuBLASLt and cuDNN share: waiting for the work a library
// call queued on a stream. The libraries' tests hand them host memory: in the emulator a
// device pointer is an ordinary pointer.
#pragma once

#include <gtest/gtest.h>

#include "emu/stream.h"

#ifdef AMPGRAD_EMU_LIBS_STANDALONE
// Built with the two library sources alone (no runtime): test_cublaslt.cpp supplies an
// enqueue that runs the work at once.
inline void wait_for(cudaStream_t) {}
#else
#include <cuda_runtime.h>
/// Waits until the work queued on `stream` has run.
inline void wait_for(cudaStream_t stream) { ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess); }
#endif
