// Every row of the autocast policy tables (autocast/src/policy.cpp), CPU and CUDA, against
// the ops themselves. The tests walk autocast::policy_table, so a new row is covered by the
// case list below or fails for lack of a case; a row whose name no op passes to the
// dispatch hook (a misspelling does nothing at all otherwise) fails too, as does an op that
// stops asking the hook.
//
// On the CPU each case runs under an autocast region, with a hook in front of autocast's
// that records what the op asked and what it computed with. For the CUDA rows the same
// cases run on the CPU only up to the hook: it records the op's name and input dtypes and
// stops the op there, and autocast::cast_dtypes (the decision cast_inputs takes for every
// device) gives the dtypes a CUDA region would cast them to; no kernel runs. Where a CUDA
// device exists the cases also run there under a CUDA region.
#include "support/testing.h"

#include <algorithm>
#include <map>
#include <set>

using namespace ag;

namespace {

using Shape = std::vector<int64_t>;

// Inputs a case may need besides its floating ones, made on the case's device before the
// op runs: class indices for the losses (logits [3, 4]) and a condition for where ([2, 3]).
struct Aux {
  Tensor target;
  Tensor cond;
};

// One public entry point that reaches an op with a row: the shapes of its floating tensor
// inputs (in the order the op passes them to the hook) and the call.
struct Case {
  std::string entry;
  std::vector<Shape> floats;
  std::function<Tensor(const std::vector<Tensor>&, const Aux&)> call;
};

using F = std::vector<Tensor>;

// Every op the tables name, by every entry point that passes that name to the hook.
const std::map<std::string, std::vector<Case>>& cases() {
  static const std::map<std::string, std::vector<Case>> m = [] {
    std::map<std::string, std::vector<Case>> c;
    const Shape s23 = {2, 3};
    auto unary = [&](const char* name, Tensor (*op)(const Tensor&)) {
      c[name] = {{std::string(name) + "(x)", {s23}, [op](const F& f, const Aux&) { return op(f[0]); }}};
    };
    c["matmul"] = {{"matmul(a, b)", {{2, 3}, {3, 4}}, [](const F& f, const Aux&) { return matmul(f[0], f[1]); }}};
    c["linear"] = {
        {"linear(x, w, b)", {{2, 3}, {4, 3}, {4}}, [](const F& f, const Aux&) { return linear(f[0], f[1], f[2]); }},
        {"linear(x, w, b, relu)", {{2, 3}, {4, 3}, {4}},
         [](const F& f, const Aux&) { return linear(f[0], f[1], f[2], Activation::Relu); }}};
    c["feed_forward"] = {{"feed_forward", {{2, 3}, {5, 3}, {5}, {4, 5}, {4}}, [](const F& f, const Aux&) {
                            return feed_forward(f[0], f[1], f[2], Activation::Relu, f[3], f[4]);
                          }}};
    c["conv2d"] = {
        {"conv2d", {{1, 2, 5, 5}, {3, 2, 3, 3}, {3}}, [](const F& f, const Aux&) { return conv2d(f[0], f[1], f[2]); }},
        {"conv2d_block", {{1, 2, 5, 5}, {3, 2, 3, 3}, {3}}, [](const F& f, const Aux&) {
           return conv2d_block(f[0], f[1], f[2], Conv2dArgs{}, Activation::Relu, MaxPool2dArgs{});
         }}};
    c["scaled_dot_product_attention"] = {
        {"scaled_dot_product_attention(q, k, v, float mask)", {{1, 2, 3, 4}, {1, 2, 5, 4}, {1, 2, 5, 4}, {3, 5}},
         [](const F& f, const Aux&) {
           AttentionOptions o;
           o.attn_mask = f[3];
           return scaled_dot_product_attention(f[0], f[1], f[2], o);
         }}};
    unary("exp", &exp);
    unary("log", &log);
    unary("log1p", &log1p);
    unary("rsqrt", &rsqrt);
    unary("reciprocal", &reciprocal);
    c["pow"] = {{"pow(a, b)", {s23, s23}, [](const F& f, const Aux&) { return pow(f[0], f[1]); }},
                {"pow(a, 2)", {s23}, [](const F& f, const Aux&) { return pow(f[0], 2.0); }}};
    c["softmax"] = {{"softmax", {s23}, [](const F& f, const Aux&) { return softmax(f[0], 1); }}};
    c["log_softmax"] = {{"log_softmax", {s23}, [](const F& f, const Aux&) { return log_softmax(f[0], 1); }}};
    c["layer_norm"] = {{"layer_norm(x, [4], w, b)", {{2, 4}, {4}, {4}},
                        [](const F& f, const Aux&) { return layer_norm(f[0], {4}, f[1], f[2]); }}};
    c["sum"] = {{"sum(x)", {s23}, [](const F& f, const Aux&) { return sum(f[0]); }},
                {"sum(x, {0})", {s23}, [](const F& f, const Aux&) { return sum(f[0], {0}); }}};
    c["norm"] = {{"norm", {s23}, [](const F& f, const Aux&) { return norm(f[0]); }}};
    c["logsumexp"] = {{"logsumexp", {s23}, [](const F& f, const Aux&) { return logsumexp(f[0], {1}); }}};
    c["cross_entropy"] = {
        {"cross_entropy", {{3, 4}}, [](const F& f, const Aux& a) { return cross_entropy(f[0], a.target); }}};
    c["nll_loss"] = {{"nll_loss", {{3, 4}}, [](const F& f, const Aux& a) { return nll_loss(f[0], a.target); }}};
    c["mse_loss"] = {{"mse_loss", {s23, s23}, [](const F& f, const Aux&) { return mse_loss(f[0], f[1]); }}};
    c["binary_cross_entropy_with_logits"] = {
        {"binary_cross_entropy_with_logits", {s23, s23},
         [](const F& f, const Aux&) { return binary_cross_entropy_with_logits(f[0], f[1]); }}};
    c["cat"] = {{"cat", {{2, 3}, {1, 3}}, [](const F& f, const Aux&) { return cat({f[0], f[1]}); }}};
    c["stack"] = {{"stack", {s23, s23}, [](const F& f, const Aux&) { return stack({f[0], f[1]}); }}};
    c["where"] = {
        {"where(c, a, b)", {s23, s23}, [](const F& f, const Aux& a) { return where(a.cond, f[0], f[1]); }},
        {"where(c, a, 2)", {s23}, [](const F& f, const Aux& a) { return where(a.cond, f[0], 2.0); }},
        {"where(c, 2, b)", {s23}, [](const F& f, const Aux& a) { return where(a.cond, 2.0, f[0]); }},
        {"masked_fill", {s23}, [](const F& f, const Aux& a) { return masked_fill(f[0], a.cond, 2.0); }}};
    c["add"] = {{"add(a, b)", {s23, s23}, [](const F& f, const Aux&) { return add(f[0], f[1]); }},
                {"add(a, 2)", {s23}, [](const F& f, const Aux&) { return add(f[0], 2.0); }}};
    c["sub"] = {{"sub(a, b)", {s23, s23}, [](const F& f, const Aux&) { return sub(f[0], f[1]); }},
                {"sub(a, 2)", {s23}, [](const F& f, const Aux&) { return sub(f[0], 2.0); }},
                {"rsub(a, 2)", {s23}, [](const F& f, const Aux&) { return rsub(f[0], 2.0); }}};
    c["mul"] = {{"mul(a, b)", {s23, s23}, [](const F& f, const Aux&) { return mul(f[0], f[1]); }},
                {"mul(a, 2)", {s23}, [](const F& f, const Aux&) { return mul(f[0], 2.0); }}};
    c["div"] = {{"div(a, b)", {s23, s23}, [](const F& f, const Aux&) { return div(f[0], f[1]); }},
                {"div(a, 2)", {s23}, [](const F& f, const Aux&) { return div(f[0], 2.0); }},
                {"rdiv(a, 2)", {s23}, [](const F& f, const Aux&) { return rdiv(f[0], 2.0); }}};
    c["maximum"] = {{"maximum", {s23, s23}, [](const F& f, const Aux&) { return maximum(f[0], f[1]); }}};
    c["minimum"] = {{"minimum", {s23, s23}, [](const F& f, const Aux&) { return minimum(f[0], f[1]); }}};
    return c;
  }();
  return m;
}

// ---- the hook in front of autocast's ----------------------------------------------------------

// One call of the dispatch hook: the op's name, the dtypes of its defined tensor inputs and
// the dtypes it computes with (the hook's answer, position by position).
struct HookCall {
  std::string op;
  std::vector<DType> in, out;
};

struct Stopped {};  // thrown by the hook in Mode::Stop, so that no kernel runs

enum class Mode { Forward, Stop };
std::vector<HookCall> g_calls;
Mode g_mode = Mode::Forward;

std::optional<std::vector<Tensor>> recording_hook(OpId op, const std::vector<Tensor>& inputs) {
  std::optional<std::vector<Tensor>> answer;
  if (g_mode == Mode::Forward) answer = autocast::cast_if_needed(op, inputs);
  const std::vector<Tensor>& used = answer ? *answer : inputs;
  HookCall call{op_name(op), {}, {}};
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined()) {
      call.in.push_back(inputs[i].dtype());
      call.out.push_back(used[i].dtype());
    }
  g_calls.push_back(std::move(call));
  if (g_mode == Mode::Stop) throw Stopped{};
  return answer;
}

// Puts recording_hook in front for its scope. Mode::Forward: inside an AutocastGuard, each
// call passes on to autocast's hook. Mode::Stop: the flag is raised here and the first call
// ends the op. Autocast's own hook is back afterwards.
class Recording {
 public:
  explicit Recording(Mode mode) {
    g_calls.clear();
    g_mode = mode;
    if (mode == Mode::Stop) dispatch::set_autocast_enabled(true);
    dispatch::set_autocast_hook(&recording_hook);
  }
  ~Recording() {
    if (g_mode == Mode::Stop) dispatch::set_autocast_enabled(false);
    dispatch::set_autocast_hook(&autocast::cast_if_needed);
  }
  Recording(const Recording&) = delete;
  Recording& operator=(const Recording&) = delete;
};

// ---- running a case ----------------------------------------------------------------------------

// Positive values (log, rsqrt and pow need them; the tests look at dtypes only).
std::vector<Tensor> floats_for(const Case& c, const std::vector<DType>& dts, Device dev) {
  std::vector<Tensor> f;
  for (size_t i = 0; i < c.floats.size(); ++i) f.push_back((agt::randf(c.floats[i]) * 0.25 + 1.0).to(dts[i]).to(dev));
  return f;
}

Aux aux_for(Device dev) {
  return {from_vector<int64_t>({0, 3, 1}, {3}).to(dev), gt(agt::randf({2, 3}), 0.0).to(dev)};
}

// The dtypes to exercise a row with: for each, the floating inputs' dtypes.
std::vector<std::vector<DType>> plans(CastPolicy p, DType ad, size_t n) {
  auto all = [n](DType d) { return std::vector<DType>(n, d); };
  std::vector<std::vector<DType>> out = {all(kFloat64)};  // float64 is never cast
  switch (p) {
    case CastPolicy::LowerPrecision: out.push_back(all(kFloat32)); break;
    case CastPolicy::Float32: out.push_back(all(ad)); break;
    case CastPolicy::Promote:
      out.push_back(all(ad));
      if (n >= 2) {
        std::vector<DType> low_first = all(kFloat32), wide_first = all(ad);
        low_first[0] = ad;
        wide_first[0] = kFloat32;
        out.push_back(low_first);
        out.push_back(wide_first);
      }
      break;
    case CastPolicy::PassThrough:
      out.push_back(all(ad));
      out.push_back(all(kFloat32));
      break;
  }
  return out;
}

// What docs/autocast.md's "What happens to an op's inputs" says an input of dtype `in`
// becomes, given the dtypes of all the op's inputs: only floating inputs other than
// float64 change; promote takes float32 when any of them is float32, else their one dtype
// (the plans never mix float16 with bfloat16).
DType expected(CastPolicy p, DType ad, DType in, const std::vector<DType>& all) {
  if (!is_floating(in) || in == kFloat64) return in;
  switch (p) {
    case CastPolicy::LowerPrecision: return ad;
    case CastPolicy::Float32: return kFloat32;
    case CastPolicy::PassThrough: return in;
    case CastPolicy::Promote:
      for (DType d : all)
        if (d == kFloat32) return kFloat32;
      return in;
  }
  return in;
}

std::vector<DType> expected(CastPolicy p, DType ad, const std::vector<DType>& in) {
  std::vector<DType> out;
  for (DType d : in) out.push_back(expected(p, ad, d, in));
  return out;
}

std::string dtypes_str(const std::vector<DType>& v) {
  std::string s;
  for (DType d : v) s += (s.empty() ? "" : ", ") + std::string(dtype_name(d));
  return "{" + s + "}";
}

// Runs one case up to its first hook call (Mode::Stop) and returns that call; nullopt when
// the op never called the hook (then it ran to the end, or failed).
std::optional<HookCall> first_hook_call(const Case& c, const std::vector<DType>& dts) {
  const std::vector<Tensor> f = floats_for(c, dts, kCPU);
  const Aux aux = aux_for(kCPU);
  Recording rec(Mode::Stop);
  try {
    (void)c.call(f, aux);
  } catch (const Stopped&) {
  } catch (const Error& e) {
    ADD_FAILURE() << c.entry << " failed without calling the dispatch hook: " << e.what();
  }
  if (g_calls.empty()) return std::nullopt;
  return g_calls.front();
}

// Runs one case under an autocast region of `dev`'s type to `ad`: checks what the op asked
// the hook, what it computed with and its result's dtype.
void run_under_autocast(const std::string& op, CastPolicy p, const Case& c, Device dev, DType ad,
                        const std::vector<DType>& dts) {
  SCOPED_TRACE(c.entry + " on " + device_type_name(dev.type) + " under " + dtype_name(ad) + " with " +
               dtypes_str(dts) + ", row " + cast_policy_name(p));
  const std::vector<Tensor> f = floats_for(c, dts, dev);
  const Aux aux = aux_for(dev);
  Tensor y;
  std::vector<HookCall> calls;
  {
    AutocastGuard g(dev.type, ad);
    Recording rec(Mode::Forward);
    y = c.call(f, aux);
    calls = g_calls;
  }
  ASSERT_FALSE(calls.empty()) << "the op never called the dispatch hook";
  const HookCall& first = calls.front();
  ASSERT_EQ(first.op, op) << "the op's first hook call names another op";
  const std::vector<DType> want = expected(p, ad, first.in);
  EXPECT_EQ(dtypes_str(first.out), dtypes_str(want)) << "the dtypes the op computed with";
  // The dispatch's decision is cast_dtypes' (one definition for every device type).
  EXPECT_EQ(dtypes_str(autocast::cast_dtypes(OpName{*op_id(op)}, dev.type, ad, first.in)), dtypes_str(first.out));
  // Every floating input lands on one dtype in these plans: the result's.
  const auto floating = std::find_if(want.begin(), want.end(), [](DType d) { return is_floating(d); });
  ASSERT_NE(floating, want.end());
  EXPECT_EQ(std::string(dtype_name(y.dtype())), dtype_name(*floating)) << "the result's dtype";
}

// The union of both tables' op names.
std::set<std::string> row_names() {
  std::set<std::string> names;
  for (DeviceType t : {kCPU, kCUDA})
    for (const auto& [op, p] : autocast::policy_table(t)) names.insert(std::string(op));
  return names;
}

const std::vector<Case>* cases_of(const std::string& op) {
  auto it = cases().find(op);
  return it == cases().end() ? nullptr : &it->second;
}

}  // namespace

// Every case belongs to a row and every row has a case: a new row fails here until it gets
// one, and a case left behind by a removed row fails too.
TEST(AutocastPolicyCoverage, EveryRowHasACaseAndEveryCaseARow) {
  const std::set<std::string> names = row_names();
  ASSERT_FALSE(names.empty());
  for (DeviceType t : {kCPU, kCUDA})
    for (const auto& [op, p] : autocast::policy_table(t))
      EXPECT_NE(cases_of(std::string(op)), nullptr)
          << "the " << device_type_name(t) << " row '" << op << "' has no case in test_policy_coverage.cpp";
  for (const auto& [op, cs] : cases()) {
    EXPECT_TRUE(names.count(op)) << "the case for '" << op << "' matches no row of the policy tables";
    EXPECT_FALSE(cs.empty()) << op;
  }
}

// A row only acts when an op passes its name to the dispatch hook. Every case runs up to
// its first hook call; the names seen there are what the ops ask, and every row's name must
// be among them.
TEST(AutocastPolicyCoverage, EveryRowNamesAnOpThatAsksTheTable) {
  std::set<std::string> asked;
  for (const auto& [op, cs] : cases())
    for (const Case& c : cs)
      if (auto call = first_hook_call(c, std::vector<DType>(c.floats.size(), kFloat32))) asked.insert(call->op);
  ASSERT_FALSE(asked.empty());
  for (DeviceType t : {kCPU, kCUDA})
    for (const auto& [op, p] : autocast::policy_table(t))
      EXPECT_TRUE(asked.count(std::string(op)))
          << "the " << device_type_name(t) << " row '" << op << "' names an op that never asks the table: no op "
          << "passes '" << op << "' to the dispatch hook";
}

// Each entry point of each op asks the hook first, under the op's own name.
TEST(AutocastPolicyCoverage, EveryEntryPointAsksTheHookFirstUnderItsOpsName) {
  for (const auto& [op, cs] : cases())
    for (const Case& c : cs) {
      const auto call = first_hook_call(c, std::vector<DType>(c.floats.size(), kFloat32));
      if (!call) {
        ADD_FAILURE() << c.entry << " never calls the dispatch hook";
        continue;
      }
      EXPECT_EQ(call->op, op) << c.entry << "'s first hook call";
      // every floating input goes to the hook, or one would escape the cast
      EXPECT_EQ(size_t(std::count_if(call->in.begin(), call->in.end(), [](DType d) { return is_floating(d); })),
                c.floats.size())
          << c.entry << " hands the hook a different number of floating tensors than it takes";
    }
}

// Each CPU row, and each CUDA-only op on the CPU (where it passes through), run under a
// CPU region to bfloat16 and to float16.
TEST(AutocastPolicyCoverage, CpuRowsDecideWhatEachOpComputesWith) {
  manual_seed(0);
  std::map<std::string, CastPolicy> cpu;
  for (const auto& [op, p] : autocast::policy_table(kCPU)) cpu[std::string(op)] = p;
  for (const auto& [op, p] : autocast::policy_table(kCUDA))
    if (!cpu.count(std::string(op))) cpu[std::string(op)] = CastPolicy::PassThrough;  // docs: cpu pass_through
  for (DType ad : {kBFloat16, kFloat16}) {
    // a dtype the guard refuses on this CPU has no region to run in
    if (hw::verdict(hw::query(), Device(kCPU), ad).support == hw::Support::Unsupported) continue;
    for (const auto& [op, p] : cpu) {
      const std::vector<Case>* cs = cases_of(op);
      if (!cs) continue;  // EveryRowHasACaseAndEveryCaseARow fails
      for (const Case& c : *cs)
        for (const auto& dts : plans(p, ad, c.floats.size())) run_under_autocast(op, p, c, kCPU, ad, dts);
    }
  }
}

// Each CUDA row: the dtypes each entry point's inputs would be cast to under a CUDA region
// to float16 and to bfloat16, from the inputs the op hands the hook; where a CUDA device
// exists, the ops also run there.
TEST(AutocastPolicyCoverage, CudaRowsDecideWhatEachOpComputesWith) {
  manual_seed(1);
  for (DType ad : {kFloat16, kBFloat16})
    for (const auto& [op_view, p] : autocast::policy_table(kCUDA)) {
      const std::string op(op_view);
      const std::vector<Case>* cs = cases_of(op);
      if (!cs) continue;  // EveryRowHasACaseAndEveryCaseARow fails
      for (const Case& c : *cs)
        for (const auto& dts : plans(p, ad, c.floats.size())) {
          SCOPED_TRACE(c.entry + " under a cuda region to " + dtype_name(ad) + " with " + dtypes_str(dts));
          const auto call = first_hook_call(c, dts);
          ASSERT_TRUE(call.has_value()) << "the op never called the dispatch hook";
          ASSERT_EQ(call->op, op);
          EXPECT_EQ(dtypes_str(autocast::cast_dtypes(OpName{*op_id(op)}, kCUDA, ad, call->in)), dtypes_str(expected(p, ad, call->in)));
        }
    }
}

// The CUDA rows for real, where a CUDA device exists.
TEST(AutocastPolicyCoverage, CudaRowsOnADevice) {
  if (hw::query().cuda.empty())
    AGT_SKIP_HARDWARE() << "no CUDA device (CudaRowsDecideWhatEachOpComputesWith checks the rows without one)";
  manual_seed(2);
  for (const auto& [op_view, p] : autocast::policy_table(kCUDA)) {
    const std::string op(op_view);
    if (const std::vector<Case>* cs = cases_of(op))
      for (const Case& c : *cs)
        for (const auto& dts : plans(p, kFloat16, c.floats.size()))
          run_under_autocast(op, p, c, Device(kCUDA), kFloat16, dts);
  }
}
