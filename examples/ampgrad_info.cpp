// ampgrad-info: the hardware report, like a short nvidia-smi plus CPU flags. It prints the
// build (oneDNN, CUDA), the CPU (model, vendor, cores, flags, the ISA oneDNN uses), each
// CUDA device with its derived features, and the native / emulated / unsupported verdict
// for every (device, dtype) with its reason. Everything printed comes from one
// ag::hw::HardwareProfile: this machine's (ag::hw::query()) or, with --profile NAME, one of
// the fake profiles in ag::hw::profiles (t4, a100, h200, cpu-without-avx512, ...).
// With --checkpoint FILE it prints instead the precision decision a checkpoint recorded
// (ag::read_precision_record: the precision, how it was chosen, on what hardware, by which
// version, and the trial's table when a trial decided).
#include <ampgrad/ampgrad.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace hw = ag::hw;

namespace {

std::string cpu_flags(const hw::CpuFeatures& f) {
  const std::pair<bool, const char*> flags[] = {
      {f.sse42, "sse4.2"},           {f.avx, "avx"},           {f.avx2, "avx2"},
      {f.fma, "fma"},                {f.f16c, "f16c"},         {f.avx512f, "avx512f"},
      {f.avx512bw, "avx512bw"},      {f.avx512vl, "avx512vl"}, {f.avx512dq, "avx512dq"},
      {f.avx512_bf16, "avx512_bf16"}, {f.avx512_fp16, "avx512_fp16"},
      {f.amx_tile, "amx_tile"},      {f.amx_bf16, "amx_bf16"}, {f.amx_fp16, "amx_fp16"}};
  std::string s;
  for (auto& [on, name] : flags)
    if (on) s += (s.empty() ? "" : " ") + std::string(name);
  return s.empty() ? "(none detected)" : s;
}

const char* yes_no(bool b) { return b ? "yes" : "no"; }

void print_build(const hw::HardwareProfile& p, const std::string& title) {
  std::printf("ampgrad %s hardware report: %s\n\n", AMPGRAD_VERSION_STRING, title.c_str());
  std::printf("build   oneDNN %s, CUDA %s\n\n", p.built_with_onednn ? "on" : "off",
              p.cuda_emulated     ? "emulated (kernels run on the CPU, -DAMPGRAD_CUDA=EMULATE)"
              : p.built_with_cuda ? "built"
                                  : "not built");
}

void print_cpu(const hw::HardwareProfile& p) {
  const auto& c = p.cpu;
  std::printf("cpu     %s\n", c.model_name.empty() ? "(unknown model)" : c.model_name.c_str());
  std::printf("        vendor %s, %d logical cores\n", c.vendor.empty() ? "(unknown)" : c.vendor.c_str(),
              c.logical_cores);
  std::printf("        flags  %s\n", cpu_flags(c).c_str());
  std::printf("        oneDNN ISA %s\n", p.onednn_isa.c_str());
  std::printf("        vector math %s%s\n\n", p.vector_math_isa.c_str(),
              p.vector_math_isa == "none" ? " (scalar functors)" : " (SLEEF: exp, log, log1p, tanh, pow; our erfc on its exp)");
}

void print_cuda_devices(const hw::HardwareProfile& p) {
  if (p.cuda.empty()) {
    std::printf("cuda    no CUDA device (%s)\n\n",
                p.built_with_cuda ? "the CUDA runtime found no GPU or no driver"
                                  : "ampgrad was built without CUDA");
    return;
  }
  for (const auto& d : p.cuda) {
    std::printf("%-8s%s\n", ("cuda:" + std::to_string(d.index)).c_str(), d.name.c_str());
    if (p.cuda_emulated)
      std::printf("        cuda: emulated on the CPU, as this GPU (AMPGRAD_CUDA_EMULATOR_DEVICE: sm_90 or sm_80)\n");
    std::printf("        compute capability %s, %.1f GiB, %d SMs\n", d.compute_capability().c_str(),
                double(d.total_memory) / double(size_t(1) << 30), d.sm_count);
    std::printf("        fp16 tensor cores %s, bf16 native %s, tf32 %s, fp8 %s\n", yes_no(d.fp16_tensor_cores()),
                yes_no(d.bf16_native()), yes_no(d.tf32()), yes_no(d.fp8()));
  }
  std::printf("\n");
}

// The devices the verdicts are given for: the CPU and each GPU, or cuda:0 where there is none.
std::vector<ag::Device> report_devices(const hw::HardwareProfile& p) {
  std::vector<ag::Device> devices = {ag::Device(ag::kCPU)};
  if (p.cuda.empty())
    devices.emplace_back(ag::kCUDA, 0);  // shows why CUDA is unsupported
  else
    for (const auto& d : p.cuda) devices.emplace_back(ag::kCUDA, d.index);
  return devices;
}

constexpr ag::DType kReportDtypes[] = {ag::kFloat32, ag::kFloat16, ag::kBFloat16, ag::kFloat64};

// Identical GPUs (same name and compute capability) share cuda:0's reasons.
bool same_as_cuda0(const hw::HardwareProfile& p, const ag::Device& dev) {
  return dev.is_cuda() && dev.index > 0 && size_t(dev.index) < p.cuda.size() &&
         p.cuda[size_t(dev.index)].name == p.cuda[0].name && p.cuda[size_t(dev.index)].cc() == p.cuda[0].cc();
}

// The verdict table (device by dtype), then each verdict's reason.
void print_verdicts(const hw::HardwareProfile& p, const std::vector<ag::Device>& devices) {
  std::printf("%-8s", "verdict");
  for (auto dt : kReportDtypes) std::printf(" %-12s", ag::dtype_name(dt));
  std::printf("\n");
  for (const auto& dev : devices) {
    std::printf("%-8s", dev.str().c_str());
    for (auto dt : kReportDtypes) std::printf(" %-12s", hw::support_name(hw::verdict(p, dev, dt).support));
    std::printf("\n");
  }
  std::printf("\nreasons\n");
  for (const auto& dev : devices) {
    if (same_as_cuda0(p, dev)) {
      std::printf("  %-7s (same as cuda:0)\n", dev.str().c_str());
      continue;
    }
    for (auto dt : kReportDtypes) {
      const auto v = hw::verdict(p, dev, dt);
      std::printf("  %-7s %-9s %-12s %s\n", dev.str().c_str(), ag::dtype_name(dt),
                  hw::support_name(v.support), v.reason.c_str());
    }
  }
}

// What each float32 product precision computes here (ag::set_float32_matmul_precision).
void print_float32_products(const hw::HardwareProfile& p, const std::vector<ag::Device>& devices) {
  std::printf("\nfloat32 products (set_float32_matmul_precision)\n");
  for (const auto& dev : devices) {
    if (same_as_cuda0(p, dev)) continue;
    const auto none = hw::float32_products(p, dev, ag::Float32MatmulPrecision::Highest);
    if (none.support != hw::Support::Native) {  // one line: no precision computes there
      std::printf("  %-7s %-8s %-9s %s\n", dev.str().c_str(), "any", "-", none.reason.c_str());
      continue;
    }
    for (auto prec : {ag::Float32MatmulPrecision::Highest, ag::Float32MatmulPrecision::High,
                      ag::Float32MatmulPrecision::Medium}) {
      const auto v = hw::float32_products(p, dev, prec);
      std::printf("  %-7s %-8s %-9s %s\n", dev.str().c_str(), ag::float32_matmul_precision_name(prec),
                  hw::float32_math_name(v.math), v.reason.c_str());
    }
  }
}

// What precision "auto" picks here (docs/precision.md), per accelerator.
void print_auto_precision(const hw::HardwareProfile& p) {
  std::printf("\nprecision \"auto\"\n");
  for (const char* acc : {"cpu", "cuda"}) {
    try {
      const ag::PrecisionDecision d = ag::resolve_precision("auto", acc, p);
      std::printf("  %-7s %-11s %s\n", acc, ag::precision_name(d.precision), d.reason.c_str());
    } catch (const ag::Error& e) {
      std::printf("  %-7s %-11s %s\n", acc, "-", e.what());
    }
  }
}

void print_report(const hw::HardwareProfile& p, const std::string& title) {
  print_build(p, title);
  print_cpu(p);
  print_cuda_devices(p);
  const std::vector<ag::Device> devices = report_devices(p);
  print_verdicts(p, devices);
  print_float32_products(p, devices);
  print_auto_precision(p);
}

// A checkpoint's precision record, as Lite::save wrote it.
void print_checkpoint(const std::string& path) {
  const ag::PrecisionRecord r = ag::read_precision_record(path);
  std::printf("checkpoint %s\n\n%s\n", path.c_str(), r.describe().c_str());
  if (const std::string hw_text = r.hardware_text(); !hw_text.empty()) {
    std::printf("\nhardware\n");
    std::size_t start = 0;
    while (start < hw_text.size()) {
      const std::size_t end = std::min(hw_text.find('\n', start), hw_text.size());
      std::printf("  %s\n", hw_text.substr(start, end - start).c_str());
      start = end + 1;
    }
  }
  if (!r.trial.empty()) std::printf("\ntrial\n%s\n", r.trial.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ampgrad-info: what this machine (or a fake profile) can compute, and how fast"};
  std::string profile_name;
  std::string names;
  for (const auto& n : hw::profiles::names()) names += (names.empty() ? "" : "|") + n;
  app.add_option("--profile", profile_name, "print the report for a fake profile: " + names)
      ->check(CLI::IsMember(hw::profiles::names()));
  std::string checkpoint;
  app.add_option("--checkpoint", checkpoint, "print the precision decision this checkpoint recorded, and nothing else");
  CLI11_PARSE(app, argc, argv);

  try {
    if (!checkpoint.empty()) {
      print_checkpoint(checkpoint);
    } else if (profile_name.empty()) {
      print_report(hw::query(), "this machine");
    } else {
      print_report(*hw::profiles::by_name(profile_name), "fake profile '" + profile_name + "'");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampgrad-info: %s\n", e.what());
    return 1;
  }
  return 0;
}
