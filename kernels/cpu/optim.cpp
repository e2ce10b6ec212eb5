// Fused optimizer steps: one pass over a parameter, its gradient and its float32 state.
// The update is computed in float32 (float64 for float64 parameters) following PyTorch's
// documented rules; a float32 master copy, when given, is updated and the parameter
// receives its rounding.
#include <cmath>

#include "cpu/cpu_backend.h"
#include "cpu/parallel.h"
#include "cpu/vec.h"

namespace ampgrad::cpu {

void CpuBackend::sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum,
                          const Tensor& master, const SgdStep& s) {
  dispatch_floating(param.dtype(), "SGD", [&]<class T>() {
    using A = acc_type_t<T>;
    T* p = param.data_ptr<T>();
    const T* g = grad.data_ptr<T>();
    float* buf = momentum.defined() ? momentum.data_ptr<float>() : nullptr;
    float* m = master.defined() ? master.data_ptr<float>() : nullptr;
    const A lr = A(s.lr), mom = A(s.momentum), damp = A(1 - s.dampening), wd = A(s.weight_decay);
    const bool first = s.first, nesterov = s.nesterov;
    // Branch-free loops per (master, momentum) case so that they vectorize, as Adam's.
    auto run = [&]<bool kMaster, bool kMomentum>(int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) {
        A w;
        if constexpr (kMaster) w = A(m[i]);
        else w = cast<A>(p[i]);
        A d = cast<A>(g[i]) + wd * w;
        if constexpr (kMomentum) {
          const A v = first ? d : mom * A(buf[i]) + damp * d;  // loop-invariant choices
          buf[i] = float(v);
          d = nesterov ? d + mom * v : v;
        }
        w -= lr * d;
        if constexpr (kMaster) m[i] = float(w);
        p[i] = cast<T>(w);
      }
    };
    parallel_for(0, param.numel(), 16384, [&](int64_t b, int64_t e) {
      if (m && buf) run.template operator()<true, true>(b, e);
      else if (m) run.template operator()<true, false>(b, e);
      else if (buf) run.template operator()<false, true>(b, e);
      else run.template operator()<false, false>(b, e);
    });
  });
}

void CpuBackend::adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                           const Tensor& exp_avg_sq, const Tensor& master, const AdamStep& s) {
  dispatch_floating(param.dtype(), s.decoupled ? "AdamW" : "Adam", [&]<class T>() {
    using A = acc_type_t<T>;
    T* p = param.data_ptr<T>();
    const T* g = grad.data_ptr<T>();
    float* m1 = exp_avg.data_ptr<float>();
    float* m2 = exp_avg_sq.data_ptr<float>();
    float* mw = master.defined() ? master.data_ptr<float>() : nullptr;
    const A b1 = A(s.beta1), b2 = A(s.beta2), eps = A(s.eps);
    // 1 - beta in double: float(1) - float(0.999) is off by 1.3e-5 relative.
    const A omb1 = A(1 - s.beta1), omb2 = A(1 - s.beta2);
    const A bc1 = A(1 - std::pow(s.beta1, double(s.step)));
    const A bc2_sqrt = A(std::sqrt(1 - std::pow(s.beta2, double(s.step))));
    const A step_size = A(s.lr) / bc1;
    const A decay = s.decoupled ? A(1 - s.lr * s.weight_decay) : A(1);
    const A l2 = s.decoupled ? A(0) : A(s.weight_decay);
    // One loop per master/no-master case, without branches or assumed aliasing, so that
    // it vectorizes (it did not with the branch inside: a third of a small model's step).
    auto run = [&]<bool kMaster>(int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) {
        A w;
        if constexpr (kMaster) w = A(mw[i]);
        else w = cast<A>(p[i]);
        const A gi = cast<A>(g[i]) + l2 * w;
        w *= decay;
        const A a = b1 * A(m1[i]) + omb1 * gi;
        const A v = b2 * A(m2[i]) + omb2 * gi * gi;
        m1[i] = float(a);
        m2[i] = float(v);
        w -= step_size * a / (std::sqrt(v) / bc2_sqrt + eps);
        if constexpr (kMaster) mw[i] = float(w);
        p[i] = cast<T>(w);
      }
    };
    parallel_for(0, param.numel(), 16384, [&](int64_t b, int64_t e) {
      if (mw) run.template operator()<true>(b, e);
      else run.template operator()<false>(b, e);
    });
  });
}

}  // namespace ampgrad::cpu
