// Random fills from the counter-based Philox generator: element i of a draw uses counter
// offset + i, so results depend on (seed, offset) only.
#include <cmath>

#include "cpu/cpu_backend.h"
#include "cpu/parallel.h"
#include "cpu/vec.h"
#include "philox.h"

namespace ampgrad::cpu {
namespace {

template <class Gen>
void fill_random(const Tensor& out, const char* op, const Gen& gen) {
  Tensor dst = out.is_contiguous() ? out : make_tensor(out.sizes(), out.dtype(), out.device());
  dispatch_floating(dst.dtype(), op, [&]<class T>() {
    T* p = static_cast<T*>(dst.raw_data());
    parallel_for(0, dst.numel(), 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = cast<T>(gen(i));
    });
  });
  if (!out.is_contiguous()) cpu_backend().copy(dst, out);
}

}  // namespace

void CpuBackend::uniform(const Tensor& out, double low, double high, uint64_t seed, uint64_t offset) {
  const double span = high - low;
  fill_random(out, "uniform", [&](int64_t i) {
    const kernels::Philox4x32 r(seed, offset + uint64_t(i));
    double v = low + span * kernels::uniform01(r.out[0], r.out[1]);
    return v < high ? v : low;  // rounding must not reach the open end
  });
}

void CpuBackend::normal(const Tensor& out, double mean, double std, uint64_t seed, uint64_t offset) {
  fill_random(out, "normal", [&](int64_t i) {
    const kernels::Philox4x32 r(seed, offset + uint64_t(i));
    const double u1 = 1.0 - kernels::uniform01(r.out[0], r.out[1]);  // (0, 1]
    const double u2 = kernels::uniform01(r.out[2], r.out[3]);
    return mean + std * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  });
}

}  // namespace ampgrad::cpu
