// libFuzzer target: the option strings a user types: precision, accelerator and output
// conversion, parsed and resolved against this machine's hardware profile.
#include <ampgrad/ampgrad.h>

#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ag::hw::HardwareProfile& profile = ag::hw::query();
  const std::string s(reinterpret_cast<const char*>(data), size);
  const std::string half = s.substr(0, s.size() / 2), rest = s.substr(s.size() / 2);
  try {
    (void)ag::parse_precision(s);
  } catch (const ag::Error&) {
  }
  try {
    (void)ag::parse_output_conversion(s);
  } catch (const ag::Error&) {
  }
  try {
    (void)ag::resolve_accelerator(s, profile);
  } catch (const ag::Error&) {
  }
  try {
    (void)ag::resolve_precision(half, rest, profile);
  } catch (const ag::Error&) {
  }
  return 0;
}
