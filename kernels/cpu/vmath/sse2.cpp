// The vector math kernels for sse2 (cpu/vmath/kernels.h); CMake compiles this file with the
// set's flags, and cpu/vmath.cpp calls it only on CPUs that have the set.
#define AG_VMATH_NS sse2
#define AG_VMATH_W 4
#define AG_VMATH_V __m128
#define AG_VMATH_SET1 _mm_set1_ps
#define AG_VMATH_ISA sse2
#include "kernels.h"
