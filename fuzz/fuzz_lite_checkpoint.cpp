// libFuzzer target: Lite::load of arbitrary bytes into a small model, its AdamW optimizer,
// a scheduler and a step counter under 16-mixed (so the grad scaler's state is read too).
// A load either restores state or throws ag::Error; nothing else is allowed.
#include <ampgrad/ampgrad.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "fuzz_file.h"

namespace {
struct Setup {
  ag::Lite lite{ag::LiteOptions{.accelerator = "cpu", .precision = "16-mixed"}};
  std::shared_ptr<ag::nn::Linear> net = std::make_shared<ag::nn::Linear>(3, 2);
  ag::optim::AdamW opt{net->parameters(), {}};
  int64_t step = 0;
};
}  // namespace

Setup& setup() {
  static Setup* s = new Setup();
  return *s;
}

// A valid checkpoint of this build's format as the seed, written into
// $AMPGRAD_FUZZ_SEED_DIR when set (scripts/fuzz sets it to the working corpus).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("AMPGRAD_FUZZ_SEED_DIR")) {
    Setup& s = setup();
    s.lite.save(std::string(dir) + "/valid.safetensors", {{"model", s.net}, {"optimizer", s.opt}, {"step", s.step}});
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Setup* s = &setup();
  try {
    s->lite.load(fuzz::as_file(data, size, ".safetensors"), {{"model", s->net}, {"optimizer", s->opt}, {"step", s->step}});
  } catch (const ag::Error&) {
  }
  return 0;
}
