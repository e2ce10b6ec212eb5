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

TEST(PrecisionTrial, GradientsThatAreNotFiniteAreNamedSo) {
  TrialRow overflowed = row(Precision::Mixed16, 2e-3);
  overflowed.min_grad_cosine = std::numeric_limits<double>::quiet_NaN();
  overflowed.max_grad_rel_error = std::numeric_limits<double>::infinity();
  const TrialDecision d = choose_from_trial({baseline(10e-3), overflowed});
  EXPECT_EQ(d.chosen, 0u);
  EXPECT_NE(d.rejected[1].find("first step's gradients are not finite"), std::string::npos) << d.rejected[1];
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

TEST(PrecisionTrial, UnsteadyStepTimesAreSaidInTheReason) {
  std::vector<TrialRow> rows = {baseline(10e-3), row(Precision::MixedBF16, 6e-3)};
  rows[0].step_seconds = {10e-3, 10.5e-3, 9.8e-3};
  rows[1].step_seconds = {6e-3, 6.1e-3, 5.9e-3};
  const TrialDecision steady = choose_from_trial(rows);
  EXPECT_EQ(steady.reason.find("unsteady"), std::string::npos) << steady.reason;
  rows[0].step_seconds = {10e-3, 31e-3, 9.8e-3};  // one step while other work ran
  const TrialDecision busy = choose_from_trial(rows);
  EXPECT_EQ(busy.chosen, 1u) << "the note does not change the rule";
  EXPECT_NE(busy.reason.find("; unsteady: one 32-true step took 3.2x another"), std::string::npos) << busy.reason;
  TrialTolerances lenient;
  lenient.unsteady_spread = 4;
  EXPECT_EQ(choose_from_trial(rows, lenient).reason.find("unsteady"), std::string::npos);
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

// ---- the trial itself ------------------------------------------------------------------------

namespace {

std::vector<data::Batch> random_batches(int n, int64_t rows) {
  std::vector<data::Batch> b;
  for (int i = 0; i < n; ++i) b.push_back({randn({rows, 784}), randint(0, 10, {rows})});
  return b;
}

Tensor mlp_loss(nn::Module& m, const data::Batch& b) {
  return cross_entropy(static_cast<nn::Sequential&>(m).forward(b.input), b.target);
}

std::unique_ptr<optim::Optimizer> adamw(nn::Module& m) { return std::make_unique<optim::AdamW>(m.parameters()); }

std::vector<Tensor> params_of(nn::Module& m) {
  std::vector<Tensor> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

}  // namespace

// The model trained after a trial equals the model trained without one, bit for bit: the
// trial puts back the weights, the gradients, the generator and the matmul precision.
TEST(PrecisionTrial, TheTrialRestoresEverythingBitForBit) {
  manual_seed(3);
  auto a = nn::make_mlp();
  auto b = nn::make_mlp();
  b->load_state_dict(a->state_dict());
  const std::vector<data::Batch> batches = random_batches(2, 16);
  // A gradient left from before the trial must survive it too.
  mlp_loss(*a, batches[0]).backward();
  mlp_loss(*b, batches[0]).backward();
  const auto gen = generator_state();
  TrialOptions o;
  o.steps = 2;
  o.include_emulated = true;  // every candidate that runs here, so that each one's changes are undone
  const TrialReport r = measure_precisions(*a, adamw, mlp_loss, batches, o);
  EXPECT_GE(r.rows.size(), 6u);
  EXPECT_EQ(generator_state(), gen);
  EXPECT_EQ(get_float32_matmul_precision(), "highest");
  const std::vector<Tensor> pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].dtype(), kFloat32);
    EXPECT_TRUE(agt::same_bits(pa[i], pb[i])) << "parameter " << i;
    ASSERT_TRUE(pa[i].grad().defined());
    EXPECT_TRUE(agt::same_bits(pa[i].grad(), pb[i].grad())) << "gradient " << i;
  }
  // Training on: the same steps, the same bits.
  auto oa = adamw(*a), ob = adamw(*b);
  for (int s = 0; s < 3; ++s) {
    for (auto [m, opt] : {std::pair{a.get(), oa.get()}, std::pair{b.get(), ob.get()}}) {
      opt->zero_grad();
      mlp_loss(*m, batches[size_t(s) % 2]).backward();
      opt->step();
    }
  }
  const std::vector<Tensor> ta = params_of(*a), tb = params_of(*b);
  for (size_t i = 0; i < ta.size(); ++i)
    EXPECT_TRUE(agt::same_bits(ta[i], tb[i])) << "parameter " << i << " after training";
}

// What each row says for itself: measured rows have a time, a loss and gradient agreement;
// 32-true agrees with itself exactly.
TEST(PrecisionTrial, RowsCarryTheirMeasurements) {
  manual_seed(4);
  auto m = nn::make_mlp();
  TrialOptions o;
  o.steps = 3;
  o.candidates = {{Precision::MixedBF16, false}, {Precision::TrueBF16, false}};
  o.include_emulated = true;
  const TrialReport r = measure_precisions(*m, adamw, mlp_loss, random_batches(2, 8), o);
  ASSERT_EQ(r.rows.size(), 3u);
  EXPECT_EQ(r.rows[0].candidate.name(), "32-true") << "32-true is measured first, as the baseline";
  EXPECT_EQ(r.rows[0].loss_rel_diff, 0.0);
  EXPECT_NEAR(r.rows[0].min_grad_cosine, 1.0, 1e-12);
  EXPECT_EQ(r.rows[0].max_grad_rel_error, 0.0);
  for (const TrialRow& row : r.rows) {
    ASSERT_TRUE(row.measured) << row.candidate.name() << ": " << row.note;
    EXPECT_EQ(row.steps, 3);
    EXPECT_GT(row.median_step_seconds, 0.0);
    ASSERT_EQ(row.step_seconds.size(), 2u) << "every step but the first is timed";
    EXPECT_EQ(row.median_step_seconds, 0.5 * (row.step_seconds[0] + row.step_seconds[1]));
    EXPECT_GT(row.peak_bytes, 0u);
    EXPECT_TRUE(std::isfinite(row.final_loss));
  }
  // bfloat16 rounds: close to 32-true's gradients, but not equal.
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_GT(r.rows[i].min_grad_cosine, 0.9) << r.rows[i].candidate.name();
    EXPECT_LT(r.rows[i].min_grad_cosine, 1.0) << r.rows[i].candidate.name();
    EXPECT_GT(r.rows[i].max_grad_rel_error, 0.0) << r.rows[i].candidate.name();
  }
  EXPECT_NE(r.table().find("decision: "), std::string::npos);
}

// Emulated candidates are listed, not measured, unless asked for.
TEST(PrecisionTrial, EmulatedCandidatesAreNotMeasuredUnlessAsked) {
  const hw::HardwareProfile none = hw::profiles::cpu_without_avx512();
  manual_seed(5);
  auto m = nn::make_mlp();
  TrialOptions o;
  o.steps = 2;
  o.candidates = {{Precision::MixedBF16, false}};
  const TrialReport r = measure_precisions(*m, adamw, mlp_loss, random_batches(1, 8), o, none);
  ASSERT_EQ(r.rows.size(), 2u);
  EXPECT_FALSE(r.rows[1].measured);
  EXPECT_FALSE(r.rows[1].native);
  EXPECT_NE(r.rows[1].note.find("include_emulated"), std::string::npos) << r.rows[1].note;
  EXPECT_EQ(r.chosen().name(), "32-true");
}

TEST(PrecisionTrial, BadArgumentsAreErrors) {
  auto m = nn::make_mlp();
  EXPECT_AG_ERROR(measure_precisions(*m, adamw, mlp_loss, {}), "[measure_precisions] no batches");
  TrialOptions one;
  one.steps = 1;
  EXPECT_AG_ERROR(measure_precisions(*m, adamw, mlp_loss, random_batches(1, 4), one), "steps must be at least 2");
  m->to(kBFloat16);
  EXPECT_AG_ERROR(measure_precisions(*m, adamw, mlp_loss, random_batches(1, 4)), "starts from float32 weights");
}

// The trial: the Fashion-MNIST MLP on real images. Where bfloat16 is native here a
// bfloat16 precision (or float32 with bfloat16 products) must win; elsewhere 32-true, with
// the bfloat16 candidates listed as emulated.
TEST(PrecisionTrial, FashionMnistMlpPicksBfloat16WhereItIsNative) {
  std::shared_ptr<data::TensorDataset> ds;
  try {
    ds = data::fashion_mnist(false);
  } catch (const Error& e) {
    AGT_SKIP_UNLESS_CI() << e.what();
  }
  std::vector<data::Batch> batches;
  for (int64_t i = 0; i < 4; ++i) {
    std::vector<int64_t> idx(128);
    for (int64_t j = 0; j < 128; ++j) idx[size_t(j)] = i * 128 + j;
    batches.push_back(ds->get_batch(idx));
  }
  manual_seed(6);
  auto m = nn::make_mlp();
  TrialOptions o;
  o.steps = 12;  // the median of 11 timed steps: a bfloat16 step is about twice as fast where native
  const TrialReport r = measure_precisions(*m, adamw, mlp_loss, batches, o);
  const bool bf16_native = hw::verdict(hw::query(), Device(kCPU), kBFloat16).support == hw::Support::Native;
  const std::string chosen = r.chosen().name();
  if (bf16_native)
    EXPECT_TRUE(chosen == "bf16-mixed" || chosen == "bf16-true" || chosen == "32-true+medium") << r.table();
  else EXPECT_EQ(chosen, "32-true") << r.table();
  // The reason names what was measured.
  EXPECT_NE(r.decision.reason.find(chosen), std::string::npos) << r.decision.reason;
  if (chosen != "32-true")
    EXPECT_NE(r.decision.reason.find("x 32-true's step rate"), std::string::npos) << r.decision.reason;
  std::printf("%s", r.table().c_str());
}

// ---- Lite's "auto:measure" -------------------------------------------------------------------

TEST(PrecisionTrial, LiteAutoMeasureSwitchesToWhatTheTrialChose) {
  Lite lite(LiteOptions{.accelerator = "cpu", .precision = "auto:measure"});
  const Precision table = resolve_precision("auto", "cpu", hw::query()).precision;
  EXPECT_EQ(lite.precision(), table) << "the table's choice until a trial runs";
  EXPECT_EQ(lite.precision_record().how, "auto (table)");
  EXPECT_NE(lite.precision_reason().find("auto:measure"), std::string::npos) << lite.precision_reason();
  manual_seed(7);
  auto m = nn::make_mlp();
  TrialOptions o;
  o.steps = 3;
  const TrialReport r = lite.measure_precision(*m, adamw, mlp_loss, random_batches(2, 16), o);
  EXPECT_EQ(lite.precision(), r.chosen().precision);
  EXPECT_EQ(lite.plugin().precision(), r.chosen().precision);
  EXPECT_EQ(lite.precision_record().how, "auto (trial)");
  EXPECT_EQ(lite.precision_record().trial, r.table());
  EXPECT_EQ(lite.precision_reason().rfind("measured: " + r.chosen().name(), 0), 0u) << lite.precision_reason();
  set_float32_matmul_precision("highest");  // a "+medium" choice sets it process-wide
  // The model trains on under the chosen precision.
  auto opt = adamw(*m);
  auto [model, optimizer] = lite.setup(m, *opt);
  const data::Batch b = random_batches(1, 16)[0];
  Tensor loss = cross_entropy(model(b.input), b.target);  // through the wrapper, which converts the input
  lite.backward(loss);
  optimizer.step();
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
}

TEST(PrecisionTrial, LiteMeasuresOnlyUnderAutoMeasureAndBeforeSetup) {
  auto m = nn::make_mlp();
  Lite fixed(LiteOptions{.accelerator = "cpu", .precision = "32-true"});
  EXPECT_AG_ERROR(
      fixed.measure_precision(*m, adamw, mlp_loss, random_batches(1, 4)),
      "[Lite::measure_precision] this Lite runs precision \"32-true\"; a trial decides only under \"auto:measure\"");
  Lite lite(LiteOptions{.accelerator = "cpu", .precision = "auto:measure"});
  auto opt = adamw(*m);
  lite.setup(m, *opt);
  EXPECT_AG_ERROR(lite.measure_precision(*m, adamw, mlp_loss, random_batches(1, 4)), "before setting up an optimizer");
  EXPECT_AG_ERROR(parse_precision("auto:measur"), "\"auto:measure\"");
}
