#include "support/testing.h"
#include "ampgrad/philox.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>

using namespace ag;

namespace {
std::vector<float> vals(const Tensor& t) { return t.to_vector<float>(); }
}  // namespace

TEST(Tensor, FactoriesAndMetadata) {
  Tensor z = zeros({2, 3});
  EXPECT_TRUE(z.defined());
  EXPECT_EQ(z.dim(), 2);
  EXPECT_EQ(z.numel(), 6);
  EXPECT_EQ(z.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(z.strides(), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(z.dtype(), kFloat32);
  EXPECT_EQ(z.device(), Device(kCPU));
  EXPECT_EQ(vals(ones({2}, kBFloat16)), (std::vector<float>{1, 1}));
  EXPECT_EQ(vals(full({2}, 2.5)), (std::vector<float>{2.5, 2.5}));
  EXPECT_EQ(full({1}, 3).dtype(), kInt64);
  EXPECT_EQ(arange(4).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(vals(arange(1.0, 2.0, 0.25)), (std::vector<float>{1, 1.25, 1.5, 1.75}));
  EXPECT_EQ(vals(linspace(0, 1, 5)), (std::vector<float>{0, 0.25, 0.5, 0.75, 1}));
  EXPECT_EQ(vals(eye(2, 3)), (std::vector<float>{1, 0, 0, 0, 1, 0}));
  EXPECT_FALSE(Tensor().defined());
  EXPECT_FALSE(z.requires_grad());
  EXPECT_TRUE(zeros({2}, TensorOptions().requires_grad(true)).requires_grad());
  EXPECT_EQ(scalar_tensor(3.5).dim(), 0);
  EXPECT_EQ(scalar_tensor(3.5).item<double>(), 3.5);
}

TEST(Tensor, FromVectorFromBlobItem) {
  Tensor t = from_vector<int32_t>({1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(t.dtype(), kInt32);
  EXPECT_EQ(t.data_ptr<int32_t>()[3], 4);
  Tensor f = from_vector<double>({1.5, 2.5}, {2}, kFloat16);
  EXPECT_EQ(f.dtype(), kFloat16);
  EXPECT_EQ(f.to_vector<float>(), (std::vector<float>{1.5, 2.5}));
  EXPECT_AG_ERROR(from_vector<float>({1, 2, 3}, {2, 2}), "[from_vector] shape [2, 2] holds 4 elements but 3 values were given");
  EXPECT_AG_ERROR(t.data_ptr<float>(), "[data_ptr] requested float32 from a tensor of dtype int32");

  float buf[6] = {0, 1, 2, 3, 4, 5};
  Tensor b = from_blob(buf, {2, 3});
  b.mul_(2.0f);
  EXPECT_EQ(buf[5], 10.0f);  // no copy: writes reach the caller's memory
  bool freed = false;
  {
    Tensor owned = from_blob(buf, {6}, {}, [&](void*) { freed = true; });
    EXPECT_FALSE(freed);
  }
  EXPECT_TRUE(freed);
  EXPECT_EQ(from_vector<float>({7}, {1}).item<float>(), 7.0f);
  EXPECT_AG_ERROR(ones({2}).item<float>(), "[item] a tensor with 2 elements (shape [2]) cannot be converted to a scalar");
}

TEST(Tensor, ViewsShareStorage) {
  Tensor a = arange(12.0).reshape({3, 4});
  Tensor v = a.view({4, 3});
  Tensor t = a.transpose(0, 1);
  Tensor n = a.narrow(1, 1, 2);
  Tensor s = a.select(0, 2);
  Tensor e = a.select(1, 0).unsqueeze(1).expand({3, 5});
  EXPECT_TRUE(v.is_alias_of(a));
  EXPECT_TRUE(t.is_alias_of(a));
  EXPECT_TRUE(n.is_alias_of(a));
  EXPECT_TRUE(e.is_alias_of(a));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.strides(), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(n.sizes(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(vals(n), (std::vector<float>{1, 2, 5, 6, 9, 10}));
  EXPECT_EQ(vals(s), (std::vector<float>{8, 9, 10, 11}));
  EXPECT_EQ(e.strides()[1], 0);
  EXPECT_EQ(vals(e.select(0, 1)), (std::vector<float>{4, 4, 4, 4, 4}));
  EXPECT_EQ(vals(t.contiguous()), (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_EQ(a.permute({1, 0}).sizes(), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(a.unsqueeze(0).squeeze().sizes(), a.sizes());
  EXPECT_EQ(a.unsqueeze(-1).sizes(), (std::vector<int64_t>{3, 4, 1}));
  EXPECT_EQ(a.flatten().sizes(), (std::vector<int64_t>{12}));
  EXPECT_EQ(a.reshape({2, -1}).sizes(), (std::vector<int64_t>{2, 6}));
  // a write through a view is seen by the base and bumps the shared version
  const uint64_t v0 = a.version();
  n.fill_(-1);
  EXPECT_EQ(a.version(), v0 + 1);
  EXPECT_EQ(vals(a.select(0, 0)), (std::vector<float>{0, -1, -1, 3}));
  // reshape of a transposed tensor must copy; view must refuse
  EXPECT_FALSE(t.reshape({12}).is_alias_of(a));
  EXPECT_AG_ERROR(t.view({12}), "cannot be viewed as shape [12] without a copy; use reshape");
  EXPECT_AG_ERROR(a.view({5, -1}), "[view] shape [5, -1] is invalid for input of size 12");
  EXPECT_AG_ERROR(a.transpose(0, 2), "[transpose] dim 2 is out of range for a tensor of 2 dims");
  EXPECT_AG_ERROR(a.narrow(1, 3, 2), "[narrow] start 3 and length 2 are out of range for dim 1 of size 4");
  EXPECT_AG_ERROR(a.expand({3, 5}), "[expand] cannot expand shape [3, 4] to [3, 5]");
}

TEST(Tensor, CatStackSplitChunk) {
  Tensor a = arange(6.0).reshape({2, 3});
  Tensor b = full({2, 1}, 9.0);
  Tensor c = cat({a, b}, 1);
  EXPECT_EQ(c.sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(vals(c), (std::vector<float>{0, 1, 2, 9, 3, 4, 5, 9}));
  EXPECT_EQ(cat({a, a}, 0).sizes(), (std::vector<int64_t>{4, 3}));
  Tensor s = stack({a, a}, 1);
  EXPECT_EQ(s.sizes(), (std::vector<int64_t>{2, 2, 3}));
  EXPECT_EQ(vals(s.select(1, 1)), vals(a));
  auto parts = arange(7.0).split(3);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[2].numel(), 1);
  auto ch = arange(6.0).chunk(4);
  ASSERT_EQ(ch.size(), 3u);  // chunks of 2, like PyTorch
  EXPECT_EQ(vals(ch[1]), (std::vector<float>{2, 3}));
  EXPECT_AG_ERROR(cat({a, full({3, 1}, 1.0)}, 1), "sizes of tensors must match except in dim 1");
  EXPECT_AG_ERROR(stack({a, b}), "[stack] all tensors must have one shape");
}

TEST(Tensor, IndexingOps) {
  Tensor a = arange(12.0).reshape({3, 4});
  Tensor idx = from_vector<int64_t>({2, 0}, {2});
  EXPECT_EQ(vals(a.index_select(0, idx)), (std::vector<float>{8, 9, 10, 11, 0, 1, 2, 3}));
  EXPECT_EQ(vals(a.index_select(1, idx)), (std::vector<float>{2, 0, 6, 4, 10, 8}));
  Tensor g = from_vector<int64_t>({3, 0, 1}, {3, 1});
  EXPECT_EQ(vals(a.gather(1, g)), (std::vector<float>{3, 4, 9}));
  Tensor mask = a > 5.0;
  EXPECT_EQ(mask.dtype(), kBool);
  EXPECT_EQ(vals(a.masked_fill(mask, 0.0).select(1, 3)), (std::vector<float>{3, 0, 0}));
  EXPECT_EQ(vals(where(mask, a, -a).select(0, 1)), (std::vector<float>{-4, -5, 6, 7}));
  EXPECT_AG_ERROR(a.index_select(0, from_vector<int64_t>({3}, {1})), "[index_select] index 3 is out of range for dim 0 of size 3");
  EXPECT_AG_ERROR(a.gather(1, from_vector<int64_t>({4}, {1, 1})), "[gather] index 4 is out of range for dim 1 of size 4");
  EXPECT_AG_ERROR(a.index_select(0, from_vector<float>({0}, {1})), "[index_select] index must be int64 or int32, got float32");
  EXPECT_AG_ERROR(where(a, a, a), "[where] the condition must be bool, got float32");
}

TEST(Tensor, ToDtypeAndPrinting) {
  Tensor a = from_vector<float>({1.5f, -2.25f, 65504.0f, 1e6f}, {4});
  EXPECT_EQ(a.to(kFloat16).to_vector<float>(), (std::vector<float>{1.5f, -2.25f, 65504.0f, INFINITY}));
  EXPECT_EQ(a.to(kInt32).to_vector<int32_t>(), (std::vector<int32_t>{1, -2, 65504, 1000000}));
  EXPECT_EQ(a.to(kBool).to_vector<bool>(), (std::vector<bool>{true, true, true, true}));
  Tensor p = from_vector<float>({1, 2, 3, 4}, {2, 2}).requires_grad_();
  const std::string s = (p * 2.0f).str();
  EXPECT_NE(s.find("tensor([[2., 4.],\n        [6., 8.]]"), std::string::npos) << s;
  EXPECT_NE(s.find("shape=[2, 2]"), std::string::npos) << s;
  EXPECT_NE(s.find("dtype=float32"), std::string::npos) << s;
  EXPECT_NE(s.find("device=cpu"), std::string::npos) << s;
  EXPECT_NE(s.find("grad_fn=<MulBackward>"), std::string::npos) << s;
  EXPECT_NE(arange(5000).str().find("..."), std::string::npos);
}

namespace {
// The Kolmogorov-Smirnov statistic: the largest gap between the sample's empirical CDF and
// the distribution's CDF.
double ks_statistic(std::vector<double> v, const std::function<double(double)>& cdf) {
  std::sort(v.begin(), v.end());
  const double n = double(v.size());
  double d = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const double f = cdf(v[i]);
    d = std::max({d, double(i + 1) / n - f, f - double(i) / n});
  }
  return d;
}
}  // namespace

// Mean and variance do not pin a distribution down (a uniform scaled to variance 1 has
// both); the whole CDF does. With a fixed seed the statistic is fixed; the bound is the
// 0.1% critical value 1.95 / sqrt(n), which a correct generator passes for almost every
// seed and a wrong shape fails by far.
TEST(Random, DistributionsPassKolmogorovSmirnov) {
  const int64_t n = 40000;
  const double bound = 1.95 / std::sqrt(double(n));
  auto normal_cdf = [](double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); };
  auto uniform_cdf = [](double x) { return std::clamp(x, 0.0, 1.0); };
  for (DType dt : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype_name(dt));
    manual_seed(123);
    EXPECT_LT(ks_statistic(randn({n}, dt).to_vector<double>(), normal_cdf), bound) << "randn against N(0, 1)";
    EXPECT_LT(ks_statistic(rand({n}, dt).to_vector<double>(), uniform_cdf), bound) << "rand against U(0, 1)";
    // the tails too: |x| > 3 has probability 0.0027, so about 108 of 40000
    int64_t tails = 0;
    for (double x : randn({n}, dt).to_vector<double>()) tails += std::fabs(x) > 3;
    EXPECT_GT(tails, 108 - 40);
    EXPECT_LT(tails, 108 + 40);
  }
  // a 2-D draw is the same stream as a 1-D one (draws do not depend on the shape)
  manual_seed(5);
  const auto flat = randn({12}).to_vector<double>();
  manual_seed(5);
  EXPECT_EQ(randn({3, 4}).to_vector<double>(), flat);
}

TEST(Random, SeededAndReproducible) {
  manual_seed(42);
  Tensor a = rand({1000});
  Tensor b = randn({1000});
  manual_seed(42);
  Tensor a2 = rand({1000});
  Tensor b2 = randn({1000});
  EXPECT_EQ(vals(a), vals(a2));
  EXPECT_EQ(vals(b), vals(b2));
  EXPECT_NE(vals(a), vals(rand({1000})));
  const auto u = a.to_vector<double>();
  double mean = 0;
  for (double x : u) {
    EXPECT_GE(x, 0.0);
    EXPECT_LT(x, 1.0);
    mean += x / double(u.size());
  }
  EXPECT_NEAR(mean, 0.5, 0.05);
  const auto n = randn({20000}, kFloat64).to_vector<double>();
  double m = 0, v = 0;
  for (double x : n) m += x / double(n.size());
  for (double x : n) v += (x - m) * (x - m) / double(n.size());
  EXPECT_NEAR(m, 0.0, 0.03);
  EXPECT_NEAR(v, 1.0, 0.05);
  const auto r = randint(-3, 4, {5000}).to_vector<int64_t>();
  int64_t lo = 100, hi = -100;
  for (auto x : r) lo = std::min(lo, x), hi = std::max(hi, x);
  EXPECT_EQ(lo, -3);
  EXPECT_EQ(hi, 3);
  const auto bern = bernoulli({10000}, 0.3).to_vector<float>();
  double ones_frac = 0;
  for (float x : bern) {
    EXPECT_TRUE(x == 0.0f || x == 1.0f);
    ones_frac += x / 10000.0;
  }
  EXPECT_NEAR(ones_frac, 0.3, 0.03);
  // the thread count does not change the numbers
  manual_seed(7);
  Tensor big = rand({200000});
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  manual_seed(7);
  Tensor big1 = rand({200000});
  omp_set_num_threads(threads);
  EXPECT_EQ(vals(big), vals(big1));
}

// The CPU's uniform and normal draws follow the documented rule element by element:
// element i of a draw with (seed, offset) is made from Philox4x32-10 of counter offset + i
// (ampgrad/philox.h), whatever block of counters the kernel computes it in. Sizes and offsets
// that are not multiples of the kernel's 16 lanes, float32 and bfloat16; at each kernel
// instruction-set level this CPU runs (the fills have an AVX-512 variant and the baseline).
class RandomEachIsa : public agt::EachKernelIsa {};
TEST_P(RandomEachIsa, CpuDrawsFollowThePhiloxRule) {
  const uint64_t seed = 0x1234567890ABCDEFull;
  for (const int64_t n : {1, 15, 17, 100, 5000})
    for (const uint64_t offset : {uint64_t(0), uint64_t(7), (uint64_t(1) << 32) - 5})
      for (const DType dt : {kFloat32, kBFloat16}) {
        SCOPED_TRACE(std::to_string(n) + " at offset " + std::to_string(offset) + " " + dtype_name(dt));
        Tensor u = empty({n}, dt), z = empty({n}, dt);
        cpu_backend().uniform(u, -2.0, 3.0, seed, offset);
        cpu_backend().normal(z, 0.5, 2.0, seed, offset);
        const std::vector<double> got_u = u.to_vector<double>(), got_z = z.to_vector<double>();
        for (int64_t i = 0; i < n; ++i) {
          const ampgrad::kernels::Philox4x32 r(seed, offset + uint64_t(i));
          const double want_u = -2.0 + 5.0 * ampgrad::kernels::uniform01(r.out[0], r.out[1]);
          const double u1 = 1.0 - ampgrad::kernels::uniform01(r.out[0], r.out[1]);
          const double u2 = ampgrad::kernels::uniform01(r.out[2], r.out[3]);
          const double want_z = 0.5 + 2.0 * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
          // the draw rounded to the dtype (one below 3 where it rounds up to it)
          const Tensor wu = full({1}, want_u, kFloat64).to(dt), wz = full({1}, want_z, kFloat64).to(dt);
          const double eu = wu.to_vector<double>()[0] < 3.0 ? wu.to_vector<double>()[0] : got_u[size_t(i)];
          ASSERT_EQ(got_u[size_t(i)], eu) << "uniform element " << i;
          ASSERT_LT(got_u[size_t(i)], 3.0) << "uniform element " << i;
          ASSERT_EQ(got_z[size_t(i)], wz.to_vector<double>()[0]) << "normal element " << i;
        }
      }
}
AGT_EACH_KERNEL_ISA(RandomEachIsa);
