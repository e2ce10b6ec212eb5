// The fused multi-tensor optimizer steps against the per-parameter rules, written out here
// element by element in the same arithmetic: 20 steps of SGD (momentum, dampening,
// nesterov, weight decay), Adam and AdamW, on float32, float64 and bfloat16 parameters with
// and without float32 master weights, with a parameter that sometimes has no gradient and
// a step skipped on the device in the middle (Adam and AdamW in each instruction-set variant
// of their loop, hw::set_kernel_isa). Parameters, state and step counts must agree bit for
// bit.
#include "support/testing.h"

#include <cmath>
#include <cstring>

using namespace ag;

namespace {

// One parameter as the reference sees it: values in the parameter's dtype (held as the
// float or double the kernels compute in, rounded after every update), float32 state.
struct RefParam {
  DType dtype;
  std::vector<double> p;  // exactly representable in dtype
  std::vector<float> buf1, buf2, master;
  bool has_master = false;
  int64_t step = 0;
};

// Rounds an accumulator value to the parameter's dtype, as the kernels' store does.
template <class A>
double store(A w, DType dt) {
  if (dt == kBFloat16) return double(float(BFloat16(float(w))));
  if (dt == kFloat32) return double(float(w));
  return double(w);
}

template <class A>
void ref_sgd(RefParam& r, const std::vector<double>& g, double lr_v, const SgdParams& s) {
  const A lr = A(lr_v), mom = A(s.momentum), damp = A(1 - s.dampening), wd = A(s.weight_decay);
  const bool first = r.step == 0;
  for (size_t i = 0; i < r.p.size(); ++i) {
    A w = r.has_master ? A(r.master[i]) : A(r.p[i]);
    A d = A(g[i]) + wd * w;
    if (s.momentum != 0) {
      const A v = first ? d : mom * A(r.buf1[i]) + damp * d;
      r.buf1[i] = float(v);
      d = s.nesterov ? d + mom * v : v;
    }
    w -= lr * d;
    if (r.has_master) r.master[i] = float(w);
    r.p[i] = store(w, r.dtype);
  }
  ++r.step;
}

template <class A>
void ref_adam(RefParam& r, const std::vector<double>& g, double lr_v, const AdamParams& s) {
  const int64_t t = r.step + 1;
  const double bc1 = 1 - std::pow(s.beta1, double(t)), bc2_sqrt = std::sqrt(1 - std::pow(s.beta2, double(t)));
  const A b1 = A(s.beta1), b2 = A(s.beta2), eps = A(s.eps * bc2_sqrt);
  const A omb1 = A(1 - s.beta1), omb2 = A(1 - s.beta2);
  const A step_size = A(lr_v * bc2_sqrt / bc1);
  const A decay = s.decoupled ? A(1 - lr_v * s.weight_decay) : A(1);
  const A l2 = s.decoupled ? A(0) : A(s.weight_decay);
  for (size_t i = 0; i < r.p.size(); ++i) {
    A w = r.has_master ? A(r.master[i]) : A(r.p[i]);
    const A gi = A(g[i]) + l2 * w;
    w *= decay;
    const A a = b1 * A(r.buf1[i]) + omb1 * gi;
    const A v = b2 * A(r.buf2[i]) + omb2 * gi * gi;
    r.buf1[i] = float(a);
    r.buf2[i] = float(v);
    w -= step_size * a / (std::sqrt(v) + eps);
    if (r.has_master) r.master[i] = float(w);
    r.p[i] = store(w, r.dtype);
  }
  r.step = t;
}

struct Case {
  std::string name;
  std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>, bool master)> make;
  std::function<void(RefParam&, const std::vector<double>&, double lr)> ref;
  bool momentum_state, adam_state;
  double lr;
};

std::vector<float> floats(const Tensor& t) { return t.to_vector<float>(); }

bool bits_equal(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

template <class F>
std::function<void(RefParam&, const std::vector<double>&, double)> by_dtype(F f) {
  return [f](RefParam& r, const std::vector<double>& g, double lr) {
    if (r.dtype == kFloat64) f.template operator()<double>(r, g, lr);
    else f.template operator()<float>(r, g, lr);
  };
}

// The SGD cases (adam false) or the Adam and AdamW ones (adam true).
std::vector<Case> cases(bool adam_cases) {
  const SgdParams sgd_nesterov{.momentum = 0.9, .dampening = 0, .weight_decay = 0.01, .nesterov = true};
  const SgdParams sgd_damped{.momentum = 0.8, .dampening = 0.25, .weight_decay = 0, .nesterov = false};
  const SgdParams sgd_plain{.momentum = 0, .dampening = 0, .weight_decay = 0.05, .nesterov = false};
  const AdamParams adam{.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01, .decoupled = false};
  const AdamParams adamw{.beta1 = 0.85, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1, .decoupled = true};
  auto sgd_case = [](std::string name, SgdParams p, double lr) {
    return Case{
        name,
        [p, lr](std::vector<Tensor> ps, bool m) -> std::unique_ptr<optim::Optimizer> {
          return std::make_unique<optim::SGD>(
              ps,
              optim::SGDOptions{.lr = lr,
                                .momentum = p.momentum,
                                .dampening = p.dampening,
                                .weight_decay = p.weight_decay,
                                .nesterov = p.nesterov,
                                .update_rounding = m ? optim::UpdateRounding::Master : optim::UpdateRounding::Nearest});
        },
        by_dtype([p]<class A>(RefParam& r, const std::vector<double>& g, double lr) { ref_sgd<A>(r, g, lr, p); }),
        p.momentum != 0,
        false,
        lr};
  };
  const std::vector<Case> all = {
      sgd_case("SGD nesterov, weight decay", sgd_nesterov, 0.05),
      sgd_case("SGD dampened momentum", sgd_damped, 0.1),
      sgd_case("SGD plain, weight decay", sgd_plain, 0.2),
      {"Adam",
       [adam](std::vector<Tensor> ps, bool m) -> std::unique_ptr<optim::Optimizer> {
         return std::make_unique<optim::Adam>(
             ps,
             optim::AdamOptions{.lr = 1e-2,
                                .weight_decay = adam.weight_decay,
                                .update_rounding = m ? optim::UpdateRounding::Master : optim::UpdateRounding::Nearest});
       },
       by_dtype([adam]<class A>(RefParam& r, const std::vector<double>& g, double lr) { ref_adam<A>(r, g, lr, adam); }),
       true, true, 1e-2},
      {"AdamW",
       [adamw](std::vector<Tensor> ps, bool m) -> std::unique_ptr<optim::Optimizer> {
         return std::make_unique<optim::AdamW>(
             ps, optim::AdamWOptions{
                     .lr = 3e-3,
                     .beta1 = adamw.beta1,
                     .beta2 = adamw.beta2,
                     .eps = adamw.eps,
                     .weight_decay = adamw.weight_decay,
                     .update_rounding = m ? optim::UpdateRounding::Master : optim::UpdateRounding::Nearest});
       },
       by_dtype(
           [adamw]<class A>(RefParam& r, const std::vector<double>& g, double lr) { ref_adam<A>(r, g, lr, adamw); }),
       true, true, 3e-3},
  };
  std::vector<Case> out;
  for (const Case& c : all)
    if (c.adam_state == adam_cases) out.push_back(c);
  return out;
}

// 20 steps of case c on float32 (one of `large` elements, split over threads in pieces of
// 16384), float64 and bfloat16 parameters in one group, with and without master weights,
// against the per-parameter rule.
void expect_steps_match(const Case& c, int64_t large) {
  const std::vector<std::pair<std::vector<int64_t>, DType>> layout = {
      {{large}, kFloat32}, {{7, 5}, kFloat32}, {{3, 4}, kFloat64}, {{300}, kBFloat16}, {{6}, kBFloat16}};
  for (bool master : {false, true}) {
    SCOPED_TRACE(c.name + (master ? ", master weights" : ""));
    manual_seed(71);
    std::vector<Tensor> params;
    std::vector<RefParam> ref;
    for (const auto& [shape, dt] : layout) {
      Tensor p = (rand(shape, dt) * 2.0 - 1.0).detach().requires_grad_();
      params.push_back(p);
      RefParam r{dt, p.to_vector<double>()};
      const size_t n = r.p.size();
      r.has_master = master && dt == kBFloat16;
      if (r.has_master) r.master = floats(p);
      if (c.momentum_state || c.adam_state) r.buf1.assign(n, 0.0f);
      if (c.adam_state) r.buf2.assign(n, 0.0f);
      ref.push_back(r);
    }
    auto opt = c.make(params, master);
    for (int step = 0; step < 20; ++step) {
      const bool skip = step == 9;  // overflowed: the fused call must write nothing
      for (size_t k = 0; k < params.size(); ++k) {
        // parameter 1 has no gradient every third step: its own step count lags
        if (k == 1 && step % 3 == 2) {
          params[k].set_grad(Tensor());
          continue;
        }
        Tensor g = (randn(params[k].sizes().vec()) * 0.5).to(params[k].dtype());
        params[k].set_grad(g);
        if (!skip) c.ref(ref[k], g.to_vector<double>(), c.lr);
      }
      const Tensor found_inf = full({1}, skip ? 1.0 : 0.0, kFloat32);
      const StepResult r = opt->step(found_inf);
      EXPECT_EQ(bool(r), !skip);
    }
    const auto sd = opt->state_dict();
    EXPECT_EQ(sd.at("steps").item<int64_t>(), 19);  // 20 calls, one skipped
    for (size_t k = 0; k < params.size(); ++k) {
      SCOPED_TRACE("parameter " + std::to_string(k) + " (" + dtype_name(params[k].dtype()) + ")");
      EXPECT_TRUE(bits_equal(params[k].to_vector<double>(), ref[k].p));
      const std::string sp = "state.0." + std::to_string(k) + ".";
      EXPECT_EQ(sd.at(sp + "step").item<int64_t>(), ref[k].step);
      if (c.momentum_state || c.adam_state) EXPECT_EQ(floats(sd.at(sp + "buf1")), ref[k].buf1);
      if (c.adam_state) EXPECT_EQ(floats(sd.at(sp + "buf2")), ref[k].buf2);
      if (ref[k].has_master) EXPECT_EQ(floats(sd.at(sp + "master")), ref[k].master);
      EXPECT_EQ(sd.count(sp + "master") > 0, ref[k].has_master);
    }
  }
}

}  // namespace

TEST(OptimFused, SgdStepsMatchThePerParameterRuleBitForBit) {
  for (const Case& c : cases(false)) expect_steps_match(c, 40000);
}

// Adam's loop has an AVX-512 variant (optim.cpp): each level this CPU runs is forced in
// turn, and each must give the per-parameter rule's bits (test_optim.cpp holds the steps to
// float64 references of PyTorch's documented rules). The large parameter is two pieces,
// the second 27 elements long (a vector tail).
class OptimFusedEachIsa : public agt::EachKernelIsa {};
TEST_P(OptimFusedEachIsa, AdamStepsMatchThePerParameterRuleBitForBit) {
  for (const Case& c : cases(true)) expect_steps_match(c, 16384 + 27);
}
AGT_EACH_KERNEL_ISA(OptimFusedEachIsa);

// A learning rate on the device is read there: the same result as the host value.
TEST(OptimFused, DeviceLearningRateEqualsHostLearningRate) {
  manual_seed(72);
  Tensor a = randn({50}).requires_grad_(), b = a.detach().clone().requires_grad_();
  optim::AdamW host({a}, {.lr = 0.01}), dev({b}, {.lr = 123.0});
  dev.set_lr(0, full({1}, 0.01, kFloat64));
  for (int i = 0; i < 5; ++i) {
    Tensor g = randn({50});
    a.set_grad(g);
    b.set_grad(g.clone());
    host.step();
    dev.step();
  }
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  EXPECT_DOUBLE_EQ(dev.lr(), 0.01);
  EXPECT_AG_ERROR(dev.set_lr(0, full({1}, 0.01, kFloat32)), "a learning-rate tensor must be float64 with one element, got float32");
  EXPECT_AG_ERROR(host.step(zeros({2})), "[AdamW] found_inf must be a float32 tensor of one element");
}
