// Precision "auto:measure": the rule that picks a precision from a trial's measurements.
//
// A trial runs each candidate precision on the same model, from the same initial weights and
// on the same batches, and measures its step time, peak memory, the loss it reaches and how
// far its first step's gradients are from 32-true's. choose_from_trial() then decides, as a
// pure function of those numbers: the fastest candidate whose loss and gradients stay within
// the tolerances, else 32-true. Keeping the rule apart from the measuring makes it testable
// on tables, and lets a recorded trial be decided again under other tolerances.
// docs/precision.md describes the trial and the defaults.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ampgrad/data/dataset.h"
#include "ampgrad/hw/profile.h"
#include "ampgrad/nn/module.h"
#include "ampgrad/optim/optimizer.h"
#include "ampgrad/wrappers/precision.h"

namespace ampgrad {

/// One precision a trial can run: a precision, and for 32-true whether its float32 products
/// run at float32_matmul_precision("medium") (bfloat16 products where the hardware has them).
struct TrialCandidate {
  Precision precision = Precision::True32;
  bool medium_matmul = false;
  /// "32-true", "bf16-mixed", ..., or "32-true+medium".
  std::string name() const;
};

/// What a trial measured for one candidate.
struct TrialRow {
  TrialCandidate candidate;
  /// False where the hardware runs the candidate's dtype emulated (correct but slower).
  bool native = true;
  /// The hardware verdict's words for the candidate's dtype on the device.
  std::string support;
  /// False when the candidate was not run; `note` says why (emulated and not asked for, or
  /// unsupported on the device).
  bool measured = false;
  std::string note;
  int64_t steps = 0;
  /// The median seconds of one training step over the timed steps.
  double median_step_seconds = std::numeric_limits<double>::quiet_NaN();
  /// Every timed step's seconds, in order: their spread says how steady the machine was.
  std::vector<double> step_seconds;
  /// The most bytes the device's allocator held at once during the candidate's steps.
  uint64_t peak_bytes = 0;
  /// The loss after the last step, and its relative difference from 32-true's.
  double final_loss = std::numeric_limits<double>::quiet_NaN();
  double loss_rel_diff = std::numeric_limits<double>::quiet_NaN();
  /// Over the parameters, the smallest cosine similarity and the largest relative error
  /// (||g - g32|| / ||g32||) of the first step's gradients against 32-true's.
  double min_grad_cosine = std::numeric_limits<double>::quiet_NaN();
  double max_grad_rel_error = std::numeric_limits<double>::quiet_NaN();
  /// Steps the grad scaler skipped (16-mixed), out of `steps`.
  int64_t skipped_steps = 0;
};

/// How close to 32-true a candidate must stay. The defaults are documented in
/// docs/precision.md; every one can be set.
struct TrialTolerances {
  /// |loss - loss32| / |loss32| after the trial's steps.
  double loss_rel = 0.05;
  /// The smallest per-parameter cosine similarity of the first step's gradients.
  double grad_cosine = 0.99;
  /// The largest per-parameter relative error of the first step's gradients.
  double grad_rel_error = 0.1;
  /// The largest fraction of steps a grad scaler may skip.
  double skipped_fraction = 0.5;
  /// Not a tolerance on a candidate: when some measured row's slowest timed step took more
  /// than this many times its fastest, the machine was not steady (other work on its
  /// cores), and the reason says that the ranking by speed may not hold.
  double unsteady_spread = 1.5;
};

/// The rule's answer: the chosen row, one line that says why, and for each row why it was
/// rejected (empty for rows within the tolerances, and for rows not measured).
struct TrialDecision {
  size_t chosen = 0;
  std::string reason;
  std::vector<std::string> rejected;
};

/// The fastest measured row within `tolerances` of the 32-true row (which is always within
/// them); a tie keeps 32-true, else the earlier row. The reason ends with a warning when the
/// step times were unsteady (TrialTolerances::unsteady_spread). Throws ag::Error when no measured
/// 32-true row (without "medium" products) is given, since every comparison is against it.
TrialDecision choose_from_trial(const std::vector<TrialRow>& rows, const TrialTolerances& tolerances = {});

/// The trial as one table, a row per candidate with the chosen one marked, and the reason
/// as the last line.
std::string format_trial(const std::vector<TrialRow>& rows, const TrialDecision& decision);

/// What measure_precisions() runs, and how.
struct TrialOptions {
  /// Training steps per candidate (the batches are reused in turn when fewer); the first
  /// step warms up and is not timed.
  int steps = 6;
  TrialTolerances tolerances;
  /// The candidates to consider; empty: 32-true, 32-true+medium, bf16-mixed, 16-mixed,
  /// bf16-true and 16-true. 32-true is always measured.
  std::vector<TrialCandidate> candidates;
  /// Also measure candidates the hardware runs emulated (slower than float32 itself, so
  /// they never win by accident: off by default, and they are listed as not measured).
  bool include_emulated = false;
};

/// A trial's rows and the rule's decision.
struct TrialReport {
  std::vector<TrialRow> rows;
  TrialDecision decision;
  const TrialCandidate& chosen() const { return rows[decision.chosen].candidate; }
  /// format_trial(rows, decision).
  std::string table() const;
};

/// The loss of one batch through the model (the trial runs it inside the candidate's
/// autocast region, with the batch converted as Lite converts inputs).
using TrialLoss = std::function<Tensor(nn::Module& model, const data::Batch& batch)>;
/// A fresh optimizer over the model's parameters (made once per candidate, before the model
/// is converted, so that 16-bit candidates get float32 master weights as Lite gives them).
using TrialOptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(nn::Module& model)>;

/// Runs `options.steps` training steps of each candidate on `model` (float32 parameters, on
/// one device), every candidate from the same weights, on the same batches and from the
/// same random-generator state, and decides with choose_from_trial. Afterwards the model's
/// parameters, buffers and gradients, the random generator and the float32 matmul precision
/// are as they were, bit for bit; the caller's own optimizer is not touched (each candidate
/// steps one made by `make_optimizer`). `profile` decides which candidates run natively.
TrialReport measure_precisions(nn::Module& model, const TrialOptimizerFactory& make_optimizer, const TrialLoss& loss,
                               const std::vector<data::Batch>& batches, const TrialOptions& options = {},
                               const hw::HardwareProfile& profile = hw::query());

}  // namespace ampgrad
