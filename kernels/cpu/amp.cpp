// The grad scaler's fused kernel: unscale a gradient in place and flag inf/NaN, in one pass.
//
// The finiteness test is on the value before scaling (PyTorch's rule) and looks at the
// exponent bits, so it vectorises and survives -ffast-math. 16-bit gradients are widened to
// float in chunks of kChunk and written back. Each parallel_for range keeps its own flag;
// ranges that saw a non-finite value store true into one atomic (a relaxed store of the
// same value from several threads is race-free), and the flag tensor is written once.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>

#include "cpu/cpu_backend.h"
#include "cpu/parallel.h"
#include "cpu/vec.h"

namespace ampgrad::cpu {
namespace {

// Scales n values of A in place; returns nonzero when any of them was inf or NaN.
template <class A>
inline uint32_t unscale_run(A* p, int64_t n, A s) {
  using U = std::conditional_t<sizeof(A) == 4, uint32_t, uint64_t>;
  constexpr U kExp = sizeof(A) == 4 ? U(0x7F800000u) : U(0x7FF0000000000000ull);
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const A x = p[i];
    bad |= uint32_t((std::bit_cast<U>(x) & kExp) == kExp);  // all-ones exponent: inf or NaN
    p[i] = x * s;
  }
  return bad;
}

}  // namespace

void CpuBackend::amp_unscale_and_check(const Tensor& grad, double inv_scale, const Tensor& found_inf) {
  constexpr const char* kOp = "amp_unscale_and_check";
  AG_CHECK(grad.is_contiguous(), kOp, "expected a contiguous gradient, got strides ",
           grad.strides());
  AG_CHECK(found_inf.dtype() == kFloat32 && found_inf.numel() == 1, kOp,
           "found_inf must be a float32 tensor of one element, got ", dtype_name(found_inf.dtype()),
           " with ", found_inf.numel(), " elements");
  std::atomic<bool> any{false};
  dispatch_floating(grad.dtype(), kOp, [&]<class T>() {
    using A = acc_type_t<T>;
    const A s = A(inv_scale);
    T* g = grad.data_ptr<T>();
    parallel_for(0, grad.numel(), kGrain, [&](int64_t b, int64_t e) {
      uint32_t bad = 0;
      if constexpr (is_half_v<T>) {
        alignas(64) float buf[kChunk];
        for (int64_t i = b; i < e; i += kChunk) {
          const int64_t n = std::min<int64_t>(kChunk, e - i);
          load_acc<T>(reinterpret_cast<const char*>(g + i), int64_t(sizeof(T)), buf, n);
          bad |= unscale_run<float>(buf, n, s);
          store_acc<T>(buf, reinterpret_cast<char*>(g + i), int64_t(sizeof(T)), n);
        }
      } else {
        bad = unscale_run<A>(g + b, e - b, s);
      }
      if (bad) any.store(true, std::memory_order_relaxed);
    });
  });
  if (any.load(std::memory_order_relaxed)) *found_inf.data_ptr<float>() = 1.0f;
}

}  // namespace ampgrad::cpu
