// libFuzzer target: nn::load on arbitrary bytes. Any outcome but a tensor dict or an
// ag::Error (a crash, a sanitizer report, a hang, a huge allocation) is a finding.
#include <ampgrad/ampgrad.h>

#include "fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    ag::nn::Metadata meta;
    const ag::nn::StateDict d = ag::nn::load(fuzz::as_file(data, size, ".safetensors"), &meta);
    for (const auto& [name, t] : d) (void)t.sum();  // touch every tensor's bytes
  } catch (const ag::Error&) {
  }
  return 0;
}
