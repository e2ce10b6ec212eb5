// Fused multi-tensor optimizer steps: one call for every listed parameter, one pass over
// each parameter, its gradient and its float32 state. A step that the grad scaler skips
// (found_inf nonzero) writes nothing, step counters included.
// The update is computed in float32 (float64 for float64 parameters) following PyTorch's
// documented rules; a float32 master copy, when given, is updated and the parameter
// receives its rounding. A float16/bfloat16 parameter without one stores the value as
// OptimizerLists::rounding says (to nearest, stochastically, or with Kahan's compensation),
// and the stalled counts, when asked for, are summed per piece and added once per piece to its
// parameter's count.
//
// Reference: kernels/reference/include/ampgrad/reference/optim.h (float64, the specification).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <vector>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "ampgrad/stochastic_round.h"
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

// How a piece stores the new value of a 16-bit parameter without a master
// (OptimizerLists::rounding): kPlain rounds to nearest (and is the only way for the rest).
enum Store { kPlain, kStochastic, kCompensated };

// What the stochastic and compensated stores read besides the parameter.
template <class T>
struct StoreArgs {
  T* comp = nullptr;  // Kahan's compensation (kCompensated)
  uint64_t seed = 0;  // the draws' key, the parameter's id and its step (kStochastic)
  int64_t id = 0, step = 0;
};

// Stores w (the new value in A, w0 + delta as the rule computed it) into p[i] and returns
// the stored value in A, for the stalled count.
template <class T, int kStore, class A>
[[gnu::always_inline]] inline A store_value(T* p, int64_t i, A w0, A w, A delta, const StoreArgs<T>& s) {
  T v;
  if constexpr (kStore == kStochastic) {
    const uint32_t r = kernels::rounding_draw(s.seed, i, s.id, s.step);
    if constexpr (std::is_same_v<T, BFloat16>) v = T::from_bits(kernels::stochastic_bf16_bits(float(w), r));
    else v = T::from_bits(kernels::stochastic_half_bits(float(w), r));
  } else if constexpr (kStore == kCompensated) {
    // Kahan: the part of y that the rounding drops is carried to the next step.
    const A y = delta + cast<A>(s.comp[i]);
    v = cast<T>(w0 + y);
    s.comp[i] = cast<T>(y - (cast<A>(v) - w0));
  } else {
    v = cast<T>(w);
  }
  p[i] = v;
  return cast<A>(v);
}

// Calls f.template operator()<kStore, kCount>() for a piece of a T parameter: the rounding
// mode and the stalled count apply to 16-bit parameters without a master only (a master's
// count is kept by the caller's kMaster path, which passes kPlain).
template <class T, class F>
void with_store(UpdateRounding rounding, bool count, const F& f) {
  if constexpr (is_float16_v<T>) {
    const int store = rounding == UpdateRounding::Stochastic    ? kStochastic
                      : rounding == UpdateRounding::Compensated ? kCompensated
                                                                : kPlain;
    if (count) {
      if (store == kStochastic) return f.template operator()<kStochastic, true>();
      if (store == kCompensated) return f.template operator()<kCompensated, true>();
      return f.template operator()<kPlain, true>();
    }
    if (store == kStochastic) return f.template operator()<kStochastic, false>();
    if (store == kCompensated) return f.template operator()<kCompensated, false>();
  }
  f.template operator()<kPlain, false>();
}

// The piece's StoreArgs for parameter k.
template <class T>
StoreArgs<T> store_args(const OptimizerLists& l, size_t k) {
  StoreArgs<T> s;
  if (k < l.comps.size() && l.comps[k].defined()) s.comp = l.comps[k].data_ptr<T>();
  s.seed = l.seed;
  s.id = k < l.ids.size() ? l.ids[k] : 0;
  s.step = *l.steps[k].data_ptr<int64_t>();
  return s;
}

// The stalled counts of one step, one per parameter: each piece adds its sum to its
// parameter's accumulator (integers: the order does not matter).
struct StalledCount {
  std::unique_ptr<std::atomic<int64_t>[]> n;
  explicit StalledCount(const OptimizerLists& l) {
    if (l.stalled.defined()) n = std::make_unique<std::atomic<int64_t>[]>(l.params.size());
  }
  void add(size_t k, int64_t v) {
    if (v) n[k].fetch_add(v, std::memory_order_relaxed);
  }
  // Adds parameter k's total to lists.stalled[k] (on the CPU: this is the device).
  void finish(const OptimizerLists& l) const {
    if (!n) return;
    int64_t* out = l.stalled.data_ptr<int64_t>();
    for (size_t k = 0; k < l.params.size(); ++k) out[k] += n[k].load(std::memory_order_relaxed);
  }
};

}  // namespace

void CpuBackend::sgd_step(const OptimizerLists& l, const SgdParams& s) {
  double lr_value;
  if (!begin_step(*this, l, "SGD", false, lr_value)) return;
  const bool nesterov = s.nesterov;
  StalledCount stalled(l);
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
      const StoreArgs<T> sa = store_args<T>(l, k);
      const A lr = A(lr_value), mom = A(s.momentum), damp = A(1 - s.dampening), wd = A(s.weight_decay);
      // Branch-free loops per (master, momentum, store, count, cast) case so that they
      // vectorize, as Adam's.
      auto run = [&]<bool kMaster, bool kMomentum, int kStore = kPlain, bool kCount = false, class C = void>() {
        C* cp = nullptr;
        if constexpr (!std::is_void_v<C>) cp = static_cast<C*>(c->raw_data());
        int64_t n_stalled = 0;
#pragma omp simd reduction(+ : n_stalled)
        for (int64_t i = b; i < e; ++i) {
          A w0;
          if constexpr (kMaster) w0 = A(m[i]);
          else w0 = cast<A>(p[i]);
          A d = cast<A>(g[i]) + wd * w0;
          if constexpr (kMomentum) {
            const A v = first ? d : mom * A(buf[i]) + damp * d;  // loop-invariant choices
            buf[i] = float(v);
            d = nesterov ? d + mom * v : v;
          }
          const A step = lr * d;
          const A w = w0 - step;
          A stored;
          if constexpr (kMaster) {
            m[i] = float(w);
            p[i] = cast<T>(w);
            stored = A(m[i]);
          } else {
            stored = store_value<T, kStore>(p, i, w0, w, -step, sa);
          }
          if constexpr (!std::is_void_v<C>) cp[i] = cast<C>(cast<T>(w));
          if constexpr (kCount) n_stalled += step != A(0) && stored == w0 ? 1 : 0;
        }
        stalled.add(k, n_stalled);
      };
      if constexpr (std::is_same_v<T, float>) {
        if (c) {
          const bool bf = c->dtype() == kBFloat16;
          if (buf)
            return bf ? run.template operator()<false, true, kPlain, false, BFloat16>()
                      : run.template operator()<false, true, kPlain, false, Half>();
          return bf ? run.template operator()<false, false, kPlain, false, BFloat16>()
                    : run.template operator()<false, false, kPlain, false, Half>();
        }
      }
      const bool count = l.stalled.defined() && is_float16_v<T>;
      if (m) {
        if (count)
          return buf ? run.template operator()<true, true, kPlain, true>()
                     : run.template operator()<true, false, kPlain, true>();
        return buf ? run.template operator()<true, true>() : run.template operator()<true, false>();
      }
      with_store<T>(l.rounding, count, [&]<int kStore, bool kCount>() {
        if (buf) run.template operator()<false, true, kStore, kCount>();
        else run.template operator()<false, false, kStore, kCount>();
      });
    });
  });
  stalled.finish(l);
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
  // lr * sqrt(1 - beta2^t) / (1 - beta1^t); decay_m1 = -lr * wd (decoupled), the decay's
  // share of the update
  A b1, b2, eps, omb1, omb2, step_size, decay, decay_m1, l2;
  StoreArgs<T> store;
  UpdateRounding rounding = UpdateRounding::Nearest;
  bool count = false;          // 16-bit parameters whose stalled elements are counted
  int64_t* stalled = nullptr;  // the piece's count
};

// The update, one loop per master/no-master case, without branches or assumed aliasing,
// so that it vectorizes (it did not with the branch inside: a third of a small model's
// step). Inlined into each ISA's variant below.
template <class T, bool kMaster, int kStore = kPlain, bool kCount = false, class C = void>
[[gnu::always_inline]] inline void adam_loop_of(const AdamPiece<T>& a) {
  using A = acc_type_t<T>;
  T* p = a.p;
  const T* g = a.g;
  float *m1 = a.m1, *m2 = a.m2, *mw = a.mw;
  C* cp = static_cast<C*>(a.c);
  int64_t n_stalled = 0;
#pragma omp simd reduction(+ : n_stalled)
  for (int64_t i = a.b; i < a.e; ++i) {
    A w0;
    if constexpr (kMaster) w0 = A(mw[i]);
    else w0 = cast<A>(p[i]);
    const A gi = cast<A>(g[i]) + a.l2 * w0;
    const A m = a.b1 * A(m1[i]) + a.omb1 * gi;
    const A v = a.b2 * A(m2[i]) + a.omb2 * gi * gi;
    m1[i] = float(m);
    m2[i] = float(v);
    const A step = a.step_size * m / (std::sqrt(v) + a.eps);
    const A w = w0 * a.decay - step;
    A stored;
    if constexpr (kMaster) {
      mw[i] = float(w);
      p[i] = cast<T>(w);
      stored = A(mw[i]);
    } else if constexpr (kStore == kCompensated) {
      stored = store_value<T, kStore>(p, i, w0, w, w0 * a.decay_m1 - step, a.store);
    } else {
      stored = store_value<T, kStore>(p, i, w0, w, A(0), a.store);
    }
    if constexpr (!std::is_void_v<C>) cp[i] = cast<C>(cast<T>(w));
    if constexpr (kCount) n_stalled += (step != A(0) || (a.decay_m1 != A(0) && w0 != A(0))) && stored == w0 ? 1 : 0;
  }
  if constexpr (kCount) *a.stalled += n_stalled;
}

template <class T>
[[gnu::always_inline]] inline void adam_loop(const AdamPiece<T>& a) {
  if constexpr (std::is_same_v<T, float>) {
    if (a.c)
      return a.c_bf16 ? adam_loop_of<T, false, kPlain, false, BFloat16>(a)
                      : adam_loop_of<T, false, kPlain, false, Half>(a);
  }
  if (a.mw) return a.count ? adam_loop_of<T, true, kPlain, true>(a) : adam_loop_of<T, true>(a);
  with_store<T>(a.rounding, a.count, [&]<int kStore, bool kCount>() { adam_loop_of<T, false, kStore, kCount>(a); });
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
  StalledCount stalled(l);
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
      a.decay_m1 = s.decoupled ? A(-lr_value * s.weight_decay) : A(0);
      a.l2 = s.decoupled ? A(0) : A(s.weight_decay);
      a.store = store_args<T>(l, k);
      a.rounding = l.rounding;
      a.count = l.stalled.defined() && is_float16_v<T>;
      int64_t n_stalled = 0;
      a.stalled = &n_stalled;
      run_adam(a);
      stalled.add(k, n_stalled);
    });
  });
  stalled.finish(l);
  for (const Tensor& st : l.steps) ++*st.data_ptr<int64_t>();
}

}  // namespace ampgrad::cpu
