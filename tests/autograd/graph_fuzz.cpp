// The random-graph gradient fuzzer (graph_fuzz.h). Every op has one row in the table below:
// how it runs, how it prints as C++, how the generator proposes it, and the guard that keeps
// it where it is smooth. scripts/graph-fuzz-vs-torch maps the same names onto PyTorch.
//
// Well-conditioned inputs. Leaves hold values in [-2, 2] or in [0.5, 2] (three decimals, so
// that programs print short). The generator runs each op in float64 as it adds it and keeps
// it only when every output is finite and at most kMaxAbs in magnitude and its guard holds:
//  * domains: sqrt, rsqrt, log, non-integer powers and the base of pow see values of at
//    least 0.05 and 0.05 * max |x|, reciprocal and divisors magnitudes of at least 0.1 and
//    0.05 * max |x|, log1p values >= -0.9, exp values <= 4 (the generator picks such an
//    input, or makes one: a positive leaf, sigmoid(x) + 0.2, or x shifted by a constant);
//  * kinks, where finite differences and a lower precision would cross the point where the
//    derivative jumps: the input of relu, abs, sign, norm with p = 1, the relu of linear,
//    feed_forward and conv2d_block, the two operands of maximum and minimum, clamp's bounds
//    and the thresholds of comparisons keep a distance of kMargin * max(1, max |x|) from
//    the kink (the generator shifts the input by a constant where it must), and max-like
//    reductions and max pooling need their maximum to lead the runner-up of its group or
//    window by that much;
//  * near-singular points and cancellation: norm stays >= 0.05, and the groups that var,
//    std and layer_norm reduce need a standard deviation of at least
//    10 * kMargin * max(1, max |x|) (below, rounding the differences from the mean shows
//    in the gradient), layer_norm's at least 3 elements; loss targets of bce_logits and
//    cross_entropy's probabilities lie in [0, 1];
//  * a peaked softmax: attention scores stay within kMaxScore.
//
// Checks. float64 gradients against central finite differences (agt::gradcheck_outputs,
// steps of 1e-6, far below these margins); float32 gradients against float64's, and those of
// a run under autocast to bfloat16 against float32's, normwise per leaf (compare_grads). A
// lower precision is compared only where every kink took the branch it took in float64
// (relu's sign pattern, max's winners, dropout's zeros, ...) and its own values kept the
// kinks' margins, and bfloat16 not where an op's
// bfloat16 gradient is rounding noise (a one-hot attention row); such programs are counted
// as skipped. A leaf whose float64 gradient is 0 is compared only against finite differences.
//
// Left out of the generator:
//  * in-place ops on a view, or on a tensor that a view was taken of: the engine does not
//    rebase a view's history (PyTorch's CopySlices), so `a = x * 1; a.narrow(0, 0, 2).mul_(3);
//    a.sum().backward()` gives x the gradient 1 where it should be 3, and the view of a
//    base modified in place keeps the base's old history. Also: an in-place op on a view of
//    a leaf that requires grad is not refused (PyTorch refuses it) and writes into the leaf;
//  * in-place ops on the output of an op whose backward reads its output (exp, sigmoid,
//    softmax, ...): backward then throws, as PyTorch's does; only ops marked `fresh` give
//    in-place targets. div is not one: its backward reads its output when the divisor
//    requires grad (PyTorch's reads its input), so there ampgrad throws and PyTorch not;
//  * the comparisons eq and ne (on continuous values they are almost always false),
//    to_dtype and Tensor::to (autocast makes the casts; a cast in a float64 program would
//    defeat finite differences), layer_norm_to (layer_norm then a 16-bit cast: the same
//    reason), bernoulli and the other random factories (no gradient), and nn's modules
//    (compositions of the ops here).
// sign records no node, so its output gets no gradient where PyTorch's gets zeros: a
// missing gradient counts as zero everywhere here.
#include "autograd/graph_fuzz.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>

#include "support/testing.h"

namespace agt::graph_fuzz {

using ag::Tensor;

namespace {

constexpr double kMaxAbs = 20;   // largest magnitude an op may produce
constexpr double kMargin = 0.01;  // relative distance from kinks (above)
constexpr double kMaxScore = 6;   // largest attention score
constexpr int64_t kMaxNumel = 96;  // largest tensor the generator makes (conv inputs: 150)

// ---- text ------------------------------------------------------------------------------

// The shortest text that reads back as v.
std::string fmt(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

// v as a C++ double literal.
std::string cd(double v) {
  std::string s = fmt(v);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

template <class T>
std::string join(const std::vector<T>& v, const char* sep = ",") {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? sep : "") << v[i];
  return os.str();
}

std::string list_fmt(const std::vector<double>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + fmt(v[i]);
  return s;
}

// {a, b} as a C++ braced list.
std::string cl(const std::vector<int64_t>& v) { return "{" + join(v, ", ") + "}"; }

std::vector<std::string> split_str(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream is(s);
  while (std::getline(is, cur, sep)) out.push_back(cur);
  return out;
}

std::string vname(int id) { return "v" + std::to_string(id); }

std::vector<double> values(const Tensor& t) { return t.detach().to_vector<double>(); }

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : values(t)) m = std::max(m, std::fabs(v));
  return m;
}

double min_val(const Tensor& t) {
  double m = INFINITY;
  for (double v : values(t)) m = std::min(m, v);
  return m;
}

double max_val(const Tensor& t) {
  double m = -INFINITY;
  for (double v : values(t)) m = std::max(m, v);
  return m;
}

double min_abs(const Tensor& t) {
  double m = INFINITY;
  for (double v : values(t)) m = std::min(m, std::fabs(v));
  return m;
}

// The distance a kink must keep in x's units.
double margin_of(const Tensor& x) { return kMargin * std::max(1.0, max_abs(x)); }

bool all_finite(const Tensor& t) {
  for (double v : values(t))
    if (!std::isfinite(v) || std::fabs(v) > kMaxAbs) return false;
  return true;
}

// Every element of d at least m from 0.
bool away(const Tensor& d, double m) { return min_abs(d) >= m; }

// Inputs of log, sqrt, rsqrt and non-integer powers, and divisors: away from 0 also in
// proportion to the tensor's largest element (small values that come from cancelling
// larger ones keep their rounding error, which these ops amplify).
bool positive_ok(const Tensor& x) { return min_val(x) >= std::max(0.05, 0.05 * max_abs(x)); }
bool nonzero_ok(const Tensor& x) { return min_abs(x) >= std::max(0.1, 0.05 * max_abs(x)); }

}  // namespace

// ---- Op ----------------------------------------------------------------------------------

bool Op::has(const std::string& key) const {
  for (const auto& kv : attrs)
    if (kv.first == key) return true;
  return false;
}

const std::string& Op::attr(const std::string& key) const {
  for (const auto& kv : attrs)
    if (kv.first == key) return kv.second;
  throw std::runtime_error("op " + name + " has no attribute " + key);
}

int64_t Op::i(const std::string& key) const { return std::stoll(attr(key)); }
double Op::d(const std::string& key) const { return std::strtod(attr(key).c_str(), nullptr); }

std::vector<int64_t> Op::iv(const std::string& key) const {
  std::vector<int64_t> out;
  for (const auto& s : split_str(attr(key), ',')) out.push_back(std::stoll(s));
  return out;
}

std::vector<double> Op::dv(const std::string& key) const {
  std::vector<double> out;
  for (const auto& s : split_str(attr(key), ',')) out.push_back(std::strtod(s.c_str(), nullptr));
  return out;
}

void Op::set(const std::string& key, const std::string& value) {
  for (auto& kv : attrs)
    if (kv.first == key) {
      kv.second = value;
      return;
    }
  attrs.emplace_back(key, value);
}

namespace {

void set_i(Op& op, const std::string& k, int64_t v) { op.set(k, std::to_string(v)); }
void set_d(Op& op, const std::string& k, double v) { op.set(k, fmt(v)); }
void set_iv(Op& op, const std::string& k, const std::vector<int64_t>& v) { op.set(k, join(v)); }

std::string op_line(const Op& op) {
  std::string s;
  for (size_t i = 0; i < op.out.size(); ++i) s += (i ? " " : "") + vname(op.out[i]);
  s += " = " + op.name;
  for (int id : op.in) s += " " + vname(id);
  for (const auto& [k, v] : op.attrs) s += " " + k + "=" + v;
  return s;
}

// ---- the ops --------------------------------------------------------------------------------

class Gen;
using TL = std::vector<Tensor>;
using Strs = std::vector<std::string>;

// What the op computes, given its inputs.
using RunFn = std::function<TL(const TL& in, const Op& op)>;
// The op as C++ statements that define its outputs (names `out`) from its inputs (`in`).
using CppFn = std::function<std::string(const Strs& in, const Strs& out, const Op& op)>;
// Proposes the op on the generator's values; false when it found nothing to apply it to.
using GenFn = std::function<bool(Gen& g)>;
// On float64 inputs and outputs: whether the op is in a smooth region (above).
using GuardFn = std::function<bool(const TL& in, const TL& out, const Op& op)>;
// On float64 copies of a run's inputs and outputs: the branches the op took at its kinks,
// which a lower-precision run must share with float64 to be compared with it.
using SigFn = std::function<TL(const TL& in, const TL& out, const Op& op)>;

struct OpDef {
  std::string name;
  int weight = 2;
  bool fresh = false;    // the output is new memory that its backward does not read
  bool inplace = false;  // modifies its first input and returns it
  bool random = false;   // draws from the generator
  RunFn run;
  CppFn cpp;
  GenFn gen;
  GuardFn guard;
  SigFn sig;
  // On float64 copies of a float32 run's inputs and outputs: whether the op's bfloat16
  // gradients are rounding noise there (then that comparison is skipped).
  GuardFn noisy16;
};

const OpDef& def(const std::string& name);
const std::vector<OpDef>& table();

// "ag::Tensor out = expr;"
std::string let(const std::string& out, const std::string& expr) { return "ag::Tensor " + out + " = " + expr + ";"; }

}  // namespace

// ---- the generator ------------------------------------------------------------------------

namespace {

enum class Kind { Float, Int, Bool };

struct Value {
  Kind kind = Kind::Float;
  Tensor t;  // its value in float64 (int64, bool), recorded by autograd as the program will
  int uses = 0;
  bool leaf = false;
  bool retired = false;  // modified in place: the op's output is its new name
  std::string producer;
  int64_t rank() const { return t.dim(); }
  std::vector<int64_t> shape() const { return t.sizes().vec(); }
  bool grad() const { return t.requires_grad(); }
};

Kind kind_of(const Tensor& t) {
  if (t.dtype() == ag::kBool) return Kind::Bool;
  if (ag::is_floating(t.dtype())) return Kind::Float;
  return Kind::Int;
}

int64_t numel_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}

using Pred = std::function<bool(const Value&)>;

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) { prog.seed = seed; }

  Program prog;
  std::map<int, Value> vals;
  int ops_made = 0;

  // From the engine's bits alone (std's distributions and shuffle differ between standard
  // libraries): a seed gives the same program everywhere.
  int64_t irand(int64_t lo, int64_t hi) { return lo + int64_t(rng_() % uint64_t(hi - lo + 1)); }
  double urand() { return double(rng_() >> 11) * 0x1p-53; }
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[size_t(irand(0, int64_t(i) - 1))]);
  }
  bool coin(double p = 0.5) { return urand() < p; }
  template <class T>
  T pick(const std::vector<T>& v) { return v[size_t(irand(0, int64_t(v.size()) - 1))]; }

  const Value& val(int id) const { return vals.at(id); }
  std::vector<int64_t> shape(int id) const { return vals.at(id).shape(); }
  int64_t rank(int id) const { return vals.at(id).rank(); }

  // Values of a kind that an op may still take (fan-out at most 4, never a value modified
  // in place since).
  std::vector<int> candidates(const Pred& pred, Kind kind = Kind::Float) const {
    std::vector<int> c;
    for (const auto& [id, v] : vals)
      if (v.kind == kind && !v.retired && v.uses < 4 && pred(v)) c.push_back(id);
    return c;
  }

  // One of c: often a result nothing uses yet (the graph grows deep), often one used
  // already (fan-out), else any.
  int choose(const std::vector<int>& c) {
    if (c.empty()) return -1;
    std::vector<int> fresh, used;
    for (int id : c) {
      const Value& v = vals.at(id);
      if (!v.leaf && v.uses == 0) fresh.push_back(id);
      if (v.uses >= 1) used.push_back(id);
    }
    const double r = urand();
    if (r < 0.45 && !fresh.empty()) return pick(fresh);
    if (r < 0.85 && !used.empty()) return pick(used);
    return pick(c);
  }

  int pick_float(const Pred& pred) { return choose(candidates(pred)); }

  std::vector<int64_t> rand_shape(int64_t min_rank = 0, int64_t max_rank = 4, int64_t max_numel = 48) {
    static const int64_t ranks[] = {0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 4, 4, 4};
    for (;;) {
      int64_t r = ranks[irand(0, 19)];
      if (r < min_rank || r > max_rank) r = irand(min_rank, max_rank);
      std::vector<int64_t> s;
      for (int64_t i = 0; i < r; ++i) s.push_back(coin(0.2) ? 1 : irand(2, 4));
      if (numel_of(s) <= max_numel) return s;
    }
  }

  // A new leaf of uniform values in [lo, hi] (three decimals); grad: whether it requires
  // grad (random when not given).
  int leaf(const std::vector<int64_t>& shape, double lo, double hi, std::optional<bool> grad = {}) {
    std::vector<double> data;
    for (int64_t i = 0; i < numel_of(shape); ++i) data.push_back(std::round((lo + (hi - lo) * urand()) * 1000) / 1000);
    const bool g = grad ? *grad : coin(0.7);
    Op op{"leaf", {}, {}, {}};
    op.set("kind", "float");
    set_iv(op, "shape", shape);
    set_i(op, "grad", g);
    op.set("data", list_fmt(data));
    return add_leaf(op);
  }
  // A float leaf, signed or positive.
  int any_leaf(const std::vector<int64_t>& shape) { return coin(0.7) ? leaf(shape, -2, 2) : leaf(shape, 0.5, 2); }

  int int_leaf(const std::vector<int64_t>& shape, const std::vector<int64_t>& data) {
    Op op{"leaf", {}, {}, {}};
    op.set("kind", "int");
    set_iv(op, "shape", shape);
    set_iv(op, "data", data);
    return add_leaf(op);
  }
  int int_leaf_range(const std::vector<int64_t>& shape, int64_t hi) {  // values in [0, hi)
    std::vector<int64_t> data;
    for (int64_t i = 0; i < numel_of(shape); ++i) data.push_back(irand(0, hi - 1));
    return int_leaf(shape, data);
  }
  int bool_leaf(const std::vector<int64_t>& shape, double p_true = 0.5) {
    std::vector<int64_t> data;
    for (int64_t i = 0; i < numel_of(shape); ++i) data.push_back(coin(p_true));
    return bool_leaf_of(shape, data);
  }
  int bool_leaf_of(const std::vector<int64_t>& shape, const std::vector<int64_t>& data) {
    Op op{"leaf", {}, {}, {}};
    op.set("kind", "bool");
    set_iv(op, "shape", shape);
    set_iv(op, "data", data);
    return add_leaf(op);
  }

  // A float value of rank in [lo, hi], from the pool or a new leaf.
  int any_float(int64_t lo = 0, int64_t hi = 4) {
    const int id = coin(0.85) ? pick_float([&](const Value& v) { return v.rank() >= lo && v.rank() <= hi; }) : -1;
    return id >= 0 ? id : any_leaf(rand_shape(lo, hi));
  }

  // A shape that broadcasts with s to s itself: some leading dims dropped, some dims 1.
  std::vector<int64_t> sub_shape(const std::vector<int64_t>& s) {
    std::vector<int64_t> r(s.begin() + irand(0, int64_t(s.size())), s.end());
    for (auto& v : r)
      if (coin(0.3)) v = 1;
    return r;
  }

  // A float operand for a broadcasting binary op with a: the same shape, a shape that
  // broadcasts to a's, or (sometimes) one that widens a's size-1 dims; pred filters values.
  int partner(int a, const Pred& pred = [](const Value&) { return true; }) {
    const std::vector<int64_t> sa = shape(a);
    auto fits = [&](const Value& v) {
      if (!pred(v)) return false;
      std::vector<int64_t> sb = v.shape(), out;
      const size_t n = std::max(sa.size(), sb.size());
      for (size_t i = 0; i < n; ++i) {
        const int64_t x = i < n - sa.size() ? 1 : sa[i - (n - sa.size())];
        const int64_t y = i < n - sb.size() ? 1 : sb[i - (n - sb.size())];
        if (x != y && x != 1 && y != 1) return false;
        out.push_back(std::max(x, y));
      }
      return numel_of(out) <= kMaxNumel;
    };
    if (coin(0.6)) {
      const int id = choose(candidates(fits));
      if (id >= 0) return id;
    }
    std::vector<int64_t> sb = coin(0.5) ? sa : sub_shape(sa);
    if (coin(0.2)) {  // widen: a size-1 dim of a meets a larger one, or a new leading dim
      for (size_t i = 0; i < sb.size(); ++i)
        if (sa[sa.size() - sb.size() + i] == 1 && coin(0.5)) sb[i] = irand(2, 3);
      if (sb.size() == sa.size() && sa.size() < 4 && coin(0.3)) sb.insert(sb.begin(), 2);
      // the broadcast shape: sb's sizes where it widens, a's elsewhere
      int64_t n = numel_of(sa);
      for (size_t i = 0; i < sb.size(); ++i)
        if (i + sa.size() < sb.size() || sa[i + sa.size() - sb.size()] == 1) n *= sb[i];
      if (n > kMaxNumel) sb = sa;
    }
    return any_leaf(sb);
  }

  // A value whose elements are all at least m from 0 (m from margin_of unless given): x
  // itself, or x shifted by a constant (an add_scalar op); -1 if no shift works.
  int away_from_zero(int x, double m = 0) {
    const Tensor& t = val(x).t;
    const double mm = m > 0 ? m : margin_of(t);
    if (away(t, mm)) return x;
    const double s = std::max(1.0, max_abs(t));
    for (int k = 0; k < 20; ++k) {
      const double c = std::round((urand() * 3 - 1.5) * s * 100) / 100;
      ag::NoGradGuard ng;
      if (away(ag::add(t, c), std::max(mm, margin_of(ag::add(t, c))))) {
        Op op{"add_scalar", {x}, {}, {}};
        set_d(op, "value", c);
        if (emit(op)) return last();
      }
    }
    return -1;
  }

  // A value with every element >= lo: from the pool, a new positive leaf, or
  // sigmoid(x) + 0.2.
  int positive(double lo = 0.1) {
    const int id = pick_float([&](const Value& v) { return min_val(v.t) >= lo; });
    if (id >= 0 && coin(0.8)) return id;
    if (coin(0.5)) return leaf(rand_shape(), std::max(0.5, lo), 2.0);
    const int x = any_float();
    if (!emit(Op{"sigmoid", {x}, {}, {}})) return -1;
    Op op{"add_scalar", {last()}, {}, {}};
    set_d(op, "value", 0.2);
    return emit(op) ? last() : -1;
  }

  // A value with every |element| >= lo (a divisor).
  int nonzero(double lo = 0.2) {
    const int id = pick_float([&](const Value& v) { return min_abs(v.t) >= lo; });
    if (id >= 0 && coin(0.8)) return id;
    const int x = any_float();
    const int y = away_from_zero(x, lo);
    return y >= 0 ? y : positive(lo);
  }

  // A non-leaf float value that an in-place op may modify: nothing has used it (so no
  // backward saved it and no view of it exists), it is no view itself, and the op that made
  // it does not read it in its backward.
  int inplace_target() {
    std::vector<int> c;
    for (const auto& [id, v] : vals)
      if (v.kind == Kind::Float && !v.leaf && !v.retired && v.uses == 0 && def(v.producer).fresh) c.push_back(id);
    return c.empty() ? -1 : pick(c);
  }

  // A dim of a rank-r value, sometimes negative.
  int64_t dim_of(int64_t r) {
    const int64_t d = irand(0, r - 1);
    return coin(0.3) ? d - r : d;
  }
  // A nonempty set of distinct dims of a rank-r value.
  std::vector<int64_t> dims_of(int64_t r) {
    std::vector<int64_t> d;
    for (int64_t i = 0; i < r; ++i)
      if (coin(0.5)) d.push_back(coin(0.2) ? i - r : i);
    if (d.empty()) d.push_back(dim_of(r));
    if (coin(0.5)) shuffle(d);
    return d;
  }

  // Runs op on the float64 values; keeps it when its outputs are finite and in range and
  // its guard holds.
  bool emit(Op op);
  int last() const { return prog.ops.back().out[0]; }

 private:
  int add_leaf(Op op);
  int next_id_ = 0;
  std::mt19937_64 rng_;
};

Tensor leaf_tensor(const Op& op, ag::DType dtype) {
  const std::string& kind = op.attr("kind");
  const std::vector<int64_t> shape = op.iv("shape");
  if (kind == "int") return ag::from_vector<int64_t>(op.iv("data"), shape);
  if (kind == "bool") {
    std::vector<int64_t> d = op.iv("data");
    std::vector<bool> b(d.begin(), d.end());
    return ag::from_vector<bool>(b, shape);
  }
  Tensor t = ag::from_vector<double>(op.dv("data"), shape);
  if (dtype != ag::kFloat64) t = t.to(dtype);
  if (op.i("grad")) t.requires_grad_(true);
  return t;
}

int Gen::add_leaf(Op op) {
  op.out = {next_id_++};
  Value v;
  v.t = leaf_tensor(op, ag::kFloat64);
  v.kind = kind_of(v.t);
  v.leaf = true;
  v.producer = "leaf";
  vals[op.out[0]] = v;
  prog.ops.push_back(op);
  return op.out[0];
}

bool Gen::emit(Op op) {
  const OpDef& d = def(op.name);
  TL in;
  for (size_t i = 0; i < op.in.size(); ++i) {
    const Value& v = vals.at(op.in[i]);
    if (v.retired) throw std::logic_error("graph fuzz: " + op.name + " reads a value modified in place");
    // The pool keeps the value an in-place op modifies: it runs on a copy here.
    in.push_back(i == 0 && d.inplace ? v.t.clone() : v.t);
  }
  TL in64, out64;
  for (const Tensor& t : in) in64.push_back(d.inplace ? t.detach().clone() : t.detach());  // before it changes
  TL out;
  try {
    out = d.run(in, op);
  } catch (const ag::Error& e) {
    op.out.assign(1, next_id_);
    throw std::logic_error("graph fuzz: the generator made an op that throws: " + op_line(op) + ": " + e.what());
  }
  {
    ag::NoGradGuard ng;
    for (const Tensor& t : out)
      if (kind_of(t) == Kind::Float && !all_finite(t)) return false;
    for (const Tensor& t : out) out64.push_back(t.detach());
    if (d.guard && !d.guard(in64, out64, op)) return false;
  }
  op.out.clear();
  for (size_t i = 0; i < out.size(); ++i) {
    op.out.push_back(next_id_++);
    Value v;
    v.t = out[i];
    v.kind = kind_of(out[i]);
    v.producer = op.name;
    vals[op.out.back()] = v;
  }
  for (int id : op.in) ++vals.at(id).uses;
  if (d.inplace) vals.at(op.in[0]).retired = true;
  prog.ops.push_back(op);
  ++ops_made;
  return true;
}

}  // namespace

// ---- guards and branch signatures ------------------------------------------------------------

namespace {

// Grad mode on for a scope (the branch signatures of pooling run a small backward).
struct GradOn {
  bool prev = ag::GradMode::is_enabled();
  GradOn() { ag::GradMode::set_enabled(true); }
  ~GradOn() { ag::GradMode::set_enabled(prev); }
};

std::vector<int64_t> all_dims(int64_t r) {
  std::vector<int64_t> d;
  for (int64_t i = 0; i < r; ++i) d.push_back(i);
  return d;
}

// Whether each group of x over dims has one element that leads the rest by the margin
// (is_max: the largest; else the smallest).
bool unique_extreme(const Tensor& x, const std::vector<int64_t>& dims, bool is_max) {
  if (x.dim() == 0) return true;
  const Tensor m = is_max ? ag::amax(x, dims, true) : ag::amin(x, dims, true);
  const Tensor near = ag::lt(ag::abs(ag::sub(x, m)), margin_of(x)).to(ag::kFloat64);
  for (double c : values(ag::sum(near, dims, false)))
    if (c != 1) return false;
  return true;
}

Tensor extreme_pattern(const Tensor& x, const std::vector<int64_t>& dims, bool is_max) {
  if (x.dim() == 0) return ag::ones({}, ag::kFloat64);
  return ag::eq(x, is_max ? ag::amax(x, dims, true) : ag::amin(x, dims, true));
}

struct PoolArgs {
  std::vector<int64_t> kernel, stride, padding, dilation;
  bool ceil = false;
};

PoolArgs pool_args(const Op& op, const std::string& prefix = "") {
  PoolArgs a;
  a.kernel = op.iv(prefix + "kernel");
  a.stride = op.iv(prefix + "stride");
  a.padding = op.iv(prefix + "padding");
  a.dilation = op.has(prefix + "dilation") ? op.iv(prefix + "dilation") : std::vector<int64_t>{1, 1};
  a.ceil = op.i(prefix + "ceil_mode") != 0;
  return a;
}

// Whether every window of max pooling (output shape from out) has a maximum that leads
// its runner-up by the margin; windows whose maximum is <= 0 may tie when zero_ties (after a
// ReLU their gradient is zero whichever element wins).
bool pool_unique(const Tensor& x, const Tensor& out, const PoolArgs& a, bool zero_ties) {
  const double thr = margin_of(x);
  const int64_t H = x.size(-2), W = x.size(-1), OH = out.size(-2), OW = out.size(-1);
  const int64_t planes = x.numel() / (H * W);
  const auto xv = values(x.contiguous());
  const int64_t kh = a.kernel[0], kw = a.kernel.back();
  const int64_t sh = a.stride.empty() ? kh : a.stride[0], sw = a.stride.empty() ? kw : a.stride.back();
  const int64_t ph = a.padding[0], pw = a.padding.back(), dh = a.dilation[0], dw = a.dilation.back();
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        std::vector<double> w;
        for (int64_t i = 0; i < kh; ++i)
          for (int64_t j = 0; j < kw; ++j) {
            const int64_t h = oh * sh - ph + i * dh, c = ow * sw - pw + j * dw;
            if (h >= 0 && h < H && c >= 0 && c < W) w.push_back(xv[size_t(p * H * W + h * W + c)]);
          }
        if (w.size() < 2) continue;
        std::sort(w.rbegin(), w.rend());
        if (zero_ties && w[0] <= 0) continue;
        if (w[0] - w[1] < thr) return false;
      }
  return true;
}

// The inputs of x that win a max-pooling window.
Tensor pool_winners(const Tensor& x, const PoolArgs& a) {
  GradOn on;
  Tensor xg = x.detach().clone().requires_grad_(true);
  Tensor y = ag::max_pool2d(xg, a.kernel, a.stride, a.padding, a.dilation, a.ceil);
  ag::run_backward({y}, {ag::ones_like(y)}, false);
  return ag::gt(xg.grad(), 0.0);
}

// Whether every group of x over dims has a standard deviation of at least 10 * margin_of(x):
// var, std and layer_norm difference their inputs with the mean, which loses what rounding
// cannot resolve.
bool spread(const Tensor& x, const std::vector<int64_t>& dims) {
  return min_val(ag::std(x, dims, 0, false)) >= 10 * margin_of(x);
}

// The same for the rows of x over its last k dims (layer_norm's).
bool rows_spread(const Tensor& x, int64_t k) {
  std::vector<int64_t> d;
  for (int64_t i = x.dim() - k; i < x.dim(); ++i) d.push_back(i);
  return spread(x, d);
}

ag::Reduction reduction_of(const Op& op) {
  const std::string& r = op.attr("reduction");
  return r == "none" ? ag::Reduction::None : r == "sum" ? ag::Reduction::Sum : ag::Reduction::Mean;
}
std::string reduction_cpp(const Op& op) {
  const std::string& r = op.attr("reduction");
  return r == "none" ? "ag::Reduction::None" : r == "sum" ? "ag::Reduction::Sum" : "ag::Reduction::Mean";
}

ag::Activation act_of(const std::string& a) {
  return a == "relu" ? ag::Activation::Relu : a == "gelu" ? ag::Activation::GeluErf
       : a == "gelu_tanh" ? ag::Activation::GeluTanh : ag::Activation::None;
}
std::string act_cpp(const std::string& a) {
  return a == "relu" ? "ag::Activation::Relu" : a == "gelu" ? "ag::Activation::GeluErf"
       : a == "gelu_tanh" ? "ag::Activation::GeluTanh" : "ag::Activation::None";
}

std::string bool_cpp(int64_t b) { return b ? "true" : "false"; }

}  // namespace

// ---- the table: elementwise ------------------------------------------------------------------

namespace {

// Input domains of unary ops (the generator's choice, and the guard).
enum class Dom { Any, Positive, Nonzero, ExpArg, Log1pArg, Kink };

bool dom_ok(Dom dom, const Tensor& x) {
  switch (dom) {
    case Dom::Positive: return positive_ok(x);
    case Dom::Nonzero: return nonzero_ok(x);
    case Dom::ExpArg: return max_val(x) <= 4;
    case Dom::Log1pArg: return min_val(x) >= -0.9;
    case Dom::Kink: return away(x, margin_of(x));
    default: return true;
  }
}

// An input for domain dom, or -1.
int input_for(Gen& g, Dom dom) {
  switch (dom) {
    case Dom::Positive: return g.positive(0.1);
    case Dom::Nonzero: return g.nonzero(0.2);
    case Dom::ExpArg: {
      const int id = g.pick_float([](const Value& v) { return max_val(v.t) <= 3; });
      return id >= 0 ? id : g.any_leaf(g.rand_shape());
    }
    case Dom::Log1pArg: {
      const int id = g.pick_float([](const Value& v) { return min_val(v.t) >= -0.5; });
      return id >= 0 ? id : g.positive(0.1);
    }
    case Dom::Kink: return g.away_from_zero(g.any_float());
    default: return g.any_float();
  }
}

SigFn sign_sig() {
  return [](const TL& in, const TL&, const Op&) { return TL{ag::sign(in[0])}; };
}

void add_unary(std::vector<OpDef>& t, const std::string& name, Tensor (*f)(const Tensor&), Dom dom,
               bool fresh = false, int weight = 2) {
  OpDef d;
  d.name = name;
  d.weight = weight;
  d.fresh = fresh;
  d.run = [f](const TL& in, const Op&) { return TL{f(in[0])}; };
  d.cpp = [name](const Strs& in, const Strs& out, const Op&) { return let(out[0], "ag::" + name + "(" + in[0] + ")"); };
  d.gen = [name, dom](Gen& g) {
    const int x = input_for(g, dom);
    return x >= 0 && g.emit(Op{name, {x}, {}, {}});
  };
  d.guard = [dom](const TL& in, const TL&, const Op&) { return dom_ok(dom, in[0]); };
  if (dom == Dom::Kink) d.sig = sign_sig();
  t.push_back(d);
}

// op(x, value) with a scalar: add_scalar, mul_scalar, ... (value from vals).
void add_scalar_op(std::vector<OpDef>& t, const std::string& name, Tensor (*f)(const Tensor&, ag::Scalar),
                   const std::string& cpp_fn, std::vector<double> vals, Dom dom = Dom::Any, bool fresh = false) {
  OpDef d;
  d.name = name;
  d.fresh = fresh;
  d.run = [f](const TL& in, const Op& op) { return TL{f(in[0], op.d("value"))}; };
  d.cpp = [cpp_fn](const Strs& in, const Strs& out, const Op& op) {
    return let(out[0], cpp_fn + "(" + in[0] + ", " + cd(op.d("value")) + ")");
  };
  d.gen = [name, vals, dom](Gen& g) {
    const int x = input_for(g, dom);
    if (x < 0) return false;
    Op op{name, {x}, {}, {}};
    set_d(op, "value", g.pick(vals));
    return g.emit(op);
  };
  d.guard = [dom](const TL& in, const TL&, const Op&) { return dom_ok(dom, in[0]); };
  t.push_back(d);
}

Tensor add_s(const Tensor& x, ag::Scalar s) { return ag::add(x, s); }
Tensor sub_s(const Tensor& x, ag::Scalar s) { return ag::sub(x, s); }
Tensor mul_s(const Tensor& x, ag::Scalar s) { return ag::mul(x, s); }
Tensor div_s(const Tensor& x, ag::Scalar s) { return ag::div(x, s); }
Tensor rsub_s(const Tensor& x, ag::Scalar s) { return ag::rsub(x, s); }
Tensor rdiv_s(const Tensor& x, ag::Scalar s) { return ag::rdiv(x, s); }
Tensor pow_s(const Tensor& x, ag::Scalar s) { return ag::pow(x, s); }
Tensor neg_f(const Tensor& x) { return ag::neg(x); }
Tensor abs_f(const Tensor& x) { return ag::abs(x); }
Tensor sign_f(const Tensor& x) { return ag::sign(x); }
Tensor square_f(const Tensor& x) { return ag::square(x); }
Tensor sqrt_f(const Tensor& x) { return ag::sqrt(x); }
Tensor rsqrt_f(const Tensor& x) { return ag::rsqrt(x); }
Tensor reciprocal_f(const Tensor& x) { return ag::reciprocal(x); }
Tensor exp_f(const Tensor& x) { return ag::exp(x); }
Tensor log_f(const Tensor& x) { return ag::log(x); }
Tensor log1p_f(const Tensor& x) { return ag::log1p(x); }
Tensor tanh_f(const Tensor& x) { return ag::tanh(x); }
Tensor sigmoid_f(const Tensor& x) { return ag::sigmoid(x); }
Tensor softplus_f(const Tensor& x) { return ag::softplus(x); }
Tensor relu_f(const Tensor& x) { return ag::relu(x); }
Tensor silu_f(const Tensor& x) { return ag::silu(x); }
Tensor clone_f(const Tensor& x) { return ag::clone(x); }
Tensor contiguous_f(const Tensor& x) { return ag::contiguous(x); }

// Binary ops on two tensors with broadcasting: add, sub (with alpha), mul, div, maximum,
// minimum, pow.
void add_binary_ops(std::vector<OpDef>& t) {
  for (const std::string name : {"add", "sub"}) {
    OpDef d;
    d.name = name;
    d.weight = 4;
    d.fresh = true;
    d.run = [name](const TL& in, const Op& op) {
      const double al = op.d("alpha");
      return TL{name == "add" ? ag::add(in[0], in[1], al) : ag::sub(in[0], in[1], al)};
    };
    d.cpp = [name](const Strs& in, const Strs& out, const Op& op) {
      const double al = op.d("alpha");
      return let(out[0], "ag::" + name + "(" + in[0] + ", " + in[1] + (al == 1 ? "" : ", " + cd(al)) + ")");
    };
    d.gen = [name](Gen& g) {
      const int a = g.any_float();
      Op op{name, {a, g.partner(a)}, {}, {}};
      set_d(op, "alpha", g.coin(0.7) ? 1.0 : g.pick(std::vector<double>{0.5, -2.0}));
      return g.emit(op);
    };
    t.push_back(d);
  }
  {
    OpDef d;
    d.name = "mul";
    d.weight = 4;
    d.fresh = true;
    d.run = [](const TL& in, const Op&) { return TL{ag::mul(in[0], in[1])}; };
    d.cpp = [](const Strs& in, const Strs& out, const Op&) { return let(out[0], "ag::mul(" + in[0] + ", " + in[1] + ")"); };
    d.gen = [](Gen& g) {
      const int a = g.any_float();
      return g.emit(Op{"mul", {a, g.partner(a)}, {}, {}});
    };
    t.push_back(d);
  }
  {
    OpDef d;
    d.name = "div";
    d.weight = 3;
    // Not `fresh`: its backward reads its output when b requires grad (PyTorch's reads a),
    // so an in-place op on the quotient makes backward throw where PyTorch's would not.
    d.run = [](const TL& in, const Op&) { return TL{ag::div(in[0], in[1])}; };
    d.cpp = [](const Strs& in, const Strs& out, const Op&) { return let(out[0], "ag::div(" + in[0] + ", " + in[1] + ")"); };
    d.gen = [](Gen& g) {
      const int a = g.any_float();
      int b = g.partner(a, [](const Value& v) { return min_abs(v.t) >= 0.2; });
      if (min_abs(g.val(b).t) < 0.2) b = g.away_from_zero(b, 0.2);
      return b >= 0 && g.emit(Op{"div", {a, b}, {}, {}});
    };
    d.guard = [](const TL& in, const TL&, const Op&) { return nonzero_ok(in[1]); };
    t.push_back(d);
  }
  for (const std::string name : {"maximum", "minimum"}) {
    OpDef d;
    d.name = name;
    d.run = [name](const TL& in, const Op&) {
      return TL{name == "maximum" ? ag::maximum(in[0], in[1]) : ag::minimum(in[0], in[1])};
    };
    d.cpp = [name](const Strs& in, const Strs& out, const Op&) {
      return let(out[0], "ag::" + name + "(" + in[0] + ", " + in[1] + ")");
    };
    d.gen = [name](Gen& g) {
      const int a = g.any_float();
      int b = g.partner(a);
      const Tensor diff = ag::sub(g.val(a).t, g.val(b).t).detach();
      if (!away(diff, kMargin * std::max({1.0, max_abs(g.val(a).t), max_abs(g.val(b).t)}))) {
        // shift b away from a
        for (int k = 0; k < 10; ++k) {
          const double c = std::round((g.urand() * 3 - 1.5) * 100) / 100;
          Op s{"add_scalar", {b}, {}, {}};
          set_d(s, "value", c);
          const Tensor d2 = ag::sub(g.val(a).t, ag::add(g.val(b).t, c)).detach();
          if (away(d2, kMargin * std::max({1.0, max_abs(g.val(a).t), max_abs(g.val(b).t) + std::fabs(c)}))) {
            if (!g.emit(s)) return false;
            b = g.last();
            break;
          }
        }
      }
      return g.emit(Op{name, {a, b}, {}, {}});
    };
    d.guard = [](const TL& in, const TL&, const Op&) {
      return away(ag::sub(in[0], in[1]), kMargin * std::max({1.0, max_abs(in[0]), max_abs(in[1])}));
    };
    d.sig = [](const TL& in, const TL&, const Op&) { return TL{ag::sign(ag::sub(in[0], in[1]))}; };
    t.push_back(d);
  }
  {
    OpDef d;
    d.name = "pow";
    d.run = [](const TL& in, const Op&) { return TL{ag::pow(in[0], in[1])}; };
    d.cpp = [](const Strs& in, const Strs& out, const Op&) { return let(out[0], "ag::pow(" + in[0] + ", " + in[1] + ")"); };
    d.gen = [](Gen& g) {
      const int a = g.positive(0.1);
      if (a < 0) return false;
      const int b = g.partner(a, [](const Value& v) { return max_abs(v.t) <= 3; });
      return g.emit(Op{"pow", {a, b}, {}, {}});
    };
    d.guard = [](const TL& in, const TL&, const Op&) { return positive_ok(in[0]); };
    t.push_back(d);
  }
}

// A threshold for x's values that keeps the margin from all of them, or nullopt.
std::optional<double> gap_threshold(Gen& g, const Tensor& x) {
  const auto v = values(x);
  if (v.empty()) return std::nullopt;
  const double lo = *std::min_element(v.begin(), v.end()), hi = *std::max_element(v.begin(), v.end());
  const double m = margin_of(x);
  for (int k = 0; k < 20; ++k) {
    const double c = std::round((lo + (hi - lo) * g.urand()) * 1000) / 1000;
    if (away(ag::sub(x.detach(), c), m)) return c;
  }
  return std::nullopt;
}

void add_clamp(std::vector<OpDef>& t, bool inplace) {
  OpDef d;
  d.name = inplace ? "clamp_" : "clamp";
  d.inplace = inplace;
  d.run = [inplace](const TL& in, const Op& op) {
    std::optional<ag::Scalar> lo, hi;
    if (op.has("min")) lo = op.d("min");
    if (op.has("max")) hi = op.d("max");
    if (!inplace) return TL{ag::clamp(in[0], lo, hi)};
    Tensor x = in[0];
    x.clamp_(lo, hi);
    return TL{x};
  };
  d.cpp = [inplace](const Strs& in, const Strs& out, const Op& op) {
    const std::string lo = op.has("min") ? cd(op.d("min")) : "std::nullopt";
    const std::string hi = op.has("max") ? cd(op.d("max")) : "std::nullopt";
    if (!inplace) return let(out[0], "ag::clamp(" + in[0] + ", " + lo + ", " + hi + ")");
    return in[0] + ".clamp_(" + lo + ", " + hi + ");\n" + let(out[0], in[0]);
  };
  d.gen = [inplace](Gen& g) {
    const int x = inplace ? g.inplace_target() : g.any_float();
    if (x < 0) return false;
    const Tensor& v = g.val(x).t;
    auto a = gap_threshold(g, v), b = gap_threshold(g, v);
    if (!a || !b) return false;
    Op op{inplace ? "clamp_" : "clamp", {x}, {}, {}};
    const int which = int(g.irand(0, 2));  // min, max or both
    if (which != 1) set_d(op, "min", std::min(*a, *b));
    if (which != 0) set_d(op, "max", which == 2 ? std::max(*a, *b) : *b);
    return g.emit(op);
  };
  d.guard = [](const TL& in, const TL&, const Op& op) {
    const double m = margin_of(in[0]);
    return (!op.has("min") || away(ag::sub(in[0], op.d("min")), m)) &&
           (!op.has("max") || away(ag::sub(in[0], op.d("max")), m));
  };
  d.sig = [](const TL& in, const TL&, const Op& op) {
    TL s;
    if (op.has("min")) s.push_back(ag::sign(ag::sub(in[0], op.d("min"))));
    if (op.has("max")) s.push_back(ag::sign(ag::sub(in[0], op.d("max"))));
    return s;
  };
  t.push_back(d);
}

// A bool value that broadcasts to shape s (from the pool or a new leaf).
int mask_for(Gen& g, const std::vector<int64_t>& s) {
  auto fits = [&](const Value& v) {
    const auto m = v.shape();
    if (m.size() > s.size()) return false;
    for (size_t i = 0; i < m.size(); ++i)
      if (m[i] != 1 && m[i] != s[s.size() - m.size() + i]) return false;
    return true;
  };
  if (g.coin(0.5)) {
    const int id = g.choose(g.candidates(fits, Kind::Bool));
    if (id >= 0) return id;
  }
  return g.bool_leaf(g.sub_shape(s));
}

// where(mask, x, partner or scalar), x of the mask's shape: a mask just made gets a use
// (else it would be dead).
bool use_mask(Gen& g, int mask) {
  const auto s = g.shape(mask);
  int x = g.choose(g.candidates([&](const Value& v) { return v.shape() == s; }));
  if (x < 0) x = g.any_leaf(s);
  Op op{"where", {mask, x}, {}, {}};
  if (g.coin(0.3)) set_d(op, "b", 0.5);
  else op.in.push_back(g.partner(x));
  return g.emit(op);
}

void add_selection_ops(std::vector<OpDef>& t) {
  {
    OpDef d;  // where(cond, a, b); a_scalar / b_scalar: that side is a value
    d.name = "where";
    d.weight = 3;
    d.fresh = true;
    d.run = [](const TL& in, const Op& op) {
      if (op.has("a")) return TL{ag::where(in[0], op.d("a"), in[1])};
      if (op.has("b")) return TL{ag::where(in[0], in[1], op.d("b"))};
      return TL{ag::where(in[0], in[1], in[2])};
    };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      if (op.has("a")) return let(out[0], "ag::where(" + in[0] + ", " + cd(op.d("a")) + ", " + in[1] + ")");
      if (op.has("b")) return let(out[0], "ag::where(" + in[0] + ", " + in[1] + ", " + cd(op.d("b")) + ")");
      return let(out[0], "ag::where(" + in[0] + ", " + in[1] + ", " + in[2] + ")");
    };
    d.gen = [](Gen& g) {
      const int a = g.any_float();
      const int m = mask_for(g, g.shape(a));
      const double r = g.urand();
      Op op{"where", {m, a}, {}, {}};
      if (r < 0.2) set_d(op, "a", -0.5);
      else if (r < 0.4) set_d(op, "b", 1.5);
      else op.in.push_back(g.partner(a));
      return g.emit(op);
    };
    t.push_back(d);
  }
  for (bool inplace : {false, true}) {
    OpDef d;
    d.name = inplace ? "masked_fill_" : "masked_fill";
    d.inplace = inplace;
    d.fresh = !inplace;
    d.run = [inplace](const TL& in, const Op& op) {
      if (!inplace) return TL{ag::masked_fill(in[0], in[1], op.d("value"))};
      Tensor x = in[0];
      x.masked_fill_(in[1], op.d("value"));
      return TL{x};
    };
    d.cpp = [inplace](const Strs& in, const Strs& out, const Op& op) {
      if (!inplace) return let(out[0], "ag::masked_fill(" + in[0] + ", " + in[1] + ", " + cd(op.d("value")) + ")");
      return in[0] + ".masked_fill_(" + in[1] + ", " + cd(op.d("value")) + ");\n" + let(out[0], in[0]);
    };
    d.gen = [inplace](Gen& g) {
      const int x = inplace ? g.inplace_target() : g.any_float();
      if (x < 0) return false;
      Op op{inplace ? "masked_fill_" : "masked_fill", {x, mask_for(g, g.shape(x))}, {}, {}};
      set_d(op, "value", g.pick(std::vector<double>{0.0, -1.0, 0.75}));
      return g.emit(op);
    };
    t.push_back(d);
  }
  // Comparisons make masks; a threshold keeps the margin from every value.
  for (const std::string name : {"gt", "lt", "ge", "le"}) {
    OpDef d;
    d.name = name;
    d.weight = 1;
    auto f = [name](const Tensor& a, const Tensor& b) {
      return name == "gt" ? ag::gt(a, b) : name == "lt" ? ag::lt(a, b) : name == "ge" ? ag::ge(a, b) : ag::le(a, b);
    };
    auto fs = [name](const Tensor& a, double b) {
      return name == "gt" ? ag::gt(a, b) : name == "lt" ? ag::lt(a, b) : name == "ge" ? ag::ge(a, b) : ag::le(a, b);
    };
    d.run = [f, fs](const TL& in, const Op& op) { return TL{op.has("value") ? fs(in[0], op.d("value")) : f(in[0], in[1])}; };
    d.cpp = [name](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], "ag::" + name + "(" + in[0] + ", " + (op.has("value") ? cd(op.d("value")) : in[1]) + ")");
    };
    d.gen = [name](Gen& g) {
      const int a = g.any_float();
      Op op{name, {a}, {}, {}};
      if (g.coin(0.6)) {
        auto c = gap_threshold(g, g.val(a).t);
        if (!c) return false;
        set_d(op, "value", *c);
      } else {
        op.in.push_back(g.partner(a));
      }
      return g.emit(op) && use_mask(g, g.last());
    };
    d.guard = [](const TL& in, const TL&, const Op& op) {
      if (op.has("value")) return away(ag::sub(in[0], op.d("value")), margin_of(in[0]));
      return away(ag::sub(in[0], in[1]), kMargin * std::max({1.0, max_abs(in[0]), max_abs(in[1])}));
    };
    d.sig = [](const TL&, const TL& out, const Op&) { return TL{out[0]}; };
    t.push_back(d);
  }
  for (const std::string name : {"logical_and", "logical_or"}) {
    OpDef d;
    d.name = name;
    d.weight = 1;
    d.run = [name](const TL& in, const Op&) {
      return TL{name == "logical_and" ? ag::logical_and(in[0], in[1]) : ag::logical_or(in[0], in[1])};
    };
    d.cpp = [name](const Strs& in, const Strs& out, const Op&) {
      return let(out[0], "ag::" + name + "(" + in[0] + ", " + in[1] + ")");
    };
    d.gen = [name](Gen& g) {
      const int a = g.choose(g.candidates([](const Value&) { return true; }, Kind::Bool));
      if (a < 0) return false;
      if (!g.emit(Op{name, {a, mask_for(g, g.shape(a))}, {}, {}})) return false;
      return use_mask(g, g.last());
    };
    t.push_back(d);
  }
}

void add_elementwise(std::vector<OpDef>& t) {
  add_unary(t, "neg", neg_f, Dom::Any, true);
  add_unary(t, "abs", abs_f, Dom::Kink);
  add_unary(t, "sign", sign_f, Dom::Kink, false, 1);
  add_unary(t, "square", square_f, Dom::Any);
  add_unary(t, "sqrt", sqrt_f, Dom::Positive);
  add_unary(t, "rsqrt", rsqrt_f, Dom::Positive);
  add_unary(t, "reciprocal", reciprocal_f, Dom::Nonzero);
  add_unary(t, "exp", exp_f, Dom::ExpArg);
  add_unary(t, "log", log_f, Dom::Positive);
  add_unary(t, "log1p", log1p_f, Dom::Log1pArg);
  add_unary(t, "tanh", tanh_f, Dom::Any);
  add_unary(t, "sigmoid", sigmoid_f, Dom::Any);
  add_unary(t, "softplus", softplus_f, Dom::Any);
  add_unary(t, "relu", relu_f, Dom::Kink, false, 3);
  add_unary(t, "silu", silu_f, Dom::Any);
  add_unary(t, "clone", clone_f, Dom::Any, true, 1);
  add_unary(t, "contiguous", contiguous_f, Dom::Any, false, 1);
  {
    OpDef d;
    d.name = "gelu";
    d.run = [](const TL& in, const Op& op) { return TL{ag::gelu(in[0], op.attr("approximate"))}; };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], "ag::gelu(" + in[0] + ", \"" + op.attr("approximate") + "\")");
    };
    d.gen = [](Gen& g) {
      Op op{"gelu", {g.any_float()}, {}, {}};
      op.set("approximate", g.coin() ? "none" : "tanh");
      return g.emit(op);
    };
    t.push_back(d);
  }
  add_clamp(t, false);
  add_scalar_op(t, "add_scalar", add_s, "ag::add", {0.5, -1.25, 2.0}, Dom::Any, true);
  add_scalar_op(t, "sub_scalar", sub_s, "ag::sub", {0.5, -0.75});
  add_scalar_op(t, "rsub", rsub_s, "ag::rsub", {1.0, -0.5});
  add_scalar_op(t, "mul_scalar", mul_s, "ag::mul", {0.5, -2.0, 3.0});
  add_scalar_op(t, "div_scalar", div_s, "ag::div", {0.5, -4.0, 3.0});
  add_scalar_op(t, "rdiv", rdiv_s, "ag::rdiv", {1.0, -2.0}, Dom::Nonzero);
  {
    OpDef d;  // pow with a scalar exponent: integral ones take any base
    d.name = "pow_scalar";
    d.run = [](const TL& in, const Op& op) { return TL{ag::pow(in[0], op.d("exponent"))}; };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], "ag::pow(" + in[0] + ", " + cd(op.d("exponent")) + ")");
    };
    d.gen = [](Gen& g) {
      const double e = g.pick(std::vector<double>{2, 3, 0.5, 1.5, -1, -0.5});
      const int x = e == std::floor(e) ? (e > 0 ? g.any_float() : g.nonzero(0.2)) : g.positive(0.1);
      if (x < 0) return false;
      Op op{"pow_scalar", {x}, {}, {}};
      set_d(op, "exponent", e);
      return g.emit(op);
    };
    d.guard = [](const TL& in, const TL&, const Op& op) {
      const double e = op.d("exponent");
      if (e != std::floor(e)) return positive_ok(in[0]);
      return e > 0 || nonzero_ok(in[0]);
    };
    t.push_back(d);
  }
  add_binary_ops(t);
  add_selection_ops(t);
  {
    OpDef d;  // dropout draws its mask from the generator, seeded at the program's start
    d.name = "dropout";
    d.weight = 1;
    d.random = true;
    d.run = [](const TL& in, const Op& op) {
      ag::manual_seed(uint64_t(op.i("seed")));
      return TL{ag::dropout(in[0], op.d("p"))};
    };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      return "ag::manual_seed(" + op.attr("seed") + ");\n" + let(out[0], "ag::dropout(" + in[0] + ", " + cd(op.d("p")) + ")");
    };
    d.gen = [](Gen& g) {
      Op op{"dropout", {g.any_float()}, {}, {}};
      set_d(op, "p", g.pick(std::vector<double>{0.25, 0.5}));
      set_i(op, "seed", g.irand(1, 999));
      return g.emit(op);
    };
    d.sig = [](const TL&, const TL& out, const Op&) { return TL{ag::eq(out[0], 0.0)}; };
    t.push_back(d);
  }
}

}  // namespace

// ---- the table: reductions -------------------------------------------------------------------

namespace {

std::vector<int64_t> wrap_all(const std::vector<int64_t>& dims, int64_t r) {
  std::vector<int64_t> w;
  for (int64_t d : dims) w.push_back(d < 0 ? d + r : d);
  return w;
}

int64_t reduced_count(const Tensor& x, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : wrap_all(dims, x.dim())) n *= x.size(d);
  return n;
}

void add_reductions(std::vector<OpDef>& t) {
  for (const std::string name : {"sum", "mean"}) {
    OpDef d;  // without dims: over everything
    d.name = name;
    d.weight = 4;
    d.fresh = true;
    d.run = [name](const TL& in, const Op& op) {
      if (!op.has("dims")) return TL{name == "sum" ? ag::sum(in[0]) : ag::mean(in[0])};
      const auto dims = op.iv("dims");
      const bool k = op.i("keepdim") != 0;
      return TL{name == "sum" ? ag::sum(in[0], dims, k) : ag::mean(in[0], dims, k)};
    };
    d.cpp = [name](const Strs& in, const Strs& out, const Op& op) {
      if (!op.has("dims")) return let(out[0], "ag::" + name + "(" + in[0] + ")");
      return let(out[0], "ag::" + name + "(" + in[0] + ", " + cl(op.iv("dims")) + ", " + bool_cpp(op.i("keepdim")) + ")");
    };
    d.gen = [name](Gen& g) {
      const int x = g.any_float();
      Op op{name, {x}, {}, {}};
      if (g.rank(x) > 0 && g.coin(0.8)) {
        set_iv(op, "dims", g.coin(0.1) ? std::vector<int64_t>{} : g.dims_of(g.rank(x)));
        set_i(op, "keepdim", g.coin());
      }
      return g.emit(op);
    };
    t.push_back(d);
  }
  for (const std::string name : {"var", "std"}) {
    OpDef d;
    d.name = name;
    d.run = [name](const TL& in, const Op& op) {
      const auto dims = op.iv("dims");
      const int64_t c = op.i("correction");
      const bool k = op.i("keepdim") != 0;
      return TL{name == "var" ? ag::var(in[0], dims, c, k) : ag::std(in[0], dims, c, k)};
    };
    d.cpp = [name](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], "ag::" + name + "(" + in[0] + ", " + cl(op.iv("dims")) + ", " + op.attr("correction") + ", " +
                             bool_cpp(op.i("keepdim")) + ")");
    };
    d.gen = [name](Gen& g) {
      const int x = g.any_float(1, 4);
      const auto dims = g.dims_of(g.rank(x));
      const int64_t c = g.coin() ? 1 : 0;
      if (reduced_count(g.val(x).t, dims) <= c + 1) return false;
      Op op{name, {x}, {}, {}};
      set_iv(op, "dims", dims);
      set_i(op, "correction", c);
      set_i(op, "keepdim", g.coin());
      return g.emit(op);
    };
    d.guard = [](const TL& in, const TL&, const Op& op) { return spread(in[0], op.iv("dims")); };
    t.push_back(d);
  }
  for (const std::string name : {"amax", "amin"}) {
    OpDef d;
    d.name = name;
    const bool is_max = name == "amax";
    d.run = [is_max](const TL& in, const Op& op) {
      const auto dims = op.iv("dims");
      const bool k = op.i("keepdim") != 0;
      return TL{is_max ? ag::amax(in[0], dims, k) : ag::amin(in[0], dims, k)};
    };
    d.cpp = [name](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], "ag::" + name + "(" + in[0] + ", " + cl(op.iv("dims")) + ", " + bool_cpp(op.i("keepdim")) + ")");
    };
    d.gen = [name](Gen& g) {
      const int x = g.any_float(1, 4);
      Op op{name, {x}, {}, {}};
      set_iv(op, "dims", g.dims_of(g.rank(x)));
      set_i(op, "keepdim", g.coin());
      return g.emit(op);
    };
    d.guard = [is_max](const TL& in, const TL&, const Op& op) { return unique_extreme(in[0], op.iv("dims"), is_max); };
    d.sig = [is_max](const TL& in, const TL&, const Op& op) { return TL{extreme_pattern(in[0], op.iv("dims"), is_max)}; };
    t.push_back(d);
  }
  for (const std::string name : {"max_all", "min_all"}) {
    OpDef d;  // ag::max(x) / ag::min(x): over every element
    d.name = name;
    d.weight = 1;
    const bool is_max = name == "max_all";
    d.run = [is_max](const TL& in, const Op&) { return TL{is_max ? ag::max(in[0]) : ag::min(in[0])}; };
    d.cpp = [is_max](const Strs& in, const Strs& out, const Op&) {
      return let(out[0], std::string(is_max ? "ag::max(" : "ag::min(") + in[0] + ")");
    };
    d.gen = [name](Gen& g) { return g.emit(Op{name, {g.any_float()}, {}, {}}); };
    d.guard = [is_max](const TL& in, const TL&, const Op&) { return unique_extreme(in[0], all_dims(in[0].dim()), is_max); };
    d.sig = [is_max](const TL& in, const TL&, const Op&) { return TL{extreme_pattern(in[0], all_dims(in[0].dim()), is_max)}; };
    t.push_back(d);
  }
  for (const std::string name : {"max_dim", "min_dim"}) {
    OpDef d;  // ag::max(x, dim, keepdim): values and int64 indices
    d.name = name;
    const bool is_max = name == "max_dim";
    d.run = [is_max](const TL& in, const Op& op) {
      auto r = is_max ? ag::max(in[0], op.i("dim"), op.i("keepdim") != 0) : ag::min(in[0], op.i("dim"), op.i("keepdim") != 0);
      return TL{r.first, r.second};
    };
    d.cpp = [is_max](const Strs& in, const Strs& out, const Op& op) {
      return "auto [" + out[0] + ", " + out[1] + "] = " + (is_max ? "ag::max(" : "ag::min(") + in[0] + ", " +
             op.attr("dim") + ", " + bool_cpp(op.i("keepdim")) + ");";
    };
    d.gen = [name](Gen& g) {
      const int x = g.any_float(1, 4);
      Op op{name, {x}, {}, {}};
      set_i(op, "dim", g.dim_of(g.rank(x)));
      set_i(op, "keepdim", g.coin());
      return g.emit(op);
    };
    d.guard = [is_max](const TL& in, const TL&, const Op& op) { return unique_extreme(in[0], {op.i("dim")}, is_max); };
    d.sig = [is_max](const TL& in, const TL&, const Op& op) { return TL{extreme_pattern(in[0], {op.i("dim")}, is_max)}; };
    t.push_back(d);
  }
  for (const std::string name : {"argmax", "argmin"}) {
    OpDef d;  // int64 indices, for gather
    d.name = name;
    d.weight = 1;
    const bool is_max = name == "argmax";
    d.run = [is_max](const TL& in, const Op& op) {
      const bool k = op.i("keepdim") != 0;
      return TL{is_max ? ag::argmax(in[0], op.i("dim"), k) : ag::argmin(in[0], op.i("dim"), k)};
    };
    d.cpp = [name](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], "ag::" + name + "(" + in[0] + ", " + op.attr("dim") + ", " + bool_cpp(op.i("keepdim")) + ")");
    };
    d.gen = [name](Gen& g) {
      const int x = g.any_float(1, 4);
      Op op{name, {x}, {}, {}};
      set_i(op, "dim", g.dim_of(g.rank(x)));
      set_i(op, "keepdim", g.coin(0.7));
      if (!g.emit(op)) return false;
      if (!op.i("keepdim")) return true;
      Op gather{"gather", {x, g.last()}, {}, {}};  // the extremes themselves
      set_i(gather, "dim", op.i("dim"));
      return g.emit(gather);
    };
    d.guard = [is_max](const TL& in, const TL&, const Op& op) { return unique_extreme(in[0], {op.i("dim")}, is_max); };
    d.sig = [](const TL&, const TL& out, const Op&) { return TL{out[0]}; };
    t.push_back(d);
  }
  {
    OpDef d;
    d.name = "logsumexp";
    d.run = [](const TL& in, const Op& op) { return TL{ag::logsumexp(in[0], op.iv("dims"), op.i("keepdim") != 0)}; };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], "ag::logsumexp(" + in[0] + ", " + cl(op.iv("dims")) + ", " + bool_cpp(op.i("keepdim")) + ")");
    };
    d.gen = [](Gen& g) {
      const int x = g.any_float(1, 4);
      Op op{"logsumexp", {x}, {}, {}};
      set_iv(op, "dims", g.dims_of(g.rank(x)));
      set_i(op, "keepdim", g.coin());
      return g.emit(op);
    };
    t.push_back(d);
  }
  {
    OpDef d;  // p = 1 has a kink at every zero element; every p at the zero vector
    d.name = "norm";
    d.run = [](const TL& in, const Op& op) {
      return TL{ag::norm(in[0], op.d("p"), op.iv("dims"), op.i("keepdim") != 0)};
    };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], "ag::norm(" + in[0] + ", " + cd(op.d("p")) + ", " + cl(op.iv("dims")) + ", " +
                             bool_cpp(op.i("keepdim")) + ")");
    };
    d.gen = [](Gen& g) {
      const double p = g.pick(std::vector<double>{1, 2, 2, 3});
      int x = g.any_float(1, 4);
      if (p == 1) x = g.away_from_zero(x);
      if (x < 0) return false;
      Op op{"norm", {x}, {}, {}};
      set_d(op, "p", p);
      set_iv(op, "dims", g.coin(0.2) ? std::vector<int64_t>{} : g.dims_of(g.rank(x)));
      set_i(op, "keepdim", g.coin());
      return g.emit(op);
    };
    d.guard = [](const TL& in, const TL& out, const Op& op) {
      return min_val(out[0]) >= 0.05 && (op.d("p") != 1 || away(in[0], margin_of(in[0])));
    };
    d.sig = [](const TL& in, const TL&, const Op& op) { return op.d("p") == 1 ? TL{ag::sign(in[0])} : TL{}; };
    t.push_back(d);
  }
}

}  // namespace

// ---- the table: views and joins --------------------------------------------------------------

namespace {

// A random factorisation of n into 1 to 4 sizes.
std::vector<int64_t> factor_shape(Gen& g, int64_t n) {
  std::vector<int64_t> s;
  int64_t rest = n;
  const int64_t dims = g.irand(1, 4);
  for (int64_t i = 0; i + 1 < dims; ++i) {
    std::vector<int64_t> f;
    for (int64_t k = 1; k <= rest; ++k)
      if (rest % k == 0) f.push_back(k);
    const int64_t k = g.pick(f);
    s.push_back(k);
    rest /= k;
  }
  s.push_back(rest);
  return s;
}

void add_views(std::vector<OpDef>& t) {
  for (const std::string name : {"reshape", "view"}) {
    OpDef d;  // view: contiguous inputs only; one size may be -1
    d.name = name;
    d.weight = name == "reshape" ? 3 : 1;
    d.run = [name](const TL& in, const Op& op) {
      return TL{name == "reshape" ? ag::reshape(in[0], op.iv("shape")) : ag::view(in[0], op.iv("shape"))};
    };
    d.cpp = [name](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], in[0] + "." + name + "(" + cl(op.iv("shape")) + ")");
    };
    d.gen = [name](Gen& g) {
      const int x = name == "view" ? g.pick_float([](const Value& v) { return v.t.is_contiguous(); }) : g.any_float();
      if (x < 0) return false;
      std::vector<int64_t> s = factor_shape(g, g.val(x).t.numel());
      if (g.coin(0.3)) s[size_t(g.irand(0, int64_t(s.size()) - 1))] = -1;
      Op op{name, {x}, {}, {}};
      set_iv(op, "shape", s);
      return g.emit(op);
    };
    t.push_back(d);
  }
  {
    OpDef d;
    d.name = "flatten";
    d.weight = 1;
    d.run = [](const TL& in, const Op& op) { return TL{ag::flatten(in[0], op.i("start"), op.i("end"))}; };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], "ag::flatten(" + in[0] + ", " + op.attr("start") + ", " + op.attr("end") + ")");
    };
    d.gen = [](Gen& g) {
      const int x = g.any_float(2, 4);
      const int64_t r = g.rank(x), a = g.irand(0, r - 2), b = g.irand(a + 1, r - 1);
      Op op{"flatten", {x}, {}, {}};
      set_i(op, "start", a);
      set_i(op, "end", g.coin(0.3) ? b - r : b);
      return g.emit(op);
    };
    t.push_back(d);
  }
  {
    OpDef d;
    d.name = "transpose";
    d.weight = 3;
    d.run = [](const TL& in, const Op& op) { return TL{ag::transpose(in[0], op.i("d0"), op.i("d1"))}; };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], in[0] + ".transpose(" + op.attr("d0") + ", " + op.attr("d1") + ")");
    };
    d.gen = [](Gen& g) {
      const int x = g.any_float(2, 4);
      const int64_t r = g.rank(x);
      int64_t a = g.dim_of(r), b = g.dim_of(r);
      if ((a + r) % r == (b + r) % r) b = ((a + r) % r + 1) % r;
      Op op{"transpose", {x}, {}, {}};
      set_i(op, "d0", a);
      set_i(op, "d1", b);
      return g.emit(op);
    };
    t.push_back(d);
  }
  {
    OpDef d;
    d.name = "permute";
    d.weight = 2;
    d.run = [](const TL& in, const Op& op) { return TL{ag::permute(in[0], op.iv("dims"))}; };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], in[0] + ".permute(" + cl(op.iv("dims")) + ")");
    };
    d.gen = [](Gen& g) {
      const int x = g.any_float(2, 4);
      std::vector<int64_t> p = all_dims(g.rank(x));
      g.shuffle(p);
      Op op{"permute", {x}, {}, {}};
      set_iv(op, "dims", p);
      return g.emit(op);
    };
    t.push_back(d);
  }
  {
    OpDef d;
    d.name = "narrow";
    d.weight = 2;
    d.run = [](const TL& in, const Op& op) { return TL{ag::narrow(in[0], op.i("dim"), op.i("start"), op.i("length"))}; };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], in[0] + ".narrow(" + op.attr("dim") + ", " + op.attr("start") + ", " + op.attr("length") + ")");
    };
    d.gen = [](Gen& g) {
      const int x = g.pick_float([](const Value& v) {
        for (int64_t s : v.shape())
          if (s >= 2) return true;
        return false;
      });
      if (x < 0) return false;
      const auto s = g.shape(x);
      int64_t dim;
      do dim = g.irand(0, int64_t(s.size()) - 1);
      while (s[size_t(dim)] < 2);
      const int64_t n = s[size_t(dim)], len = g.irand(1, n - 1), start = g.irand(0, n - len);
      Op op{"narrow", {x}, {}, {}};
      set_i(op, "dim", g.coin(0.3) ? dim - int64_t(s.size()) : dim);
      set_i(op, "start", start);
      set_i(op, "length", len);
      return g.emit(op);
    };
    t.push_back(d);
  }
  {
    OpDef d;
    d.name = "select";
    d.weight = 2;
    d.run = [](const TL& in, const Op& op) { return TL{ag::select(in[0], op.i("dim"), op.i("index"))}; };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], in[0] + ".select(" + op.attr("dim") + ", " + op.attr("index") + ")");
    };
    d.gen = [](Gen& g) {
      const int x = g.any_float(1, 4);
      const int64_t dim = g.dim_of(g.rank(x));
      Op op{"select", {x}, {}, {}};
      set_i(op, "dim", dim);
      set_i(op, "index", g.irand(0, g.val(x).t.size(dim) - 1));
      return g.emit(op);
    };
    t.push_back(d);
  }
  {
    OpDef d;  // size-1 dims grow, and new leading dims
    d.name = "expand";
    d.weight = 3;
    d.run = [](const TL& in, const Op& op) { return TL{ag::expand(in[0], op.iv("shape"))}; };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], in[0] + ".expand(" + cl(op.iv("shape")) + ")");
    };
    d.gen = [](Gen& g) {
      const int x = g.any_float(0, 3);
      std::vector<int64_t> s = g.shape(x);
      for (auto& v : s)
        if (v == 1 && g.coin(0.7)) v = g.irand(2, 3);
      const int64_t lead = g.irand(s.empty() ? 1 : 0, 2);
      for (int64_t i = 0; i < lead; ++i) s.insert(s.begin(), g.irand(1, 3));
      if (numel_of(s) > kMaxNumel) return false;  // x's own shape too: a new view all the same
      if (g.coin(0.2)) {  // -1 keeps a size
        const size_t i = size_t(int64_t(s.size()) - g.rank(x)) + size_t(g.irand(0, std::max<int64_t>(0, g.rank(x) - 1)));
        if (i < s.size() && g.rank(x) > 0) s[i] = -1;
      }
      Op op{"expand", {x}, {}, {}};
      set_iv(op, "shape", s);
      return g.emit(op);
    };
    t.push_back(d);
  }
  {
    OpDef d;  // without dim: every size-1 dim
    d.name = "squeeze";
    d.weight = 1;
    d.run = [](const TL& in, const Op& op) { return TL{op.has("dim") ? ag::squeeze(in[0], op.i("dim")) : ag::squeeze(in[0])}; };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], in[0] + ".squeeze(" + (op.has("dim") ? op.attr("dim") : "") + ")");
    };
    d.gen = [](Gen& g) {
      const int x = g.pick_float([](const Value& v) {
        for (int64_t s : v.shape())
          if (s == 1) return true;
        return false;
      });
      if (x < 0) return false;
      Op op{"squeeze", {x}, {}, {}};
      if (g.coin(0.6)) set_i(op, "dim", g.dim_of(g.rank(x)));
      return g.emit(op);
    };
    t.push_back(d);
  }
  {
    OpDef d;
    d.name = "unsqueeze";
    d.weight = 2;
    d.run = [](const TL& in, const Op& op) { return TL{ag::unsqueeze(in[0], op.i("dim"))}; };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], in[0] + ".unsqueeze(" + op.attr("dim") + ")");
    };
    d.gen = [](Gen& g) {
      const int x = g.any_float(0, 3);
      Op op{"unsqueeze", {x}, {}, {}};
      set_i(op, "dim", g.dim_of(g.rank(x) + 1));
      return g.emit(op);
    };
    t.push_back(d);
  }
  for (const std::string name : {"cat", "stack"}) {
    OpDef d;  // 2 or 3 tensors, the same one more than once sometimes
    d.name = name;
    d.weight = 2;
    d.fresh = true;
    d.run = [name](const TL& in, const Op& op) {
      return TL{name == "cat" ? ag::cat(in, op.i("dim")) : ag::stack(in, op.i("dim"))};
    };
    d.cpp = [name](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], "ag::" + name + "({" + join(in, ", ") + "}, " + op.attr("dim") + ")");
    };
    d.gen = [name](Gen& g) {
      const bool is_cat = name == "cat";
      const int a = g.any_float(is_cat ? 1 : 0, 3);
      const auto s = g.shape(a);
      const int64_t r = int64_t(s.size());
      const int64_t dim = is_cat ? g.dim_of(r) : g.dim_of(r + 1);
      const int64_t wd = dim < 0 ? dim + r : dim;
      Op op{name, {a}, {}, {}};
      int64_t total = numel_of(s);
      const int64_t n = g.irand(2, 3);
      for (int64_t k = 1; k < n; ++k) {
        if (g.coin(0.25)) {
          op.in.push_back(a);
        } else {
          auto fits = [&](const Value& v) {
            const auto vs = v.shape();
            if (vs.size() != s.size()) return false;
            for (size_t i = 0; i < vs.size(); ++i)
              if (vs[i] != s[i] && !(is_cat && int64_t(i) == wd)) return false;
            return true;
          };
          int b = g.coin(0.6) ? g.choose(g.candidates(fits)) : -1;
          if (b < 0) {
            auto bs = s;
            if (is_cat) bs[size_t(wd)] = g.irand(1, 3);
            b = g.any_leaf(bs);
          }
          op.in.push_back(b);
        }
        total += g.val(op.in.back()).t.numel();
      }
      if (total > kMaxNumel) return false;
      set_i(op, "dim", dim);
      return g.emit(op);
    };
    t.push_back(d);
  }
  for (const std::string name : {"split", "chunk"}) {
    OpDef d;  // several outputs, views of the input
    d.name = name;
    d.weight = 2;
    d.run = [name](const TL& in, const Op& op) {
      return name == "split" ? ag::split(in[0], op.i("size"), op.i("dim")) : ag::chunk(in[0], op.i("chunks"), op.i("dim"));
    };
    d.cpp = [name](const Strs& in, const Strs& out, const Op& op) {
      const std::string r = "r_" + out[0];
      std::string s = "std::vector<ag::Tensor> " + r + " = ag::" + name + "(" + in[0] + ", " +
                      op.attr(name == "split" ? "size" : "chunks") + ", " + op.attr("dim") + ");";
      for (size_t i = 0; i < out.size(); ++i) s += "\n" + let(out[i], r + "[" + std::to_string(i) + "]");
      return s;
    };
    d.gen = [name](Gen& g) {
      const int x = g.pick_float([](const Value& v) {
        for (int64_t s : v.shape())
          if (s >= 2) return true;
        return false;
      });
      if (x < 0) return false;
      const auto s = g.shape(x);
      int64_t dim;
      do dim = g.irand(0, int64_t(s.size()) - 1);
      while (s[size_t(dim)] < 2);
      Op op{name, {x}, {}, {}};
      set_i(op, name == "split" ? "size" : "chunks", g.irand(1, s[size_t(dim)] - 1));
      set_i(op, "dim", g.coin(0.3) ? dim - int64_t(s.size()) : dim);
      return g.emit(op);
    };
    t.push_back(d);
  }
  {
    OpDef d;  // a 1-D int64 index, repeats allowed (the backward adds them up)
    d.name = "index_select";
    d.weight = 1;
    d.run = [](const TL& in, const Op& op) { return TL{ag::index_select(in[0], op.i("dim"), in[1])}; };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], "ag::index_select(" + in[0] + ", " + op.attr("dim") + ", " + in[1] + ")");
    };
    d.gen = [](Gen& g) {
      const int x = g.any_float(1, 3);
      const int64_t dim = g.dim_of(g.rank(x));
      const int idx = g.int_leaf_range({g.irand(1, 4)}, g.val(x).t.size(dim));
      Op op{"index_select", {x, idx}, {}, {}};
      set_i(op, "dim", dim);
      return g.emit(op);
    };
    t.push_back(d);
  }
  {
    OpDef d;  // an index of x's rank (argmax's with keepdim fits: gather then picks maxima)
    d.name = "gather";
    d.weight = 1;
    d.run = [](const TL& in, const Op& op) { return TL{ag::gather(in[0], op.i("dim"), in[1])}; };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], "ag::gather(" + in[0] + ", " + op.attr("dim") + ", " + in[1] + ")");
    };
    d.gen = [](Gen& g) {
      const int x = g.any_float(1, 3);
      const auto s = g.shape(x);
      const int64_t r = int64_t(s.size()), dim = g.dim_of(r), wd = (dim + r) % r;
      auto fits = [&](const Value& v) {
        const auto is = v.shape();
        if (int64_t(is.size()) != r) return false;
        for (int64_t i = 0; i < r; ++i)
          if (i != wd && is[size_t(i)] > s[size_t(i)]) return false;
        return v.t.numel() > 0 && max_val(v.t) < double(s[size_t(wd)]) && min_val(v.t) >= 0;
      };
      int idx = g.coin(0.5) ? g.choose(g.candidates(fits, Kind::Int)) : -1;
      if (idx < 0) {
        std::vector<int64_t> is;
        for (int64_t i = 0; i < r; ++i) is.push_back(i == wd ? g.irand(1, 3) : g.irand(1, s[size_t(i)]));
        idx = g.int_leaf_range(is, s[size_t(wd)]);
      }
      Op op{"gather", {x, idx}, {}, {}};
      set_i(op, "dim", dim);
      return g.emit(op);
    };
    t.push_back(d);
  }
}

}  // namespace

// ---- the table: products, normalisation, attention, convolution, losses ----------------------

namespace {

// A float value of exactly this shape (from the pool, sometimes) or a new leaf.
int of_shape(Gen& g, const std::vector<int64_t>& s, double p_pool = 0.5) {
  if (g.coin(p_pool)) {
    const int id = g.choose(g.candidates([&](const Value& v) { return v.shape() == s; }));
    if (id >= 0) return id;
  }
  return g.any_leaf(s);
}

// x with rank 4 and both spatial sizes >= lo: from the pool, a reshape of a value, or a leaf.
int image(Gen& g, int64_t lo) {
  const int x = g.pick_float([&](const Value& v) { return v.rank() == 4 && v.t.size(2) >= lo && v.t.size(3) >= lo; });
  if (x >= 0 && g.coin(0.7)) return x;
  const int y = g.pick_float([&](const Value& v) { return v.t.numel() >= lo * lo; });
  if (y >= 0 && g.coin(0.5)) {
    const int64_t n = g.val(y).t.numel();
    for (int64_t h = lo; h <= 5; ++h)
      for (int64_t w = lo; w <= 5; ++w)
        if (n % (h * w) == 0 && n / (h * w) <= 6) {
          const int64_t c = n / (h * w);
          Op op{"reshape", {y}, {}, {}};
          set_iv(op, "shape", c % 2 == 0 && g.coin() ? std::vector<int64_t>{2, c / 2, h, w} : std::vector<int64_t>{1, c, h, w});
          return g.emit(op) ? g.last() : -1;
        }
  }
  return g.any_leaf({g.irand(1, 2), g.irand(1, 3), g.irand(lo, 5), g.irand(lo, 5)});
}

void add_products(std::vector<OpDef>& t) {
  {
    OpDef d;  // 1-D to N-D, with broadcast batch dims
    d.name = "matmul";
    d.weight = 3;
    d.fresh = true;
    d.run = [](const TL& in, const Op&) { return TL{ag::matmul(in[0], in[1])}; };
    d.cpp = [](const Strs& in, const Strs& out, const Op&) { return let(out[0], "ag::matmul(" + in[0] + ", " + in[1] + ")"); };
    d.gen = [](Gen& g) {
      const int a = g.any_float(1, 4);
      const auto sa = g.shape(a);
      const int64_t K = sa.back(), N = g.irand(1, 4);
      std::vector<int64_t> sb;
      const double r = g.urand();
      if (r < 0.2) sb = {K};
      else if (r < 0.7 || sa.size() < 2) sb = {K, N};
      else {  // batch dims that broadcast with a's
        std::vector<int64_t> batch(sa.begin(), sa.end() - 2);
        for (auto& v : batch)
          if (g.coin(0.3)) v = 1;
        if (batch.empty() || g.coin(0.2)) batch.insert(batch.begin(), 2);
        sb = batch;
        sb.push_back(K);
        sb.push_back(N);
      }
      if (numel_of(sb) > kMaxNumel) return false;
      return g.emit(Op{"matmul", {a, of_shape(g, sb)}, {}, {}});
    };
    t.push_back(d);
  }
  {
    OpDef d;  // act: none, relu, gelu, gelu_tanh (the fused forms)
    d.name = "linear";
    d.weight = 3;
    d.run = [](const TL& in, const Op& op) {
      const Tensor b = in.size() > 2 ? in[2] : Tensor();
      const std::string& a = op.attr("act");
      return TL{a == "none" ? ag::linear(in[0], in[1], b) : ag::linear(in[0], in[1], b, act_of(a))};
    };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      const std::string b = in.size() > 2 ? in[2] : "ag::Tensor()";
      const std::string& a = op.attr("act");
      return let(out[0], "ag::linear(" + in[0] + ", " + in[1] + ", " + b + (a == "none" ? "" : ", " + act_cpp(a)) + ")");
    };
    d.gen = [](Gen& g) {
      const int x = g.any_float(1, 4);
      const int64_t K = g.shape(x).back(), N = g.irand(1, 4);
      Op op{"linear", {x, of_shape(g, {N, K})}, {}, {}};
      if (g.coin(0.7)) op.in.push_back(of_shape(g, {N}));
      op.set("act", g.pick(std::vector<std::string>{"none", "none", "relu", "gelu", "gelu_tanh"}));
      return g.emit(op);
    };
    d.guard = [](const TL& in, const TL&, const Op& op) {
      if (op.attr("act") != "relu") return true;
      const Tensor pre = ag::linear(in[0], in[1], in.size() > 2 ? in[2] : Tensor());
      return away(pre, margin_of(pre));
    };
    d.sig = [](const TL& in, const TL&, const Op& op) {
      if (op.attr("act") != "relu") return TL{};
      return TL{ag::sign(ag::linear(in[0], in[1], in.size() > 2 ? in[2] : Tensor()))};
    };
    t.push_back(d);
  }
  {
    OpDef d;  // inputs x, w1, [b1], w2, [b2]
    d.name = "feed_forward";
    d.weight = 1;
    d.run = [](const TL& in, const Op& op) {
      size_t k = 2;
      const Tensor b1 = op.i("b1") ? in[k++] : Tensor();
      const Tensor w2 = in[k++];
      const Tensor b2 = op.i("b2") ? in[k++] : Tensor();
      return TL{ag::feed_forward(in[0], in[1], b1, act_of(op.attr("act")), w2, b2)};
    };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      size_t k = 2;
      const std::string b1 = op.i("b1") ? in[k++] : "ag::Tensor()";
      const std::string w2 = in[k++];
      const std::string b2 = op.i("b2") ? in[k++] : "ag::Tensor()";
      return let(out[0], "ag::feed_forward(" + in[0] + ", " + in[1] + ", " + b1 + ", " + act_cpp(op.attr("act")) + ", " +
                             w2 + ", " + b2 + ")");
    };
    d.gen = [](Gen& g) {
      const int x = g.any_float(1, 3);
      const int64_t K = g.shape(x).back(), H = g.irand(1, 4), O = g.irand(1, 3);
      Op op{"feed_forward", {x, of_shape(g, {H, K})}, {}, {}};
      set_i(op, "b1", g.coin(0.8));
      if (op.i("b1")) op.in.push_back(of_shape(g, {H}));
      op.in.push_back(of_shape(g, {O, H}));
      set_i(op, "b2", g.coin(0.5));
      if (op.i("b2")) op.in.push_back(of_shape(g, {O}));
      op.set("act", g.pick(std::vector<std::string>{"relu", "gelu", "gelu_tanh"}));
      return g.emit(op);
    };
    d.guard = [](const TL& in, const TL&, const Op& op) {
      if (op.attr("act") != "relu") return true;
      const Tensor h = ag::linear(in[0], in[1], op.i("b1") ? in[2] : Tensor());
      return away(h, margin_of(h));
    };
    d.sig = [](const TL& in, const TL&, const Op& op) {
      if (op.attr("act") != "relu") return TL{};
      return TL{ag::sign(ag::linear(in[0], in[1], op.i("b1") ? in[2] : Tensor()))};
    };
    t.push_back(d);
  }
  for (const std::string name : {"softmax", "log_softmax"}) {
    OpDef d;
    d.name = name;
    d.weight = 2;
    d.run = [name](const TL& in, const Op& op) {
      return TL{name == "softmax" ? ag::softmax(in[0], op.i("dim")) : ag::log_softmax(in[0], op.i("dim"))};
    };
    d.cpp = [name](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], "ag::" + name + "(" + in[0] + ", " + op.attr("dim") + ")");
    };
    d.gen = [name](Gen& g) {
      const int x = g.any_float(1, 4);
      Op op{name, {x}, {}, {}};
      set_i(op, "dim", g.dim_of(g.rank(x)));
      return g.emit(op);
    };
    t.push_back(d);
  }
  {
    OpDef d;  // over the last 1 or 2 dims; inputs x, [weight], [bias]
    d.name = "layer_norm";
    d.weight = 2;
    d.run = [](const TL& in, const Op& op) {
      size_t k = 1;
      const Tensor w = op.i("w") ? in[k++] : Tensor();
      const Tensor b = op.i("b") ? in[k++] : Tensor();
      return TL{ag::layer_norm(in[0], op.iv("shape"), w, b, op.d("eps"))};
    };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      size_t k = 1;
      const std::string w = op.i("w") ? in[k++] : "ag::Tensor()";
      const std::string b = op.i("b") ? in[k++] : "ag::Tensor()";
      return let(out[0], "ag::layer_norm(" + in[0] + ", " + cl(op.iv("shape")) + ", " + w + ", " + b + ", " +
                             cd(op.d("eps")) + ")");
    };
    d.gen = [](Gen& g) {
      const int x = g.pick_float([](const Value& v) { return v.rank() >= 1 && v.t.size(-1) >= 2; });
      if (x < 0) return false;
      const auto s = g.shape(x);
      const int64_t k = s.size() >= 2 && g.coin(0.3) ? 2 : 1;
      const std::vector<int64_t> ns(s.end() - k, s.end());
      if (numel_of(ns) < 3) return false;
      Op op{"layer_norm", {x}, {}, {}};
      set_iv(op, "shape", ns);
      set_i(op, "w", g.coin(0.6));
      if (op.i("w")) op.in.push_back(of_shape(g, ns));
      set_i(op, "b", g.coin(0.6));
      if (op.i("b")) op.in.push_back(of_shape(g, ns));
      set_d(op, "eps", g.coin(0.7) ? 1e-5 : 0.1);
      return g.emit(op);
    };
    // Rows of at least 3: over 2 the output is -1 and 1 whatever the input, and the gradient
    // is eps's effect alone, a cancellation that float32 does not resolve.
    d.guard = [](const TL& in, const TL&, const Op& op) {
      return numel_of(op.iv("shape")) >= 3 && rows_spread(in[0], int64_t(op.iv("shape").size()));
    };
    t.push_back(d);
  }
  {
    OpDef d;  // rows of a float table picked by an int64 index
    d.name = "embedding";
    d.weight = 1;
    d.run = [](const TL& in, const Op&) { return TL{ag::embedding(in[0], in[1])}; };
    d.cpp = [](const Strs& in, const Strs& out, const Op&) { return let(out[0], "ag::embedding(" + in[0] + ", " + in[1] + ")"); };
    d.gen = [](Gen& g) {
      const int w = g.any_float(2, 2);
      const int idx = g.int_leaf_range(g.rand_shape(0, 2, 6), g.val(w).t.size(0));
      return g.emit(Op{"embedding", {idx, w}, {}, {}});
    };
    t.push_back(d);
  }
  {
    OpDef d;  // inputs q, k, v, [mask]
    d.name = "sdpa";
    d.weight = 2;
    d.random = true;  // when dropout_p > 0
    d.run = [](const TL& in, const Op& op) {
      if (op.has("seed")) ag::manual_seed(uint64_t(op.i("seed")));
      ag::AttentionOptions o;
      o.is_causal = op.i("causal") != 0;
      if (in.size() > 3) o.attn_mask = in[3];
      o.dropout_p = op.d("dropout_p");
      if (op.has("scale")) o.scale = op.d("scale");
      return TL{ag::scaled_dot_product_attention(in[0], in[1], in[2], o)};
    };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      Strs o;
      if (op.i("causal")) o.push_back(".is_causal = true");
      if (in.size() > 3) o.push_back(".attn_mask = " + in[3]);
      if (op.d("dropout_p") > 0) o.push_back(".dropout_p = " + cd(op.d("dropout_p")));
      if (op.has("scale")) o.push_back(".scale = " + cd(op.d("scale")));
      return (op.has("seed") ? "ag::manual_seed(" + op.attr("seed") + ");\n" : std::string()) + let(out[0], "ag::scaled_dot_product_attention(" + in[0] + ", " + in[1] + ", " + in[2] +
                             (o.empty() ? "" : ", {" + join(o, ", ") + "}") + ")");
    };
    d.gen = [](Gen& g) {
      const int q = g.pick_float([](const Value& v) { return v.rank() >= 2 && v.rank() <= 4 && v.t.size(-1) <= 4; });
      std::vector<int64_t> qs = q >= 0 ? g.shape(q) : g.rand_shape(2, 4, 32);
      if (qs.size() < 2) return false;
      const int qi = q >= 0 ? q : g.any_leaf(qs);
      const std::vector<int64_t> batch(qs.begin(), qs.end() - 2);
      const int64_t Tq = qs[qs.size() - 2], D = qs.back();
      const bool self = g.coin(0.3);
      const int64_t Tk = self ? Tq : g.irand(1, 4), Dv = g.irand(1, 4);
      auto with = [&](int64_t a, int64_t b) {
        auto s = batch;
        s.push_back(a);
        s.push_back(b);
        return s;
      };
      const int k = self ? qi : of_shape(g, with(Tk, D));
      const int v = self && g.coin() ? qi : of_shape(g, with(Tk, self ? D : Dv));
      Op op{"sdpa", {qi, k, v}, {}, {}};
      const double r = g.urand();
      set_i(op, "causal", r < 0.25);
      if (r >= 0.25 && r < 0.5) {  // a mask over [Tq, Tk]: bool with a key for every query, or additive
        if (g.coin()) {  // query i always sees key i % Tk
          std::vector<int64_t> m;
          for (int64_t i = 0; i < Tq * Tk; ++i) m.push_back(i % Tk == (i / Tk) % Tk || g.coin(0.6));
          op.in.push_back(g.bool_leaf_of({Tq, Tk}, m));
        } else {
          op.in.push_back(g.leaf({Tq, Tk}, -1, 1, false));
        }
      }
      set_d(op, "dropout_p", g.coin(0.1) ? 0.3 : 0.0);
      if (op.d("dropout_p") > 0) set_i(op, "seed", g.irand(1, 999));
      if (g.coin(0.3)) set_d(op, "scale", g.pick(std::vector<double>{0.5, 1.25}));
      return g.emit(op);
    };
    // Scores of moderate size: a peaked softmax amplifies its inputs' rounding.
    d.guard = [](const TL& in, const TL&, const Op& op) {
      const double scale = op.has("scale") ? op.d("scale") : 1 / std::sqrt(double(std::max<int64_t>(in[0].size(-1), 1)));
      return max_abs(ag::matmul(in[0], in[1].transpose(-2, -1))) * scale <= kMaxScore;
    };
    // A query whose softmax is one-hot (a single key, the first query of causal attention,
    // a dominant score) has q and k gradients that are 0 in exact arithmetic, and
    // FlashAttention's backward forms them as dP - rowsum(dO * O) with O rounded to the
    // output's dtype, so in bfloat16 they are rounding noise.
    d.noisy16 = [](const TL& in, const TL&, const Op& op) {
      const double scale = op.has("scale") ? op.d("scale") : 1 / std::sqrt(double(std::max<int64_t>(in[0].size(-1), 1)));
      Tensor s = ag::mul(ag::matmul(in[0], in[1].transpose(-2, -1)), scale);
      const int64_t Tq = s.size(-2), Tk = s.size(-1);
      if (in.size() > 3) {
        const Tensor& m = in[3];
        s = m.dtype() == ag::kBool ? ag::where(m, s, -INFINITY) : ag::add(s, m);
      }
      if (op.i("causal")) {
        std::vector<bool> hide;
        for (int64_t i = 0; i < Tq * Tk; ++i) hide.push_back(i % Tk > i / Tk);
        s = ag::masked_fill(s, ag::from_vector<bool>(hide, {Tq, Tk}), -INFINITY);
      }
      return max_val(ag::amax(ag::softmax(s, -1), {-1}, false)) > 0.98;
    };
    t.push_back(d);
  }
}

PoolArgs rand_pool(Gen& g, int64_t H, int64_t W) {
  for (;;) {
    PoolArgs a;
    const int64_t k = g.irand(1, 3);
    a.kernel = g.coin(0.7) ? std::vector<int64_t>{k} : std::vector<int64_t>{k, g.irand(1, 3)};
    a.stride = g.coin(0.4) ? std::vector<int64_t>{} : std::vector<int64_t>{g.irand(1, 2)};
    a.padding = {g.coin(0.3) ? a.kernel[0] / 2 : 0, 0};
    a.dilation = g.coin(0.2) ? std::vector<int64_t>{2, 1} : std::vector<int64_t>{1, 1};
    a.ceil = g.coin(0.3);
    const int64_t eh = a.dilation[0] * (a.kernel[0] - 1) + 1, ew = a.dilation[1] * (a.kernel.back() - 1) + 1;
    if (eh <= H + 2 * a.padding[0] && ew <= W + 2 * a.padding[1]) return a;
  }
}

void set_pool(Op& op, const PoolArgs& a, const std::string& prefix = "") {
  set_iv(op, prefix + "kernel", a.kernel);
  set_iv(op, prefix + "stride", a.stride);
  set_iv(op, prefix + "padding", a.padding);
  set_iv(op, prefix + "dilation", a.dilation);
  set_i(op, prefix + "ceil_mode", a.ceil);
}

std::string pool_cpp(const PoolArgs& a) {
  return cl(a.kernel) + ", " + cl(a.stride) + ", " + cl(a.padding) + ", " + cl(a.dilation) + ", " + bool_cpp(a.ceil);
}

struct ConvArgs {
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups = 1;
};
ConvArgs conv_args(const Op& op) {
  return {op.iv("stride"), op.iv("padding"), op.iv("dilation"), op.i("groups")};
}
std::string conv_cpp(const ConvArgs& c) {
  return cl(c.stride) + ", " + cl(c.padding) + ", " + cl(c.dilation) + ", " + std::to_string(c.groups);
}

// conv2d's weight (and bias) for x; fills op's conv attributes. false if x is too small.
bool conv_setup(Gen& g, int x, Op& op, bool bias) {
  const auto s = g.shape(x);
  const int64_t C = s[1], H = s[2], W = s[3];
  std::vector<int64_t> groups_ok;
  for (int64_t gr = 1; gr <= C; ++gr)
    if (C % gr == 0) groups_ok.push_back(gr);
  const int64_t groups = g.coin(0.7) ? 1 : g.pick(groups_ok);
  const int64_t OC = groups * g.irand(1, 2), kh = g.irand(1, 3), kw = g.irand(1, 3);
  ConvArgs c{{g.irand(1, 2), g.irand(1, 2)}, {g.irand(0, 1), g.irand(0, 1)}, {g.coin(0.2) ? 2 : 1, 1}, groups};
  if (c.dilation[0] * (kh - 1) + 1 > H + 2 * c.padding[0] || kw > W + 2 * c.padding[1]) return false;
  op.in = {x, of_shape(g, {OC, C / groups, kh, kw}, 0.2)};
  if (bias) op.in.push_back(of_shape(g, {OC}));
  set_iv(op, "stride", c.stride);
  set_iv(op, "padding", c.padding);
  set_iv(op, "dilation", c.dilation);
  set_i(op, "groups", groups);
  return true;
}

void add_conv(std::vector<OpDef>& t) {
  {
    OpDef d;  // inputs x, w, [b]
    d.name = "conv2d";
    d.weight = 2;
    d.run = [](const TL& in, const Op& op) {
      const ConvArgs c = conv_args(op);
      return TL{ag::conv2d(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), c.stride, c.padding, c.dilation, c.groups)};
    };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], "ag::conv2d(" + in[0] + ", " + in[1] + ", " + (in.size() > 2 ? in[2] : "ag::Tensor()") + ", " +
                             conv_cpp(conv_args(op)) + ")");
    };
    d.gen = [](Gen& g) {
      const int x = image(g, 2);
      Op op{"conv2d", {}, {}, {}};
      return x >= 0 && conv_setup(g, x, op, g.coin(0.7)) && g.emit(op);
    };
    t.push_back(d);
  }
  {
    OpDef d;
    d.name = "max_pool2d";
    d.weight = 2;
    d.run = [](const TL& in, const Op& op) {
      const PoolArgs a = pool_args(op);
      return TL{ag::max_pool2d(in[0], a.kernel, a.stride, a.padding, a.dilation, a.ceil)};
    };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], "ag::max_pool2d(" + in[0] + ", " + pool_cpp(pool_args(op)) + ")");
    };
    d.gen = [](Gen& g) {
      const int x = image(g, 2);
      if (x < 0) return false;
      Op op{"max_pool2d", {x}, {}, {}};
      set_pool(op, rand_pool(g, g.val(x).t.size(2), g.val(x).t.size(3)));
      return g.emit(op);
    };
    d.guard = [](const TL& in, const TL& out, const Op& op) { return pool_unique(in[0], out[0], pool_args(op), false); };
    d.sig = [](const TL& in, const TL&, const Op& op) { return TL{pool_winners(in[0], pool_args(op))}; };
    t.push_back(d);
  }
  {
    OpDef d;
    d.name = "avg_pool2d";
    d.weight = 2;
    d.run = [](const TL& in, const Op& op) {
      const PoolArgs a = pool_args(op);
      return TL{ag::avg_pool2d(in[0], a.kernel, a.stride, a.padding, a.ceil, op.i("count_include_pad") != 0)};
    };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      const PoolArgs a = pool_args(op);
      return let(out[0], "ag::avg_pool2d(" + in[0] + ", " + cl(a.kernel) + ", " + cl(a.stride) + ", " + cl(a.padding) + ", " +
                             bool_cpp(a.ceil) + ", " + bool_cpp(op.i("count_include_pad")) + ")");
    };
    d.gen = [](Gen& g) {
      const int x = image(g, 2);
      if (x < 0) return false;
      Op op{"avg_pool2d", {x}, {}, {}};
      PoolArgs a = rand_pool(g, g.val(x).t.size(2), g.val(x).t.size(3));
      a.dilation = {1, 1};
      set_iv(op, "kernel", a.kernel);
      set_iv(op, "stride", a.stride);
      set_iv(op, "padding", a.padding);
      set_i(op, "ceil_mode", a.ceil);
      set_i(op, "count_include_pad", g.coin());
      return g.emit(op);
    };
    t.push_back(d);
  }
  {
    OpDef d;  // max_pool2d(act(conv2d(x, w, b))) as one op; inputs x, w, [b]
    d.name = "conv2d_block";
    d.weight = 1;
    auto conv_of = [](const TL& in, const Op& op) {
      const ConvArgs c = conv_args(op);
      return ag::conv2d(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), c.stride, c.padding, c.dilation, c.groups);
    };
    d.run = [](const TL& in, const Op& op) {
      const ConvArgs c = conv_args(op);
      const PoolArgs p = pool_args(op, "p");
      return TL{ag::conv2d_block(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), {c.stride, c.padding, c.dilation, c.groups},
                                 act_of(op.attr("act")), {p.kernel, p.stride, p.padding, p.dilation, p.ceil})};
    };
    d.cpp = [](const Strs& in, const Strs& out, const Op& op) {
      const ConvArgs c = conv_args(op);
      const PoolArgs p = pool_args(op, "p");
      return let(out[0], "ag::conv2d_block(" + in[0] + ", " + in[1] + ", " + (in.size() > 2 ? in[2] : "ag::Tensor()") +
                             ", {" + cl(c.stride) + ", " + cl(c.padding) + ", " + cl(c.dilation) + ", " +
                             std::to_string(c.groups) + "}, " + act_cpp(op.attr("act")) + ", {" + pool_cpp(p) + "})");
    };
    d.gen = [](Gen& g) {
      const int x = image(g, 3);
      Op op{"conv2d_block", {}, {}, {}};
      if (x < 0 || !conv_setup(g, x, op, g.coin(0.8))) return false;
      op.set("act", g.coin(0.7) ? "relu" : "none");
      // the convolution's output size decides the pooling's arguments
      ag::Tensor c;
      {
        ag::NoGradGuard ng;
        TL in;
        for (int id : op.in) in.push_back(g.val(id).t);
        const ConvArgs a = conv_args(op);
        c = ag::conv2d(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), a.stride, a.padding, a.dilation, a.groups);
      }
      set_pool(op, rand_pool(g, c.size(2), c.size(3)), "p");
      return g.emit(op);
    };
    d.guard = [conv_of](const TL& in, const TL& out, const Op& op) {
      const Tensor c = conv_of(in, op);
      const bool relu = op.attr("act") == "relu";
      if (relu && !away(c, margin_of(c))) return false;
      return pool_unique(relu ? ag::relu(c) : c, out[0], pool_args(op, "p"), relu);
    };
    d.sig = [conv_of](const TL& in, const TL&, const Op& op) {
      const Tensor c = conv_of(in, op);
      const bool relu = op.attr("act") == "relu";
      return TL{ag::sign(c), pool_winners(relu ? ag::relu(c) : c, pool_args(op, "p"))};
    };
    t.push_back(d);
  }
}

// A target of probabilities, values in [0, 1] of shape s (from the pool or a leaf): outside
// it, the terms of a loss can cancel.
int probabilities(Gen& g, const std::vector<int64_t>& s) {
  const int id = g.coin(0.5) ? g.choose(g.candidates([&](const Value& v) {
    return v.shape() == s && v.t.numel() > 0 && min_val(v.t) >= 0 && max_val(v.t) <= 1;
  })) : -1;
  return id >= 0 ? id : g.leaf(s, 0, 1);
}

void add_losses(std::vector<OpDef>& t) {
  for (const std::string name : {"cross_entropy", "nll_loss"}) {
    OpDef d;  // class indices (int64) or, for cross_entropy, probabilities shaped like the logits
    d.name = name;
    d.weight = 2;
    const bool ce = name == "cross_entropy";
    d.run = [ce](const TL& in, const Op& op) {
      const int64_t ig = op.i("ignore_index");
      if (ce) return TL{ag::cross_entropy(in[0], in[1], reduction_of(op), ig, op.d("label_smoothing"))};
      return TL{ag::nll_loss(in[0], in[1], reduction_of(op), ig)};
    };
    d.cpp = [ce](const Strs& in, const Strs& out, const Op& op) {
      if (ce)
        return let(out[0], "ag::cross_entropy(" + in[0] + ", " + in[1] + ", " + reduction_cpp(op) + ", " +
                               op.attr("ignore_index") + ", " + cd(op.d("label_smoothing")) + ")");
      return let(out[0], "ag::nll_loss(" + in[0] + ", " + in[1] + ", " + reduction_cpp(op) + ", " + op.attr("ignore_index") + ")");
    };
    d.gen = [ce, name](Gen& g) {
      // logits [N, C], [C] or [N, C, d] (nll_loss: [N, C])
      const int x = g.pick_float([&](const Value& v) {
        return (v.rank() == 2 || (ce && (v.rank() == 1 || v.rank() == 3))) && v.t.size(v.rank() == 1 ? 0 : 1) >= 2;
      });
      const int lg = x >= 0 && g.coin(0.8) ? x : g.any_leaf(ce && g.coin(0.2) ? std::vector<int64_t>{g.irand(1, 3), g.irand(2, 4), 2}
                                                                                : std::vector<int64_t>{g.irand(1, 4), g.irand(2, 5)});
      const auto s = g.shape(lg);
      const int64_t cdim = s.size() == 1 ? 0 : 1, C = s[size_t(cdim)];
      Op op{name, {lg}, {}, {}};
      op.set("reduction", g.pick(std::vector<std::string>{"mean", "mean", "sum", "none"}));
      set_i(op, "ignore_index", -100);
      set_d(op, "label_smoothing", ce && g.coin(0.3) ? g.pick(std::vector<double>{0.1, 0.3}) : 0.0);
      if (ce && g.coin(0.2)) {
        op.in.push_back(probabilities(g, s));
      } else {
        std::vector<int64_t> ts = s;
        ts.erase(ts.begin() + cdim);
        std::vector<int64_t> data;
        for (int64_t i = 0; i < numel_of(ts); ++i) data.push_back(g.irand(0, C - 1));
        if (g.coin(0.3) && data.size() > 1) {  // some targets ignored (never all)
          const int64_t ig = g.coin() ? -100 : data[0];
          set_i(op, "ignore_index", ig);
          if (ig == -100) data[size_t(g.irand(1, int64_t(data.size()) - 1))] = -100;
          bool any = false;
          for (int64_t v : data) any = any || v != ig;
          if (!any) return false;
        }
        op.in.push_back(g.int_leaf(ts, data));
      }
      return g.emit(op);
    };
    t.push_back(d);
  }
  for (const std::string name : {"mse_loss", "bce_logits"}) {
    OpDef d;  // a float target of the input's shape (it may require grad; bce's in [0, 1])
    d.name = name;
    d.weight = 1;
    const bool mse = name == "mse_loss";
    d.run = [mse](const TL& in, const Op& op) {
      return TL{mse ? ag::mse_loss(in[0], in[1], reduction_of(op)) : ag::binary_cross_entropy_with_logits(in[0], in[1], reduction_of(op))};
    };
    d.cpp = [mse](const Strs& in, const Strs& out, const Op& op) {
      return let(out[0], std::string(mse ? "ag::mse_loss(" : "ag::binary_cross_entropy_with_logits(") + in[0] + ", " + in[1] +
                             ", " + reduction_cpp(op) + ")");
    };
    d.gen = [mse](Gen& g) {
      const int x = g.any_float();
      Op op{mse ? "mse_loss" : "bce_logits", {x, mse ? of_shape(g, g.shape(x)) : probabilities(g, g.shape(x))}, {}, {}};
      op.set("reduction", g.pick(std::vector<std::string>{"mean", "sum", "none"}));
      return g.emit(op);
    };
    t.push_back(d);
  }
}

}  // namespace

// ---- the table: in-place ops -----------------------------------------------------------------

namespace {

// add_, sub_, mul_, div_ with a tensor (broadcast to the target's shape) or a scalar.
void add_inplace_arith(std::vector<OpDef>& t) {
  for (const std::string base : {"add", "sub", "mul", "div"}) {
    for (bool scalar : {false, true}) {
      OpDef d;
      d.name = base + (scalar ? "_scalar_" : "_");
      d.inplace = true;
      d.fresh = true;
      d.weight = 1;
      d.run = [base, scalar](const TL& in, const Op& op) {
        Tensor x = in[0];
        if (scalar) {
          const double s = op.d("value");
          if (base == "add") x.add_(s);
          else if (base == "sub") x.sub_(s);
          else if (base == "mul") x.mul_(s);
          else x.div_(s);
        } else {
          if (base == "add") x.add_(in[1], op.d("alpha"));
          else if (base == "sub") x.sub_(in[1]);
          else if (base == "mul") x.mul_(in[1]);
          else x.div_(in[1]);
        }
        return TL{x};
      };
      d.cpp = [base, scalar](const Strs& in, const Strs& out, const Op& op) {
        std::string arg = scalar ? cd(op.d("value")) : in[1];
        if (!scalar && base == "add" && op.d("alpha") != 1) arg += ", " + cd(op.d("alpha"));
        return in[0] + "." + base + "_(" + arg + ");\n" + let(out[0], in[0]);
      };
      d.gen = [base, scalar, name = d.name](Gen& g) {
        const int x = g.inplace_target();
        if (x < 0) return false;
        Op op{name, {x}, {}, {}};
        if (scalar) {
          set_d(op, "value", base == "div" ? g.pick(std::vector<double>{2.0, -0.5}) : g.pick(std::vector<double>{0.5, -1.5}));
          return g.emit(op);
        }
        const auto s = g.shape(x);
        const Tensor& target = g.val(x).t;
        auto fits = [&](const Value& v) {
          const auto vs = v.shape();
          if (vs.size() > s.size() || v.t.is_alias_of(target)) return false;
          for (size_t i = 0; i < vs.size(); ++i)
            if (vs[i] != 1 && vs[i] != s[s.size() - vs.size() + i]) return false;
          return base != "div" || min_abs(v.t) >= 0.2;
        };
        int o = g.coin(0.5) ? g.choose(g.candidates(fits)) : -1;
        if (o < 0) o = base == "div" ? g.leaf(g.sub_shape(s), 0.5, 2) : g.any_leaf(g.sub_shape(s));
        op.in.push_back(o);
        if (base == "add") set_d(op, "alpha", g.coin(0.7) ? 1.0 : -0.5);
        return g.emit(op);
      };
      if (base == "div" && !scalar) d.guard = [](const TL& in, const TL&, const Op&) { return nonzero_ok(in[1]); };
      t.push_back(d);
    }
  }
  {
    OpDef d;  // the target takes src's values (broadcast) and src's history
    d.name = "copy_";
    d.inplace = true;
    d.fresh = true;
    d.weight = 1;
    d.run = [](const TL& in, const Op&) {
      Tensor x = in[0];
      x.copy_(in[1]);
      return TL{x};
    };
    d.cpp = [](const Strs& in, const Strs& out, const Op&) { return in[0] + ".copy_(" + in[1] + ");\n" + let(out[0], in[0]); };
    d.gen = [](Gen& g) {
      const int x = g.inplace_target();
      if (x < 0) return false;
      const auto s = g.shape(x);
      const Tensor& target = g.val(x).t;
      auto fits = [&](const Value& v) {
        const auto vs = v.shape();
        if (vs.size() > s.size() || v.t.is_alias_of(target)) return false;
        for (size_t i = 0; i < vs.size(); ++i)
          if (vs[i] != 1 && vs[i] != s[s.size() - vs.size() + i]) return false;
        return true;
      };
      int o = g.choose(g.candidates(fits));
      if (o < 0) o = g.any_leaf(g.sub_shape(s));
      return g.emit(Op{"copy_", {x, o}, {}, {}});
    };
    t.push_back(d);
  }
  for (const std::string name : {"zero_", "fill_"}) {
    OpDef d;  // the target becomes a constant: no gradient flows through it
    d.name = name;
    d.inplace = true;
    d.fresh = true;
    d.weight = 1;
    d.run = [name](const TL& in, const Op& op) {
      Tensor x = in[0];
      if (name == "zero_") x.zero_();
      else x.fill_(op.d("value"));
      return TL{x};
    };
    d.cpp = [name](const Strs& in, const Strs& out, const Op& op) {
      return in[0] + "." + name + "(" + (name == "fill_" ? cd(op.d("value")) : "") + ");\n" + let(out[0], in[0]);
    };
    d.gen = [name](Gen& g) {
      const int x = g.inplace_target();
      if (x < 0) return false;
      Op op{name, {x}, {}, {}};
      if (name == "fill_") set_d(op, "value", 0.75);
      return g.emit(op);
    };
    t.push_back(d);
  }
  add_clamp(t, true);
}

std::vector<OpDef> build_table() {
  std::vector<OpDef> t;
  add_elementwise(t);
  add_reductions(t);
  add_views(t);
  add_products(t);
  add_conv(t);
  add_losses(t);
  add_inplace_arith(t);
  return t;
}

const std::vector<OpDef>& table() {
  static const std::vector<OpDef> t = build_table();
  return t;
}

const OpDef& def(const std::string& name) {
  static const std::map<std::string, const OpDef*> by_name = [] {
    std::map<std::string, const OpDef*> m;
    for (const OpDef& d : table()) m[d.name] = &d;
    return m;
  }();
  static const OpDef leaf_def = [] {
    OpDef d;
    d.name = "leaf";
    return d;
  }();
  if (name == "leaf") return leaf_def;
  const auto it = by_name.find(name);
  if (it == by_name.end()) throw std::runtime_error("graph fuzz: unknown op " + name);
  return *it->second;
}

}  // namespace

const std::vector<std::string>& op_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const OpDef& d : table()) n.push_back(d.name);
    return n;
  }();
  return names;
}

// ---- programs: text, running, normalising ------------------------------------------------------

namespace {

bool is_ref(const std::string& tok) {
  return tok.size() > 1 && tok[0] == 'v' && tok.find_first_not_of("0123456789", 1) == std::string::npos;
}

bool has_random(const Program& p) {
  for (const Op& op : p.ops)
    if (op.name != "leaf" && def(op.name).random && (op.name != "sdpa" || op.d("dropout_p") > 0)) return true;
  return false;
}

// What a run of a kink op saw: float64 copies of its inputs and outputs.
struct TraceEntry {
  size_t op;
  TL in, out;
};

TL f64_copies(const TL& ts) {
  TL r;
  for (const Tensor& t : ts) r.push_back(ag::is_floating(t.dtype()) ? t.detach().to(ag::kFloat64).clone() : t.detach().clone());
  return r;
}

// r: applied to every op's outputs (identity, or a rounding to a lower precision).
TL run_impl(const Program& p, const TL& leaves, std::vector<TraceEntry>* trace, std::map<int, Tensor>* env_out = nullptr,
            const Round& r = {}) {
  std::map<int, Tensor> env;
  std::optional<std::pair<uint64_t, uint64_t>> gen_state;
  if (has_random(p)) gen_state = ag::generator_state();  // the random ops seed it
  size_t li = 0;
  for (size_t k = 0; k < p.ops.size(); ++k) {
    const Op& op = p.ops[k];
    if (op.name == "leaf") {
      env[op.out.at(0)] = leaves.at(li++);
      continue;
    }
    const OpDef& d = def(op.name);
    TL in;
    for (int id : op.in) in.push_back(env.at(id));
    const bool traced = trace && (d.sig || d.noisy16);
    const TL in64 = traced ? f64_copies(in) : TL{};  // before an in-place op changes them
    TL out = d.run(in, op);
    if (out.size() != op.out.size())
      throw std::runtime_error("graph fuzz: " + op.name + " made " + std::to_string(out.size()) + " outputs, the program names " +
                               std::to_string(op.out.size()));
    if (traced) trace->push_back({k, in64, f64_copies(out)});
    for (size_t i = 0; i < out.size(); ++i) env[op.out[i]] = r ? r(out[i]) : out[i];
  }
  if (gen_state) ag::set_generator_state(gen_state->first, gen_state->second);
  TL outs;
  for (int id : p.outputs) outs.push_back(env.at(id));
  if (env_out) *env_out = std::move(env);
  return outs;
}

// Drops ops whose outputs nothing needs, and numbers the values in order.
Program normalize(const Program& p) {
  std::set<int> live(p.outputs.begin(), p.outputs.end());
  std::vector<bool> keep(p.ops.size(), false);
  for (size_t k = p.ops.size(); k-- > 0;) {
    bool any = false;
    for (int id : p.ops[k].out) any = any || live.count(id);
    if (!any) continue;
    keep[k] = true;
    for (int id : p.ops[k].in) live.insert(id);
  }
  Program q;
  q.seed = p.seed;
  std::map<int, int> to;
  for (size_t k = 0; k < p.ops.size(); ++k) {
    if (!keep[k]) continue;
    Op op = p.ops[k];
    for (int& id : op.in) id = to.at(id);
    for (int& id : op.out) {
      const int n = int(to.size());
      to[id] = n;
      id = n;
    }
    q.ops.push_back(op);
  }
  for (int id : p.outputs) q.outputs.push_back(to.at(id));
  return q;
}

Program finish(Gen& g) {
  std::vector<int> outs, used, grad_leaves;
  for (const auto& [id, v] : g.vals) {
    if (v.kind != Kind::Float || v.retired) continue;
    if (v.leaf) {
      if (v.grad()) grad_leaves.push_back(id);
    } else if (v.uses == 0) {
      outs.push_back(id);
    } else {
      used.push_back(id);
    }
  }
  // A result that ops use is sometimes a root too, and so, rarely, is a leaf or one root twice.
  if (!used.empty() && (outs.empty() || g.coin(0.3))) outs.push_back(g.pick(used));
  if (!grad_leaves.empty() && (outs.empty() || g.coin(0.1))) outs.push_back(g.pick(grad_leaves));
  if (!outs.empty() && g.coin(0.1)) outs.push_back(outs[0]);
  if (outs.empty())
    for (const auto& [id, v] : g.vals)
      if (v.kind == Kind::Float && !v.retired) outs.push_back(id);
  g.prog.outputs = outs;
  return normalize(g.prog);
}

}  // namespace

Program generate(uint64_t seed) {
  const auto gen_state = ag::generator_state();  // dropout's seeds move it
  Gen g(seed);
  const int target = int(g.irand(3, 30));
  int total = 0;
  for (const OpDef& d : table()) total += d.weight;
  g.any_leaf(g.rand_shape());
  for (int attempts = 0; g.ops_made < target && attempts < 60 * target; ++attempts) {
    int r = int(g.irand(0, total - 1));
    const OpDef* d = nullptr;
    for (const OpDef& e : table())
      if ((r -= e.weight) < 0) {
        d = &e;
        break;
      }
    d->gen(g);
  }
  ag::set_generator_state(gen_state.first, gen_state.second);
  return finish(g);
}

int op_count(const Program& p) {
  int n = 0;
  for (const Op& op : p.ops) n += op.name != "leaf";
  return n;
}

std::string to_text(const Program& p) {
  std::string s = "# ampgrad graph fuzz program, seed " + std::to_string(p.seed) + "\n";
  for (const Op& op : p.ops) s += op_line(op) + "\n";
  s += "out";
  for (int id : p.outputs) s += " " + vname(id);
  return s + "\n";
}

Program from_text(const std::string& text) {
  Program p;
  int line_no = 0;
  for (const std::string& line : split_str(text, '\n')) {
    ++line_no;
    auto fail = [&](const std::string& why) {
      throw std::runtime_error("graph fuzz program, line " + std::to_string(line_no) + ": " + why + ": " + line);
    };
    std::istringstream is(line);
    std::vector<std::string> tok;
    for (std::string t; is >> t;) tok.push_back(t);
    if (tok.empty()) continue;
    if (tok[0][0] == '#') {
      const auto at = line.find("seed ");
      if (at != std::string::npos) p.seed = std::stoull(line.substr(at + 5));
      continue;
    }
    if (tok[0] == "out") {
      for (size_t i = 1; i < tok.size(); ++i) {
        if (!is_ref(tok[i])) fail("expected a value name");
        p.outputs.push_back(std::stoi(tok[i].substr(1)));
      }
      continue;
    }
    Op op;
    size_t i = 0;
    for (; i < tok.size() && tok[i] != "="; ++i) {
      if (!is_ref(tok[i])) fail("expected a value name before '='");
      op.out.push_back(std::stoi(tok[i].substr(1)));
    }
    if (i + 1 >= tok.size() || op.out.empty()) fail("expected 'vN ... = op ...'");
    op.name = tok[i + 1];
    if (op.name != "leaf") def(op.name);  // throws for an unknown op
    for (i += 2; i < tok.size(); ++i) {
      const auto eq = tok[i].find('=');
      if (is_ref(tok[i])) op.in.push_back(std::stoi(tok[i].substr(1)));
      else if (eq != std::string::npos) op.attrs.emplace_back(tok[i].substr(0, eq), tok[i].substr(eq + 1));
      else fail("unexpected '" + tok[i] + "'");
    }
    p.ops.push_back(op);
  }
  return p;
}

std::vector<Tensor> make_leaves(const Program& p, ag::DType dtype) {
  TL leaves;
  for (const Op& op : p.ops)
    if (op.name == "leaf") leaves.push_back(leaf_tensor(op, dtype));
  return leaves;
}

std::vector<Tensor> run(const Program& p, const std::vector<Tensor>& leaves) { return run_impl(p, leaves, nullptr); }

Tensor output_gradient(int64_t k, const std::vector<int64_t>& shape, ag::DType dtype) {
  std::vector<double> w(size_t(numel_of(shape)));
  for (size_t i = 0; i < w.size(); ++i) {
    uint32_t h = uint32_t(i) * 2654435761u ^ uint32_t(k + 1) * 40503u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    w[i] = 0.5 + double(h) / 4294967296.0;
  }
  return ag::from_vector<double>(w, shape).to(dtype);
}

// ---- checks ------------------------------------------------------------------------------------

namespace {

using Fn = std::function<TL(const TL&, const Round&)>;

Tensor identity(const Tensor& t) { return t; }

// How a wider run imitates one in dt: every value (the leaves too) and every gradient that
// reaches a value is rounded to dt, to nearest or (random) moved by a random relative amount
// of up to dt's spacing, 2^-7 for bfloat16 and 2^-23 for float32: rounding to nearest can
// land next to the exact value by chance, and does not see an op's own rounding inside.
struct Imitation {
  ag::DType dt;
  bool random = false;
};

// t with its values changed so (in t's dtype).
Tensor imitate(const Tensor& t, const Imitation& im) {
  ag::NoGradGuard ng;
  if (!im.random) return t.to(im.dt).to(t.dtype());
  const double spacing = im.dt == ag::kBFloat16 ? 0x1p-7 : 0x1p-23;
  return ag::mul(t, ag::add(ag::mul(ag::rand(t.sizes().vec(), ag::TensorOptions(t.dtype())), 2 * spacing), 1 - spacing));
}

// The Round of an imitation, through autograd without the casts' nodes (which the run in dt
// uses): t + (imitate(t) - t), the difference detached, has t's gradient; a hook changes the
// gradient.
Round imitating(const Imitation& im) {
  return [im](const Tensor& t) {
    if (!ag::is_floating(t.dtype())) return t;
    Tensor shift;
    {
      ag::NoGradGuard ng;
      shift = ag::sub(imitate(t, im), t);
    }
    Tensor r = ag::add(t, shift);
    if (r.requires_grad()) r.register_hook([im](const Tensor& g) { return imitate(g, im); });
    return r;
  };
}

struct RunResult {
  TL grads;                 // per float leaf that requires grad, float64 (zeros when none came)
  std::vector<TL> branches;  // per kink op run: its branch signature
  bool noisy16 = false;      // an op's bfloat16 gradients would be rounding noise (OpDef::noisy16)
  bool near_kink = false;    // a kink op's guard fails on this run's own values
};

// Backward from every output that requires grad, output k weighted by output_gradient(k).
void backward_all(const TL& outs) {
  TL roots, grads;
  for (size_t k = 0; k < outs.size(); ++k)
    if (outs[k].requires_grad()) {
      roots.push_back(outs[k]);
      grads.push_back(output_gradient(int64_t(k), outs[k].sizes().vec(), ag::kFloat64));
    }
  if (!roots.empty()) ag::run_backward(roots, grads, false);
}

// f on leaves in `dtype` (autocast: float32 leaves under autocast to bfloat16), then
// backward; the leaves' gradients in float64. im: the run imitates a lower precision (f
// applies the Round it is given to every value it makes); its random draws are seeded.
RunResult forward_backward(const Fn& f, const TL& leaves64, ag::DType dtype, bool autocast,
                           std::optional<Imitation> im = std::nullopt) {
  const auto gen_state = ag::generator_state();
  ag::manual_seed(97);
  TL leaves;
  for (const Tensor& l : leaves64) {
    if (!ag::is_floating(l.dtype())) {
      leaves.push_back(l);
      continue;
    }
    Tensor t = l.detach().to(autocast ? ag::kFloat32 : dtype);
    t = (im ? imitate(t, *im) : t).clone();
    if (l.requires_grad()) t.requires_grad_(true);
    leaves.push_back(t);
  }
  TL outs;
  {
    std::optional<ag::AutocastGuard> guard;
    if (autocast) guard.emplace(ag::kCPU, ag::kBFloat16);
    outs = f(leaves, im ? imitating(*im) : Round(identity));
  }
  backward_all(outs);
  ag::set_generator_state(gen_state.first, gen_state.second);
  RunResult r;
  for (const Tensor& l : leaves)
    if (ag::is_floating(l.dtype()) && l.requires_grad())
      r.grads.push_back(l.grad().defined() ? l.grad().to(ag::kFloat64) : ag::zeros(l.sizes().vec(), ag::kFloat64));
  return r;
}

// How far the normwise tolerance of tol_for(dt) grows over `ops` ops: rounding errors of
// about the dtype's unit roundoff per op, adding up like the square root of their number.
double dtype_growth(int ops) { return 2 * std::sqrt(double(std::max(ops, 1))); }

// got against ref, the leaves' gradients of a run in dt and of one in a wider dtype:
// normwise per leaf, ||got - ref|| <= growth * (rtol ||ref|| + atol sqrt(n)) + kSensitivity
// max ||imitated - ref||, over the wider runs that imitate dt (Imitation): how far dt's
// precision moves the gradient (an ill-conditioned graph, where values cancel, moves it far).
// exact: the float64 gradients. A leaf whose gradient is 0 in float64 (a function constant
// in it, such as log_softmax over copies of one value, 1/x @ x in x, attention's keys when
// there is one) is left out: its gradient in dt is the rounding error of the terms that
// cancel, relative to their size, not to the gradient's.
// Not modelled: rounding inside an op that a large gradient from above magnifies where terms
// cancel (var and std of bfloat16 values take their mean in bfloat16 in backward, and the
// gradient of a bias that shifts all of them sums to 0 only up to that rounding). Long runs
// meet such programs rarely, at the bfloat16 stage; the shrunk form shows whether that is
// what happened.
constexpr double kSensitivity = 8;
::testing::AssertionResult compare_grads(const TL& ref, const std::vector<const TL*>& imitated, const TL& got, ag::DType dt,
                                         int ops, const TL* exact = nullptr) {
  for (const TL* q : imitated)
    if (q->size() != ref.size()) return ::testing::AssertionFailure() << "leaf counts differ";
  if (ref.size() != got.size()) return ::testing::AssertionFailure() << "leaf counts differ";
  const double rtol = agt::tol_for(dt).rtol * dtype_growth(ops), atol = agt::tol_for(dt).atol * dtype_growth(ops);
  for (size_t k = 0; k < ref.size(); ++k) {
    if (exact && max_abs(exact->at(k)) <= 1e-10) continue;
    const auto r = values(ref[k]), g = values(got[k]);
    double err = 0, norm = 0, moved = 0;
    for (const TL* imit : imitated) {
      const auto q = values(imit->at(k));
      double m = 0;
      for (size_t i = 0; i < r.size(); ++i) m += (q[i] - r[i]) * (q[i] - r[i]);
      moved = std::max(moved, std::sqrt(m));
      if (!std::isfinite(m)) moved = m;
    }
    for (size_t i = 0; i < r.size(); ++i) {
      if (!std::isfinite(g[i]) && std::isfinite(r[i]))
        return ::testing::AssertionFailure() << ag::dtype_name(dt) << " gradient of leaf " << k
                                             << " (counting those that require grad), element " << i << ": " << g[i]
                                             << ", reference " << r[i];
      err += (g[i] - r[i]) * (g[i] - r[i]);
      norm += r[i] * r[i];
    }
    err = std::sqrt(err);
    norm = std::sqrt(norm);
    if (!std::isfinite(moved)) continue;  // imitating dt leaves an op's domain: not comparable
    const double tol = rtol * norm + atol * std::sqrt(double(r.size())) + kSensitivity * moved;
    if (!(err <= tol)) {
      size_t worst = 0;
      for (size_t i = 0; i < r.size(); ++i)
        if (std::fabs(g[i] - r[i]) > std::fabs(g[worst] - r[worst])) worst = i;
      return ::testing::AssertionFailure()
             << ag::dtype_name(dt) << " gradient of leaf " << k << " (counting those that require grad) is off by " << err
             << " (norm), more than " << tol << " (rtol " << rtol << " of the reference's norm " << norm << ", atol " << atol
             << ", imitating " << ag::dtype_name(dt) << "'s rounding moves it by " << moved
             << "); worst element " << worst << ": " << g[worst] << " vs " << r[worst];
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<TL> branches_of(const Program& p, const std::vector<TraceEntry>& trace) {
  ag::NoGradGuard ng;
  std::vector<TL> s;
  for (const TraceEntry& e : trace)
    if (def(p.ops[e.op].name).sig) s.push_back(def(p.ops[e.op].name).sig(e.in, e.out, p.ops[e.op]));
  return s;
}

bool same_branches(const std::vector<TL>& a, const std::vector<TL>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size()) return false;
    for (size_t j = 0; j < a[i].size(); ++j)
      if (a[i][j].sizes() != b[i][j].sizes() || values(a[i][j]) != values(b[i][j])) return false;
  }
  return true;
}

// A program's run with its kinks' branches.
RunResult traced_run(const Program& p, ag::DType dtype, bool autocast, std::optional<Imitation> im = std::nullopt) {
  std::vector<TraceEntry> trace;
  RunResult r = forward_backward([&](const TL& in, const Round& rd) { return run_impl(p, in, &trace, nullptr, rd); },
                                 make_leaves(p, ag::kFloat64), dtype, autocast, im);
  r.branches = branches_of(p, trace);
  ag::NoGradGuard ng;
  for (const TraceEntry& e : trace) {
    const OpDef& d = def(p.ops[e.op].name);
    if (d.noisy16 && d.noisy16(e.in, e.out, p.ops[e.op])) r.noisy16 = true;
    // Rounding moved a kink op's inputs within the margin (checked in float64): its own
    // rounding inside may then take the other branch, which the signature cannot see.
    if (d.sig && d.guard && !d.guard(e.in, e.out, p.ops[e.op])) r.near_kink = true;
  }
  return r;
}

}  // namespace

::testing::AssertionResult compare_dtypes(const Fn& f, const std::vector<Tensor>& ref, ag::DType dt, bool autocast, int ops) {
  const ag::DType wide = autocast ? ag::kFloat32 : ag::kFloat64;
  const RunResult a = forward_backward(f, ref, wide, false);
  const RunResult r = forward_backward(f, ref, wide, false, Imitation{dt});
  const RunResult q = forward_backward(f, ref, wide, false, Imitation{dt, true});
  const RunResult b = forward_backward(f, ref, dt, autocast);
  const RunResult e = forward_backward(f, ref, ag::kFloat64, false);
  return compare_grads(a.grads, {&r.grads, &q.grads}, b.grads, dt, ops, &e.grads);
}

bool bfloat16_available() {
  return ag::hw::verdict(ag::hw::query(), ag::Device(ag::kCPU), ag::kBFloat16).support != ag::hw::Support::Unsupported;
}

Outcome check(const Program& p, const CheckOptions& opts) {
  Outcome oc;
  auto fail = [&](const std::string& stage, const std::string& msg) {
    oc.ok = false;
    oc.stage = stage;
    oc.message = msg;
    return oc;
  };
  const int ops = op_count(p);
  RunResult r64;
  {
    // Whether the forward pass alone throws, then the backward pass.
    TL leaves = make_leaves(p, ag::kFloat64);
    TL outs;
    try {
      outs = run(p, leaves);
    } catch (const std::exception& e) {
      return fail("forward", e.what());
    }
    try {
      r64 = traced_run(p, ag::kFloat64, false);
    } catch (const std::exception& e) {
      return fail("backward", e.what());
    }
  }
  {
    TL leaves = make_leaves(p, ag::kFloat64);
    ::testing::AssertionResult fd = ::testing::AssertionSuccess();
    try {
      fd = agt::gradcheck_outputs([&](const TL& in) { return run(p, in); }, leaves);
    } catch (const std::exception& e) {
      return fail("backward", e.what());
    }
    if (!fd) return fail("float64", std::string("finite differences: ") + fd.message());
  }
  RunResult r32;
  if (opts.float32 || opts.bfloat16) {
    RunResult r64r, r64q;
    try {
      r32 = traced_run(p, ag::kFloat32, false);
      if (opts.float32) {
        r64r = traced_run(p, ag::kFloat64, false, Imitation{ag::kFloat32});
        r64q = traced_run(p, ag::kFloat64, false, Imitation{ag::kFloat32, true});
      }
    } catch (const std::exception& e) {
      return fail("float32", std::string("threw: ") + e.what());
    }
    if (opts.float32) {
      if (r32.near_kink || r64r.near_kink || r64q.near_kink || !same_branches(r64.branches, r32.branches) ||
          !same_branches(r64.branches, r64r.branches) || !same_branches(r64.branches, r64q.branches)) {
        ++oc.skipped_float32;
      } else if (auto c = compare_grads(r64.grads, {&r64r.grads, &r64q.grads}, r32.grads, ag::kFloat32, ops, &r64.grads);
                 !c) {
        return fail("float32", c.message());
      }
    }
  }
  if (opts.bfloat16) {
    RunResult r16, r32r, r32q;
    try {
      r16 = traced_run(p, ag::kBFloat16, true);
      r32r = traced_run(p, ag::kFloat32, false, Imitation{ag::kBFloat16});
      r32q = traced_run(p, ag::kFloat32, false, Imitation{ag::kBFloat16, true});
    } catch (const std::exception& e) {
      return fail("bfloat16", std::string("threw: ") + e.what());
    }
    if (r32.noisy16 || r16.near_kink || r32r.near_kink || r32q.near_kink || !same_branches(r32.branches, r16.branches) ||
        !same_branches(r64.branches, r32.branches) || !same_branches(r32.branches, r32r.branches) ||
        !same_branches(r32.branches, r32q.branches)) {
      ++oc.skipped_bfloat16;
    } else if (auto c = compare_grads(r32.grads, {&r32r.grads, &r32q.grads}, r16.grads, ag::kBFloat16, ops, &r64.grads);
               !c) {
      return fail("bfloat16", c.message());
    }
  }
  return oc;
}

// ---- validity, shrinking, reports ------------------------------------------------------------------

namespace {

enum class Validity { Valid, Invalid, ForwardThrows };

// Whether p obeys the generator's rules (so that a shrunk program still means what its
// failure says): values defined once before use; an in-place op's target is a result of a
// `fresh` op that no other op reads (nor the outputs), not a leaf; every op's outputs
// finite and in range and its guard holding in float64.
Validity validate(const Program& p) {
  std::map<int, size_t> defined_at, uses;
  for (size_t k = 0; k < p.ops.size(); ++k) {
    for (int id : p.ops[k].in) {
      if (!defined_at.count(id)) return Validity::Invalid;
      ++uses[id];
    }
    for (int id : p.ops[k].out) {
      if (defined_at.count(id)) return Validity::Invalid;
      defined_at[id] = k;
    }
  }
  if (p.outputs.empty()) return Validity::Invalid;
  for (int id : p.outputs) {
    if (!defined_at.count(id)) return Validity::Invalid;
    ++uses[id];
  }
  for (const Op& op : p.ops) {
    if (op.name == "leaf" && op.attr("kind") == "float")
      for (double x : op.dv("data"))
        if (!std::isfinite(x)) return Validity::Invalid;
    if (op.name == "leaf" || !def(op.name).inplace) continue;
    const int target = op.in.at(0);
    const Op& producer = p.ops[defined_at.at(target)];
    if (producer.name == "leaf" || !def(producer.name).fresh || uses[target] != 1) return Validity::Invalid;
    for (size_t i = 1; i < op.in.size(); ++i)
      if (op.in[i] == target) return Validity::Invalid;
  }
  std::map<int, Tensor> env;
  const TL leaves = make_leaves(p, ag::kFloat64);
  size_t li = 0;
  std::optional<std::pair<uint64_t, uint64_t>> gen_state;
  if (has_random(p)) gen_state = ag::generator_state();
  Validity v = Validity::Valid;
  for (const Op& op : p.ops) {
    if (op.name == "leaf") {
      env[op.out[0]] = leaves.at(li++);
      continue;
    }
    const OpDef& d = def(op.name);
    TL in;
    for (int id : op.in) in.push_back(env.at(id));
    if (d.inplace) in[0] = in[0].clone();
    TL in64, out64;
    for (const Tensor& t : in) in64.push_back(d.inplace ? t.detach().clone() : t.detach());
    TL out;
    try {
      out = d.run(in, op);
    } catch (const std::exception&) {
      v = Validity::ForwardThrows;
      break;
    }
    if (out.size() != op.out.size()) {
      v = Validity::Invalid;
      break;
    }
    ag::NoGradGuard ng;
    for (const Tensor& t : out) {
      if (kind_of(t) == Kind::Float && !all_finite(t)) v = Validity::Invalid;
      out64.push_back(t.detach());
    }
    if (v == Validity::Valid && d.guard && !d.guard(in64, out64, op)) v = Validity::Invalid;
    if (v != Validity::Valid) break;
    for (size_t i = 0; i < out.size(); ++i) env[op.out[i]] = out[i];
  }
  if (gen_state) ag::set_generator_state(gen_state->first, gen_state->second);
  if (v == Validity::Valid)
    for (int id : p.outputs)
      if (kind_of(env.at(id)) != Kind::Float) return Validity::Invalid;
  return v;
}

// A leaf op holding t's values.
Op leaf_of(const Tensor& t, int id, bool grad) {
  Op op{"leaf", {}, {id}, {}};
  const Kind k = kind_of(t);
  op.set("kind", k == Kind::Float ? "float" : k == Kind::Int ? "int" : "bool");
  set_iv(op, "shape", t.sizes().vec());
  if (k == Kind::Float) {
    set_i(op, "grad", grad);
    op.set("data", list_fmt(values(t)));
  } else {
    std::vector<int64_t> d;
    for (double v : values(t)) d.push_back(int64_t(v));
    set_iv(op, "data", d);
  }
  return op;
}

std::map<int, Tensor> values_of(const Program& p) {
  ag::NoGradGuard ng;
  std::map<int, Tensor> env;
  run_impl(p, make_leaves(p, ag::kFloat64), nullptr, &env);
  return env;
}

}  // namespace

Program shrink(const Program& p0, const std::function<bool(const Program&)>& fails) {
  Program best = normalize(p0);
  std::string best_text = to_text(best);
  auto accept = [&](const Program& cand) {
    const Program q = normalize(cand);
    const std::string text = to_text(q);
    if (text == best_text || q.outputs.empty() || !fails(q)) return false;
    best = q;
    best_text = text;
    return true;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t i = 0; best.outputs.size() > 1 && i < best.outputs.size(); ++i) {
      Program q = best;
      q.outputs.erase(q.outputs.begin() + long(i));
      if (accept(q)) {
        progress = true;
        --i;
      }
    }
    // An output moves up to a float input of the op that made it.
    for (size_t i = 0; i < best.outputs.size(); ++i) {
      const std::map<int, Tensor> env = values_of(best);
      const int id = best.outputs[i];
      for (const Op& op : best.ops) {
        if (std::find(op.out.begin(), op.out.end(), id) == op.out.end()) continue;
        for (int src : op.in) {
          if (kind_of(env.at(src)) != Kind::Float) continue;
          Program q = best;
          q.outputs[i] = src;
          if (accept(q)) {
            progress = true;
            break;
          }
        }
        break;
      }
    }
    // Ops from the last: bypassed by an input of the same shape and kind, or replaced by
    // leaves holding what they computed (so the ops after them see the same values).
    for (size_t k = best.ops.size(); k-- > 0;) {
      if (k >= best.ops.size() || best.ops[k].name == "leaf") continue;
      const std::map<int, Tensor> env = values_of(best);
      const Op op = best.ops[k];
      bool done = false;
      if (op.out.size() == 1) {
        for (int src : op.in) {
          const Tensor& a = env.at(src);
          const Tensor& b = env.at(op.out[0]);
          if (done || a.sizes() != b.sizes() || kind_of(a) != kind_of(b)) continue;
          Program q = best;
          q.ops.erase(q.ops.begin() + long(k));
          for (Op& o : q.ops)
            for (int& id : o.in)
              if (id == op.out[0]) id = src;
          for (int& id : q.outputs)
            if (id == op.out[0]) id = src;
          done = accept(q);
        }
      }
      for (bool grad : {true, false}) {
        if (done) break;
        Program q = best;
        q.ops.erase(q.ops.begin() + long(k));
        std::vector<Op> leaves;
        for (int id : op.out) leaves.push_back(leaf_of(env.at(id), id, grad));
        q.ops.insert(q.ops.begin() + long(k), leaves.begin(), leaves.end());
        done = accept(q);
      }
      progress = progress || done;
    }
    // Leaves: grad off, data rounded to three decimals.
    for (size_t k = 0; k < best.ops.size(); ++k) {
      if (best.ops[k].name != "leaf" || best.ops[k].attr("kind") != "float") continue;
      if (best.ops[k].i("grad")) {
        Program q = best;
        set_i(q.ops[k], "grad", 0);
        progress = accept(q) || progress;
      }
      std::vector<double> d = best.ops[k].dv("data");
      for (double& v : d) v = std::round(v * 1000) / 1000;
      if (list_fmt(d) != best.ops[k].attr("data")) {
        Program q = best;
        q.ops[k].set("data", list_fmt(d));
        progress = accept(q) || progress;
      }
    }
  }
  return best;
}

std::string to_cpp(const Program& p, const std::string& test_name, const std::string& stage) {
  std::ostringstream os;
  os << "// Found by the graph fuzzer (seed " << p.seed << "); needs \"support/testing.h\" and \"autograd/graph_fuzz.h\".\n";
  os << "TEST(GraphFuzzRepro, " << test_name << ") {\n";
  os << "  const std::vector<ag::Tensor> leaves = {\n";
  Strs leaf_names;
  for (const Op& op : p.ops) {
    if (op.name != "leaf") continue;
    leaf_names.push_back(vname(op.out[0]));
    const std::string& kind = op.attr("kind");
    std::string data;
    if (kind == "float") {
      Strs d;
      for (double v : op.dv("data")) d.push_back(cd(v));
      data = "ag::from_vector<double>({" + join(d, ", ") + "}, " + cl(op.iv("shape")) + ")" + (op.i("grad") ? ".requires_grad_()" : "");
    } else if (kind == "int") {
      data = "ag::from_vector<int64_t>(" + cl(op.iv("data")) + ", " + cl(op.iv("shape")) + ")";
    } else {
      Strs d;
      for (int64_t v : op.iv("data")) d.push_back(v ? "true" : "false");
      data = "ag::from_vector<bool>({" + join(d, ", ") + "}, " + cl(op.iv("shape")) + ")";
    }
    os << "      " << data << ",  // " << vname(op.out[0]) << "\n";
  }
  os << "  };\n";
  // The dtype checks measure how far rounding every value moves the gradient: there the
  // lambda applies the rounding it is given (compare_dtypes) to each value it makes.
  const bool rounds = stage == "float32" || stage == "bfloat16";
  if (rounds)
    os << "  auto f = [](const std::vector<ag::Tensor>& in, const agt::graph_fuzz::Round& r) -> std::vector<ag::Tensor> {\n";
  else
    os << "  auto f = [](const std::vector<ag::Tensor>& in) -> std::vector<ag::Tensor> {\n";
  for (size_t i = 0; i < leaf_names.size(); ++i) os << "    const ag::Tensor& " << leaf_names[i] << " = in[" << i << "];\n";
  for (const Op& op : p.ops) {
    if (op.name == "leaf") continue;
    Strs in, out;
    for (int id : op.in) in.push_back(vname(id));
    for (int id : op.out) out.push_back(vname(id));
    std::string stmt = def(op.name).cpp(in, out, op);
    if (rounds) {
      const std::string head = "ag::Tensor " + out[0] + " = ";
      if (out.size() == 1 && stmt.find('\n') == std::string::npos && stmt.rfind(head, 0) == 0)
        stmt = head + "r(" + stmt.substr(head.size(), stmt.size() - head.size() - 1) + ");";
      else
        for (const std::string& o : out) stmt += "\n" + o + " = r(" + o + ");";
    }
    size_t at = 0;
    while ((at = stmt.find('\n', at)) != std::string::npos) stmt.replace(at, 1, "\n    "), at += 5;
    os << "    " << stmt << "\n";
  }
  Strs outs;
  for (int id : p.outputs) outs.push_back(vname(id));
  os << "    return {" << join(outs, ", ") << "};\n";
  os << "  };\n";
  if (stage == "float32" || stage == "bfloat16")
    os << "  EXPECT_TRUE(agt::graph_fuzz::compare_dtypes(f, leaves, " << (stage == "float32" ? "ag::kFloat32, false" : "ag::kBFloat16, true")
       << ", " << op_count(p) << "));\n";
  else
    os << "  EXPECT_TRUE(agt::gradcheck_outputs(f, leaves));\n";
  os << "}\n";
  return os.str();
}

std::string check_and_report(const Program& p, const CheckOptions& opts, Outcome* outcome) {
  const Outcome oc = check(p, opts);
  if (outcome) *outcome = oc;
  if (oc.ok) return "";
  const std::string stage = oc.stage;
  const Program s = shrink(p, [&](const Program& q) {
    const Validity v = validate(q);
    if (v == Validity::Invalid) return false;
    if (v == Validity::ForwardThrows) return stage == "forward";
    const Outcome o = check(q, opts);
    return !o.ok && o.stage == stage;
  });
  const Outcome so = check(s, opts);
  std::ostringstream os;
  os << "graph fuzz: seed " << p.seed << " (" << op_count(p) << " ops) fails at " << stage << ": " << oc.message << "\n";
  os << "shrunk to " << op_count(s) << " ops, which fail with: " << so.message << "\n";
  os << "---- program (ampgrad_graph_fuzz --replay FILE) ----\n" << to_text(s);
  os << "---- as a test ----\n" << to_cpp(s, "Seed" + std::to_string(p.seed), stage);
  return os.str();
}

}  // namespace agt::graph_fuzz
