// The test binary runs the emulated CUDA device in strict mode (emu/control.h): queued work
// runs only when something waits for it, so a missing wait gives a wrong answer in the tests
// instead of passing by luck. AMPGRAD_CUDA_EMULATOR_STRICT=0 in the environment turns it off.
//
// After each test the device runs what the test left queued, so that a fault inside a kernel
// (sticky, as on a GPU, where the process could not use the device again) is charged to the
// test that caused it: it is cleared, so the next test starts clean, and the program fails
// at its end naming the test.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "emu/control.h"

namespace {

std::vector<std::string>& offenders() {
  static std::vector<std::string> v;
  return v;
}

class StrictMode : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* env = std::getenv("AMPGRAD_CUDA_EMULATOR_STRICT");
    if (!env || !*env) ampgrad::emu::set_strict(true);
  }
  void TearDown() override {
    for (const std::string& o : offenders()) ADD_FAILURE() << o;
  }
};

class StickyErrors : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo& test) override {
    cudaDeviceSynchronize();
    if (ampgrad::emu::sticky_error() == 0) return;
    offenders().push_back(std::string(test.test_suite_name()) + "." + test.name() +
                          " left a fault inside a kernel (a sticky CUDA error " +
                          std::to_string(ampgrad::emu::sticky_error()) + "): " + ampgrad::emu::last_fault());
    ampgrad::emu::clear_sticky_error();
  }
};

[[maybe_unused]] const bool registered = [] {
  ::testing::AddGlobalTestEnvironment(new StrictMode);
  ::testing::UnitTest::GetInstance()->listeners().Append(new StickyErrors);
  return true;
}();

}  // namespace
