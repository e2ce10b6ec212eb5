// The safetensors format to the byte (huggingface/safetensors, "Format"): an 8-byte
// little-endian header length N, N bytes of UTF-8 JSON starting with '{' (padded with
// spaces), then the data buffer, each tensor at data_offsets [begin, end) relative to the
// buffer's start, tensors covering the buffer with no hole and no overlap.
//
// Here: a file assembled by hand from the spec loads; what nn::save writes is checked byte
// by byte; every malformed file is refused with a message naming the file and the problem;
// every dtype round-trips; and files go both ways with the Python `safetensors` package
// (tests/interop/safetensors_interop.py), which scripts/install-test-deps installs.
#include "support/testing.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

using namespace ag;
namespace fs = std::filesystem;

using namespace agt;  // TempDir, Bytes, error_of, read_bytes, write_bytes
constexpr auto has = agt::contains;

namespace {

static_assert(std::endian::native == std::endian::little, "the byte-level checks assume a little-endian host");

// n bytes of v, least significant first: the spec's byte order, written out by hand.
void put_le(Bytes& b, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b.push_back(uint8_t(v >> (8 * i)));
}

// A whole file: the length prefix, the header text padded with spaces to a multiple of 8
// (plus `extra_spaces`), then the data buffer.
Bytes st_file(std::string header, const Bytes& data, size_t extra_spaces = 0) {
  header.append((8 - header.size() % 8) % 8 + extra_spaces, ' ');
  Bytes b;
  put_le(b, header.size(), 8);
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

uint64_t u64_at(const Bytes& b, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(b[at + size_t(i)]) << (8 * i);
  return v;
}

// Byte-exact equality of dtype, shape and contents (NaN payloads and signed zeros included).
::testing::AssertionResult same_tensor(const Tensor& got, const Tensor& ref) {
  if (got.dtype() != ref.dtype())
    return ::testing::AssertionFailure() << "dtype " << dtype_name(got.dtype()) << " vs " << dtype_name(ref.dtype());
  if (got.sizes() != ref.sizes()) return ::testing::AssertionFailure() << "shape " << got.sizes() << " vs " << ref.sizes();
  Tensor a = got.contiguous(), b = ref.contiguous();
  if (a.nbytes() > 0 && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) != 0)
    return ::testing::AssertionFailure() << "bytes differ";
  return ::testing::AssertionSuccess();
}

Bytes bytes_of(const Tensor& t) {
  Tensor c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.raw_data());
  return Bytes(p, p + c.nbytes());
}

}  // namespace

// (a) A file written from the specification alone, byte by byte: the header lists the
// tensors in another order than the data holds them, and ag::nn::load reads them all.
TEST(SafetensorsSpec, FileAssembledByHandLoads) {
  // The data buffer, in the order BOOL, BF16, I64, F32 (the header lists them otherwise).
  Bytes data;
  for (uint8_t v : {1, 0, 0, 1}) put_le(data, v, 1);                             // m: BOOL [4]   at [0, 4)
  for (uint16_t v : {0x3F80, 0xC020, 0x3E20}) put_le(data, v, 2);                // h: BF16 [3]   at [4, 10)
  for (uint64_t v : {uint64_t(1) << 40, ~uint64_t(0)}) put_le(data, v, 8);       // n: I64 [2]    at [10, 26)
  for (uint32_t v : {0x3F800000u, 0xC0000000u, 0x3F000000u, 0x40400000u}) put_le(data, v, 4);  // w: F32 [2, 2] at [26, 42)
  ASSERT_EQ(data.size(), 42u);
  const std::string header =
      R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[26,42]},)"
      R"("__metadata__":{"format":"pt","step":"7"},)"
      R"("h":{"dtype":"BF16","shape":[3],"data_offsets":[4,10]},)"
      R"("n":{"dtype":"I64","shape":[2],"data_offsets":[10,26]},)"
      R"("m":{"dtype":"BOOL","shape":[4],"data_offsets":[0,4]}})";

  TempDir dir;
  // the header padded to a multiple of 8 as writers do, and padded further (any trailing
  // whitespace is allowed)
  for (size_t extra : {0, 24}) {
    const std::string path = dir.file("hand" + std::to_string(extra) + ".safetensors");
    const Bytes file = st_file(header, data, extra);
    ASSERT_EQ((file.size() - data.size()) % 8, 0u);
    write_bytes(path, file);
    nn::Metadata meta;
    const nn::StateDict d = nn::load(path, &meta);
    EXPECT_EQ(meta, (nn::Metadata{{"format", "pt"}, {"step", "7"}}));
    ASSERT_EQ(d.size(), 4u);
    EXPECT_EQ(d.at("w").dtype(), kFloat32);
    EXPECT_EQ(d.at("w").sizes(), (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(d.at("w").to_vector<float>(), (std::vector<float>{1.0f, -2.0f, 0.5f, 3.0f}));
    EXPECT_EQ(d.at("h").dtype(), kBFloat16);
    EXPECT_EQ(d.at("h").sizes(), (std::vector<int64_t>{3}));
    EXPECT_EQ(d.at("h").to_vector<float>(), (std::vector<float>{1.0f, -2.5f, 0.15625f}));
    EXPECT_EQ(d.at("n").dtype(), kInt64);
    EXPECT_EQ(d.at("n").to_vector<int64_t>(), (std::vector<int64_t>{int64_t(1) << 40, -1}));
    EXPECT_EQ(d.at("m").dtype(), kBool);
    EXPECT_EQ(d.at("m").sizes(), (std::vector<int64_t>{4}));
    EXPECT_EQ(d.at("m").to_vector<bool>(), (std::vector<bool>{true, false, false, true}));
  }

  // Empty tensors and a scalar ([] holds one element); an empty file body is fine too.
  Bytes scalar_data;
  put_le(scalar_data, 0x4004000000000000, 8);  // 2.5 as F64
  const std::string path = dir.file("edge.safetensors");
  write_bytes(path, st_file(R"({"e":{"dtype":"F16","shape":[0,3],"data_offsets":[8,8]},)"
                            R"("s":{"dtype":"F64","shape":[],"data_offsets":[0,8]},)"
                            R"("z":{"dtype":"I32","shape":[0],"data_offsets":[0,0]}})",
                            scalar_data));
  const nn::StateDict d = nn::load(path);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d.at("e").sizes(), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(d.at("e").dtype(), kFloat16);
  EXPECT_EQ(d.at("s").dim(), 0);
  EXPECT_EQ(d.at("s").to_vector<double>(), (std::vector<double>{2.5}));
  EXPECT_EQ(d.at("z").sizes(), (std::vector<int64_t>{0}));
  write_bytes(path, st_file("{}", {}));
  nn::Metadata meta;
  EXPECT_TRUE(nn::load(path, &meta).empty());
  EXPECT_TRUE(meta.empty());
}

// A BOOL byte other than 0 and 1 (numpy reads it as true) loads as true, never as an
// invalid C++ bool.
TEST(SafetensorsSpec, BoolBytesBeyondOneLoadAsTrue) {
  TempDir dir;
  const std::string path = dir.file("bool.safetensors");
  write_bytes(path, st_file(R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", {2, 0, 255}));
  const Tensor m = nn::load(path).at("m");
  EXPECT_EQ(bytes_of(m), (Bytes{1, 0, 1}));
}

// (b) What nn::save writes, byte by byte.
TEST(SafetensorsSpec, SaveWritesTheLayoutByteForByte) {
  TempDir dir;
  const std::string path = dir.file("saved.safetensors");
  const nn::StateDict d{{"a", from_vector<float>({1.0f, -2.5f, 0.15625f}, {3}).to(kBFloat16)},
                        {"m", from_vector<bool>({true, false, false, true}, {4})},
                        {"n", from_vector<int64_t>({int64_t(1) << 40, -1}, {2})},
                        {"w", from_vector<float>({1.0f, -2.0f, 0.5f, 3.0f}, {2, 2})}};
  nn::save(path, d, {{"step", "7"}, {"format", "pt"}});
  const Bytes file = read_bytes(path);
  ASSERT_GE(file.size(), 8u);
  const uint64_t hlen = u64_at(file, 0);
  ASSERT_LE(8 + hlen, file.size());
  EXPECT_EQ(hlen % 8, 0u);
  const std::string header(file.begin() + 8, file.begin() + 8 + long(hlen));
  ASSERT_FALSE(header.empty());
  EXPECT_EQ(header.front(), '{');
  // the JSON ends at the last '}', and fewer than 8 spaces follow it
  const size_t close = header.find_last_of('}');
  ASSERT_NE(close, std::string::npos);
  EXPECT_EQ(header.substr(close + 1), std::string(header.size() - close - 1, ' '));
  EXPECT_LT(header.size() - close - 1, 8u);
  const auto h = nlohmann::json::parse(header);
  EXPECT_EQ(h.at("__metadata__"), (nlohmann::json{{"format", "pt"}, {"step", "7"}}));
  EXPECT_EQ(h.size(), 5u);

  // The data follows in the order the entries were written, each tensor starting where
  // the previous one ended, and holds exactly the little-endian values.
  const std::map<std::string, std::pair<const char*, Bytes>> want = [] {
    std::map<std::string, std::pair<const char*, Bytes>> w;
    Bytes a, m, n, x;
    for (uint16_t v : {0x3F80, 0xC020, 0x3E20}) put_le(a, v, 2);
    for (uint8_t v : {1, 0, 0, 1}) put_le(m, v, 1);
    for (uint64_t v : {uint64_t(1) << 40, ~uint64_t(0)}) put_le(n, v, 8);
    for (uint32_t v : {0x3F800000u, 0xC0000000u, 0x3F000000u, 0x40400000u}) put_le(x, v, 4);
    w["a"] = {"BF16", a};
    w["m"] = {"BOOL", m};
    w["n"] = {"I64", n};
    w["w"] = {"F32", x};
    return w;
  }();
  uint64_t at = 0;
  for (const auto& [name, t] : d) {  // save writes the StateDict's (sorted) order
    const auto& e = h.at(name);
    EXPECT_EQ(e.at("dtype"), want.at(name).first) << name;
    EXPECT_EQ(e.at("shape").get<std::vector<int64_t>>(), t.sizes().vec()) << name;
    const auto offs = e.at("data_offsets").get<std::vector<uint64_t>>();
    ASSERT_EQ(offs.size(), 2u) << name;
    EXPECT_EQ(offs[0], at) << name;
    EXPECT_EQ(offs[1] - offs[0], t.nbytes()) << name;
    const Bytes got(file.begin() + long(8 + hlen + offs[0]), file.begin() + long(8 + hlen + offs[1]));
    EXPECT_EQ(got, want.at(name).second) << name;
    EXPECT_EQ(got, bytes_of(t)) << name;
    at = offs[1];
  }
  EXPECT_EQ(file.size(), 8 + hlen + at);  // nothing after the last tensor

  // No tensors and no metadata: the smallest file, "{}" padded to 8.
  nn::save(path, {});
  Bytes empty;
  put_le(empty, 8, 8);
  for (char c : std::string("{}      ")) empty.push_back(uint8_t(c));
  EXPECT_EQ(read_bytes(path), empty);
}

// Names that the format cannot hold are refused before anything is written.
TEST(SafetensorsSpec, SaveRefusesReservedAndInvalidNames) {
  TempDir dir;
  const std::string path = dir.file("x.safetensors");
  const Tensor t = from_vector<float>({1}, {1});
  EXPECT_AG_ERROR(nn::save(path, {{"__metadata__", t}}), "'__metadata__' is reserved");
  EXPECT_AG_ERROR(nn::save(path, {{"bad\xff", t}}), path + ": cannot write the header");
  EXPECT_AG_ERROR(nn::save(path, {{"w", t}}, {{"k", "bad\xff"}}), path + ": cannot write the header");
  EXPECT_TRUE(dir.listing().empty());
}

// (c) Each malformed file is refused with an ag::Error naming the file and the problem.
TEST(SafetensorsSpec, MalformedFilesAreRefused) {
  const Bytes f32x4(16, 0);  // room for four F32
  auto one = [&](const std::string& entry) { return st_file(R"({"w":)" + entry + "}", f32x4); };
  struct Case {
    std::string name;
    Bytes content;
    std::string problem;
  };
  std::vector<Case> cases;
  {  // header length past the end of the file
    Bytes b;
    put_le(b, 1000, 8);
    for (char c : std::string("{}      ")) b.push_back(uint8_t(c));
    cases.push_back({"hlen-past-end", b, "header length 1000 exceeds the file size 16"});
  }
  {  // header length 0: no '{'
    Bytes b;
    put_le(b, 0, 8);
    cases.push_back({"hlen-zero", b, "header does not start with '{'"});
  }
  cases.push_back({"leading-space", st_file(R"( {"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", f32x4),
                   "header does not start with '{'"});
  cases.push_back({"array", st_file("[]", {}), "header does not start with '{'"});
  cases.push_back({"bad-json", st_file(R"({"w":{"dtype":"F32",)", f32x4), "malformed header"});
  cases.push_back({"trailing-junk", st_file(R"({}x)", {}), "malformed header"});
  cases.push_back({"duplicate-name",
                   st_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", f32x4),
                   "the name 'w' appears twice"});
  cases.push_back({"nul-padding", [] {
                     Bytes b;
                     put_le(b, 8, 8);
                     for (char c : std::string("{}")) b.push_back(uint8_t(c));
                     b.resize(16, 0);
                     return b;
                   }(),
                   "malformed header: a NUL byte at offset 2"});
  cases.push_back({"nul-then-junk", st_file(std::string("{}\0junk", 7), {}), "malformed header: a NUL byte at offset 2"});
  // unknown dtypes, including real safetensors dtypes ampgrad has no tensor type for
  cases.push_back({"dtype-c64", one(R"({"dtype":"C64","shape":[2],"data_offsets":[0,16]})"), "unsupported dtype 'C64'"});
  cases.push_back({"dtype-u16", one(R"({"dtype":"U16","shape":[8],"data_offsets":[0,16]})"), "unsupported dtype 'U16'"});
  cases.push_back({"dtype-lower", one(R"({"dtype":"f32","shape":[4],"data_offsets":[0,16]})"), "unsupported dtype 'f32'"});
  cases.push_back({"dtype-number", one(R"({"dtype":7,"shape":[4],"data_offsets":[0,16]})"), "malformed entry 'w'"});
  cases.push_back({"no-offsets", one(R"({"dtype":"F32","shape":[4]})"), "malformed entry 'w'"});
  cases.push_back({"not-object", one(R"([1, 2])"), "malformed entry 'w'"});
  // shape and offsets that disagree
  cases.push_back({"size-short", one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,16]})"),
                   "tensor 'w' of dtype F32 and shape [3] needs 12 bytes but has 16"});
  cases.push_back({"size-long", one(R"({"dtype":"F64","shape":[2,2],"data_offsets":[0,16]})"),
                   "tensor 'w' of dtype F64 and shape [2, 2] needs 32 bytes but has 16"});
  cases.push_back({"size-overflow", one(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]})"),
                   "needs more than 2^64 bytes but has 16"});
  cases.push_back({"shape-negative", one(R"({"dtype":"F32","shape":[-4],"data_offsets":[0,16]})"),
                   "tensor 'w' has shape [-4], not a list of non-negative integers"});
  cases.push_back({"shape-float", one(R"({"dtype":"F32","shape":[4.0],"data_offsets":[0,16]})"),
                   "not a list of non-negative integers"});
  cases.push_back({"shape-huge", one(R"({"dtype":"F32","shape":[0,9223372036854775808],"data_offsets":[0,0]})"),
                   "not a list of non-negative integers"});
  // offsets out of the buffer
  cases.push_back({"offsets-past-end", one(R"({"dtype":"F32","shape":[5],"data_offsets":[0,20]})"),
                   "tensor 'w' has data offsets [0,20] outside the file's 16 data bytes"});
  cases.push_back({"offsets-reversed", one(R"({"dtype":"F32","shape":[2],"data_offsets":[8,0]})"), "outside the file"});
  cases.push_back({"offsets-three", one(R"({"dtype":"F32","shape":[4],"data_offsets":[0,8,16]})"), "outside the file"});
  cases.push_back({"offsets-negative", one(R"({"dtype":"F32","shape":[4],"data_offsets":[-1,15]})"),
                   "data_offsets [-1,15], not a list of non-negative integers"});
  // overlaps and holes
  cases.push_back({"overlap", st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                      R"("b":{"dtype":"F32","shape":[3],"data_offsets":[4,16]}})", f32x4),
                   "tensors 'a' and 'b' overlap: data offsets [0, 8) and [4, 16)"});
  cases.push_back({"same-bytes", st_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                         R"("b":{"dtype":"I32","shape":[4],"data_offsets":[0,16]}})", f32x4),
                   "overlap"});
  cases.push_back({"hole-middle", st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", f32x4),
                   "hole in the data: bytes [4, 8) belong to no tensor"});
  cases.push_back({"hole-start", one(R"({"dtype":"F32","shape":[3],"data_offsets":[4,16]})"),
                   "hole in the data: bytes [0, 4) belong to no tensor"});
  cases.push_back({"hole-end", one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,12]})"),
                   "hole in the data: bytes [12, 16) belong to no tensor"});
  cases.push_back({"no-tensors-but-data", st_file("{}", f32x4), "hole in the data: bytes [0, 16) belong to no tensor"});
  // metadata must be a map of strings
  const std::string w = R"("w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]})";
  cases.push_back({"meta-number", st_file(R"({"__metadata__":{"step":3},)" + w + "}", f32x4),
                   "__metadata__ value of 'step' is not a string: 3"});
  cases.push_back({"meta-nested", st_file(R"({"__metadata__":{"cfg":{"lr":"1"}},)" + w + "}", f32x4),
                   "__metadata__ value of 'cfg' is not a string"});
  cases.push_back({"meta-not-map", st_file(R"({"__metadata__":"pt",)" + w + "}", f32x4),
                   "__metadata__ is not a map of strings"});

  TempDir dir;
  for (const auto& c : cases) {
    const std::string path = dir.file(c.name + ".safetensors");
    write_bytes(path, c.content);
    const std::string msg = error_of([&] { nn::load(path); });
    EXPECT_TRUE(has(msg, "[load] " + path + ": ")) << c.name << ": " << msg;
    EXPECT_TRUE(has(msg, c.problem)) << c.name << ": " << msg << "\nexpected: " << c.problem;
  }
  // a failed load leaves the caller's metadata alone
  nn::Metadata meta{{"kept", "yes"}};
  EXPECT_AG_ERROR(nn::load(dir.file("meta-number.safetensors"), &meta), "not a string");
  EXPECT_EQ(meta, (nn::Metadata{{"kept", "yes"}}));
}

// The Python library refuses headers over 100 MB; so does load, before allocating one. The
// file is sparse: its length is real, its blocks are not.
TEST(SafetensorsSpec, HeaderOverTheLimitIsRefused) {
  TempDir dir;
  const std::string path = dir.file("huge.safetensors");
  Bytes b;
  put_le(b, 100'000'001, 8);
  b.push_back('{');
  write_bytes(path, b);
  fs::resize_file(path, 8 + 100'000'001);
  EXPECT_AG_ERROR(nn::load(path), path + ": header length 100000001 is over the safetensors limit of 100000000 bytes");
}

// (d) Every dtype, with scalars (shape []) and empty tensors, and special float values,
// comes back bit for bit.
TEST(SafetensorsSpec, EveryDtypeRoundTripsWithScalarsAndEmptyTensors) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  nn::StateDict d;
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    const std::string n = dtype_name(dt);
    d[n + ".values"] = from_vector<double>({1.5, -0.0, inf, -inf, nan, 3e-5}, {2, 3}).to(dt);
    d[n + ".scalar"] = scalar_tensor(-2.25, dt);
    d[n + ".empty"] = empty({0}, dt);
    d[n + ".empty3d"] = empty({3, 0, 2}, dt);
  }
  d["int64.values"] = from_vector<int64_t>({INT64_MIN, -1, 0, INT64_MAX}, {2, 2});
  d["int32.values"] = from_vector<int32_t>({INT32_MIN, -1, 0, INT32_MAX}, {4, 1});
  d["uint8.values"] = from_vector<uint8_t>({0, 1, 128, 255}, {1, 4});
  d["bool.values"] = from_vector<bool>({true, false, true}, {3});
  for (DType dt : {kInt64, kInt32, kUInt8, kBool}) {
    const std::string n = dtype_name(dt);
    d[n + ".scalar"] = scalar_tensor(1, dt);
    d[n + ".empty"] = empty({0, 5}, dt);
  }
  TempDir dir;
  const std::string path = dir.file("all.safetensors");
  nn::save(path, d, {{"empty", ""}, {"unicode", "\xc3\xa9t\xc3\xa9 \xe2\x9c\x93"}});
  nn::Metadata meta;
  const nn::StateDict back = nn::load(path, &meta);
  EXPECT_EQ(meta, (nn::Metadata{{"empty", ""}, {"unicode", "\xc3\xa9t\xc3\xa9 \xe2\x9c\x93"}}));
  ASSERT_EQ(back.size(), d.size());
  for (const auto& [k, v] : d) {
    ASSERT_TRUE(back.count(k)) << k;
    EXPECT_TRUE(same_tensor(back.at(k), v)) << k;
  }
  EXPECT_EQ(back.at("float32.scalar").dim(), 0);
  EXPECT_EQ(back.at("float32.scalar").to_vector<double>(), (std::vector<double>{-2.25}));
}

// ---- interop with the Python `safetensors` package --------------------------------------

namespace {

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// AMPGRAD_TEST_PYTHON, else the venv scripts/install-test-deps makes, else python3.
std::string test_python() {
  if (const char* p = std::getenv("AMPGRAD_TEST_PYTHON"); p && *p) return p;
  const std::string venv = agt::source_dir() + "/build/pyenv/bin/python3";
  if (::access(venv.c_str(), X_OK) == 0) return venv;
  return "python3";
}

// Runs a shell command; its exit status (-1 when it did not exit normally).
int run_command(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// The interpreter when it can import safetensors and numpy, else "" (the test skips).
std::string python_with_safetensors() {
  const std::string py = test_python();
  if (run_command(shell_quote(py) + " -c 'import safetensors, numpy' >/dev/null 2>&1") != 0) return "";
  return py;
}

// Declares `py`, the interpreter to use, or skips the test saying how to get one.
#define SKIP_WITHOUT_SAFETENSORS(py)                                                           \
  const std::string py = python_with_safetensors();                                           \
  if (py.empty())                                                                              \
    AGT_SKIP_UNLESS_CI() << "the Python package safetensors (with numpy) is not importable by "       \
                 << test_python() << "; install it with scripts/install-test-deps (or point " \
                 << "AMPGRAD_TEST_PYTHON at a python that has it)"

// Runs the interop script; on failure, the status and what it printed.
::testing::AssertionResult run_interop(const std::string& py, const std::string& args, const TempDir& dir) {
  const std::string script = agt::source_dir() + "/tests/interop/safetensors_interop.py";
  const std::string log = dir.file("python.log");
  const int rc = run_command(shell_quote(py) + " " + shell_quote(script) + " " + args + " >" + shell_quote(log) + " 2>&1");
  if (rc == 0) return ::testing::AssertionSuccess();
  const Bytes out = read_bytes(log);
  return ::testing::AssertionFailure() << "safetensors_interop.py " << args << " exited " << rc << ":\n"
                                       << std::string(out.begin(), out.end());
}

// A tensor's values as JSON for the script: floats exactly (non-finite as strings), ints, bools.
nlohmann::json values_json(const Tensor& t) {
  nlohmann::json v = nlohmann::json::array();
  if (is_floating(t.dtype())) {
    for (double x : t.to_vector<double>())
      if (std::isnan(x)) v.push_back("nan");
      else if (std::isinf(x)) v.push_back(x > 0 ? "inf" : "-inf");
      else v.push_back(x);
  } else if (t.dtype() == kBool) {
    for (bool x : t.to_vector<bool>()) v.push_back(x);
  } else {
    for (int64_t x : t.to_vector<int64_t>()) v.push_back(x);
  }
  return v;
}

}  // namespace

// ag::nn::save -> safetensors (Python): same names, dtypes, shapes, values and metadata.
TEST(SafetensorsInterop, PythonReadsWhatAgSaves) {
  SKIP_WITHOUT_SAFETENSORS(py);
  manual_seed(5);
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const std::map<std::string, std::pair<const char*, Tensor>> tensors = {
      {"layer.0.weight", {"F32", randn({3, 4})}},
      {"f32.special", {"F32", from_vector<double>({-0.0, inf, -inf, nan, 1e-3}, {5}).to(kFloat32)}},
      {"f64", {"F64", randn({2, 2, 2}, kFloat64)}},
      {"f16", {"F16", from_vector<double>({1, -2.5, 65504, 5.960464477539063e-08, -0.0, inf}, {2, 3}).to(kFloat16)}},
      {"bf16", {"BF16", randn({7}).to(kBFloat16)}},
      {"bf16.special", {"BF16", from_vector<double>({-0.0, inf, nan, 3.0e38}, {2, 2}).to(kBFloat16)}},
      {"i64", {"I64", from_vector<int64_t>({INT64_MIN, -1, 0, INT64_MAX}, {4})}},
      {"i32", {"I32", from_vector<int32_t>({INT32_MIN, 7, INT32_MAX}, {3, 1})}},
      {"u8", {"U8", from_vector<uint8_t>({0, 128, 255}, {3})}},
      {"bool", {"BOOL", from_vector<bool>({true, false, false, true}, {2, 2})}},
      {"scalar", {"F32", scalar_tensor(0.75, kFloat32)}},
      {"empty", {"F32", empty({0, 4}, kFloat32)}},
  };
  const nn::Metadata meta{{"format", "pt"}, {"step", "1200"}, {"note", "quotes \" and \\ and \xc3\xa9"}};
  nn::StateDict d;
  nlohmann::json expected{{"metadata", meta}, {"tensors", nlohmann::json::object()}};
  for (const auto& [name, p] : tensors) {
    d[name] = p.second;
    expected["tensors"][name] = {{"dtype", p.first}, {"shape", p.second.sizes().vec()}, {"values", values_json(p.second)}};
  }
  TempDir dir;
  const std::string ckpt = dir.file("from ag's save.safetensors");  // a space and a quote, for the quoting
  nn::save(ckpt, d, meta);
  const std::string want = dir.file("expected.json");
  std::ofstream(want) << expected.dump();
  EXPECT_TRUE(run_interop(py, "check " + shell_quote(ckpt) + " " + shell_quote(want), dir));

  // and the script does notice a difference (reports it, rather than crashing)
  expected["tensors"]["i64"]["values"][1] = -2;
  expected["tensors"]["bf16.special"]["values"][0] = 0.0;  // a sign of zero
  std::ofstream(want) << expected.dump();
  const auto differs = run_interop(py, "check " + shell_quote(ckpt) + " " + shell_quote(want), dir);
  EXPECT_FALSE(differs);
  EXPECT_TRUE(has(differs.message(), "i64: values [-9223372036854775808, -1, 0, 9223372036854775807] != "
                                     "[-9223372036854775808, -2, 0, 9223372036854775807]"))
      << differs.message();
  EXPECT_TRUE(has(differs.message(), "bf16.special: values")) << differs.message();
  EXPECT_FALSE(has(differs.message(), "Traceback")) << differs.message();
}

// safetensors.numpy.save_file (Python) -> ag::nn::load. The package orders the data by
// dtype alignment, not by name, so this also loads tensors stored out of name order.
TEST(SafetensorsInterop, AgLoadsWhatPythonSaves) {
  SKIP_WITHOUT_SAFETENSORS(py);
  TempDir dir;
  const std::string path = dir.file("from python.safetensors");
  ASSERT_TRUE(run_interop(py, "write " + shell_quote(path), dir));
  nn::Metadata meta;
  const nn::StateDict d = nn::load(path, &meta);
  EXPECT_EQ(meta, (nn::Metadata{{"format", "np"}, {"written_by", "safetensors.numpy.save_file"}}));
  ASSERT_EQ(d.size(), 9u);
  auto expect = [&](const char* name, DType dt, std::vector<int64_t> shape) {
    ASSERT_TRUE(d.count(name)) << name;
    EXPECT_EQ(d.at(name).dtype(), dt) << name;
    EXPECT_EQ(d.at(name).sizes(), shape) << name;
  };
  expect("f32", kFloat32, {2, 3});
  EXPECT_EQ(d.at("f32").to_vector<float>(), (std::vector<float>{1.5f, -2.0f, 0.0f, 3.25f, -0.0f, 1e-3f}));
  EXPECT_TRUE(std::signbit(d.at("f32").to_vector<float>()[4]));
  expect("f64", kFloat64, {3});
  EXPECT_EQ(d.at("f64").to_vector<double>(), (std::vector<double>{M_PI, -1e300, 5e-324}));
  expect("f16", kFloat16, {4});
  EXPECT_EQ(d.at("f16").to_vector<double>(), (std::vector<double>{1.0, -2.5, 65504.0, std::ldexp(1.0, -24)}));
  expect("i64", kInt64, {2, 2});
  EXPECT_EQ(d.at("i64").to_vector<int64_t>(), (std::vector<int64_t>{int64_t(1) << 40, -3, 0, INT64_MAX}));
  expect("i32", kInt32, {3});
  EXPECT_EQ(d.at("i32").to_vector<int32_t>(), (std::vector<int32_t>{-7, INT32_MAX, 5}));
  expect("u8", kUInt8, {3});
  EXPECT_EQ(d.at("u8").to_vector<uint8_t>(), (std::vector<uint8_t>{0, 255, 17}));
  expect("bool", kBool, {4});
  EXPECT_EQ(d.at("bool").to_vector<bool>(), (std::vector<bool>{true, false, true, true}));
  expect("scalar", kFloat32, {});
  EXPECT_EQ(d.at("scalar").to_vector<float>(), (std::vector<float>{2.5f}));
  expect("empty", kFloat32, {0, 3});

  // and back: what ag saves from it, Python reads as the same values
  const std::string again = dir.file("again.safetensors");
  nn::save(again, d, meta);
  nlohmann::json expected{{"metadata", meta}, {"tensors", nlohmann::json::object()}};
  const std::map<DType, const char*> st{{kFloat32, "F32"}, {kFloat64, "F64"}, {kFloat16, "F16"}, {kInt64, "I64"},
                                        {kInt32, "I32"},   {kUInt8, "U8"},    {kBool, "BOOL"}};
  for (const auto& [name, t] : d)
    expected["tensors"][name] = {{"dtype", st.at(t.dtype())}, {"shape", t.sizes().vec()}, {"values", values_json(t)}};
  const std::string want = dir.file("expected.json");
  std::ofstream(want) << expected.dump();
  EXPECT_TRUE(run_interop(py, "check " + shell_quote(again) + " " + shell_quote(want), dir));
}

// ---- hostile headers and files --------------------------------------------------------------

// JSON nesting is bounded before anything walks it: 100,000 levels under a tensor's shape
// or in the metadata used to reach a recursive dump() in the error message and overflow
// the stack. 64 levels is the limit; a value nested within it is described, not dumped.
TEST(SafetensorsHostile, DeepNestingIsRefusedBeforeAnythingRecurses) {
  TempDir dir;
  const auto nest = [](int depth) { return std::string(size_t(depth), '[') + std::string(size_t(depth), ']'); };
  struct Case {
    std::string name, header, problem;
  };
  const std::vector<Case> cases = {
      {"deep-shape", R"({"w":{"dtype":"F32","shape":)" + nest(100000) + R"(,"data_offsets":[0,0]}})",
       "malformed header: JSON nested deeper than 64 levels"},
      {"deep-meta", R"({"__metadata__":{"k":)" + nest(100000) + "}}", "JSON nested deeper than 64 levels"},
      {"deep-unclosed", "{\"a\":" + std::string(200000, '['), "JSON nested deeper than 64 levels"},
      {"deep-objects", [] {
         std::string h = "{\"w\":";
         for (int i = 0; i < 50000; ++i) h += "{\"a\":";
         h += "1";
         for (int i = 0; i < 50000; ++i) h += "}";
         return h + "}";
       }(),
       "JSON nested deeper than 64 levels"},
      // within the limit: refused by the usual checks, the value described briefly
      {"meta-nested-60", R"({"__metadata__":{"k":)" + nest(60) + "}}", "__metadata__ value of 'k' is not a string: a list of 1 item"},
      {"shape-nested-60", R"({"w":{"dtype":"F32","shape":)" + nest(60) + R"(,"data_offsets":[0,0]}})",
       "tensor 'w' has shape a list of 1 item, not a list of non-negative integers"},
  };
  for (const auto& c : cases) {
    const std::string path = dir.file(c.name + ".safetensors");
    write_bytes(path, st_file(c.header, {}));
    // in a child: without the bound, this overflows the stack
    const std::string msg = error_in_child([&] { nn::load(path); });
    EXPECT_TRUE(has(msg, "[load] " + path + ": ")) << c.name << ": " << msg;
    EXPECT_TRUE(has(msg, c.problem)) << c.name << ": " << msg << "\nexpected: " << c.problem;
  }
  // 64 levels below the top is still JSON the loader reads (and refuses for what it says)
  const std::string path = dir.file("at-limit.safetensors");
  write_bytes(path, st_file(R"({"__metadata__":{"k":)" + nest(62) + "}}", {}));
  EXPECT_AG_ERROR(nn::load(path), "__metadata__ value of 'k' is not a string");
}

// Parsing is linear in the header: 50,000 tiny tensors (a 3.5 MB header) took 84 s when
// a parser callback checked for duplicate names; the time is printed, not asserted. A name
// given twice at the end of such a header is still refused.
TEST(SafetensorsHostile, HeaderOf50000TensorsLoadsAndDuplicatesAreStillRefused) {
  TempDir dir;
  const std::string path = dir.file("many.safetensors");
  constexpr int kN = 50000;
  nn::StateDict d;
  for (int i = 0; i < kN; ++i) d["layer." + std::to_string(i) + ".w"] = full({2}, double(i), kFloat32);
  nn::save(path, d);
  const auto t0 = std::chrono::steady_clock::now();
  const nn::StateDict back = nn::load(path);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[          ] loading a header of %d tensors (%zu bytes) took %.3f s\n", kN, size_t(u64_at(read_bytes(path), 0)),
              secs);
  ASSERT_EQ(back.size(), size_t(kN));
  EXPECT_EQ(back.at("layer.49999.w").to_vector<double>(), (std::vector<double>{49999, 49999}));

  std::string h = "{";
  for (int i = 0; i < kN; ++i) h += "\"t" + std::to_string(i) + R"(":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},)";
  h += R"("t17":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})";
  const std::string dup = dir.file("dup.safetensors");
  write_bytes(dup, st_file(h, {}));
  EXPECT_AG_ERROR(nn::load(dup), dup + ": malformed header: the name 't17' appears twice");
}

// Only regular files are opened; a FIFO used to block forever, a directory gave a header
// length from uninitialised bytes. Each is refused by name, at once (in a child process
// that is killed if it blocks).
TEST(SafetensorsHostile, OnlyRegularFilesAreOpened) {
  TempDir dir;
  const std::string fifo = dir.file("pipe.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string sub = dir.file("folder.safetensors");
  fs::create_directory(sub);
  EXPECT_EQ(error_in_child([&] { nn::load(fifo); }, 10), "[load] " + fifo + ": is a FIFO (named pipe), not a regular file");
  EXPECT_AG_ERROR(nn::load(sub), "[load] " + sub + ": is a directory, not a regular file");
  EXPECT_AG_ERROR(nn::load("/dev/null"), "[load] /dev/null: is a character device, not a regular file");
  EXPECT_AG_ERROR(nn::load(dir.file("nope.safetensors")), dir.file("nope.safetensors") + ": cannot open: no such file");
  // the same for IDX files and Lite checkpoints, which use the same opening
  EXPECT_EQ(error_in_child([&] { data::read_idx(fifo); }, 10), "[read_idx] " + fifo + ": is a FIFO (named pipe), not a regular file");
  EXPECT_AG_ERROR(data::read_idx(sub), "[read_idx] " + sub + ": is a directory, not a regular file");
  EXPECT_AG_ERROR(Lite({.accelerator = "cpu"}).load(sub, {}), sub + ": is a directory, not a regular file");
}

// A file the process may not read says so (it said "no such file?"). As root, the check
// runs in a child that drops to nobody first.
TEST(SafetensorsHostile, PermissionDeniedSaysSo) {
  TempDir dir;
  fs::permissions(dir.path(), fs::perms::all);  // anyone may enter the directory, but not read the file
  const std::string path = dir.file("secret.safetensors");
  nn::save(path, {{"w", zeros({2})}});
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
  if (::geteuid() != 0) fs::permissions(path, fs::perms::none);
  const std::string msg = error_in_child([&] { nn::load(path); }, 20, /*unprivileged=*/true);
  EXPECT_EQ(msg, "[load] " + path + ": cannot open: permission denied");
  const std::string msg2 = error_in_child([&] { data::read_idx(path); }, 20, true);
  EXPECT_EQ(msg2, "[read_idx] " + path + ": cannot open: permission denied");
}
