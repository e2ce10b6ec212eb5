// Elementwise kernels: one templated loop per family (unary, binary, compare, where),
// instantiated per op from the functors in kernels/functors.h and per dtype by dispatch.
// float16/bfloat16 are widened to float in chunks and narrowed once on store.
#include "cpu/cpu_backend.h"
#include "cpu/loops.h"
#include "cpu/vec.h"
#include "functors.h"

namespace ampgrad::cpu {
namespace {

using kernels::BinaryFn;
using kernels::CompareFn;
using kernels::UnaryFn;

template <class T, class F>
void unary_loop(const Tensor& x, const Tensor& out, const F& f) {
  using A = acc_type_t<T>;
  for_each_strided<2>({&out, &x}, [&](char** p, const int64_t* s, int64_t n) {
    if constexpr (is_half_v<T>) {
      A buf[kChunk];
      for (int64_t i = 0; i < n; i += kChunk) {
        const int64_t m = std::min(kChunk, n - i);
        load_acc<T>(p[1] + i * s[1], s[1], buf, m);
        for (int64_t j = 0; j < m; ++j) buf[j] = f(buf[j]);
        store_acc<T>(buf, p[0] + i * s[0], s[0], m);
      }
    } else if (s[0] == sizeof(T) && s[1] == sizeof(T)) {
      T* o = reinterpret_cast<T*>(p[0]);
      const T* in = reinterpret_cast<const T*>(p[1]);
      for (int64_t i = 0; i < n; ++i) o[i] = T(f(A(in[i])));
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<T*>(p[0] + i * s[0]) = T(f(A(*reinterpret_cast<const T*>(p[1] + i * s[1]))));
    }
  });
}

// out = f(a, b) for out of type O (T, or bool for comparisons).
template <class T, class O, class F>
void binary_loop(const Tensor& a, const Tensor& b, const Tensor& out, const F& f) {
  using A = acc_type_t<T>;
  for_each_strided<3>({&out, &a, &b}, [&](char** p, const int64_t* s, int64_t n) {
    if constexpr (is_half_v<T>) {
      A ba[kChunk], bb[kChunk];
      for (int64_t i = 0; i < n; i += kChunk) {
        const int64_t m = std::min(kChunk, n - i);
        load_acc<T>(p[1] + i * s[1], s[1], ba, m);
        load_acc<T>(p[2] + i * s[2], s[2], bb, m);
        if constexpr (std::is_same_v<O, bool>) {
          bool* o = reinterpret_cast<bool*>(p[0] + i * s[0]);
          for (int64_t j = 0; j < m; ++j) o[j * s[0]] = f(ba[j], bb[j]);
        } else {
          for (int64_t j = 0; j < m; ++j) ba[j] = f(ba[j], bb[j]);
          store_acc<T>(ba, p[0] + i * s[0], s[0], m);
        }
      }
    } else {
      O* o = reinterpret_cast<O*>(p[0]);
      const T* x = reinterpret_cast<const T*>(p[1]);
      const T* y = reinterpret_cast<const T*>(p[2]);
      constexpr int64_t so = sizeof(O), st = sizeof(T);
      // The common layouts get their own loops so the compiler can vectorise them.
      if (s[0] == so && s[1] == st && s[2] == st) {
        for (int64_t i = 0; i < n; ++i) o[i] = O(f(A(x[i]), A(y[i])));
      } else if (s[0] == so && s[1] == st && s[2] == 0) {
        const A yv = A(y[0]);
        for (int64_t i = 0; i < n; ++i) o[i] = O(f(A(x[i]), yv));
      } else if (s[0] == so && s[1] == 0 && s[2] == st) {
        const A xv = A(x[0]);
        for (int64_t i = 0; i < n; ++i) o[i] = O(f(xv, A(y[i])));
      } else {
        for (int64_t i = 0; i < n; ++i)
          *reinterpret_cast<O*>(p[0] + i * s[0]) =
              O(f(A(*reinterpret_cast<const T*>(p[1] + i * s[1])),
                  A(*reinterpret_cast<const T*>(p[2] + i * s[2]))));
      }
    }
  });
}

template <class T>
void where_loop(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  for_each_strided<4>({&out, &cond, &a, &b}, [&](char** p, const int64_t* s, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const bool c = *reinterpret_cast<const bool*>(p[1] + i * s[1]);
      *reinterpret_cast<T*>(p[0] + i * s[0]) =
          *reinterpret_cast<const T*>(p[c ? 2 : 3] + i * s[c ? 2 : 3]);
    }
  });
}

// Dispatches dtype for a functor that may be restricted to floating dtypes.
template <class Fn, class Run>
void dispatch_for(DType dt, const char* op, const Run& run) {
  if constexpr (Fn::kFloatOnly) {
    dispatch_floating(dt, op, run);
  } else {
    dispatch_all(dt, op, [&]<class T>() {
      if constexpr (std::is_same_v<T, bool>) AG_ERROR(op, "not defined for bool tensors");
      else run.template operator()<T>();
    });
  }
}

}  // namespace

void CpuBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out, UnaryParams p) {
  switch (op) {
#define AG_CASE(NAME)                                                                  \
  case UnaryOp::NAME: {                                                                \
    using Fn = UnaryFn<UnaryOp::NAME>;                                                 \
    const Fn f{p};                                                                     \
    return dispatch_for<Fn>(x.dtype(), op_name(op),                                    \
                            [&]<class T>() { unary_loop<T>(x, out, f); });             \
  }
    AG_UNARY_OPS(AG_CASE)
#undef AG_CASE
  }
}

void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  switch (op) {
#define AG_CASE(NAME)                                                                  \
  case BinaryOp::NAME: {                                                               \
    using Fn = BinaryFn<BinaryOp::NAME>;                                               \
    return dispatch_for<Fn>(a.dtype(), op_name(op),                                    \
                            [&]<class T>() { binary_loop<T, T>(a, b, out, Fn{}); });   \
  }
    AG_BINARY_OPS(AG_CASE)
#undef AG_CASE
  }
}

void CpuBackend::compare(CompareOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  switch (op) {
#define AG_CASE(NAME)                                                                  \
  case CompareOp::NAME:                                                                \
    return dispatch_all(a.dtype(), op_name(op), [&]<class T>() {                       \
      binary_loop<T, bool>(a, b, out, CompareFn<CompareOp::NAME>{});                   \
    });
    AG_COMPARE_OPS(AG_CASE)
#undef AG_CASE
  }
}

void CpuBackend::where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_all(out.dtype(), "where", [&]<class T>() { where_loop<T>(cond, a, b, out); });
}

}  // namespace ampgrad::cpu
