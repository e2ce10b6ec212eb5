// The autocast policy tables: the one place that says what autocast does to each op.
// They follow PyTorch's lists (aten/src/ATen/autocast_mode.cpp) for the ops ampgrad has.
// docs/autocast.md shows the same rows; tests/autocast/test_autocast.cpp fails when the two
// disagree. Ops not listed pass through.
#include <algorithm>

#include "ampgrad/autocast/autocast.h"

namespace ampgrad::autocast {

namespace {
using Row = std::pair<std::string_view, CastPolicy>;
constexpr auto L = CastPolicy::LowerPrecision;
constexpr auto F = CastPolicy::Float32;
constexpr auto P = CastPolicy::Promote;

const std::vector<Row> kCuda = {
    {"matmul", L}, {"linear", L}, {"feed_forward", L}, {"conv2d", L}, {"scaled_dot_product_attention", L},
    {"exp", F}, {"log", F}, {"log1p", F}, {"pow", F}, {"rsqrt", F}, {"reciprocal", F},
    {"softmax", F}, {"log_softmax", F}, {"layer_norm", F}, {"sum", F}, {"norm", F},
    {"logsumexp", F}, {"cross_entropy", F}, {"nll_loss", F}, {"mse_loss", F},
    {"binary_cross_entropy_with_logits", F},
    {"cat", P}, {"stack", P}, {"where", P}, {"add", P}, {"sub", P}, {"mul", P}, {"div", P},
    {"maximum", P}, {"minimum", P},
};

const std::vector<Row> kCpu = {
    {"matmul", L}, {"linear", L}, {"feed_forward", L}, {"conv2d", L}, {"scaled_dot_product_attention", L},
    {"cross_entropy", F}, {"nll_loss", F}, {"mse_loss", F}, {"binary_cross_entropy_with_logits", F},
    {"cat", P}, {"stack", P},
};
}  // namespace

const std::vector<std::pair<std::string_view, CastPolicy>>& policy_table(DeviceType t) {
  return t == DeviceType::CUDA ? kCuda : kCpu;
}

CastPolicy policy(std::string_view op, DeviceType t) {
  const auto& rows = policy_table(t);
  auto it = std::find_if(rows.begin(), rows.end(), [&](const Row& r) { return r.first == op; });
  return it == rows.end() ? CastPolicy::PassThrough : it->second;
}

}  // namespace ampgrad::autocast
