// Fused multi-tensor optimizer steps: one call for every listed parameter, one pass over
// each parameter, its gradient and its float32 state. A step that the grad scaler skips
// (found_inf nonzero) writes nothing, step counters included.
// The update is computed in float32 (float64 for float64 parameters) following PyTorch's
// documented rules; a float32 master copy, when given, is updated and the parameter
// receives its rounding.
#include <algorithm>
#include <cmath>
#include <vector>

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
bool begin_step(const OptimizerLists& l, const char* op, bool two_moments, double& lr) {
  l.check(op, two_moments);
  if (l.found_inf.defined() && *l.found_inf.data_ptr<float>() != 0.0f) return false;
  lr = l.lr.tensor.defined() ? scalar_value(l.lr.tensor, op) : l.lr.value;
  return true;
}

// Runs body(k, begin, end) over the elements of every parameter, cut into pieces, in one
// parallel region: a step over many small parameters pays for one thread team, not one per
// parameter. Steps of 16384 elements or fewer in all stay on the calling thread.
template <class Body>
void for_each_piece(const TensorList& params, const Body& body) {
  constexpr int64_t kPiece = 16384;
  struct Piece {
    size_t k;
    int64_t begin, end;
  };
  std::vector<Piece> pieces;
  int64_t total = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    const int64_t n = params[k].numel();
    total += n;
    for (int64_t b = 0; b < n; b += kPiece) pieces.push_back({k, b, std::min(b + kPiece, n)});
  }
  const int64_t np = int64_t(pieces.size());
  parallel_for(0, np, total <= kPiece ? np : 1, [&](int64_t pb, int64_t pe) {
    for (int64_t i = pb; i < pe; ++i) body(pieces[size_t(i)].k, pieces[size_t(i)].begin, pieces[size_t(i)].end);
  });
}

}  // namespace

void CpuBackend::sgd_step(const OptimizerLists& l, const SgdParams& s) {
  double lr_value;
  if (!begin_step(l, "SGD", false, lr_value)) return;
  const bool nesterov = s.nesterov;
  for_each_piece(l.params, [&](size_t k, int64_t b, int64_t e) {
    const Tensor& param = l.params[k];
    const bool first = *l.steps[k].data_ptr<int64_t>() == 0;
    dispatch_floating(param.dtype(), "SGD", [&]<class T>() {
      using A = acc_type_t<T>;
      T* p = param.data_ptr<T>();
      const T* g = l.grads[k].data_ptr<T>();
      float* buf = l.buf1.empty() || !l.buf1[k].defined() ? nullptr : l.buf1[k].data_ptr<float>();
      float* m = l.masters[k].defined() ? l.masters[k].data_ptr<float>() : nullptr;
      const A lr = A(lr_value), mom = A(s.momentum), damp = A(1 - s.dampening), wd = A(s.weight_decay);
      // Branch-free loops per (master, momentum) case so that they vectorize, as Adam's.
      auto run = [&]<bool kMaster, bool kMomentum>() {
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
      if (m && buf) run.template operator()<true, true>();
      else if (m) run.template operator()<true, false>();
      else if (buf) run.template operator()<false, true>();
      else run.template operator()<false, false>();
    });
  });
  for (const Tensor& st : l.steps) ++*st.data_ptr<int64_t>();
}

void CpuBackend::adam_step(const OptimizerLists& l, const AdamParams& s) {
  const char* op = s.decoupled ? "AdamW" : "Adam";
  double lr_value;
  if (!begin_step(l, op, true, lr_value)) return;
  // Each parameter's bias corrections, at its own 1-based step.
  struct Corr {
    double bc1, bc2_sqrt;
  };
  std::vector<Corr> corr(l.params.size());
  for (size_t k = 0; k < l.params.size(); ++k) {
    const double t = double(*l.steps[k].data_ptr<int64_t>() + 1);
    corr[k] = {1 - std::pow(s.beta1, t), std::sqrt(1 - std::pow(s.beta2, t))};
  }
  for_each_piece(l.params, [&](size_t k, int64_t b, int64_t e) {
    const Tensor& param = l.params[k];
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
      const A bc1 = A(corr[k].bc1), bc2_sqrt = A(corr[k].bc2_sqrt);
      const A step_size = A(lr_value) / bc1;
      const A decay = s.decoupled ? A(1 - lr_value * s.weight_decay) : A(1);
      const A l2 = s.decoupled ? A(0) : A(s.weight_decay);
      // One loop per master/no-master case, without branches or assumed aliasing, so that
      // it vectorizes (it did not with the branch inside: a third of a small model's step).
      auto run = [&]<bool kMaster>() {
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
      if (mw) run.template operator()<true>();
      else run.template operator()<false>();
    });
  });
  for (const Tensor& st : l.steps) ++*st.data_ptr<int64_t>();
}

}  // namespace ampgrad::cpu
