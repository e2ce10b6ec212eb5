// matmul and linear: values against a naive float64 reference for every rank combination
// and broadcast, transposed and otherwise strided operands, float64 gradchecks, the 16-bit
// dtypes against float32, error messages, and the oneDNN primitive cache.
#include "support/testing.h"

#include <omp.h>

#include <array>
#include <cmath>
#include <thread>

using namespace ag;
using TL = std::vector<Tensor>;

namespace {

// torch.matmul in float64 with plain loops: 1-D operands get a dim prepended (left) or
// appended (right) that is removed from the result; batch dims broadcast.
Tensor ref_matmul(const Tensor& a0, const Tensor& b0) {
  const std::vector<int64_t> as = a0.dim() == 1 ? std::vector<int64_t>{1, a0.size(0)} : a0.sizes().vec();
  const std::vector<int64_t> bs = b0.dim() == 1 ? std::vector<int64_t>{b0.size(0), 1} : b0.sizes().vec();
  const auto av = a0.to_vector<double>(), bv = b0.to_vector<double>();
  const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  EXPECT_EQ(K, bs[bs.size() - 2]);
  const size_t ab = as.size() - 2, bb = bs.size() - 2, nb = std::max(ab, bb);
  std::vector<int64_t> batch(nb);
  for (size_t i = 0; i < nb; ++i) {
    const int64_t da = i < nb - ab ? 1 : as[i - (nb - ab)];
    const int64_t db = i < nb - bb ? 1 : bs[i - (nb - bb)];
    batch[i] = std::max(da, db);
  }
  int64_t B = 1;
  for (int64_t s : batch) B *= s;
  std::vector<double> out(size_t(B * M * N));
  for (int64_t bi = 0; bi < B; ++bi) {
    // the batch's multi-index, then each operand's (broadcast) batch offset
    int64_t rem = bi, ao = 0, bo = 0, astride = M * K, bstride = K * N;
    for (int64_t d = int64_t(nb) - 1; d >= 0; --d) {
      const int64_t idx = rem % batch[size_t(d)];
      rem /= batch[size_t(d)];
      const int64_t ad = d - int64_t(nb - ab), bd = d - int64_t(nb - bb);
      if (ad >= 0) {
        if (as[size_t(ad)] != 1) ao += idx * astride;
        astride *= as[size_t(ad)];
      }
      if (bd >= 0) {
        if (bs[size_t(bd)] != 1) bo += idx * bstride;
        bstride *= bs[size_t(bd)];
      }
    }
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += av[size_t(ao + m * K + k)] * bv[size_t(bo + k * N + n)];
        out[size_t((bi * M + m) * N + n)] = s;
      }
  }
  std::vector<int64_t> shape = batch;
  if (a0.dim() > 1) shape.push_back(M);
  if (b0.dim() > 1) shape.push_back(N);
  return from_vector(out, shape);
}

using agt::fp32_tol;
using agt::randf;
using agt::ref_linear;

}  // namespace

TEST(Linalg, MatmulAllRankCombinations) {
  manual_seed(11);
  struct Case {
    std::vector<int64_t> a, b, out;
  };
  const std::vector<Case> cases = {
      {{5}, {5}, {}},                          // dot
      {{5}, {5, 3}, {3}},                      // vector @ matrix
      {{4, 5}, {5}, {4}},                      // matrix @ vector
      {{4, 5}, {5, 3}, {4, 3}},                // matrix @ matrix
      {{5}, {2, 5, 3}, {2, 3}},                // vector @ batch
      {{2, 4, 5}, {5}, {2, 4}},                // batch @ vector
      {{4, 5}, {2, 5, 3}, {2, 4, 3}},          // matrix broadcast over the batch
      {{2, 4, 5}, {5, 3}, {2, 4, 3}},          // batch @ matrix (folded)
      {{2, 4, 5}, {2, 5, 3}, {2, 4, 3}},       // batch @ batch
      {{2, 1, 4, 5}, {3, 5, 6}, {2, 3, 4, 6}}, // batch dims broadcast both ways
      {{1, 3, 4, 5}, {2, 1, 5, 6}, {2, 3, 4, 6}},
      {{3, 1, 4, 5}, {1, 2, 5, 6}, {3, 2, 4, 6}},
      {{2, 3, 4, 5}, {5, 6}, {2, 3, 4, 6}},
      {{1, 1}, {1, 1}, {1, 1}},
      {{7, 1}, {1, 9}, {7, 9}},                // outer product (K = 1)
  };
  for (const auto& c : cases) {
    Tensor a = randf(c.a), b = randf(c.b);
    Tensor got = matmul(a, b);
    EXPECT_EQ(got.sizes(), c.out) << Shape(c.a) << " @ " << Shape(c.b);
    EXPECT_TRUE(agt::allclose(got, ref_matmul(a, b), fp32_tol(c.a.back()))) << Shape(c.a) << " @ " << Shape(c.b);
    EXPECT_TRUE(agt::allclose(a.matmul(b), got, 0, 0));
  }
}

TEST(Linalg, MatmulLargerShapesMatchReference) {
  manual_seed(12);
  for (auto [m, k, n] : std::vector<std::array<int64_t, 3>>{{64, 96, 80}, {1, 300, 17}, {129, 3, 65}, {33, 257, 1}}) {
    Tensor a = randf({m, k}), b = randf({k, n});
    EXPECT_TRUE(agt::allclose(matmul(a, b), ref_matmul(a, b), fp32_tol(k))) << m << "x" << k << "x" << n;
  }
}

// Products of at least 2048 rows with large weights take the weight in oneDNN's blocked
// layout, reordered on each call: row-major and transposed weights against the float64
// reference, and a weight changed in place between two calls is read anew.
TEST(Linalg, LargeFloat32ProductsWithReorderedWeightsMatchReference) {
  manual_seed(22);
  for (auto [m, k, n] : std::vector<std::array<int64_t, 3>>{{2048, 128, 512}, {2050, 520, 130}}) {
    Tensor a = randf({m, k});
    for (bool wt : {false, true}) {
      Tensor b = wt ? randf({n, k}).t() : randf({k, n});
      EXPECT_TRUE(agt::allclose(matmul(a, b), ref_matmul(a, b), fp32_tol(k))) << m << "x" << k << "x" << n << " " << wt;
      b.mul_(-0.5);
      EXPECT_TRUE(agt::allclose(matmul(a, b), ref_matmul(a, b), fp32_tol(k)))
          << m << "x" << k << "x" << n << " " << wt << " after the weight changed";
    }
  }
}

// A weight gradient's product dY^T X: the first operand transposed, a long inner dimension
// (the batch's rows), split into shares with oneDNN and the partial products summed.
// Against the float64 reference on every thread count, with the second operand row-major
// and transposed and inner dimensions that do and do not divide evenly; with oneDNN, the
// same bits for any thread count (Eigen's GEMM picks its blocking by the thread count).
TEST(Linalg, WeightGradientProductsMatchReferenceForAnyThreadCount) {
  manual_seed(18);
  const int saved = omp_get_max_threads();
  const std::vector<std::array<int64_t, 3>> shapes = {{24, 512, 40},  {33, 2048, 17}, {16, 3073, 48},
                                                       {40, 8300, 24}, {3, 4096, 5},   {64, 2048, 20}};
  for (auto [m, k, n] : shapes) {
    for (int layout = 0; layout < 3; ++layout) {
      // a [m, k] column-major; b [k, n] row-major, transposed, or both with leading
      // dimensions wider than their rows (the columns of wider matrices)
      const bool wt = layout == 1, wide = layout == 2;
      Tensor a = wide ? randf({k, m + 5}).narrow(1, 2, m).t() : randf({k, m}).t();
      Tensor b = wt ? randf({n, k}).t() : wide ? randf({k, n + 3}).narrow(1, 1, n) : randf({k, n});
      const Tensor ref = ref_matmul(a, b);
      omp_set_num_threads(1);
      const Tensor one = matmul(a, b);
      EXPECT_TRUE(agt::allclose(one, ref, fp32_tol(k))) << m << "x" << k << "x" << n << " layout " << layout;
      for (int threads : {2, 3, 4}) {  // 4: more threads than the shares of 2048 rows (rows split)
        omp_set_num_threads(threads);
        const Tensor got = matmul(a, b);
        EXPECT_TRUE(agt::allclose(got, ref, fp32_tol(k))) << m << "x" << k << "x" << n << " layout " << layout;
        if (built_with_onednn())
          EXPECT_TRUE(agt::allclose(got, one, 0, 0))
              << m << "x" << k << "x" << n << " layout " << layout << " on " << threads << " threads";
      }
    }
  }
  omp_set_num_threads(saved);
}

TEST(Linalg, MatmulStridedOperandsAreReadInPlaceOrCopied) {
  manual_seed(13);
  Tensor base_a = randf({6, 5}), base_b = randf({3, 6});
  // transposed views (column-major operands)
  Tensor at = base_a.t(), bt = base_b.t();  // [5, 6], [6, 3]
  EXPECT_FALSE(at.is_contiguous());
  EXPECT_TRUE(agt::allclose(matmul(at, bt), ref_matmul(at, bt), fp32_tol(6)));
  // both transposed, batched: transpose(-1, -2) of 3-D tensors
  Tensor a3 = randf({3, 7, 4}).transpose(1, 2), b3 = randf({3, 5, 7}).transpose(1, 2);  // [3,4,7] @ [3,7,5]
  EXPECT_TRUE(agt::allclose(matmul(a3, b3), ref_matmul(a3, b3), fp32_tol(7)));
  // a column slice: row stride larger than the row length
  Tensor wide = randf({8, 10});
  Tensor sl = wide.narrow(1, 2, 5);  // [8, 5], row stride 10
  Tensor r = randf({5, 4});
  EXPECT_TRUE(agt::allclose(matmul(sl, r), ref_matmul(sl, r), fp32_tol(5)));
  // neither matrix dim of unit stride: a copy is made
  Tensor pairs = randf({4, 6, 2});
  Tensor even = pairs.select(2, 0);  // [4, 6] with strides [12, 2]
  Tensor q = randf({6, 3});
  EXPECT_TRUE(agt::allclose(matmul(even, q), ref_matmul(even, q), fp32_tol(6)));
  // rows repeated by expand (row stride 0)
  Tensor row = randf({1, 6}).expand({5, 6});
  EXPECT_TRUE(agt::allclose(matmul(row, q), ref_matmul(row, q), fp32_tol(6)));
  // batch dims that cannot collapse into one stride
  Tensor nb = randf({2, 3, 4, 5}).permute({1, 0, 2, 3});  // [3, 2, 4, 5]
  Tensor rb = randf({3, 2, 5, 2});
  EXPECT_TRUE(agt::allclose(matmul(nb, rb), ref_matmul(nb, rb), fp32_tol(5)));
  // both operands expanded over the batch (batch stride 0 in each): every batch of the
  // result is the same product (found by the graph fuzzer)
  Tensor b1 = randf({1, 3, 4}), ea = randf({2, 3}).expand({2, 2, 3}), eb = b1.expand({2, 3, 4});
  EXPECT_TRUE(agt::allclose(matmul(ea, eb), ref_matmul(ea, eb), fp32_tol(3)));
  EXPECT_TRUE(agt::allclose(matmul(ea, b1), ref_matmul(ea, eb), fp32_tol(3)));
  // a size-1 dim whose stride equals the other dim's: the transpose of a [2, 1] column is
  // [1, 2] with strides [1, 1] (a matmul's weight gradient reads it so), over a batch
  Tensor col = randf({2, 1}), g = randf({2, 2, 1});
  EXPECT_TRUE(agt::allclose(matmul(col.t().expand({2, 1, 2}), g), ref_matmul(col.t().expand({2, 1, 2}), g), fp32_tol(2)));
  EXPECT_TRUE(agt::allclose(matmul(col.t(), g), ref_matmul(col.t(), g), fp32_tol(2)));
  // the test helper's layout
  Tensor nc = agt::non_contiguous(randf({6, 7})), nd = agt::non_contiguous(randf({7, 6}));
  EXPECT_TRUE(agt::allclose(matmul(nc, nd), ref_matmul(nc, nd), fp32_tol(7)));
}

// Copies out of a transposed matrix of 16-, 32- and 64-bit elements (blocks through AVX-512
// registers at the kernels' level avx512, the edges apart; L1 buffers below it, at each
// level this CPU runs) give each element where it belongs, whatever the sizes' remainders.
class LinalgEachIsa : public agt::EachKernelIsa {};
TEST_P(LinalgEachIsa, TransposedCopiesPutEveryElementInPlace) {
  manual_seed(17);
  for (auto [r, c] : std::vector<std::array<int64_t, 2>>{{16, 16}, {17, 33}, {40, 200}, {200, 40}, {15, 64}, {1536, 384}}) {
    SCOPED_TRACE(std::to_string(r) + "x" + std::to_string(c));
    for (DType dt : {kFloat32, kInt32, kBFloat16, kFloat64}) {
      const Tensor base = randint(-1000000, 1000000, {c, r}).to(dt);
      const Tensor t = base.t().contiguous();
      ASSERT_TRUE(t.is_contiguous());
      const auto bv = base.to_vector<double>(), tv = t.to_vector<double>();
      int64_t wrong = 0;
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = 0; j < c; ++j) wrong += tv[size_t(i * c + j)] != bv[size_t(j * r + i)];
      EXPECT_EQ(wrong, 0);
    }
  }
  // a transposed view of a wider buffer (leading dimension above the rows)
  const Tensor wide = randf({40, 70}).narrow(1, 3, 50);  // [40, 50], row stride 70
  const auto wv = wide.to_vector<double>(), tv = wide.t().contiguous().to_vector<double>();
  for (int64_t i = 0; i < 50; ++i)
    for (int64_t j = 0; j < 40; ++j) ASSERT_EQ(tv[size_t(i * 40 + j)], wv[size_t(j * 50 + i)]);
}
AGT_EACH_KERNEL_ISA(LinalgEachIsa);

// The same for every element width and for the copies that are batches of transposes:
// transpose(1, 2) of a batch, a permute that moves the innermost dim (NCHW to NHWC), and a
// copy into a strided destination, whose padding must stay untouched. Each element is
// checked against its index arithmetic.
TEST(Linalg, TransposedCopiesOfEveryWidthAndBatch) {
  manual_seed(18);
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt64, kInt32, kUInt8, kBool}) {
    SCOPED_TRACE(dtype_name(dt));
    const auto values = [&](const std::vector<int64_t>& shape) {
      return randint(0, dt == kBool ? 2 : 100, shape).to(dt);
    };
    for (auto [r, c] : std::vector<std::array<int64_t, 2>>{{16, 16}, {17, 33}, {40, 200}, {200, 40}, {33, 1000}, {130, 97}}) {
      SCOPED_TRACE(std::to_string(r) + "x" + std::to_string(c));
      // a batch of three [c, r] matrices, each copied transposed
      const Tensor base = values({3, c, r});
      const Tensor t = base.transpose(1, 2).contiguous();
      ASSERT_EQ(t.sizes(), std::vector<int64_t>({3, r, c}));
      const auto bv = base.to_vector<double>(), tv = t.to_vector<double>();
      int64_t wrong = 0;
      for (int64_t b = 0; b < 3; ++b)
        for (int64_t i = 0; i < r; ++i)
          for (int64_t j = 0; j < c; ++j) wrong += tv[size_t((b * r + i) * c + j)] != bv[size_t((b * c + j) * r + i)];
      EXPECT_EQ(wrong, 0);
      // one of them into the middle of a wider, zeroed buffer
      const Tensor wide = zeros({r, c + 5}, dt);
      wide.narrow(1, 2, c).copy_(base.select(0, 1).t());
      const auto wv = wide.to_vector<double>();
      wrong = 0;
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = 0; j < c + 5; ++j) {
          const double want = j < 2 || j >= c + 2 ? 0.0 : bv[size_t((c + j - 2) * r + i)];
          wrong += wv[size_t(i * (c + 5) + j)] != want;
        }
      EXPECT_EQ(wrong, 0);
    }
    // NCHW -> NHWC: per image a [C, H * W] transpose
    const int64_t N = 2, C = 20, H = 9, W = 7;
    const Tensor x = values({N, C, H, W});
    const auto xv = x.to_vector<double>(), yv = x.permute({0, 2, 3, 1}).contiguous().to_vector<double>();
    int64_t wrong = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < W; ++w)
          for (int64_t ch = 0; ch < C; ++ch)
            wrong += yv[size_t(((n * H + h) * W + w) * C + ch)] != xv[size_t(((n * C + ch) * H + h) * W + w)];
    EXPECT_EQ(wrong, 0);
  }
}

TEST(Linalg, MatmulFloat64AndEmptyShapes) {
  manual_seed(14);
  Tensor a = randf({9, 11}, kFloat64), b = randf({11, 4}, kFloat64);
  EXPECT_TRUE(agt::allclose(matmul(a, b), ref_matmul(a, b), 1e-12, 1e-12));
  // K = 0: an empty sum is zero
  Tensor z = matmul(zeros({3, 0}), zeros({0, 4}));
  EXPECT_EQ(z.sizes(), std::vector<int64_t>({3, 4}));
  EXPECT_TRUE(agt::allclose(z, zeros({3, 4}), 0, 0));
  EXPECT_EQ(matmul(zeros({0, 5}), ones({5, 2})).sizes(), std::vector<int64_t>({0, 2}));
  EXPECT_EQ(matmul(zeros({2, 0, 5}), ones({5, 2})).sizes(), std::vector<int64_t>({2, 0, 2}));
  Tensor zb = matmul(zeros({2, 3, 0}), zeros({2, 0, 4}));
  EXPECT_TRUE(agt::allclose(zb, zeros({2, 3, 4}), 0, 0));
}

TEST(Linalg, MatmulGradcheck) {
  manual_seed(15);
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes = {
      {{4}, {4}},       {{3, 4}, {4, 2}},    {{4}, {4, 3}},          {{3, 4}, {4}},
      {{2, 3, 4}, {4, 2}}, {{3, 4}, {2, 4, 2}}, {{2, 3, 4}, {2, 4, 2}}, {{2, 1, 3, 4}, {3, 4, 2}},
      {{4}, {2, 4, 3}}, {{2, 3, 4}, {4}}};
  for (const auto& [sa, sb] : shapes) {
    Tensor a = agt::rand64(sa), b = agt::rand64(sb);
    EXPECT_TRUE(agt::gradcheck([](const TL& in) { return matmul(in[0], in[1]); }, {a, b})) << Shape(sa) << " @ " << Shape(sb);
  }
  // transposed operands
  Tensor a = agt::rand64({4, 3}), b = agt::rand64({2, 4});
  EXPECT_TRUE(agt::gradcheck([](const TL& in) { return matmul(in[0].t(), in[1].t()); }, {a, b}));
  // only one operand requires grad
  Tensor c = agt::rand64({3, 4}), d = agt::rand64({4, 5}, -1, 1, false);
  EXPECT_TRUE(agt::gradcheck([](const TL& in) { return matmul(in[0], in[1]); }, {c, d}));
}

TEST(Linalg, LinearMatchesReference) {
  manual_seed(16);
  Tensor w = randf({6, 5}), b = randf({6});
  for (const auto& xs : std::vector<std::vector<int64_t>>{{5}, {4, 5}, {2, 3, 5}, {1, 5}}) {
    Tensor x = randf(xs);
    Tensor y = linear(x, w, b);
    std::vector<int64_t> expect = xs;
    expect.back() = 6;
    EXPECT_EQ(y.sizes(), expect);
    EXPECT_TRUE(agt::allclose(y, ref_linear(x, w, b), fp32_tol(5))) << Shape(xs);
    EXPECT_TRUE(agt::allclose(linear(x, w), ref_linear(x, w, Tensor()), fp32_tol(5))) << Shape(xs);
  }
  // transposed input and weight views
  Tensor xt = randf({5, 4}).t(), wt = randf({5, 6}).t();
  EXPECT_TRUE(agt::allclose(linear(xt, wt, b), ref_linear(xt, wt, b), fp32_tol(5)));
  // K = 0: the bias alone; no rows: an empty result, zero weight gradients
  EXPECT_TRUE(agt::allclose(linear(zeros({3, 0}), zeros({6, 0}), b), b.expand({3, 6}), 0, 0));
  Tensor wg = randf({6, 5}).requires_grad_(), bg = randf({6}).requires_grad_();
  Tensor e = linear(zeros({0, 5}), wg, bg);
  EXPECT_EQ(e.sizes(), std::vector<int64_t>({0, 6}));
  e.sum().backward();
  EXPECT_TRUE(agt::allclose(wg.grad(), zeros({6, 5}), 0, 0));
  EXPECT_TRUE(agt::allclose(bg.grad(), zeros({6}), 0, 0));
}

TEST(Linalg, LinearGradcheck) {
  manual_seed(17);
  Tensor w = agt::rand64({4, 3}), b = agt::rand64({4});
  for (const auto& xs : std::vector<std::vector<int64_t>>{{3}, {5, 3}, {2, 2, 3}}) {
    Tensor x = agt::rand64(xs);
    EXPECT_TRUE(agt::gradcheck([](const TL& in) { return linear(in[0], in[1], in[2]); }, {x, w, b})) << Shape(xs);
    EXPECT_TRUE(agt::gradcheck([](const TL& in) { return linear(in[0], in[1]); }, {x, w})) << Shape(xs);
  }
  // the weight alone requiring grad, and transposed views
  Tensor x = agt::rand64({5, 3}, -1, 1, false);
  EXPECT_TRUE(agt::gradcheck([](const TL& in) { return linear(in[0], in[1], in[2]); }, {x, w, b}));
  Tensor x2 = agt::rand64({3, 5}), w2 = agt::rand64({3, 4});
  EXPECT_TRUE(agt::gradcheck([](const TL& in) { return linear(in[0].t(), in[1].t()); }, {x2, w2}));
}

// bfloat16 and float16 products accumulate in float32 and round once, so against the
// float32 product of the same (already rounded) inputs they differ by about one rounding
// of the result: within tol_for(dtype) without scaling by K.
TEST(Linalg, HalfPrecisionMatchesFloat32) {
  manual_seed(18);
  for (DType dt : {kBFloat16, kFloat16}) {
    for (const auto& [sa, sb] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
             {{64, 48}, {48, 32}}, {{3, 17, 40}, {3, 40, 9}}, {{5, 33}, {2, 33, 7}}, {{2, 4, 16}, {16, 8}}, {{16}, {16, 5}}}) {
      Tensor a = randf(sa).to(dt), b = randf(sb).to(dt);
      Tensor got = matmul(a, b);
      EXPECT_EQ(got.dtype(), dt);
      EXPECT_TRUE(agt::allclose(got, matmul(a.to(kFloat32), b.to(kFloat32)), agt::tol_for(dt)))
          << dtype_name(dt) << " " << Shape(sa) << " @ " << Shape(sb);
    }
    // transposed operands
    Tensor a = randf({40, 24}).to(dt), b = randf({16, 40}).to(dt);
    EXPECT_TRUE(agt::allclose(matmul(a.t(), b.t()), matmul(a.to(kFloat32).t(), b.to(kFloat32).t()),
                              agt::tol_for(dt)));
    // linear with a bias, and its gradients
    Tensor x = randf({12, 24}).to(dt), w = randf({10, 24}).to(dt), bias = randf({10}).to(dt);
    x.requires_grad_();
    w.requires_grad_();
    bias.requires_grad_();
    Tensor y = linear(x, w, bias);
    EXPECT_EQ(y.dtype(), dt);
    Tensor xf = x.detach().to(kFloat32).requires_grad_(), wf = w.detach().to(kFloat32).requires_grad_(),
           bf = bias.detach().to(kFloat32).requires_grad_();
    Tensor yf = linear(xf, wf, bf);
    EXPECT_TRUE(agt::allclose(y, yf, agt::tol_for(dt))) << dtype_name(dt);
    Tensor g = randf({12, 10}).to(dt);
    y.backward(g);
    yf.backward(g.to(kFloat32));
    EXPECT_EQ(x.grad().dtype(), dt);
    EXPECT_TRUE(agt::allclose(x.grad(), xf.grad(), agt::tol_for(dt)));
    EXPECT_TRUE(agt::allclose(w.grad(), wf.grad(), agt::tol_for(dt)));
    EXPECT_TRUE(agt::allclose(bias.grad(), bf.grad(), agt::tol_for(dt)));
  }
}

TEST(Linalg, GradientsOfBroadcastBatchesAreSummed) {
  manual_seed(19);
  Tensor a = randf({4, 5}).requires_grad_(), b = randf({3, 5, 2}).requires_grad_();
  matmul(a, b).backward(ones({3, 4, 2}));
  // d/da sum(a @ b[i]) = sum_i ones @ b[i]^T
  Tensor expect = zeros({4, 5});
  for (int64_t i = 0; i < 3; ++i) expect = expect + matmul(ones({4, 2}), b.detach().select(0, i).t());
  EXPECT_EQ(a.grad().sizes(), std::vector<int64_t>({4, 5}));
  EXPECT_TRUE(agt::allclose(a.grad(), expect, 1e-5, 1e-5));
}

TEST(Linalg, ErrorsNameTheOpAndShapes) {
  EXPECT_AG_ERROR(matmul(zeros({2, 3}), zeros({4, 5})), "[matmul] cannot multiply shapes [2, 3] and [4, 5]: 3 != 4");
  EXPECT_AG_ERROR(matmul(zeros({3}), zeros({4})), "[matmul] cannot multiply shapes [3] and [4]: 3 != 4");
  EXPECT_AG_ERROR(matmul(zeros({2, 2, 3}), zeros({4})), "cannot multiply shapes [2, 2, 3] and [4]: 3 != 4");
  EXPECT_AG_ERROR(matmul(zeros({2, 2, 3}), zeros({3, 3, 1})), "[matmul] shapes [2] and [3] cannot be broadcast");
  EXPECT_AG_ERROR(matmul(zeros({2, 3}), zeros({3, 2}, kBFloat16)),
                  "[matmul] expected both operands to have one dtype, got float32 and bfloat16");
  EXPECT_AG_ERROR(matmul(zeros({2, 3}, kInt64), zeros({3, 2}, kInt64)), "[matmul] expected floating operands, got int64");
  EXPECT_AG_ERROR(matmul(scalar_tensor(1.0), zeros({3})), "[matmul] both operands need at least 1 dim");
  EXPECT_AG_ERROR(matmul(Tensor(), zeros({3})), "[matmul] the first operand is an undefined tensor");
  EXPECT_AG_ERROR(linear(zeros({2, 3}), zeros({4, 5})), "[linear] cannot multiply shapes [2, 3] and [4, 5]^T: 3 != 5");
  EXPECT_AG_ERROR(linear(zeros({2, 3}), zeros({3})), "[linear] weight must be 2-D");
  EXPECT_AG_ERROR(linear(zeros({2, 3}), zeros({4, 3}), zeros({3})), "[linear] bias must have shape [4]");
  EXPECT_AG_ERROR(linear(zeros({2, 3}), zeros({4, 3}, kBFloat16)),
                  "[linear] expected input and weight to have one dtype, got float32 and bfloat16");
  EXPECT_AG_ERROR(linear(zeros({2, 3}), zeros({4, 3}), zeros({4}, kFloat64)),
                  "[linear] expected input, weight and bias to have one dtype, got float32, float32 and float64");
}

// A training step repeats the same shapes: after the first, no oneDNN primitive is made.
TEST(Linalg, RepeatedShapesCreateNoPrimitives) {
  if (!built_with_onednn()) AGT_SKIP_BUILD() << "built without oneDNN: no primitive cache";
  manual_seed(20);
  auto step = [] {
    // shapes no other test uses, so the first step must create primitives
    Tensor x = randf({31, 23}), w = randf({17, 23}).requires_grad_(), b = randf({17}).requires_grad_();
    Tensor v = randf({17, 9}).requires_grad_();
    Tensor h = matmul(linear(x, w, b), v);
    Tensor bh = matmul(randf({3, 5, 23}), randf({3, 23, 7}));
    (h.sum() + bh.sum()).backward();
  };
  const size_t before = detail::cpu_primitive_cache_size();
  step();
  const size_t after_first = detail::cpu_primitive_cache_size();
  EXPECT_GT(after_first, before);
  for (int i = 0; i < 3; ++i) step();
  EXPECT_EQ(detail::cpu_primitive_cache_size(), after_first);
  // a new shape makes one more
  matmul(randf({37, 3}), randf({3, 41}));
  EXPECT_EQ(detail::cpu_primitive_cache_size(), after_first + 1);
}

// Cached primitives are shared by threads: concurrent calls of one shape (one busy entry,
// the others taking temporary memory objects) give the serial result.
TEST(Linalg, ConcurrentCallsAgree) {
  manual_seed(21);
  Tensor a = randf({48, 40}), b = randf({40, 24}), bias = randf({24});
  const Tensor want = matmul(a, b), want_lin = linear(a, b.t(), bias);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      bool good = true;
      for (int i = 0; i < 50; ++i) {
        good = good && agt::allclose(matmul(a, b), want, 1e-6, 1e-6);
        good = good && agt::allclose(linear(a, b.t(), bias), want_lin, 1e-6, 1e-6);
      }
      ok[size_t(t)] = good;
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_TRUE(ok[size_t(t)]) << "thread " << t;
}
