// AG_HOST_DEVICE: marks a function callable from host code and, under nvcc, from CUDA
// device code too. The scalar code shared by every backend (the 16-bit float conversions,
// the elementwise functors, the Philox generator) uses it; a plain C++ compiler sees
// nothing.
#pragma once

#ifndef AG_HOST_DEVICE
#if defined(__CUDACC__)
#define AG_HOST_DEVICE __host__ __device__
#else
#define AG_HOST_DEVICE
#endif
#endif
