// ag::set_float32_matmul_precision / get_float32_matmul_precision: the default, the round
// trip of each accepted value, and the error for any other string (which leaves the
// setting unchanged). The CPU ignores the setting, so a float32 product is the same
// under each value.
#include "support/testing.h"

using namespace ag;

namespace {
// Restores the default however a test ends.
struct RestorePrecision {
  ~RestorePrecision() { set_float32_matmul_precision("highest"); }
};
}  // namespace

TEST(MatmulPrecision, DefaultIsHighest) {
  EXPECT_EQ(get_float32_matmul_precision(), "highest");
  EXPECT_EQ(float32_matmul_precision(), Float32MatmulPrecision::Highest);
}

TEST(MatmulPrecision, SetGetRoundTrip) {
  RestorePrecision restore;
  set_float32_matmul_precision("high");
  EXPECT_EQ(get_float32_matmul_precision(), "high");
  EXPECT_EQ(float32_matmul_precision(), Float32MatmulPrecision::High);
  set_float32_matmul_precision("medium");
  EXPECT_EQ(get_float32_matmul_precision(), "medium");
  EXPECT_EQ(float32_matmul_precision(), Float32MatmulPrecision::Medium);
  set_float32_matmul_precision("highest");
  EXPECT_EQ(get_float32_matmul_precision(), "highest");
}

TEST(MatmulPrecision, RejectsOtherStrings) {
  RestorePrecision restore;
  set_float32_matmul_precision("high");
  EXPECT_AG_ERROR(set_float32_matmul_precision("low"), "[set_float32_matmul_precision]");
  EXPECT_AG_ERROR(set_float32_matmul_precision("Highest"), "\"Highest\"");
  EXPECT_AG_ERROR(set_float32_matmul_precision(""), "\"\"");
  EXPECT_EQ(get_float32_matmul_precision(), "high");  // unchanged by the failed calls
}

TEST(MatmulPrecision, CpuIgnoresIt) {
  RestorePrecision restore;
  const Tensor a = randn({17, 33}), b = randn({33, 9});
  const Tensor ref = matmul(a, b);
  set_float32_matmul_precision("medium");
  const Tensor got = matmul(a, b);
  EXPECT_EQ(got.to_vector<float>(), ref.to_vector<float>());
}
