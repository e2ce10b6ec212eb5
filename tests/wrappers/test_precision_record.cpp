// The precision record (precision_record.h): what a checkpoint says about its precision,
// through metadata and back, an older checkpoint's, and Lite's save and load of it.
#include "support/testing.h"

#include <algorithm>

#include "ampgrad/version.h"

using namespace ag;

namespace {

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// The small state a checkpoint of these tests holds.
struct SmallRun {
  std::shared_ptr<nn::Linear> net = std::make_shared<nn::Linear>(4, 3);
  optim::AdamW adamw{net->parameters(), {.lr = 1e-2}};
  std::vector<std::string> warnings;
  Lite lite;
  LiteOptimizer opt;
  int64_t step = 0;
  SmallRun(const char* precision, const hw::HardwareProfile& profile, std::optional<PrecisionRecord> recorded = {})
      : lite({.accelerator = "cpu",
              .precision = precision,
              .profile = &profile,
              .warn = [this](const std::string& line) { warnings.push_back(line); },
              .recorded = std::move(recorded)}),
        opt(lite.setup_optimizer(adamw)) {
    lite.setup_module(net);
  }
  LiteState state() { return {{"model", net}, {"optimizer", opt}, {"step", step}}; }
};

}  // namespace

TEST(PrecisionRecord, MadeFromTheDecisionAndTheProfile) {
  const hw::HardwareProfile h200 = hw::profiles::h200();
  const PrecisionRecord r = make_precision_record(resolve_precision("auto", "cuda", h200), "auto", h200);
  EXPECT_EQ(r.precision, Precision::MixedBF16);
  EXPECT_EQ(r.how, "auto (table)");
  EXPECT_TRUE(agt::contains(r.reason, "native bfloat16")) << r.reason;
  EXPECT_EQ(r.cpu_model, h200.cpu.model_name);
  // The features that decide precision, read from the profile's flags.
  EXPECT_EQ(has(r.cpu_features, "amx_bf16"), h200.cpu.amx_bf16);
  EXPECT_EQ(has(r.cpu_features, "avx512_bf16"), h200.cpu.avx512_bf16);
  EXPECT_EQ(has(r.cpu_features, "avx512f"), h200.cpu.avx512f);
  EXPECT_FALSE(has(r.cpu_features, "sse4.2"));
  ASSERT_EQ(r.cuda.size(), h200.cuda.size());
  EXPECT_EQ(r.cuda[0].name, h200.cuda[0].name);
  EXPECT_EQ(r.cuda[0].compute_capability, "9.0");
  EXPECT_FALSE(r.cuda_emulated);
  EXPECT_EQ(r.version, AMPGRAD_VERSION_STRING);
  EXPECT_TRUE(r.trial.empty());

  // The CPU decided: no CUDA device is recorded, even where the machine has some.
  const PrecisionRecord cpu = make_precision_record(resolve_precision("32-true", "cpu", h200), "32-true", h200);
  EXPECT_EQ(cpu.how, "explicit");
  EXPECT_TRUE(cpu.cuda.empty());
  EXPECT_EQ(cpu.decided_on(), h200.cpu.model_name);
  // An old spelling is an explicit request; "auto:measure" a trial.
  const hw::HardwareProfile amx = hw::profiles::cpu_amx();
  EXPECT_EQ(make_precision_record(resolve_precision("bf16", "cpu", amx), "bf16", amx).how, "explicit");
  EXPECT_EQ(make_precision_record(resolve_precision("auto", "cpu", amx), "auto:measure", amx, "table").how,
            "auto (trial)");
}

TEST(PrecisionRecord, RoundTripsThroughMetadata) {
  const hw::HardwareProfile h200 = hw::profiles::h200();
  PrecisionRecord r = make_precision_record(resolve_precision("16-mixed", "cuda", h200), "16-mixed", h200,
                                            "candidate   step\n* 32-true   1.0 ms\n  bf16-mixed 0.6 ms");
  r.cuda.push_back({3, "Vendor GPU, rev. 2, compute capability x", "8.6"});  // commas in the name
  r.cuda_emulated = true;
  const nn::Metadata m = r.to_metadata();
  EXPECT_EQ(m.at("lite.precision"), "16-mixed");  // the key older readers know
  EXPECT_EQ(m.at("lite.precision.how"), "explicit");
  EXPECT_EQ(m.at("lite.precision.reason"), r.reason);
  EXPECT_EQ(m.at("lite.precision.version"), AMPGRAD_VERSION_STRING);
  EXPECT_EQ(m.at("lite.precision.trial"), r.trial);
  EXPECT_TRUE(
      agt::contains(m.at("lite.precision.hardware"), "cuda:0: " + h200.cuda[0].name + ", compute capability 9.0"));
  const std::optional<PrecisionRecord> back = precision_record_from_metadata(m);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, r);
  EXPECT_EQ(back->cuda.back().name, "Vendor GPU, rev. 2, compute capability x");

  // Without a trial there is no trial key; a CPU without any of the features reads back empty.
  PrecisionRecord plain = r;
  plain.trial.clear();
  plain.cuda.clear();
  plain.cuda_emulated = false;
  plain.cpu_features.clear();
  EXPECT_EQ(plain.to_metadata().count("lite.precision.trial"), 0u);
  EXPECT_EQ(precision_record_from_metadata(plain.to_metadata()), plain);
}

TEST(PrecisionRecord, AnOlderCheckpointAndBadValues) {
  const std::optional<PrecisionRecord> old = precision_record_from_metadata({{"lite.precision", "bf16-mixed"}});
  ASSERT_TRUE(old.has_value());
  EXPECT_EQ(old->precision, Precision::MixedBF16);
  EXPECT_EQ(old->how, "unknown (saved before decisions were recorded)");
  EXPECT_TRUE(old->reason.empty() && old->cpu_model.empty() && old->cuda.empty() && old->version.empty());
  EXPECT_EQ(old->decided_on(), "unknown hardware");
  EXPECT_TRUE(
      agt::contains(old->describe(), "precision bf16-mixed, chosen unknown (saved before decisions were recorded)"))
      << old->describe();
  EXPECT_FALSE(precision_record_from_metadata({{"note", "x"}}).has_value());  // not a Lite checkpoint

  EXPECT_AG_ERROR(precision_record_from_metadata({{"lite.precision", "fp8"}}),
                  "\"lite.precision\" is \"fp8\", which is not a precision");
  EXPECT_AG_ERROR(
      precision_record_from_metadata({{"lite.precision", "32-true"}, {"lite.precision.hardware", "gpu: x"}}),
      "metadata \"lite.precision.hardware\": unexpected line \"gpu: x\"");
  EXPECT_AG_ERROR(
      precision_record_from_metadata(
          {{"lite.precision", "32-true"}, {"lite.precision.hardware", "cuda:x: A100, compute capability 8.0"}}),
      "the line \"cuda:x: A100, compute capability 8.0\" is not \"cuda:N: <name>, compute capability X.Y\"");
  EXPECT_AG_ERROR(precision_record_from_metadata(
                      {{"lite.precision", "32-true"}, {"lite.precision.hardware", "cuda emulated: maybe"}}),
                  "is neither yes nor no");
}

TEST(PrecisionRecord, DescribeNamesWhatWasDecidedAndWhere) {
  const hw::HardwareProfile amx = hw::profiles::cpu_amx();
  const PrecisionRecord r = make_precision_record(resolve_precision("auto", "cpu", amx), "auto", amx);
  const std::string d = r.describe();
  for (const std::string& part : {std::string("precision bf16-mixed, chosen auto (table) on ") + amx.cpu.model_name,
                                  std::string("amx_bf16"), r.reason, std::string("ampgrad ") + AMPGRAD_VERSION_STRING})
    EXPECT_TRUE(agt::contains(d, part)) << d << "\nexpected: " << part;
  EXPECT_EQ(d.find('\n'), std::string::npos) << d;
}

TEST(PrecisionRecord, ReadFromAFileNamesWhatIsWrong) {
  agt::TempDir dir;
  const std::string junk = dir.file("junk.safetensors");
  agt::write_bytes(junk, agt::Bytes(20, 'x'));
  EXPECT_AG_ERROR(read_precision_record(junk), "[load] " + junk);
  const std::string plain = dir.file("plain.safetensors");
  nn::save(plain, {{"w", zeros({2})}});
  EXPECT_AG_ERROR(read_precision_record(plain), plain + " holds no precision record");
}

TEST(PrecisionRecord, LiteSavesItsRecordAndLoadSaysWhenItRunsAnother) {
  agt::TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  const hw::HardwareProfile amx = hw::profiles::cpu_amx();
  manual_seed(3);
  SmallRun a("auto", amx);
  a.step = 7;
  EXPECT_EQ(a.lite.precision_record().how, "auto (table)");
  a.lite.save(path, a.state());
  const PrecisionRecord saved = read_precision_record(path);
  EXPECT_EQ(saved, a.lite.precision_record());
  EXPECT_EQ(saved.precision, Precision::MixedBF16);
  EXPECT_EQ(saved.reason, a.lite.precision_reason());

  // The same precision: loads, says nothing.
  SmallRun same("bf16-mixed", amx);
  same.lite.load(path, same.state());
  EXPECT_EQ(same.step, 7);
  EXPECT_TRUE(same.warnings.empty()) << same.warnings.front();

  // Another precision: loads all the same (the step and the weights), with one line.
  manual_seed(4);
  SmallRun other("32-true", amx);
  other.lite.load(path, other.state());
  EXPECT_EQ(other.step, 7);
  EXPECT_TRUE(agt::same_bits(other.net->weight, a.net->weight));
  ASSERT_EQ(other.warnings.size(), 1u);
  const std::string& line = other.warnings[0];
  for (const std::string& part : {path + " was saved under bf16-mixed (auto (table) on " + amx.cpu.model_name + ")",
                                  std::string("this Lite runs 32-true (explicit)"),
                                  std::string("pass precision \"bf16-mixed\" to keep the recorded one")})
    EXPECT_TRUE(agt::contains(line, part)) << line << "\nexpected: " << part;
  // The existing refusals stay: a grad scaler's state into a Lite without one.
  SmallRun mixed16("16-mixed", amx);
  mixed16.lite.save(path, mixed16.state());
  SmallRun bf16("bf16-mixed", amx);
  EXPECT_AG_ERROR(bf16.lite.load(path, bf16.state()), "holds grad-scaler state (saved under 16-mixed)");
}

TEST(PrecisionRecord, LiteLoadsAnOlderCheckpointAndChecksTheRecord) {
  agt::TempDir dir;
  const hw::HardwareProfile amx = hw::profiles::cpu_amx();
  SmallRun a("32-true", amx);
  a.step = 2;
  const std::string path = dir.file("ckpt.safetensors");
  a.lite.save(path, a.state());
  nn::Metadata meta;
  nn::StateDict tensors = nn::load(path, &meta);
  // An older checkpoint: the precision alone. Strict loading accepts it, and the record says so.
  nn::Metadata old = meta;
  std::erase_if(old, [](const auto& kv) { return kv.first.rfind("lite.precision.", 0) == 0; });
  ASSERT_EQ(old.size() + 4, meta.size());  // how, reason, hardware, version
  const std::string old_path = dir.file("old.safetensors");
  nn::save(old_path, tensors, old);
  EXPECT_EQ(read_precision_record(old_path).how, kUnknownHow);
  SmallRun b("bf16-mixed", amx);
  b.lite.load(old_path, b.state());
  EXPECT_EQ(b.step, 2);
  ASSERT_EQ(b.warnings.size(), 1u);
  EXPECT_TRUE(
      agt::contains(b.warnings[0], "saved under 32-true (" + std::string(kUnknownHow) + " on unknown hardware)"))
      << b.warnings[0];
  // A record that does not parse is refused before anything is restored.
  nn::Metadata bad = meta;
  bad["lite.precision.hardware"] = "tpu: v5";
  const std::string bad_path = dir.file("bad.safetensors");
  nn::save(bad_path, tensors, bad);
  SmallRun c("32-true", amx);
  EXPECT_AG_ERROR(c.lite.load(bad_path, c.state()), "[Lite::load] " + bad_path + ": metadata: ");
  EXPECT_EQ(c.step, 0);
}

// A resumed run that keeps the recorded precision keeps its record (how it was first
// decided, and where), and one that runs another makes its own.
TEST(PrecisionRecord, LiteCarriesOnARecordOfItsPrecision) {
  const hw::HardwareProfile amx = hw::profiles::cpu_amx(), avx2 = hw::profiles::cpu_without_avx512();
  const PrecisionRecord first = SmallRun("auto", amx).lite.precision_record();
  ASSERT_EQ(first.precision, Precision::MixedBF16);
  SmallRun kept("bf16-mixed", avx2, first);
  EXPECT_EQ(kept.lite.precision_record(), first);
  SmallRun other("32-true", avx2, first);
  EXPECT_EQ(other.lite.precision_record().how, "explicit");
  EXPECT_EQ(other.lite.precision_record().cpu_model, avx2.cpu.model_name);
}

TEST(PrecisionRecord, KeepsTheFloat32ProductPrecisionItWasDecidedUnder) {
  agt::Float32MatmulPrecisionGuard restore;
  const hw::HardwareProfile amx = hw::profiles::cpu_amx();
  const PrecisionDecision d = resolve_precision("32-true", "cpu", amx);
  EXPECT_EQ(make_precision_record(d, "32-true", amx).float32_matmul, "highest");
  EXPECT_EQ(make_precision_record(d, "32-true", amx).to_metadata().count("lite.precision.float32_matmul"), 0u);
  set_float32_matmul_precision("medium");
  const PrecisionRecord medium = make_precision_record(d, "auto:measure", amx, "a table");
  EXPECT_EQ(medium.float32_matmul, "medium");
  EXPECT_EQ(medium.precision_text(), "32-true+medium");
  EXPECT_NE(medium.describe().find("32-true+medium"), std::string::npos) << medium.describe();
  const nn::Metadata meta = medium.to_metadata();
  EXPECT_EQ(meta.at("lite.precision.float32_matmul"), "medium");
  EXPECT_EQ(precision_record_from_metadata(meta), medium);
  nn::Metadata bad = meta;
  bad["lite.precision.float32_matmul"] = "lowest";
  EXPECT_AG_ERROR(precision_record_from_metadata(bad), "lite.precision.float32_matmul\" is \"lowest\"");
  // A Lite that runs the record's precision under other float32 products makes its own record.
  set_float32_matmul_precision("highest");
  SmallRun highest("32-true", amx, medium);
  EXPECT_EQ(highest.lite.precision_record().float32_matmul, "highest");
  set_float32_matmul_precision("medium");
  SmallRun kept("32-true", amx, medium);
  EXPECT_EQ(kept.lite.precision_record(), medium);
}

TEST(PrecisionOnResume, KeepsTheRecordedPrecisionWhereAutoWouldPickAnother) {
  const hw::HardwareProfile amx = hw::profiles::cpu_amx(), avx512_bf16 = hw::profiles::cpu_avx512_bf16();
  PrecisionRecord rec = make_precision_record(resolve_precision("32-true", "cpu", amx), "32-true", amx);
  const ResumePrecision r = precision_on_resume(rec, std::nullopt, false, "auto", avx512_bf16);
  EXPECT_EQ(r.choice, ResumePrecision::Choice::Kept);
  EXPECT_EQ(r.precision, "32-true");
  EXPECT_EQ(r.auto_here, Precision::MixedBF16);
  EXPECT_EQ(r.emulated_here, "");
  EXPECT_EQ(r.float32_matmul, "highest");
  const std::string line = r.line(rec, "ckpt.safetensors", Precision::True32);
  EXPECT_NE(line.find("precision: 32-true, recorded in ckpt.safetensors (explicit on " + amx.cpu.model_name + ")"),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("--redecide-precision decides again"), std::string::npos) << line;
}

TEST(PrecisionOnResume, AKeptPrecisionThisHardwareEmulatesSaysWhyAndWhatAutoWouldPick) {
  const hw::HardwareProfile amx = hw::profiles::cpu_amx(), avx2 = hw::profiles::cpu_without_avx512();
  const PrecisionRecord rec = make_precision_record(resolve_precision("auto", "cpu", amx), "auto", amx);
  ASSERT_EQ(rec.precision, Precision::MixedBF16);
  const ResumePrecision r = precision_on_resume(rec, std::nullopt, false, "cpu", avx2);
  EXPECT_EQ(r.choice, ResumePrecision::Choice::Kept);
  EXPECT_EQ(r.precision, "bf16-mixed");
  EXPECT_EQ(r.choice_name(), "kept, emulated here");
  EXPECT_NE(r.emulated_here.find("cpu: no AVX512-BF16 or AMX-BF16"), std::string::npos) << r.emulated_here;
  EXPECT_EQ(r.auto_here, Precision::True32);
  const std::string line = r.line(rec, "ckpt", Precision::MixedBF16);
  EXPECT_NE(line.find("kept, but this hardware runs it emulated and slower (cpu: no AVX512-BF16"), std::string::npos)
      << line;
  EXPECT_NE(line.find("--redecide-precision would pick 32-true here"), std::string::npos) << line;
  // On the hardware it was recorded on, nothing is emulated.
  EXPECT_EQ(precision_on_resume(rec, std::nullopt, false, "cpu", amx).emulated_here, "");
}

TEST(PrecisionOnResume, ARequestOrRedecidingWinsOverTheRecord) {
  const hw::HardwareProfile amx = hw::profiles::cpu_amx(), avx2 = hw::profiles::cpu_without_avx512();
  PrecisionRecord rec = make_precision_record(resolve_precision("auto", "cpu", amx), "auto", amx);
  rec.float32_matmul = "medium";
  const ResumePrecision asked = precision_on_resume(rec, std::string("16-mixed"), false, "cpu", avx2);
  EXPECT_EQ(asked.choice, ResumePrecision::Choice::Requested);
  EXPECT_EQ(asked.precision, "16-mixed");
  EXPECT_EQ(asked.float32_matmul, "");
  EXPECT_NE(asked.line(rec, "ckpt", Precision::Mixed16)
                .find("precision: 16-mixed, as requested; differs from "
                      "bf16-mixed+medium, recorded in ckpt"),
            std::string::npos)
      << asked.line(rec, "ckpt", Precision::Mixed16);
  const ResumePrecision again = precision_on_resume(rec, std::nullopt, true, "cpu", avx2);
  EXPECT_EQ(again.choice, ResumePrecision::Choice::Redecided);
  EXPECT_EQ(again.precision, "auto");
  EXPECT_NE(again.line(rec, "ckpt", Precision::True32).find("decided again (--redecide-precision); differs from"),
            std::string::npos);
  // The record's float32 products come back with its precision.
  EXPECT_EQ(precision_on_resume(rec, std::nullopt, false, "cpu", amx).float32_matmul, "medium");
  EXPECT_AG_ERROR(precision_on_resume(rec, std::nullopt, false, "cuda", avx2), "accelerator \"cuda\" was requested");
}
