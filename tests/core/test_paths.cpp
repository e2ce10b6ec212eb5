// Paths no other test takes: Shape beyond its 6 inline dims (the heap path) and rank-7/8
// tensors through views, broadcasting, reductions and backward; GradScaler::update(new_scale);
// the generator state API and its counter rule; set_last_step of both schedulers; a custom op
// written against the public autograd API; the *_like factories; the nn::init functions.
// Values are checked against plain-loop references, documented formulas, or the call the
// header documents as equivalent (randn_like and randn) — not against the op under test.
#include "support/testing.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

using namespace ag;
using TL = std::vector<Tensor>;
using Dims = std::vector<int64_t>;

namespace {

// ---- plain-loop reference helpers ----------------------------------------------------------

int64_t count(const Dims& s) { return std::accumulate(s.begin(), s.end(), int64_t(1), std::multiplies<>()); }

Dims row_major_strides(const Dims& s) {
  Dims st(s.size(), 1);
  for (size_t i = s.size(); i-- > 1;) st[i - 1] = st[i] * s[i];
  return st;
}

// Calls f(index) for every multi-index of shape s, in row-major order.
void for_each_index(const Dims& s, const std::function<void(const Dims&)>& f) {
  if (count(s) == 0) return;
  Dims idx(s.size(), 0);
  while (true) {
    f(idx);
    size_t d = s.size();
    while (d > 0) {
      if (++idx[d - 1] < s[d - 1]) break;
      idx[--d] = 0;
    }
    if (d == 0) return;
  }
}

int64_t flat(const Dims& idx, const Dims& strides) {
  int64_t o = 0;
  for (size_t i = 0; i < idx.size(); ++i) o += idx[i] * strides[i];
  return o;
}

// x (row-major values of shape s) permuted by p: out[j] = x[i] with i[p[k]] = j[k].
std::vector<double> ref_permute(const std::vector<double>& x, const Dims& s, const Dims& p) {
  Dims os(p.size());
  for (size_t k = 0; k < p.size(); ++k) os[k] = s[size_t(p[k])];
  const Dims st = row_major_strides(s);
  std::vector<double> out;
  for_each_index(os, [&](const Dims& j) {
    Dims i(s.size());
    for (size_t k = 0; k < p.size(); ++k) i[size_t(p[k])] = j[k];
    out.push_back(x[size_t(flat(i, st))]);
  });
  return out;
}

enum class Red { Sum, Mean, Max };

// Reduction of x (shape s) over dims (non-negative), with the output's shape.
std::pair<std::vector<double>, Dims> ref_reduce(const std::vector<double>& x, const Dims& s, const Dims& dims,
                                                bool keepdim, Red kind) {
  Dims kept = s;  // the keepdim shape
  for (int64_t d : dims) kept[size_t(d)] = 1;
  const Dims kst = row_major_strides(kept), st = row_major_strides(s);
  const double init = kind == Red::Max ? -std::numeric_limits<double>::infinity() : 0.0;
  std::vector<double> out(size_t(count(kept)), init);
  for_each_index(s, [&](const Dims& i) {
    Dims o = i;
    for (int64_t d : dims) o[size_t(d)] = 0;
    double& acc = out[size_t(flat(o, kst))];
    const double v = x[size_t(flat(i, st))];
    acc = kind == Red::Max ? std::max(acc, v) : acc + v;
  });
  if (kind == Red::Mean)
    for (double& v : out) v /= double(count(s) / count(kept));
  Dims shape;
  for (size_t d = 0; d < s.size(); ++d)
    if (keepdim || std::find(dims.begin(), dims.end(), int64_t(d)) == dims.end()) shape.push_back(kept[d]);
  return {out, shape};
}

// Distinct values 0.5, 1.5, ... so that every element is identifiable in a comparison.
Tensor iota64(const Dims& s) {
  std::vector<double> v(size_t(count(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = double(i) + 0.5;
  return from_vector(v, s);
}

}  // namespace

// =============================================================================================
// Shape beyond kInline
// =============================================================================================

TEST(PathsShape, PushBackPastInlineKeepsEveryValue) {
  static_assert(Shape::kInline == 6, "the tests below cross the inline capacity at 6");
  Shape s;
  std::vector<int64_t> ref;
  // 30 values: grows once at the 7th and again at each later doubling.
  for (int64_t v = 1; v <= 30; ++v) {
    s.push_back(v * 11);
    ref.push_back(v * 11);
    ASSERT_EQ(s, ref) << "after " << v << " pushes";
  }
  EXPECT_EQ(s.size(), 30u);
  EXPECT_EQ(s.front(), 11);
  EXPECT_EQ(s.back(), 330);
  EXPECT_EQ(s.vec(), ref);
  EXPECT_EQ(std::vector<int64_t>(s), ref);
  EXPECT_TRUE(ref == s);  // the reversed comparison

  // numel over a heap shape multiplies all entries
  const Shape r8{2, 3, 1, 2, 2, 1, 2, 3};
  EXPECT_EQ(r8.numel(), 144);
  EXPECT_EQ(r8.size(), 8u);
  EXPECT_FALSE(r8 == (std::vector<int64_t>{2, 3, 1, 2, 2, 1, 2}));  // a prefix is not equal
  EXPECT_FALSE(r8 == (std::vector<int64_t>{2, 3, 1, 2, 2, 1, 2, 4}));
  EXPECT_FALSE(r8 == Shape({2, 3, 1, 2, 2, 1, 2, 3, 1}));

  // resize across the boundary fills the new entries
  Shape z{1, 2, 3};
  z.resize(9, 7);
  EXPECT_EQ(z, (std::vector<int64_t>{1, 2, 3, 7, 7, 7, 7, 7, 7}));
  z.resize(2);
  EXPECT_EQ(z, (std::vector<int64_t>{1, 2}));
}

TEST(PathsShape, InsertAndEraseOnHeapShapes) {
  // insert into a full inline shape: the push_back inside grows it
  Shape s{1, 2, 3, 4, 5, 6};
  s.insert(0, 100);
  EXPECT_EQ(s, (std::vector<int64_t>{100, 1, 2, 3, 4, 5, 6}));
  s.insert(4, 200);
  EXPECT_EQ(s, (std::vector<int64_t>{100, 1, 2, 3, 200, 4, 5, 6}));
  s.insert(s.size(), 300);  // at the end
  EXPECT_EQ(s, (std::vector<int64_t>{100, 1, 2, 3, 200, 4, 5, 6, 300}));
  s.erase(0);
  EXPECT_EQ(s, (std::vector<int64_t>{1, 2, 3, 200, 4, 5, 6, 300}));
  s.erase(3);
  EXPECT_EQ(s, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 300}));
  s.erase(s.size() - 1);
  EXPECT_EQ(s, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));  // back to 6 entries, still on the heap
  s.push_back(7);
  EXPECT_EQ(s, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
  s.clear();
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(s, std::vector<int64_t>{});
}

TEST(PathsShape, CopyAndMoveOfHeapShapes) {
  const std::vector<int64_t> ref{9, 8, 7, 6, 5, 4, 3, 2};
  Shape a(ref);
  Shape b(a);  // copy: independent storage
  EXPECT_EQ(b, ref);
  b[0] = -1;
  EXPECT_EQ(a, ref);
  EXPECT_NE(a.data(), b.data());

  Shape c{1, 2};
  c = a;  // copy-assign a heap shape into an inline one
  EXPECT_EQ(c, ref);
  c = Shape{5};  // and a short one back into it
  EXPECT_EQ(c, (std::vector<int64_t>{5}));
  Shape c7{1, 2};
  c7 = Shape{1, 2, 3, 4, 5, 6, 7};  // one past the inline capacity
  EXPECT_EQ(c7, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
  Shape& self = a;
  a = self;  // self-assignment keeps the values
  EXPECT_EQ(a, ref);

  const int64_t* heap = a.data();
  Shape m(std::move(a));  // move: takes the buffer, leaves the source empty
  EXPECT_EQ(m, ref);
  EXPECT_EQ(m.data(), heap);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): the documented moved-from state
  EXPECT_EQ(a.size(), 0u);
  a.push_back(42);  // a moved-from shape is usable again
  EXPECT_EQ(a, (std::vector<int64_t>{42}));

  Shape n{1, 2, 3, 4, 5, 6, 7, 8, 9};
  n = std::move(m);  // move-assign heap over heap
  EXPECT_EQ(n, ref);
  EXPECT_TRUE(m.empty());  // NOLINT(bugprone-use-after-move)
  Shape i{1, 2, 3};
  n = std::move(i);  // inline over heap
  EXPECT_EQ(n, (std::vector<int64_t>{1, 2, 3}));
  n.push_back(4);
  EXPECT_EQ(n, (std::vector<int64_t>{1, 2, 3, 4}));
}

// =============================================================================================
// Rank-7 and rank-8 tensors
// =============================================================================================

TEST(PathsShape, Rank8ViewsPermuteAndCopy) {
  const Dims s{2, 3, 1, 2, 2, 1, 2, 3};
  Tensor flat_x = iota64({count(s)});
  Tensor x = flat_x.reshape(s);  // contiguous: a view
  EXPECT_EQ(x.sizes(), s);
  EXPECT_EQ(x.strides(), row_major_strides(s));
  EXPECT_TRUE(x.is_alias_of(flat_x));
  EXPECT_EQ(x.to_vector<double>(), flat_x.to_vector<double>());

  const Dims p{7, 0, 5, 2, 6, 1, 4, 3};
  Tensor y = x.permute(p);
  Dims ys(8), yst(8);
  for (size_t k = 0; k < 8; ++k) {
    ys[k] = s[size_t(p[k])];
    yst[k] = row_major_strides(s)[size_t(p[k])];
  }
  EXPECT_EQ(y.sizes(), ys);
  EXPECT_EQ(y.strides(), yst);
  EXPECT_TRUE(y.is_alias_of(x));
  EXPECT_FALSE(y.is_contiguous());

  const std::vector<double> ref = ref_permute(x.to_vector<double>(), s, p);
  Tensor c = y.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(c.is_alias_of(x));
  EXPECT_EQ(c.sizes(), ys);
  EXPECT_EQ(c.to_vector<double>(), ref);
  EXPECT_EQ(y.clone().to_vector<double>(), ref);
  // copy_ of the permuted view into a fresh rank-8 tensor
  Tensor d = zeros(ys, kFloat64);
  d.copy_(y);
  EXPECT_EQ(d.to_vector<double>(), ref);

  // reshape of the non-contiguous view copies, in the permuted row-major order
  Tensor r = y.reshape({6, 24});
  EXPECT_EQ(r.sizes(), (Dims{6, 24}));
  EXPECT_EQ(r.to_vector<double>(), ref);
  Tensor r7 = r.reshape({3, 2, 1, 2, 2, 3, 2});  // and on to rank 7
  EXPECT_EQ(r7.sizes(), (Dims{3, 2, 1, 2, 2, 3, 2}));
  EXPECT_EQ(r7.to_vector<double>(), ref);

  // unsqueeze inserts into a full inline shape; squeeze erases from a heap one
  Tensor six = iota64({2, 3, 2, 2, 3, 2});
  Tensor seven = six.unsqueeze(3);
  EXPECT_EQ(seven.sizes(), (Dims{2, 3, 2, 1, 2, 3, 2}));
  Tensor eight = seven.unsqueeze(-1);
  EXPECT_EQ(eight.sizes(), (Dims{2, 3, 2, 1, 2, 3, 2, 1}));
  EXPECT_TRUE(eight.is_alias_of(six));
  EXPECT_EQ(eight.to_vector<double>(), six.to_vector<double>());
  EXPECT_EQ(eight.squeeze(3).sizes(), (Dims{2, 3, 2, 2, 3, 2, 1}));
  EXPECT_EQ(eight.squeeze().sizes(), six.sizes());
}

TEST(PathsShape, Rank7BroadcastAgainstLoops) {
  const Dims as{2, 1, 3, 1, 2, 1, 2}, bs{1, 2, 1, 2, 1, 3, 1}, os{2, 2, 3, 2, 2, 3, 2};
  manual_seed(11);
  Tensor a = agt::rand64(as, -2, 2, false), b = agt::rand64(bs, -2, 2, false);
  const auto av = a.to_vector<double>(), bv = b.to_vector<double>();
  const Dims ast = row_major_strides(as), bst = row_major_strides(bs);
  std::vector<double> prod, diff;
  for_each_index(os, [&](const Dims& i) {
    Dims ia = i, ib = i;
    for (size_t d = 0; d < i.size(); ++d) {
      if (as[d] == 1) ia[d] = 0;
      if (bs[d] == 1) ib[d] = 0;
    }
    const double x = av[size_t(flat(ia, ast))], y = bv[size_t(flat(ib, bst))];
    prod.push_back(x * y);
    diff.push_back(x - y);
  });
  Tensor m = a * b;
  EXPECT_EQ(m.sizes(), os);
  EXPECT_TRUE(agt::allclose(m, from_vector(prod, os), 1e-15, 0));
  EXPECT_TRUE(agt::allclose(a - b, from_vector(diff, os), 1e-15, 0));
  // float32 through the same loops, and a rank-8 result from a rank-8 and a rank-3 operand
  EXPECT_TRUE(agt::allclose(a.to(kFloat32) * b.to(kFloat32), from_vector(prod, os), 1e-6, 1e-6));
  Tensor c = iota64({2, 1, 2, 1, 2, 1, 2, 1});
  Tensor e = iota64({3, 1, 2});
  Tensor ce = c + e;
  const Dims ces{2, 1, 2, 1, 2, 3, 2, 2};
  EXPECT_EQ(ce.sizes(), ces);
  const auto cv = c.to_vector<double>(), ev = e.to_vector<double>();
  std::vector<double> ref;
  for_each_index(ces, [&](const Dims& i) {
    const double x = cv[size_t(flat({i[0], 0, i[2], 0, i[4], 0, i[6], 0}, row_major_strides({2, 1, 2, 1, 2, 1, 2, 1})))];
    const double y = ev[size_t(flat({i[5], 0, i[7]}, row_major_strides({3, 1, 2})))];
    ref.push_back(x + y);
  });
  EXPECT_EQ(ce.to_vector<double>(), ref);
}

TEST(PathsShape, Rank8ReductionsAgainstLoops) {
  const Dims s{2, 3, 1, 2, 2, 1, 2, 3};
  manual_seed(12);
  Tensor x = agt::rand64(s, -3, 3, false);
  const auto xv = x.to_vector<double>();
  // several dim sets, negative dims included (normalised for the reference)
  const std::vector<std::pair<Dims, Dims>> cases = {
      {{0, 3, 5, 7}, {0, 3, 5, 7}}, {{1, -1, 4}, {1, 7, 4}}, {{6}, {6}}, {{0, 1, 2, 3, 4, 5, 6}, {0, 1, 2, 3, 4, 5, 6}}};
  for (const auto& [dims, norm] : cases)
    for (bool keep : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "dims " << Shape(dims) << " keepdim " << keep);
      const auto [sv, sshape] = ref_reduce(xv, s, norm, keep, Red::Sum);
      const auto [mv, mshape] = ref_reduce(xv, s, norm, keep, Red::Mean);
      const auto [xm, xshape] = ref_reduce(xv, s, norm, keep, Red::Max);
      Tensor su = sum(x, dims, keep), me = mean(x, dims, keep), mx = amax(x, dims, keep);
      EXPECT_EQ(su.sizes(), sshape);
      EXPECT_EQ(me.sizes(), mshape);
      EXPECT_EQ(mx.sizes(), xshape);
      EXPECT_TRUE(agt::allclose(su, from_vector(sv, sshape), 1e-13, 1e-13));
      EXPECT_TRUE(agt::allclose(me, from_vector(mv, mshape), 1e-13, 1e-13));
      EXPECT_EQ(mx.to_vector<double>(), xm);  // max is exact
    }
  // the same reductions of a permuted (non-contiguous) rank-8 view
  const Dims p{3, 7, 1, 0, 6, 2, 5, 4};
  Tensor y = x.permute(p);
  Dims ys(8);
  for (size_t k = 0; k < 8; ++k) ys[k] = s[size_t(p[k])];
  const auto yv = ref_permute(xv, s, p);
  const auto [sv, sshape] = ref_reduce(yv, ys, {1, 2, 6}, true, Red::Sum);
  EXPECT_TRUE(agt::allclose(sum(y, {1, 2, 6}, true), from_vector(sv, sshape), 1e-13, 1e-13));
  const auto [xm, xshape] = ref_reduce(yv, ys, {0, 4}, false, Red::Max);
  EXPECT_EQ(amax(y, {0, 4}).to_vector<double>(), xm);
  EXPECT_EQ(amax(y, {0, 4}).sizes(), xshape);
}

TEST(PathsShape, Rank7And8Backward) {
  manual_seed(13);
  // broadcast product, rank-7 permute, multi-dim sum: the engine sums gradients back to the
  // rank-7 broadcast shapes (sum_to on heap shapes)
  Tensor a = agt::rand64({2, 1, 2, 1, 2, 1, 2}), b = agt::rand64({1, 2, 1, 2, 1, 2, 1});
  EXPECT_TRUE(agt::gradcheck(
      [](const TL& in) { return sum((in[0] * in[1]).permute({6, 5, 4, 3, 2, 1, 0}), {0, 2, 5}); }, {a, b}));
  EXPECT_TRUE(agt::gradcheck([](const TL& in) { return mean(in[0] - in[1], {1, -1}, true); }, {a, b}));

  // rank 8: permute, a copying reshape, reshape back to a different rank-8 shape, then a
  // keepdim mean of a square plus a keepdim amax broadcast against it
  Tensor x = agt::rand64({2, 1, 2, 1, 2, 1, 2, 2});
  EXPECT_TRUE(agt::gradcheck(
      [](const TL& in) {
        Tensor w = in[0].permute({7, 0, 5, 2, 6, 1, 4, 3}).reshape({4, 2, 4}).reshape({2, 2, 1, 2, 1, 2, 1, 2});
        return mean(w * w, {1, 3, 6}, true) + amax(w, {0, 7}, true);
      },
      {x}));
  EXPECT_TRUE(agt::gradcheck([](const TL& in) { return amax(in[0].contiguous(), {0, 2, 4, 6}); }, {x}));
  // a rank-8 gradient reaching a rank-4 leaf through unsqueeze and expand
  Tensor v = agt::rand64({2, 1, 2, 2});
  EXPECT_TRUE(agt::gradcheck(
      [](const TL& in) { return (in[0].unsqueeze(0).unsqueeze(2).unsqueeze(-1).expand({3, 2, 2, 1, 2, 2, 2, 2}) * 1.5).sum({0, 6}); },
      {v}));
}

// =============================================================================================
// GradScaler::update(new_scale)
// =============================================================================================

namespace {

// One float32 parameter of 4 zeros under SGD(lr = 1); gradients are set directly.
struct ScalerRig {
  Tensor p = zeros({4}, kFloat32).requires_grad_();
  optim::SGD opt{{p}, {.lr = 1.0}};
  void grad(double v, bool inf = false) {
    std::vector<float> g(4, float(v));
    if (inf) g[1] = std::numeric_limits<float>::infinity();
    p.set_grad(from_vector(g, {4}));
  }
};

}  // namespace

TEST(PathsScaler, UpdateWithNewScaleKeepsTrackerAndReadiesOptimizers) {
  ScalerRig r;
  GradScaler scaler({.init_scale = 8, .growth_interval = 3});
  for (int i = 0; i < 2; ++i) {  // two clean iterations: tracker 2, no growth yet
    r.grad(4.0);
    EXPECT_TRUE(scaler.step(r.opt));
    scaler.update();
  }
  ASSERT_EQ(scaler.get_scale(), 8);
  ASSERT_EQ(scaler.get_growth_tracker(), 2);
  ASSERT_EQ(scaler.num_updates(), 2);

  // a third iteration ends with update(new_scale) instead of the rule
  r.grad(4.0);
  scaler.unscale_(r.opt);
  EXPECT_TRUE(scaler.step(r.opt));
  scaler.update(1024.0);
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  EXPECT_EQ(scaler.get_growth_tracker(), 2);  // kept
  EXPECT_EQ(scaler.num_updates(), 2);         // the rule was not applied

  // the optimizer is READY: unscale_ and step are allowed again, and divide by the new scale
  r.grad(512.0);
  EXPECT_NO_THROW(scaler.unscale_(r.opt));
  EXPECT_EQ(r.p.grad().to_vector<float>(), std::vector<float>(4, 0.5f));
  EXPECT_TRUE(scaler.step(r.opt));

  // scale() multiplies by the new value (and so does the gradient of the scaled loss)
  Tensor loss = full({}, 1.5, kFloat32).requires_grad_();
  Tensor scaled = scaler.scale(loss);
  EXPECT_EQ(scaled.item<double>(), 1.5 * 1024);
  scaled.backward();
  EXPECT_EQ(loss.grad().item<double>(), 1024.0);

  // the kept tracker reaches growth_interval on the next clean update: growth from 1024
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 2048.0);
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
  EXPECT_EQ(scaler.num_updates(), 3);
}

TEST(PathsScaler, UpdateWithNewScaleMidIterationAndAfterOverflow) {
  ScalerRig a, b;
  GradScaler scaler({.init_scale = 64, .growth_interval = 10});
  a.grad(32.0);
  EXPECT_TRUE(scaler.step(a.opt));
  scaler.update();
  ASSERT_EQ(scaler.get_growth_tracker(), 1);

  // an overflow this iteration, then update(new_scale): no backoff, no tracker reset, and the
  // overflow is not recorded as an update that saw one
  a.grad(32.0, /*inf=*/true);
  b.grad(32.0);
  EXPECT_FALSE(scaler.step(a.opt));
  scaler.unscale_(b.opt);  // b only unscaled, not stepped
  scaler.update(16.0);
  EXPECT_EQ(scaler.get_scale(), 16.0);
  EXPECT_EQ(scaler.get_growth_tracker(), 1);
  EXPECT_EQ(scaler.last_overflow_step(), -1);
  EXPECT_EQ(scaler.skipped_steps(), 1);

  // both optimizers are READY again, whatever stage each was in
  a.grad(8.0);
  b.grad(8.0);
  EXPECT_NO_THROW(scaler.unscale_(a.opt));
  EXPECT_NO_THROW(scaler.unscale_(b.opt));
  EXPECT_EQ(b.p.grad().to_vector<float>(), std::vector<float>(4, 0.5f));  // 8 / 16
  EXPECT_TRUE(scaler.step(a.opt));
  EXPECT_TRUE(scaler.step(b.opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 16.0);
  EXPECT_EQ(scaler.get_growth_tracker(), 2);
}

TEST(PathsScaler, UpdateWithInvalidScaleThrowsAndChangesNothing) {
  ScalerRig r;
  GradScaler scaler({.init_scale = 32});
  r.grad(16.0);
  EXPECT_TRUE(scaler.step(r.opt));
  const double bad[] = {0.0, -0.0, -1e-300, 1e-300, 1e-40, 1e39, std::numeric_limits<double>::infinity(),
                        -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()};
  for (double v : bad) {
    SCOPED_TRACE(v);
    EXPECT_AG_ERROR(scaler.update(v), "[GradScaler] update(new_scale): the scale must be a positive normal float32 number, in [2^-126, 3.4e38], got ");
  }
  EXPECT_AG_ERROR(scaler.update(0.0), "3.4e38], got 0");
  EXPECT_AG_ERROR(scaler.update(std::numeric_limits<double>::infinity()), "3.4e38], got inf");
  EXPECT_EQ(scaler.get_scale(), 32.0);
  // the refusals left the optimizer STEPPED: stepping again is still refused
  EXPECT_AG_ERROR(scaler.step(r.opt), "step() has already been called on this optimizer");
  scaler.update(2.0);
  EXPECT_EQ(scaler.get_scale(), 2.0);
}

// =============================================================================================
// Generator state
// =============================================================================================

TEST(PathsGenerator, SaveDrawRestoreIsBitIdentical) {
  manual_seed(2024);
  (void)rand({5});
  const auto st = generator_state();
  EXPECT_EQ(st, (std::pair<uint64_t, uint64_t>{2024, 5}));
  const auto u1 = rand({3, 4}).to_vector<float>();
  const auto n1 = randn({7}, kFloat64).to_vector<double>();
  const auto b1 = rand({6}, kBFloat16).to_vector<float>();
  const auto after = generator_state();
  EXPECT_EQ(after.second, st.second + 12 + 7 + 6);  // one counter per element

  set_generator_state(st.first, st.second);
  EXPECT_EQ(generator_state(), st);
  EXPECT_EQ(rand({3, 4}).to_vector<float>(), u1);
  EXPECT_EQ(randn({7}, kFloat64).to_vector<double>(), n1);
  EXPECT_EQ(rand({6}, kBFloat16).to_vector<float>(), b1);
  EXPECT_EQ(generator_state(), after);

  // another seed with the same offset draws something else
  set_generator_state(st.first + 1, st.second);
  EXPECT_NE(rand({3, 4}).to_vector<float>(), u1);
}

TEST(PathsGenerator, AdvanceReservesCountersAndDrawsContinueTheStream) {
  const int64_t n = 37, m = 19;
  manual_seed(99);
  const auto whole = rand({n + m}, kFloat64).to_vector<double>();
  const std::vector<double> head(whole.begin(), whole.begin() + n), tail(whole.begin() + n, whole.end());

  // element i of a draw uses counter offset + i: two draws are one split in two
  manual_seed(99);
  EXPECT_EQ(rand({n}, kFloat64).to_vector<double>(), head);
  EXPECT_EQ(rand({m}, kFloat64).to_vector<double>(), tail);

  // generator_advance(n) reserves [offset, offset + n) and returns where it started
  manual_seed(99);
  EXPECT_EQ(generator_advance(0), (std::pair<uint64_t, uint64_t>{99, 0}));
  EXPECT_EQ(generator_advance(uint64_t(n)), (std::pair<uint64_t, uint64_t>{99, 0}));
  EXPECT_EQ(generator_state(), (std::pair<uint64_t, uint64_t>{99, uint64_t(n)}));
  EXPECT_EQ(rand({m}, kFloat64).to_vector<double>(), tail);
  EXPECT_EQ(generator_advance(5), (std::pair<uint64_t, uint64_t>{99, uint64_t(n + m)}));
  EXPECT_EQ(generator_state().second, uint64_t(n + m + 5));

  // the same rule for normals, and for a shaped draw (counters in row-major order)
  manual_seed(5);
  const auto nw = randn({n + m}, kFloat64).to_vector<double>();
  manual_seed(5);
  generator_advance(uint64_t(n));
  const auto nt = randn({m}, kFloat64).to_vector<double>();
  EXPECT_EQ(nt, std::vector<double>(nw.begin() + n, nw.end()));
  manual_seed(99);
  EXPECT_EQ(rand({7, 8}, kFloat64).to_vector<double>(), whole);  // 7 * 8 == n + m

  // counters past 2^32 (the high word of the counter) follow the same rule
  const uint64_t hi = (uint64_t(1) << 32) - 2;
  set_generator_state(7, hi);
  const auto across = rand({4}, kFloat64).to_vector<double>();
  set_generator_state(7, hi + 2);
  EXPECT_EQ(rand({2}, kFloat64).to_vector<double>(), std::vector<double>(across.begin() + 2, across.end()));
  EXPECT_NE(across[0], across[2]);
  set_generator_state(7, 0);  // counter 2^32 is not counter 0: the high word counts
  EXPECT_NE(rand({2}, kFloat64).to_vector<double>(), std::vector<double>(across.begin() + 2, across.end()));
}

TEST(PathsGenerator, ManualSeedResetsTheOffset) {
  manual_seed(31);
  const auto first = rand({8}, kFloat64).to_vector<double>();
  (void)randn({100});
  generator_advance(1000);
  EXPECT_EQ(generator_state(), (std::pair<uint64_t, uint64_t>{31, 1108}));
  manual_seed(31);
  EXPECT_EQ(generator_state(), (std::pair<uint64_t, uint64_t>{31, 0}));
  EXPECT_EQ(rand({8}, kFloat64).to_vector<double>(), first);
  set_generator_state(31, 500);
  manual_seed(32);
  EXPECT_EQ(generator_state(), (std::pair<uint64_t, uint64_t>{32, 0}));
}

// =============================================================================================
// set_last_step
// =============================================================================================

namespace {

// Warmup from 0.1 over 4 steps, then halving every 3 steps: the closed form of
// Sequence({LinearWarmup({.steps = 4, .start_factor = 0.1}), StepDecay({3, 0.5})}, {4}).
optim::SchedulePtr warm_then_step() {
  return optim::Sequence({optim::LinearWarmup({.steps = 4, .start_factor = 0.1}),
                          optim::StepDecay({.step_size = 3, .gamma = 0.5})},
                         {4});
}
double warm_then_step_lr(int64_t t, double base) {
  if (t < 4) return base * (0.1 + 0.9 * double(t) / 4);
  return base * std::pow(0.5, double((t - 4) / 3));
}

}  // namespace

TEST(PathsScheduler, LRSchedulerJumpsToTheStepsRate) {
  Tensor a = zeros({1}).requires_grad_(), b = zeros({1}).requires_grad_();
  Tensor c = zeros({1}).requires_grad_(), d = zeros({1}).requires_grad_();
  optim::SGD o1(std::vector<optim::SGD::ParamGroup>{{{a}, {.lr = 0.1}}, {{b}, {.lr = 0.02}}});
  optim::SGD o2(std::vector<optim::SGD::ParamGroup>{{{c}, {.lr = 0.1}}, {{d}, {.lr = 0.02}}});
  optim::LRScheduler stepped(o1, warm_then_step()), jumped(o2, warm_then_step());
  std::vector<std::pair<double, double>> seen{{o1.lr(0), o1.lr(1)}};
  for (int64_t t = 1; t <= 15; ++t) {
    stepped.step();
    seen.emplace_back(o1.lr(0), o1.lr(1));
  }
  // jump forwards and backwards, in an order no run of steps would take
  for (int64_t t : {7, 3, 15, 0, 4, 11, 1, 6}) {
    SCOPED_TRACE(t);
    jumped.set_last_step(t);
    EXPECT_EQ(jumped.last_step(), t);
    EXPECT_NEAR(o2.lr(0), warm_then_step_lr(t, 0.1), 1e-15);
    EXPECT_NEAR(o2.lr(1), warm_then_step_lr(t, 0.02), 1e-15);
    EXPECT_EQ(o2.lr(0), seen[size_t(t)].first);  // what t steps gave
    EXPECT_EQ(o2.lr(1), seen[size_t(t)].second);
    EXPECT_EQ(jumped.last_lr(1), o2.lr(1));
  }
  // stepping on from a jump continues from it
  jumped.set_last_step(9);
  jumped.step();
  EXPECT_EQ(jumped.last_step(), 10);
  EXPECT_EQ(o2.lr(0), seen[10].first);
  // the base stays the constructor's, not the rate of the step jumped from
  jumped.set_last_step(0);
  EXPECT_NEAR(o2.lr(0), 0.1 * 0.1, 1e-16);
  EXPECT_AG_ERROR(jumped.set_last_step(-1), "[LRScheduler] step must be >= 0, got -1");
  EXPECT_EQ(jumped.last_step(), 0);
  EXPECT_NEAR(o2.lr(0), 0.1 * 0.1, 1e-16);
}

TEST(PathsScheduler, LiteSchedulerJumpsAndThenAdvancesOnRealSteps) {
  static const hw::HardwareProfile amx = hw::profiles::cpu_amx();
  Lite lite({.accelerator = "cpu", .precision = "32-true", .profile = &amx});
  Tensor w = zeros({2}).requires_grad_();
  optim::SGD sgd({w}, {.lr = 0.4});
  LiteOptimizer opt = lite.setup_optimizer(sgd);
  LiteScheduler sched = lite.setup_scheduler(opt, warm_then_step());
  EXPECT_EQ(sched.last_step(), 0);

  sched.set_last_step(8);
  EXPECT_EQ(sched.last_step(), 8);
  EXPECT_NEAR(sgd.lr(), warm_then_step_lr(8, 0.4), 1e-15);
  EXPECT_EQ(sched.last_lr(), sgd.lr());
  sched.step();  // no optimizer step since the jump: stays
  EXPECT_EQ(sched.last_step(), 8);

  w.set_grad(ones({2}));
  EXPECT_TRUE(opt.step());
  sched.step();
  EXPECT_EQ(sched.last_step(), 9);
  EXPECT_NEAR(sgd.lr(), warm_then_step_lr(9, 0.4), 1e-15);

  // a step taken before a jump is part of the restored position, not a pending advance
  EXPECT_TRUE(opt.step());
  sched.set_last_step(2);
  sched.step();
  EXPECT_EQ(sched.last_step(), 2);
  EXPECT_NEAR(sgd.lr(), warm_then_step_lr(2, 0.4), 1e-15);

  EXPECT_AG_ERROR(sched.set_last_step(-3), "got -3");
  EXPECT_EQ(sched.last_step(), 2);
  EXPECT_NEAR(sgd.lr(), warm_then_step_lr(2, 0.4), 1e-15);
}

// =============================================================================================
// A custom op through the public autograd API
// =============================================================================================

namespace {

// y = x^3, computed without recording (only the user's node is in the graph), with the
// backward 3 x^2 g from a SavedTensor.
Tensor cube(const Tensor& x) {
  Tensor y;
  {
    NoGradGuard ng;
    y = x * x * x;
  }
  record("cube", {x}, {y}, [saved = SavedTensor(x)](const TL& g, GradMask) -> TL {
    const Tensor& xs = saved.get();
    return {g[0] * xs * xs * 3.0};
  });
  return y;
}

struct MaskSeen {
  int calls = 0;
  bool a = false, b = false, beyond = true;
};

// a * b whose backward reports the GradMask it got and computes only what is asked for.
Tensor user_mul(const Tensor& a, const Tensor& b, const std::shared_ptr<MaskSeen>& seen,
                std::shared_ptr<Node>* node = nullptr) {
  Tensor y;
  {
    NoGradGuard ng;
    y = a * b;
  }
  auto n = record("user_mul", {a, b}, {y},
                  [sa = SavedTensor(a), sb = SavedTensor(b), seen](const TL& g, GradMask needs) -> TL {
                    ++seen->calls;
                    seen->a = needs[0];
                    seen->b = needs[1];
                    seen->beyond = needs[2];
                    return {needs[0] ? g[0] * sb.get() : Tensor(), needs[1] ? g[0] * sa.get() : Tensor()};
                  });
  if (node) *node = n;
  return y;
}

}  // namespace

TEST(PathsCustomOp, CubeRecordsOneNamedNodeAndPassesGradcheck) {
  manual_seed(21);
  Tensor x = agt::rand64({3, 4});
  Tensor y = cube(x);
  ASSERT_TRUE(y.requires_grad());
  EXPECT_FALSE(y.is_leaf());
  ASSERT_TRUE(y.grad_fn());
  EXPECT_EQ(y.grad_fn()->name(), "CubeBackward");
  ASSERT_EQ(y.grad_fn()->next_edges.size(), 1u);  // straight to the leaf: nothing recorded inside
  EXPECT_EQ(y.grad_fn()->next_edges[0].fn->name(), "AccumulateGrad");
  EXPECT_EQ(y.grad_fn()->input_meta[0].sizes, (Dims{3, 4}));

  y.sum().backward();
  const auto xv = x.to_vector<double>(), gv = x.grad().to_vector<double>();
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_NEAR(gv[i], 3 * xv[i] * xv[i], 1e-14);

  EXPECT_TRUE(agt::gradcheck([](const TL& in) { return cube(in[0]); }, {x}));
  // composed with library ops on both sides (kept in a small range: finite differences of a
  // large exp lose the small entries' gradients to rounding)
  EXPECT_TRUE(agt::gradcheck([](const TL& in) { return cube(in[0] * 0.5 + 0.25).exp().sum({1}); }, {x}));
  Tensor z = cube(x * 2.0);
  EXPECT_EQ(z.grad_fn()->next_edges[0].fn->name(), "MulBackward");

  // the name comes from the forward name: each '_' starts a capitalised word
  Tensor v = agt::rand64({2});
  Tensor o;
  {
    NoGradGuard ng;
    o = v * 2.0;
  }
  auto node = record("scaled_by_two", {v}, {o}, [](const TL& g, GradMask) -> TL { return {g[0] * 2.0}; });
  ASSERT_TRUE(node);
  EXPECT_EQ(node->name(), "ScaledByTwoBackward");
  EXPECT_EQ(o.grad_fn(), node);
}

TEST(PathsCustomOp, SavedInputModifiedInPlaceMakesBackwardThrow) {
  manual_seed(22);
  Tensor x = agt::rand64({3});
  Tensor y = cube(x);
  {
    NoGradGuard ng;
    x.mul_(2.0);
  }
  EXPECT_AG_ERROR(y.sum().backward(),
                  "[CubeBackward] a tensor saved for backward (shape [3], float64) was modified by an in-place "
                  "operation");
  EXPECT_FALSE(x.grad().defined());

  // a non-leaf input modified by a later in-place op: the same check
  Tensor h = x * 1.0;
  Tensor y2 = cube(h);
  h.add_(1.0);
  EXPECT_AG_ERROR(y2.sum().backward(), "use an out-of-place op or clone the tensor before modifying it");

  // unmodified, the same op runs
  Tensor y3 = cube(x);
  y3.sum().backward();
  EXPECT_TRUE(x.grad().defined());
}

TEST(PathsCustomOp, GradMaskTellsWhichInputsNeedGrad) {
  manual_seed(23);
  for (int which = 0; which < 3; ++which) {  // a only, b only, both
    SCOPED_TRACE(which);
    Tensor a = agt::rand64({2, 3}, -1, 1, which != 1), b = agt::rand64({2, 3}, -1, 1, which != 0);
    auto seen = std::make_shared<MaskSeen>();
    std::shared_ptr<Node> node;
    Tensor y = user_mul(a, b, seen, &node);
    ASSERT_TRUE(node);
    EXPECT_EQ(node->name(), "UserMulBackward");
    ASSERT_EQ(node->next_edges.size(), 2u);  // one per input, invalid where none is needed
    EXPECT_EQ(node->next_edges[0].valid(), a.requires_grad());
    EXPECT_EQ(node->next_edges[1].valid(), b.requires_grad());
    y.sum().backward();
    EXPECT_EQ(seen->calls, 1);
    EXPECT_EQ(seen->a, a.requires_grad());
    EXPECT_EQ(seen->b, b.requires_grad());
    EXPECT_FALSE(seen->beyond);  // past the inputs: false, not out of bounds
    if (a.requires_grad()) {
      EXPECT_TRUE(agt::allclose(a.grad(), b.detach(), 0, 0));
    }
    if (b.requires_grad()) {
      EXPECT_TRUE(agt::allclose(b.grad(), a.detach(), 0, 0));
    }
  }
  Tensor a = agt::rand64({4}), b = agt::rand64({4});
  auto seen = std::make_shared<MaskSeen>();
  EXPECT_TRUE(agt::gradcheck([&](const TL& in) { return user_mul(in[0], in[1], seen); }, {a, b}));

  // nothing to record: no input requires grad, or grad mode is off
  std::shared_ptr<Node> node = std::make_shared<FunctionNode>("x", BackwardFn());
  Tensor y = user_mul(agt::rand64({2}, -1, 1, false), agt::rand64({2}, -1, 1, false), seen, &node);
  EXPECT_FALSE(node);
  EXPECT_FALSE(y.requires_grad());
  {
    NoGradGuard ng;
    Tensor y2 = user_mul(a, b, seen, &node);
    EXPECT_FALSE(node);
    EXPECT_FALSE(y2.requires_grad());
  }
}

TEST(PathsCustomOp, TwoOutputsAndBroadcastGradients) {
  manual_seed(24);
  // (2x, x^2) from one node: a backward from one output gets an undefined gradient for the
  // other
  auto defined = std::make_shared<std::pair<bool, bool>>();
  auto twice_and_square = [defined](const Tensor& x) {
    Tensor d, s;
    {
      NoGradGuard ng;
      d = x * 2.0;
      s = x * x;
    }
    record("twice_and_square", {x}, {d, s}, [sx = SavedTensor(x), defined](const TL& g, GradMask) -> TL {
      *defined = {g[0].defined(), g[1].defined()};
      Tensor gx;
      if (g[0].defined()) gx = g[0] * 2.0;
      if (g[1].defined()) gx = gx.defined() ? gx + g[1] * sx.get() * 2.0 : g[1] * sx.get() * 2.0;
      return {gx};
    });
    return std::make_pair(d, s);
  };
  Tensor x = agt::rand64({3});
  auto [d, s] = twice_and_square(x);
  EXPECT_EQ(d.grad_fn(), s.grad_fn());
  EXPECT_EQ(d.output_nr(), 0u);
  EXPECT_EQ(s.output_nr(), 1u);
  EXPECT_EQ(d.grad_fn()->num_outputs, 2u);
  d.sum().backward();
  EXPECT_EQ(*defined, (std::pair<bool, bool>{true, false}));
  EXPECT_EQ(x.grad().to_vector<double>(), std::vector<double>(3, 2.0));
  EXPECT_TRUE(agt::gradcheck(
      [&](const TL& in) {
        auto [a, b] = twice_and_square(in[0]);
        return a * 3.0 + b;
      },
      {x}));
  EXPECT_EQ(*defined, (std::pair<bool, bool>{true, true}));

  // a backward that returns the gradient at the output's (broadcast) shape: the engine sums
  // it down to the input's shape
  auto add_row = [](const Tensor& m, const Tensor& r) {
    Tensor y;
    {
      NoGradGuard ng;
      y = m + r;
    }
    record("add_row", {m, r}, {y}, [](const TL& g, GradMask) -> TL { return {g[0], g[0]}; });
    return y;
  };
  Tensor m = agt::rand64({3, 4}), r = agt::rand64({4});
  EXPECT_TRUE(agt::gradcheck([&](const TL& in) { return add_row(in[0], in[1]); }, {m, r}));
  // one that cannot be summed to the input's shape is named in the error
  Tensor v = agt::rand64({3});
  Tensor o;
  {
    NoGradGuard ng;
    o = v * 1.0;
  }
  record("bad_shape", {v}, {o}, [](const TL&, GradMask) -> TL { return {ones({5}, kFloat64)}; });
  EXPECT_AG_ERROR(o.sum().backward(), "[BadShapeBackward] returned a gradient of shape [5] for input 0 of shape [3]");
}

// =============================================================================================
// *_like factories
// =============================================================================================

TEST(PathsLike, ShapeDtypeDeviceValuesAndNoGrad) {
  for (DType dt : {kFloat32, kFloat64, kBFloat16, kFloat16, kInt64}) {
    SCOPED_TRACE(dtype_name(dt));
    manual_seed(41);
    Tensor base = is_floating(dt) ? randn({3, 5}).to(dt) : randint(-9, 9, {3, 5});
    Tensor x = agt::non_contiguous(base);  // strides of a transpose
    ASSERT_FALSE(x.is_contiguous());
    if (is_floating(dt)) x.requires_grad_();
    const auto xv = x.to_vector<double>();
    const double full_value = is_floating(dt) ? -2.5 : 7.0;

    std::vector<std::pair<const char*, Tensor>> made = {{"empty_like", empty_like(x)},
                                                        {"zeros_like", zeros_like(x)},
                                                        {"ones_like", ones_like(x)},
                                                        {"full_like", is_floating(dt) ? full_like(x, -2.5) : full_like(x, 7)}};
    if (is_floating(dt)) {
      made.emplace_back("rand_like", rand_like(x));
      made.emplace_back("randn_like", randn_like(x));
    }
    for (auto& [name, t] : made) {
      SCOPED_TRACE(name);
      EXPECT_EQ(t.sizes(), (Dims{3, 5}));
      EXPECT_EQ(t.dtype(), dt);
      EXPECT_EQ(t.device(), x.device());
      EXPECT_FALSE(t.requires_grad());  // not inherited
      EXPECT_TRUE(t.is_leaf());
      EXPECT_FALSE(t.is_alias_of(x));
      {
        NoGradGuard ng;
        t.fill_(1);  // writing the new tensor leaves the input alone
      }
      EXPECT_EQ(x.to_vector<double>(), xv);
    }
    EXPECT_EQ(zeros_like(x).to_vector<double>(), std::vector<double>(15, 0.0));
    EXPECT_EQ(ones_like(x).to_vector<double>(), std::vector<double>(15, 1.0));
    const Tensor f = is_floating(dt) ? full_like(x, -2.5) : full_like(x, 7);
    EXPECT_EQ(f.to_vector<double>(), std::vector<double>(15, full_value));
  }
}

TEST(PathsLike, RandomLikeDrawsAsTheFactoryOfThatShapeAndDtype) {
  for (DType dt : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = agt::non_contiguous(zeros({4, 6}, dt)).requires_grad_();
    manual_seed(51);
    const auto off0 = generator_state().second;
    Tensor u = rand_like(x);
    EXPECT_EQ(generator_state().second, off0 + 24);  // one counter per element
    Tensor n = randn_like(x);
    manual_seed(51);
    EXPECT_EQ(u.to_vector<double>(), rand({4, 6}, dt).to_vector<double>());
    EXPECT_EQ(n.to_vector<double>(), randn({4, 6}, dt).to_vector<double>());
    EXPECT_EQ(n.dtype(), dt);
    for (double v : u.to_vector<double>()) {
      EXPECT_GE(v, 0.0);
      EXPECT_LT(v, 1.0);
    }
  }
  // randn_like of a float64 input keeps float64 precision: not a widened float32 draw
  manual_seed(52);
  const auto n64 = randn_like(zeros({64}, kFloat64)).to_vector<double>();
  bool beyond_float = false;
  for (double v : n64) beyond_float |= double(float(v)) != v;
  EXPECT_TRUE(beyond_float);
}

// A 53-bit draw rounded to a 16-bit dtype would reach 1.0 about once in 2^9 (bfloat16) or
// 2^12 (float16) draws; factories.h promises [0, 1).
TEST(PathsLike, RandLikeStaysBelowOneInEveryDtype) {
  for (DType dt : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    manual_seed(0);
    const auto v = rand_like(zeros({1 << 16}, dt)).to_vector<double>();
    EXPECT_LT(*std::max_element(v.begin(), v.end()), 1.0);
  }
}

// =============================================================================================
// nn::init
// =============================================================================================

namespace {

struct Stats {
  double min, max, mean, sd;
};
Stats stats_of(const Tensor& t) {
  const auto v = t.to_vector<double>();
  Stats s{v[0], v[0], 0, 0};
  for (double x : v) {
    s.min = std::min(s.min, x);
    s.max = std::max(s.max, x);
    s.mean += x;
  }
  s.mean /= double(v.size());
  for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
  s.sd = std::sqrt(s.sd / double(v.size()));
  return s;
}

// Relative rounding of a dtype: a value drawn below a bound may round up to just above it.
double rounding(DType dt) { return dt == kBFloat16 ? 1.0 / 256 : dt == kFloat32 ? 1.0 / (1 << 23) : 0.0; }

}  // namespace

TEST(PathsInit, FanInAndFanOut) {
  using P = std::pair<int64_t, int64_t>;
  EXPECT_EQ(nn::init::fan_in_and_fan_out(empty({5, 3})), (P{3, 5}));  // Linear(3, 5).weight
  EXPECT_EQ(nn::init::fan_in_and_fan_out(empty({6, 4, 3})), (P{12, 18}));
  EXPECT_EQ(nn::init::fan_in_and_fan_out(empty({2, 3, 1, 4, 2})), (P{24, 16}));
  EXPECT_AG_ERROR(nn::init::fan_in_and_fan_out(empty({4})),
                  "[init] fan in and fan out need a tensor of at least 2 dims, got shape [4]");
}

TEST(PathsInit, UniformNormalAndConstantsAgainstTheirDefinitions) {
  const int64_t n = 40000;
  for (DType dt : {kFloat32, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    manual_seed(61);
    Tensor t = empty({200, n / 200}, dt);
    // uniform on [-2, 3): sd of the sample mean is 5 / sqrt(12 n) ~ 0.007
    Tensor r = nn::init::uniform_(t, -2, 3);
    EXPECT_EQ(r.unsafe_impl(), t.unsafe_impl());  // returns its argument
    EXPECT_EQ(t.dtype(), dt);
    Stats s = stats_of(t);
    EXPECT_GE(s.min, -2.0);
    EXPECT_LT(s.max, 3.0);  // open above, in every dtype
    EXPECT_LT(s.min, -1.99);
    // the largest bfloat16 below 3 is 3 - 2^-6
    EXPECT_GT(s.max, dt == kFloat32 ? 2.99 : 2.98);
    EXPECT_NEAR(s.mean, 0.5, 0.04);
    EXPECT_NEAR(s.sd, 5 / std::sqrt(12.0), 0.02);
    // normal(2, 0.5): mean within 5 sd of the mean (0.0125), sd within ~5 of its sd (0.009)
    nn::init::normal_(t, 2.0, 0.5);
    s = stats_of(t);
    EXPECT_NEAR(s.mean, 2.0, 0.0125);
    EXPECT_NEAR(s.sd, 0.5, 0.01);
    nn::init::normal_(t);  // defaults: standard normal
    s = stats_of(t);
    EXPECT_NEAR(s.mean, 0.0, 0.025);
    EXPECT_NEAR(s.sd, 1.0, 0.02);
    nn::init::constant_(t, -0.75);
    EXPECT_EQ(t.to_vector<double>(), std::vector<double>(size_t(n), -0.75));
    nn::init::ones_(t);
    EXPECT_EQ(t.to_vector<double>(), std::vector<double>(size_t(n), 1.0));
    nn::init::zeros_(t);
    EXPECT_EQ(t.to_vector<double>(), std::vector<double>(size_t(n), 0.0));
  }
}

TEST(PathsInit, KaimingAndXavierBounds) {
  // a conv weight with fan_in (20 * 9 = 180) far from fan_out (128 * 9 = 1152), so that a
  // formula mixing them up misses the bound
  const Dims shape{128, 20, 3, 3};
  const double fan_in = 180, fan_out = 1152;
  for (DType dt : {kFloat32, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    manual_seed(62);
    Tensor w = empty(shape, dt);
    struct Case {
      const char* name;
      std::function<void()> init;
      double bound;
    };
    const double a = std::sqrt(5.0);
    const std::vector<Case> cases = {
        {"kaiming a=0", [&] { nn::init::kaiming_uniform_(w); }, std::sqrt(6 / fan_in)},
        {"kaiming a=sqrt(5)", [&] { nn::init::kaiming_uniform_(w, a); }, std::sqrt(6 / ((1 + a * a) * fan_in))},
        {"kaiming a=0.2", [&] { nn::init::kaiming_uniform_(w, 0.2); }, std::sqrt(6 / (1.04 * fan_in))},
        {"xavier gain 1", [&] { nn::init::xavier_uniform_(w); }, std::sqrt(6 / (fan_in + fan_out))},
        {"xavier gain 1.5", [&] { nn::init::xavier_uniform_(w, 1.5); }, 1.5 * std::sqrt(6 / (fan_in + fan_out))},
    };
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name);
      c.init();
      EXPECT_EQ(w.dtype(), dt);
      const Stats s = stats_of(w);
      // 23040 draws: the extremes come within 1% of the bound with overwhelming probability
      EXPECT_LE(s.max, c.bound * (1 + rounding(dt)));
      EXPECT_GE(s.min, -c.bound * (1 + rounding(dt)));
      EXPECT_GT(s.max, 0.99 * c.bound);
      EXPECT_LT(s.min, -0.99 * c.bound);
      EXPECT_NEAR(s.mean, 0.0, 0.05 * c.bound);
    }
  }
}

TEST(PathsInit, InPlaceOnALeafThatRequiresGradWithoutAGraph) {
  manual_seed(63);
  Tensor w = empty({8, 6}).requires_grad_();
  // the same in-place fill outside init is refused in grad mode: init must switch it off
  EXPECT_AG_ERROR(w.uniform_(-1, 1), "cannot be modified in place in grad mode");
  const std::vector<std::pair<const char*, std::function<Tensor()>>> inits = {
      {"uniform_", [&] { return nn::init::uniform_(w, -1, 1); }},
      {"normal_", [&] { return nn::init::normal_(w); }},
      {"constant_", [&] { return nn::init::constant_(w, 3); }},
      {"zeros_", [&] { return nn::init::zeros_(w); }},
      {"ones_", [&] { return nn::init::ones_(w); }},
      {"kaiming_uniform_", [&] { return nn::init::kaiming_uniform_(w); }},
      {"xavier_uniform_", [&] { return nn::init::xavier_uniform_(w); }},
  };
  for (const auto& [name, init] : inits) {
    SCOPED_TRACE(name);
    const uint64_t v0 = w.version();
    const auto before = w.to_vector<float>();
    Tensor r = init();
    EXPECT_EQ(r.unsafe_impl(), w.unsafe_impl());
    EXPECT_GT(w.version(), v0);  // an in-place write
    EXPECT_TRUE(GradMode::is_enabled());  // restored
    EXPECT_TRUE(w.is_leaf());
    EXPECT_TRUE(w.requires_grad());
    EXPECT_FALSE(w.grad_fn());
    EXPECT_NE(w.to_vector<float>(), before);
  }
  // still an ordinary leaf: gradients accumulate into it
  (w * 2.0f).sum().backward();
  EXPECT_EQ(w.grad().to_vector<float>(), std::vector<float>(48, 2.0f));
  // and a bfloat16 leaf the same way
  Tensor h = empty({16, 8}, kBFloat16).requires_grad_();
  nn::init::kaiming_uniform_(h, std::sqrt(5.0));
  EXPECT_TRUE(h.is_leaf());
  EXPECT_FALSE(h.grad_fn());
  EXPECT_EQ(h.dtype(), kBFloat16);
  EXPECT_LE(stats_of(h).max, std::sqrt(1.0 / 8) * (1 + 1.0 / 256));
}
