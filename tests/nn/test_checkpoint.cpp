// nn::save / nn::load: the safetensors layout, every dtype and metadata, errors naming the
// file for short or malformed files, and atomic replacement of an existing file.
#include "support/testing.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

using namespace ag;
namespace fs = std::filesystem;

using namespace agt;  // TempDir, Bytes, error_of, read_bytes, write_bytes
constexpr auto has = agt::contains;

namespace {






// A one-layer GPT of width 8 and its AdamW, trained on one fixed batch of two 4-token rows.
struct TinyRun {
  static nn::GPTConfig config() {
    nn::GPTConfig c;
    c.vocab_size = 7;
    c.block_size = 4;
    c.layers = 1;
    c.heads = 2;
    c.width = 8;
    return c;
  }
  explicit TinyRun(uint64_t seed) : model((manual_seed(seed), config())), opt(model.parameters(), {.lr = 1e-2}) {}
  Tensor logits() { return model.forward(idx); }
  void step() {
    opt.zero_grad();
    cross_entropy(logits().view({8, 7}), targets).backward();
    opt.step();
  }
  void save(const TempDir& dir) {
    nn::save(dir.file("model.safetensors"), model.state_dict(), {{"step", std::to_string(opt.steps())}});
    nn::save(dir.file("optim.safetensors"), opt.state_dict());
  }
  nn::Metadata load(const TempDir& dir) {
    nn::Metadata meta;
    model.load_state_dict(nn::load(dir.file("model.safetensors"), &meta));
    opt.load_state_dict(nn::load(dir.file("optim.safetensors")));
    return meta;
  }

  nn::GPT model;
  optim::AdamW opt;
  const Tensor idx = from_vector<int64_t>({1, 2, 3, 4, 5, 6, 0, 1}, {2, 4});
  const Tensor targets = from_vector<int64_t>({2, 3, 4, 5, 6, 0, 1, 2}, {8});
};

// Byte-exact equality of dtype, shape and contents.
::testing::AssertionResult same_tensor(const Tensor& got, const Tensor& ref) {
  if (got.dtype() != ref.dtype())
    return ::testing::AssertionFailure() << "dtype " << dtype_name(got.dtype()) << " vs " << dtype_name(ref.dtype());
  if (got.sizes() != ref.sizes()) return ::testing::AssertionFailure() << "shape " << got.sizes() << " vs " << ref.sizes();
  Tensor a = got.contiguous(), b = ref.contiguous();
  if (a.nbytes() > 0 && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) != 0) return ::testing::AssertionFailure() << "bytes differ";
  return ::testing::AssertionSuccess();
}

nn::StateDict every_dtype() {
  manual_seed(21);
  nn::StateDict d;
  d["f32"] = randn({2, 3});
  d["f64"] = randn({4}, kFloat64);
  d["f16"] = randn({3, 2}).to(kFloat16);
  d["bf16"] = randn({5}).to(kBFloat16);
  d["i64"] = from_vector<int64_t>({int64_t(1) << 40, -3, 0, INT64_MAX}, {2, 2});
  d["i32"] = from_vector<int32_t>({-7, 2147483647, 5}, {3});
  d["u8"] = from_vector<uint8_t>({0, 255, 17, 128}, {2, 2});
  d["bool"] = from_vector<bool>({true, false, true}, {3});
  d["scalar"] = scalar_tensor(2.5, kFloat64);
  d["empty"] = zeros({0, 3});
  d["nested.name.weight"] = randn({2, 2, 2});
  return d;
}

}  // namespace

TEST(CheckpointSaveLoad, EveryDtypeAndMetadataRoundTrip) {
  TempDir dir;
  const std::string path = dir.file("all.safetensors");
  const auto d = every_dtype();
  const nn::Metadata meta{{"step", "42"}, {"model", "mlp"}, {"note", "quotes \" and \\ kept"}};
  nn::save(path, d, meta);
  nn::Metadata got_meta;
  auto back = nn::load(path, &got_meta);
  EXPECT_EQ(got_meta, meta);
  ASSERT_EQ(back.size(), d.size());
  for (const auto& [k, v] : d) {
    ASSERT_TRUE(back.count(k)) << k;
    EXPECT_TRUE(same_tensor(back.at(k), v)) << k;
    EXPECT_TRUE(back.at(k).device().is_cpu()) << k;
  }
  // loaded tensors own their memory: independent of each other and of the file
  fs::remove(path);
  EXPECT_TRUE(same_tensor(back.at("f32"), d.at("f32")));
  // loading without asking for metadata works too
  nn::save(path, d);
  nn::Metadata none;
  auto again = nn::load(path, &none);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(nn::load(path).size(), d.size());
}

TEST(CheckpointSaveLoad, SafetensorsLayout) {
  TempDir dir;
  const std::string path = dir.file("layout.safetensors");
  nn::StateDict d{{"b", from_vector<float>({1, 2, 3}, {3})},
                  {"a", from_vector<int64_t>({7}, {1, 1})},
                  {"h", from_vector<float>({1, -2}, {2}).to(kBFloat16)},
                  {"m", from_vector<bool>({true}, {1})}};
  nn::save(path, d, {{"format", "pt"}});
  const Bytes bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= uint64_t(bytes[size_t(i)]) << (8 * i);
  ASSERT_LE(8 + hlen, bytes.size());
  EXPECT_EQ((8 + hlen) % 8, 0u);  // data aligned to 8 bytes
  const auto header = nlohmann::json::parse(std::string(bytes.begin() + 8, bytes.begin() + 8 + long(hlen)));
  EXPECT_EQ(header.at("__metadata__").at("format").get<std::string>(), "pt");
  EXPECT_EQ(header.at("b").at("dtype").get<std::string>(), "F32");
  EXPECT_EQ(header.at("a").at("dtype").get<std::string>(), "I64");
  EXPECT_EQ(header.at("h").at("dtype").get<std::string>(), "BF16");
  EXPECT_EQ(header.at("m").at("dtype").get<std::string>(), "BOOL");
  EXPECT_EQ(header.at("a").at("shape").get<std::vector<int64_t>>(), (std::vector<int64_t>{1, 1}));
  // offsets tile the data section exactly, and the data is little-endian raw values
  uint64_t total = 0;
  for (const char* k : {"a", "b", "h", "m"}) {
    auto offs = header.at(k).at("data_offsets").get<std::vector<uint64_t>>();
    ASSERT_EQ(offs.size(), 2u);
    total += offs[1] - offs[0];
  }
  EXPECT_EQ(total, 8 + 12 + 4 + 1);
  EXPECT_EQ(bytes.size(), 8 + hlen + total);
  auto ob = header.at("b").at("data_offsets").get<std::vector<uint64_t>>();
  float f[3];
  std::memcpy(f, bytes.data() + 8 + hlen + ob[0], 12);
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[2], 3.0f);
}

TEST(CheckpointSaveLoad, NonContiguousAndModelRoundTrip) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  Tensor t = arange(12, kFloat32).view({3, 4}).transpose(0, 1);
  nn::save(path, {{"t", t}});
  auto back = nn::load(path);
  EXPECT_EQ(back.at("t").sizes(), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(back.at("t").to_vector<double>(), t.contiguous().to_vector<double>());

  // a model and its optimizer saved, then restored into fresh objects
  TinyRun a(1);
  a.step();
  a.step();
  a.save(dir);
  TinyRun b(2);
  EXPECT_EQ(b.load(dir).at("step"), "2");
  EXPECT_TRUE(agt::allclose(b.logits(), a.logits(), 0, 0));
  a.step();
  b.step();
  EXPECT_TRUE(agt::allclose(b.logits(), a.logits(), 0, 0));
  EXPECT_EQ(b.opt.steps(), 3);
}

// A run resumed from a checkpoint goes on as the uninterrupted run does, bit for bit, with
// the allocator in a different state at each attempt (tensors kept alive between them):
// kernels whose rounding depended on buffer addresses made the two drift apart.
TEST(CheckpointSaveLoad, ResumedTrainingMatchesTheUninterruptedRunWhereverBuffersLie) {
  std::vector<Tensor> keep;
  for (int attempt = 0; attempt < 60; ++attempt) {
    for (int i = 0; i < attempt % 37; ++i) keep.push_back(empty({int64_t(1 + i * 3)}));
    TempDir dir;
    TinyRun a(1);
    a.step();
    a.step();
    a.save(dir);
    for (int i = 0; i < attempt % 11; ++i) keep.push_back(empty({int64_t(5 + i * 7)}));
    TinyRun b(2);
    b.load(dir);
    a.step();
    b.step();
    ASSERT_TRUE(agt::same_bits(b.logits(), a.logits())) << "attempt " << attempt;
    if (keep.size() > 400) keep.clear();
  }
}

TEST(CheckpointErrors, ShortOrGarbageFilesNameTheFile) {
  TempDir dir;
  const std::string good = dir.file("good.safetensors");
  nn::save(good, {{"w", randn({16, 16})}, {"b", randn({16})}});
  const Bytes bytes = read_bytes(good);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= uint64_t(bytes[size_t(i)]) << (8 * i);

  struct Case {
    std::string name;
    Bytes content;
    const char* problem;
  };
  std::vector<Case> cases = {
      {"empty", {}, "too short"},
      {"four", Bytes(bytes.begin(), bytes.begin() + 4), "too short"},
      {"header-cut", Bytes(bytes.begin(), bytes.begin() + 8 + long(hlen) / 2), "exceeds the file size"},
      {"data-cut", Bytes(bytes.begin(), bytes.end() - 100), "outside the file"},
      {"data-cut-1", Bytes(bytes.begin(), bytes.end() - 1), "outside the file"},
  };
  // garbage: text, and random bytes
  const std::string text = "this is not a checkpoint, just some text that is long enough";
  cases.push_back({"text", Bytes(text.begin(), text.end()), "exceeds the file size"});
  Bytes junk(4096);
  uint32_t x = 12345;
  for (auto& c : junk) c = uint8_t((x = x * 1103515245u + 12345u) >> 24);
  cases.push_back({"junk", junk, "exceeds the file size"});
  // a plausible length followed by a header that is not JSON
  Bytes notjson{16, 0, 0, 0, 0, 0, 0, 0};
  for (char c : std::string("{\"w\": [1, 2, 3 ")) notjson.push_back(uint8_t(c));
  notjson.push_back(' ');
  cases.push_back({"notjson", notjson, "malformed header"});
  // JSON, but an entry without the needed fields, or a bad dtype, or a size mismatch
  auto with_header = [](const std::string& h) {
    Bytes b(8 + h.size() + 16, 0);
    for (int i = 0; i < 8; ++i) b[size_t(i)] = uint8_t(uint64_t(h.size()) >> (8 * i));
    for (size_t i = 0; i < h.size(); ++i) b[8 + i] = uint8_t(h[i]);
    return b;
  };
  cases.push_back({"nofields", with_header(R"({"w": {"dtype": "F32"}})"), "malformed entry 'w'"});
  cases.push_back({"dtype", with_header(R"({"w": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}})"),
                   "unsupported dtype 'C64'"});
  cases.push_back({"size", with_header(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})"),
                   "needs 12 bytes but has 8"});
  cases.push_back({"offsets", with_header(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})"),
                   "outside the file"});

  for (const auto& c : cases) {
    const std::string path = dir.file(c.name + ".safetensors");
    write_bytes(path, c.content);
    const std::string msg = error_of([&] { nn::load(path); });
    EXPECT_TRUE(has(msg, "[load]")) << c.name << ": " << msg;
    EXPECT_TRUE(has(msg, path)) << c.name << ": " << msg;
    EXPECT_TRUE(has(msg, c.problem)) << c.name << ": " << msg << "\nexpected: " << c.problem;
  }
  const std::string missing = dir.file("missing.safetensors");
  EXPECT_AG_ERROR(nn::load(missing), missing + ": cannot open");
  // the good file still loads
  EXPECT_EQ(nn::load(good).size(), 2u);
}

TEST(CheckpointSave, ReplacesAtomicallyWithoutLeftovers) {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  nn::save(path, {{"big", randn({256, 256})}}, {{"v", "1"}});
  EXPECT_EQ(dir.listing(), (std::vector<std::string>{"ckpt.safetensors"}));
  const auto size1 = fs::file_size(path);
  // keep the old file open: a rename leaves the reader's view intact, an in-place rewrite would not
  std::ifstream old_reader(path, std::ios::binary);
  Tensor small = from_vector<float>({1, 2}, {2});
  nn::save(path, {{"small", small}}, {{"v", "2"}});
  EXPECT_EQ(dir.listing(), (std::vector<std::string>{"ckpt.safetensors"}));
  EXPECT_LT(fs::file_size(path), size1);
  nn::Metadata meta;
  auto back = nn::load(path, &meta);
  EXPECT_EQ(meta.at("v"), "2");
  ASSERT_EQ(back.size(), 1u);
  EXPECT_TRUE(same_tensor(back.at("small"), small));
  old_reader.seekg(0, std::ios::end);
  EXPECT_EQ(uint64_t(old_reader.tellg()), size1);  // the old file was replaced, not truncated
  // saving into a missing directory fails naming it and leaves nothing behind
  const std::string bad = dir.file("no/such/dir/x.safetensors");
  const std::string msg = error_of([&] { nn::save(bad, {{"small", small}}); });
  EXPECT_TRUE(has(msg, "[save]")) << msg;
  EXPECT_TRUE(has(msg, dir.file("no/such/dir/x.safetensors"))) << msg;
  EXPECT_EQ(dir.listing(), (std::vector<std::string>{"ckpt.safetensors"}));
  // an undefined tensor is refused before anything is written
  EXPECT_AG_ERROR(nn::save(dir.file("u.safetensors"), {{"u", Tensor()}}), "tensor 'u' is undefined");
  EXPECT_EQ(dir.listing(), (std::vector<std::string>{"ckpt.safetensors"}));
}
