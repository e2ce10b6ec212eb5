#include "support/testing.h"

using namespace ag;

TEST(DType, NamesSizesAndCategories) {
  EXPECT_STREQ(dtype_name(kFloat32), "float32");
  EXPECT_STREQ(dtype_name(kFloat64), "float64");
  EXPECT_STREQ(dtype_name(kFloat16), "float16");
  EXPECT_STREQ(dtype_name(kBFloat16), "bfloat16");
  EXPECT_STREQ(dtype_name(kInt64), "int64");
  EXPECT_STREQ(dtype_name(kInt32), "int32");
  EXPECT_STREQ(dtype_name(kUInt8), "uint8");
  EXPECT_STREQ(dtype_name(kBool), "bool");
  EXPECT_EQ(itemsize(kFloat32), 4u);
  EXPECT_EQ(itemsize(kFloat64), 8u);
  EXPECT_EQ(itemsize(kFloat16), 2u);
  EXPECT_EQ(itemsize(kBFloat16), 2u);
  EXPECT_EQ(itemsize(kInt64), 8u);
  EXPECT_EQ(itemsize(kBool), 1u);
  EXPECT_TRUE(is_floating(kBFloat16));
  EXPECT_FALSE(is_floating(kInt32));
  EXPECT_EQ(dtype_of<Half>, kFloat16);
  EXPECT_EQ(dtype_of<int64_t>, kInt64);
}

// Expected values are PyTorch's torch.promote_types for every pair.
TEST(DType, PromotionTableMatchesPyTorch) {
  const DType all[] = {kFloat32, kFloat64, kFloat16, kBFloat16, kInt64, kInt32, kUInt8, kBool};
  // rows/cols in the order above
  const DType f32 = kFloat32, f64 = kFloat64, f16 = kFloat16, b16 = kBFloat16, i64 = kInt64,
              i32 = kInt32, u8 = kUInt8, b = kBool;
  const DType expected[8][8] = {
      /*f32*/ {f32, f64, f32, f32, f32, f32, f32, f32},
      /*f64*/ {f64, f64, f64, f64, f64, f64, f64, f64},
      /*f16*/ {f32, f64, f16, f32, f16, f16, f16, f16},
      /*b16*/ {f32, f64, f32, b16, b16, b16, b16, b16},
      /*i64*/ {f32, f64, f16, b16, i64, i64, i64, i64},
      /*i32*/ {f32, f64, f16, b16, i64, i32, i32, i32},
      /*u8 */ {f32, f64, f16, b16, i64, i32, u8, u8},
      /*b  */ {f32, f64, f16, b16, i64, i32, u8, b},
  };
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j)
      EXPECT_EQ(promote_types(all[i], all[j]), expected[i][j])
          << dtype_name(all[i]) << " with " << dtype_name(all[j]);
}

TEST(DType, ScalarsDoNotWidenTensors) {
  EXPECT_EQ(result_type(kFloat16, Scalar(2.5)), kFloat16);
  EXPECT_EQ(result_type(kBFloat16, Scalar(3)), kBFloat16);
  EXPECT_EQ(result_type(kInt32, Scalar(2)), kInt32);
  EXPECT_EQ(result_type(kInt64, Scalar(0.5)), get_default_dtype());
  Tensor h = ones({3}, kFloat16);
  EXPECT_EQ((h * 2.5).dtype(), kFloat16);
  Tensor i = arange(3);
  EXPECT_EQ(i.dtype(), kInt64);
  EXPECT_EQ((i + 1).dtype(), kInt64);
  EXPECT_EQ((i * 0.5).dtype(), kFloat32);
  EXPECT_EQ((h + ones({3}, kBFloat16)).dtype(), kFloat32);
}

TEST(DType, DefaultDtypeAndParsing) {
  EXPECT_EQ(get_default_dtype(), kFloat32);
  set_default_dtype(kFloat64);
  EXPECT_EQ(zeros({2}).dtype(), kFloat64);
  EXPECT_EQ((arange(3) * 0.5).dtype(), kFloat64);
  set_default_dtype(kFloat32);
  EXPECT_EQ(zeros({2}).dtype(), kFloat32);
  EXPECT_AG_ERROR(set_default_dtype(kInt32), "[set_default_dtype] the default dtype must be floating, got int32");
  EXPECT_EQ(parse_dtype("bf16"), kBFloat16);
  EXPECT_EQ(parse_dtype("float16"), kFloat16);
  EXPECT_AG_ERROR(parse_dtype("float8"), "unknown dtype 'float8'");
}

TEST(Device, Parsing) {
  EXPECT_EQ(Device("cpu"), Device(kCPU));
  EXPECT_EQ(Device("cuda"), Device(kCUDA, 0));
  EXPECT_EQ(Device("cuda:1").index, 1);
  EXPECT_EQ(Device("cuda:1").str(), "cuda:1");
  EXPECT_AG_ERROR(Device("tpu"), "unknown device 'tpu'");
  EXPECT_AG_ERROR(Device("cuda:x"), "bad device index in 'cuda:x'");
  EXPECT_AG_ERROR(Device("cpu:1"), "cpu has only index 0");
}

TEST(Device, CudaWithoutCudaIsAnError) {
  Tensor t = ones({2});
  if (!built_with_cuda()) {
    EXPECT_AG_ERROR(t.to(kCUDA), "[to] ampgrad was built without CUDA");
    EXPECT_AG_ERROR(zeros({2}, Device(kCUDA)), "ampgrad was built without CUDA");
  } else {
    // Built with CUDA but this machine may have no GPU: a clear error, never a crash.
    try {
      Tensor c = t.to(kCUDA);
      EXPECT_EQ(c.to(kCPU).to_vector<float>(), (std::vector<float>{1, 1}));
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
    }
  }
}
