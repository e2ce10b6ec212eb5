// Fused multi-tensor optimizer steps: one call for every listed parameter, one pass over
// each parameter, its gradient and its float32 state. A step that the grad scaler skips
// (found_inf nonzero) writes nothing, step counters included.
// The update is computed in float32 (float64 for float64 parameters) following PyTorch's
// documented rules; a float32 master copy, when given, is updated and the parameter
// receives its rounding.
//
// Reference: kernels/reference/include/ampgrad/reference/optim.h (float64, the specification).
#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "cpu/avx512.h"
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
bool begin_step(CpuBackend& be, const OptimizerLists& l, const char* op, bool two_moments, double& lr) {
  l.check(op, two_moments);
  if (l.found_inf.defined() && *l.found_inf.data_ptr<float>() != 0.0f) {
    // A skipped step still leaves each cast the rounding of its (unchanged) parameter.
    for (size_t k = 0; k < l.casts.size(); ++k)
      if (l.casts[k].defined()) be.copy(l.params[k], l.casts[k]);
    return false;
  }
  lr = l.lr.tensor.defined() ? scalar_value(l.lr.tensor, op) : l.lr.value;
  return true;
}

// Denormal floats flush to zero (MXCSR's FTZ and DAZ) on the calling thread while it lives,
// restored after. A parameter whose gradient stays 0 (a Fashion-MNIST pixel that is 0 in
// every image) has moments that decay geometrically into the denormal range, and every
// operation on a denormal takes a microcode assist, so without this a step grows slower
// epoch by epoch as more moments decay.
class FlushDenormals {
 public:
#if defined(__x86_64__)
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFtz | kDaz); }
  ~FlushDenormals() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kFtz = 0x8000, kDaz = 0x0040;
  unsigned saved_;
#endif
};

// Runs body(k, begin, end) over the elements of every parameter, cut into pieces, in one
// parallel region: a step over many small parameters pays for one thread team, not one per
// parameter. Steps of 16384 elements or fewer in all stay on the calling thread. Denormals
// flush to zero in the steps (FlushDenormals).
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
    const FlushDenormals flush;
    for (int64_t i = pb; i < pe; ++i) body(pieces[size_t(i)].k, pieces[size_t(i)].begin, pieces[size_t(i)].end);
  });
}

// The cast that step k writes (OptimizerLists::casts), or null.
const Tensor* cast_of(const OptimizerLists& l, size_t k) {
  return k < l.casts.size() && l.casts[k].defined() ? &l.casts[k] : nullptr;
}

}  // namespace

void CpuBackend::sgd_step(const OptimizerLists& l, const SgdParams& s) {
  double lr_value;
  if (!begin_step(*this, l, "SGD", false, lr_value)) return;
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
      const Tensor* c = cast_of(l, k);
      const A lr = A(lr_value), mom = A(s.momentum), damp = A(1 - s.dampening), wd = A(s.weight_decay);
      // Branch-free loops per (master, momentum, cast) case so that they vectorize, as Adam's.
      auto run = [&]<bool kMaster, bool kMomentum, class C = void>() {
        C* cp = nullptr;
        if constexpr (!std::is_void_v<C>) cp = static_cast<C*>(c->raw_data());
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
          if constexpr (!std::is_void_v<C>) cp[i] = cast<C>(cast<T>(w));
        }
      };
      if constexpr (std::is_same_v<T, float>) {
        if (c) {
          const bool bf = c->dtype() == kBFloat16;
          if (buf) return bf ? run.template operator()<false, true, BFloat16>() : run.template operator()<false, true, Half>();
          return bf ? run.template operator()<false, false, BFloat16>() : run.template operator()<false, false, Half>();
        }
      }
      if (m && buf) run.template operator()<true, true>();
      else if (m) run.template operator()<true, false>();
      else if (buf) run.template operator()<false, true>();
      else run.template operator()<false, false>();
    });
  });
  for (const Tensor& st : l.steps) ++*st.data_ptr<int64_t>();
}

namespace {

// One piece of one parameter for Adam(W): pointers and the step's constants in A.
template <class T, class A = acc_type_t<T>>
struct AdamPiece {
  T* p;
  const T* g;
  float *m1, *m2, *mw;  // moments, and the float32 master (null without one)
  void* c = nullptr;     // the cast's float16 or bfloat16 elements (float parameters), or null
  bool c_bf16 = false;
  int64_t b, e;
  // eps and step_size with the bias corrections folded in (backend.h): eps * sqrt(1 - beta2^t),
  // lr * sqrt(1 - beta2^t) / (1 - beta1^t)
  A b1, b2, eps, omb1, omb2, step_size, decay, l2;
};

// The update, one loop per master/no-master case, without branches or assumed aliasing,
// so that it vectorizes (it did not with the branch inside: a third of a small model's
// step). Inlined into each ISA's variant below.
template <class T, bool kMaster, class C = void>
[[gnu::always_inline]] inline void adam_loop_of(const AdamPiece<T>& a) {
  using A = acc_type_t<T>;
  T* p = a.p;
  const T* g = a.g;
  float *m1 = a.m1, *m2 = a.m2, *mw = a.mw;
  C* cp = static_cast<C*>(a.c);
#pragma omp simd
  for (int64_t i = a.b; i < a.e; ++i) {
    A w;
    if constexpr (kMaster) w = A(mw[i]);
    else w = cast<A>(p[i]);
    const A gi = cast<A>(g[i]) + a.l2 * w;
    w *= a.decay;
    const A m = a.b1 * A(m1[i]) + a.omb1 * gi;
    const A v = a.b2 * A(m2[i]) + a.omb2 * gi * gi;
    m1[i] = float(m);
    m2[i] = float(v);
    w -= a.step_size * m / (std::sqrt(v) + a.eps);
    if constexpr (kMaster) mw[i] = float(w);
    p[i] = cast<T>(w);
    if constexpr (!std::is_void_v<C>) cp[i] = cast<C>(cast<T>(w));
  }
}

template <class T>
[[gnu::always_inline]] inline void adam_loop(const AdamPiece<T>& a) {
  if constexpr (std::is_same_v<T, float>) {
    if (a.c) return a.c_bf16 ? adam_loop_of<T, false, BFloat16>(a) : adam_loop_of<T, false, Half>(a);
  }
  if (a.mw) adam_loop_of<T, true>(a);
  else adam_loop_of<T, false>(a);
}

// The library is built for baseline x86-64, whose 4-wide vectors make this loop (a
// division and a square root per element) a visible share of a small model's step on an
// AVX-512 CPU.
// The file is compiled with -ffp-contract=off, so both variants round alike (CMakeLists.txt).
template <class T>
AG_AVX512_TARGET void adam_avx512(const AdamPiece<T>& a) {
  adam_loop(a);
}

template <class T>
void run_adam(const AdamPiece<T>& a) {
  run_variant<adam_loop<T>, adam_avx512<T>>(a);
}

}  // namespace

void CpuBackend::adam_step(const OptimizerLists& l, const AdamParams& s) {
  const char* op = s.decoupled ? "AdamW" : "Adam";
  double lr_value;
  if (!begin_step(*this, l, op, true, lr_value)) return;
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
      AdamPiece<T> a;
      a.p = param.data_ptr<T>();
      a.g = l.grads[k].data_ptr<T>();
      a.m1 = l.buf1[k].data_ptr<float>();
      a.m2 = l.buf2[k].data_ptr<float>();
      a.mw = l.masters[k].defined() ? l.masters[k].data_ptr<float>() : nullptr;
      if (const Tensor* c = cast_of(l, k)) {
        a.c = c->raw_data();
        a.c_bf16 = c->dtype() == kBFloat16;
      }
      a.b = b;
      a.e = e;
      a.b1 = A(s.beta1), a.b2 = A(s.beta2);
      // 1 - beta in double: float(1) - float(0.999) is off by 1.3e-5 relative.
      a.omb1 = A(1 - s.beta1), a.omb2 = A(1 - s.beta2);
      // The bias corrections folded into two constants, in double: one division per element
      // where PyTorch's form has two (divisions and square roots bound the loop).
      a.eps = A(s.eps * corr[k].bc2_sqrt);
      a.step_size = A(lr_value * corr[k].bc2_sqrt / corr[k].bc1);
      a.decay = s.decoupled ? A(1 - lr_value * s.weight_decay) : A(1);
      a.l2 = s.decoupled ? A(0) : A(s.weight_decay);
      run_adam(a);
    });
  });
  for (const Tensor& st : l.steps) ++*st.data_ptr<int64_t>();
}

}  // namespace ampgrad::cpu
