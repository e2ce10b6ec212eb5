// CheckpointFolder (keep the newest K, resume from the newest that loads) and the run of
// skipped steps that LiteOptimizer counts on the device.
#include "support/testing.h"

#include <filesystem>
#include <limits>

using namespace ag;
namespace fs = std::filesystem;

namespace {

const hw::HardwareProfile& amx() {
  static const hw::HardwareProfile p = hw::profiles::cpu_amx();
  return p;
}

std::shared_ptr<nn::Sequential> tiny_net() {
  return std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{std::make_shared<nn::Linear>(3, 2)});
}

// A Lite run whose weights are all set to a chosen value before each save, so a loaded
// checkpoint tells which save it came from.
struct Trainee {
  std::shared_ptr<nn::Sequential> net = tiny_net();
  optim::SGD sgd{net->parameters(), {.lr = 0.1}};
  Lite lite{{.accelerator = "cpu", .precision = "32-true", .profile = &amx()}};
  LiteOptimizer opt;
  LiteModule<nn::Sequential> model;
  Trainee() { std::tie(model, opt) = lite.setup(net, sgd); }
  LiteState state() { return {{"model", model}, {"optimizer", opt}}; }
  void set_weights(double v) {
    NoGradGuard ng;
    for (Tensor& p : net->parameters()) p.fill_(v);
  }
  double weight() const { return net->parameters()[0].detach().flatten().to_vector<float>()[0]; }
};

std::vector<std::string> names(const CheckpointFolder& f) {
  std::vector<std::string> out;
  for (const auto& e : f.list()) out.push_back(fs::path(e.path).filename().string());
  return out;
}

}  // namespace

TEST(CheckpointFolder, SaveKeepsTheNewestKAndTouchesNothingElse) {
  agt::TempDir tmp;
  const std::string dir = tmp.file("run");  // created by the first save
  CheckpointFolder folder(dir, {.keep = 2});
  EXPECT_TRUE(folder.list().empty());
  Trainee run;
  fs::create_directories(dir);
  // Files that are not this folder's checkpoints stay, whatever their names look like.
  const std::vector<std::string> others = {"notes.txt", "epoch-x.safetensors", "epoch-0001.safetensors.tmp.77",
                                           "step-0001.safetensors", "epoch-.safetensors"};
  for (const auto& o : others) agt::write_bytes(dir + "/" + o, {1, 2, 3});
  for (int n = 1; n <= 5; ++n) {
    run.set_weights(n);
    EXPECT_EQ(folder.save(run.lite, run.state(), n), dir + "/epoch-000" + std::to_string(n) + ".safetensors");
  }
  EXPECT_EQ(names(folder), (std::vector<std::string>{"epoch-0005.safetensors", "epoch-0004.safetensors"}));
  for (const auto& o : others) EXPECT_TRUE(fs::exists(dir + "/" + o)) << o;
  // Each kept file is the save of its number, whole.
  for (const auto& e : folder.list()) {
    Trainee fresh;
    fresh.lite.load(e.path, fresh.state());
    EXPECT_EQ(fresh.weight(), double(e.number)) << e.path;
  }
}

TEST(CheckpointFolder, NumbersOrderNumericallyAndTheFileJustWrittenStays) {
  agt::TempDir tmp;
  CheckpointFolder folder(tmp.file("run"), {.keep = 2});
  Trainee run;
  for (int64_t n : {9, 100000, 10}) folder.save(run.lite, run.state(), n);
  // keep 2: 10 was written last and stays even though 100000 is higher; 9 goes.
  EXPECT_EQ(names(folder), (std::vector<std::string>{"epoch-100000.safetensors", "epoch-0010.safetensors"}));
  EXPECT_EQ(folder.list().front().number, 100000);
}

TEST(CheckpointFolder, LoadNewestSkipsWhatDoesNotLoadAndSaysWhy) {
  agt::TempDir tmp;
  const std::string dir = tmp.file("run");
  CheckpointFolder folder(dir, {.keep = 5});
  Trainee run;
  for (int n = 1; n <= 4; ++n) {
    run.set_weights(n);
    folder.save(run.lite, run.state(), n);
  }
  // 4: cut short, as a full disk might leave a file written by another tool.
  const auto bytes = agt::read_bytes(folder.path_for(4));
  agt::write_bytes(folder.path_for(4), agt::Bytes(bytes.begin(), bytes.begin() + long(bytes.size() / 2)));
  // 3: a checkpoint of a different state (an extra item: a strict load refuses it).
  {
    double extra = 1;
    run.set_weights(3);
    LiteState more = run.state();
    more.emplace("extra", StateItem(extra));
    run.lite.save(folder.path_for(3), more);
  }
  // 2: rejected by the caller's own check.
  const auto accept = [&](const std::string& path, const nn::Metadata&) {
    AG_CHECK(path != folder.path_for(2), "test", "refused on purpose");
  };
  Trainee fresh;
  const auto r = folder.load_newest(fresh.lite, fresh.state(), accept);
  EXPECT_EQ(r.path, folder.path_for(1));
  EXPECT_EQ(r.number, 1);
  EXPECT_EQ(fresh.weight(), 1.0);
  ASSERT_EQ(r.skipped.size(), 3u);
  EXPECT_EQ(r.skipped[0].path, folder.path_for(4));
  // The reason without the path in front (the entry has it).
  EXPECT_EQ(r.skipped[0].reason.rfind("header length ", 0), 0u) << r.skipped[0].reason;
  EXPECT_TRUE(agt::contains(r.skipped[0].reason, "exceeds the file size")) << r.skipped[0].reason;
  EXPECT_EQ(r.skipped[1].path, folder.path_for(3));
  EXPECT_TRUE(agt::contains(r.skipped[1].reason, "\"extra\"")) << r.skipped[1].reason;
  EXPECT_EQ(r.skipped[2].path, folder.path_for(2));
  EXPECT_EQ(r.skipped[2].reason, "refused on purpose");
  // Nothing is deleted or rewritten by a load.
  EXPECT_EQ(names(folder).size(), 4u);
}

TEST(CheckpointFolder, ErrorsNameTheFolderAndEveryReason) {
  agt::TempDir tmp;
  Trainee run;
  const std::string dir = tmp.file("run");
  EXPECT_EQ(agt::error_of([&] { CheckpointFolder(dir).load_newest(run.lite, run.state()); }),
            "[CheckpointFolder] " + dir + " holds no checkpoint (epoch-<number>.safetensors)");
  CheckpointFolder folder(dir);
  folder.save(run.lite, run.state(), 1);
  folder.save(run.lite, run.state(), 2);
  agt::write_bytes(folder.path_for(1), {1, 2, 3});
  agt::write_bytes(folder.path_for(2), {});
  const std::string e = agt::error_of([&] { folder.load_newest(run.lite, run.state()); });
  EXPECT_TRUE(agt::contains(e, "[CheckpointFolder] " + dir + ": no checkpoint loads:")) << e;
  EXPECT_TRUE(agt::contains(e, folder.path_for(2) + ": ")) << e;
  EXPECT_TRUE(agt::contains(e, folder.path_for(1) + ": ")) << e;
  EXPECT_TRUE(agt::contains(e, "too short for a safetensors file (0 bytes)")) << e;
  EXPECT_TRUE(agt::contains(e, "too short for a safetensors file (3 bytes)")) << e;

  EXPECT_EQ(agt::error_of([&] { CheckpointFolder(dir, {.keep = 0}); }),
            "[CheckpointFolder] keep must be at least 1, got 0");
  EXPECT_EQ(agt::error_of([&] { CheckpointFolder(dir, {.prefix = "../x"}); }),
            "[CheckpointFolder] the prefix must be letters, digits, '_' or '.', got \"../x\"");
  EXPECT_EQ(agt::error_of([&] { CheckpointFolder(folder.path_for(1)); }),
            "[CheckpointFolder] " + folder.path_for(1) + " exists and is not a folder");
  EXPECT_EQ(agt::error_of([&] { folder.path_for(-1); }),
            "[CheckpointFolder] a checkpoint's number must be non-negative, got -1");
}

// The metadata alone comes from the header, after the same checks as a full load.
TEST(CheckpointFolder, LoadMetadataReadsTheHeaderOnly) {
  agt::TempDir tmp;
  const std::string path = tmp.file("m.safetensors");
  nn::save(path, {{"w", ones({1000})}}, {{"kind", "mlp"}});
  EXPECT_EQ(nn::load_metadata(path), (nn::Metadata{{"kind", "mlp"}}));
  auto bytes = agt::read_bytes(path);
  bytes.resize(bytes.size() - 4);  // the data is short: the header's offsets leave the file
  agt::write_bytes(path, bytes);
  EXPECT_TRUE(agt::contains(agt::error_of([&] { nn::load_metadata(path); }), "outside the file's")) << path;
}

// The run of skipped steps: counted on the device, reset by a step that updates.
TEST(LiteMixed16, ConsecutiveSkipsCountTheRunAndResetOnAStep) {
  manual_seed(3);
  auto net = tiny_net();
  optim::SGD sgd(net->parameters(), {.lr = 0.1});
  Lite lite({.accelerator = "cpu", .precision = "16-mixed", .scaler = {.init_scale = 256.0}, .profile = &amx()});
  auto set_up = lite.setup(net, sgd);  // named members: the lambda below captures them
  auto& model = set_up.first;
  auto& opt = set_up.second;
  bool poison = false;
  net->parameters()[0].register_hook(
      [&](const Tensor& g) { return poison ? g * std::numeric_limits<float>::infinity() : g; });
  const Tensor x = randn({4, 3}), y = randint(0, 2, {4});
  const auto iteration = [&](bool inf) {
    poison = inf;
    opt.zero_grad();
    lite.backward(cross_entropy(model(x), y));
    return bool(opt.step());
  };
  EXPECT_EQ(opt.consecutive_skips(), 0);
  EXPECT_TRUE(iteration(false));
  std::vector<int64_t> runs;
  for (bool inf : {true, true, true, false, true}) {
    EXPECT_EQ(iteration(inf), !inf);
    runs.push_back(opt.consecutive_skips());
  }
  EXPECT_EQ(runs, (std::vector<int64_t>{1, 2, 3, 0, 1}));
  EXPECT_EQ(opt.steps_skipped(), 4);
  EXPECT_EQ(opt.steps_taken(), 2);
}
