// Vectorized float32 math for the CPU elementwise kernels.
//
// The transcendental functions come from SLEEF (Debian's libsleef-dev, the library PyTorch's
// CPU kernels use), its 1.0-ulp entry points (1.5 for erfc), called on whole vector
// registers: AVX-512 (16 floats), AVX2 with FMA (8) or SSE2 (4), chosen once at run time
// from the CPU's features (ampgrad::hw::cpu_features). The compositions around them (GELU,
// SiLU, sigmoid, the gradients) are written here in forms that stay accurate in the tails:
// sigmoid(x) = e/(1+e) with e = exp(-|x|) never overflows; GELU(erf) = 0.5 x erfc(-x/sqrt2)
// and GELU(tanh) = x sigmoid(2u) have no 1 + (-1 + tiny) cancellation for negative x.
// The scalar functors in kernels/functors.h stay the definition of each op (float64, CUDA)
// and the reference the tests compare with; tests/ops/test_vmath.cpp states and checks the
// accuracy of every function here over a sweep of float32 inputs, edges included.
// Each instruction set's kernels live in their own translation unit compiled with that
// set's flags (vmath/kernels.h, included by vmath/avx512.cpp, avx2.cpp, sse2.cpp); this
// header and vmath.cpp are baseline code.
#pragma once

#include <cstdint>

#include "ampgrad/op_kinds.h"
#include "vmath/fn.h"

namespace ampgrad::cpu::vmath {

/// The vector instruction sets the kernels exist for, narrowest first. None: this build or
/// this CPU has no vector kernels (the callers run the scalar functors).
enum class Isa : uint8_t { None, Sse2, Avx2, Avx512 };

/// "none", "sse2", "avx2", "avx512".
const char* isa_name(Isa isa);
/// The widest set this build has kernels for and this CPU runs.
Isa best_isa();
/// True when this build has kernels for isa and this CPU runs them.
bool supported(Isa isa);
/// The set the kernels run with: best_isa(), or what the environment variable AMPGRAD_VMATH
/// names ("none" turns the vector kernels off, for before/after measurements; a set this CPU
/// lacks is refused with an ag::Error); hw::set_vector_math_isa changes it.
Isa active_isa();

/// The vector function for a unary op with parameters p, or Fn::None when the op has none
/// (integer math, sign, clamp, ...; pow with exponent 0.5, 1 or 2 stays on the exact
/// scalar forms).
Fn unary_fn(UnaryOp op, const UnaryParams& p);
/// The vector function for a tensor-tensor binary op, or Fn::None.
Fn binary_fn(BinaryOp op);

/// y[i] = fn(x[i], param) for n contiguous floats (y may be x). fn must be a unary Fn.
void unary(Fn fn, const float* x, float* y, int64_t n, float param = 0.0f, Isa isa = active_isa());
/// y[i] = fn(a[i], b[i]) for n contiguous floats (y may be a or b). fn must be a binary Fn.
void binary(Fn fn, const float* a, const float* b, float* y, int64_t n, Isa isa = active_isa());
/// y[i] = fn(x[i]) and d[i] = fn'(x[i]) in one pass, fn GeluErf, GeluTanh or Silu (d may
/// be x): y bit for bit as unary computes it, d as the gradient function computes it for an
/// incoming gradient of 1. What a linear with GELU keeps for its backward on the CPU.
void with_derivative(Fn fn, const float* x, float* y, float* d, int64_t n, Isa isa = active_isa());

}  // namespace ampgrad::cpu::vmath
