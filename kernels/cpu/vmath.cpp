// Run-time choice of the vector math kernels (cpu/vmath.h).
#include "cpu/vmath.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "ampgrad/error.h"
#include "ampgrad/hw/cpu.h"

// Each set's entry points, defined in cpu/vmath/<set>.cpp (compiled with the set's flags).
#define AG_VMATH_DECLARE(NS)                                                        \
  namespace ampgrad::cpu::vmath::NS {                                               \
  void unary(Fn fn, const float* x, float* y, int64_t n, float param);              \
  void binary(Fn fn, const float* a, const float* b, float* y, int64_t n);          \
  void with_derivative(Fn fn, const float* x, float* y, float* d, int64_t n);       \
  }
#if AMPGRAD_WITH_SLEEF
AG_VMATH_DECLARE(sse2)
AG_VMATH_DECLARE(avx2)
AG_VMATH_DECLARE(avx512)
#endif
#undef AG_VMATH_DECLARE

namespace ampgrad::cpu::vmath {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::None: return "none";
    case Isa::Sse2: return "sse2";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "?";
}

bool supported(Isa isa) {
#if AMPGRAD_WITH_SLEEF
  const auto& f = hw::cpu_features();
  switch (isa) {
    case Isa::None: return true;
    case Isa::Sse2: return true;  // every x86-64 CPU
    case Isa::Avx2: return f.avx2 && f.fma;
    case Isa::Avx512: return f.avx512f;
  }
  return false;
#else
  return isa == Isa::None;
#endif
}

Isa best_isa() {
  for (Isa isa : {Isa::Avx512, Isa::Avx2, Isa::Sse2})
    if (supported(isa)) return isa;
  return Isa::None;
}

namespace {
Isa parse_isa(std::string_view name, const char* source) {
  for (Isa isa : {Isa::None, Isa::Sse2, Isa::Avx2, Isa::Avx512}) {
    if (name != isa_name(isa)) continue;
    AG_CHECK(supported(isa), "vector math", source, name, ": this ",
             best_isa() == Isa::None ? "build has no vector math kernels" : "CPU lacks that instruction set",
             " (the widest it runs: ", isa_name(best_isa()), ")");
    return isa;
  }
  AG_ERROR("vector math", source, name, " is not one of none, sse2, avx2, avx512");
}

std::atomic<Isa>& active() {
  static std::atomic<Isa> isa = [] {
    const char* env = std::getenv("AMPGRAD_VMATH");
    return env == nullptr || *env == '\0' ? best_isa() : parse_isa(env, "AMPGRAD_VMATH=");
  }();
  return isa;
}
}  // namespace

Isa active_isa() { return active().load(std::memory_order_relaxed); }

Fn unary_fn(UnaryOp op, const UnaryParams& p) {
  switch (op) {
    case UnaryOp::Exp: return Fn::Exp;
    case UnaryOp::Log: return Fn::Log;
    case UnaryOp::Log1p: return Fn::Log1p;
    case UnaryOp::Tanh: return Fn::Tanh;
    case UnaryOp::Sigmoid: return Fn::Sigmoid;
    case UnaryOp::GeluErf: return Fn::GeluErf;
    case UnaryOp::GeluTanh: return Fn::GeluTanh;
    case UnaryOp::Silu: return Fn::Silu;
    // The functor's exact forms (x * x, x, sqrt) beat a 1-ulp pow for these exponents.
    case UnaryOp::PowScalar: return p.a == 2.0 || p.a == 1.0 || p.a == 0.5 ? Fn::None : Fn::PowScalar;
    default: return Fn::None;
  }
}

Fn binary_fn(BinaryOp op) {
  switch (op) {
    case BinaryOp::Pow: return Fn::Pow;
    case BinaryOp::GeluErfBackward: return Fn::GeluErfBackward;
    case BinaryOp::GeluTanhBackward: return Fn::GeluTanhBackward;
    case BinaryOp::SiluBackward: return Fn::SiluBackward;
    default: return Fn::None;
  }
}

void unary(Fn fn, const float* x, float* y, int64_t n, float param, Isa isa) {
  AG_CHECK(fn != Fn::None && fn < Fn::Pow, "vmath", "unary called with a function that is not unary");
  AG_CHECK(supported(isa) && isa != Isa::None, "vmath", "no vector kernels for ", isa_name(isa));
#if AMPGRAD_WITH_SLEEF
  switch (isa) {
    case Isa::Avx512: return avx512::unary(fn, x, y, n, param);
    case Isa::Avx2: return avx2::unary(fn, x, y, n, param);
    default: return sse2::unary(fn, x, y, n, param);
  }
#endif
}

void binary(Fn fn, const float* a, const float* b, float* y, int64_t n, Isa isa) {
  AG_CHECK(fn >= Fn::Pow, "vmath", "binary called with a function that is not binary");
  AG_CHECK(supported(isa) && isa != Isa::None, "vmath", "no vector kernels for ", isa_name(isa));
#if AMPGRAD_WITH_SLEEF
  switch (isa) {
    case Isa::Avx512: return avx512::binary(fn, a, b, y, n);
    case Isa::Avx2: return avx2::binary(fn, a, b, y, n);
    default: return sse2::binary(fn, a, b, y, n);
  }
#endif
}

void with_derivative(Fn fn, const float* x, float* y, float* d, int64_t n, Isa isa) {
  AG_CHECK(fn == Fn::GeluErf || fn == Fn::GeluTanh || fn == Fn::Silu, "vmath",
           "with_derivative called with a function other than GELU or SiLU");
  AG_CHECK(supported(isa) && isa != Isa::None, "vmath", "no vector kernels for ", isa_name(isa));
#if AMPGRAD_WITH_SLEEF
  switch (isa) {
    case Isa::Avx512: return avx512::with_derivative(fn, x, y, d, n);
    case Isa::Avx2: return avx2::with_derivative(fn, x, y, d, n);
    default: return sse2::with_derivative(fn, x, y, d, n);
  }
#endif
}

}  // namespace ampgrad::cpu::vmath

namespace ampgrad::hw {

std::string vector_math_isa() { return cpu::vmath::isa_name(cpu::vmath::active_isa()); }
std::string best_vector_math_isa() { return cpu::vmath::isa_name(cpu::vmath::best_isa()); }
void set_vector_math_isa(std::string_view name) {
  cpu::vmath::active().store(cpu::vmath::parse_isa(name, ""), std::memory_order_relaxed);
}

}  // namespace ampgrad::hw
