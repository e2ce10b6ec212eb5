// The rule of precision "auto:measure" (precision_trial.h): a pure function over a trial's
// measurements, and the table that shows them.
#include "ampgrad/wrappers/precision_trial.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "ampgrad/error.h"
#include "ampgrad/factories.h"
#include "ampgrad/matmul_precision.h"
#include "ampgrad/memory.h"
#include "ampgrad/ops/elementwise.h"
#include "ampgrad/ops/reduce.h"
#include "ampgrad/stream.h"

namespace ampgrad {

namespace {

bool is_baseline(const TrialRow& r) {
  return r.measured && r.candidate.precision == Precision::True32 && !r.candidate.medium_matmul;
}

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string percent(double v) { return std::isfinite(v) ? fixed(100 * v, 2) + "%" : "-"; }

// Why `r` is outside the tolerances, or empty when it is within them.
std::string rejection(const TrialRow& r, const TrialTolerances& t) {
  if (!std::isfinite(r.final_loss)) return "its loss is not finite";
  if (!std::isfinite(r.median_step_seconds) || r.median_step_seconds <= 0) return "no step time was measured";
  if (!std::isfinite(r.min_grad_cosine) || !std::isfinite(r.max_grad_rel_error))
    return "its first step's gradients are not finite (the grad scaler skips such a step)";
  if (!(r.loss_rel_diff <= t.loss_rel))
    return "its loss is " + percent(r.loss_rel_diff) + " off 32-true's (tolerance " + percent(t.loss_rel) + ")";
  if (!(r.min_grad_cosine >= t.grad_cosine))
    return "a gradient's cosine similarity to 32-true's is " + fixed(r.min_grad_cosine, 4) + " (tolerance " +
           fixed(t.grad_cosine, 4) + ")";
  if (!(r.max_grad_rel_error <= t.grad_rel_error))
    return "a gradient's relative error against 32-true's is " + percent(r.max_grad_rel_error) + " (tolerance " +
           percent(t.grad_rel_error) + ")";
  if (r.steps > 0 && double(r.skipped_steps) / double(r.steps) > t.skipped_fraction)
    return "the grad scaler skipped " + std::to_string(r.skipped_steps) + " of " + std::to_string(r.steps) +
           " steps (tolerance " + percent(t.skipped_fraction) + ")";
  return "";
}

}  // namespace

std::string TrialCandidate::name() const {
  return std::string(precision_name(precision)) + (medium_matmul ? "+medium" : "");
}

TrialDecision choose_from_trial(const std::vector<TrialRow>& rows, const TrialTolerances& tolerances) {
  size_t base = rows.size();
  for (size_t i = 0; i < rows.size() && base == rows.size(); ++i)
    if (is_baseline(rows[i])) base = i;
  AG_CHECK(base < rows.size(), "precision trial",
           "the trial has no measured 32-true row to compare the candidates with (", rows.size(), " rows)");

  TrialDecision d;
  d.chosen = base;
  d.rejected.assign(rows.size(), "");
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!rows[i].measured || i == base) continue;
    d.rejected[i] = rejection(rows[i], tolerances);
    if (!d.rejected[i].empty()) continue;
    if (rows[i].median_step_seconds < rows[d.chosen].median_step_seconds) d.chosen = i;
  }

  const TrialRow& c = rows[d.chosen];
  const TrialRow& b = rows[base];
  std::ostringstream why;
  if (d.chosen == base) {
    why << "32-true: no candidate is faster and within the tolerances";
  } else {
    why << c.candidate.name() << ": the fastest within the tolerances, "
        << fixed(b.median_step_seconds / c.median_step_seconds, 2) << "x 32-true's step rate, loss "
        << percent(c.loss_rel_diff) << " off 32-true's, gradient cosine >= " << fixed(c.min_grad_cosine, 4);
  }
  // The faster candidates that lost, each with its reason: what the user would ask about.
  for (size_t i = 0; i < rows.size(); ++i)
    if (!d.rejected[i].empty() && rows[i].median_step_seconds < c.median_step_seconds)
      why << "; " << rows[i].candidate.name() << " was faster but " << d.rejected[i];
  // A busy machine slows whichever candidate runs while it is busy: say so rather than let
  // a ranking by noise pass for a measurement.
  double spread = 1;
  const TrialRow* unsteady = nullptr;
  for (const TrialRow& r : rows) {
    if (!r.measured || r.step_seconds.empty()) continue;
    const auto [lo, hi] = std::minmax_element(r.step_seconds.begin(), r.step_seconds.end());
    if (*lo > 0 && *hi / *lo > spread) {
      spread = *hi / *lo;
      unsteady = &r;
    }
  }
  if (unsteady && spread > tolerances.unsteady_spread)
    why << "; unsteady: one " << unsteady->candidate.name() << " step took " << fixed(spread, 1)
        << "x another (other work on the cores?), so the ranking by speed may not hold: measure again on a quiet "
           "machine";
  d.reason = why.str();
  return d;
}

std::string format_trial(const std::vector<TrialRow>& rows, const TrialDecision& decision) {
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "  %-16s %-9s %10s %10s %10s %9s %9s %8s %s\n", "precision", "support", "step ms",
                "peak MiB", "loss", "loss diff", "grad cos", "grad err", "");
  os << line;
  for (size_t i = 0; i < rows.size(); ++i) {
    const TrialRow& r = rows[i];
    const std::string mark = i == decision.chosen ? "<- chosen" : "";
    if (!r.measured) {
      std::snprintf(line, sizeof line, "  %-16s %-9s not measured: %s\n", r.candidate.name().c_str(),
                    r.native ? "native" : "emulated", r.note.c_str());
      os << line;
      continue;
    }
    std::string skipped = r.skipped_steps ? " (" + std::to_string(r.skipped_steps) + " skipped)" : "";
    std::snprintf(line, sizeof line, "  %-16s %-9s %10s %10s %10s %9s %9s %8s %s%s\n", r.candidate.name().c_str(),
                  r.native ? "native" : "emulated", fixed(1e3 * r.median_step_seconds, 3).c_str(),
                  fixed(double(r.peak_bytes) / (1 << 20), 1).c_str(), fixed(r.final_loss, 5).c_str(),
                  percent(r.loss_rel_diff).c_str(), fixed(r.min_grad_cosine, 4).c_str(),
                  percent(r.max_grad_rel_error).c_str(), mark.c_str(), skipped.c_str());
    os << line;
  }
  os << "  decision: " << decision.reason << "\n";
  return os.str();
}

std::string TrialReport::table() const { return format_trial(rows, decision); }

namespace {

std::vector<TrialCandidate> all_candidates() {
  return {{Precision::True32, false},  {Precision::True32, true},    {Precision::MixedBF16, false},
          {Precision::Mixed16, false}, {Precision::TrueBF16, false}, {Precision::True16, false}};
}

// Whether the hardware runs a candidate, and natively: the verdict of its compute dtype, or
// for "+medium" of float32 products under "medium".
struct CandidateSupport {
  bool runs = true;
  bool native = true;
  std::string words;
};

CandidateSupport support_of(const TrialCandidate& c, const hw::HardwareProfile& profile, Device device) {
  if (c.medium_matmul) {
    const hw::Float32ProductVerdict v = hw::float32_products(profile, device, Float32MatmulPrecision::Medium);
    if (v.support == hw::Support::Unsupported) return {false, false, v.reason};
    if (v.math == hw::Float32Math::Float32) return {false, true, "\"medium\" products are float32 here: " + v.reason};
    return {true, true, v.reason};
  }
  if (c.precision == Precision::True32) return {true, true, "float32"};
  const hw::Verdict v = hw::verdict(profile, device, compute_dtype(c.precision));
  return {v.support != hw::Support::Unsupported, v.support == hw::Support::Native, v.reason};
}

// What the trial changes and puts back: the model's values and gradients, the generator,
// the float32 matmul precision.
struct Snapshot {
  nn::StateDict state;
  std::vector<Tensor> grads;
  std::pair<uint64_t, uint64_t> generator;
  std::string matmul_precision;
};

Snapshot take_snapshot(nn::Module& model) {
  Snapshot s;
  for (const auto& [name, t] : model.state_dict()) s.state[name] = t.clone();
  for (const Tensor& p : model.parameters()) s.grads.push_back(p.grad().defined() ? p.grad().clone() : Tensor());
  s.generator = generator_state();
  s.matmul_precision = get_float32_matmul_precision();
  return s;
}

void restore(nn::Module& model, const Snapshot& s) {
  model.to(kFloat32);
  model.load_state_dict(s.state);
  const std::vector<Tensor> params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].set_grad(s.grads[i].defined() ? s.grads[i].clone() : Tensor());
  set_generator_state(s.generator.first, s.generator.second);
  set_float32_matmul_precision(s.matmul_precision);
}

uint64_t peak_bytes(Device d) {
  return d.type == DeviceType::CPU ? memory_stats(d).peak_bytes_in_use : cuda::memory_stats(d.index).peak;
}
void reset_peak(Device d) {
  if (d.type == DeviceType::CPU) reset_peak_memory_stats(d);
  else cuda::reset_peak_memory_stats(d.index);
}

// Runs one candidate from the snapshot's state; fills the row's step time, memory, loss
// and skipped steps, and returns the first step's (unscaled) gradients in float64.
std::vector<Tensor> run_candidate(nn::Module& model, const TrialOptimizerFactory& make_optimizer,
                                  const TrialLoss& loss_fn, const std::vector<data::Batch>& batches, int steps,
                                  Device device, TrialRow& row) {
  const TrialCandidate& c = row.candidate;
  if (c.medium_matmul) set_float32_matmul_precision("medium");
  std::unique_ptr<PrecisionPlugin> plugin = make_precision_plugin(c.precision, device.type);
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(model);
  AG_CHECK(opt != nullptr, "measure_precisions", "the optimizer factory returned no optimizer");
  if (c.precision == Precision::True16 || c.precision == Precision::TrueBF16) {
    opt->set_master_weights(true);  // as Lite's default: float32 masters for 16-bit parameters
    opt->init_master_weights();
  }
  plugin->convert_module(model);
  reset_peak(device);

  std::vector<Tensor> first_grads;
  std::vector<double> seconds;
  double last_loss = std::numeric_limits<double>::quiet_NaN();
  for (int s = 0; s < steps; ++s) {
    const data::Batch& b = batches[size_t(s) % batches.size()];
    const data::Batch in{plugin->convert_input(b.input), plugin->convert_input(b.target)};
    const auto t0 = std::chrono::steady_clock::now();
    opt->zero_grad();
    Tensor loss;
    {
      ForwardContext ctx = plugin->forward_context();
      loss = loss_fn(model, in);
    }
    plugin->backward(loss);
    if (s == 0) {
      plugin->unscale_gradients(*opt);
      for (const Tensor& p : model.parameters())
        first_grads.push_back(p.grad().defined() ? p.grad().detach().to(kFloat64) : zeros_like(p).to(kFloat64));
    }
    const bool stepped = bool(plugin->optimizer_step(*opt));
    if (GradScaler* scaler = plugin->scaler(); scaler && scaler->is_enabled()) scaler->update();
    last_loss = loss.detach().to(kFloat64).item<double>();  // waits for the step's work too
    synchronize(device);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) seconds.push_back(dt);
    if (!stepped) ++row.skipped_steps;
  }
  row.step_seconds = seconds;
  std::sort(seconds.begin(), seconds.end());
  row.steps = steps;
  row.median_step_seconds = seconds.empty() ? std::numeric_limits<double>::quiet_NaN()
                            : seconds.size() % 2
                                ? seconds[seconds.size() / 2]
                                : 0.5 * (seconds[seconds.size() / 2 - 1] + seconds[seconds.size() / 2]);
  row.peak_bytes = peak_bytes(device);
  row.final_loss = last_loss;
  row.measured = true;
  return first_grads;
}

// The smallest cosine and the largest relative error over the parameters, against `base`.
void compare_gradients(const std::vector<Tensor>& base, const std::vector<Tensor>& g, TrialRow& row) {
  double min_cos = 1, max_err = 0;
  for (size_t i = 0; i < base.size() && i < g.size(); ++i) {
    const double nb = norm(base[i]).item<double>(), ng = norm(g[i]).item<double>();
    const double diff = norm(sub(g[i], base[i])).item<double>();
    const double dot = sum(mul(g[i], base[i])).item<double>();
    // Two zero gradients agree; one zero against one not is as far apart as can be.
    const double cos = nb == 0 && ng == 0 ? 1.0 : (nb == 0 || ng == 0 ? 0.0 : dot / (nb * ng));
    const double err = nb == 0 ? (ng == 0 ? 0.0 : std::numeric_limits<double>::infinity()) : diff / nb;
    if (!(cos >= min_cos)) min_cos = cos;  // NaN sticks
    if (!(err <= max_err)) max_err = err;
  }
  row.min_grad_cosine = min_cos;
  row.max_grad_rel_error = max_err;
}

}  // namespace

TrialReport measure_precisions(nn::Module& model, const TrialOptimizerFactory& make_optimizer, const TrialLoss& loss,
                               const std::vector<data::Batch>& batches, const TrialOptions& options,
                               const hw::HardwareProfile& profile) {
  constexpr const char* kOp = "measure_precisions";
  AG_CHECK(!batches.empty(), kOp, "no batches to train on");
  AG_CHECK(options.steps >= 2, kOp, "steps must be at least 2 (the first is not timed), got ", options.steps);
  AG_CHECK(make_optimizer && loss, kOp, "the optimizer factory and the loss must be given");
  const std::vector<Tensor> params = model.parameters();
  AG_CHECK(!params.empty(), kOp, "the model has no parameters");
  const Device device = params[0].device();
  for (const auto& [name, t] : model.state_dict())
    AG_CHECK(!t.is_floating_point() || t.dtype() == kFloat32, kOp, "the trial starts from float32 weights, but ", name,
             " is ", dtype_name(t.dtype()));

  std::vector<TrialCandidate> wanted = options.candidates.empty() ? all_candidates() : options.candidates;
  // 32-true first: every other candidate is compared with it.
  wanted.erase(
      std::remove_if(wanted.begin(), wanted.end(),
                     [](const TrialCandidate& c) { return c.precision == Precision::True32 && !c.medium_matmul; }),
      wanted.end());
  wanted.insert(wanted.begin(), TrialCandidate{Precision::True32, false});

  TrialReport report;
  const Snapshot snap = take_snapshot(model);
  std::vector<std::vector<Tensor>> grads;
  try {
    for (const TrialCandidate& c : wanted) {
      TrialRow row;
      row.candidate = c;
      const CandidateSupport sup = support_of(c, profile, device);
      row.native = sup.native;
      row.support = sup.words;
      if (!sup.runs) row.note = sup.words;
      else if (!sup.native && !options.include_emulated)
        row.note = "emulated (" + sup.words + "); TrialOptions::include_emulated measures it";
      if (row.note.empty())
        grads.push_back(run_candidate(model, make_optimizer, loss, batches, options.steps, device, row));
      else grads.emplace_back();
      restore(model, snap);
      report.rows.push_back(std::move(row));
    }
  } catch (...) {
    restore(model, snap);
    throw;
  }
  const TrialRow& base = report.rows[0];
  for (size_t i = 0; i < report.rows.size(); ++i) {
    TrialRow& r = report.rows[i];
    if (!r.measured) continue;
    r.loss_rel_diff = std::abs(r.final_loss - base.final_loss) / std::max(std::abs(base.final_loss), 1e-12);
    compare_gradients(grads[0], grads[i], r);
  }
  report.decision = choose_from_trial(report.rows, options.tolerances);
  return report;
}

}  // namespace ampgrad
