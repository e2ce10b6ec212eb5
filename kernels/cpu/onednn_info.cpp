// The ISA oneDNN will actually dispatch to on this machine (after its own cpuid checks and
// any DNNL_MAX_CPU_ISA / ONEDNN_MAX_CPU_ISA limit), as a readable name for the hardware
// profile. Built only with oneDNN; eigen_info.cpp answers otherwise.
#include <oneapi/dnnl/dnnl.hpp>

#include <cstdio>
#include <string>

#include "ampgrad/hw/profile.h"

namespace ampgrad::hw::detail {

std::string onednn_isa() {
  // Switch on the C values so that a newer oneDNN's extra ISAs fall into `default`.
  const dnnl_cpu_isa_t isa = static_cast<dnnl_cpu_isa_t>(dnnl::get_effective_cpu_isa());
  switch (isa) {
    case dnnl_cpu_isa_all: return "all";
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: break;
  }
  return "isa 0x" + [&] {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%x", unsigned(isa));
    return std::string(buf);
  }();
}

}  // namespace ampgrad::hw::detail
