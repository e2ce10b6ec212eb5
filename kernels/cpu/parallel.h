// CPU threading: one parallel_for over an index range, on OpenMP.
//
// Small ranges (below the grain) run inline on the calling thread, so that tiny ops pay
// nothing for threading; nested calls run inline too.
#pragma once

#include <algorithm>
#include <cstdint>

#include <omp.h>

namespace ampgrad::cpu {

/// Elements below which an elementwise loop stays on one thread. Picked by measurement
/// (bench_math's grain rows): an OpenMP region on 2 threads costs about 1.6 us and a float32
/// add about 0.38 ns per element on one thread, so splitting breaks even near 8,400
/// elements; the grain is twice that, so going parallel pays for itself.
inline constexpr int64_t kGrain = 16384;
/// The same for the vector math kernels (cpu/vmath.h): 0.6 (exp) to 5.4 (GELU's erfc) ns per
/// element break even between 600 and 5,300 elements.
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
