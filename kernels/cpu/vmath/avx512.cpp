// The vector math kernels for avx512 (cpu/vmath/kernels.h); CMake compiles this file with the
// set's flags, and cpu/vmath.cpp calls it only on CPUs that have the set.
#define AG_VMATH_NS avx512
#define AG_VMATH_W 16
#define AG_VMATH_V __m512
#define AG_VMATH_SET1 _mm512_set1_ps
#define AG_VMATH_ISA avx512f
#define AG_VMATH_FMSUB _mm512_fmsub_ps
#define AG_VMATH_SCALEF _mm512_scalef_ps
// GCC 12 warns of uninitialized vectors inside its own AVX-512 intrinsics (scalef's
// pass-through operand); this file holds nothing else (cpu/avx512.h, which has the same
// pair of pragmas as macros, brings inline functions this file must not compile).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "kernels.h"
