// Devices: a type (CPU or CUDA) and an index. ag::kCPU and ag::kCUDA convert to a Device,
// and a Device parses from "cpu", "cuda", "cuda:1".
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace ampgrad {

enum class DeviceType : int8_t { CPU = 0, CUDA = 1 };
inline constexpr DeviceType kCPU = DeviceType::CPU;
inline constexpr DeviceType kCUDA = DeviceType::CUDA;
inline constexpr int kNumDeviceTypes = 2;

const char* device_type_name(DeviceType t);

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // CPU: always 0

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(i) {}  // NOLINT: implicit on purpose
  /// Parses "cpu", "cuda", "cuda:N". Throws ag::Error naming the string otherwise.
  Device(std::string_view spec);  // NOLINT
  Device(const char* spec) : Device(std::string_view(spec)) {}  // NOLINT

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;
  friend constexpr bool operator==(const Device& a, const Device& b) {
    return a.type == b.type && a.index == b.index;
  }
};

inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }
inline std::ostream& operator<<(std::ostream& os, DeviceType t) { return os << device_type_name(t); }

}  // namespace ampgrad
