#include "support/testing.h"

#include <fstream>
#include <map>
#include <sstream>

using namespace ag;

namespace {

// The docs table: op -> (cpu policy, cuda policy).
std::map<std::string, std::pair<std::string, std::string>> doc_table() {
  std::ifstream in(agt::source_dir() + "/docs/autocast.md");
  EXPECT_TRUE(in.good()) << "docs/autocast.md not found";
  std::map<std::string, std::pair<std::string, std::string>> rows;
  std::string line;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (line.rfind("| op | cpu | cuda |", 0) == 0) {
      in_table = true;
      continue;
    }
    if (!in_table) continue;
    if (line.empty() || line[0] != '|') break;
    if (line.rfind("|---", 0) == 0) continue;
    std::vector<std::string> cells;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, '|')) {
      const auto b = cell.find_first_not_of(' '), e = cell.find_last_not_of(' ');
      if (b != std::string::npos) cells.push_back(cell.substr(b, e - b + 1));
    }
    if (cells.size() == 3) rows[cells[0]] = {cells[1], cells[2]};
  }
  return rows;
}

}  // namespace

TEST(AutocastPolicy, DocsTableMatchesCode) {
  const auto rows = doc_table();
  ASSERT_FALSE(rows.empty());
  for (const auto& [op, pol] : rows) {
    EXPECT_TRUE(op_id(op)) << "docs/autocast.md has a row for " << op << ", which no op is called (ampgrad/op_ids.h)";
    EXPECT_EQ(pol.first, cast_policy_name(autocast::policy(op, kCPU))) << op << " on cpu";
    EXPECT_EQ(pol.second, cast_policy_name(autocast::policy(op, kCUDA))) << op << " on cuda";
  }
  for (DeviceType t : {kCPU, kCUDA})
    for (const auto& [op, p] : autocast::policy_table(t))
      EXPECT_TRUE(rows.count(std::string(op))) << op << " is in the code's table but not in docs/autocast.md";
}

// Output dtype of each row under each autocast dtype, for every kind of input.
TEST(AutocastPolicy, RowByRowDecisions) {
  const std::vector<DType> ins = {kFloat32, kFloat16, kBFloat16, kFloat64, kInt64};
  for (DeviceType t : {kCPU, kCUDA}) {
    for (DType ad : {kFloat16, kBFloat16}) {
      for (const auto& [op, p] : autocast::policy_table(t)) {
        for (DType in : ins) {
          const auto got = autocast::cast_dtypes(op, t, ad, {in, kInt64})[0];
          DType want = in;
          if (is_floating(in) && in != kFloat64) {
            if (p == CastPolicy::LowerPrecision) want = ad;
            if (p == CastPolicy::Float32) want = kFloat32;
          }
          EXPECT_EQ(got, want) << op << " on " << device_type_name(t) << " under " << dtype_name(ad) << " with "
                               << dtype_name(in);
        }
      }
      // promote: low precision only when every floating input is
      EXPECT_EQ(autocast::cast_dtypes(op::cat, t, ad, {ad, ad}), (std::vector<DType>{ad, ad}));
      EXPECT_EQ(autocast::cast_dtypes(op::cat, t, ad, {ad, kFloat32}), (std::vector<DType>{kFloat32, kFloat32}));
      EXPECT_EQ(autocast::cast_dtypes(op::cat, t, ad, {ad, kFloat64}), (std::vector<DType>{ad, kFloat64}));
      EXPECT_EQ(autocast::cast_dtypes(op::relu, t, ad, {kFloat32}), (std::vector<DType>{kFloat32}));
    }
  }
  EXPECT_EQ(autocast::policy(op::softmax, kCPU), CastPolicy::PassThrough);
  EXPECT_EQ(autocast::policy(op::softmax, kCUDA), CastPolicy::Float32);
  // By name, as users and the docs ask: the same rows.
  EXPECT_EQ(autocast::policy("softmax", kCPU), CastPolicy::PassThrough);
  EXPECT_EQ(autocast::policy("softmax", kCUDA), CastPolicy::Float32);
  EXPECT_EQ(autocast::policy("no_such_op", kCUDA), CastPolicy::PassThrough);
}

TEST(Autocast, OpsUnderCpuBFloat16) {
  manual_seed(0);
  Tensor x = randn({4, 8}), w = randn({3, 8}), b = randn({3});
  AutocastGuard g(kCPU, kBFloat16);
  EXPECT_EQ(linear(x, w, b).dtype(), kBFloat16);
  EXPECT_EQ(matmul(x, w.t()).dtype(), kBFloat16);
  EXPECT_EQ(conv2d(randn({1, 2, 5, 5}), randn({3, 2, 3, 3})).dtype(), kBFloat16);
  Tensor logits = linear(x, w, b);
  EXPECT_EQ(cross_entropy(logits, from_vector<int64_t>({0, 1, 2, 0}, {4})).dtype(), kFloat32);
  EXPECT_EQ(mse_loss(logits, zeros({4, 3}, kBFloat16)).dtype(), kFloat32);
  EXPECT_EQ(softmax(logits, 1).dtype(), kBFloat16);  // pass-through on cpu
  EXPECT_EQ(cat({logits, logits}).dtype(), kBFloat16);
  EXPECT_EQ(cat({logits, x.narrow(1, 0, 3)}).dtype(), kFloat32);
  EXPECT_EQ(linear(x.to(kFloat64), w.to(kFloat64)).dtype(), kFloat64);  // float64 is never cast
  EXPECT_EQ((x + x).dtype(), kFloat32);  // pass-through
  // values: autocast linear equals a bf16 linear computed by hand
  Tensor by_hand;
  {
    AutocastGuard off(kCPU, false);
    by_hand = linear(x.to(kBFloat16), w.to(kBFloat16), b.to(kBFloat16));
  }
  EXPECT_TRUE(agt::allclose(linear(x, w, b), by_hand, 0, 0));
}

// scaled_dot_product_attention's row: q, k, v and a float mask run in the lower precision
// (PyTorch's lower_precision_fp list), a bool mask passes untouched, float64 is never cast,
// and float32 leaves get float32 gradients through the casts.
TEST(Autocast, AttentionRunsInLowerPrecision) {
  manual_seed(3);
  const Tensor q = randn({2, 3, 9, 8}).requires_grad_(), k = randn({2, 3, 11, 8}), v = randn({2, 3, 11, 4});
  const Tensor fmask = randn({9, 11}), bmask = ge(rand({9, 11}), 0.3);
  for (DType ad : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(dtype_name(ad));
    for (const Tensor& mask : {fmask, bmask}) {
      AttentionOptions o;
      o.attn_mask = mask;
      Tensor y, by_hand;
      {
        AutocastGuard g(kCPU, ad);
        y = scaled_dot_product_attention(q, k, v, o);
        AutocastGuard off(kCPU, false);
        AttentionOptions h;
        h.attn_mask = mask.dtype() == kBool ? mask : mask.to(ad);
        by_hand = scaled_dot_product_attention(q.to(ad), k.to(ad), v.to(ad), h);
      }
      EXPECT_EQ(y.dtype(), ad);
      EXPECT_TRUE(agt::allclose(y, by_hand, 0, 0));
      q.set_grad(Tensor());
      sum(y.to(kFloat32)).backward();
      ASSERT_TRUE(q.grad().defined());
      EXPECT_EQ(q.grad().dtype(), kFloat32);
    }
  }
  AutocastGuard g(kCPU, kBFloat16);
  EXPECT_EQ(scaled_dot_product_attention(q.to(kFloat64), k.to(kFloat64), v.to(kFloat64)).dtype(), kFloat64);
}

TEST(Autocast, GuardNestingExceptionsAndDisable) {
  EXPECT_FALSE(autocast::is_enabled(kCPU));
  EXPECT_EQ(autocast::get_dtype(kCPU), kBFloat16);
  EXPECT_EQ(autocast::get_dtype(kCUDA), kFloat16);
  {
    AutocastGuard a(kCPU, kFloat16, true, false);
    EXPECT_TRUE(autocast::is_enabled(kCPU));
    EXPECT_EQ(autocast::get_dtype(kCPU), kFloat16);
    EXPECT_FALSE(autocast::is_cache_enabled(kCPU));
    EXPECT_EQ(autocast::depth(kCPU), 1);
    try {
      AutocastGuard b(kCPU, kBFloat16);
      EXPECT_EQ(autocast::depth(kCPU), 2);
      {
        AutocastGuard off(kCPU, false);
        EXPECT_FALSE(autocast::is_enabled(kCPU));
        EXPECT_EQ(linear(ones({2, 2}), ones({2, 2})).dtype(), kFloat32);
      }
      EXPECT_TRUE(autocast::is_enabled(kCPU));
      throw std::runtime_error("leave");
    } catch (const std::runtime_error&) {
    }
    EXPECT_EQ(autocast::get_dtype(kCPU), kFloat16);
    EXPECT_FALSE(autocast::is_cache_enabled(kCPU));
    EXPECT_EQ(autocast::depth(kCPU), 1);
  }
  EXPECT_FALSE(autocast::is_enabled(kCPU));
  EXPECT_TRUE(autocast::is_cache_enabled(kCPU));
  EXPECT_EQ(autocast::get_dtype(kCPU), kBFloat16);
  EXPECT_EQ(autocast::depth(kCPU), 0);
  EXPECT_FALSE(autocast::any_enabled());
  EXPECT_AG_ERROR(AutocastGuard(kCPU, kInt32), "[AutocastGuard] autocast casts to float16, bfloat16 or float32, got int32");
}

TEST(Autocast, UnsupportedDeviceFailsAtTheGuard) {
  if (!hw::query().cuda.empty()) AGT_SKIP_HARDWARE() << "this machine has a CUDA device, so cuda is not unsupported here";
  EXPECT_AG_ERROR(AutocastGuard(kCUDA, kFloat16), "[AutocastGuard] float16 is unsupported on cuda");
  // an emulated dtype runs: float16 on this CPU (no AVX512-FP16) or native where it exists
  AutocastGuard ok(kCPU, kFloat16);
  EXPECT_EQ(linear(ones({2, 2}), ones({2, 2})).dtype(), kFloat16);
}

TEST(Autocast, GradientsOfFloat32ParametersComeBackFloat32) {
  manual_seed(1);
  Tensor w = randn({3, 5}).requires_grad_(), b = randn({3}).requires_grad_();
  Tensor x = randn({4, 5});
  Tensor y = from_vector<int64_t>({0, 2, 1, 2}, {4});
  Tensor loss;
  {
    AutocastGuard g(kCPU, kBFloat16);
    loss = cross_entropy(linear(x, w, b), y);
  }
  loss.backward();
  EXPECT_EQ(w.grad().dtype(), kFloat32);
  EXPECT_EQ(b.grad().dtype(), kFloat32);
  Tensor w2 = w.detach().requires_grad_(), b2 = b.detach().requires_grad_();
  cross_entropy(linear(x, w2, b2), y).backward();
  EXPECT_TRUE(agt::allclose(w.grad(), w2.grad(), 0.05, 0.02));  // bf16 forward vs fp32 forward
  // the cast is part of the graph
  EXPECT_NE(loss.grad_fn(), nullptr);
}

TEST(AutocastCache, SameParameterSameCastWithinTheRegion) {
  Tensor w = randn({4, 4}).requires_grad_();
  Tensor plain = randn({4, 4});
  Tensor x = randn({2, 4});
  {
    AutocastGuard g(kCPU, kBFloat16);
    EXPECT_EQ(autocast::cache_size(), 0u);
    Tensor y1 = linear(x, w), y2 = linear(x * 2.0f, w);
    EXPECT_EQ(autocast::cache_size(), 1u);  // w cast once; x (no grad) never cached
    auto c1 = autocast::cast_inputs(op::linear, {x, w});
    auto c2 = autocast::cast_inputs(op::linear, {x, w});
    EXPECT_EQ(c1[1].unsafe_impl(), c2[1].unsafe_impl());  // same half tensor
    EXPECT_NE(c1[0].unsafe_impl(), c2[0].unsafe_impl());  // not cached
    linear(x, plain);
    linear(x, w * 1.0f);  // a non-leaf
    linear(x, w.narrow(0, 0, 2));  // a view
    EXPECT_EQ(autocast::cache_size(), 1u);
    {
      AutocastGuard off(kCPU, false);  // an inner disabled region keeps the cache
    }
    EXPECT_EQ(autocast::cache_size(), 1u);
    {
      NoGradGuard ng;
      w.mul_(1.5f);  // in place: a new version, so a new cast
    }
    auto c3 = autocast::cast_inputs(op::linear, {x, w});
    EXPECT_NE(c3[1].unsafe_impl(), c1[1].unsafe_impl());
    EXPECT_TRUE(agt::allclose(c3[1], w.detach() , 1.0 / 128, 0));
  }
  EXPECT_EQ(autocast::cache_size(), 0u);  // emptied when the outermost region exits
}

// PyTorch issues 65766 and 112583: a first pass under no_grad must not poison a later
// pass with grad.
TEST(AutocastCache, NoGradFirstPassDoesNotPoisonALaterGradPass) {
  Tensor w = randn({3, 4}).requires_grad_();
  Tensor x = randn({2, 4});
  AutocastGuard g(kCPU, kBFloat16);
  {
    NoGradGuard ng;
    Tensor y = linear(x, w);
    EXPECT_FALSE(y.requires_grad());
  }
  Tensor y = linear(x, w);
  EXPECT_TRUE(y.requires_grad());
  y.sum().backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), kFloat32);
  EXPECT_GT(norm(w.grad()).item<double>(), 0.0);
}

// A float32 weight cast to bfloat16 by autocast gets its gradient straight from a float32
// product of the 16-bit operands: no rounding to bfloat16 and widening again.
TEST(AutocastWideGrad, WeightGradientOfACastIsComputedInFloat32) {
  for (DType dt : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    manual_seed(3);
    Tensor w = randn({64, 96}).requires_grad_(), b = randn({64}).requires_grad_();
    Tensor x = randn({32, 96});
    Tensor y16;
    {
      AutocastGuard g(kCPU, dt);
      y16 = linear(x, w, b);
      EXPECT_EQ(gradient_dtype(autocast::cast_inputs(op::linear, {x, w})[1]), kFloat32);
    }
    ASSERT_EQ(y16.dtype(), dt);
    Tensor gy = randn({32, 64}).to(dt);
    y16.backward(gy);
    ASSERT_EQ(w.grad().dtype(), kFloat32);
    // Reference: the same 16-bit operands multiplied in double.
    Tensor ref = matmul(transpose(gy.to(kFloat64), 0, 1), x.to(dt).to(kFloat64));
    EXPECT_TRUE(agt::allclose(w.grad(), ref.to(kFloat32), 1e-5, 1e-5));
    // Rounded to 16 bits it would lose most of these bits.
    Tensor rounded = w.grad().to(dt).to(kFloat32);
    EXPECT_GT(max(abs(w.grad() - rounded)).item<double>(), 1e-3);
  }
}

TEST(AutocastWideGrad, GradientDtypeOnlyWidensCastsOfFloat32) {
  Tensor w = randn({4, 4}).requires_grad_();
  EXPECT_EQ(gradient_dtype(w), kFloat32);
  EXPECT_EQ(gradient_dtype(w.to(kBFloat16)), kFloat32);
  EXPECT_EQ(gradient_dtype(w.to(kFloat16)), kFloat32);
  EXPECT_EQ(gradient_dtype(w.to(kBFloat16) * 2.0f), kBFloat16);  // not a cast
  EXPECT_EQ(gradient_dtype(w.to(kFloat64).to(kBFloat16)), kBFloat16);  // cast of float64
  Tensor leaf16 = randn({4, 4}).to(kBFloat16).requires_grad_();
  EXPECT_EQ(gradient_dtype(leaf16), kBFloat16);
  NoGradGuard ng;
  EXPECT_EQ(gradient_dtype(w.to(kBFloat16)), kBFloat16);  // no graph, nothing to widen
}

TEST(AutocastWideGrad, MatmulOfACastWidensAndHooksStillSeeTheCastDtype) {
  manual_seed(4);
  Tensor w = randn({8, 5}).requires_grad_();
  Tensor a = randn({3, 6, 8}).to(kBFloat16);  // batched left operand, 2-D right one
  Tensor ref = matmul(transpose(a.to(kFloat64).reshape({18, 8}), 0, 1),
                      ones({18, 5}, TensorOptions().dtype(kFloat64))).to(kFloat32);
  matmul(a, w.to(kBFloat16)).sum().backward();
  ASSERT_EQ(w.grad().dtype(), kFloat32);
  EXPECT_TRUE(agt::allclose(w.grad(), ref, 1e-5, 1e-5));

  // A hook on the cast sees (and passes on) the gradient in the cast's dtype.
  w.set_grad(Tensor());
  Tensor w16 = w.to(kBFloat16);
  DType seen = kFloat64;
  w16.register_hook([&](const Tensor& g) {
    seen = g.dtype();
    return Tensor();
  });
  matmul(a, w16).sum().backward();
  EXPECT_EQ(seen, kBFloat16);
  EXPECT_TRUE(agt::allclose(w.grad(), ref.to(kBFloat16).to(kFloat32), 0, 0));
}

// A weight used by two ops in one region is cast once (the cache); both consumers hand
// back float32 gradients, which the engine sums before the cast's backward.
TEST(AutocastWideGrad, CachedCastUsedTwiceSumsBothGradients) {
  manual_seed(5);
  Tensor w = randn({6, 4}).requires_grad_();
  Tensor x1 = randn({3, 4}), x2 = randn({5, 4});
  {
    AutocastGuard g(kCPU, kBFloat16);
    Tensor y = sum(linear(x1, w)) + sum(linear(x2, w));
    EXPECT_EQ(autocast::cache_size(), 1u);
    y.backward();
  }
  ASSERT_EQ(w.grad().dtype(), kFloat32);
  // d/dw sum(x w^T) = column sums of x, for every row of w.
  Tensor colsum = (sum(x1.to(kBFloat16).to(kFloat64), {0}) + sum(x2.to(kBFloat16).to(kFloat64), {0})).to(kFloat32);
  EXPECT_TRUE(agt::allclose(w.grad(), colsum.unsqueeze(0).expand({6, 4}), 1e-5, 1e-5));
}
