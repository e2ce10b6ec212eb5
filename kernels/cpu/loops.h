// Strided elementwise iteration over N operands of one shape (operand 0 is the output).
//
// for_each_strided coalesces dims that are contiguous in every operand, splits the linear
// index range over threads, and calls a 1-D inner loop `inner(ptrs, byte_strides, n)` for
// each run along the innermost dim. Inner loops test the strides once per run: equal to
// the item size (contiguous, vectorisable) or 0 (a broadcast scalar), else generic.
// map_loop is the inner loop of every elementwise kernel: out[i] = f(inputs[i]...).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "ampgrad/tensor.h"
#include "layout.h"
#include "cpu/parallel.h"
#include "cpu/vec.h"

namespace ampgrad::cpu {

using kernels::kMaxLoopDims;
using kernels::make_layout;
using kernels::Split3;
using kernels::StridedLayout;

/// Runs inner(char* ptrs[N], const int64_t strides[N], int64_t n) over the layout.
template <int N, class Inner>
void for_each_strided(const StridedLayout<N>& L, const Inner& inner, int64_t grain = kGrain) {
  if (L.numel == 0) return;
  parallel_for(0, L.numel, grain, [&](int64_t begin, int64_t end) {
    int64_t idx[kMaxLoopDims];
    int64_t rem = begin;
    for (int d = 0; d < L.ndim; ++d) {
      idx[d] = rem % L.sizes[d];
      rem /= L.sizes[d];
    }
    char* ptrs[N];
    int64_t inner_strides[N];
    for (int k = 0; k < N; ++k) {
      inner_strides[k] = L.strides[k][0];
      ptrs[k] = L.base[k];
      for (int d = 0; d < L.ndim; ++d) ptrs[k] += idx[d] * L.strides[k][d];
    }
    int64_t pos = begin;
    while (pos < end) {
      const int64_t n = std::min(L.sizes[0] - idx[0], end - pos);
      inner(ptrs, inner_strides, n);
      pos += n;
      if (pos >= end) break;
      // advance to the start of the next innermost run
      for (int k = 0; k < N; ++k) ptrs[k] += n * L.strides[k][0];
      idx[0] += n;
      for (int d = 0; d < L.ndim - 1 && idx[d] == L.sizes[d]; ++d) {
        for (int k = 0; k < N; ++k)
          ptrs[k] += L.strides[k][d + 1] - L.sizes[d] * L.strides[k][d];
        idx[d] = 0;
        ++idx[d + 1];
      }
    }
  });
}

template <int N, class Inner>
void for_each_strided(const std::array<const Tensor*, N>& ops, const Inner& inner,
                      int64_t grain = kGrain) {
  for_each_strided<N>(make_layout<N>(ops), inner, grain);
}

namespace loop_impl {

// v as a functor receives it: converted to C, or as stored when C is void.
template <class C, class In>
inline auto as_compute(In v) {
  if constexpr (std::is_void_v<C>) return v;
  else return C(v);
}

// One run of map_loop: n elements, p[0] the output, p[1 + k] input k, byte strides s.
template <class O, class C, class... Ins, class F, size_t... I>
inline void map_run(const F& f, char** p, const int64_t* s, int64_t n, std::index_sequence<I...>) {
  constexpr int K = int(sizeof...(Ins));
  if constexpr (std::is_same_v<C, float> && (is_float16_v<Ins> || ...)) {
    // 16-bit floats: widen a chunk of each input in bulk, compute, narrow once on store.
    // An input already in C and unit-stride (the float32 side of a widening binary) is read
    // where it is.
    C buf[K][kChunk];
    for (int64_t i = 0; i < n; i += kChunk) {
      const int64_t m = std::min(kChunk, n - i);
      const C* src[K];
      ((src[I] = [&]() -> const C* {
         const char* at = p[I + 1] + i * s[I + 1];
         if constexpr (std::is_same_v<Ins, C>)
           if (s[I + 1] == int64_t(sizeof(C))) return reinterpret_cast<const C*>(at);
         load_acc<Ins, C>(at, s[I + 1], buf[I], m);
         return buf[I];
       }()),
       ...);
      if constexpr (is_float16_v<O>) {
        for (int64_t j = 0; j < m; ++j) buf[0][j] = f(src[I][j]...);
        store_acc<O, C>(buf[0], p[0] + i * s[0], s[0], m);
      } else if (s[0] == int64_t(sizeof(O))) {  // contiguous: a loop the compiler vectorises
        O* o = reinterpret_cast<O*>(p[0]) + i;
        for (int64_t j = 0; j < m; ++j) o[j] = O(f(src[I][j]...));
      } else {
        char* o = p[0] + i * s[0];
        for (int64_t j = 0; j < m; ++j) *reinterpret_cast<O*>(o + j * s[0]) = O(f(src[I][j]...));
      }
    }
  } else {
    O* o = reinterpret_cast<O*>(p[0]);
    const std::tuple<const Ins*...> in{reinterpret_cast<const Ins*>(p[I + 1])...};
    // The common layouts get their own loops so the compiler can vectorise them.
    if (s[0] == int64_t(sizeof(O)) && ((s[I + 1] == int64_t(sizeof(Ins))) && ...)) {
      for (int64_t i = 0; i < n; ++i) o[i] = O(f(as_compute<C>(std::get<I>(in)[i])...));
      return;
    }
    if constexpr (K == 2) {  // one input broadcast along the run
      using X = std::tuple_element_t<0, std::tuple<Ins...>>;
      using Y = std::tuple_element_t<1, std::tuple<Ins...>>;
      const X* x = std::get<0>(in);
      const Y* y = std::get<1>(in);
      if (s[0] == int64_t(sizeof(O)) && s[1] == int64_t(sizeof(X)) && s[2] == 0) {
        const auto yv = as_compute<C>(y[0]);
        for (int64_t i = 0; i < n; ++i) o[i] = O(f(as_compute<C>(x[i]), yv));
        return;
      }
      if (s[0] == int64_t(sizeof(O)) && s[1] == 0 && s[2] == int64_t(sizeof(Y))) {
        const auto xv = as_compute<C>(x[0]);
        for (int64_t i = 0; i < n; ++i) o[i] = O(f(xv, as_compute<C>(y[i])));
        return;
      }
    }
    for (int64_t i = 0; i < n; ++i)
      *reinterpret_cast<O*>(p[0] + i * s[0]) =
          O(f(as_compute<C>(*reinterpret_cast<const Ins*>(p[I + 1] + i * s[I + 1]))...));
  }
}

}  // namespace loop_impl

/// out[i] = f(in[0][i], ..., in[K-1][i]) over K strided inputs whose C++ storage types are
/// Ins... (already broadcast to out's shape), for an output of type O. f receives the
/// inputs converted to C, the type the op computes in (the accumulation type; void: as
/// stored). Kernels bind scalar operands into f, so a scalar stays in a register and the
/// loop runs over the tensors alone.
template <class O, class C, class... Ins, class F>
void map_loop(const F& f, const Tensor& out, const std::array<const Tensor*, sizeof...(Ins)>& in) {
  constexpr int K = int(sizeof...(Ins));
  std::array<const Tensor*, K + 1> ops{&out};
  for (int k = 0; k < K; ++k) ops[size_t(k) + 1] = in[size_t(k)];
  for_each_strided<K + 1>(ops, [&](char** p, const int64_t* s, int64_t n) {
    loop_impl::map_run<O, C, Ins...>(f, p, s, n, std::index_sequence_for<Ins...>());
  });
}

}  // namespace ampgrad::cpu
