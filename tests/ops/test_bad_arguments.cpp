// The bad-argument sweep: every public op and factory called with what a caller gets wrong
// (wrong ranks, mismatched shapes, dims out of range both ways, out-of-range and negative
// indices, undefined and empty tensors, huge sizes, wrong dtypes, overlapping views written
// in place). Each bad call must throw ag::Error whose message starts with the op's name;
// none may crash (the sanitizer build runs this too), throw anything else, or succeed.
// Empty tensors are often valid: those calls may succeed, or refuse naming the op.
#include "support/testing.h"

#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

using namespace ag;

namespace {

enum class Expect { Refuse, RefuseOrSucceed };

struct Case {
  std::string op;    // the name the error must start with: "[op] "
  std::string what;  // the bad input, for the failure list
  Expect expect;
  std::function<void()> call;
};

class Sweep {
 public:
  void refuse(const std::string& op, const std::string& what, std::function<void()> f) {
    cases_.push_back({op, what, Expect::Refuse, std::move(f)});
  }
  void empty_ok(const std::string& op, const std::string& what, std::function<void()> f) {
    cases_.push_back({op, what, Expect::RefuseOrSucceed, std::move(f)});
  }
  // Runs every case; returns the failures, one line each.
  std::vector<std::string> run() const {
    std::vector<std::string> failures;
    for (const Case& c : cases_) {
      const std::string head = "[" + c.op + "] ";
      std::string outcome;
      try {
        c.call();
        if (c.expect == Expect::Refuse) outcome = "succeeded";
      } catch (const Error& e) {
        const std::string msg = e.what();
        if (msg.rfind(head, 0) != 0) outcome = "ag::Error not naming the op: " + msg;
      } catch (const std::exception& e) {
        outcome = std::string("a non-ag exception: ") + e.what();
      } catch (...) {
        outcome = "an unknown exception";
      }
      if (!outcome.empty()) failures.push_back(c.op + " with " + c.what + ": " + outcome);
    }
    return failures;
  }
  size_t size() const { return cases_.size(); }

 private:
  std::vector<Case> cases_;
};

constexpr int64_t kHuge = int64_t(1) << 62;

Tensor f32(std::vector<int64_t> shape) { return randn(shape); }
Tensor i64(std::vector<int64_t> values) { return from_vector<int64_t>(values, {int64_t(values.size())}); }

// Ops of one tensor that accept any shape and floating dtype.
const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>>& unary_ops() {
  static const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> ops = {
      {"neg", [](const Tensor& x) { return neg(x); }},
      {"abs", [](const Tensor& x) { return abs(x); }},
      {"sign", [](const Tensor& x) { return sign(x); }},
      {"square", [](const Tensor& x) { return square(x); }},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }},
      {"reciprocal", [](const Tensor& x) { return reciprocal(x); }},
      {"exp", [](const Tensor& x) { return exp(x); }},
      {"log", [](const Tensor& x) { return log(x); }},
      {"log1p", [](const Tensor& x) { return log1p(x); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
      {"softplus", [](const Tensor& x) { return softplus(x); }},
      {"relu", [](const Tensor& x) { return relu(x); }},
      {"gelu", [](const Tensor& x) { return gelu(x); }},
      {"silu", [](const Tensor& x) { return silu(x); }},
      {"clamp", [](const Tensor& x) { return clamp(x, -1.0, 1.0); }},
      {"contiguous", [](const Tensor& x) { return contiguous(x); }},
      {"clone", [](const Tensor& x) { return clone(x); }},
      {"pow", [](const Tensor& x) { return pow(x, 2.0); }},
      {"sum", [](const Tensor& x) { return sum(x); }},
      {"mean", [](const Tensor& x) { return mean(x); }},
  };
  return ops;
}

using Binary = std::function<Tensor(const Tensor&, const Tensor&)>;
const std::vector<std::pair<std::string, Binary>>& binary_ops() {
  static const std::vector<std::pair<std::string, Binary>> ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }},
      {"eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); }},
      {"ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); }},
      {"lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); }},
      {"le", [](const Tensor& a, const Tensor& b) { return le(a, b); }},
      {"gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); }},
      {"ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); }},
      {"logical_and", [](const Tensor& a, const Tensor& b) { return logical_and(a, b); }},
      {"logical_or", [](const Tensor& a, const Tensor& b) { return logical_or(a, b); }},
      {"matmul", [](const Tensor& a, const Tensor& b) { return matmul(a, b); }},
      {"mse_loss", [](const Tensor& a, const Tensor& b) { return mse_loss(a, b); }},
      {"binary_cross_entropy_with_logits",
       [](const Tensor& a, const Tensor& b) { return binary_cross_entropy_with_logits(a, b); }},
  };
  return ops;
}

using DimOp = std::function<Tensor(const Tensor&, int64_t)>;
const std::vector<std::pair<std::string, DimOp>>& dim_ops() {
  static const std::vector<std::pair<std::string, DimOp>> ops = {
      {"sum", [](const Tensor& x, int64_t d) { return sum(x, {d}); }},
      {"mean", [](const Tensor& x, int64_t d) { return mean(x, {d}); }},
      {"var", [](const Tensor& x, int64_t d) { return var(x, {d}); }},
      {"std", [](const Tensor& x, int64_t d) { return ag::std(x, {d}); }},
      {"amax", [](const Tensor& x, int64_t d) { return amax(x, {d}); }},
      {"amin", [](const Tensor& x, int64_t d) { return amin(x, {d}); }},
      {"max", [](const Tensor& x, int64_t d) { return max(x, d).first; }},
      {"min", [](const Tensor& x, int64_t d) { return min(x, d).first; }},
      {"argmax", [](const Tensor& x, int64_t d) { return argmax(x, d); }},
      {"argmin", [](const Tensor& x, int64_t d) { return argmin(x, d); }},
      {"logsumexp", [](const Tensor& x, int64_t d) { return logsumexp(x, {d}); }},
      {"norm", [](const Tensor& x, int64_t d) { return norm(x, 2, {d}); }},
      {"softmax", [](const Tensor& x, int64_t d) { return softmax(x, d); }},
      {"log_softmax", [](const Tensor& x, int64_t d) { return log_softmax(x, d); }},
      {"transpose", [](const Tensor& x, int64_t d) { return transpose(x, d, 0); }},
      {"narrow", [](const Tensor& x, int64_t d) { return narrow(x, d, 0, 1); }},
      {"select", [](const Tensor& x, int64_t d) { return select(x, d, 0); }},
      {"squeeze", [](const Tensor& x, int64_t d) { return squeeze(x, d); }},
      {"flatten", [](const Tensor& x, int64_t d) { return flatten(x, d); }},
      {"cat", [](const Tensor& x, int64_t d) { return cat({x, x}, d); }},
      {"split", [](const Tensor& x, int64_t d) { return split(x, 1, d)[0]; }},
      {"chunk", [](const Tensor& x, int64_t d) { return chunk(x, 2, d)[0]; }},
      {"index_select", [](const Tensor& x, int64_t d) { return index_select(x, d, i64({0})); }},
      {"gather", [](const Tensor& x, int64_t d) { return gather(x, d, zeros({2, 3}, kInt64)); }},
  };
  return ops;
}

void add_generic_cases(Sweep& s) {
  const Tensor undefined;
  for (const auto& [name, f] : unary_ops()) {
    const auto& fn = f;
    s.refuse(name, "an undefined tensor", [&fn, undefined] { fn(undefined); });
    s.empty_ok(name, "an empty [0, 3] tensor", [&fn] { fn(zeros({0, 3})); });
  }
  for (const auto& [name, f] : binary_ops()) {
    const auto& fn = f;
    const bool mm = name == "matmul";
    s.refuse(name, "an undefined first operand", [&fn, undefined] { fn(undefined, f32({2, 3})); });
    s.refuse(name, "an undefined second operand", [&fn, undefined] { fn(f32({2, 3}), undefined); });
    s.refuse(name, "shapes [2, 3] and [4]", [&fn] { fn(f32({2, 3}), f32({4})); });
    s.refuse(name, "shapes [2, 3, 5] and [2, 4, 5]", [&fn] { fn(f32({2, 3, 5}), f32({2, 4, 5})); });
    if (mm) {
      s.refuse(name, "a 0-dim operand", [&fn] { fn(f32({}), f32({3})); });
      s.refuse(name, "inner sizes 0 and 3", [&fn] { fn(f32({2, 0}), f32({3, 2})); });
    }
    s.empty_ok(name, "two empty [0, 3] operands", [&fn, mm] {
      if (mm) fn(zeros({0, 3}), zeros({3, 0}));
      else fn(zeros({0, 3}), zeros({0, 3}));
    });
  }
  for (const auto& [name, f] : dim_ops()) {
    const auto& fn = f;
    for (int64_t d : std::vector<int64_t>{2, -3, 100, -100, std::numeric_limits<int64_t>::max(),
                                          std::numeric_limits<int64_t>::min()})
      s.refuse(name, "dim " + std::to_string(d) + " of a [2, 3] tensor", [&fn, d] { fn(f32({2, 3}), d); });
    s.refuse(name, "an undefined tensor", [&fn, undefined] { fn(undefined, 0); });
    s.empty_ok(name, "an empty [0, 3] tensor over dim 0", [&fn] { fn(zeros({0, 3}), 0); });
  }
}

void add_shape_cases(Sweep& s) {
  const Tensor x = f32({2, 3});
  s.refuse("view", "shape [4, 2] for 6 elements", [x] { view(x, {4, 2}); });
  s.refuse("view", "two -1 dims", [x] { view(x, {-1, -1}); });
  s.refuse("view", "a -2 dim", [x] { view(x, {-2, -3}); });
  s.refuse("view", "a non-contiguous input with an incompatible shape", [x] { view(x.t(), {6}); });
  s.refuse("reshape", "shape [5] for 6 elements", [x] { reshape(x, {5}); });
  s.refuse("reshape", "a huge shape", [x] { reshape(x, {kHuge, kHuge}); });
  s.refuse("reshape", "-1 with a 0 dim", [x] { reshape(x, {0, -1}); });
  s.refuse("flatten", "start 1 after end 0", [x] { flatten(x, 1, 0); });
  s.refuse("permute", "two dims for a [2, 3] tensor... of three", [x] { permute(x, {0, 1, 2}); });
  s.refuse("permute", "a repeated dim", [x] { permute(x, {0, 0}); });
  s.refuse("permute", "dim 5", [x] { permute(x, {0, 5}); });
  s.refuse("narrow", "start -7", [x] { narrow(x, 1, -7, 1); });
  s.refuse("narrow", "length 4 from 0 of 3", [x] { narrow(x, 1, 0, 4); });
  s.refuse("narrow", "a negative length", [x] { narrow(x, 1, 1, -1); });
  s.refuse("narrow", "start + length past int64", [x] { narrow(x, 1, 2, std::numeric_limits<int64_t>::max()); });
  s.refuse("select", "index 3 of 3", [x] { select(x, 1, 3); });
  s.refuse("select", "index -4 of 3", [x] { select(x, 1, -4); });
  s.refuse("select", "a 0-dim tensor", [] { select(f32({}), 0, 0); });
  s.refuse("expand", "[2, 3] to [4, 3]", [x] { expand(x, {4, 3}); });
  s.refuse("expand", "[2, 3] to [3]", [x] { expand(x, {3}); });
  s.refuse("expand", "a negative size in a new dim", [x] { expand(x, {-1, 2, 3}); });
  s.refuse("expand", "a huge shape", [] { expand(f32({1, 1}), {kHuge, kHuge}); });
  s.refuse("unsqueeze", "dim 3 of a [2, 3] tensor", [x] { unsqueeze(x, 3); });
  s.refuse("unsqueeze", "dim -4", [x] { unsqueeze(x, -4); });
  s.refuse("cat", "no tensors", [] { cat({}, 0); });
  s.refuse("cat", "[2, 3] and [2, 4] along 0", [x] { cat({x, f32({2, 4})}, 0); });
  s.refuse("cat", "ranks 2 and 1", [x] { cat({x, f32({3})}, 0); });
  s.refuse("cat", "an undefined tensor", [x] { cat({x, Tensor()}, 0); });
  s.refuse("stack", "no tensors", [] { stack({}, 0); });
  s.refuse("stack", "[2, 3] and [3, 2]", [x] { stack({x, f32({3, 2})}, 0); });
  s.refuse("stack", "dim 3 of rank 3", [x] { stack({x, x}, 3); });
  s.refuse("split", "size 0", [x] { split(x, 0, 0); });
  s.refuse("split", "size -1", [x] { split(x, -1, 0); });
  s.refuse("chunk", "0 chunks", [x] { chunk(x, 0, 0); });
  s.refuse("chunk", "-2 chunks", [x] { chunk(x, -2, 0); });
  s.refuse("index_select", "index 3 of 3", [x] { index_select(x, 1, i64({0, 3})); });
  s.refuse("index_select", "index -4 of 3", [x] { index_select(x, 1, i64({-4})); });
  s.refuse("index_select", "index -1", [x] { index_select(x, 1, i64({-1})); });
  s.refuse("index_select", "index INT64_MIN", [x] { index_select(x, 1, i64({std::numeric_limits<int64_t>::min()})); });
  s.refuse("index_select", "a float index", [x] { index_select(x, 1, zeros({1})); });
  s.refuse("index_select", "a 2-D index", [x] { index_select(x, 1, zeros({1, 1}, kInt64)); });
  s.refuse("gather", "index 3 of 3", [x] { gather(x, 1, full({2, 1}, 3, kInt64)); });
  s.refuse("gather", "index -1", [x] { gather(x, 1, full({2, 1}, -1, kInt64)); });
  s.refuse("gather", "an index of another rank", [x] { gather(x, 1, zeros({2}, kInt64)); });
  s.refuse("gather", "an index larger than the input in another dim", [x] { gather(x, 1, zeros({5, 1}, kInt64)); });
  s.refuse("gather", "a float index", [x] { gather(x, 1, zeros({2, 1})); });
  s.refuse("where", "a float condition", [x] { where(x, x, x); });
  s.refuse("where", "shapes [2, 3], [4], [2, 3]", [x] { where(gt(x, 0.0), f32({4}), x); });
  s.refuse("masked_fill", "a mask of shape [4]", [x] { masked_fill(x, zeros({4}, kBool), 1.0); });
  s.refuse("masked_fill", "a float mask", [x] { masked_fill(x, zeros({2, 3}), 1.0); });
  s.refuse("size", "dim 2 of rank 2", [x] { (void)x.size(2); });
  s.refuse("size", "dim -3 of rank 2", [x] { (void)x.size(-3); });
  s.refuse("stride", "dim 2 of rank 2", [x] { (void)x.stride(2); });
  s.refuse("item", "six elements", [x] { (void)x.item<float>(); });
  s.refuse("backward", "a tensor that does not require grad", [x] { x.backward(); });
  s.refuse("backward", "a non-scalar output without a gradient", [] {
    Tensor w = f32({2, 3}).requires_grad_();
    (w * 2.0).backward();
  });
  s.refuse("backward", "a gradient of the wrong shape", [] {
    Tensor w = f32({2, 3}).requires_grad_();
    (w * 2.0).backward(ones({3, 2}));
  });
}

void add_nn_cases(Sweep& s) {
  const Tensor x = f32({4, 3}), w = f32({5, 3}), b = f32({5});
  s.refuse("linear", "a weight of shape [5, 4] for 3 features", [x] { linear(x, f32({5, 4})); });
  s.refuse("linear", "a bias of 4 for 5 outputs", [x, w] { linear(x, w, f32({4})); });
  s.refuse("linear", "a 3-D weight", [x] { linear(x, f32({5, 3, 1})); });
  s.refuse("linear", "a 0-dim input", [w] { linear(f32({}), w); });
  s.refuse("linear", "an undefined weight", [x] { linear(x, Tensor()); });
  s.refuse("linear", "an int64 input", [w] { linear(zeros({4, 3}, kInt64), w); });
  s.refuse("linear", "float32 input and float64 weight", [x] { linear(x, f32({5, 3}).to(kFloat64)); });
  s.refuse("feed_forward", "a second weight of 4 inputs for 5 hidden", [x, w, b] {
    feed_forward(x, w, b, Activation::Relu, f32({2, 4}));
  });
  s.refuse("softmax", "an int64 tensor", [] { softmax(zeros({2, 3}, kInt64), 1); });
  s.refuse("layer_norm", "normalized shape [4] of a [4, 3] input", [x] { layer_norm(x, {4}); });
  s.refuse("layer_norm", "a weight of shape [2]", [x] { layer_norm(x, {3}, f32({2})); });
  s.refuse("layer_norm", "an empty normalized shape", [x] { layer_norm(x, {}); });
  s.refuse("layer_norm", "eps -1", [x] { layer_norm(x, {3}, Tensor(), Tensor(), -1.0); });
  const Tensor table = f32({10, 4});
  s.refuse("embedding", "index 10 of 10", [table] { embedding(i64({1, 10}), table); });
  s.refuse("embedding", "index -1", [table] { embedding(i64({-1}), table); });
  s.refuse("embedding", "a float index", [table] { embedding(zeros({2}), table); });
  s.refuse("embedding", "a 1-D weight", [] { embedding(i64({0}), f32({10})); });
  s.refuse("dropout", "p = -0.1", [x] { dropout(x, -0.1); });
  s.refuse("dropout", "p = 1.5", [x] { dropout(x, 1.5); });
  s.refuse("dropout", "p = NaN", [x] { dropout(x, std::numeric_limits<double>::quiet_NaN()); });

  const Tensor aq = f32({2, 5, 4}), ak = f32({2, 6, 4}), av = f32({2, 6, 3});
  auto sdpa = [](const Tensor& q, const Tensor& k, const Tensor& v, AttentionOptions o = {}) {
    scaled_dot_product_attention(q, k, v, o);
  };
  s.refuse("scaled_dot_product_attention", "a key of head dim 5 for 4", [aq, av, sdpa] { sdpa(aq, f32({2, 6, 5}), av); });
  s.refuse("scaled_dot_product_attention", "7 values for 6 keys", [aq, ak, sdpa] { sdpa(aq, ak, f32({2, 7, 3})); });
  s.refuse("scaled_dot_product_attention", "other batch dims", [aq, sdpa] { sdpa(aq, f32({3, 6, 4}), f32({3, 6, 3})); });
  s.refuse("scaled_dot_product_attention", "1-D inputs", [sdpa] { sdpa(f32({4}), f32({4}), f32({4})); });
  s.refuse("scaled_dot_product_attention", "an undefined key", [aq, av, sdpa] { sdpa(aq, Tensor(), av); });
  s.refuse("scaled_dot_product_attention", "int64 inputs", [sdpa] {
    sdpa(zeros({2, 5, 4}, kInt64), zeros({2, 6, 4}, kInt64), zeros({2, 6, 3}, kInt64));
  });
  s.refuse("scaled_dot_product_attention", "a float64 key", [aq, ak, av, sdpa] { sdpa(aq, ak.to(kFloat64), av); });
  s.refuse("scaled_dot_product_attention", "a [5, 5] mask for [2, 5, 6] scores", [aq, ak, av, sdpa] {
    AttentionOptions o;
    o.attn_mask = ones({5, 5}, kBool);
    sdpa(aq, ak, av, o);
  });
  s.refuse("scaled_dot_product_attention", "an int64 mask", [aq, ak, av, sdpa] {
    AttentionOptions o;
    o.attn_mask = ones({5, 6}, kInt64);
    sdpa(aq, ak, av, o);
  });
  s.refuse("scaled_dot_product_attention", "is_causal with a mask", [aq, ak, av, sdpa] {
    AttentionOptions o;
    o.is_causal = true;
    o.attn_mask = ones({5, 6}, kBool);
    sdpa(aq, ak, av, o);
  });
  for (double p : {-0.1, 1.0, std::numeric_limits<double>::quiet_NaN()})
    s.refuse("scaled_dot_product_attention", "dropout_p " + std::to_string(p), [aq, ak, av, sdpa, p] {
      AttentionOptions o;
      o.dropout_p = p;
      sdpa(aq, ak, av, o);
    });
  s.refuse("scaled_dot_product_attention", "an infinite scale", [aq, ak, av, sdpa] {
    AttentionOptions o;
    o.scale = std::numeric_limits<double>::infinity();
    sdpa(aq, ak, av, o);
  });
  s.empty_ok("scaled_dot_product_attention", "no keys", [aq, sdpa] { sdpa(aq, f32({2, 0, 4}), f32({2, 0, 3})); });
  s.empty_ok("scaled_dot_product_attention", "an empty batch", [sdpa] { sdpa(f32({0, 5, 4}), f32({0, 6, 4}), f32({0, 6, 3})); });

  const Tensor img = f32({1, 2, 5, 5}), k = f32({4, 2, 3, 3});
  s.refuse("conv2d", "a 2-D input", [k] { conv2d(f32({5, 5}), k); });
  s.refuse("conv2d", "a 5-D input", [k] { conv2d(f32({1, 1, 2, 5, 5}), k); });
  s.refuse("conv2d", "3 input channels for a weight of 2", [k] { conv2d(f32({1, 3, 5, 5}), k); });
  s.refuse("conv2d", "a kernel larger than the padded input", [img] { conv2d(img, f32({4, 2, 7, 7})); });
  s.refuse("conv2d", "stride 0", [img, k] { conv2d(img, k, Tensor(), {0, 1}); });
  s.refuse("conv2d", "padding -1", [img, k] { conv2d(img, k, Tensor(), {1, 1}, {-1, 0}); });
  s.refuse("conv2d", "dilation 0", [img, k] { conv2d(img, k, Tensor(), {1, 1}, {0, 0}, {0, 1}); });
  s.refuse("conv2d", "groups 3 of 2 channels", [img] { conv2d(img, f32({3, 1, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 1}, 3); });
  s.refuse("conv2d", "groups 0", [img, k] { conv2d(img, k, Tensor(), {1, 1}, {0, 0}, {1, 1}, 0); });
  s.refuse("conv2d", "a bias of 3 for 4 channels", [img, k] { conv2d(img, k, f32({3})); });
  s.refuse("conv2d", "stride of three values", [img, k] { conv2d(img, k, Tensor(), {1, 1, 1}); });
  s.refuse("conv2d", "no stride values", [img, k] { conv2d(img, k, Tensor(), {}); });
  s.refuse("conv2d", "a huge padding", [img, k] { conv2d(img, k, Tensor(), {1, 1}, {kHuge, kHuge}); });
  s.refuse("conv2d", "an int64 input", [k] { conv2d(zeros({1, 2, 5, 5}, kInt64), k); });
  for (const std::string op : {"max_pool2d", "avg_pool2d"}) {
    const bool mx = op == "max_pool2d";
    const auto pool = [mx](const Tensor& in, std::vector<int64_t> ks, std::vector<int64_t> st,
                           std::vector<int64_t> pad) {
      return mx ? max_pool2d(in, ks, st, pad) : avg_pool2d(in, ks, st, pad);
    };
    s.refuse(op, "kernel 0", [img, pool] { pool(img, {0, 2}, {}, {0, 0}); });
    s.refuse(op, "kernel of three values", [img, pool] { pool(img, {2, 2, 2}, {}, {0, 0}); });
    s.refuse(op, "stride 0", [img, pool] { pool(img, {2, 2}, {0, 1}, {0, 0}); });
    s.refuse(op, "stride -1", [img, pool] { pool(img, {2, 2}, {-1, 1}, {0, 0}); });
    s.refuse(op, "padding 2 for kernel 2", [img, pool] { pool(img, {2, 2}, {}, {2, 0}); });
    s.refuse(op, "padding -1", [img, pool] { pool(img, {2, 2}, {}, {-1, 0}); });
    s.refuse(op, "a kernel larger than the input", [img, pool] { pool(img, {7, 7}, {}, {0, 0}); });
    s.refuse(op, "a 2-D input", [pool] { pool(f32({5, 5}), {2, 2}, {}, {0, 0}); });
    s.refuse(op, "a huge kernel", [img, pool] { pool(img, {kHuge, kHuge}, {}, {0, 0}); });
  }
  s.refuse("max_pool2d", "dilation 0", [img] { max_pool2d(img, {2, 2}, {}, {0, 0}, {0, 1}); });

  const Tensor logits = f32({4, 5});
  s.refuse("cross_entropy", "class 5 of 5", [logits] { cross_entropy(logits, i64({0, 1, 2, 5})); });
  s.refuse("cross_entropy", "class -2", [logits] { cross_entropy(logits, i64({0, 1, 2, -2})); });
  s.refuse("cross_entropy", "3 targets for 4 rows", [logits] { cross_entropy(logits, i64({0, 1, 2})); });
  s.refuse("cross_entropy", "a float target of another shape", [logits] { cross_entropy(logits, f32({4, 4})); });
  s.refuse("cross_entropy", "label smoothing 1.5", [logits] {
    cross_entropy(logits, i64({0, 1, 2, 3}), Reduction::Mean, -100, 1.5);
  });
  s.refuse("cross_entropy", "label smoothing -0.1", [logits] {
    cross_entropy(logits, i64({0, 1, 2, 3}), Reduction::Mean, -100, -0.1);
  });
  s.refuse("cross_entropy", "0-dim logits", [] { cross_entropy(f32({}), i64({0})); });
  s.refuse("cross_entropy", "an int64 input", [] { cross_entropy(zeros({4, 5}, kInt64), i64({0, 1, 2, 3})); });
  s.refuse("nll_loss", "class 5 of 5", [logits] { nll_loss(logits, i64({0, 1, 2, 5})); });
  s.refuse("nll_loss", "class -7", [logits] { nll_loss(logits, i64({0, 1, 2, -7})); });
  s.refuse("nll_loss", "a float target", [logits] { nll_loss(logits, f32({4})); });
  s.refuse("nll_loss", "3 targets for 4 rows", [logits] { nll_loss(logits, i64({0, 1, 2})); });
}

void add_factory_cases(Sweep& s) {
  for (const std::string op : {"empty", "zeros", "ones", "rand", "randn"}) {
    const auto make = [op](const std::vector<int64_t>& shape) {
      if (op == "empty") return empty(shape);
      if (op == "zeros") return zeros(shape);
      if (op == "ones") return ones(shape);
      if (op == "rand") return rand(shape);
      return randn(shape);
    };
    s.refuse(op, "size -1", [make] { make({2, -1}); });
    s.refuse(op, "a shape of 2^62 x 4 elements", [make] { make({kHuge, 4}); });
    s.refuse(op, "a shape of INT64_MAX x 2", [make] { make({std::numeric_limits<int64_t>::max(), 2}); });
    s.refuse(op, "2^40 float32 elements (4 TiB)", [make] { make({int64_t(1) << 40}); });
    s.empty_ok(op, "a [0, 5] shape", [make] { make({0, 5}); });
  }
  s.refuse("full", "size -3", [] { full({-3}, 1.0); });
  s.refuse("full", "a huge shape", [] { full({kHuge, kHuge}, 1.0); });
  s.refuse("arange", "step 0", [] { arange(0, 10, 0); });
  s.refuse("arange", "a step against the direction", [] { arange(0, 10, -1); });
  s.refuse("arange", "a NaN end", [] { arange(0.0, std::numeric_limits<double>::quiet_NaN(), 1.0); });
  s.refuse("arange", "an infinite end", [] { arange(0.0, std::numeric_limits<double>::infinity(), 1.0); });
  s.refuse("arange", "2^62 float32 values", [] { arange(0.0, double(kHuge), 1.0); });
  s.refuse("arange", "an int64 range of 2^63 values", [] {
    arange(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), 1, kInt64);
  });
  s.refuse("linspace", "-1 steps", [] { linspace(0, 1, -1); });
  s.refuse("linspace", "a huge count", [] { linspace(0, 1, kHuge); });
  s.refuse("eye", "n = -1", [] { eye(-1); });
  s.refuse("eye", "m = -2", [] { eye(3, -2); });
  s.refuse("eye", "a huge n", [] { eye(kHuge); });
  s.refuse("randint", "low 5, high 5", [] { randint(5, 5, {3}); });
  s.refuse("randint", "low 5, high 2", [] { randint(5, 2, {3}); });
  s.refuse("randint", "size -1", [] { randint(0, 2, {-1}); });
  s.refuse("bernoulli", "p = 1.5", [] { bernoulli({3}, 1.5); });
  s.refuse("bernoulli", "p = -0.5", [] { bernoulli({3}, -0.5); });
  s.refuse("from_vector", "3 values for shape [2, 2]", [] { from_vector<float>({1, 2, 3}, {2, 2}); });
  s.refuse("from_vector", "a negative shape", [] { from_vector<float>({1, 2}, {-2}); });
  s.refuse("from_blob", "a null pointer", [] { from_blob(nullptr, {4}); });
  s.refuse("from_blob", "a negative size", [] {
    float d[4] = {};
    from_blob(d, {-4});
  });
  s.refuse("to", "a tensor of an undefined tensor", [] { Tensor().to(kFloat64); });
}

void add_in_place_cases(Sweep& s) {
  // Every in-place write through a view whose elements overlap in memory.
  const auto overlapping = [] { return zeros({1, 4}).expand({3, 4}); };
  const std::vector<std::pair<std::string, std::function<void(Tensor&)>>> writes = {
      {"add_", [](Tensor& t) { t.add_(1.0); }},
      {"add_", [](Tensor& t) { t.add_(ones({3, 4})); }},
      {"sub_", [](Tensor& t) { t.sub_(1.0); }},
      {"sub_", [](Tensor& t) { t.sub_(ones({3, 4})); }},
      {"mul_", [](Tensor& t) { t.mul_(2.0); }},
      {"mul_", [](Tensor& t) { t.mul_(ones({3, 4})); }},
      {"div_", [](Tensor& t) { t.div_(2.0); }},
      {"div_", [](Tensor& t) { t.div_(ones({3, 4})); }},
      {"zero_", [](Tensor& t) { t.zero_(); }},
      {"fill_", [](Tensor& t) { t.fill_(1.0); }},
      {"copy_", [](Tensor& t) { t.copy_(ones({3, 4})); }},
      {"clamp_", [](Tensor& t) { t.clamp_(0.0, 1.0); }},
      {"masked_fill_", [](Tensor& t) { t.masked_fill_(ones({3, 4}, kBool), 1.0); }},
      {"uniform_", [](Tensor& t) { t.uniform_(); }},
      {"normal_", [](Tensor& t) { t.normal_(); }},
  };
  for (const auto& [op, write] : writes) {
    const std::function<void(Tensor&)> w = write;  // a copy: the list goes before the sweep runs
    s.refuse(op, "an expanded (overlapping) view", [overlapping, w] {
      Tensor t = overlapping();
      w(t);
    });
  }
  // Shapes and dtypes that an in-place write cannot take.
  Tensor x = zeros({2, 3});
  s.refuse("add_", "an operand of shape [4]", [x]() mutable { x.add_(ones({4})); });
  s.refuse("add_", "an operand that would grow the result", [x]() mutable { x.add_(ones({2, 2, 3})); });
  s.refuse("copy_", "a source of shape [3, 2]", [x]() mutable { x.copy_(ones({3, 2})); });
  s.refuse("copy_", "an undefined source", [x]() mutable { x.copy_(Tensor()); });
  s.refuse("masked_fill_", "a mask of shape [4]", [x]() mutable { x.masked_fill_(ones({4}, kBool), 1.0); });
  s.refuse("uniform_", "from 1 to 0", [x]() mutable { x.uniform_(1.0, 0.0); });
  s.refuse("normal_", "std -1", [x]() mutable { x.normal_(0.0, -1.0); });
  s.refuse("uniform_", "an int64 tensor", [] { zeros({2}, kInt64).uniform_(); });
  s.refuse("add_", "a leaf that requires grad", [] { f32({2}).requires_grad_().add_(1.0); });
}

}  // namespace

TEST(BadArguments, EveryBadCallRefusesNamingItsOp) {
  Sweep s;
  add_generic_cases(s);
  add_shape_cases(s);
  add_nn_cases(s);
  add_factory_cases(s);
  add_in_place_cases(s);
  const std::vector<std::string> failures = s.run();
  // The count goes into the test's output, so a report can say how much was tried.
  std::printf("bad-argument sweep: %zu calls, %zu failed\n", s.size(), failures.size());
  ::testing::Test::RecordProperty("calls", int(s.size()));
  std::string list;
  for (const auto& f : failures) list += "\n  " + f;
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << s.size() << " calls:" << list;
  EXPECT_GT(s.size(), 300u);
}
