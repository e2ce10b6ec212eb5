// The kernel-level identities of elementwise and reduction ops: one X-macro list per
// family. The enums below are generated from them; each backend specialises one functor
// per entry (kernels/functors.h) and its dispatch switch is generated from the same list,
// so an entry without a functor fails to compile.
#pragma once

#include <cstdint>

// Unary ops: out = f(x [, a, b]). Parameters a, b: PowScalar (exponent a), Clamp (a, b).
#define AG_UNARY_OPS(_) \
  _(Neg)                \
  _(Abs)                \
  _(Sign)               \
  _(Square)             \
  _(Sqrt)               \
  _(Rsqrt)              \
  _(Reciprocal)         \
  _(Exp)                \
  _(Log)                \
  _(Log1p)              \
  _(Tanh)               \
  _(Sigmoid)            \
  _(Relu)               \
  _(GeluErf)            \
  _(GeluTanh)           \
  _(Silu)               \
  _(Softplus)           \
  _(PowScalar)          \
  _(Clamp)

// Binary ops with an output of the inputs' dtype. The *Backward entries are fused
// gradient formulas f(grad, saved) for the activations (hot paths, one pass each).
#define AG_BINARY_OPS(_) \
  _(Add)                 \
  _(Sub)                 \
  _(Mul)                 \
  _(Div)                 \
  _(Pow)                 \
  _(Maximum)             \
  _(Minimum)             \
  _(ReluBackward)        \
  _(GeluErfBackward)     \
  _(GeluTanhBackward)    \
  _(SiluBackward)        \
  _(SigmoidBackward)     \
  _(TanhBackward)

// Binary ops with a bool output.
#define AG_COMPARE_OPS(_) \
  _(Eq)                   \
  _(Ne)                   \
  _(Lt)                   \
  _(Le)                   \
  _(Gt)                   \
  _(Ge)                   \
  _(LogicalAnd)           \
  _(LogicalOr)

// Reductions over a set of dims. Mean divides by the count, Var by (count - correction),
// Norm is (sum |x|^p)^(1/p). ArgMax/ArgMin write int64 indices (first occurrence).
#define AG_REDUCE_OPS(_) \
  _(Sum)                 \
  _(Mean)                \
  _(Max)                 \
  _(Min)                 \
  _(ArgMax)              \
  _(ArgMin)              \
  _(Var)                 \
  _(LogSumExp)           \
  _(Norm)

namespace ampgrad {

#define AG_ENUM_ENTRY(name) name,
enum class UnaryOp : uint8_t { AG_UNARY_OPS(AG_ENUM_ENTRY) };
enum class BinaryOp : uint8_t { AG_BINARY_OPS(AG_ENUM_ENTRY) };
enum class CompareOp : uint8_t { AG_COMPARE_OPS(AG_ENUM_ENTRY) };
enum class ReduceOp : uint8_t { AG_REDUCE_OPS(AG_ENUM_ENTRY) };
#undef AG_ENUM_ENTRY

const char* op_name(UnaryOp op);
const char* op_name(BinaryOp op);
const char* op_name(CompareOp op);
const char* op_name(ReduceOp op);

// Activations a matrix product may apply in its epilogue (linear with an activation and
// feed_forward, core/include/ampgrad/ops/nn.h). Each maps to one unary op for the forward
// and one fused *Backward binary op for the gradient, so the math has one definition.
enum class Activation : uint8_t { None, Relu, GeluErf, GeluTanh };

/// "none", "relu", "gelu" (erf form) or "gelu_tanh".
const char* activation_name(Activation a);
/// The unary op of a (a is not None).
UnaryOp activation_op(Activation a);
/// The fused gradient op f(grad, saved) of a (a is not None).
BinaryOp activation_backward_op(Activation a);
/// True when the gradient reads the activation's output (ReLU); otherwise it reads its
/// input, the pre-activation (GELU).
bool activation_grad_reads_output(Activation a);

struct UnaryParams {
  double a = 0;
  double b = 0;
};

struct ReduceParams {
  double p = 2;            // Norm
  int64_t correction = 1;  // Var
};

}  // namespace ampgrad
