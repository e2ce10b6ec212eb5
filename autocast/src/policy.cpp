// The autocast policy tables: the one place that says what autocast does to each op.
// They follow PyTorch's lists (aten/src/ATen/autocast_mode.cpp) for the ops ampgrad has.
// docs/autocast.md shows the same rows; tests/autocast/test_autocast.cpp fails when the two
// disagree. Ops not listed pass through. Rows name ops by their ids (ampgrad/op_ids.h).
#include <algorithm>

#include "ampgrad/autocast/autocast.h"

namespace ampgrad::autocast {

namespace {
using Row = std::pair<OpName, CastPolicy>;
constexpr auto L = CastPolicy::LowerPrecision;
constexpr auto F = CastPolicy::Float32;
constexpr auto P = CastPolicy::Promote;

const std::vector<Row> kCuda = {
    {op::matmul, L}, {op::linear, L}, {op::feed_forward, L}, {op::conv2d, L}, {op::scaled_dot_product_attention, L},
    {op::exp, F}, {op::log, F}, {op::log1p, F}, {op::pow, F}, {op::rsqrt, F}, {op::reciprocal, F},
    {op::softmax, F}, {op::log_softmax, F}, {op::layer_norm, F}, {op::sum, F}, {op::norm, F},
    {op::logsumexp, F}, {op::cross_entropy, F}, {op::nll_loss, F}, {op::mse_loss, F},
    {op::binary_cross_entropy_with_logits, F},
    {op::cat, P}, {op::stack, P}, {op::where, P}, {op::add, P}, {op::sub, P}, {op::mul, P}, {op::div, P},
    {op::maximum, P}, {op::minimum, P},
};

const std::vector<Row> kCpu = {
    {op::matmul, L}, {op::linear, L}, {op::feed_forward, L}, {op::conv2d, L}, {op::scaled_dot_product_attention, L},
    {op::cross_entropy, F}, {op::nll_loss, F}, {op::mse_loss, F}, {op::binary_cross_entropy_with_logits, F},
    {op::cat, P}, {op::stack, P},
};
}  // namespace

const std::vector<Row>& policy_table(DeviceType t) { return t == DeviceType::CUDA ? kCuda : kCpu; }

CastPolicy policy(OpName op, DeviceType t) {
  const auto& rows = policy_table(t);
  auto it = std::find_if(rows.begin(), rows.end(), [&](const Row& r) { return r.first.id == op.id; });
  return it == rows.end() ? CastPolicy::PassThrough : it->second;
}

CastPolicy policy(std::string_view name, DeviceType t) {
  const std::optional<OpId> id = op_id(name);
  return id ? policy(OpName{*id}, t) : CastPolicy::PassThrough;
}

}  // namespace ampgrad::autocast
