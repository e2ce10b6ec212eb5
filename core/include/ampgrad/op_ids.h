// The ops' names, listed once. Every public op has an id here; its name is what errors show
// in brackets ("[matmul] ..."), what the tape's node is called, and what autocast's policy
// table is keyed on. Code names an op as `op::matmul` (an OpName: the id, and the name
// wherever a string is wanted), never as a string literal, so a misspelled name in an op,
// an error or a policy row fails to compile instead of silently naming nothing.
//
// A new op adds one line to AG_OPS (docs/adding-an-op.md).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string_view>

// Grouped as the headers under ampgrad/ops/ declare them; in-place forms end in '_'.
#define AG_OPS(_)                                                                                              \
  /* elementwise.h */                                                                                          \
  _(neg) _(abs) _(sign) _(square) _(sqrt) _(rsqrt) _(reciprocal) _(exp) _(log) _(log1p) _(tanh) _(sigmoid)     \
  _(relu) _(gelu) _(silu) _(softplus) _(pow) _(clamp) _(add) _(sub) _(mul) _(div) _(maximum) _(minimum) _(eq)  \
  _(ne) _(lt) _(le) _(gt) _(ge) _(logical_and) _(logical_or) _(where) _(masked_fill) _(dropout) _(bernoulli)   \
  _(add_) _(sub_) _(mul_) _(div_) _(clamp_) _(masked_fill_) _(copy_) _(fill_) _(zero_)                         \
  /* reduce.h */                                                                                               \
  _(sum) _(mean) _(max) _(min) _(amax) _(amin) _(argmax) _(argmin) _(var) _(std) _(logsumexp) _(norm)          \
  /* shape.h, and the tensor's own views and copies */                                                         \
  _(view) _(reshape) _(expand) _(flatten) _(squeeze) _(unsqueeze) _(permute) _(transpose) _(narrow) _(select)  \
  _(chunk) _(split) _(cat) _(stack) _(contiguous) _(clone) _(to) _(index_select) _(gather) _(embedding)        \
  /* nn.h */                                                                                                   \
  _(matmul) _(linear) _(feed_forward) _(conv2d) _(conv2d_block) _(max_pool2d) _(avg_pool2d) _(layer_norm)      \
  _(layer_norm_to) _(softmax) _(log_softmax) _(scaled_dot_product_attention)                                   \
  /* loss.h */                                                                                                 \
  _(cross_entropy) _(nll_loss) _(mse_loss) _(binary_cross_entropy_with_logits)

namespace ampgrad {

#define AG_OP_ENTRY(name) name,
/// An op's identity: the index of its line in AG_OPS.
enum class OpId : uint16_t { AG_OPS(AG_OP_ENTRY) };
#undef AG_OP_ENTRY

#define AG_OP_ENTRY(name) +1
inline constexpr size_t kOpCount = 0 AG_OPS(AG_OP_ENTRY);
#undef AG_OP_ENTRY

namespace detail {
#define AG_OP_ENTRY(name) #name,
inline constexpr std::array<const char*, kOpCount> kOpNames = {AG_OPS(AG_OP_ENTRY)};
#undef AG_OP_ENTRY
}  // namespace detail

/// An op's name as errors, the tape and the autocast policy show it.
constexpr const char* op_name(OpId id) { return detail::kOpNames[size_t(id)]; }

/// The op of that name, or nullopt when no op has it.
constexpr std::optional<OpId> op_id(std::string_view name) {
  for (size_t i = 0; i < kOpCount; ++i)
    if (name == detail::kOpNames[i]) return OpId(i);
  return std::nullopt;
}

/// An op as code names it: its id, and its name wherever a string is expected (an error's
/// op, a node's name).
struct OpName {
  OpId id;
  constexpr operator const char*() const { return op_name(id); }
  constexpr operator std::string_view() const { return op_name(id); }
  constexpr const char* name() const { return op_name(id); }
};
inline std::ostream& operator<<(std::ostream& os, OpName op) { return os << op.name(); }

/// op::matmul, op::add, ...: one constant per line of AG_OPS.
namespace op {
#define AG_OP_ENTRY(name) inline constexpr OpName name{OpId::name};
AG_OPS(AG_OP_ENTRY)
#undef AG_OP_ENTRY
}  // namespace op

}  // namespace ampgrad
