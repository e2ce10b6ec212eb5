// Random fills from the counter-based Philox generator: element i of a draw uses counter
// offset + i, so results depend on (seed, offset) only.
#include <cmath>
#include <cstdint>
#include <limits>

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
      for (int64_t i = b; i < e; ++i) p[i] = gen.template operator()<T>(i);
    });
  });
  if (!out.is_contiguous()) cpu_backend().copy(dst, out);
}

// The largest value of T below x (and not below floor), for the rare draw that rounds up.
template <class T>
T below(double x, double floor) {
  if constexpr (is_float16_v<T>) {
    T t = cast<T>(x);
    while (cast<double>(t) >= x) {
      const uint16_t b = t.bits();
      // one step toward -inf: positive values lose a unit in the last place, negative gain one
      t = T::from_bits((b & 0x7FFF) == 0 ? uint16_t(0x8001) : (b & 0x8000) ? uint16_t(b + 1) : uint16_t(b - 1));
    }
    return cast<double>(t) < floor ? cast<T>(floor) : t;
  } else {
    const T t = std::nextafter(T(x), -std::numeric_limits<T>::infinity());
    return t < T(floor) ? T(floor) : t;
  }
}

}  // namespace

void CpuBackend::uniform(const Tensor& out, double low, double high, uint64_t seed, uint64_t offset) {
  const double span = high - low;
  fill_random(out, "uniform", [&]<class T>(int64_t i) {
    const kernels::Philox4x32 r(seed, offset + uint64_t(i));
    const T v = cast<T>(low + span * kernels::uniform01(r.out[0], r.out[1]));
    // Rounding to the dtype may reach the open end (once in 2^9 bfloat16 draws of [0, 1)):
    // such a draw takes the dtype's largest value below `high` instead.
    return cast<double>(v) < high ? v : below<T>(high, low);
  });
}

void CpuBackend::normal(const Tensor& out, double mean, double std, uint64_t seed, uint64_t offset) {
  fill_random(out, "normal", [&]<class T>(int64_t i) {
    const kernels::Philox4x32 r(seed, offset + uint64_t(i));
    const double u1 = 1.0 - kernels::uniform01(r.out[0], r.out[1]);  // (0, 1]
    const double u2 = kernels::uniform01(r.out[2], r.out[3]);
    return cast<T>(mean + std * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  });
}

}  // namespace ampgrad::cpu
