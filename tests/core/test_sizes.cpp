// Size arithmetic that would overflow int64 (shapes near 2^62 and 2^63, byte counts, narrow's
// start + length, reshape's -1, cat's joined size, arange's count, conv and pool output
// sizes, the IDX dims) is refused with an ag::Error naming the op and the sizes, before
// anything is allocated; the ordinary cases are unchanged.
#include "support/testing.h"

#include <cmath>
#include <cstdint>
#include <limits>

using namespace ag;

namespace {

constexpr int64_t k62 = int64_t(1) << 62;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

using V = std::vector<int64_t>;

uint64_t cpu_allocations() { return memory_stats(kCPU).allocations; }

// Expects f to throw an ag::Error containing `substr` without allocating any CPU storage.
#define EXPECT_REFUSED_NO_ALLOC(stmt, substr)                                      \
  do {                                                                             \
    const uint64_t before_ = cpu_allocations();                                    \
    EXPECT_AG_ERROR(stmt, substr);                                                 \
    EXPECT_EQ(cpu_allocations(), before_) << #stmt " allocated before refusing"; \
  } while (0)

}  // namespace

TEST(Sizes, CheckedHelpers) {
  EXPECT_EQ(checked_mul(3, 4, "op"), 12);
  EXPECT_EQ(checked_mul(-3, 4, "op"), -12);
  EXPECT_EQ(checked_mul(k62, 1, "op"), k62);
  EXPECT_EQ(checked_add(kMax - 1, 1, "op"), kMax);
  EXPECT_AG_ERROR(checked_mul(k62, 4, "zeros", "the size"), "[zeros] the size overflows int64: 4611686018427387904 * 4");
  EXPECT_AG_ERROR(checked_mul(k62, 2, "op"), "[op] size overflows int64: 4611686018427387904 * 2");
  EXPECT_AG_ERROR(checked_add(kMax, 1, "narrow", "the end"), "[narrow] the end overflows int64: 9223372036854775807 + 1");

  EXPECT_EQ(checked_numel({2, 3, 4}, "op"), 24);
  EXPECT_EQ(checked_numel({}, "op"), 1);
  EXPECT_EQ(checked_numel({0, k62}, "op"), 0);  // the nonzero sizes' product fits
  EXPECT_EQ(checked_numel({k62, 1}, "op"), k62);
  EXPECT_TRUE(shape_fits({kMax}));
  EXPECT_FALSE(shape_fits({k62, 2}));
  EXPECT_FALSE(shape_fits({0, k62, k62}));
  EXPECT_FALSE(shape_fits({2, -1}));
  EXPECT_AG_ERROR(checked_numel({k62, 4}, "zeros"),
                  "[zeros] the shape [4611686018427387904, 4] has more elements than int64 can hold");
  EXPECT_AG_ERROR(checked_numel({int64_t(1) << 32, int64_t(1) << 32}, "op"),
                  "[op] the shape [4294967296, 4294967296] has more elements than int64 can hold");
  EXPECT_AG_ERROR(checked_numel({0, k62, k62}, "op"),
                  "[op] the shape [0, 4611686018427387904, 4611686018427387904] is too large: the product of its nonzero sizes overflows int64");
  EXPECT_AG_ERROR(checked_numel({3, -2}, "op"), "[op] negative dimension -2 in shape [3, -2]");

  EXPECT_EQ(checked_nbytes(6, 4, "op"), 24u);
  EXPECT_EQ(checked_nbytes(0, 8, "op"), 0u);
  EXPECT_EQ(checked_nbytes(kMax, 1, "op"), size_t(kMax));
  EXPECT_AG_ERROR(checked_nbytes(k62, 2, "zeros"),
                  "[zeros] a tensor of 4611686018427387904 elements of 2 bytes each needs more bytes than int64 can hold");
  EXPECT_AG_ERROR(checked_nbytes(-1, 2, "op"), "[op] negative element count -1");

  // Shape::numel refuses rather than wraps, even where no op checked the shape first.
  EXPECT_EQ(Shape({2, 3}).numel(), 6);
  EXPECT_AG_ERROR(Shape({k62, 4}).numel(), "[numel] the shape [4611686018427387904, 4] has more elements than int64 can hold");
  EXPECT_AG_ERROR(Shape({int64_t(1) << 33, int64_t(1) << 31}).numel(), "[numel]");  // 2^64 would wrap to 0
}

TEST(Sizes, FactoriesRefuseHugeShapesBeforeAllocating) {
  const std::string more = "has more elements than int64 can hold";
  EXPECT_REFUSED_NO_ALLOC(zeros({k62, 4}), "[zeros] the shape [4611686018427387904, 4] " + more);
  EXPECT_REFUSED_NO_ALLOC(ones({kMax, 2}), "[ones] the shape [9223372036854775807, 2] " + more);
  EXPECT_REFUSED_NO_ALLOC(empty({k62, 2}), "[empty] the shape [4611686018427387904, 2] " + more);
  EXPECT_REFUSED_NO_ALLOC(full({3, k62}, 1.5), "[full] the shape [3, 4611686018427387904] " + more);
  EXPECT_REFUSED_NO_ALLOC(rand({k62, 4}), "[rand] the shape");
  EXPECT_REFUSED_NO_ALLOC(randn({4, k62}), "[randn] the shape");
  EXPECT_REFUSED_NO_ALLOC(randint(0, 5, {k62, 4}), "[randint] the shape");
  EXPECT_REFUSED_NO_ALLOC(bernoulli({k62, 4}, 0.5), "[bernoulli] the shape");
  // products that wrap to 0 or to a small number: a tensor with a huge shape and no storage
  EXPECT_REFUSED_NO_ALLOC(zeros({int64_t(1) << 32, int64_t(1) << 32}), "[zeros] the shape [4294967296, 4294967296] " + more);
  EXPECT_REFUSED_NO_ALLOC(zeros({int64_t(1) << 33, int64_t(1) << 31}), "[zeros] the shape [8589934592, 2147483648] " + more);
  EXPECT_REFUSED_NO_ALLOC(empty({k62, 8, 3}, kUInt8), "[empty] the shape [4611686018427387904, 8, 3] " + more);
  EXPECT_REFUSED_NO_ALLOC(empty({k62 + 1, 4}), "[empty] the shape [4611686018427387905, 4] " + more);  // wraps to 4
  // a zero size does not excuse the others: they still multiply into the strides
  EXPECT_REFUSED_NO_ALLOC(zeros({0, k62, k62}), "[zeros] the shape [0, 4611686018427387904, 4611686018427387904] is too large");
  // the element count fits, the byte count does not
  EXPECT_REFUSED_NO_ALLOC(zeros({k62}), "[zeros] a tensor of 4611686018427387904 elements of 4 bytes each needs more bytes than int64 can hold");
  EXPECT_REFUSED_NO_ALLOC(zeros({int64_t(1) << 60}, kFloat64), "[zeros] a tensor of 1152921504606846976 elements of 8 bytes each");
  EXPECT_REFUSED_NO_ALLOC(empty({int64_t(1) << 31, int64_t(1) << 31}, kBFloat16), "[empty] a tensor of 4611686018427387904 elements of 2 bytes");
  // negative sizes
  EXPECT_REFUSED_NO_ALLOC(zeros({-1, 3}), "[zeros] negative dimension -1 in shape [-1, 3]");
  EXPECT_REFUSED_NO_ALLOC(rand({2, -5}), "[rand] negative dimension -5 in shape [2, -5]");
  // the *_like factories take their shape from a tensor, which can be a huge expanded view
  const Tensor wide = ones({1}).expand({k62});
  EXPECT_REFUSED_NO_ALLOC(zeros_like(wide), "[zeros] a tensor of 4611686018427387904 elements of 4 bytes");
  EXPECT_REFUSED_NO_ALLOC(wide.contiguous(), "[clone] a tensor of 4611686018427387904 elements of 4 bytes");
  EXPECT_REFUSED_NO_ALLOC(wide.to(kFloat64), "[to] a tensor of 4611686018427387904 elements of 8 bytes");
}

TEST(Sizes, FactoryCountsNameTheirOp) {
  // arange's count (end - start) / step, as a double, before it becomes an integer
  EXPECT_REFUSED_NO_ALLOC(arange(0.0, 1.0, 1e-300), "[arange] the range [0, 1) with step 1e-300 has 1e+300 elements, more than int64 can hold");
  EXPECT_REFUSED_NO_ALLOC(arange(0.0, 1e300, 1.0), "[arange] the range [0, 1e+300) with step 1 has 1e+300 elements");
  EXPECT_REFUSED_NO_ALLOC(arange(0.0, 1e19, 1.0), "[arange] the range [0, 1e+19) with step 1 has 1e+19 elements, more than int64 can hold");
  EXPECT_REFUSED_NO_ALLOC(arange(-1e308, 1e308, 1.0), "[arange] the range [-1e+308, 1e+308) with step 1 has inf elements");
  EXPECT_REFUSED_NO_ALLOC(arange(0.0, 1.0, INFINITY), "[arange] step must be finite, got inf");
  EXPECT_REFUSED_NO_ALLOC(arange(0.0, 1.0, NAN), "[arange] step must be finite, got nan");
  EXPECT_REFUSED_NO_ALLOC(arange(0.0, INFINITY, 1.0), "[arange] bounds must be finite");
  EXPECT_REFUSED_NO_ALLOC(arange(0, k62), "[arange] a tensor of 4611686018427387904 elements of 8 bytes each");
  // kMax rounds up to 2^63 as a double: one past int64
  EXPECT_REFUSED_NO_ALLOC(arange(kMax), "[arange] the range [0, 9.22337e+18) with step 1 has 9.22337e+18 elements, more than int64 can hold");
  // linspace's steps
  EXPECT_REFUSED_NO_ALLOC(linspace(0, 1, k62), "[linspace] a tensor of 4611686018427387904 elements of 8 bytes each");
  EXPECT_REFUSED_NO_ALLOC(linspace(0, 1, kMax), "[linspace] a tensor of 9223372036854775807 elements");
  EXPECT_REFUSED_NO_ALLOC(linspace(0, 1, -3), "[linspace] number of steps must be non-negative, got -3");
  // eye's n * m
  EXPECT_REFUSED_NO_ALLOC(eye(k62, 4), "[eye] the element count n * m overflows int64: 4611686018427387904 * 4");
  EXPECT_REFUSED_NO_ALLOC(eye(int64_t(1) << 32), "[eye] the element count n * m overflows int64: 4294967296 * 4294967296");
  EXPECT_REFUSED_NO_ALLOC(eye(int64_t(1) << 31), "[eye] a tensor of 4611686018427387904 elements of 8 bytes each");
  EXPECT_REFUSED_NO_ALLOC(eye(-1, 3), "[eye] sizes must be non-negative, got -1 and 3");
  // shapes given with values
  EXPECT_REFUSED_NO_ALLOC(from_vector<float>({}, {int64_t(1) << 32, int64_t(1) << 32}),
                          "[from_vector] the shape [4294967296, 4294967296] has more elements than int64 can hold");
  EXPECT_REFUSED_NO_ALLOC(from_vector<float>({1, 2}, {k62, 4}), "[from_vector] the shape [4611686018427387904, 4]");
  float buf[8] = {};
  EXPECT_AG_ERROR(from_blob(buf, {k62, 4}), "[from_blob] the shape [4611686018427387904, 4] has more elements than int64 can hold");
  EXPECT_AG_ERROR(from_blob(nullptr, {int64_t(1) << 32, int64_t(1) << 32}), "[from_blob] the shape");
  EXPECT_AG_ERROR(from_blob(buf, {3, 2}, V{kMax, 1}), "[from_blob] the memory extent overflows int64: 2 * 9223372036854775807");
  EXPECT_AG_ERROR(from_blob(buf, {2, 2}, V{k62, k62}), "[from_blob] the memory extent overflows int64: 4611686018427387905 + 4611686018427387904");
  EXPECT_AG_ERROR(from_blob(buf, {int64_t(1) << 61}, V{1}), "[from_blob] a tensor of 2305843009213693952 elements of 4 bytes each");
  EXPECT_AG_ERROR(from_blob(buf, {2, k62}, V{0, 0}), "[from_blob] the shape [2, 4611686018427387904] has more elements");
}

TEST(Sizes, OrdinaryFactoriesUnchanged) {
  EXPECT_EQ(zeros({2, 3}).numel(), 6);
  EXPECT_EQ(zeros({2, 3}).strides(), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(empty({0, 3}).numel(), 0);
  const Tensor z = zeros({0, int64_t(1) << 40});  // no elements; the strides fit
  EXPECT_EQ(z.numel(), 0);
  EXPECT_EQ(z.strides(), (std::vector<int64_t>{int64_t(1) << 40, 1}));
  EXPECT_EQ(z.nbytes(), 0u);
  EXPECT_EQ(empty(std::vector<int64_t>{}).numel(), 1);
  EXPECT_EQ(arange(0, 10, 3).to_vector<int64_t>(), (std::vector<int64_t>{0, 3, 6, 9}));
  EXPECT_EQ(arange(1.0, 0.0, -0.3).numel(), 4);
  EXPECT_EQ(arange(5, 5).numel(), 0);
  EXPECT_EQ(arange(0.0, 1.0, 0.5).numel(), 2);
  EXPECT_EQ(arange(0, k62, k62 / 2).to_vector<int64_t>(), (std::vector<int64_t>{0, k62 / 2}));
  EXPECT_EQ(linspace(0, 1, 0).numel(), 0);
  EXPECT_EQ(linspace(0, 1, 3).to_vector<double>(), (std::vector<double>{0, 0.5, 1}));
  EXPECT_EQ(eye(0, 5).sizes(), (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(eye(2, 3).to_vector<float>(), (std::vector<float>{1, 0, 0, 0, 1, 0}));
  EXPECT_EQ(randint(0, 3, {2, 2}).numel(), 4);
  float buf[6] = {0, 1, 2, 3, 4, 5};
  EXPECT_EQ(from_blob(buf, {3, 2}, V{1, 3}).to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(from_blob(nullptr, {0, 4}).numel(), 0);
  EXPECT_EQ(from_blob(buf, {k62}, V{0}).numel(), k62);  // a broadcast view of one value fits
}

TEST(Sizes, ViewsRefuseOverflowingSizes) {
  const Tensor x = arange(4);
  // narrow: start + length would wrap past the dim's size
  EXPECT_REFUSED_NO_ALLOC(x.narrow(0, 1, kMax), "[narrow] start 1 and length 9223372036854775807 are out of range for dim 0 of size 4");
  EXPECT_REFUSED_NO_ALLOC(x.narrow(0, kMax, 1), "[narrow] start 9223372036854775807 and length 1 are out of range");
  EXPECT_REFUSED_NO_ALLOC(x.narrow(0, -1, kMax), "[narrow] start 3 and length 9223372036854775807 are out of range");
  EXPECT_REFUSED_NO_ALLOC(x.narrow(0, std::numeric_limits<int64_t>::min(), 1), "[narrow]");
  EXPECT_REFUSED_NO_ALLOC(x.narrow(0, 2, -1), "[narrow] start 2 and length -1 are out of range");
  EXPECT_EQ(x.narrow(0, 1, 3).to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(x.narrow(0, -2, 2).to_vector<int64_t>(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(x.narrow(0, 4, 0).numel(), 0);

  // expand: a view with no storage of its own still has a numel that must fit
  const Tensor one = ones({1, 1}), one1 = ones({1});
  EXPECT_REFUSED_NO_ALLOC(one.expand({k62, 4}), "[expand] the shape [4611686018427387904, 4] has more elements than int64 can hold");
  EXPECT_REFUSED_NO_ALLOC(one.expand({int64_t(1) << 32, int64_t(1) << 32}), "[expand] the shape [4294967296, 4294967296]");
  EXPECT_REFUSED_NO_ALLOC(one.expand({3, k62, k62}), "[expand]");
  EXPECT_REFUSED_NO_ALLOC(one1.expand({-2}), "[expand] invalid size -2 in dim 0 of [-2]");
  EXPECT_REFUSED_NO_ALLOC(one.expand({2, -3}), "[expand] invalid size -3 in dim 1 of [2, -3]");
  EXPECT_EQ(one.expand({k62, 1}).numel(), k62);
  EXPECT_EQ(ones({1, 3}).expand({2, -1}).sizes(), (std::vector<int64_t>{2, 3}));

  // broadcasting two expanded views
  const Tensor tall = one.expand({k62, 1}), wide = one.expand({1, 4});
  EXPECT_REFUSED_NO_ALLOC(add(tall, wide), "[add] the shape [4611686018427387904, 4] has more elements than int64 can hold");
  EXPECT_REFUSED_NO_ALLOC(tall * wide, "[mul] the shape [4611686018427387904, 4]");
  const Tensor batch_a = ones({1, 1, 1, 1}).expand({k62, 1, 1, 1}), batch_b = ones({1, 4, 1, 1});
  EXPECT_REFUSED_NO_ALLOC(matmul(batch_a, batch_b), "[matmul] the shape [4611686018427387904, 4] has more elements");
  const Tensor rows = one.expand({k62, 1}), cols = one.expand({1, k62});
  EXPECT_REFUSED_NO_ALLOC(matmul(rows, cols), "[matmul] the shape [4611686018427387904, 4611686018427387904] has more elements");

  // reshape and view, with and without -1
  const Tensor none = zeros({0});
  EXPECT_REFUSED_NO_ALLOC(none.reshape({int64_t(1) << 32, int64_t(1) << 32}),
                          "[reshape] the shape [4294967296, 4294967296] has more elements than int64 can hold");
  EXPECT_REFUSED_NO_ALLOC(none.view({int64_t(1) << 32, int64_t(1) << 32}), "[view] the shape [4294967296, 4294967296]");
  EXPECT_REFUSED_NO_ALLOC(none.reshape({k62, 4, -1}), "[reshape] the shape [4611686018427387904, 4, -1] has more elements than int64 can hold");
  EXPECT_REFUSED_NO_ALLOC(none.reshape({k62, 4, 0}), "[reshape] the shape [4611686018427387904, 4, 0] is too large");
  EXPECT_REFUSED_NO_ALLOC(none.view({0, k62, k62}), "[view] the shape [0, 4611686018427387904, 4611686018427387904] is too large");
  EXPECT_REFUSED_NO_ALLOC(x.view({k62, -1}), "[view] shape [4611686018427387904, -1] is invalid for input of size 4");
  EXPECT_REFUSED_NO_ALLOC(x.reshape({-1, -2}), "[reshape] invalid dimension -2 in shape [-1, -2]");
  EXPECT_EQ(none.reshape({0, k62}).strides(), (std::vector<int64_t>{k62, 1}));
  EXPECT_EQ(x.reshape({2, -1}).sizes(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(x.view({-1}).sizes(), (std::vector<int64_t>{4}));
  EXPECT_EQ(tall.reshape({-1}).numel(), k62);  // a view: the 1-sized dim drops out
  EXPECT_EQ(tall.flatten().sizes(), (std::vector<int64_t>{k62}));

  // cat's joined size
  const Tensor half = ones({1}).expand({k62});
  EXPECT_REFUSED_NO_ALLOC(cat({half, half}), "[cat] the joined size overflows int64: 4611686018427387904 + 4611686018427387904");
  const Tensor quarter = ones({1}).expand({int64_t(1) << 61});
  EXPECT_REFUSED_NO_ALLOC(cat({quarter, quarter}), "[cat] a tensor of 4611686018427387904 elements of 4 bytes each");
  EXPECT_REFUSED_NO_ALLOC(stack({half, half}), "[cat] the shape [2, 4611686018427387904] has more elements");

  // split and chunk walk a huge dim without overflowing their offsets
  const Tensor big = ones({1}).expand({kMax});
  const auto parts = big.split(k62 + 1);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].size(0), k62 + 1);
  EXPECT_EQ(parts[1].size(0), kMax - (k62 + 1));
  EXPECT_EQ(big.split(kMax).size(), 1u);
  const auto halves = big.chunk(2);
  ASSERT_EQ(halves.size(), 2u);
  EXPECT_EQ(halves[0].size(0), k62);
  EXPECT_EQ(halves[1].size(0), k62 - 1);
  EXPECT_EQ(x.chunk(3).size(), 2u);  // ceil(4 / 3) = 2 per chunk
  EXPECT_EQ(x.split(3).size(), 2u);
  EXPECT_EQ(zeros({0}).split(2).size(), 1u);

  // unsqueeze's new stride, from a strided view of caller memory
  unsigned char bytes[2] = {};
  const Tensor far = from_blob(bytes, {2, 1}, V{k62, 1}, kUInt8);
  EXPECT_AG_ERROR(far.unsqueeze(0), "[unsqueeze] the new stride overflows int64: 2 * 4611686018427387904");
  EXPECT_EQ(x.unsqueeze(0).strides(), (std::vector<int64_t>{4, 1}));
}

TEST(Sizes, ConvAndPoolOutputSizes) {
  const Tensor x = ones({1, 1, 4, 4});
  const Tensor w = ones({1, 1, 3, 3});
  EXPECT_REFUSED_NO_ALLOC(conv2d(x, w, {}, {1}, {k62}), "[conv2d] the padding overflows int64: 2 * 4611686018427387904");
  EXPECT_REFUSED_NO_ALLOC(conv2d(x, w, {}, {1}, {kMax / 2}), "[conv2d] the padded input size overflows int64: 4 + 9223372036854775806");
  EXPECT_REFUSED_NO_ALLOC(conv2d(x, w, {}, {1}, {0}, {k62}), "[conv2d] the dilated kernel size overflows int64: 4611686018427387904 * 2");
  EXPECT_REFUSED_NO_ALLOC(conv2d(x, w, {}, {1}, {0}, {kMax / 2 + 1}), "[conv2d] the dilated kernel size overflows int64");
  // 4 * (2^62 + 1) wraps to 4, which would have matched the input's 4 channels
  const Tensor x4 = ones({1, 4, 2, 2}), w0 = ones({0, 4, 1, 1});
  EXPECT_REFUSED_NO_ALLOC(conv2d(x4, w0, {}, {1}, {0}, {1}, k62 + 1),
                          "[conv2d] in_channels / groups * groups overflows int64: 4 * 4611686018427387905");
  EXPECT_REFUSED_NO_ALLOC(conv2d(x, w, {}, {1}, {0}, {2}), "[conv2d] kernel of shape [1, 1, 3, 3] (dilated size [5, 5]) is larger");
  // the ordinary sizes are unchanged
  EXPECT_EQ(conv2d(x, w).sizes(), (std::vector<int64_t>{1, 1, 2, 2}));
  EXPECT_EQ(conv2d(x, w, {}, {1}, {1}).sizes(), (std::vector<int64_t>{1, 1, 4, 4}));
  EXPECT_EQ(conv2d(x, w, {}, {100}, {1}).sizes(), (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(conv2d(x, w, {}, {2}, {1}).to_vector<float>(), (std::vector<float>{4, 6, 6, 9}));

  EXPECT_REFUSED_NO_ALLOC(max_pool2d(x, {3}, {1}, {0}, {k62}), "[max_pool2d] the dilated kernel size overflows int64: 4611686018427387904 * 2");
  EXPECT_REFUSED_NO_ALLOC(max_pool2d(x, {kMax}, {1}, {kMax / 2}), "[max_pool2d] the padded input size overflows int64: 4 + 9223372036854775806");
  EXPECT_REFUSED_NO_ALLOC(avg_pool2d(x, {kMax}, {1}, {kMax / 2}, true), "[avg_pool2d] the padded input size overflows int64");
  EXPECT_REFUSED_NO_ALLOC(max_pool2d(x, {kMax}), "[max_pool2d] input of shape [1, 1, 4, 4] is too small for kernel_size");
  EXPECT_REFUSED_NO_ALLOC(avg_pool2d(x, {k62}, {1}, {0}), "[avg_pool2d] input of shape [1, 1, 4, 4] is too small");
  // a stride past the input in ceil mode: one window, as in PyTorch. (The size arithmetic
  // takes strides up to int64's max, where num + stride - 1 used to overflow; where oneDNN
  // refuses such strides, the loops compute the window.)
  const Tensor y = arange(64.0).view({1, 1, 8, 8});
  const Tensor p = max_pool2d(y, {3}, {100}, {0}, {1}, true);
  EXPECT_EQ(p.sizes(), (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(p.item<float>(), 18.0f);
  EXPECT_EQ(avg_pool2d(y, {2}, {100}, {1}, true).sizes(), (std::vector<int64_t>{1, 1, 1, 1}));
  const Tensor q = max_pool2d(y, {3}, {kMax}, {0}, {1}, true);
  EXPECT_EQ(q.sizes(), (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(q.item<float>(), 18.0f);
  // PyTorch's ceil_mode sizes
  const Tensor five = ones({1, 1, 5, 5});
  EXPECT_EQ(max_pool2d(five, {2}, {2}).sizes(), (std::vector<int64_t>{1, 1, 2, 2}));
  EXPECT_EQ(max_pool2d(five, {2}, {2}, {0}, {1}, true).sizes(), (std::vector<int64_t>{1, 1, 3, 3}));
  EXPECT_EQ(max_pool2d(ones({1, 1, 4, 4}), {2}, {2}, {1}, {1}, true).sizes(), (std::vector<int64_t>{1, 1, 3, 3}));
  EXPECT_EQ(avg_pool2d(ones({1, 1, 6, 6}), {3}, {2}, {1}, true).sizes(), (std::vector<int64_t>{1, 1, 4, 4}));
  EXPECT_EQ(avg_pool2d(ones({1, 1, 6, 6}), {3}, {2}, {1}, false).sizes(), (std::vector<int64_t>{1, 1, 3, 3}));
}

TEST(Sizes, IdxDimsProduct) {
  agt::TempDir dir;
  // dims 2^17 * 2^16 * 2^31 = 2^64: a 64-bit product wraps to 0, which "matched" no data
  // (later on, the shape itself would be refused as well)
  const std::string wrap = dir.file("wrap-idx3-ubyte");
  agt::write_bytes(wrap, {0, 0, 8, 3, 0, 2, 0, 0, 0, 1, 0, 0, 0x80, 0, 0, 0});
  EXPECT_REFUSED_NO_ALLOC(data::read_idx(wrap), "[read_idx] " + wrap + ": dims [131072, 65536, 2147483648] are implausibly large");
  // the old bound on the product still holds below int64
  const std::string large = dir.file("large-idx3-ubyte");
  agt::write_bytes(large, {0, 0, 8, 3, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0});
  EXPECT_REFUSED_NO_ALLOC(data::read_idx(large), "implausibly large");
  const std::string ok = dir.file("ok-idx2-ubyte");
  agt::write_bytes(ok, {0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 4, 5, 6});
  const Tensor t = data::read_idx(ok);
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
}
