// The CUDA backend. So far it holds memory and moves bytes between host and device; the
// kernel families arrive with the CUDA backend issue, and until then every other entry
// point inherits the default that names the op and says it is not implemented on cuda.
// Every CUDA runtime call goes through AG_CUDA_CHECK, which names the failing call.
#include <cuda_runtime.h>

#include "ampgrad/backend.h"
#include "ampgrad/hw/profile.h"

#define AG_CUDA_CHECK(op, call)                                                   \
  do {                                                                            \
    const cudaError_t err_ = (call);                                              \
    if (err_ != cudaSuccess)                                                      \
      AG_ERROR(op, #call " failed: ", cudaGetErrorString(err_));                  \
  } while (0)

namespace ampgrad {
namespace {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

class CudaBackend final : public Backend {
 public:
  DeviceType device_type() const override { return DeviceType::CUDA; }

  void* allocate(size_t nbytes, int device_index) override {
    check_device(device_index, "allocate");
    AG_CUDA_CHECK("allocate", cudaSetDevice(device_index));
    void* p = nullptr;
    AG_CUDA_CHECK("allocate", cudaMalloc(&p, nbytes ? nbytes : 1));
    return p;
  }
  void deallocate(void* p, size_t, int device_index) override {
    if (!p) return;
    cudaSetDevice(device_index);
    cudaFree(p);  // never throws from a destructor path
  }
  void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n) override {
    const cudaMemcpyKind kind = dst_device.is_cuda() && src_device.is_cuda() ? cudaMemcpyDeviceToDevice
                                : dst_device.is_cuda()                       ? cudaMemcpyHostToDevice
                                                                             : cudaMemcpyDeviceToHost;
    AG_CUDA_CHECK("copy", cudaMemcpy(dst, src, n, kind));
  }

 private:
  static void check_device(int index, const char* op) {
    const int n = device_count();
    AG_CHECK(n > 0, op, "no CUDA device is available (this build has CUDA, the machine has no GPU or driver)");
    AG_CHECK(index >= 0 && index < n, op, "CUDA device ", index, " does not exist (", n, " found)");
  }
};

}  // namespace

Backend& cuda_backend(const char* op) {
  static CudaBackend* b = new CudaBackend();
  (void)op;
  return *b;
}

bool built_with_cuda() { return true; }

namespace hw::detail {
// For the hardware profile: any runtime error (no driver, a device that fails to answer)
// gives an empty list, never an exception, and the sticky error is cleared.
std::vector<CudaDevice> query_cuda_devices() {
  std::vector<CudaDevice> out;
  const int n = device_count();
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      cudaGetLastError();
      return {};
    }
    out.push_back({i, prop.name, prop.major, prop.minor, prop.totalGlobalMem, prop.multiProcessorCount});
  }
  return out;
}
}  // namespace hw::detail

}  // namespace ampgrad
