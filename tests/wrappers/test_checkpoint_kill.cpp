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
    // Wait until the child has saved round + 2 checkpoints (read while it writes: each read
    // must see a whole one too), then kill it at a moment that differs per round.
    const auto start = std::chrono::steady_clock::now();
    int64_t seen = 0;
    while (seen < round + 2 && std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
      if (std::filesystem::exists(path)) {
        Lite reader(LiteOptions{.accelerator = "cpu", .precision = "32-true"});
        auto m = std::make_shared<nn::Linear>(48, 40);
        int64_t s = -1;
        ASSERT_NO_THROW(reader.load(path, {{"model", m}, {"step", s}})) << "a read during the saves";
        EXPECT_TRUE(agt::allclose(m->weight, full({40, 48}, double(s)), 0, 0)) << "a read during the saves";
        seen = s;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(1300 * round));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the saving child ended by itself (status " << status << ")";
    ASSERT_TRUE(std::filesystem::exists(path)) << "round " << round << ": no checkpoint at all";

    Lite lite(LiteOptions{.accelerator = "cpu", .precision = "32-true"});
    auto model = std::make_shared<nn::Linear>(48, 40);
    int64_t step = -1;
    ASSERT_NO_THROW(lite.load(path, {{"model", model}, {"step", step}})) << "round " << round;
    EXPECT_GE(step, round + 2) << "the child was too slow to save round + 2 checkpoints in 30 s";
    const Tensor expect_w = full({40, 48}, double(step)), expect_b = full({40}, double(step));
    EXPECT_TRUE(agt::allclose(model->weight, expect_w, 0, 0)) << "round " << round << ": weights of another step";
    EXPECT_TRUE(agt::allclose(model->bias, expect_b, 0, 0)) << "round " << round;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
