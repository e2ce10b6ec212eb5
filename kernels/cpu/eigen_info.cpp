// The hardware profile's oneDNN ISA in a build without oneDNN (onednn_info.cpp otherwise).
#include "ampgrad/hw/profile.h"

namespace ampgrad::hw::detail {
std::string onednn_isa() { return "none (built without oneDNN)"; }
}  // namespace ampgrad::hw::detail
