// The vector math kernels for avx512 (cpu/vmath/kernels.h); CMake compiles this file with the
// set's flags, and cpu/vmath.cpp calls it only on CPUs that have the set.
#define AG_VMATH_NS avx512
#define AG_VMATH_W 16
#define AG_VMATH_V __m512
#define AG_VMATH_SET1 _mm512_set1_ps
#define AG_VMATH_ISA avx512f
#include "kernels.h"
