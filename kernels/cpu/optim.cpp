// Fused multi-tensor optimizer steps: one call for every listed parameter, one pass over
// each parameter, its gradient and its float32 state. A step that the grad scaler skips
// (found_inf nonzero) writes nothing, step counters included.
// The update is computed in float32 (float64 for float64 parameters) following PyTorch's
// documented rules; a float32 master copy, when given, is updated and the parameter
// receives its rounding.
#include <cmath>

#include "cpu/cpu_backend.h"
#include "cpu/parallel.h"
#include "cpu/vec.h"

namespace ampgrad::cpu {

namespace {

double scalar_value(const Tensor& t, const char* op) {
  AG_CHECK(t.numel() == 1 && (t.dtype() == kFloat64 || t.dtype() == kFloat32), op,
           "a learning-rate tensor must be float64 or float32 with one element");
  return t.dtype() == kFloat64 ? *t.data_ptr<double>() : double(*t.data_ptr<float>());
}

// What every fused step checks and reads once: the lists agree, the step is not skipped
// (found_inf is read in place: this is the device), and the learning rate.
bool begin_step(const OptimizerLists& l, const char* op, double& lr) {
  const size_t n = l.params.size();
  AG_CHECK(l.grads.size() == n && l.steps.size() == n && l.masters.size() == n && (l.buf1.empty() || l.buf1.size() == n) &&
               (l.buf2.empty() || l.buf2.size() == n),
           op, "parameter, gradient, state and step lists differ in length (", n, " parameters)");
  if (l.found_inf.defined()) {
    AG_CHECK(l.found_inf.dtype() == kFloat32 && l.found_inf.numel() == 1, op,
             "found_inf must be a float32 tensor of one element");
    if (*l.found_inf.data_ptr<float>() != 0.0f) return false;
  }
  lr = l.lr.tensor.defined() ? scalar_value(l.lr.tensor, op) : l.lr.value;
  return true;
}

}  // namespace

void CpuBackend::sgd_step(const OptimizerLists& l, const SgdParams& s) {
  double lr_value;
  if (!begin_step(l, "SGD", lr_value)) return;
  for (size_t k = 0; k < l.params.size(); ++k) {
    const Tensor& param = l.params[k];
    int64_t& step = *l.steps[k].data_ptr<int64_t>();
    dispatch_floating(param.dtype(), "SGD", [&]<class T>() {
      using A = acc_type_t<T>;
      T* p = param.data_ptr<T>();
      const T* g = l.grads[k].data_ptr<T>();
      float* buf = l.buf1.empty() || !l.buf1[k].defined() ? nullptr : l.buf1[k].data_ptr<float>();
      float* m = l.masters[k].defined() ? l.masters[k].data_ptr<float>() : nullptr;
      const A lr = A(lr_value), mom = A(s.momentum), damp = A(1 - s.dampening), wd = A(s.weight_decay);
      const bool first = step == 0, nesterov = s.nesterov;
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
    ++step;
  }
}

void CpuBackend::adam_step(const OptimizerLists& l, const AdamParams& s) {
  const char* op = s.decoupled ? "AdamW" : "Adam";
  double lr_value;
  if (!begin_step(l, op, lr_value)) return;
  AG_CHECK(l.buf1.size() == l.params.size() && l.buf2.size() == l.params.size(), op, "expected both moment lists");
  for (size_t k = 0; k < l.params.size(); ++k) {
    const Tensor& param = l.params[k];
    int64_t& step = *l.steps[k].data_ptr<int64_t>();
    const int64_t t = step + 1;  // the 1-based step of this update
    dispatch_floating(param.dtype(), op, [&]<class T>() {
      using A = acc_type_t<T>;
      T* p = param.data_ptr<T>();
      const T* g = l.grads[k].data_ptr<T>();
      float* m1 = l.buf1[k].data_ptr<float>();
      float* m2 = l.buf2[k].data_ptr<float>();
      float* mw = l.masters[k].defined() ? l.masters[k].data_ptr<float>() : nullptr;
      const A b1 = A(s.beta1), b2 = A(s.beta2), eps = A(s.eps);
      // 1 - beta in double: float(1) - float(0.999) is off by 1.3e-5 relative.
      const A omb1 = A(1 - s.beta1), omb2 = A(1 - s.beta2);
      const A bc1 = A(1 - std::pow(s.beta1, double(t)));
      const A bc2_sqrt = A(std::sqrt(1 - std::pow(s.beta2, double(t))));
      const A step_size = A(lr_value) / bc1;
      const A decay = s.decoupled ? A(1 - lr_value * s.weight_decay) : A(1);
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
    step = t;
  }
}

}  // namespace ampgrad::cpu
