// What the CUDA emulator's self-tests share (tests/emulator/, emulated build only): device
// buffers, launching through the backend's own helper, and reading a fault back.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "cuda/launch.cuh"
#include "emu/control.h"

namespace emutest {

using ampgrad::cuda::launch;

/// A device buffer of n elements of T (the emulator's poison in it until written).
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) { EXPECT_EQ(cudaMalloc(&p_, n * sizeof(T)), cudaSuccess); }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    EXPECT_EQ(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  /// Waits for everything queued before (a synchronous copy on the legacy stream).
  std::vector<T> download() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

/// Waits for the device, then clears the sticky error a provoked fault leaves (on a GPU
/// the process could not use the device again); returns what the wait returned.
inline cudaError_t sync_and_clear() {
  const cudaError_t e = cudaDeviceSynchronize();
  ampgrad::emu::clear_sticky_error();
  return e;
}

/// The bits of a value.
template <class T>
unsigned long long bits_of(const T& v) {
  unsigned long long b = 0;
  std::memcpy(&b, &v, sizeof v);
  return b;
}

}  // namespace emutest
