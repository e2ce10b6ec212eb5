// scaled_dot_product_attention (ops/nn.h): values and float64 gradients against the
// float64 reference (kernels/reference: causal, bool and float masks, Tq != Tk, Dv != D,
// lengths around and beyond the kernel's 64-wide tiles), float64 gradchecks, the 16-bit
// dtypes against float64, rows that see no key, dropout (reproducible, its keep rate, the
// documented Philox rule, the same mask in backward), the error messages, Backend's
// composed form (what CUDA runs) against the CPU kernel, CausalSelfAttention against the
// five-op formula it replaced, and each instruction-set variant (hw::set_kernel_isa) in
// float32 and bfloat16 against float64, head sizes over 256 included.
#include "ampgrad/reference/attention.h"
#include "support/testing.h"

#include <cmath>
#include <limits>

using namespace ag;
using TL = std::vector<Tensor>;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

using agt::randf;

std::vector<int64_t> scores_shape(const Tensor& q, const Tensor& k) {
  std::vector<int64_t> s = q.sizes().vec();
  s.back() = k.size(-2);
  return s;
}

// The additive value of each score (0, -inf or the float mask's value), flattened over
// [batch..., Tq, Tk]; zeros without a mask.
std::vector<double> additive_values(const Tensor& mask, const std::vector<int64_t>& scores) {
  int64_t n = 1;
  for (int64_t s : scores) n *= s;
  if (!mask.defined()) return std::vector<double>(size_t(n), 0.0);
  std::vector<double> v = mask.expand(scores).contiguous().to(kFloat64).to_vector<double>();
  if (mask.dtype() == kBool)
    for (double& x : v) x = x != 0 ? 0.0 : -kInf;
  return v;
}

// The float64 reference's shape and options for q, k, v (batch dims flattened), with the
// additive mask and dropout factors as flat vectors that must outlive the options.
ampgrad::reference::AttentionShape ref_shape(const Tensor& q, const Tensor& k, const Tensor& v) {
  int64_t B = 1;
  for (int64_t i = 0; i + 2 < q.dim(); ++i) B *= q.size(i);
  return {B, q.size(-2), k.size(-2), q.size(-1), v.size(-1)};
}

// softmax(scale q k^T + mask) v by the float64 reference, with the causal rule (key j
// visible to query i when j <= i) and, when given, a dropout factor per score; a row that
// sees no key gives 0.
Tensor ref_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                     double scale, const std::vector<double>& drop = {}) {
  const std::vector<double> mv = additive_values(mask, scores_shape(q, k));
  const std::vector<double> out = ampgrad::reference::attention(
      q.to_vector<double>(), k.to_vector<double>(), v.to_vector<double>(), ref_shape(q, k, v),
      {.scale = scale, .causal = causal, .mask = mv, .dropout = drop});
  std::vector<int64_t> shape = q.sizes().vec();
  shape.back() = v.size(-1);
  return from_vector(out, shape);
}

// {dq, dk, dv} of ref_attention for the incoming gradient go, by the float64 reference.
TL ref_attention_grads(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& go, const Tensor& mask,
                       bool causal, double scale) {
  const std::vector<double> mv = additive_values(mask, scores_shape(q, k));
  const auto g = ampgrad::reference::attention_backward(
      q.to_vector<double>(), k.to_vector<double>(), v.to_vector<double>(), go.to_vector<double>(), ref_shape(q, k, v),
      {.scale = scale, .causal = causal, .mask = mv});
  return {from_vector(g.dq, q.sizes().vec()), from_vector(g.dk, k.sizes().vec()), from_vector(g.dv, v.sizes().vec())};
}

Tensor sdpa(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false, const Tensor& mask = Tensor(),
            double dropout_p = 0, std::optional<double> scale = std::nullopt) {
  AttentionOptions o;
  o.is_causal = causal;
  o.attn_mask = mask;
  o.dropout_p = dropout_p;
  o.scale = scale;
  return scaled_dot_product_attention(q, k, v, o);
}

// One problem of the sweeps: batch dims, lengths, head dims, and which mask.
enum class MaskKind { None, Causal, Bool, Float };
struct Problem {
  std::vector<int64_t> batch;
  int64_t Tq, Tk, D, Dv;
  MaskKind mask;
  std::string name() const {
    const char* m[] = {"none", "causal", "bool", "float"};
    return "Tq " + std::to_string(Tq) + " Tk " + std::to_string(Tk) + " D " + std::to_string(D) + " Dv " +
           std::to_string(Dv) + " mask " + m[int(mask)];
  }
};

std::vector<int64_t> with(std::vector<int64_t> batch, int64_t a, int64_t b) {
  batch.push_back(a);
  batch.push_back(b);
  return batch;
}

// A mask of the problem's kind: bool [Tq, Tk] (broadcast over the batch) with about a
// fifth hidden and each row keeping its first key, or float [last batch dim, Tq, Tk] with
// values in [-2, 2) and some -inf.
Tensor make_mask(const Problem& pb) {
  if (pb.mask == MaskKind::Bool) {
    Tensor keep = ge(rand({pb.Tq, pb.Tk}), 0.2);
    std::vector<bool> first(size_t(pb.Tq * pb.Tk), false);
    for (int64_t i = 0; i < pb.Tq; ++i) first[size_t(i * pb.Tk)] = true;
    return logical_or(keep, from_vector<bool>(first, {pb.Tq, pb.Tk}));
  }
  if (pb.mask == MaskKind::Float) {
    const int64_t h = pb.batch.empty() ? 1 : pb.batch.back();
    Tensor m = randf({h, pb.Tq, pb.Tk}) * 2.0;
    return where(ge(rand({h, pb.Tq, pb.Tk}), 0.1), m, -kInf);
  }
  return Tensor();
}

const std::vector<Problem>& problems() {
  static const std::vector<Problem> ps = {
      {{2, 3}, 5, 5, 4, 4, MaskKind::None},      {{2, 3}, 5, 5, 4, 4, MaskKind::Causal},
      {{2}, 64, 64, 8, 8, MaskKind::Causal},      {{1, 2}, 65, 65, 8, 5, MaskKind::Causal},
      {{2, 2}, 130, 130, 16, 16, MaskKind::Causal}, {{3}, 7, 19, 6, 3, MaskKind::None},
      {{3}, 19, 7, 6, 9, MaskKind::Causal},       {{2}, 70, 200, 8, 8, MaskKind::Bool},
      {{2, 2}, 33, 129, 5, 7, MaskKind::Float},   {{}, 1, 1, 3, 2, MaskKind::None},
      {{2, 2}, 100, 64, 8, 4, MaskKind::Bool},    {{1}, 129, 3, 4, 4, MaskKind::Causal},
      // keys transposed partly in 16 x 16 blocks (AVX-512), with rows and columns left over
      {{2}, 37, 37, 40, 24, MaskKind::Causal},
  };
  return ps;
}

TEST(Attention, MatchesFloat64LoopsAcrossShapesAndMasks) {
  manual_seed(1);
  for (const Problem& pb : problems()) {
    SCOPED_TRACE(pb.name());
    const Tensor q = randf(with(pb.batch, pb.Tq, pb.D), kFloat64), k = randf(with(pb.batch, pb.Tk, pb.D), kFloat64),
                 v = randf(with(pb.batch, pb.Tk, pb.Dv), kFloat64);
    const Tensor mask = make_mask(pb);
    const bool causal = pb.mask == MaskKind::Causal;
    const Tensor ref = ref_attention(q, k, v, mask, causal, 1 / std::sqrt(double(pb.D)));
    const Tensor got = sdpa(q, k, v, causal, mask);
    EXPECT_EQ(got.dtype(), kFloat64);
    EXPECT_TRUE(agt::allclose(got, ref, 1e-10, 1e-12));
    // float32 against the same float64 reference
    const Tensor got32 = sdpa(q.to(kFloat32), k.to(kFloat32), v.to(kFloat32), causal, mask);
    EXPECT_EQ(got32.dtype(), kFloat32);
    EXPECT_TRUE(agt::allclose(got32, ref, 1e-4, 1e-5));
    // strided inputs give the same values
    if (q.dim() >= 3)
      EXPECT_TRUE(agt::allclose(sdpa(agt::non_contiguous(q), agt::non_contiguous(k), agt::non_contiguous(v), causal, mask),
                                ref, 1e-10, 1e-12));
    // the float64 gradients against the reference's backward
    TL in;
    for (const Tensor& t : {q, k, v}) in.push_back(t.detach().requires_grad_());
    const Tensor go = randf(with(pb.batch, pb.Tq, pb.Dv), kFloat64);
    sdpa(in[0], in[1], in[2], causal, mask).backward(go);
    const TL want = ref_attention_grads(q, k, v, go, mask, causal, 1 / std::sqrt(double(pb.D)));
    for (size_t i = 0; i < 3; ++i)
      EXPECT_TRUE(agt::allclose(in[i].grad(), want[i], 1e-10, 1e-12)) << "gradient " << i << " (0-2: dq, dk, dv)";
  }
}

TEST(Attention, ScaleOptionAndGptLayoutViews) {
  manual_seed(2);
  const Tensor q = randf({2, 3, 9, 4}, kFloat64), k = randf({2, 3, 11, 4}, kFloat64), v = randf({2, 3, 11, 6}, kFloat64);
  EXPECT_TRUE(agt::allclose(sdpa(q, k, v, false, Tensor(), 0, 0.3), ref_attention(q, k, v, Tensor(), false, 0.3), 1e-10, 1e-12));
  EXPECT_TRUE(agt::allclose(sdpa(q, k, v, true, Tensor(), 0, -1.5), ref_attention(q, k, v, Tensor(), true, -1.5), 1e-10, 1e-12));
  // The GPT's heads: views [B, H, T, D] of a [B, T, 3C] tensor (no unit batch strides).
  const int64_t B = 2, T = 67, H = 4, D = 8, C = H * D;
  const Tensor qkv = randf({B, T, 3 * C});
  auto heads = [&](int64_t part) { return qkv.narrow(2, part * C, C).view({B, T, H, D}).transpose(1, 2); };
  const Tensor hq = heads(0), hk = heads(1), hv = heads(2);
  ASSERT_FALSE(hq.is_contiguous());
  EXPECT_TRUE(agt::allclose(sdpa(hq, hk, hv, true),
                            ref_attention(hq.contiguous(), hk.contiguous(), hv.contiguous(), Tensor(), true,
                                          1 / std::sqrt(double(D))),
                            1e-4, 1e-5));
}

// The output is laid out [batch'..., Tq, H, Dv] so that merging the heads is a view; the
// kernel writes the same values there as into a contiguous out.
TEST(Attention, OutputIsLaidOutByPositionThenHead) {
  manual_seed(3);
  const int64_t B = 2, H = 3, T = 37, D = 8, Dv = 6;
  for (DType dt : {kFloat32, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor q = randf({B, H, T, D}, dt), k = randf({B, H, T, D}, dt), v = randf({B, H, T, Dv}, dt);
    const Tensor y = sdpa(q, k, v, true);
    EXPECT_EQ(y.strides(), Shape({T * H * Dv, Dv, H * Dv, 1}));
    const Tensor merged = y.transpose(1, 2).reshape({B, T, H * Dv});
    EXPECT_EQ(merged.raw_data(), y.raw_data());  // a view, not a copy
    AttentionParams p;
    p.scale = 1 / std::sqrt(double(D));
    p.causal = true;
    const Tensor out = empty({B, H, T, Dv}, dt), lse = empty({B, H, T});
    cpu_backend().attention(q, k, v, Tensor(), p, out, lse);
    EXPECT_EQ(y.to_vector<double>(), out.to_vector<double>());
  }
  // a single batch dim, or one head: contiguous
  const Tensor q3 = randf({2, 5, 4});
  EXPECT_TRUE(sdpa(q3, q3, q3).is_contiguous());
  const Tensor q1 = randf({2, 1, 5, 4});
  EXPECT_TRUE(sdpa(q1, q1, q1).is_contiguous());
}

TEST(Attention, GradcheckFloat64) {
  manual_seed(3);
  for (const Problem& pb : std::vector<Problem>{{{2}, 5, 5, 3, 3, MaskKind::Causal},
                                                {{2, 1}, 4, 6, 3, 2, MaskKind::None},
                                                {{1}, 6, 4, 2, 3, MaskKind::Causal},
                                                {{1}, 5, 7, 3, 2, MaskKind::Causal},  // keys past every query
                                                {{2}, 5, 7, 3, 2, MaskKind::Bool},
                                                {{2}, 6, 5, 2, 3, MaskKind::Float},
                                                {{1}, 70, 70, 2, 2, MaskKind::Causal}}) {
    SCOPED_TRACE(pb.name());
    const Tensor q = agt::rand64(with(pb.batch, pb.Tq, pb.D)), k = agt::rand64(with(pb.batch, pb.Tk, pb.D)),
                 v = agt::rand64(with(pb.batch, pb.Tk, pb.Dv));
    const Tensor mask = make_mask(pb);
    const bool causal = pb.mask == MaskKind::Causal;
    EXPECT_TRUE(agt::gradcheck([&](const TL& in) { return sdpa(in[0], in[1], in[2], causal, mask); }, {q, k, v}));
  }
  // only some inputs requiring grad
  const Tensor q = agt::rand64({2, 4, 3}), k = agt::rand64({2, 5, 3}, -1, 1, false), v = agt::rand64({2, 5, 2});
  EXPECT_TRUE(agt::gradcheck([](const TL& in) { return sdpa(in[0], in[1], in[2], true); }, {q, k, v}));
  EXPECT_FALSE(k.grad().defined());
}

TEST(Attention, DtypeGridAgainstFloat64) {
  manual_seed(4);
  const Problem pb{{2, 2}, 70, 70, 16, 16, MaskKind::Causal};
  const Tensor q = randf(with(pb.batch, pb.Tq, pb.D), kFloat64), k = randf(with(pb.batch, pb.Tk, pb.D), kFloat64),
               v = randf(with(pb.batch, pb.Tk, pb.Dv), kFloat64), w = randf(with(pb.batch, pb.Tq, pb.Dv), kFloat64);
  auto run = [&](DType dt, bool causal, const Tensor& mask) {
    TL in = {q.to(dt).detach().requires_grad_(), k.to(dt).detach().requires_grad_(), v.to(dt).detach().requires_grad_()};
    const Tensor out = sdpa(in[0], in[1], in[2], causal, mask);
    sum(out.to(kFloat64) * w).backward();
    return TL{out, in[0].grad(), in[1].grad(), in[2].grad()};
  };
  const Tensor fmask = make_mask({{2}, 70, 70, 16, 16, MaskKind::Float});
  for (const bool causal : {true, false}) {
    const Tensor mask = causal ? Tensor() : fmask;
    const TL ref = run(kFloat64, causal, mask);
    for (DType dt : {kFloat32, kBFloat16, kFloat16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (causal ? " causal" : " float mask"));
      const TL got = run(dt, causal, mask);
      // 16-bit inputs are rounded before the float32 computation; gradients sum over 70 keys
      const agt::Tol t = dt == kFloat32 ? agt::Tol{1e-4, 1e-5} : dt == kBFloat16 ? agt::Tol{0.05, 0.05} : agt::Tol{8e-3, 8e-3};
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].dtype(), dt) << "output " << i;
        EXPECT_TRUE(agt::allclose(got[i], ref[i], t)) << "output " << i << " (0: out, 1-3: dq, dk, dv)";
      }
    }
  }
}

// Causal attention with more keys than queries in bfloat16: a query block's visible keys
// end before the last key, an odd count when the block has an odd number of queries. Read
// in place (CPUs with AVX512-BF16), that product was declined with no float rows to fall
// back on, and the kernel read through a null pointer.
TEST(Attention, Bfloat16CausalWithMoreKeysThanQueries) {
  manual_seed(11);
  for (const auto& [Tq, Tk] : std::vector<std::pair<int64_t, int64_t>>{{1, 2}, {3, 4}, {2, 5}, {5, 9}, {65, 70}}) {
    SCOPED_TRACE("Tq " + std::to_string(Tq) + ", Tk " + std::to_string(Tk));
    const Tensor q = randf({2, Tq, 3}, kFloat64), k = randf({2, Tk, 3}, kFloat64), v = randf({2, Tk, 2}, kFloat64),
                 w = randf({2, Tq, 2}, kFloat64);
    auto run = [&](DType dt) {
      TL in = {q.to(dt).detach().requires_grad_(), k.to(dt).detach().requires_grad_(), v.to(dt).detach().requires_grad_()};
      const Tensor out = sdpa(in[0], in[1], in[2], true);
      sum(out.to(kFloat64) * w).backward();
      return TL{out, in[0].grad(), in[1].grad(), in[2].grad()};
    };
    const TL ref = run(kFloat64), got = run(kBFloat16);
    for (size_t i = 0; i < got.size(); ++i)  // as in DtypeGridAgainstFloat64
      EXPECT_TRUE(agt::allclose(got[i], ref[i], 0.05, 0.05)) << "output " << i << " (0: out, 1-3: dq, dk, dv)";
  }
}

TEST(Attention, RowsThatSeeNoKeyGiveZeroOutputAndGradient) {
  manual_seed(5);
  const int64_t Tq = 6, Tk = 70, D = 4;
  std::vector<bool> allowed(size_t(Tq * Tk), true);
  for (int64_t j = 0; j < Tk; ++j) allowed[size_t(2 * Tk + j)] = false;  // row 2 sees nothing
  const Tensor bmask = from_vector<bool>(allowed, {Tq, Tk});
  const Tensor fmask = where(bmask, full({Tq, Tk}, 0.5), -kInf);  // the same as a float mask
  for (const Tensor& mask : {bmask, fmask})
    for (DType dt : {kFloat64, kFloat32, kBFloat16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (mask.dtype() == kBool ? " bool" : " float"));
      const Tensor q = randf({2, Tq, D}, dt).requires_grad_(), k = randf({2, Tk, D}, dt).requires_grad_(),
                   v = randf({2, Tk, D}, dt).requires_grad_();
      const Tensor out = sdpa(q, k, v, false, mask);
      sum(out * randf({2, Tq, D}, dt)).backward();
      EXPECT_TRUE(agt::allclose(out.narrow(1, 2, 1), zeros({2, 1, D}), 0, 0));
      EXPECT_TRUE(agt::allclose(q.grad().narrow(1, 2, 1), zeros({2, 1, D}), 0, 0));
      for (const Tensor& t : {out, q.grad(), k.grad(), v.grad()})
        for (double x : t.to_vector<double>()) ASSERT_FALSE(std::isnan(x));
      // the other rows are untouched by the empty one
      EXPECT_TRUE(agt::allclose(out.to(kFloat64).narrow(1, 3, 3),
                                ref_attention(q.to(kFloat64), k.to(kFloat64), v.to(kFloat64), mask, false, 0.5)
                                    .narrow(1, 3, 3),
                                agt::tol_for(dt)));
    }
  // no key at all (Tk = 0): every row is empty
  const Tensor q = randf({2, 3, 4}).requires_grad_();
  const Tensor out = sdpa(q, randf({2, 0, 4}), randf({2, 0, 5}));
  EXPECT_TRUE(agt::allclose(out, zeros({2, 3, 5}), 0, 0));
  sum(out).backward();
  EXPECT_TRUE(agt::allclose(q.grad(), zeros({2, 3, 4}), 0, 0));
  // empty batch and no queries
  EXPECT_EQ(sdpa(randf({0, 3, 4}), randf({0, 5, 4}), randf({0, 5, 2})).sizes(), (std::vector<int64_t>{0, 3, 2}));
  EXPECT_EQ(sdpa(randf({2, 0, 4}), randf({2, 5, 4}), randf({2, 5, 2}), true).sizes(), (std::vector<int64_t>{2, 0, 2}));
}

TEST(Attention, ErrorMessagesNameTheValues) {
  const Tensor q = randf({2, 3, 5, 4}), k = randf({2, 3, 6, 4}), v = randf({2, 3, 6, 7});
  EXPECT_AG_ERROR(sdpa(q, randf({2, 3, 6, 5}), v),
                  "[scaled_dot_product_attention] key's last dim 5 must equal query's 4 (shapes [2, 3, 5, 4] and "
                  "[2, 3, 6, 5])");
  EXPECT_AG_ERROR(sdpa(q, k, randf({2, 3, 7, 7})), "value has 7 positions but key has 6");
  EXPECT_AG_ERROR(sdpa(q, randf({2, 4, 6, 4}), randf({2, 4, 6, 7})), "must have the same batch dims, got shapes [2, 3, 5, 4], [2, 4, 6, 4]");
  EXPECT_AG_ERROR(sdpa(q, randf({3, 6, 4}), v), "must have one rank of at least 2");
  EXPECT_AG_ERROR(sdpa(randf({4}), randf({4}), randf({4})), "must have one rank of at least 2");
  EXPECT_AG_ERROR(sdpa(q.to(kInt64), k.to(kInt64), v.to(kInt64)), "query must be floating, got int64");
  EXPECT_AG_ERROR(sdpa(q, k.to(kFloat64), v), "query, key and value must share a dtype, got float32, float64 and float32");
  EXPECT_AG_ERROR(sdpa(q, k, Tensor()), "value");
  EXPECT_AG_ERROR(sdpa(q, k, v, true, ones({5, 6}, kBool)), "is_causal and attn_mask cannot both be set");
  EXPECT_AG_ERROR(sdpa(q, k, v, false, ones({5, 5}, kBool)),
                  "attn_mask of shape [5, 5] does not broadcast to the scores' shape [2, 3, 5, 6]");
  EXPECT_AG_ERROR(sdpa(q, k, v, false, ones({4, 3, 5, 6}, kBool)), "does not broadcast to the scores' shape");
  EXPECT_AG_ERROR(sdpa(q, k, v, false, ones({1, 2, 3, 5, 6}, kBool)), "does not broadcast");
  EXPECT_AG_ERROR(sdpa(q, k, v, false, ones({5, 6}, kInt64)), "attn_mask must be bool or floating, got int64");
  EXPECT_AG_ERROR(sdpa(q, k, v, false, zeros({5, 6}).requires_grad_()), "attn_mask requires grad");
  EXPECT_AG_ERROR(sdpa(q, k, v, false, Tensor(), 1.0), "dropout_p must be in [0, 1), got 1");
  EXPECT_AG_ERROR(sdpa(q, k, v, false, Tensor(), -0.25), "dropout_p must be in [0, 1), got -0.25");
  EXPECT_AG_ERROR(sdpa(q, k, v, false, Tensor(), std::nan("")), "dropout_p must be in [0, 1), got nan");
  EXPECT_AG_ERROR(sdpa(q, k, v, false, Tensor(), 0, kInf), "scale must be finite, got inf");
  EXPECT_AG_ERROR(sdpa(q, k, v, false, Tensor(), 0, std::nan("")), "scale must be finite, got nan");
  // a mask that requires grad is fine without grad mode, and a broadcastable one of lower rank
  NoGradGuard no_grad;
  EXPECT_EQ(sdpa(q, k, v, false, zeros({6}).requires_grad_()).sizes(), (std::vector<int64_t>{2, 3, 5, 7}));
}

TEST(Attention, DropoutIsReproducibleKeepsTheRightShareAndFollowsThePhiloxRule) {
  // q = 0 makes every probability 1 / Tk, and v = I (Dv = Tk) puts probability (i, j) times
  // its dropout factor at out[i, j]: the output shows the mask.
  const int64_t N = 4, T = 80;
  const double p = 0.3;
  const Tensor q = zeros({N, T, 8}), k = randf({N, T, 8}), v = eye(T).expand({N, T, T});
  manual_seed(11);
  const auto state = generator_state();
  const Tensor a = sdpa(q, k, v, false, Tensor(), p);
  EXPECT_EQ(generator_state().second, state.second + uint64_t(N * T * T)) << "one counter per probability";
  manual_seed(11);
  EXPECT_TRUE(agt::allclose(sdpa(q, k, v, false, Tensor(), p), a, 0, 0)) << "same seed, same mask";
  EXPECT_FALSE(agt::allclose(sdpa(q, k, v, false, Tensor(), p), a, 0, 0)) << "the next call draws anew";
  const auto factors = (a * double(T)).to_vector<double>();
  int64_t kept = 0;
  for (double f : factors) {
    EXPECT_TRUE(std::fabs(f) < 1e-6 || std::fabs(f - 1 / (1 - p)) < 1e-5) << f;
    kept += f > 0.5;
  }
  const double share = double(kept) / double(factors.size());  // 25600 draws: sd 0.003
  EXPECT_NEAR(share, 1 - p, 0.015);
  // The documented rule: probability (b, i, j) is kept when the float64 uniform of counter
  // offset + (b * Tq + i) * Tk + j is below 1 - p, which is rand's float64 draw.
  set_generator_state(state.first, state.second);
  const auto u = rand({N, T, T}, kFloat64).to_vector<double>();
  for (size_t i = 0; i < u.size(); ++i) ASSERT_EQ(factors[i] > 0.5, u[i] < 1 - p) << "probability " << i;
  // the values against the float64 loops with that mask
  std::vector<double> z(u.size());
  for (size_t i = 0; i < u.size(); ++i) z[i] = u[i] < 1 - p ? 1 / (1 - p) : 0.0;
  const Tensor q2 = randf({N, T, 8});
  set_generator_state(state.first, state.second);
  EXPECT_TRUE(agt::allclose(sdpa(q2, k, v, true, Tensor(), p), ref_attention(q2, k, v, Tensor(), true, 1 / std::sqrt(8.0), z),
                            1e-5, 1e-6));
}

TEST(Attention, DropoutBackwardUsesTheForwardMask) {
  // The same seed before each call of f gives the same mask, so finite differences see one
  // function; a backward with another mask would fail the check.
  const Tensor q = agt::rand64({2, 70, 3}), k = agt::rand64({2, 70, 3}), v = agt::rand64({2, 70, 2});
  EXPECT_TRUE(agt::gradcheck(
      [](const TL& in) {
        manual_seed(21);
        return sdpa(in[0], in[1], in[2], true, Tensor(), 0.4);
      },
      {q, k, v}));
}

// A backend that runs Backend's composed attention (what CUDA runs) on the CPU's kernels.
class ComposedCpu final : public Backend {
 public:
  DeviceType device_type() const override { return DeviceType::CPU; }
  Allocation allocate(size_t n, Stream s) override { return cpu().allocate(n, s); }
  void deallocate(void* p, size_t n, Stream s) override { cpu().deallocate(p, n, s); }
  void copy_bytes(void* dst, Device dd, const void* src, Device sd, size_t n, Stream s, bool nb) override {
    ++host_copies;
    cpu().copy_bytes(dst, dd, src, sd, n, s, nb);
  }
  int host_copies = 0;  // the causal mask's copies
  void copy(const Tensor& src, const Tensor& dst) override { cpu().copy(src, dst); }
  void fill(const Tensor& dst, double value) override { cpu().fill(dst, value); }
  void unary(UnaryOp op, const Tensor& x, const Tensor& out, UnaryParams p) override { cpu().unary(op, x, out, p); }
  void binary(BinaryOp op, const Operand& a, const Operand& b, const Tensor& out) override { cpu().binary(op, a, b, out); }
  void compare(CompareOp op, const Operand& a, const Operand& b, const Tensor& out) override {
    cpu().compare(op, a, b, out);
  }
  void where(const Tensor& c, const Operand& a, const Operand& b, const Tensor& out) override { cpu().where(c, a, b, out); }
  void reduce(ReduceOp op, const Tensor& x, const Shape& dims, const Tensor& out, ReduceParams p) override {
    cpu().reduce(op, x, dims, out, p);
  }
  void uniform(const Tensor& out, double lo, double hi, uint64_t seed, uint64_t offset) override {
    cpu().uniform(out, lo, hi, seed, offset);
  }
  void matmul(const Tensor& a, const Tensor& w, const Tensor& out) override { cpu().matmul(a, w, out); }
  void softmax_backward(const Tensor& g, const Tensor& y, int64_t dim, bool log, const Tensor& gi) override {
    cpu().softmax_backward(g, y, dim, log, gi);
  }
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const AttentionParams& p,
                 const Tensor& out, const Tensor& lse) override {
    attention_composed(q, k, v, mask, p, out, lse);
  }
  void attention_backward(const Tensor& go, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                          const Tensor& out, const Tensor& lse, const AttentionParams& p, const Tensor& gq,
                          const Tensor& gk, const Tensor& gv) override {
    attention_backward_composed(go, q, k, v, mask, out, lse, p, gq, gk, gv);
  }

 private:
  static Backend& cpu() { return cpu_backend(); }
};

TEST(Attention, ComposedFormMatchesTheCpuKernel) {
  manual_seed(6);
  ComposedCpu composed;
  Backend& fused = cpu_backend();
  const int64_t B = 2, H = 3, Tq = 70, Tk = 67, D = 8, Dv = 5;
  // a float mask over [H, Tq, Tk] broadcast over B, with row 4 of head 1 hidden entirely
  std::vector<double> mv = randf({H, Tq, Tk}, kFloat64).to_vector<double>();
  for (int64_t j = 0; j < Tk; ++j) mv[size_t((1 * Tq + 4) * Tk + j)] = -kInf;
  for (DType dt : {kFloat32, kFloat64, kBFloat16}) {
    const DType acc = dt == kFloat64 ? kFloat64 : kFloat32;
    const Tensor mask = from_vector(mv, {H, Tq, Tk}).to(acc).expand({B, H, Tq, Tk});
    const Tensor q = randf({B, H, Tq, D}, dt), k = randf({B, H, Tk, D}, dt), v = randf({B, H, Tk, Dv}, dt),
                 go = randf({B, H, Tq, Dv}, dt);
    for (int variant = 0; variant < 3; ++variant) {
      // 0: the mask; 1: causal; 2: causal with dropout
      SCOPED_TRACE(std::string(dtype_name(dt)) + " variant " + std::to_string(variant));
      AttentionParams p;
      p.scale = 0.35;
      p.causal = variant > 0;
      p.dropout_p = variant == 2 ? 0.25 : 0;
      p.seed = 99;
      p.offset = 12345;
      const Tensor m = variant == 0 ? mask : Tensor();
      TL res[2];
      Backend* bes[2] = {&fused, &composed};
      for (int i = 0; i < 2; ++i) {
        // the composed form gets the op's own layouts: [B, Tq, H, Dv] memory, a strided out,
        // and gradients laid out by position then head, as those of a split projection are
        auto layout = [&](int64_t T, int64_t W) {
          return i == 0 ? empty({B, H, T, W}, dt) : empty({B, T, H, W}, dt).transpose(1, 2);
        };
        Tensor out = layout(Tq, Dv), lse = empty({B, H, Tq}, acc);
        Tensor gq = layout(Tq, D), gk = layout(Tk, D), gv = layout(Tk, Dv);
        bes[i]->attention(q, k, v, m, p, out, lse);
        bes[i]->attention_backward(go, q, k, v, m, out, lse, p, gq, gk, gv);
        res[i] = {out, lse, gq, gk, gv};
      }
      const agt::Tol t = dt == kFloat64 ? agt::Tol{1e-10, 1e-12} : dt == kFloat32 ? agt::Tol{1e-4, 1e-5} : agt::Tol{0.03, 0.03};
      for (size_t i = 0; i < res[0].size(); ++i)
        EXPECT_TRUE(agt::allclose(res[1][i], res[0][i], t)) << "result " << i << " (out, lse, dq, dk, dv)";
      if (variant == 0) EXPECT_EQ(res[1][1].narrow(1, 1, 1).narrow(2, 4, 1).to_vector<double>()[0], kInf);
    }
  }
  // The causal mask is made once per device and dtype (and when a longer one is needed), so
  // a steady state on an asynchronous device copies nothing from the host.
  composed.host_copies = 0;
  AttentionParams p;
  p.causal = true;
  const Tensor q = randf({1, 100, 4}), out = empty({1, 100, 4}), lse = empty({1, 100});
  composed.attention(q, q, q, Tensor(), p, out, lse);
  EXPECT_EQ(composed.host_copies, 0);
}

// Rows a multiple of 1 KiB apart alias in the L1 cache, so the kernel copies such operands
// (and lays out its transposed keys and values) with a cache line of padding per row: the
// heads of a [B, T, 3C] projection with C = 256 (rows 3 KiB apart) and 256 keys (k^T and
// v^T rows of 256 floats). The values are those of the composed form on the same views.
TEST(Attention, RowsThatAliasInTheCacheArePaddedWithTheSameValues) {
  manual_seed(8);
  ComposedCpu composed;
  Backend& fused = cpu_backend();
  const int64_t B = 1, T = 256, H = 8, D = 32, C = H * D;
  for (DType dt : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor qkv = randf({B, T, 3 * C}, dt), go = randf({B, H, T, D}, dt);
    auto heads = [&](int64_t part) { return qkv.narrow(2, part * C, C).view({B, T, H, D}).transpose(1, 2); };
    const Tensor q = heads(0), k = heads(1), v = heads(2);
    ASSERT_EQ(q.stride(2) * int64_t(itemsize(dt)) % 1024, 0);
    AttentionParams p;
    p.scale = 1 / std::sqrt(double(D));
    p.causal = true;
    TL res[2];
    Backend* bes[2] = {&fused, &composed};
    for (int i = 0; i < 2; ++i) {
      Tensor out = empty({B, H, T, D}, dt), lse = empty({B, H, T}, dt);
      Tensor gq = empty({B, H, T, D}, dt), gk = empty({B, H, T, D}, dt), gv = empty({B, H, T, D}, dt);
      bes[i]->attention(q, k, v, Tensor(), p, out, lse);
      bes[i]->attention_backward(go, q, k, v, Tensor(), out, lse, p, gq, gk, gv);
      res[i] = {out, lse, gq, gk, gv};
    }
    const agt::Tol t = dt == kFloat64 ? agt::Tol{1e-10, 1e-12} : agt::Tol{1e-4, 1e-5};
    for (size_t i = 0; i < res[0].size(); ++i)
      EXPECT_TRUE(agt::allclose(res[1][i], res[0][i], t)) << "result " << i << " (out, lse, dq, dk, dv)";
  }
}

// q, k and v viewed as heads of one [B, T, 3C] projection: their gradients are slices of
// one buffer laid out like it, so split's backward joins them without a copy, and the
// values are those of the same attention on contiguous copies of q, k and v.
TEST(Attention, GradientsOfASplitProjectionAreJoinedWithoutACopy) {
  manual_seed(7);
  const int64_t B = 2, T = 37, H = 3, D = 8, C = H * D;
  for (DType dt : {kFloat32, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor g = randf({B, T, C}, dt);
    Tensor x_grad[2];
    for (int contiguous_heads = 0; contiguous_heads < 2; ++contiguous_heads) {
      manual_seed(11);  // the same x both times
      const Tensor x = randf({B, T, 3 * C}).to(dt).requires_grad_(true);
      const Tensor qkv = x * 2.0;
      std::vector<Tensor> parts = qkv.split(C, 2);
      Tensor part_grad[3], qkv_grad;
      for (int i = 0; i < 3; ++i)
        parts[size_t(i)].register_hook([&part_grad, i](const Tensor& pg) {
          part_grad[i] = pg;
          return Tensor();
        });
      qkv.register_hook([&qkv_grad](const Tensor& qg) {
        qkv_grad = qg;
        return Tensor();
      });
      auto heads = [&](const Tensor& t) {
        const Tensor h = t.view({B, T, H, D}).transpose(1, 2);
        return contiguous_heads ? h.contiguous() : h;
      };
      const Tensor y = sdpa(heads(parts[0]), heads(parts[1]), heads(parts[2]), true);
      y.transpose(1, 2).reshape({B, T, C}).backward(g);
      x_grad[contiguous_heads] = x.grad();
      if (!contiguous_heads) {
        for (int i = 0; i < 3; ++i) EXPECT_TRUE(part_grad[i].is_alias_of(part_grad[0])) << "piece " << i;
        EXPECT_TRUE(qkv_grad.is_alias_of(part_grad[0]));  // joined, not concatenated
        EXPECT_TRUE(qkv_grad.is_contiguous());
      } else {
        EXPECT_FALSE(qkv_grad.is_alias_of(part_grad[0]));  // separate gradients: a cat
      }
    }
    EXPECT_EQ(x_grad[0].to_vector<double>(), x_grad[1].to_vector<double>());
  }
}

// CausalSelfAttention's former forward: matmul, scale, where-mask, softmax, (dropout), matmul.
Tensor five_op_attention(nn::CausalSelfAttention& attn, const Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = attn.embed_dim, H = attn.num_heads, D = C / H;
  auto parts = attn.qkv->forward(x).split(C, 2);
  auto heads = [&](const Tensor& t) { return t.view({B, T, H, D}).transpose(1, 2); };
  Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  Tensor att = matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(D)));
  att = softmax(where(attn.mask.narrow(0, 0, T).narrow(1, 0, T), att, -kInf), -1);
  Tensor y = matmul(att, v).transpose(1, 2).reshape({B, T, C});
  return attn.proj->forward(y);
}

TEST(Attention, CausalSelfAttentionMatchesTheFiveOpFormula) {
  manual_seed(7);
  const int64_t B = 3, T = 70, C = 32, H = 4;
  nn::CausalSelfAttention attn(C, H, 96);
  const Tensor x = randf({B, T, C}).requires_grad_(), x2 = x.detach().requires_grad_();
  const Tensor w = randf({B, T, C});
  const Tensor y = attn.forward(x);
  sum(y * w).backward();
  const Tensor gw = attn.qkv->weight.grad().clone();
  attn.zero_grad();
  const Tensor y5 = five_op_attention(attn, x2);
  sum(y5 * w).backward();
  EXPECT_TRUE(agt::allclose(y, y5, 1e-5, 1e-6));
  EXPECT_TRUE(agt::allclose(x.grad(), x2.grad(), 1e-4, 1e-6));
  EXPECT_TRUE(agt::allclose(gw, attn.qkv->weight.grad(), 1e-4, 1e-6));
  // the state_dict keys stay as they were: checkpoints still load
  std::vector<std::string> keys;
  for (const auto& kv : attn.state_dict()) keys.push_back(kv.first);
  EXPECT_EQ(keys, (std::vector<std::string>{"mask", "proj.bias", "proj.weight", "qkv.bias", "qkv.weight"}));
  // dropout: active in training mode only
  nn::CausalSelfAttention dropping(C, H, 96, 0.5);
  dropping.load_state_dict(attn.state_dict());
  dropping.eval();
  EXPECT_TRUE(agt::allclose(dropping.forward(x), y, 0, 0));
  dropping.train();
  manual_seed(8);
  const Tensor d1 = dropping.forward(x);
  manual_seed(8);
  EXPECT_TRUE(agt::allclose(dropping.forward(x), d1, 0, 0));
  EXPECT_FALSE(agt::allclose(d1, y, 1e-3, 1e-3));
}

}  // namespace

// bfloat16 inputs with unit-stride rows are read in place (their products on bfloat16 pairs
// packed straight from them); with strided rows they are widened to float first. The
// products see the same bfloat16 values either way, so both give the same bits: causal
// (stripes), a float mask and dropout, odd lengths and head sizes.
TEST(Attention, Bfloat16ReadInPlaceAndWidenedAgreeBitForBit) {
  manual_seed(9);
  for (const bool causal : {true, false}) {
    const int64_t B = 2, H = 3, Tq = causal ? 77 : 45, Tk = causal ? 77 : 70, D = 24, Dv = 33;
    const Tensor q = randf({B, H, Tq, D}, kBFloat16), k = randf({B, H, Tk, D}, kBFloat16),
                 v = randf({B, H, Tk, Dv}, kBFloat16), go = randf({B, H, Tq, Dv}, kBFloat16);
    const Tensor mask = causal ? Tensor() : randf({Tq, Tk}, kFloat32);
    TL res[2];
    for (int strided = 0; strided < 2; ++strided) {
      // the same values, stored [.., C, R] and viewed [.., R, C]: rows with a stride of one column
      const auto lay = [&](const Tensor& t) {
        return (strided ? t.transpose(-1, -2).contiguous().transpose(-1, -2) : t.clone()).requires_grad_();
      };
      const Tensor qi = lay(q), ki = lay(k), vi = lay(v);
      ASSERT_EQ(qi.stride(-1) != 1, strided == 1);
      manual_seed(3);
      const Tensor out = sdpa(qi, ki, vi, causal, mask, 0.2);
      out.backward(go);
      res[strided] = {out, qi.grad(), ki.grad(), vi.grad()};
    }
    for (size_t i = 0; i < 4; ++i)
      EXPECT_EQ(res[0][i].to_vector<double>(), res[1][i].to_vector<double>())
          << (causal ? "causal" : "float mask") << ", output " << i << " (0: out, 1-3: dq, dk, dv)";
  }
}

// ---- each instruction-set variant -----------------------------------------------------
// The row work runs in three variants (baseline, AVX2 with FMA, AVX-512), the float products
// on tile_gemm's AVX-512 kernel from the level avx512 and on its general path (Eigen or
// oneDNN's sgemm) below, the key and value transposes through AVX-512 registers or element
// by element, and bfloat16 inputs multiply in bfloat16 pairs from the level avx512_bf16 (AMX
// tiles at amx) and widened to float below. Each level this CPU runs is forced in turn.

namespace {

class AttentionEachIsa : public agt::EachKernelIsa {};

// {out, dq, dk, dv} of attention on q, k, v and the incoming gradient go (float64, rounded
// to dt first).
TL forward_backward(const TL& qkv, const Tensor& go, DType dt, bool causal, const Tensor& mask) {
  TL in;
  for (const Tensor& t : qkv) in.push_back(t.to(dt).detach().requires_grad_());
  const Tensor out = sdpa(in[0], in[1], in[2], causal, mask);
  out.backward(go.to(dt));
  return {out.detach(), in[0].grad(), in[1].grad(), in[2].grad()};
}

// Runs problem pb in dt at the level in force against float64 on the same rounded inputs:
// the output against the loops (ref_attention), the gradients against the float64 kernel
// (which GradcheckFloat64 holds to finite differences). float32 within the tolerance of the
// float64 sweeps above; bfloat16 within its own (tol_for), doubled for the gradients, whose
// products take the probabilities and score gradients rounded to bfloat16. Below the level
// avx512_bf16 a bfloat16 output must be the float32 kernel's on the widened inputs, rounded
// (the bfloat16 products are off); from it, not (they ran).
void expect_matches_float64(const Problem& pb, DType dt) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " " << pb.name() << " at " << hw::kernel_isa());
  const TL qkv = {randf(with(pb.batch, pb.Tq, pb.D), kFloat64), randf(with(pb.batch, pb.Tk, pb.D), kFloat64),
                  randf(with(pb.batch, pb.Tk, pb.Dv), kFloat64)};
  const Tensor go = randf(with(pb.batch, pb.Tq, pb.Dv), kFloat64);
  const Tensor mask = make_mask(pb);
  const bool causal = pb.mask == MaskKind::Causal;
  const TL got = forward_backward(qkv, go, dt, causal, mask);
  TL rounded;
  for (const Tensor& t : qkv) rounded.push_back(t.to(dt).to(kFloat64));
  const TL ref = forward_backward(rounded, go.to(dt).to(kFloat64), kFloat64, causal, mask);
  const agt::Tol t = dt == kFloat32 ? agt::Tol{1e-4, 1e-5} : agt::tol_for(dt);
  EXPECT_TRUE(agt::allclose(got[0], ref_attention(rounded[0], rounded[1], rounded[2], mask, causal,
                                                  1 / std::sqrt(double(pb.D))),
                            t))
      << "output";
  const agt::Tol tg = dt == kFloat32 ? t : agt::Tol{2 * t.rtol, 2 * t.atol};
  for (size_t i = 1; i < got.size(); ++i)
    EXPECT_TRUE(agt::allclose(got[i], ref[i], tg)) << "gradient " << i << " (1-3: dq, dk, dv)";
  if (dt == kBFloat16) {
    const Tensor widened = sdpa(rounded[0].to(kFloat32), rounded[1].to(kFloat32), rounded[2].to(kFloat32), causal, mask);
    const bool bf16_products = agt::kernel_isa_at_least("avx512_bf16");
    EXPECT_EQ(agt::same_bits(got[0], widened.to(kBFloat16)), !bf16_products)
        << (bf16_products ? "the bfloat16 products did not run" : "the bfloat16 products ran below avx512_bf16");
  }
}

}  // namespace

// Causal stripes across 64-wide tiles and a tail tile (70), keys transposed in 16 x 16
// blocks with rows and columns left over (D 40), bool and float masks, Tq != Tk, odd sizes.
TEST_P(AttentionEachIsa, Float32AndBfloat16AgainstFloat64) {
  manual_seed(84);
  for (const Problem& pb : std::vector<Problem>{{{2}, 70, 70, 40, 24, MaskKind::Causal},
                                                {{1, 2}, 65, 65, 8, 5, MaskKind::Bool},
                                                {{2, 2}, 33, 129, 5, 7, MaskKind::Float},
                                                {{3}, 19, 7, 6, 9, MaskKind::None}})
    for (DType dt : {kFloat32, kBFloat16}) expect_matches_float64(pb, dt);
}

// Head sizes over 256: bfloat16 inputs are not read in place then (direct_bf16), and the
// products whose inner dimension is the head size (q k^T, dO v^T) exceed what
// tile_gemm_bf16 and tile_gemm's small kernel take, so they run on tile_gemm's general path
// in float while the others stay on bfloat16 pairs; 256 itself is the last size read in place.
TEST_P(AttentionEachIsa, HeadSizesOver256AgainstFloat64) {
  manual_seed(85);
  for (const Problem& pb : std::vector<Problem>{{{1}, 70, 70, 256, 260, MaskKind::Causal},
                                                {{2}, 70, 70, 264, 264, MaskKind::Causal},
                                                {{1, 2}, 40, 66, 320, 200, MaskKind::Float},
                                                {{1}, 33, 65, 512, 300, MaskKind::None}})
    for (DType dt : {kBFloat16, kFloat32}) expect_matches_float64(pb, dt);
}

AGT_EACH_KERNEL_ISA(AttentionEachIsa);
