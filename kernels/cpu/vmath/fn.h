// The functions of the vector math kernels (cpu/vmath.h), as a plain enum: the per-ISA
// translation units include nothing else of the library, so that no inline function of
// ours is compiled there with another instruction set's flags.
#pragma once

#include <cstdint>

namespace ampgrad::cpu::vmath {

enum class Fn : uint8_t {
  None,
  // unary: y = f(x) (PowScalar: y = x^param)
  Exp,
  Log,
  Log1p,
  Tanh,
  Sigmoid,
  GeluErf,
  GeluTanh,
  Silu,
  PowScalar,
  // binary: y = f(a, b); the gradients take a = the incoming gradient, b = the saved input
  Pow,
  GeluErfBackward,
  GeluTanhBackward,
  SiluBackward,
};

}  // namespace ampgrad::cpu::vmath
