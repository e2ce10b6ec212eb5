// The cross-backend harness: every kernel entry of the Backend interface, reached through
// the public ops (forward and backward) or the optimizers and grad scaler that call it, runs
// on CUDA and on the CPU backend with the same inputs, in float32, float16 and bfloat16
// (float64 where the op has it), and the results must agree within atol + rtol * |ref|
// scaled by the dtype. NaN-ness is compared, not NaN payloads (kernels/cuda/common.cuh
// says what GPU kernels promise). Further cases take the shapes that split a kernel's work
// or its launches (chunked reductions, optimizer packs), broadcast batches, empty and
// integer tensors, and a created stream; test_backend_coverage.cpp has what a comparison
// with the CPU backend cannot check (TF32, a tensor past 2^31 elements).
//
// Without a CUDA device the comparisons skip, saying so; the coverage test runs everywhere:
// it reads the entries declared in core/include/ampgrad/backend.h and fails for any entry
// that no case exercises, for an entry the CUDA backend does not declare (a declared one
// must be defined, or the library does not link), and for one forwarding to Backend's
// "not implemented" default.
#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "support/testing.h"

namespace {

using namespace ag;

bool have_cuda() { return !hw::query().cuda.empty(); }
const Device kGpu(kCUDA, 0);

// ---- comparing a function on both devices ---------------------------------------------------
// An input of a case: float64 values on the CPU, cast to the case's dtype on each device.
// Integer inputs (indices, labels) keep their dtype and never require grad.
struct Input {
  Tensor values;
  bool differentiable = true;
};

using Fn = std::function<TensorList(const TensorList&)>;

agt::Tol scaled(DType dt, double factor) {
  const agt::Tol t = agt::tol_for(dt);
  return {t.rtol * factor, t.atol * factor};
}

// Runs f on both devices and compares every floating output, then (when any input is
// differentiable) the gradients of sum(out * w) for fixed random weights w.
void compare_backends(const std::string& name, const Fn& f, const std::vector<Input>& inputs, DType dt,
                      double tol_factor = 2.0) {
  SCOPED_TRACE(name + " in " + std::string(dtype_name(dt)));
  auto prepare = [&](Device d) {
    TensorList xs;
    for (const Input& in : inputs) {
      Tensor v = in.values.is_floating_point() ? in.values.to(dt) : in.values;
      v = v.to(d).detach();
      if (in.differentiable && v.is_floating_point()) v.requires_grad_(true);
      xs.push_back(v);
    }
    return xs;
  };
  const TensorList cpu_in = prepare(kCPU), gpu_in = prepare(kGpu);
  const TensorList cpu_out = f(cpu_in), gpu_out = f(gpu_in);
  ASSERT_EQ(cpu_out.size(), gpu_out.size());
  const agt::Tol tol = scaled(dt, tol_factor);
  Tensor cpu_loss, gpu_loss;
  manual_seed(1234);
  for (size_t i = 0; i < cpu_out.size(); ++i) {
    ASSERT_EQ(gpu_out[i].device(), kGpu) << "output " << i;
    ASSERT_EQ(gpu_out[i].dtype(), cpu_out[i].dtype()) << "output " << i;
    ASSERT_EQ(gpu_out[i].sizes(), cpu_out[i].sizes()) << "output " << i;
    const Tensor got = gpu_out[i].to(kCPU);
    if (cpu_out[i].is_floating_point()) {
      EXPECT_TRUE(agt::allclose(got, cpu_out[i], tol)) << "output " << i;
      if (cpu_out[i].requires_grad()) {
        const Tensor w = randn(cpu_out[i].sizes().vec(), kFloat32);
        const Tensor lc = sum(cpu_out[i].to(kFloat32) * w), lg = sum(gpu_out[i].to(kFloat32) * w.to(kGpu));
        cpu_loss = cpu_loss.defined() ? cpu_loss + lc : lc;
        gpu_loss = gpu_loss.defined() ? gpu_loss + lg : lg;
      }
    } else {
      EXPECT_TRUE(agt::allclose(got.to(kFloat64), cpu_out[i].to(kFloat64), 0, 0)) << "output " << i;
    }
  }
  if (!cpu_loss.defined()) return;
  cpu_loss.backward();
  gpu_loss.backward();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!cpu_in[i].requires_grad()) continue;
    ASSERT_TRUE(gpu_in[i].grad().defined()) << "gradient of input " << i;
    EXPECT_TRUE(agt::allclose(gpu_in[i].grad().to(kCPU), cpu_in[i].grad(), scaled(dt, tol_factor * 2)))
        << "gradient of input " << i;
  }
}

Input uniform_in(std::vector<int64_t> shape, double lo = -2, double hi = 2) {
  return {agt::rand64(shape, lo, hi, false), true};
}
Input index_in(std::vector<int64_t> shape, int64_t high) { return {randint(0, high, shape, kInt64), false}; }
Input constant_in(Tensor t) { return {t, false}; }
// Values in [-2, 2] on a grid of 1/64: exact in every floating dtype, and so are their sums
// in float32 (a few million of them) in any order, so that a reduction's chunking cannot
// hide behind rounding.
Input grid_in(std::vector<int64_t> shape) {
  std::vector<double> v = agt::rand64(shape, -2, 2, false).to_vector<double>();
  for (double& e : v) e = std::round(e * 64) / 64;
  return {from_vector<double>(v, shape), true};
}
// Class indices in [0, high) with every third one set to -100 (the default ignore_index).
Input ignored_in(std::vector<int64_t> shape, int64_t high) {
  std::vector<int64_t> v = randint(0, high, shape, kInt64).to_vector<int64_t>();
  for (size_t i = 0; i < v.size(); i += 3) v[i] = -100;
  return {from_vector<int64_t>(v, shape), false};
}

// An additive attention mask [Tq, Tk] in [-1, 1) with some -inf, and row 5 all -inf (a
// query that sees no key).
Tensor attention_mask(int64_t Tq, int64_t Tk) {
  std::vector<double> v = agt::rand64({Tq, Tk}, -1, 1, false).to_vector<double>();
  for (size_t i = 0; i < v.size(); i += 7) v[i] = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < Tk; ++j) v[size_t(5 * Tk + j)] = -std::numeric_limits<double>::infinity();
  return from_vector<double>(v, {Tq, Tk});
}

// f run on a stream created for the call, as code that overlaps work does: the inputs are
// made afresh on the current stream (a copy kernel each, differentiable), the side stream
// waits for them through an Event, f's kernels run there, and the current stream waits for
// its results. In strict mode (the test binary's, docs/cuda-emulator.md) work runs only
// when something waits for it, so a missing or broken wait reads poison. On the CPU, f
// runs as it is.
Fn on_side_stream(Fn f) {
  return [f](const TensorList& x) {
    if (x.empty() || !x[0].device().is_cuda()) return f(x);
    const Device d = x[0].device();
    const Stream side = create_stream(d);
    TensorList fresh, out;
    for (const Tensor& t : x) fresh.push_back(t.clone());
    {
      Event ready(d, false);
      ready.record();
      StreamGuard guard(side);
      ready.wait();
      for (const Tensor& t : fresh) record_stream(t, side);
      out = f(fresh);
    }
    Event done(d, false);
    done.record(side);
    done.wait();
    for (const Tensor& t : out) record_stream(t, current_stream(d));
    destroy_stream(side);
    return out;
  };
}

// out [B, M, N] = a @ w through the backend of a's device, bypassing the frontend (which
// folds some broadcast batches into one 2-D product before the backend sees them).
Tensor backend_matmul(const Tensor& a, const Tensor& w) {
  NoGradGuard no_grad;
  const Tensor out = empty({a.size(0), a.size(1), w.size(2)}, TensorOptions(a.dtype()).device(a.device()));
  backend(a.device(), "matmul").matmul(a.detach(), w.detach(), out);
  return out;
}

// ---- the cases ----------------------------------------------------------------------------
// A case names the Backend entries it reaches (checked against backend.h), the dtypes it
// runs in, and what it runs.
struct Case {
  std::string name;
  std::vector<std::string> entries;
  std::vector<DType> dtypes;
  std::function<void(DType)> run;
};

const std::vector<DType> kFloats = {kFloat32, kFloat16, kBFloat16, kFloat64};
const std::vector<DType> kLowp = {kFloat32, kFloat16, kBFloat16};

Case unary_case(const std::string& name, std::function<Tensor(const Tensor&)> op, double lo = -2, double hi = 2) {
  return {name, {"unary"}, kFloats, [=](DType dt) {
            compare_backends(name, [op](const TensorList& x) { return TensorList{op(x[0])}; },
                             {uniform_in({7, 33}, lo, hi)}, dt);
          }};
}

std::vector<Case> all_cases() {
  std::vector<Case> c;
  // -- data movement
  c.push_back({"copy", {"copy"}, kFloats, [](DType dt) {
                 // a transposed view made contiguous, a dtype change, a broadcast copy
                 compare_backends("copy",
                                  [](const TensorList& x) {
                                    return TensorList{x[0].transpose(0, 1).contiguous(), x[0].to(kFloat32),
                                                      x[1].expand({5, 6}).contiguous()};
                                  },
                                  {uniform_in({6, 5}), uniform_in({1, 6})}, dt, 1.0);
               }});
  c.push_back({"fill", {"fill"}, kFloats, [](DType dt) {
                 compare_backends("fill",
                                  [dt](const TensorList& x) {
                                    return TensorList{full({3, 4}, 2.5, TensorOptions(dt).device(x[0].device())),
                                                      zeros_like(x[0]), ones_like(x[0])};
                                  },
                                  {constant_in(agt::rand64({3, 4}, -1, 1, false))}, dt, 1.0);
               }});
  // -- unary ops (and the binary entries their backward uses)
  c.push_back(unary_case("neg", [](const Tensor& x) { return neg(x); }));
  c.push_back(unary_case("abs", [](const Tensor& x) { return abs(x); }));
  c.push_back(unary_case("sign", [](const Tensor& x) { return sign(x); }));
  c.push_back(unary_case("square", [](const Tensor& x) { return square(x); }));
  c.push_back(unary_case("sqrt", [](const Tensor& x) { return sqrt(x); }, 0.1, 4));
  c.push_back(unary_case("rsqrt", [](const Tensor& x) { return rsqrt(x); }, 0.1, 4));
  c.push_back(unary_case("reciprocal", [](const Tensor& x) { return reciprocal(x); }, 0.5, 4));
  c.push_back(unary_case("exp", [](const Tensor& x) { return exp(x); }));
  c.push_back(unary_case("log", [](const Tensor& x) { return log(x); }, 0.1, 4));
  c.push_back(unary_case("log1p", [](const Tensor& x) { return log1p(x); }, -0.5, 4));
  c.push_back(unary_case("tanh", [](const Tensor& x) { return tanh(x); }));
  c.push_back(unary_case("sigmoid", [](const Tensor& x) { return sigmoid(x); }));
  c.push_back(unary_case("softplus", [](const Tensor& x) { return softplus(x); }));
  c.push_back(unary_case("relu", [](const Tensor& x) { return relu(x); }));
  c.push_back(unary_case("gelu", [](const Tensor& x) { return gelu(x); }));
  c.push_back(unary_case("gelu_tanh", [](const Tensor& x) { return gelu(x, "tanh"); }));
  c.push_back(unary_case("silu", [](const Tensor& x) { return silu(x); }));
  c.push_back(unary_case("pow_scalar", [](const Tensor& x) { return pow(x, 1.7); }, 0.1, 3));
  c.push_back(unary_case("clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.75); }));
  // -- binary, compare, where: broadcasting, strided and scalar operands
  c.push_back({"binary", {"binary"}, kFloats, [](DType dt) {
                 compare_backends("binary",
                                  [](const TensorList& x) {
                                    const Tensor a = x[0], b = x[1], t = x[2].transpose(0, 1);
                                    return TensorList{a + b, a - t,        a * b,          a / (abs(b) + 0.5), pow(abs(a) + 0.1, b),
                                                      maximum(a, b), minimum(a, t), a * 2.0, 3.0 - a};
                                  },
                                  {uniform_in({4, 9}), uniform_in({1, 9}), uniform_in({9, 4})}, dt);
               }});
  c.push_back({"compare", {"compare"}, kFloats, [](DType dt) {
                 compare_backends("compare",
                                  [](const TensorList& x) {
                                    const Tensor a = x[0], b = x[1];
                                    return TensorList{eq(a, b), ne(a, b), lt(a, b), le(a, 0.25), gt(a, b), ge(a, -0.25),
                                                      logical_and(gt(a, 0.0), lt(b, 0.0)), logical_or(gt(a, 1.0), lt(b, -1.0))};
                                  },
                                  {uniform_in({5, 8}), uniform_in({5, 1})}, dt, 0.0);
               }});
  c.push_back({"where", {"where", "compare"}, kFloats, [](DType dt) {
                 compare_backends("where",
                                  [](const TensorList& x) {
                                    const Tensor m = gt(x[2], 0.0);
                                    return TensorList{where(m, x[0], x[1]), where(m, x[0], 7.0), where(m, -1.0, x[1]),
                                                      masked_fill(x[0], m, 0.5)};
                                  },
                                  {uniform_in({6, 7}), uniform_in({6, 7}), constant_in(agt::rand64({6, 7}, -1, 1, false))},
                                  dt, 1.0);
               }});
  // -- reductions
  c.push_back({"reduce", {"reduce"}, kFloats, [](DType dt) {
                 compare_backends("reduce",
                                  [](const TensorList& x) {
                                    const Tensor a = x[0];
                                    return TensorList{sum(a),           sum(a, {1}),       mean(a, {0, 2}, true), amax(a, {2}),
                                                      amin(a, {0}),     var(a, {1}),       ag::std(a, {2}, 0),        logsumexp(a, {2}),
                                                      norm(a, 2, {1}),  norm(a, 1, {0, 1}), argmax(a, 1),          argmin(a, 2),
                                                      sum(a.transpose(0, 2), {0})};
                                  },
                                  {uniform_in({5, 37, 66})}, dt, 4.0);
               }});
  c.push_back({"reduce_large", {"reduce"}, kLowp, [](DType dt) {
                 // more elements per output than one block holds
                 compare_backends("reduce_large",
                                  [](const TensorList& x) { return TensorList{sum(x[0]), mean(x[0], {0}), amax(x[0])}; },
                                  {uniform_in({3000, 700})}, dt, 8.0);
               }});
  c.push_back({"max_min_dim", {"max_min_dim"}, kFloats, [](DType dt) {
                 compare_backends("max_min_dim",
                                  [](const TensorList& x) {
                                    auto [v, i] = max(x[0], 1);
                                    return TensorList{v, i};
                                  },
                                  {uniform_in({9, 50, 3})}, dt, 1.0);
               }});
  // -- random: the same seed gives the same numbers on both backends
  c.push_back({"random", {"uniform", "normal"}, kFloats, [](DType dt) {
                 manual_seed(77);
                 const Tensor u_cpu = rand({1000, 3}, dt), n_cpu = randn({4099}, dt);
                 manual_seed(77);
                 const Tensor u_gpu = rand({1000, 3}, TensorOptions(dt).device(kGpu)),
                              n_gpu = randn({4099}, TensorOptions(dt).device(kGpu));
                 EXPECT_TRUE(agt::allclose(u_gpu.to(kCPU), u_cpu, 0, 0));
                 EXPECT_TRUE(agt::allclose(n_gpu.to(kCPU), n_cpu, scaled(dt, 1.0)));
               }});
  // the same seed before the call on each device, as attention below: seeded once outside,
  // the second device's mask would be drawn after the first's
  c.push_back({"dropout", {"uniform", "binary"}, kLowp, [](DType dt) {
                 compare_backends("dropout",
                                  [](const TensorList& x) {
                                    manual_seed(5);
                                    return TensorList{dropout(x[0], 0.3)};
                                  },
                                  {uniform_in({64, 65})}, dt, 1.0);
               }});
  // -- indexing
  c.push_back({"index_select", {"index_select", "index_add"}, kFloats, [](DType dt) {
                 compare_backends("index_select",
                                  [](const TensorList& x) { return TensorList{x[0].index_select(1, x[1]), embedding(x[2], x[0])}; },
                                  {uniform_in({11, 13}), index_in({17}, 13), index_in({4, 5}, 11)}, dt);
               }});
  c.push_back({"gather", {"gather", "scatter_add"}, kFloats, [](DType dt) {
                 compare_backends("gather", [](const TensorList& x) { return TensorList{x[0].gather(1, x[1])}; },
                                  {uniform_in({6, 10}), index_in({6, 4}, 10)}, dt);
               }});
  c.push_back({"cross_entropy", {"cross_entropy", "cross_entropy_backward", "reduce", "compare", "binary"}, kFloats,
               [](DType dt) {
                 // rows (inner == 1: small and long rows), positions with inner > 1, a 1-D input;
                 // every target tensor has ignored entries (-100)
                 compare_backends("cross_entropy",
                                  [](const TensorList& x) {
                                    return TensorList{cross_entropy(x[0], x[1]),
                                                      cross_entropy(x[0], x[1], Reduction::Sum, -100, 0.1),
                                                      cross_entropy(x[2], x[3], Reduction::None),
                                                      cross_entropy(x[4], x[5], Reduction::Mean, -100, 0.2),
                                                      cross_entropy(x[6], x[7], Reduction::None, -100, 0.05)};
                                  },
                                  {uniform_in({32, 10}, -4, 4), ignored_in({32}, 10), uniform_in({6, 3000}, -4, 4),
                                   ignored_in({6}, 3000), uniform_in({4, 7, 37}, -4, 4), ignored_in({4, 37}, 7),
                                   uniform_in({13}, -4, 4), constant_in(scalar_tensor(int64_t(5), kInt64))},
                                  dt, 4.0);
               }});
  // -- products
  c.push_back({"matmul", {"matmul"}, kFloats, [](DType dt) {
                 compare_backends("matmul",
                                  [](const TensorList& x) {
                                    return TensorList{matmul(x[0], x[1]), matmul(x[2], x[1]), matmul(x[0].transpose(0, 1).contiguous().transpose(0, 1), x[1])};
                                  },
                                  {uniform_in({33, 70}), uniform_in({70, 20}), uniform_in({3, 5, 33, 70})}, dt, 8.0);
               }});
  c.push_back({"linear", {"linear", "matmul", "reduce"}, kFloats, [](DType dt) {
                 compare_backends("linear",
                                  [](const TensorList& x) { return TensorList{linear(x[0], x[1], x[2]), linear(x[0], x[1])}; },
                                  {uniform_in({17, 40}), uniform_in({24, 40}), uniform_in({24})}, dt, 8.0);
               }});
  // linear with each activation (a result with 24 features takes cuBLASLt's epilogues, one
  // with 13 the composed path) and feed_forward (DRELU_BGRAD / DGELU_BGRAD in its backward).
  c.push_back({"linear_act", {"linear_act", "linear_act_backward", "linear", "matmul", "reduce"}, kFloats, [](DType dt) {
                 for (Activation a : {Activation::Relu, Activation::GeluErf, Activation::GeluTanh})
                   compare_backends(std::string("linear_act ") + activation_name(a),
                                    [a](const TensorList& x) {
                                      return TensorList{linear(x[0], x[1], x[2], a), linear(x[0], x[3], Tensor(), a),
                                                        feed_forward(x[0], x[1], x[2], a, x[4], x[5]),
                                                        feed_forward(x[0], x[3], Tensor(), a, x[6])};
                                    },
                                    {uniform_in({17, 40}), uniform_in({24, 40}), uniform_in({24}), uniform_in({13, 40}),
                                     uniform_in({8, 24}), uniform_in({8}), uniform_in({5, 13})},
                                    dt, 8.0);
               }});
  // scaled dot-product attention: the CPU's fused kernel against CUDA's composed form;
  // causal with Tq != Tk, a float mask with a row that sees no key, and dropout (the same
  // seed before the call on each device: both draw AttentionParams' mask)
  c.push_back({"attention", {"attention", "attention_backward"}, kFloats, [](DType dt) {
                 compare_backends("attention",
                                  [](const TensorList& x) {
                                    AttentionOptions causal, masked, dropping;
                                    causal.is_causal = true;
                                    masked.attn_mask = x[4];
                                    dropping.is_causal = true;
                                    dropping.dropout_p = 0.2;
                                    manual_seed(17);
                                    return TensorList{scaled_dot_product_attention(x[0], x[1], x[2], causal),
                                                      scaled_dot_product_attention(x[3], x[1], x[2], masked),
                                                      scaled_dot_product_attention(x[0], x[1], x[2], dropping)};
                                  },
                                  {uniform_in({2, 3, 19, 8}), uniform_in({2, 3, 70, 8}), uniform_in({2, 3, 70, 5}),
                                   uniform_in({2, 3, 66, 8}), constant_in(attention_mask(66, 70))},
                                  dt, 8.0);
               }});
  // -- convolution and pooling
  c.push_back({"conv2d", {"conv2d", "conv2d_backward_input", "conv2d_backward_weight"}, kFloats, [](DType dt) {
                 compare_backends("conv2d",
                                  [](const TensorList& x) {
                                    return TensorList{conv2d(x[0], x[1], x[2], {1, 1}, {1, 1}),
                                                      conv2d(x[0], x[3], Tensor(), {2, 2}, {0, 1}, {1, 1}, 2)};
                                  },
                                  {uniform_in({2, 4, 9, 10}), uniform_in({6, 4, 3, 3}), uniform_in({6}), uniform_in({4, 2, 2, 3})},
                                  dt, 8.0);
               }});
  c.push_back({"max_pool2d", {"max_pool2d", "max_pool2d_backward"}, kFloats, [](DType dt) {
                 compare_backends("max_pool2d",
                                  [](const TensorList& x) {
                                    // Dilated windows; and width 1 with kernel 2, dilation 2 and
                                    // padding 1: each row's one window taps columns -1 and 1, no
                                    // input at all (-inf, no gradient; Pool.MaxWindowWithNoInputTap...).
                                    return TensorList{max_pool2d(x[0], {2, 2}), max_pool2d(x[0], {3, 3}, {2, 2}, {1, 1}, {1, 1}, true),
                                                      max_pool2d(x[0], {2, 3}, {1, 2}, {1, 1}, {2, 2}),
                                                      max_pool2d(x[1], {1, 2}, {1, 1}, {0, 1}, {1, 2})};
                                  },
                                  {uniform_in({2, 3, 11, 12}), uniform_in({2, 3, 5, 1})}, dt, 1.0);
               }});
  c.push_back({"conv2d_block", {"conv2d_block", "conv2d_block_backward"}, kFloats, [](DType dt) {
                 compare_backends("conv2d_block",
                                  [](const TensorList& x) {
                                    return TensorList{conv2d_block(x[0], x[1], x[2], {.padding = {1, 1}}, Activation::Relu),
                                                      conv2d_block(x[0], x[3], Tensor(), {.groups = 2}, Activation::None,
                                                                   {.kernel_size = {3, 3}, .ceil_mode = true})};
                                  },
                                  {uniform_in({2, 4, 10, 10}), uniform_in({6, 4, 3, 3}), uniform_in({6}), uniform_in({4, 2, 2, 3})},
                                  dt, 8.0);
               }});
  c.push_back({"avg_pool2d", {"avg_pool2d", "avg_pool2d_backward"}, kFloats, [](DType dt) {
                 compare_backends("avg_pool2d",
                                  [](const TensorList& x) {
                                    return TensorList{avg_pool2d(x[0], {2, 2}), avg_pool2d(x[0], {3, 3}, {2, 2}, {1, 1}, false, false)};
                                  },
                                  {uniform_in({2, 3, 11, 12})}, dt, 2.0);
               }});
  // -- normalisation
  c.push_back({"softmax", {"softmax", "softmax_backward"}, kFloats, [](DType dt) {
                 compare_backends("softmax",
                                  [](const TensorList& x) {
                                    return TensorList{softmax(x[0], -1), log_softmax(x[0], -1), softmax(x[0], 0), log_softmax(x[1], -1)};
                                  },
                                  {uniform_in({12, 130}, -5, 5), uniform_in({3, 5000}, -5, 5)}, dt, 4.0);
               }});
  c.push_back({"layer_norm", {"layer_norm", "layer_norm_backward"}, kFloats, [](DType dt) {
                 compare_backends("layer_norm",
                                  [](const TensorList& x) {
                                    return TensorList{layer_norm(x[0], {96}, x[1], x[2]), layer_norm(x[0], {96})};
                                  },
                                  {uniform_in({2, 33, 96}), uniform_in({96}), uniform_in({96})}, dt, 8.0);
               }});
  // -- optimizers, grad scaler and clipping: several steps, parameters compared after each
  c.push_back({"optimizers", {"sgd_step", "adam_step"}, kFloats, [](DType dt) {
                 for (int which = 0; which < 3; ++which) {
                   SCOPED_TRACE(which == 0 ? "SGD" : which == 1 ? "Adam" : "AdamW");
                   std::vector<Tensor> init = {agt::rand64({70, 3}, -1, 1, false), agt::rand64({100001}, -1, 1, false)};
                   auto make = [&](Device d) {
                     std::vector<Tensor> ps;
                     for (const Tensor& t : init) ps.push_back(t.to(dt).to(d).detach().requires_grad_(true));
                     return ps;
                   };
                   std::vector<Tensor> pc = make(kCPU), pg = make(kGpu);
                   // 16-bit parameters step through float32 master weights, the mixed-precision path.
                   const bool master = dt == kFloat16 || dt == kBFloat16;
                   auto opt = [&](std::vector<Tensor> ps) -> std::unique_ptr<optim::Optimizer> {
                     if (which == 0)
                       return std::make_unique<optim::SGD>(
                           ps, optim::SGDOptions{.lr = 0.1,
                                                 .momentum = 0.9,
                                                 .weight_decay = 0.01,
                                                 .nesterov = true,
                                                 .update_rounding = master ? optim::UpdateRounding::Master
                                                                           : optim::UpdateRounding::Nearest});
                     if (which == 1)
                       return std::make_unique<optim::Adam>(
                           ps, optim::AdamOptions{.lr = 0.01,
                                                  .weight_decay = 0.01,
                                                  .update_rounding = master ? optim::UpdateRounding::Master
                                                                            : optim::UpdateRounding::Nearest});
                     return std::make_unique<optim::AdamW>(
                         ps, optim::AdamWOptions{.lr = 0.01,
                                                 .update_rounding = master ? optim::UpdateRounding::Master
                                                                           : optim::UpdateRounding::Nearest});
                   };
                   auto oc = opt(pc), og = opt(pg);
                   for (int step = 0; step < 5; ++step) {
                     for (size_t k = 0; k < pc.size(); ++k) {
                       const Tensor g = agt::rand64(init[k].sizes().vec(), -1, 1, false).to(dt);
                       pc[k].set_grad(g);
                       pg[k].set_grad(g.to(kGpu));
                     }
                     oc->step();
                     og->step();
                     for (size_t k = 0; k < pc.size(); ++k)
                       EXPECT_TRUE(agt::allclose(pg[k].detach().to(kCPU), pc[k].detach(), scaled(dt, 2.0))) << "step " << step;
                   }
                 }
               }});
  c.push_back({"grad_scaler", {"scale_and_check", "update_scale", "sum_of_squares"}, kLowp, [](DType dt) {
                 const Tensor init = agt::rand64({4097}, -1, 1, false);
                 Tensor pc = init.to(dt).detach().requires_grad_(true), pg = init.to(dt).to(kGpu).detach().requires_grad_(true);
                 optim::SGD oc({pc}, {.lr = 0.1}), og({pg}, {.lr = 0.1});
                 GradScaler sc({.init_scale = 1024, .growth_interval = 2}), sg({.init_scale = 1024, .growth_interval = 2});
                 // The scaler refuses float16 gradients on every device (they cannot hold an
                 // unscaled value): float16 reaches these kernels through clipping alone.
                 for (int step = 0; dt != kFloat16 && step < 6; ++step) {
                   Tensor g = agt::rand64({4097}, -1, 1, false) * 1024.0;
                   if (step == 3) g = where(gt(g, 900.0), full({4097}, INFINITY, kFloat64), g);  // an overflow
                   pc.set_grad(g.to(dt));
                   pg.set_grad(g.to(dt).to(kGpu));
                   const bool stepped_c = bool(sc.step(oc)), stepped_g = bool(sg.step(og));
                   EXPECT_EQ(stepped_g, stepped_c) << "step " << step;
                   sc.update();
                   sg.update();
                   EXPECT_EQ(sg.get_scale(), sc.get_scale()) << "step " << step;
                   EXPECT_TRUE(agt::allclose(pg.detach().to(kCPU), pc.detach(), scaled(dt, 2.0))) << "step " << step;
                 }
                 pc.set_grad(init.to(dt) * 3.0);
                 pg.set_grad(init.to(dt).to(kGpu) * 3.0);
                 const Tensor nc = nn::clip_grad_norm_({pc}, 1.0), ng = nn::clip_grad_norm_({pg}, 1.0);
                 EXPECT_TRUE(agt::allclose(ng.to(kCPU), nc, 1e-5, 0));
                 EXPECT_TRUE(agt::allclose(pg.grad().to(kCPU), pc.grad(), scaled(dt, 1.0)));
               }});
  // -- what the cases above leave out (issue 43 section 2)
  // Reductions over dim 0 of tall [R, C] inputs take the columns kernel with the reduced
  // range split into chunks (reduce.cu's chunks_for: few column blocks, R >= 8192) and the
  // merge kernel; the 3-D input splits with two outer outputs per column.
  c.push_back({"reduce_columns_split", {"reduce", "max_min_dim"}, {kFloat32, kBFloat16, kFloat64}, [](DType dt) {
                 compare_backends("reduce_columns_split",
                                  [](const TensorList& x) {
                                    const Tensor a = x[0], b = x[1];
                                    auto [v, i] = max(a, 0);
                                    return TensorList{sum(a, {0}),     mean(a, {0}),     amax(a, {0}), argmin(a, 0), var(a, {0}),
                                                      logsumexp(a, {0}), v,               i,            sum(b, {1}),  amin(b, {1})};
                                  },
                                  {grid_in({8200, 33}), grid_in({2, 8200, 20})}, dt, 8.0);
               }});
  // Layer norm's weight and bias gradients split the rows into chunks from 128 rows
  // (norm.cu's launch_layer_norm_backward) and merge them; the second one has no bias.
  c.push_back({"layer_norm_rows_split", {"layer_norm", "layer_norm_backward"}, kFloats, [](DType dt) {
                 compare_backends("layer_norm_rows_split",
                                  [](const TensorList& x) {
                                    return TensorList{layer_norm(x[0], {96}, x[1], x[2]), layer_norm(x[3], {40}, x[4], Tensor())};
                                  },
                                  {uniform_in({2, 100, 96}), uniform_in({96}), uniform_in({96}), uniform_in({300, 40}), uniform_in({40})},
                                  dt, 8.0);
               }});
  // The fused optimizer kernels take at most 36 tensors and 320 chunks of 65536 elements per
  // launch (optim.cu's for_each_pack): 5 small parameters, one of 321 chunks whose last 6
  // continue in the next pack (from its slot 5 to slot 0 there), then 40 small ones, which
  // fill that pack to 36 tensors and open a third. Clipping's sum of squares and the grad
  // scaler's unscale-and-check pack the same way. bfloat16 keeps the large one cheap (the
  // float32 master weights still step).
  c.push_back({"optimizer_packs", {"sgd_step", "adam_step", "scale_and_check", "update_scale", "sum_of_squares"}, {kBFloat16},
               [](DType dt) {
                 std::vector<int64_t> sizes;
                 for (int64_t k = 0; k < 45; ++k) sizes.push_back(1 + 37 * k);
                 sizes.insert(sizes.begin() + 5, 320 * 65536 + 100);
                 // SGD steps after clipping (sum_of_squares), AdamW through the grad scaler
                 // (gradients scaled by 1024, exact; scale_and_check unscales them).
                 for (int which = 0; which < 2; ++which) {
                   SCOPED_TRACE(which == 0 ? "SGD" : "AdamW");
                   std::vector<Tensor> pc, pg;
                   for (int64_t n : sizes) {
                     const Tensor init = agt::randf({n}, dt);
                     pc.push_back(init.detach().requires_grad_(true));
                     pg.push_back(init.to(kGpu).detach().requires_grad_(true));
                     const Tensor g = agt::randf({n}, dt) * (which == 1 ? 1024.0 : 1.0);
                     pc.back().set_grad(g);
                     pg.back().set_grad(g.to(kGpu));
                   }
                   if (which == 0) {
                     optim::SGD oc(pc, {.lr = 0.1, .momentum = 0.9, .update_rounding = optim::UpdateRounding::Master}),
                         og(pg, {.lr = 0.1, .momentum = 0.9, .update_rounding = optim::UpdateRounding::Master});
                     const Tensor nc = nn::clip_grad_norm_(pc, 100.0), ng = nn::clip_grad_norm_(pg, 100.0);
                     EXPECT_TRUE(agt::allclose(ng.to(kCPU), nc, 1e-4, 0)) << "the total norm";
                     oc.step();
                     og.step();
                   } else {
                     optim::AdamW oc(pc, {.lr = 0.01, .update_rounding = optim::UpdateRounding::Master}),
                         og(pg, {.lr = 0.01, .update_rounding = optim::UpdateRounding::Master});
                     GradScaler sc({.init_scale = 1024}), sg({.init_scale = 1024});
                     EXPECT_TRUE(bool(sc.step(oc)));
                     EXPECT_TRUE(bool(sg.step(og)));
                     sc.update();
                     sg.update();
                     EXPECT_EQ(sg.get_scale(), sc.get_scale());
                   }
                   for (size_t k = 0; k < pc.size(); ++k)
                     EXPECT_TRUE(agt::allclose(pg[k].detach().to(kCPU), pc[k].detach(), scaled(dt, 2.0))) << "parameter " << k;
                 }
               }});
  // Update rounding of 16-bit parameters (optim's update_rounding) and the stalled count:
  // stochastic rounding draws the same bits on both devices for one seed, and the Kahan
  // compensation is kept alike. The draws are keyed by element, parameter and step, so the
  // parameter of 321 chunks, split across packs, draws as on the CPU. The emulator computes
  // the float32 update as the CPU does, so the results agree bit for bit there; on a GPU
  // nvcc may fuse a multiply and an add of the update, moving a value by a float32 ulp
  // before it is rounded, so an element may round to the other neighbour: within one
  // 16-bit ulp (2^-7 relative) there. The stalled counts are kept per parameter: the one
  // split across packs adds its second pack's count to its own slot (1), not to slot 0 of
  // that pack's list; a step counts without a host sync.
  c.push_back({"optimizer_rounding", {"sgd_step", "adam_step"}, {kBFloat16, kFloat16}, [](DType dt) {
                 const bool exact = cuda_emulated();
                 for (UpdateRounding mode : {UpdateRounding::Stochastic, UpdateRounding::Compensated}) {
                   for (int which = 0; which < 2; ++which) {
                     SCOPED_TRACE(std::string(update_rounding_name(mode)) + (which ? " AdamW" : " SGD"));
                     // Once (it is large), a parameter whose last chunks continue in a second
                     // pack at slot 0 there, which must draw with its own id.
                     const bool packs = mode == UpdateRounding::Stochastic && which == 0 && dt == kBFloat16;
                     const std::vector<int64_t> sizes = {1000, (packs ? 320 : 3) * 65536 + 100, 37};
                     std::vector<Tensor> pc, pg;
                     for (int64_t n : sizes) {
                       const Tensor init = agt::randf({n}, dt);
                       pc.push_back(init.detach().requires_grad_(true));
                       pg.push_back(init.to(kGpu).detach().requires_grad_(true));
                     }
                     auto opt = [&](std::vector<Tensor> ps) -> std::unique_ptr<optim::Optimizer> {
                       if (which == 0)
                         return std::make_unique<optim::SGD>(
                             ps, optim::SGDOptions{.lr = 1e-3, .momentum = 0.9, .update_rounding = mode});
                       return std::make_unique<optim::AdamW>(ps,
                                                             optim::AdamWOptions{.lr = 1e-4, .update_rounding = mode});
                     };
                     auto oc = opt(pc), og = opt(pg);
                     og->set_rounding_seed(oc->rounding_seed());
                     oc->set_count_stalled(true);
                     og->set_count_stalled(true);
                     for (int step = 0; step < (packs ? 1 : 3); ++step) {
                       for (size_t k = 0; k < pc.size(); ++k) {
                         const Tensor g = agt::randf({sizes[k]}, dt);
                         pc[k].set_grad(g);
                         pg[k].set_grad(g.to(kGpu));
                       }
                       oc->step();
                       EXPECT_EQ(agt::host_syncs_of([&] { og->step(); }), std::vector<std::string>{});
                       for (size_t k = 0; k < pc.size(); ++k) {
                         const Tensor got = pg[k].detach().to(kCPU);
                         if (exact)
                           EXPECT_TRUE(agt::same_bits(got, pc[k].detach())) << "parameter " << k << ", step " << step;
                         else
                           EXPECT_TRUE(agt::allclose(got, pc[k].detach(), 1.0 / 128, 0))
                               << "parameter " << k << ", step " << step;
                       }
                       const int64_t sc = oc->stalled_count().item<int64_t>(),
                                     sg = og->stalled_count().to(kCPU).item<int64_t>();
                       EXPECT_GT(sc, 0) << "step " << step;  // updates of 1e-4 to values near 1 are lost
                       if (exact) EXPECT_EQ(sg, sc) << "step " << step;
                       const std::vector<int64_t> per_c = oc->stalled_counts(0).to_vector<int64_t>(),
                                                  per_g = og->stalled_counts(0).to_vector<int64_t>();
                       ASSERT_EQ(per_g.size(), sizes.size());
                       int64_t sum_g = 0;
                       for (int64_t v : per_g) sum_g += v;
                       EXPECT_GT(per_c[1], 0) << "step " << step;  // the large one (across packs)
                       EXPECT_EQ(sum_g, sg) << "step " << step;
                       if (exact) EXPECT_EQ(per_g, per_c) << "step " << step;
                     }
                   }
                 }
               }});
  // Batched products with broadcast operands: through the frontend, and through the backend
  // directly so that its own batch handling runs: blas.cu's gemm() turns a shared right
  // operand (batch stride 0) with left batches stored row after row into one tall GEMM;
  // left batches with a gap between them, a transposed shared right operand, a broadcast
  // left operand and two broadcast operands keep (or are) strided batches.
  c.push_back({"matmul_broadcast", {"matmul"}, kFloats, [](DType dt) {
                 compare_backends("matmul_broadcast",
                                  [](const TensorList& x) {
                                    const Tensor a = x[0], w = x[1], v = x[2], b = x[3], gapped = x[4].narrow(1, 0, 5),
                                                 wt = x[5].t(), at = x[6].transpose(1, 2);
                                    const std::vector<int64_t> wb = {3, 7, 4}, vb = {3, 5, 7};
                                    return TensorList{matmul(a, w.expand(wb)),
                                                      matmul(v.expand(vb), b),
                                                      matmul(v.expand(vb), w.expand(wb)),
                                                      backend_matmul(a, w.expand(wb)),
                                                      backend_matmul(a, wt.expand(wb)),
                                                      backend_matmul(gapped, w.expand(wb)),
                                                      backend_matmul(at, w.expand(wb)),
                                                      backend_matmul(v.expand(vb), b),
                                                      backend_matmul(v.expand(vb), w.expand(wb))};
                                  },
                                  {uniform_in({3, 5, 7}), uniform_in({7, 4}), uniform_in({5, 7}), uniform_in({3, 7, 4}),
                                   constant_in(agt::rand64({3, 6, 7}, -2, 2, false)), constant_in(agt::rand64({4, 7}, -2, 2, false)),
                                   constant_in(agt::rand64({3, 7, 5}, -2, 2, false))},
                                  dt, 8.0);
               }});
  // Empty tensors (numel 0) through elementwise ops, reductions (an empty sum is 0, an empty
  // mean NaN), products with K = 0 (zeros, plus the bias) and M = 0, softmax, layer norm
  // (zero parameter gradients), cat and index_select, forward and backward.
  c.push_back({"empty",
               {"unary", "binary", "reduce", "matmul", "linear", "softmax", "softmax_backward", "layer_norm",
                "layer_norm_backward", "index_select", "index_add", "copy"},
               kFloats, [](DType dt) {
                 compare_backends("empty",
                                  [](const TensorList& x) {
                                    const Tensor e = x[0], z = x[3];
                                    return TensorList{e * 2.0 + 1.0,        exp(e),          e - z.narrow(0, 0, 0),
                                                      sum(e),               sum(e, {0}),     amax(e, {1}),
                                                      mean(e, {0}),         matmul(x[1], x[2]), matmul(e, z.t()),
                                                      linear(x[1], x[4], x[5]), softmax(e, -1), log_softmax(e, 0),
                                                      layer_norm(e, {7}, x[6], x[7]), cat({e, z}, 0),
                                                      z.index_select(0, x[8]), e.index_select(1, x[9])};
                                  },
                                  {uniform_in({0, 7}), uniform_in({3, 0}), uniform_in({0, 5}), uniform_in({4, 7}),
                                   uniform_in({6, 0}), uniform_in({6}), uniform_in({7}), uniform_in({7}), index_in({0}, 4),
                                   index_in({3}, 7)},
                                  dt, 1.0);
               }});
  // Integer and bool tensors: arithmetic (uint8 wraps), comparisons, where, sums (into
  // int64), extrema, index ops, strided copies and casts to and from float (out-of-range
  // floats convert by the host's rule on both).
  c.push_back({"integer", {"binary", "compare", "where", "reduce", "max_min_dim", "index_select", "gather", "copy"},
               {kInt64, kInt32, kUInt8, kBool}, [](DType dt) {
                 const bool is_bool = dt == kBool;
                 auto ints = [&](std::vector<int64_t> shape, int64_t lo, int64_t hi) {
                   return constant_in(randint(is_bool ? 0 : lo, is_bool ? 2 : hi, shape, kInt64).to(dt));
                 };
                 compare_backends(std::string("integer ") + dtype_name(dt),
                                  [dt, is_bool](const TensorList& x) {
                                    const Tensor a = x[0], b = x[1], f = x[4];
                                    TensorList out = {eq(a, b), ne(a, b), lt(a, b), ge(a, b.t().contiguous().t()),
                                                      where(ne(a, b), a, b), sum(a), sum(a, {0}), amax(a, {1}),
                                                      argmax(a, 1), a.index_select(1, x[2]), a.gather(1, x[3]),
                                                      a.transpose(0, 1).contiguous(), a.to(kFloat32), f.to(dt),
                                                      cat({a, b.expand({3, 9})}, 0)};
                                    if (is_bool) {
                                      out.push_back(logical_and(a, b));
                                      out.push_back(logical_or(a, b));
                                    } else {
                                      // extrema of rows that are all negative (uint8 wraps) or all large
                                      auto [v, i] = max(a - 60, 0);
                                      for (const Tensor& t : {a + b, a * b, a - b, maximum(a, b), minimum(a, b), a * 3, 2 + a, v, i,
                                                              amax(a - 60, {1}), amin(a + 60, {0}), argmax(a - 60, 0)})
                                        out.push_back(t);
                                    }
                                    return out;
                                  },
                                  {ints({6, 9}, -50, 50), ints({1, 9}, -50, 50), index_in({11}, 9), index_in({6, 4}, 9),
                                   constant_in(agt::rand64({5, 8}, -300, 300, false))},
                                  kFloat32, 0.0);
               }});
  // In-place writes into views of a larger tensor, which is compared whole: a kernel that
  // writes past its view (an off-by-one bound) changes the neighbours. The dense views start
  // 16-byte aligned, so that they take the vectorised kernel, and leave a scalar tail.
  c.push_back({"views_written", {"fill", "binary", "unary", "copy"}, kFloats, [](DType dt) {
                 compare_backends("views_written",
                                  [](const TensorList& x) {
                                    Tensor buf = x[0].detach().clone();
                                    buf.narrow(0, 8, 101).fill_(0.5);
                                    buf.narrow(0, 120, 53).mul_(x[1].detach());
                                    buf.narrow(0, 200, 120).view({40, 3}).narrow(1, 0, 2).copy_(x[2].detach());
                                    buf.narrow(0, 336, 45).clamp_(-0.5, 0.5);
                                    return TensorList{buf};
                                  },
                                  {uniform_in({400}), uniform_in({53}), uniform_in({40, 2})}, dt, 1.0);
               }});
  // Cases run on a created stream (on_side_stream): the waits between streams that Event
  // gives, in strict mode.
  c.push_back({"side_stream", {"binary", "reduce", "matmul", "softmax", "softmax_backward", "layer_norm", "layer_norm_backward"},
               kLowp, [](DType dt) {
                 compare_backends("side_stream",
                                  on_side_stream([](const TensorList& x) {
                                    return TensorList{x[0] * x[1], sum(x[0], {1}), matmul(x[0], x[2]), softmax(x[0], -1),
                                                      layer_norm(x[0], {40}, x[3], x[4])};
                                  }),
                                  {uniform_in({17, 40}), uniform_in({1, 40}), uniform_in({40, 9}), uniform_in({40}), uniform_in({40})},
                                  dt, 8.0);
               }});
  return c;
}

// ---- coverage -------------------------------------------------------------------------------
std::string read_source(const std::string& rel) {
  std::ifstream in(agt::source_dir() + "/" + rel);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The kernel entries of Backend: the virtual functions after the streams-and-events section.
std::set<std::string> backend_kernel_entries() {
  const std::string src = read_source("core/include/ampgrad/backend.h");
  const size_t from = src.find("// ---- data movement");
  std::set<std::string> names;
  const std::regex virt(R"(virtual\s+[\w:<>&\s\*]+?\b(\w+)\s*\()");
  for (auto it = std::sregex_iterator(src.begin() + long(from), src.end(), virt); it != std::sregex_iterator(); ++it)
    names.insert((*it)[1]);
  return names;
}

TEST(CudaHarness, EveryBackendEntryHasACase) {
  const std::set<std::string> entries = backend_kernel_entries();
  ASSERT_GE(entries.size(), 30u) << "the scan of backend.h found too few entries";
  std::set<std::string> covered;
  for (const Case& c : all_cases())
    for (const std::string& e : c.entries) {
      EXPECT_TRUE(entries.count(e)) << "case " << c.name << " names " << e << ", which is no Backend entry";
      covered.insert(e);
    }
  for (const std::string& e : entries) EXPECT_TRUE(covered.count(e)) << "no harness case reaches Backend::" << e;
}

// The entries whose Backend default is `kind` in core/src/backend.cpp: "missing" (throws
// "not implemented") or "composed" (calls the entry's *_composed form).
std::set<std::string> entries_defaulting_to(const std::string& kind) {
  const std::string src = read_source("core/src/backend.cpp");
  const std::regex def(R"(\bBackend::(\w+)\([^{]*\{\s*(return\s+)?(AG_MISSING|(\w+)_composed)\()");
  std::set<std::string> names;
  for (auto it = std::sregex_iterator(src.begin(), src.end(), def); it != std::sregex_iterator(); ++it) {
    const bool missing = (*it)[3] == "AG_MISSING";
    if (kind == "missing" ? missing : (!missing && (*it)[4] == (*it)[1])) names.insert((*it)[1]);
  }
  return names;
}

// The one fallback rule: every primitive entry's default throws, every fused entry's default
// is its composition, and CUDA declares every primitive entry (a fused one only with a
// fused form of its own).
TEST(CudaHarness, CudaBackendDeclaresEveryEntry) {
  const std::string decl = read_source("kernels/cuda/cuda_backend.h");
  ASSERT_FALSE(decl.empty());
  const std::set<std::string> missing = entries_defaulting_to("missing"), composed = entries_defaulting_to("composed");
  EXPECT_TRUE(composed.count("attention") && composed.count("conv2d_block") && composed.count("linear_act"))
      << "the scan of backend.cpp found no composed defaults";
  for (const std::string& e : backend_kernel_entries()) {
    EXPECT_NE(missing.count(e) + composed.count(e), 0u)
        << "Backend::" << e << " neither throws by default nor composes (core/src/backend.cpp)";
    if (missing.count(e))
      EXPECT_TRUE(std::regex_search(decl, std::regex("\\b" + e + "\\([^;]*\\)\\s*override;")))
          << "CudaBackend does not declare " << e;
  }
  // Declared entries must be defined (the link fails otherwise) and must not fall back to
  // Backend's "not implemented" default.
  for (const char* family :
       {"backend", "elementwise", "random", "index", "reduce", "norm", "loss", "blas", "conv", "optim"}) {
    const std::string src = read_source("kernels/cuda/" + std::string(family) + ".cu");
    EXPECT_FALSE(src.empty()) << "kernels/cuda/" << family << ".cu is missing";
    EXPECT_FALSE(std::regex_search(src, std::regex(R"((^|[^A-Za-z_])Backend::[a-z_0-9]+\()")))
        << "kernels/cuda/" << family << ".cu forwards an entry to Backend's default";
  }
}

// One test over every case (each failure names its case and dtype), so that a machine
// without a GPU lists one skip, not one per case.
TEST(CudaBackendOps, EveryCaseMatchesTheCpu) {
  if (!built_with_cuda()) AGT_SKIP_BUILD() << "built without CUDA";
  if (!have_cuda()) AGT_SKIP_HARDWARE() << "no CUDA device";
  for (const Case& c : all_cases()) {
    for (DType dt : c.dtypes) {
      SCOPED_TRACE("case " + c.name + " in " + std::string(dtype_name(dt)));
      manual_seed(42);
      try {
        c.run(dt);
      } catch (const Error& e) {
        ADD_FAILURE() << c.name << " in " << dtype_name(dt) << ": " << e.what();
      }
    }
  }
}

}  // namespace

namespace {

// The index a max-pooling window saves for its backward: a window with no tap inside the
// input (width 1, kernel 2, dilation 2, padding 1: columns -1 and 1) saves -1, not an
// index built from its first tap (which is the next row's element). The backward gathers
// per input element and checks each window's geometry, so the harness's gradients could
// not see the wrong index; a backward that scatters through it would route gradient there.
TEST(CudaBackendOps, MaxPoolWindowWithNoInputTapSavesNoIndex) {
  if (!built_with_cuda()) AGT_SKIP_BUILD() << "built without CUDA";
  if (!have_cuda()) AGT_SKIP_HARDWARE() << "no CUDA device";
  const Tensor x = from_vector<float>({1, 2, 3}, {1, 1, 3, 1}).to(kGpu);
  Pool2dParams p;
  p.kernel[1] = 2;
  p.padding[1] = 1;
  p.dilation[1] = 2;
  const Tensor out = empty({1, 1, 3, 1}, TensorOptions().device(kGpu));
  const Tensor idx = backend(kGpu, "max_pool2d").max_pool2d(x, out, p);
  ASSERT_EQ(idx.dtype(), kInt64);
  EXPECT_EQ(idx.to(kCPU).to_vector<int64_t>(), std::vector<int64_t>({-1, -1, -1}));
  for (float v : out.to(kCPU).to_vector<float>()) EXPECT_EQ(v, -INFINITY);
}

}  // namespace
