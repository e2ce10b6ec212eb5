// CPU threading: one parallel_for over an index range, on OpenMP.
//
// Small ranges (below the grain) run inline on the calling thread, so that tiny ops pay
// nothing for threading; nested calls run inline too.
#pragma once

#include <algorithm>
#include <cstdint>

#include <omp.h>

namespace ampgrad::cpu {

/// Elements below which an elementwise loop stays on one thread.
inline constexpr int64_t kGrain = 32768;

template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  const int max_threads = omp_get_max_threads();
  if (n <= grain || max_threads == 1 || omp_in_parallel()) {
    f(begin, end);
    return;
  }
  const int64_t threads = std::min<int64_t>(max_threads, (n + grain - 1) / grain);
#pragma omp parallel num_threads(int(threads))
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t chunk = (n + nt - 1) / nt;
    const int64_t b = begin + t * chunk, e = std::min(end, b + chunk);
    if (b < e) f(b, e);
  }
}

}  // namespace ampgrad::cpu
