// ampgrad/hw/profile.h — what the hardware can do, as one plain value.
//
// `query()` gathers, once, the CPU features (cpu.h: cpuid plus the OS's consent), the ISA
// oneDNN will actually dispatch to, and every CUDA device (name, compute capability,
// memory, SMs). No driver or no GPU is a normal answer: an empty `cuda` list, never an
// error. Everything that decides from hardware takes a HardwareProfile as an argument, so
// tests and docs use the fake profiles in `profiles::` (a T4, an A100, an H200, CPUs with
// and without AVX-512 BF16 / AMX) instead of the machine they run on.
//
// `verdict(profile, device, dtype)` says whether a dtype is computed natively (a fast
// hardware path), emulated (correct, computed through float32, slower) or unsupported,
// always with a reason. Unlike PyTorch's is_bf16_supported(), which answers yes on a T4
// because bfloat16 tensors can be allocated there, native and emulated are never confused.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ampgrad/device.h"
#include "ampgrad/dtype.h"
#include "ampgrad/hw/cpu.h"
#include "ampgrad/matmul_precision.h"

namespace ampgrad::hw {

/// One CUDA device as the runtime reports it (cudaGetDeviceProperties).
struct CudaDevice {
  int index = 0;            ///< the N of "cuda:N"
  std::string name;         ///< e.g. "Tesla T4", "NVIDIA A100-SXM4-80GB"
  int major = 0, minor = 0; ///< compute capability, e.g. 7.5 for a T4
  size_t total_memory = 0;  ///< bytes of global memory
  int sm_count = 0;         ///< streaming multiprocessors

  /// "7.5", "8.0", "9.0".
  std::string compute_capability() const;
  /// Compute capability as major*10+minor (75, 80, 89, 90).
  int cc() const { return major * 10 + minor; }
  /// Tensor cores with float16 inputs: Volta (7.0) and later.
  bool fp16_tensor_cores() const { return cc() >= 70; }
  /// bfloat16 arithmetic and bfloat16 tensor cores: Ampere (8.0) and later.
  bool bf16_native() const { return cc() >= 80; }
  /// TensorFloat-32 tensor-core matmul for float32: Ampere (8.0) and later.
  bool tf32() const { return cc() >= 80; }
  /// fp8 (e4m3/e5m2) tensor cores: Ada (8.9) and Hopper (9.0) and later.
  bool fp8() const { return cc() >= 89; }

  bool operator==(const CudaDevice&) const = default;
};

/// Everything ampgrad knows about the hardware it runs on (or a fake, for tests).
struct HardwareProfile {
  CpuFeatures cpu;
  /// The ISA oneDNN dispatches to ("avx512_core_bf16", ...), or
  /// "none (built without oneDNN)".
  std::string onednn_isa;
  /// The instruction set of the elementwise kernels' vector math (hw::vector_math_isa(); a
  /// fake profile: the widest its flags allow).
  std::string vector_math_isa;
  bool built_with_onednn = false;
  bool built_with_cuda = false;
  /// The CUDA devices are emulated on the CPU (ag::cuda_emulated(): an emulated build); each
  /// reports the properties of the GPU it emulates, and decisions treat it as that GPU.
  bool cuda_emulated = false;
  /// Every CUDA device, in index order; empty without CUDA, driver or GPU.
  std::vector<CudaDevice> cuda;

  bool operator==(const HardwareProfile&) const = default;
};

/// The profile of this machine and build, gathered on the first call (thread-safe) and
/// cached: later calls return the same object. Never throws because CUDA is missing.
const HardwareProfile& query();

/// How a (device, dtype) pair is computed.
enum class Support {
  Native,      ///< a fast hardware path for this dtype
  Emulated,    ///< correct, but computed through float32 (slower than native)
  Unsupported  ///< not available on this device / build, or not a compute dtype
};

/// "native", "emulated", "unsupported".
const char* support_name(Support s);

struct Verdict {
  Support support;
  std::string reason;  ///< one sentence naming the feature (or its absence) that decided
};

/// Whether `dtype` is native, emulated or unsupported on `device` for the hardware in
/// `profile`:
/// - float32 and float64: native on the CPU and on any CUDA device that exists;
/// - CPU bfloat16: native with AVX512-BF16 or AMX-BF16, else emulated;
/// - CPU float16: native with AVX512-FP16 or AMX-FP16, else emulated (F16C only converts);
/// - CUDA float16: native from compute capability 7.0 (tensor cores), else emulated;
/// - CUDA bfloat16: native from 8.0, else emulated (e.g. a T4, 7.5);
/// - CUDA anything: unsupported when built without CUDA, with no device, or when the
///   index does not exist;
/// - integer and bool dtypes: unsupported as compute dtypes for mixed precision.
Verdict verdict(const HardwareProfile& profile, Device device, DType dtype);

/// The arithmetic of a float32 product; its result is float32 in every case.
enum class Float32Math {
  Float32,  ///< float32 multiplies and sums
  TF32,     ///< TensorFloat-32 tensor cores: operands rounded to 10 mantissa bits, float32 sums
  BFloat16  ///< operands rounded to bfloat16 (7 mantissa bits), float32 sums
};

/// "float32", "tf32", "bfloat16".
const char* float32_math_name(Float32Math m);

struct Float32ProductVerdict {
  Support support;   ///< Native where the device computes; Unsupported (math unused) where not
  Float32Math math;
  std::string reason;  ///< one sentence naming what decided
};

/// How float32 matmul and linear (and convolutions on CUDA) compute on `device` under
/// `precision` (ag::set_float32_matmul_precision), for the hardware in `profile`:
/// - "highest": float32 everywhere;
/// - CPU: "medium" rounds the operands to bfloat16 where bfloat16 is native there (verdict)
///   in a build with oneDNN, else float32; "high" is float32 (CPUs have no TF32);
/// - CUDA: "high" and "medium" use TF32 tensor cores from compute capability 8.0, float32
///   before; a CUDA device that verdict calls unsupported is unsupported here, its reason
///   the same.
/// The CPU backend decides with this function; ampgrad-info prints it.
Float32ProductVerdict float32_products(const HardwareProfile& profile, Device device,
                                       Float32MatmulPrecision precision);

/// Fake profiles with realistic names, memory sizes and SM counts, for tests and docs.
/// The GPU profiles pair the GPU with a typical host CPU of the machines that carry it.
namespace profiles {
HardwareProfile t4();                  ///< Tesla T4 (7.5, 40 SMs, 15 GiB) on a Skylake Xeon
HardwareProfile a100();                ///< A100-SXM4-80GB (8.0, 108 SMs) on an AMD EPYC 7742
HardwareProfile h200();                ///< H200 (9.0, 132 SMs, ~141 GB) on a Sapphire Rapids Xeon
HardwareProfile cpu_without_avx512();  ///< AVX2/FMA/F16C only (AMD EPYC 7763), no CUDA
HardwareProfile cpu_avx512_bf16();     ///< AVX-512 with BF16 but no FP16 or AMX (AMD EPYC 9654)
HardwareProfile cpu_amx();             ///< Sapphire Rapids: AVX512-BF16/FP16, AMX-BF16
/// The names accepted by by_name: "t4", "a100", "h200", "cpu-without-avx512",
/// "cpu-avx512-bf16", "cpu-amx".
const std::vector<std::string>& names();
/// The fake profile of that name (underscores are accepted for dashes), or nullopt.
std::optional<HardwareProfile> by_name(std::string_view name);
}  // namespace profiles

namespace detail {
/// Implemented by kernels/cuda/backend.cu (cudaGetDeviceProperties; any error gives an
/// empty list and the sticky error is cleared) or by kernels/cuda/stub.cpp (empty list).
std::vector<CudaDevice> query_cuda_devices();
/// Implemented by kernels/cpu/onednn_info.cpp (dnnl::get_effective_cpu_isa as a readable
/// name) or kernels/cpu/eigen_info.cpp ("none (built without oneDNN)").
std::string onednn_isa();
}  // namespace detail

}  // namespace ampgrad::hw
