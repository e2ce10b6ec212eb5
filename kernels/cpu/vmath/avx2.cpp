// The vector math kernels for avx2 (cpu/vmath/kernels.h); CMake compiles this file with the
// set's flags, and cpu/vmath.cpp calls it only on CPUs that have the set.
#define AG_VMATH_NS avx2
#define AG_VMATH_W 8
#define AG_VMATH_V __m256
#define AG_VMATH_SET1 _mm256_set1_ps
#define AG_VMATH_ISA avx2
#define AG_VMATH_FMSUB _mm256_fmsub_ps
#include "kernels.h"
