// Checkpoints survive a process killed while saving: a child saves Lite checkpoints in a
// loop, each one a model whose every weight equals its step counter; the parent kills it
// (SIGKILL) at a different moment each round and loads what is left, which must be one whole
// checkpoint, old or new, never a mix or a torn file.
#include "support/testing.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

using namespace ag;

namespace {

// The model of step i: every weight and bias equal to i.
void fill_model(nn::Linear& m, int64_t i) {
  NoGradGuard no_grad;
  m.weight.fill_(double(i));
  m.bias.fill_(double(i));
}

TEST(CheckpointKill, AKilledSaveLeavesTheOldOrTheNewCheckpointWhole) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("ampgrad-kill-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "ckpt.safetensors").string();
  int64_t loaded_steps = 0;
  for (int round = 0; round < 6; ++round) {
    std::filesystem::remove(path);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // The child: small tensors keep every kernel on this thread (no OpenMP after fork).
      try {
        Lite lite(LiteOptions{.accelerator = "cpu", .precision = "32-true"});
        auto model = std::make_shared<nn::Linear>(48, 40);
        int64_t step = 0;
        for (step = 1;; ++step) {
          fill_model(*model, step);
          lite.save(path, {{"model", model}, {"step", step}});
        }
      } catch (...) {
      }
      ::_exit(3);
    }
    // Wait for the first checkpoint, then kill at a moment that differs per round.
    const auto start = std::chrono::steady_clock::now();
    while (!std::filesystem::exists(path) && std::chrono::steady_clock::now() - start < std::chrono::seconds(20))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::microseconds(3000 + 7919 * round));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the saving child ended by itself (status " << status << ")";
    ASSERT_TRUE(std::filesystem::exists(path)) << "round " << round << ": no checkpoint at all";

    Lite lite(LiteOptions{.accelerator = "cpu", .precision = "32-true"});
    auto model = std::make_shared<nn::Linear>(48, 40);
    int64_t step = -1;
    ASSERT_NO_THROW(lite.load(path, {{"model", model}, {"step", step}})) << "round " << round;
    EXPECT_GE(step, 1);
    const Tensor expect_w = full({40, 48}, double(step)), expect_b = full({40}, double(step));
    EXPECT_TRUE(agt::allclose(model->weight, expect_w, 0, 0)) << "round " << round << ": weights of another step";
    EXPECT_TRUE(agt::allclose(model->bias, expect_b, 0, 0)) << "round " << round;
    loaded_steps += step;
  }
  EXPECT_GT(loaded_steps, 6) << "the kills all landed before a second save: the test exercised nothing";
  std::filesystem::remove_all(dir);
}

}  // namespace
