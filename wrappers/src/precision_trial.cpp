// The rule of precision "auto:measure" (precision_trial.h): a pure function over a trial's
// measurements, and the table that shows them.
#include "ampgrad/wrappers/precision_trial.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "ampgrad/error.h"

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

}  // namespace ampgrad
