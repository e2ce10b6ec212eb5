// CUDA's built-in vector types as the emulator defines them: dim3 and uint3 (the launch
// geometry and the thread and block indices), and the small vector types with their
// make_* functions and CUDA's alignments (float2 8 bytes, float4 16, ...).
#pragma once

struct uint3 {
  unsigned int x, y, z;
};

/// A launch's grid or block size; unspecified dimensions are 1, as in CUDA.
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

#define AMPGRAD_EMU_VECTOR_TYPES(T, NAME, A2, A4)                       \
  struct NAME##1 {                                                      \
    T x;                                                                \
  };                                                                    \
  struct alignas(A2) NAME##2 {                                          \
    T x, y;                                                             \
  };                                                                    \
  struct NAME##3 {                                                      \
    T x, y, z;                                                          \
  };                                                                    \
  struct alignas(A4) NAME##4 {                                          \
    T x, y, z, w;                                                       \
  };                                                                    \
  constexpr NAME##1 make_##NAME##1(T x) { return {x}; }                 \
  constexpr NAME##2 make_##NAME##2(T x, T y) { return {x, y}; }         \
  constexpr NAME##3 make_##NAME##3(T x, T y, T z) { return {x, y, z}; } \
  constexpr NAME##4 make_##NAME##4(T x, T y, T z, T w) { return {x, y, z, w}; }

AMPGRAD_EMU_VECTOR_TYPES(signed char, char, 2, 4)
AMPGRAD_EMU_VECTOR_TYPES(unsigned char, uchar, 2, 4)
AMPGRAD_EMU_VECTOR_TYPES(short, short, 4, 8)
AMPGRAD_EMU_VECTOR_TYPES(unsigned short, ushort, 4, 8)
AMPGRAD_EMU_VECTOR_TYPES(int, int, 8, 16)
AMPGRAD_EMU_VECTOR_TYPES(float, float, 8, 16)
AMPGRAD_EMU_VECTOR_TYPES(long long, longlong, 16, 16)
AMPGRAD_EMU_VECTOR_TYPES(unsigned long long, ulonglong, 16, 16)
AMPGRAD_EMU_VECTOR_TYPES(double, double, 16, 16)
#undef AMPGRAD_EMU_VECTOR_TYPES

// uint3 is declared above (the type of threadIdx and blockIdx); the other unsigned vectors.
struct uint1 {
  unsigned int x;
};
struct alignas(8) uint2 {
  unsigned int x, y;
};
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
constexpr uint1 make_uint1(unsigned int x) { return {x}; }
constexpr uint2 make_uint2(unsigned int x, unsigned int y) { return {x, y}; }
constexpr uint3 make_uint3(unsigned int x, unsigned int y, unsigned int z) { return {x, y, z}; }
constexpr uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return {x, y, z, w}; }
