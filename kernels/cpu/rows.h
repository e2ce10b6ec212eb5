// Reductions along a contiguous row in the accumulation type, written so that GCC
// vectorises them (eight independent lanes, combined in a fixed order): shared by the row
// kernels of norm.cpp (softmax, layer norm) and loss.cpp (cross entropy). Always inlined,
// so that a row kernel compiled for AVX-512 by a target attribute runs them at its width
// (called out of line they would run the baseline build's SSE code between its own).
// The loop over the eight lanes is marked `omp simd simdlen(8)` (its lanes are independent,
// so nothing is reassociated): left to itself, GCC 12 vectorised the AVX-512 variants
// across two rows' worth of lanes in 512-bit registers, with permutes and one scalar add
// per lane, and softmax's backward ran at half the speed of its SSE2 build.
#pragma once

#include <cstdint>
#include <limits>

namespace ampgrad::cpu {

/// Sum of f(i) for i in [0, n) over eight lanes: vectorisable, and its error grows with n / 8.
template <class A, class F>
[[gnu::always_inline]] inline A lane_sum(int64_t n, const F& f) {
  A lane[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
#pragma omp simd simdlen(8)
    for (int k = 0; k < 8; ++k) lane[k] += f(i + k);
  }
  A tail = 0;
  for (; i < n; ++i) tail += f(i);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7])) + tail;
}

/// The largest value of v (NaNs ignored; -inf for an empty row), in eight lanes of selects
/// that vectorise.
template <class A>
[[gnu::always_inline]] inline A row_max(const A* v, int64_t n) {
  A lane[8];
  for (int k = 0; k < 8; ++k) lane[k] = -std::numeric_limits<A>::infinity();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
#pragma omp simd simdlen(8)
    for (int k = 0; k < 8; ++k) lane[k] = v[i + k] > lane[k] ? v[i + k] : lane[k];
  }
  A m = -std::numeric_limits<A>::infinity();
  for (; i < n; ++i) m = v[i] > m ? v[i] : m;
  for (int k = 0; k < 8; ++k) m = lane[k] > m ? lane[k] : m;
  return m;
}

}  // namespace ampgrad::cpu
