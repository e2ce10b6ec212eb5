// The precision record (precision_record.h): to and from checkpoint metadata.
#include "ampgrad/wrappers/precision_record.h"

#include <sstream>

#include "ampgrad/error.h"
#include "ampgrad/matmul_precision.h"
#include "ampgrad/version.h"

namespace ampgrad {

namespace {

constexpr const char* kPrecision = "lite.precision";
constexpr const char* kHow = "lite.precision.how";
constexpr const char* kReason = "lite.precision.reason";
constexpr const char* kHardware = "lite.precision.hardware";
constexpr const char* kVersion = "lite.precision.version";
constexpr const char* kTrial = "lite.precision.trial";
constexpr const char* kFloat32Matmul = "lite.precision.float32_matmul";

constexpr const char* kCpu = "cpu: ";
constexpr const char* kCpuFeatures = "cpu features: ";
constexpr const char* kEmulated = "cuda emulated: ";
constexpr const char* kCapability = ", compute capability ";

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

std::vector<std::string> words(const std::string& s) {
  std::istringstream is(s);
  std::vector<std::string> out;
  for (std::string w; is >> w;) out.push_back(w);
  return out;
}

// The features that decide how the precisions' dtypes compute on a CPU (hw::verdict).
std::vector<std::string> precision_features(const hw::CpuFeatures& f) {
  const std::pair<bool, const char*> flags[] = {{f.avx2, "avx2"},
                                                {f.f16c, "f16c"},
                                                {f.avx512f, "avx512f"},
                                                {f.avx512_bf16, "avx512_bf16"},
                                                {f.avx512_fp16, "avx512_fp16"},
                                                {f.amx_bf16, "amx_bf16"},
                                                {f.amx_fp16, "amx_fp16"}};
  std::vector<std::string> out;
  for (const auto& [on, name] : flags)
    if (on) out.push_back(name);
  return out;
}

// One "cuda:N: <name>, compute capability X.Y" line (the name may hold commas: the last
// capability marker ends it).
PrecisionRecord::Gpu parse_gpu(const std::string& line) {
  const size_t colon = line.find(": ");
  const size_t cap = line.rfind(kCapability);
  const std::string index = line.substr(5, colon == std::string::npos ? 0 : colon - 5);
  const bool ok = colon != std::string::npos && cap != std::string::npos && cap > colon && !index.empty() &&
                  index.size() <= 7 && index.find_first_not_of("0123456789") == std::string::npos;
  AG_CHECK(ok, "precision record", "metadata \"", kHardware, "\": the line \"", line,
           "\" is not \"cuda:N: <name>, compute capability X.Y\"");
  return {std::stoi(index), line.substr(colon + 2, cap - colon - 2),
          line.substr(cap + std::string(kCapability).size())};
}

std::string how_of(std::string_view requested) {
  if (requested == "auto") return "auto (table)";
  if (requested == "auto:measure") return "auto (trial)";
  return "explicit";
}

}  // namespace

PrecisionRecord make_precision_record(const PrecisionDecision& decision, std::string_view requested,
                                      const hw::HardwareProfile& profile, std::string trial) {
  PrecisionRecord r;
  r.precision = decision.precision;
  r.how = how_of(requested);
  r.reason = decision.reason;
  r.cpu_model = profile.cpu.model_name.empty() ? "(unknown model)" : profile.cpu.model_name;
  r.cpu_features = precision_features(profile.cpu);
  for (const Device& d : decision.devices) {
    if (!d.is_cuda()) continue;
    const hw::CudaDevice& g = profile.cuda.at(size_t(d.index));
    r.cuda.push_back({g.index, g.name, g.compute_capability()});
  }
  r.cuda_emulated = profile.cuda_emulated && !r.cuda.empty();
  r.version = AMPGRAD_VERSION_STRING;
  r.trial = std::move(trial);
  r.float32_matmul = get_float32_matmul_precision();
  return r;
}

std::string PrecisionRecord::precision_text() const {
  const std::string name = precision_name(precision);
  return float32_matmul == "highest" ? name : name + "+" + float32_matmul;
}

std::string PrecisionRecord::hardware_text() const {
  if (cpu_model.empty() && cuda.empty()) return {};
  std::string s = std::string(kCpu) + cpu_model + "\n" + kCpuFeatures;
  for (size_t i = 0; i < cpu_features.size(); ++i) s += (i ? " " : "") + cpu_features[i];
  if (cpu_features.empty()) s += "(none)";
  for (const Gpu& g : cuda)
    s += "\ncuda:" + std::to_string(g.index) + ": " + g.name + kCapability + g.compute_capability;
  return s + "\n" + kEmulated + (cuda_emulated ? "yes" : "no");
}

nn::Metadata PrecisionRecord::to_metadata() const {
  nn::Metadata m{{kPrecision, precision_name(precision)},
                 {kHow, how},
                 {kReason, reason},
                 {kHardware, hardware_text()},
                 {kVersion, version}};
  if (!trial.empty()) m[kTrial] = trial;
  if (float32_matmul != "highest") m[kFloat32Matmul] = float32_matmul;
  return m;
}

std::optional<PrecisionRecord> precision_record_from_metadata(const nn::Metadata& meta) {
  const auto get = [&](const char* key) {
    const auto it = meta.find(key);
    return it == meta.end() ? std::string() : it->second;
  };
  const auto p = meta.find(kPrecision);
  if (p == meta.end()) return std::nullopt;
  const std::optional<Precision> precision = precision_from_name(p->second);
  AG_CHECK(precision.has_value(), "precision record", "metadata \"", kPrecision, "\" is \"", p->second,
           "\", which is not a precision (a checkpoint records the one it was saved under: 32-true, 64-true, "
           "16-mixed, bf16-mixed, 16-true or bf16-true)");
  PrecisionRecord r;
  r.precision = *precision;
  // Older checkpoints wrote the precision alone: nothing else is known.
  r.how = meta.count(kHow) ? get(kHow) : kUnknownHow;
  r.reason = get(kReason);
  r.version = get(kVersion);
  r.trial = get(kTrial);
  if (meta.count(kFloat32Matmul)) {
    r.float32_matmul = get(kFloat32Matmul);
    AG_CHECK(r.float32_matmul == "highest" || r.float32_matmul == "high" || r.float32_matmul == "medium",
             "precision record", "metadata \"", kFloat32Matmul, "\" is \"", r.float32_matmul,
             "\"; expected highest, high or medium");
  }
  std::istringstream lines(get(kHardware));
  for (std::string line; std::getline(lines, line);) {
    if (starts_with(line, kCpuFeatures)) {
      const std::string list = line.substr(std::string(kCpuFeatures).size());
      if (list != "(none)") r.cpu_features = words(list);
    } else if (starts_with(line, kCpu)) {
      r.cpu_model = line.substr(std::string(kCpu).size());
    } else if (starts_with(line, kEmulated)) {
      const std::string v = line.substr(std::string(kEmulated).size());
      AG_CHECK(v == "yes" || v == "no", "precision record", "metadata \"", kHardware, "\": \"", line,
               "\" is neither yes nor no");
      r.cuda_emulated = v == "yes";
    } else if (starts_with(line, "cuda:")) {
      r.cuda.push_back(parse_gpu(line));
    } else {
      AG_ERROR("precision record", "metadata \"", kHardware, "\": unexpected line \"", line,
               "\" (expected \"cpu: \", \"cpu features: \", \"cuda:N: \" or \"cuda emulated: \")");
    }
  }
  return r;
}

PrecisionRecord read_precision_record(const std::string& path) {
  const std::optional<PrecisionRecord> r = precision_record_from_metadata(nn::load_metadata(path));
  AG_CHECK(r.has_value(), "read_precision_record", path, " holds no precision record: its metadata has no \"",
           kPrecision, "\" (it was not written by Lite::save)");
  return *r;
}

std::string PrecisionRecord::decided_on() const {
  if (!cuda.empty()) {
    std::string s;
    for (size_t i = 0; i < cuda.size(); ++i)
      s += (i ? ", " : "") + ("cuda:" + std::to_string(cuda[i].index)) + " " + cuda[i].name + " (" +
           cuda[i].compute_capability + (cuda_emulated ? ", emulated" : "") + ")";
    return s;
  }
  return cpu_model.empty() ? "unknown hardware" : cpu_model;
}

std::string PrecisionRecord::describe() const {
  std::ostringstream os;
  os << "precision " << precision_text() << ", chosen " << how;
  if (cpu_model.empty() && cuda.empty()) {
    os << "; the hardware it was decided on is not recorded";
  } else {
    os << " on " << decided_on();
    if (!cuda.empty()) os << " with host CPU " << cpu_model;
    os << " (CPU features that matter for precision: ";
    for (size_t i = 0; i < cpu_features.size(); ++i) os << (i ? ", " : "") << cpu_features[i];
    os << (cpu_features.empty() ? "none)" : ")");
  }
  if (float32_matmul != "highest")
    os << ". float32 products ran at float32_matmul_precision(\"" << float32_matmul << "\")";
  if (!reason.empty()) os << ". Reason: " << reason;
  os << ". " << (version.empty() ? std::string("ampgrad version not recorded") : "Decided by ampgrad " + version)
     << (trial.empty() ? "." : "; a trial's table is recorded.");
  return os.str();
}

// ---- resuming ----------------------------------------------------------------------------

std::string ResumePrecision::choice_name() const {
  switch (choice) {
    case Choice::Kept: return emulated_here.empty() ? "kept" : "kept, emulated here";
    case Choice::Requested: return "requested";
    case Choice::Redecided: return "decided again";
  }
  return {};
}

std::string ResumePrecision::line(const PrecisionRecord& recorded, std::string_view checkpoint,
                                  Precision running) const {
  const std::string rec = recorded.precision_text(), now = precision_name(running);
  const std::string where = std::string(checkpoint) + " (" + recorded.how + " on " + recorded.decided_on() + ")";
  switch (choice) {
    case Choice::Kept:
      if (emulated_here.empty())
        return "precision: " + rec + ", recorded in " + where + "; --redecide-precision decides again";
      return "precision: " + rec + ", recorded in " + where +
             "; kept, but this hardware runs it emulated and slower (" + emulated_here +
             "); --redecide-precision would pick " + precision_name(auto_here) + " here";
    case Choice::Requested:
    case Choice::Redecided: {
      const std::string how = choice == Choice::Requested ? "as requested" : "decided again (--redecide-precision)";
      if (rec == now) return "precision: " + now + ", " + how + ", the same as recorded in " + where;
      return "precision: " + now + ", " + how + "; differs from " + rec + ", recorded in " + where;
    }
  }
  return {};
}

ResumePrecision precision_on_resume(const PrecisionRecord& recorded, const std::optional<std::string>& requested,
                                    bool redecide, std::string_view accelerator, const hw::HardwareProfile& profile) {
  ResumePrecision r;
  const AcceleratorChoice acc = resolve_accelerator(accelerator, profile);
  r.auto_here = resolve_precision("auto", accelerator, profile).precision;
  if (requested || redecide) {
    r.choice = requested ? ResumePrecision::Choice::Requested : ResumePrecision::Choice::Redecided;
    r.precision = requested ? *requested : "auto";
    return r;
  }
  r.precision = precision_name(recorded.precision);
  r.float32_matmul = recorded.float32_matmul;
  // Every floating dtype runs on every device (natively or emulated): a recorded precision
  // can always be kept; the verdict says at what cost.
  for (const Device& d : acc.devices) {
    const hw::Verdict v = hw::verdict(profile, d, compute_dtype(recorded.precision));
    if (v.support != hw::Support::Native)
      r.emulated_here += (r.emulated_here.empty() ? "" : "; ") + d.str() + ": " + v.reason;
  }
  return r;
}

}  // namespace ampgrad
