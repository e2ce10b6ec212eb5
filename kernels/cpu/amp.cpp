// The grad scaler's kernels: scale a list of gradients in place and flag inf/NaN in one
// pass; the sum of squares of a list (gradient clipping); the scale update rule.
//
// The finiteness test is on the value before scaling (PyTorch's rule) and looks at the
// exponent bits, so it vectorises and survives -ffast-math. 16-bit gradients are widened to
// float in chunks of kChunk and written back. Each parallel_for range keeps its own flag;
// ranges that saw a non-finite value store true into one atomic (a relaxed store of the
// same value from several threads is race-free), and the flag tensor is written once.
//
// Reference: kernels/reference/include/ampgrad/reference/grad_scaler.h (float64, the specification).
#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <limits>
#include <vector>

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

namespace {

// The value of a one-element float32 or float64 tensor (read in place: this is the device).
double scalar_of(const Tensor& t, const char* op, const char* what) {
  AG_CHECK(t.defined() && t.numel() == 1 && (t.dtype() == kFloat32 || t.dtype() == kFloat64), op, what,
           " must be a float32 or float64 tensor of one element");
  return t.dtype() == kFloat32 ? double(*t.data_ptr<float>()) : *t.data_ptr<double>();
}

void check_flag(const Tensor& f, const char* op) {
  AG_CHECK(f.dtype() == kFloat32 && f.numel() == 1, op, "found_inf must be a float32 tensor of one element, got ",
           dtype_name(f.dtype()), " with ", f.numel(), " elements");
}

}  // namespace

void CpuBackend::scale_and_check(const TensorList& xs, const Tensor& factor, const Tensor& found_inf) {
  constexpr const char* kOp = "scale_and_check";
  if (found_inf.defined()) check_flag(found_inf, kOp);
  const double f = scalar_of(factor, kOp, "factor");
  std::atomic<bool> any{false};
  for (const Tensor& x : xs) {
    AG_CHECK(x.is_contiguous(), kOp, "expected contiguous tensors, got strides ", x.strides());
    dispatch_floating(x.dtype(), kOp, [&]<class T>() {
      using A = acc_type_t<T>;
      const A s = A(f);
      T* g = x.data_ptr<T>();
      parallel_for(0, x.numel(), kGrain, [&](int64_t b, int64_t e) {
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
  }
  if (found_inf.defined() && any.load(std::memory_order_relaxed)) *found_inf.data_ptr<float>() = 1.0f;
}

// Fixed chunks (by position, not by thread) summed in the accumulation type, then the
// chunk sums added in order in double: the result does not depend on the thread count.
void CpuBackend::sum_of_squares(const TensorList& xs, const Tensor& out) {
  constexpr const char* kOp = "sum_of_squares";
  AG_CHECK(out.dtype() == kFloat32 && out.numel() == 1, kOp, "out must be a float32 tensor of one element");
  constexpr int64_t kPart = 8192;
  struct Part {
    size_t tensor;
    int64_t begin, end;
  };
  std::vector<Part> parts;
  for (size_t t = 0; t < xs.size(); ++t) {
    AG_CHECK(xs[t].is_contiguous(), kOp, "expected contiguous tensors, got strides ", xs[t].strides());
    AG_CHECK(xs[t].is_floating_point(), kOp, "expected floating tensors, got ", dtype_name(xs[t].dtype()));
    for (int64_t b = 0; b < xs[t].numel(); b += kPart) parts.push_back({t, b, std::min(b + kPart, xs[t].numel())});
  }
  std::vector<double> sums(parts.size());
  parallel_for(0, int64_t(parts.size()), 4, [&](int64_t pb, int64_t pe) {
    for (int64_t k = pb; k < pe; ++k) {
      const Part& pt = parts[size_t(k)];
      const Tensor& x = xs[pt.tensor];
      dispatch_floating(x.dtype(), kOp, [&]<class T>() {
        using A = acc_type_t<T>;
        const T* p = x.data_ptr<T>();
        A acc = 0;
        if constexpr (is_half_v<T>) {
          alignas(64) float buf[kChunk];
          for (int64_t i = pt.begin; i < pt.end; i += kChunk) {
            const int64_t n = std::min<int64_t>(kChunk, pt.end - i);
            load_acc<T>(reinterpret_cast<const char*>(p + i), int64_t(sizeof(T)), buf, n);
            for (int64_t j = 0; j < n; ++j) acc += buf[j] * buf[j];
          }
        } else {
#pragma omp simd reduction(+ : acc)
          for (int64_t i = pt.begin; i < pt.end; ++i) acc += p[i] * p[i];
        }
        sums[size_t(k)] = double(acc);
      });
    }
  });
  double total = 0;
  for (double v : sums) total += v;
  *out.data_ptr<float>() = float(total);
}

void CpuBackend::update_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                              const ScaleUpdateRule& r) {
  constexpr const char* kOp = "update_scale";
  AG_CHECK(scale.dtype() == kFloat64 && scale.numel() == 1, kOp, "scale must be a float64 tensor of one element");
  AG_CHECK(growth_tracker.dtype() == kInt64 && growth_tracker.numel() == 1, kOp,
           "growth_tracker must be an int64 tensor of one element");
  check_flag(found_inf, kOp);
  double& s = *scale.data_ptr<double>();
  int64_t& tracker = *growth_tracker.data_ptr<int64_t>();
  if (*found_inf.data_ptr<float>() != 0.0f) {
    s = std::max(s * r.backoff_factor, r.min_scale);
    tracker = 0;
  } else if (++tracker >= r.growth_interval) {
    // The scale is applied as a float32 tensor, so growth beyond float32 is refused.
    const double grown = s * r.growth_factor;
    if (grown <= double(std::numeric_limits<float>::max())) s = std::min(grown, r.max_scale);
    tracker = 0;
  }
}

}  // namespace ampgrad::cpu
