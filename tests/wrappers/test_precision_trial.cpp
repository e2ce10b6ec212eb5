// The rule of precision "auto:measure" (ampgrad/wrappers/precision_trial.h), on tables of
// measurements: no model runs here.
#include "ampgrad/wrappers/precision_trial.h"

#include "support/testing.h"

using namespace ag;

namespace {

TrialRow row(Precision p, double step_s, double loss_diff = 0.001, double cosine = 0.9999, double rel_err = 0.01,
             bool medium = false) {
  TrialRow r;
  r.candidate = {p, medium};
  r.measured = true;
  r.steps = 8;
  r.median_step_seconds = step_s;
  r.final_loss = 0.5 * (1 + loss_diff);
  r.loss_rel_diff = loss_diff;
  r.min_grad_cosine = cosine;
  r.max_grad_rel_error = rel_err;
  return r;
}

TrialRow baseline(double step_s) { return row(Precision::True32, step_s, 0, 1, 0); }

}  // namespace

TEST(PrecisionTrial, TheFastestWithinTheTolerancesWins) {
  const std::vector<TrialRow> rows = {baseline(10e-3), row(Precision::MixedBF16, 6e-3), row(Precision::TrueBF16, 4e-3),
                                      row(Precision::Mixed16, 8e-3)};
  const TrialDecision d = choose_from_trial(rows);
  EXPECT_EQ(d.chosen, 2u);
  EXPECT_NE(d.reason.find("bf16-true: the fastest within the tolerances"), std::string::npos) << d.reason;
  EXPECT_NE(d.reason.find("2.50x 32-true's step rate"), std::string::npos) << d.reason;
  for (const std::string& r : d.rejected) EXPECT_TRUE(r.empty()) << r;
}

TEST(PrecisionTrial, AFastCandidateWhoseLossDivergesIsRejected) {
  const std::vector<TrialRow> rows = {baseline(10e-3), row(Precision::MixedBF16, 6e-3),
                                      row(Precision::TrueBF16, 4e-3, /*loss_diff=*/0.2)};
  const TrialDecision d = choose_from_trial(rows);
  EXPECT_EQ(d.chosen, 1u);
  EXPECT_NE(d.rejected[2].find("its loss is 20.00% off 32-true's (tolerance 5.00%)"), std::string::npos)
      << d.rejected[2];
  // The reason names the faster candidate that lost, and why.
  EXPECT_NE(d.reason.find("bf16-true was faster but its loss is 20.00% off"), std::string::npos) << d.reason;
}

TEST(PrecisionTrial, EachToleranceRejectsOnItsOwn) {
  TrialRow nan_loss = row(Precision::True16, 1e-3);
  nan_loss.final_loss = std::numeric_limits<double>::infinity();
  TrialRow skipping = row(Precision::Mixed16, 2e-3);
  skipping.skipped_steps = 5;
  const std::vector<TrialRow> rows = {baseline(10e-3), row(Precision::MixedBF16, 3e-3, 0.001, /*cosine=*/0.9),
                                      row(Precision::TrueBF16, 4e-3, 0.001, 0.9999, /*rel_err=*/0.3), nan_loss,
                                      skipping};
  const TrialDecision d = choose_from_trial(rows);
  EXPECT_EQ(d.chosen, 0u) << "every candidate is outside a tolerance";
  EXPECT_NE(d.rejected[1].find("cosine similarity to 32-true's is 0.9000"), std::string::npos) << d.rejected[1];
  EXPECT_NE(d.rejected[2].find("relative error against 32-true's is 30.00%"), std::string::npos) << d.rejected[2];
  EXPECT_NE(d.rejected[3].find("loss is not finite"), std::string::npos) << d.rejected[3];
  EXPECT_NE(d.rejected[4].find("skipped 5 of 8 steps"), std::string::npos) << d.rejected[4];
  EXPECT_NE(d.reason.find("32-true: no candidate is faster and within the tolerances"), std::string::npos) << d.reason;
}

TEST(PrecisionTrial, AllRejectedOrSlowerGives32True) {
  const std::vector<TrialRow> slower = {baseline(5e-3), row(Precision::MixedBF16, 6e-3), row(Precision::Mixed16, 9e-3)};
  EXPECT_EQ(choose_from_trial(slower).chosen, 0u);
  // The baseline need not come first.
  const std::vector<TrialRow> later = {row(Precision::MixedBF16, 6e-3, 0.5), baseline(10e-3)};
  EXPECT_EQ(choose_from_trial(later).chosen, 1u);
}

TEST(PrecisionTrial, TiesKeep32TrueThenTheEarlierRow) {
  const std::vector<TrialRow> tie_base = {baseline(5e-3), row(Precision::MixedBF16, 5e-3)};
  EXPECT_EQ(choose_from_trial(tie_base).chosen, 0u);
  const std::vector<TrialRow> tie = {baseline(9e-3), row(Precision::MixedBF16, 5e-3), row(Precision::TrueBF16, 5e-3)};
  EXPECT_EQ(choose_from_trial(tie).chosen, 1u);
}

TEST(PrecisionTrial, RowsNotMeasuredAreNotCandidates) {
  TrialRow emulated = row(Precision::Mixed16, 1e-3);
  emulated.measured = false;
  emulated.native = false;
  emulated.note = "float16 is emulated on this CPU; ask for it to measure it";
  const std::vector<TrialRow> rows = {baseline(10e-3), emulated,
                                      row(Precision::True32, 7e-3, 0.001, 0.9999, 0.01, true)};
  const TrialDecision d = choose_from_trial(rows);
  EXPECT_EQ(d.chosen, 2u);
  EXPECT_NE(d.reason.find("32-true+medium"), std::string::npos) << d.reason;
  const std::string table = format_trial(rows, d);
  EXPECT_NE(table.find("16-mixed         emulated  not measured: float16 is emulated"), std::string::npos) << table;
  EXPECT_NE(table.find("<- chosen"), std::string::npos) << table;
  EXPECT_NE(table.find("decision: 32-true+medium"), std::string::npos) << table;
}

TEST(PrecisionTrial, TolerancesAreSettable) {
  const std::vector<TrialRow> rows = {baseline(10e-3), row(Precision::TrueBF16, 4e-3, 0.08)};
  EXPECT_EQ(choose_from_trial(rows).chosen, 0u) << "8% is outside the default 5%";
  TrialTolerances loose;
  loose.loss_rel = 0.1;
  EXPECT_EQ(choose_from_trial(rows, loose).chosen, 1u);
}

TEST(PrecisionTrial, ATrialWithout32TrueIsAnError) {
  EXPECT_AG_ERROR(choose_from_trial({row(Precision::MixedBF16, 1e-3)}),
                  "[precision trial] the trial has no measured 32-true row");
  TrialRow medium_only = row(Precision::True32, 1e-3, 0, 1, 0, true);
  EXPECT_AG_ERROR(choose_from_trial({medium_only}), "no measured 32-true row");
}
