// The op registry (ampgrad/op_ids.h): one name per op, found by name and by id, and the name
// that errors, the tape and the autocast policy use.
#include <set>

#include "support/testing.h"

using namespace ag;

TEST(OpIds, EveryOpHasOneNameAndIsFoundByIt) {
  std::set<std::string> seen;
  for (size_t i = 0; i < kOpCount; ++i) {
    const OpId id = OpId(i);
    const std::string name = op_name(id);
    ASSERT_FALSE(name.empty());
    EXPECT_TRUE(seen.insert(name).second) << name << " is listed twice in AG_OPS";
    ASSERT_TRUE(op_id(name).has_value()) << name;
    EXPECT_EQ(*op_id(name), id) << name;
  }
  EXPECT_FALSE(op_id("matmull").has_value());
  EXPECT_FALSE(op_id("").has_value());
  EXPECT_STREQ(op::matmul, "matmul");
  EXPECT_EQ(op::scaled_dot_product_attention.id, *op_id("scaled_dot_product_attention"));
}

// An op's errors name it as the registry does, and so does its node on the tape.
TEST(OpIds, ErrorsAndTheTapeUseTheRegistrysName) {
  EXPECT_AG_ERROR(matmul(randn({2, 3}), randn({4, 5})), std::string("[") + op::matmul.name() + "] cannot multiply");
  EXPECT_AG_ERROR(cat({}, 0), std::string("[") + op::cat.name() + "]");
  const Tensor a = randn({2, 3}).requires_grad_(), b = randn({3, 2}).requires_grad_();
  const Tensor y = matmul(a, b);
  ASSERT_TRUE(y.grad_fn());
  EXPECT_EQ(y.grad_fn()->name(), "MatmulBackward");
}

// Every row of both autocast tables names a registered op, and the lookup by name answers
// what the lookup by id does.
TEST(OpIds, PolicyRowsAreKeyedOnTheRegistry) {
  for (DeviceType t : {kCPU, kCUDA})
    for (const auto& [op, p] : autocast::policy_table(t)) {
      ASSERT_TRUE(op_id(op.name()).has_value());
      EXPECT_EQ(autocast::policy(op, t), p) << op;
      EXPECT_EQ(autocast::policy(std::string_view(op.name()), t), p) << op;
    }
  EXPECT_EQ(autocast::policy("matmull", kCPU), CastPolicy::PassThrough);
}
