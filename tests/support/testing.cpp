#include "support/testing.h"

#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

#include "ampgrad/reference/softmax.h"

namespace agt {

bool in_ci() {
  const char* ci = std::getenv("CI");
  return ci && std::string(ci) == "true";
}

Tol tol_for(ag::DType dt) {
  switch (dt) {
    case ag::kBFloat16: return {1.0 / 128, 1e-2};
    case ag::kFloat16: return {1.0 / 1024, 1e-3};
    case ag::kFloat64: return {1e-10, 1e-12};
    default: return {1e-5, 1e-6};
  }
}

::testing::AssertionResult same_bits(const ag::Tensor& a, const ag::Tensor& b) {
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes())
    return ::testing::AssertionFailure() << ag::dtype_name(a.dtype()) << " " << a.sizes() << " vs "
                                         << ag::dtype_name(b.dtype()) << " " << b.sizes();
  const ag::Tensor ca = a.contiguous(), cb = b.contiguous();
  if (std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) != 0) return ::testing::AssertionFailure() << "bits differ";
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult allclose(const ag::Tensor& got, const ag::Tensor& ref, double rtol,
                                    double atol) {
  if (got.sizes() != ref.sizes())
    return ::testing::AssertionFailure() << "shape " << got.sizes() << " vs reference " << ref.sizes();
  const auto g = got.detach().to_vector<double>();
  const auto r = ref.detach().to_vector<double>();
  double worst = 0;
  size_t wi = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(r[i]) || std::isnan(g[i])) {
      if (std::isnan(r[i]) != std::isnan(g[i]))
        return ::testing::AssertionFailure() << "element " << i << ": " << g[i] << " vs " << r[i];
      continue;
    }
    if (std::isinf(r[i]) || std::isinf(g[i])) {
      if (g[i] != r[i])
        return ::testing::AssertionFailure() << "element " << i << ": " << g[i] << " vs " << r[i];
      continue;
    }
    const double excess = std::fabs(g[i] - r[i]) - (atol + rtol * std::fabs(r[i]));
    if (excess > worst) {
      worst = excess;
      wi = i;
    }
  }
  if (worst > 0)
    return ::testing::AssertionFailure() << "element " << wi << ": got " << g[wi] << ", reference "
                                         << r[wi] << " (rtol " << rtol << ", atol " << atol << ")";
  return ::testing::AssertionSuccess();
}

namespace {

// Pointer to element `linear` (row-major over sizes) of a float64 tensor of any strides.
double* element(const ag::Tensor& t, int64_t linear) {
  int64_t off = 0;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    const int64_t s = t.sizes()[size_t(d)];
    off += (linear % s) * t.strides()[size_t(d)];
    linear /= s;
  }
  return static_cast<double*>(t.raw_data()) + off;
}

double weighted_sum(const std::vector<ag::Tensor>& outs, const std::vector<ag::Tensor>& ws) {
  double s = 0;
  for (size_t k = 0; k < outs.size(); ++k) {
    const auto o = outs[k].detach().to_vector<double>();
    const auto w = ws[k].to_vector<double>();
    for (size_t i = 0; i < o.size(); ++i) s += o[i] * w[i];
  }
  return s;
}

// The one finite-difference loop of gradcheck and gradcheck_outputs; missing_is_zero: an
// input that gets no gradient counts as a zero gradient instead of failing.
::testing::AssertionResult gradcheck_impl(
    const std::function<std::vector<ag::Tensor>(const std::vector<ag::Tensor>&)>& f,
    const std::vector<ag::Tensor>& inputs, double eps, double atol, double rtol, bool missing_is_zero) {
  for (const auto& in : inputs)
    if (in.defined() && in.requires_grad() && in.dtype() != ag::kFloat64)
      return ::testing::AssertionFailure() << "gradcheck wants float64 inputs";
  for (const auto& in : inputs)
    if (in.defined() && in.requires_grad()) in.set_grad(ag::Tensor());
  const std::vector<ag::Tensor> outs = f(inputs);
  std::vector<ag::Tensor> ws, roots, root_grads;
  for (const ag::Tensor& out : outs) {
    ws.push_back(ag::rand(out.sizes().vec(), ag::kFloat64) + 0.5);
    if (out.requires_grad()) {
      roots.push_back(out);
      root_grads.push_back(ws.back());
    }
  }
  if (!roots.empty()) ag::run_backward(roots, root_grads, false);
  for (size_t k = 0; k < inputs.size(); ++k) {
    const ag::Tensor& in = inputs[k];
    if (!in.defined() || !in.requires_grad()) continue;
    ag::Tensor analytic = in.grad();
    if (!analytic.defined()) {
      if (!missing_is_zero) return ::testing::AssertionFailure() << "input " << k << " received no gradient";
      analytic = ag::zeros(in.sizes().vec(), ag::kFloat64);
    }
    if (analytic.sizes() != in.sizes())
      return ::testing::AssertionFailure() << "input " << k << ": gradient shape " << analytic.sizes()
                                           << " vs input shape " << in.sizes();
    const auto a = analytic.to_vector<double>();
    for (int64_t i = 0; i < in.numel(); ++i) {
      double* p = element(in, i);
      const double orig = *p;
      double plus, minus;
      {
        ag::NoGradGuard ng;
        *p = orig + eps;
        plus = weighted_sum(f(inputs), ws);
        *p = orig - eps;
        minus = weighted_sum(f(inputs), ws);
        *p = orig;
      }
      const double numeric = (plus - minus) / (2 * eps);
      // Written so that a NaN on either side fails (every comparison with NaN is false).
      if (!(std::fabs(numeric - a[size_t(i)]) <= atol + rtol * std::fabs(numeric)))
        return ::testing::AssertionFailure()
               << "input " << k << " element " << i << ": analytic " << a[size_t(i)]
               << " vs numeric " << numeric;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace

::testing::AssertionResult gradcheck(
    const std::function<ag::Tensor(const std::vector<ag::Tensor>&)>& f,
    const std::vector<ag::Tensor>& inputs, double eps, double atol, double rtol) {
  return gradcheck_impl([&](const std::vector<ag::Tensor>& in) { return std::vector<ag::Tensor>{f(in)}; },
                        inputs, eps, atol, rtol, false);
}

::testing::AssertionResult gradcheck_outputs(
    const std::function<std::vector<ag::Tensor>(const std::vector<ag::Tensor>&)>& f,
    const std::vector<ag::Tensor>& inputs, double eps, double atol, double rtol) {
  return gradcheck_impl(f, inputs, eps, atol, rtol, true);
}

ag::Tensor non_contiguous(const ag::Tensor& t) {
  const int64_t n = t.dim();
  ag::Tensor c = t.detach().transpose(0, n - 1).contiguous().transpose(0, n - 1);
  if (t.requires_grad()) c.requires_grad_(true);
  return c;
}

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  path_ = std::filesystem::path(::testing::TempDir()) /
          ("ampgrad_" + std::string(info ? info->name() : "test") + "_" + std::to_string(::getpid()) + "_" +
           std::to_string(counter++));
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::file(const std::string& name) const { return (path_ / name).string(); }

std::vector<std::string> TempDir::listing() const {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(path_)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

void write_bytes(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string error_in_child(const std::function<void()>& f, int seconds, bool unprivileged) {
  int fds[2];
  if (::pipe(fds) != 0) return "<pipe failed>";
  const pid_t pid = ::fork();
  if (pid < 0) return "<fork failed>";
  if (pid == 0) {
    ::close(fds[0]);
    std::string msg;
    if (unprivileged && ::geteuid() == 0 && (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0))
      msg = "<cannot drop root>";
    else
      msg = error_of(f);
    size_t off = 0;
    while (off < msg.size()) {
      const ssize_t w = ::write(fds[1], msg.data() + off, msg.size() - off);
      if (w <= 0) break;
      off += size_t(w);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, int(left.count())) <= 0) continue;
    char buf[4096];
    const ssize_t r = ::read(fds[0], buf, sizeof buf);
    if (r <= 0) break;  // the child closed its end: done
    out.append(buf, size_t(r));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (timed_out) return "<timed out>";
  if (!WIFEXITED(status)) return "<crashed>";
  return out;
}

std::string source_dir() { return AMPGRAD_SOURCE_DIR; }

namespace {
// A level's place in ag::hw::kernel_isas() (narrowest first).
ptrdiff_t isa_rank(const std::string& name) {
  const std::vector<std::string> all = ag::hw::kernel_isas();
  return std::find(all.begin(), all.end(), name) - all.begin();
}
}  // namespace

bool kernel_isa_at_least(const std::string& name) { return isa_rank(ag::hw::kernel_isa()) >= isa_rank(name); }

void EachKernelIsa::SetUp() {
  before_ = ag::hw::kernel_isa();
  // A level this CPU runs must be accepted (a refusal fails the test); a wider one is a skip
  // whose reason is the library's refusal, which names what the CPU lacks.
  if (isa_rank(GetParam()) > isa_rank(ag::hw::best_kernel_isa()))
    AGT_SKIP_HARDWARE() << error_of([&] { ag::hw::set_kernel_isa(GetParam()); });
  ag::hw::set_kernel_isa(GetParam());
}

void EachKernelIsa::TearDown() {
  if (!before_.empty()) ag::hw::set_kernel_isa(before_);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ag::Error& e) {
    return e.what();
  }
  return "<no error>";
}

std::vector<std::string> host_syncs_of(const std::function<void()>& f) {
  std::vector<std::string> what;
  ag::set_host_sync_observer([&](const char* w) { what.emplace_back(w); });
  const uint64_t before = ag::host_sync_count();
  f();
  const uint64_t n = ag::host_sync_count() - before;
  ag::set_host_sync_observer({});
  EXPECT_EQ(n, what.size()) << "the observer missed host syncs";
  return what;
}

ag::Tensor rand64(const std::vector<int64_t>& shape, double lo, double hi, bool requires_grad) {
  ag::Tensor t = ag::rand(shape, ag::kFloat64) * (hi - lo) + lo;
  t = t.detach();
  if (requires_grad) t.requires_grad_(true);
  return t;
}

ag::Tensor randf(const std::vector<int64_t>& shape, ag::DType dt) { return ag::rand(shape, dt) * 2.0 - 1.0; }

ag::Tensor ref_linear(const ag::Tensor& x, const ag::Tensor& w, const ag::Tensor& b,
                      const std::function<double(double)>& act) {
  const int64_t K = w.size(1), N = w.size(0), M = x.numel() / std::max<int64_t>(K, 1);
  const auto xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const auto bv = b.defined() ? b.to_vector<double>() : std::vector<double>(size_t(N), 0.0);
  std::vector<double> out(size_t(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = bv[size_t(n)];
      for (int64_t k = 0; k < K; ++k) s += xv[size_t(m * K + k)] * wv[size_t(n * K + k)];
      out[size_t(m * N + n)] = act ? act(s) : s;
    }
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = N;
  return ag::from_vector(out, shape);
}

double ref_gelu(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double ref_gelu_tanh(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

Lines lines_along(const ag::Tensor& x, int64_t dim) {
  const int64_t nd = x.dim();
  if (nd == 0) return {1, 1, 1};
  dim = (dim + nd) % nd;
  Lines l{1, x.size(dim), 1};
  for (int64_t d = 0; d < dim; ++d) l.outer *= x.size(d);
  for (int64_t d = dim + 1; d < nd; ++d) l.inner *= x.size(d);
  return l;
}

ag::Tensor ref_softmax(const ag::Tensor& x, int64_t dim, bool log) {
  const auto v = x.to_vector<double>();
  const Lines l = lines_along(x, dim);
  const auto y = log ? ampgrad::reference::log_softmax(v, l.outer, l.n, l.inner)
                     : ampgrad::reference::softmax(v, l.outer, l.n, l.inner);
  return ag::from_vector<double>(y, x.sizes().vec());
}

double chi_square(const std::vector<double>& observed, const std::vector<double>& expected) {
  EXPECT_EQ(observed.size(), expected.size());
  double q = 0;
  for (size_t i = 0; i < observed.size() && i < expected.size(); ++i)
    q += (observed[i] - expected[i]) * (observed[i] - expected[i]) / expected[i];
  return q;
}

namespace {
// P(X > x) for X chi-square with df degrees of freedom, from the closed forms for integer
// df: e^-h sum_{k<m} h^k / k! for df = 2m, and erfc(sqrt h) + e^-h sum_{k=1..m} h^(k-1/2) /
// Gamma(k + 1/2) for df = 2m + 1, with h = x / 2.
double chi_square_upper_tail(double x, int df) {
  const double h = x / 2;
  double sum = 0, term;
  if (df % 2 == 0) {
    term = 1;
    for (int k = 0; k < df / 2; ++k) {
      if (k > 0) term *= h / k;
      sum += term;
    }
    return std::exp(-h) * sum;
  }
  term = std::sqrt(h) / std::tgamma(1.5);
  for (int k = 1; k <= (df - 1) / 2; ++k) {
    if (k > 1) term *= h / (k - 0.5);
    sum += term;
  }
  return std::erfc(std::sqrt(h)) + std::exp(-h) * sum;
}
}  // namespace

double chi_square_critical(int df, double alpha) {
  EXPECT_TRUE(df >= 1 && alpha > 0 && alpha < 1) << "df " << df << ", alpha " << alpha;
  double lo = 0, hi = 100.0 + 20.0 * df;  // the tail at hi is far below any alpha used
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    (chi_square_upper_tail(mid, df) > alpha ? lo : hi) = mid;
  }
  return lo;
}

std::shared_ptr<ag::data::TensorDataset> numbered(int64_t n) {
  std::vector<float> in;
  std::vector<int64_t> tg;
  for (int64_t i = 0; i < n; ++i) {
    in.push_back(float(i));
    in.push_back(-float(i));
    tg.push_back(i);
  }
  return std::make_shared<ag::data::TensorDataset>(ag::from_vector<float>(in, {n, 2}),
                                                   ag::from_vector<int64_t>(tg, {n}));
}

std::vector<std::vector<int64_t>> epoch(const ag::data::DataLoader& loader) {
  std::vector<std::vector<int64_t>> out;
  for (const ag::data::Batch& b : loader) {
    auto ids = b.target.to_vector<int64_t>();
    auto in = b.input.to_vector<double>();
    EXPECT_EQ(b.input.sizes(), (std::vector<int64_t>{int64_t(ids.size()), 2}));
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(in[2 * i], double(ids[i]));
      EXPECT_EQ(in[2 * i + 1], -double(ids[i]));
    }
    out.push_back(ids);
  }
  return out;
}

std::vector<int64_t> flat(const std::vector<std::vector<int64_t>>& batches) {
  std::vector<int64_t> out;
  for (auto& b : batches) out.insert(out.end(), b.begin(), b.end());
  return out;
}

double tf32(double x) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = 0;
  const double m = std::frexp(x, &e);  // [0.5, 1)
  return std::ldexp(std::round(std::ldexp(m, 11)), e - 11);
}

Tol fp32_tol(int64_t K) { return {1e-5, 4e-6 * std::sqrt(double(std::max<int64_t>(K, 1)))}; }

}  // namespace agt
