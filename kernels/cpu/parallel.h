// CPU threading: one parallel_for over an index range, on OpenMP.
//
// Small ranges (below the grain) run inline on the calling thread, so that tiny ops pay
// nothing for threading; nested calls run inline too.
#pragma once

#include <algorithm>
#include <cstdint>

#include <omp.h>

namespace ampgrad::cpu {

/// Elements below which an elementwise loop stays on one thread. Splitting n elements of
/// per-element cost c over 2 threads saves n c / 2 and costs one OpenMP region, so it breaks
/// even where n c / 2 equals the region's cost; the grain is about twice the break-even of a
/// float32 add (bench_math's grain rows measure both), so going parallel pays for itself.
inline constexpr int64_t kGrain = 16384;
/// The same for the vector math kernels (cpu/vmath.h), whose per-element cost is several
/// times an add's, so they break even at fewer elements.
inline constexpr int64_t kMathGrain = 4096;

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
