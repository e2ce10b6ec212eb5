// The hardware profile: query() assembles it once from cpu.h and the backends' detail hooks;
// verdict() decides native / emulated / unsupported from a profile alone (never from the
// machine), so fake profiles test every branch. The fake profiles live here too.
#include "ampgrad/hw/profile.h"

#include <algorithm>

#include "ampgrad/backend.h"

namespace ampgrad::hw {

std::string CudaDevice::compute_capability() const {
  return std::to_string(major) + "." + std::to_string(minor);
}

const HardwareProfile& query() {
  static const HardwareProfile profile = [] {
    HardwareProfile p;
    p.cpu = cpu_features();
    p.vector_math_isa = vector_math_isa();
    p.built_with_onednn = built_with_onednn();
    p.built_with_cuda = built_with_cuda();
    p.cuda_emulated = cuda_emulated();
    try {
      p.onednn_isa = detail::onednn_isa();
    } catch (...) {
      p.onednn_isa = "unknown";
    }
    try {
      p.cuda = detail::query_cuda_devices();
    } catch (...) {
      p.cuda.clear();  // no driver / no device is a normal answer
    }
    return p;
  }();
  return profile;
}

const char* support_name(Support s) {
  switch (s) {
    case Support::Native: return "native";
    case Support::Emulated: return "emulated";
    case Support::Unsupported: return "unsupported";
  }
  return "?";
}

namespace {

// What the CPU's features allow, before asking whether the build uses them.
Verdict cpu_features_verdict(const CpuFeatures& f, DType dt) {
  switch (dt) {
    case kFloat32: return {Support::Native, "float32 is the CPU's native floating type"};
    case kFloat64: return {Support::Native, "float64 is native on the CPU"};
    case kBFloat16:
      if (f.amx_bf16 && f.avx512_bf16)
        return {Support::Native, "AMX-BF16 tiles (matmul) and AVX512-BF16 (dot products)"};
      if (f.amx_bf16) return {Support::Native, "AMX-BF16 tiles compute bfloat16 matmuls"};
      if (f.avx512_bf16) return {Support::Native, "AVX512-BF16 computes bfloat16 dot products"};
      return {Support::Emulated,
              "no AVX512-BF16 or AMX-BF16: bfloat16 is computed through float32"};
    case kFloat16:
      if (f.amx_fp16) return {Support::Native, "AMX-FP16 tiles compute float16 matmuls"};
      if (f.avx512_fp16) return {Support::Native, "AVX512-FP16 computes in float16"};
      return {Support::Emulated,
              std::string("no AVX512-FP16 or AMX-FP16: float16 is computed through float32") +
                  (f.f16c ? " (F16C only converts)" : " (no F16C either: converted in software)")};
    default: break;
  }
  return {Support::Unsupported,
          std::string(dtype_name(dt)) + " is not a floating compute dtype for mixed precision"};
}

// The 16-bit hardware paths are oneDNN's kernels; the Eigen-only build multiplies float32
// copies, so there even a capable CPU only emulates.
Verdict cpu_verdict(const HardwareProfile& p, DType dt) {
  Verdict v = cpu_features_verdict(p.cpu, dt);
  if (v.support == Support::Native && is_reduced_floating(dt) && !p.built_with_onednn)
    return {Support::Emulated, v.reason + ", but ampgrad was built without oneDNN: " + dtype_name(dt) +
                                   " matmuls are computed through float32 (Eigen)"};
  return v;
}

Verdict cuda_verdict(const HardwareProfile& p, int index, DType dt) {
  const std::string dev = "cuda:" + std::to_string(index);
  if (!p.built_with_cuda) return {Support::Unsupported, "ampgrad was built without CUDA"};
  if (p.cuda.empty())
    return {Support::Unsupported, "no CUDA device (no GPU, or no driver) on this machine"};
  if (index < 0 || index >= int(p.cuda.size()))
    return {Support::Unsupported, dev + " does not exist (" + std::to_string(p.cuda.size()) +
                                      " CUDA device" + (p.cuda.size() == 1 ? "" : "s") + " found)"};
  const CudaDevice& d = p.cuda[size_t(index)];
  const std::string cc = "compute capability " + d.compute_capability();
  switch (dt) {
    case kFloat32:
      return {Support::Native, d.tf32() ? cc + ": float32, with TF32 tensor cores for matmul"
                                        : cc + ": float32 on CUDA cores (no TF32 before 8.0)"};
    case kFloat64: return {Support::Native, "float64 runs on every CUDA device"};
    case kFloat16:
      if (d.fp16_tensor_cores()) return {Support::Native, cc + " has float16 tensor cores"};
      return {Support::Emulated,
              cc + " has no tensor cores (7.0+): float16 is computed through float32"};
    case kBFloat16:
      if (d.bf16_native()) return {Support::Native, cc + " has bfloat16 tensor cores"};
      return {Support::Emulated,
              cc + " has no bfloat16 arithmetic (8.0+): bfloat16 is computed through float32"};
    default: break;
  }
  return {Support::Unsupported,
          std::string(dtype_name(dt)) + " is not a floating compute dtype for mixed precision"};
}

}  // namespace

Verdict verdict(const HardwareProfile& profile, Device device, DType dtype) {
  if (device.is_cpu()) return cpu_verdict(profile, dtype);
  return cuda_verdict(profile, device.index, dtype);
}

const char* float32_math_name(Float32Math m) {
  switch (m) {
    case Float32Math::Float32: return "float32";
    case Float32Math::TF32: return "tf32";
    case Float32Math::BFloat16: return "bfloat16";
  }
  return "?";
}

Float32ProductVerdict float32_products(const HardwareProfile& profile, Device device,
                                       Float32MatmulPrecision precision) {
  const Verdict f32 = verdict(profile, device, kFloat32);
  if (f32.support != Support::Native) return {f32.support, Float32Math::Float32, f32.reason};
  if (precision == Float32MatmulPrecision::Highest)
    return {Support::Native, Float32Math::Float32, "\"highest\" (the default) keeps float32 arithmetic"};
  if (device.is_cpu()) {
    if (precision == Float32MatmulPrecision::High)
      return {Support::Native, Float32Math::Float32, "CPUs have no TF32 arithmetic: \"high\" computes as \"highest\""};
    if (!profile.built_with_onednn)
      return {Support::Native, Float32Math::Float32,
              "ampgrad was built without oneDNN: the Eigen products stay float32"};
    const Verdict bf16 = verdict(profile, device, kBFloat16);
    if (bf16.support != Support::Native)
      return {Support::Native, Float32Math::Float32, "bfloat16 is not native here (" + bf16.reason + "): float32 arithmetic"};
    return {Support::Native, Float32Math::BFloat16, "operands rounded to bfloat16, sums in float32: " + bf16.reason};
  }
  const CudaDevice& d = profile.cuda[size_t(device.index)];
  const std::string cc = "compute capability " + d.compute_capability();
  if (d.tf32())
    return {Support::Native, Float32Math::TF32, cc + ": TF32 tensor cores (cuBLASLt and cuDNN), sums in float32"};
  return {Support::Native, Float32Math::Float32, cc + " has no TF32 tensor cores (8.0+): float32 arithmetic"};
}

// ---- fake profiles ------------------------------------------------------------------------

namespace profiles {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

CpuFeatures avx2_base(std::string vendor, std::string model, int cores) {
  CpuFeatures f;
  f.vendor = std::move(vendor);
  f.model_name = std::move(model);
  f.logical_cores = cores;
  f.sse42 = f.avx = f.avx2 = f.fma = f.f16c = true;
  return f;
}
CpuFeatures with_avx512(CpuFeatures f) {
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = true;
  return f;
}
// Intel Xeon Platinum 8480+ (Sapphire Rapids): AVX512-BF16/FP16 and AMX-BF16/INT8.
CpuFeatures sapphire_rapids() {
  CpuFeatures f = with_avx512(avx2_base("GenuineIntel", "Intel(R) Xeon(R) Platinum 8480+", 224));
  f.avx512_bf16 = f.avx512_fp16 = true;
  f.amx_tile = f.amx_bf16 = true;
  return f;
}
HardwareProfile cpu_only(CpuFeatures f, std::string isa) {
  HardwareProfile p;
  p.cpu = std::move(f);
  p.onednn_isa = std::move(isa);
  p.vector_math_isa = p.cpu.avx512f ? "avx512" : p.cpu.avx2 && p.cpu.fma ? "avx2" : "sse2";
  p.built_with_onednn = true;
  p.built_with_cuda = false;
  return p;
}
HardwareProfile with_gpus(CpuFeatures f, std::string isa, CudaDevice d, int count) {
  HardwareProfile p = cpu_only(std::move(f), std::move(isa));
  p.built_with_cuda = true;
  for (int i = 0; i < count; ++i) {
    d.index = i;
    p.cuda.push_back(d);
  }
  return p;
}

}  // namespace

HardwareProfile t4() {
  // A cloud T4 VM: Skylake Xeon (AVX-512, no BF16), one Tesla T4.
  return with_gpus(with_avx512(avx2_base("GenuineIntel", "Intel(R) Xeon(R) CPU @ 2.00GHz", 8)),
                   "avx512_core", {0, "Tesla T4", 7, 5, 15360 * kMiB, 40}, 1);
}
HardwareProfile a100() {
  // A DGX A100: AMD EPYC 7742 (Zen 2, AVX2 only), eight A100-SXM4-80GB.
  return with_gpus(avx2_base("AuthenticAMD", "AMD EPYC 7742 64-Core Processor", 256), "avx2",
                   {0, "NVIDIA A100-SXM4-80GB", 8, 0, 81920 * kMiB, 108}, 8);
}
HardwareProfile h200() {
  // An HGX H200: Sapphire Rapids hosts, eight H200 (141 GB HBM3e, 143771 MiB reported).
  return with_gpus(sapphire_rapids(), "avx512_core_amx",
                   {0, "NVIDIA H200", 9, 0, 143771 * kMiB, 132}, 8);
}
HardwareProfile cpu_without_avx512() {
  return cpu_only(avx2_base("AuthenticAMD", "AMD EPYC 7763 64-Core Processor", 128), "avx2");
}
HardwareProfile cpu_avx512_bf16() {
  // Zen 4 has AVX512-BF16 but neither AVX512-FP16 nor AMX.
  CpuFeatures f = with_avx512(avx2_base("AuthenticAMD", "AMD EPYC 9654 96-Core Processor", 192));
  f.avx512_bf16 = true;
  return cpu_only(std::move(f), "avx512_core_bf16");
}
HardwareProfile cpu_amx() { return cpu_only(sapphire_rapids(), "avx512_core_amx"); }

const std::vector<std::string>& names() {
  static const std::vector<std::string> n = {"t4",      "a100", "h200", "cpu-without-avx512",
                                             "cpu-avx512-bf16", "cpu-amx"};
  return n;
}

std::optional<HardwareProfile> by_name(std::string_view name) {
  std::string n(name);
  std::replace(n.begin(), n.end(), '_', '-');
  if (n == "t4") return t4();
  if (n == "a100") return a100();
  if (n == "h200") return h200();
  if (n == "cpu-without-avx512") return cpu_without_avx512();
  if (n == "cpu-avx512-bf16") return cpu_avx512_bf16();
  if (n == "cpu-amx") return cpu_amx();
  return std::nullopt;
}

}  // namespace profiles
}  // namespace ampgrad::hw
