// The precision decision, recorded: what a checkpoint says about the precision it was saved
// under, so that a resumed run can keep it and a person can read how it was chosen.
//
//   ag::PrecisionRecord r = ag::read_precision_record("ckpt.safetensors");
//   std::puts(r.describe().c_str());
//
// Lite::save writes the record of its decision into every checkpoint's metadata
// (safetensors metadata is a flat string map):
//   "lite.precision"           the precision's name (written before records existed too)
//   "lite.precision.how"       "explicit", "auto (table)" or "auto (trial)"
//   "lite.precision.reason"    the decision's sentence
//   "lite.precision.hardware"  the hardware it was decided on, one "label: value" line each:
//                              "cpu: <model>", "cpu features: <those that matter for
//                              precision>", "cuda:N: <name>, compute capability X.Y" per
//                              CUDA device in use, "cuda emulated: yes|no"
//   "lite.precision.version"   the ampgrad version that decided
//   "lite.precision.trial"     the trial's table (only after "auto:measure")
//   "lite.precision.float32_matmul"  float32_matmul_precision() when it was not "highest"
//                              (a trial's "32-true+medium", or --float32-matmul-precision)
// A checkpoint with only "lite.precision" (saved before decisions were recorded) reads as a
// record whose `how` is kUnknownHow. docs/precision.md, "The decision is recorded".
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ampgrad/hw/profile.h"
#include "ampgrad/nn/serialize.h"
#include "ampgrad/wrappers/precision.h"

namespace ampgrad {

/// A record's `how` when the checkpoint predates records.
inline constexpr const char* kUnknownHow = "unknown (saved before decisions were recorded)";

struct PrecisionRecord {
  /// A CUDA device the decision was made for.
  struct Gpu {
    int index = 0;
    std::string name;
    std::string compute_capability;  ///< "9.0"
    bool operator==(const Gpu&) const = default;
  };

  Precision precision = Precision::True32;
  /// "explicit", "auto (table)", "auto (trial)", or kUnknownHow.
  std::string how;
  std::string reason;
  /// The host CPU's model name, and those of its features that decide precision (avx2,
  /// f16c, avx512f, avx512_bf16, avx512_fp16, amx_bf16, amx_fp16) that it has.
  std::string cpu_model;
  std::vector<std::string> cpu_features;
  /// The CUDA devices in use (empty: the CPU decided), and whether they were emulated.
  std::vector<Gpu> cuda;
  bool cuda_emulated = false;
  /// AMPGRAD_VERSION_STRING of the run that decided; empty when unknown.
  std::string version;
  /// The trial's table (format_trial) when a trial decided; else empty.
  std::string trial;
  /// float32_matmul_precision() of the decision ("highest", "high" or "medium"): part of
  /// the precision, since "medium" computes float32 products in bfloat16.
  std::string float32_matmul = "highest";

  /// The precision's name, with "+medium" or "+high" when float32 products were reduced
  /// ("32-true+medium", as a trial names that candidate).
  std::string precision_text() const;

  /// The record as checkpoint metadata (the keys above; "lite.precision.trial" only when
  /// there is a trial).
  nn::Metadata to_metadata() const;
  /// The hardware as the "lite.precision.hardware" text (empty for an old checkpoint's).
  std::string hardware_text() const;
  /// Where it was decided, short: the CUDA devices in use ("cuda:0 NVIDIA H200 (9.0)"),
  /// else the CPU's model; "unknown hardware" when not recorded.
  std::string decided_on() const;
  /// One paragraph: the precision, how, on what, the reason, the version (not the trial).
  std::string describe() const;

  bool operator==(const PrecisionRecord&) const = default;
};

/// The record of `decision`, made for the precision string `requested` ("auto" gives
/// "auto (table)", "auto:measure" "auto (trial)", anything else "explicit"; an old spelling
/// is explicit too), on `profile` (the CPU, and the CUDA devices of decision.devices), by
/// this version of ampgrad, under the float32_matmul_precision() in force; `trial` is the
/// trial's table, when there was one.
PrecisionRecord make_precision_record(const PrecisionDecision& decision, std::string_view requested,
                                      const hw::HardwareProfile& profile, std::string trial = {});

/// The record in a checkpoint's metadata; nullopt when it has no "lite.precision" (not a
/// Lite checkpoint). Throws ag::Error naming the key for a value that is not what save
/// writes (a precision name that is not one, a hardware line that does not parse).
std::optional<PrecisionRecord> precision_record_from_metadata(const nn::Metadata& meta);

/// The record of the checkpoint at `path`, reading only its metadata (nn::load_metadata).
/// Throws the loader's ag::Error for a file that is not safetensors, and an ag::Error
/// naming the file when it holds no record (not written by Lite::save).
PrecisionRecord read_precision_record(const std::string& path);

/// What a resumed run does with the precision its checkpoint recorded: keep it, unless the
/// user asked for a precision or to decide again. A kept precision that this hardware runs
/// only emulated (bf16-mixed recorded on a CPU with AVX512-BF16, resumed on one without) is
/// still kept, so that the run goes on with the same numerics, and the line says why it is
/// slower and what "auto" would pick here. docs/precision.md, "The decision is recorded".
struct ResumePrecision {
  enum class Choice { Kept, Requested, Redecided };
  Choice choice = Choice::Kept;
  /// The precision string the resumed run passes to Lite: the recorded precision's name
  /// when kept, else what was requested ("auto" when deciding again without a request).
  std::string precision;
  /// The float32_matmul_precision() to set when kept (the record's), else empty.
  std::string float32_matmul;
  /// When kept and the hardware here runs it emulated: the verdict's words; else empty.
  std::string emulated_here;
  /// What "auto" would pick on this hardware.
  Precision auto_here = Precision::True32;

  /// "kept", "kept, emulated here", "requested" or "decided again".
  std::string choice_name() const;
  /// One line: the precision the run trains in (`running`, Lite's) and how it relates to the
  /// record of `checkpoint`.
  std::string line(const PrecisionRecord& recorded, std::string_view checkpoint, Precision running) const;
};

/// The decision for a run resumed from a checkpoint that recorded `recorded`: `requested` is
/// the precision the user asked for (nullopt when none), `redecide` asks to decide again
/// ("auto", or `requested`) instead of keeping the record; `accelerator` and `profile` are
/// this run's. Throws the accelerator's ag::Error for an accelerator this machine lacks.
ResumePrecision precision_on_resume(const PrecisionRecord& recorded, const std::optional<std::string>& requested,
                                    bool redecide, std::string_view accelerator, const hw::HardwareProfile& profile);

}  // namespace ampgrad
