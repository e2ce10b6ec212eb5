// IDX files (round trips and every kind of corruption), the DataLoader (coverage, order,
// drop_last, seeding, prefetch), CharDataset, and the datasets' missing-file errors.
#include "support/testing.h"

#include <sys/resource.h>
#include <unistd.h>
#include <omp.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

using namespace ag;
namespace fs = std::filesystem;

using namespace agt;  // TempDir, Bytes, error_of, read_bytes, write_bytes, numbered, epoch, flat
constexpr auto has = agt::contains;

namespace {






// A gzip file holding `data` in one stored (uncompressed) deflate block, so that tests can
// put any bytes inside a valid gzip stream without linking zlib (RFC 1951 and 1952).
Bytes gzip_stored(const Bytes& data) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char c : data) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  crc ^= 0xffffffffu;
  const size_t n = data.size();
  Bytes out(10 + 5 + n + 8, 0);
  const unsigned char head[10] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff};  // magic, deflate, no flags, mtime, xfl, os
  for (size_t i = 0; i < 10; ++i) out[i] = head[i];
  const uint16_t len = uint16_t(n), nlen = uint16_t(~len);
  out[10] = 1;  // final block, stored
  out[11] = uint8_t(len & 0xff);
  out[12] = uint8_t(len >> 8);
  out[13] = uint8_t(nlen & 0xff);
  out[14] = uint8_t(nlen >> 8);
  for (size_t i = 0; i < n; ++i) out[15 + i] = data[i];
  for (int k = 0; k < 4; ++k) {
    out[15 + n + size_t(k)] = uint8_t(crc >> (8 * k));
    out[19 + n + size_t(k)] = uint8_t(uint32_t(n) >> (8 * k));
  }
  return out;
}

}  // namespace

// ---- IDX --------------------------------------------------------------------------------------

TEST(DataIdx, RoundTripPlainAndGzip) {
  TempDir dir;
  manual_seed(1);
  Tensor t = randint(0, 256, {3, 4, 5}, kUInt8);
  Tensor v = from_vector<int64_t>({0, 1, 127, 128, 255}, {5}, kUInt8);
  for (const char* name : {"a-idx3-ubyte", "a-idx3-ubyte.gz"}) {
    const std::string path = dir.file(name);
    data::write_idx(path, t);
    Tensor r = data::read_idx(path);
    EXPECT_EQ(r.dtype(), kUInt8) << name;
    EXPECT_EQ(r.sizes(), (std::vector<int64_t>{3, 4, 5})) << name;
    EXPECT_EQ(r.to_vector<int64_t>(), t.to_vector<int64_t>()) << name;
  }
  const Bytes plain = read_bytes(dir.file("a-idx3-ubyte"));
  ASSERT_EQ(plain.size(), 4u + 3 * 4 + 60);
  EXPECT_EQ(Bytes(plain.begin(), plain.begin() + 8), (Bytes{0, 0, 8, 3, 0, 0, 0, 3}));
  const Bytes gz = read_bytes(dir.file("a-idx3-ubyte.gz"));
  ASSERT_GE(gz.size(), 2u);
  EXPECT_EQ(gz[0], 0x1f);  // the gzip magic
  EXPECT_EQ(gz[1], 0x8b);
  // 1-D, with every byte value kept
  data::write_idx(dir.file("v.gz"), v);
  EXPECT_EQ(data::read_idx(dir.file("v.gz")).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 127, 128, 255}));
  // a non-contiguous tensor is written in logical order
  Tensor nc = t.select(2, 1);
  data::write_idx(dir.file("nc"), nc.transpose(0, 1));
  Tensor back = data::read_idx(dir.file("nc"));
  EXPECT_EQ(back.sizes(), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(back.to_vector<int64_t>(), nc.transpose(0, 1).contiguous().to_vector<int64_t>());
  // overwriting leaves no temporary file behind
  data::write_idx(dir.file("v.gz"), t);
  EXPECT_EQ(data::read_idx(dir.file("v.gz")).sizes(), (std::vector<int64_t>{3, 4, 5}));
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  EXPECT_AG_ERROR(data::write_idx(dir.file("f"), zeros({2})), "expected a uint8 tensor, got float32");
}

TEST(DataIdx, CorruptFilesNameThePathAndProblem) {
  TempDir dir;
  struct Case {
    const char* name;
    Bytes bytes;
    const char* problem;
  };
  const std::vector<Case> cases = {
      {"truncated", {0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 4, 5}, "need 6 bytes of data but the file has 5 (truncated)"},
      {"trailing", {0, 0, 8, 1, 0, 0, 0, 2, 7, 8, 9}, "need 2 bytes of data but the file has 3 (trailing data)"},
      {"magic", {1, 0, 8, 1, 0, 0, 0, 1, 7}, "bad magic number"},
      {"magic2", {0, 3, 8, 1, 0, 0, 0, 1, 7}, "bad magic number"},
      {"type", {0, 0, 0x0D, 1, 0, 0, 0, 1, 0, 0, 0, 0}, "element type 0xd is not supported"},
      {"ndim0", {0, 0, 8, 0}, "bad number of dims 0"},
      {"short", {0, 0, 8}, "too short for an IDX header (3 bytes)"},
      {"empty", {}, "too short for an IDX header (0 bytes)"},
      {"header", {0, 0, 8, 3, 0, 0, 0, 1, 0, 0}, "truncated header"},
      {"huge", {0, 0, 8, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1}, "implausibly large"},
  };
  for (const auto& c : cases) {
    const std::string path = dir.file(std::string(c.name) + "-idx-ubyte");
    write_bytes(path, c.bytes);
    const std::string msg = error_of([&] { data::read_idx(path); });
    EXPECT_TRUE(has(msg, "[read_idx]")) << c.name << ": " << msg;
    EXPECT_TRUE(has(msg, path)) << c.name << ": " << msg;
    EXPECT_TRUE(has(msg, c.problem)) << c.name << ": " << msg << "\nexpected: " << c.problem;
  }
  // a valid gzip stream (written by hand, see gzip_stored) whose IDX content is corrupt
  {
    const std::string plain_ok = dir.file("stored-ok.gz");
    write_bytes(plain_ok, gzip_stored({0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 2, 1, 2, 3, 4}));
    EXPECT_EQ(data::read_idx(plain_ok).to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3, 4}));
    const std::string path = dir.file("stored-truncated.gz");
    write_bytes(path, gzip_stored({0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 2, 1, 2, 3}));
    const std::string msg = error_of([&] { data::read_idx(path); });
    EXPECT_TRUE(has(msg, path)) << msg;
    EXPECT_TRUE(has(msg, "need 4 bytes of data but the file has 3 (truncated)")) << msg;
  }
  // a truncated gzip stream
  const std::string good = dir.file("good.gz");
  manual_seed(2);
  data::write_idx(good, randint(0, 256, {64, 64}, kUInt8));
  const Bytes gz = read_bytes(good);
  ASSERT_GT(gz.size(), 100u);
  for (size_t keep : {gz.size() / 2, gz.size() - 4}) {
    const std::string path = dir.file("cut" + std::to_string(keep) + ".gz");
    write_bytes(path, Bytes(gz.begin(), gz.begin() + std::ptrdiff_t(keep)));
    const std::string msg = error_of([&] { data::read_idx(path); });
    EXPECT_TRUE(has(msg, path)) << msg;
    // the stream ends early: either zlib notices, or the IDX dims do
    EXPECT_TRUE(has(msg, "corrupt or truncated gzip data") || has(msg, "(truncated)")) << keep << ": " << msg;
  }
  // gzip with a corrupted body (CRC or inflate error)
  Bytes bad = gz;
  for (size_t i = 20; i < 60; ++i) bad[i] ^= 0x5a;
  const std::string badpath = dir.file("garbled.gz");
  write_bytes(badpath, bad);
  const std::string msg = error_of([&] { data::read_idx(badpath); });
  EXPECT_TRUE(has(msg, badpath)) << msg;
  EXPECT_TRUE(has(msg, "corrupt or truncated gzip data")) << msg;
}

TEST(DataIdx, MissingFileNamed) {
  TempDir dir;
  const std::string path = dir.file("nope-idx1-ubyte.gz");
  EXPECT_AG_ERROR(data::read_idx(path), path + ": cannot open: no such file");
}

namespace {

// A gzip file (zlib's gzwrite) holding the IDX header for `dims`, then `zeros` zero bytes.
void write_gz_idx(const std::string& path, const std::vector<uint32_t>& dims, uint64_t zeros) {
  Bytes head{0, 0, 8, uint8_t(dims.size())};
  for (uint32_t d : dims)
    for (int k = 3; k >= 0; --k) head.push_back(uint8_t(d >> (8 * k)));
  gzFile f = gzopen(path.c_str(), "wb9");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, head.data(), unsigned(head.size())), int(head.size()));
  const std::vector<unsigned char> block(1 << 20, 0);
  for (uint64_t left = zeros; left > 0;) {
    const unsigned n = unsigned(std::min<uint64_t>(left, block.size()));
    ASSERT_EQ(gzwrite(f, block.data(), n), int(n));
    left -= n;
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

long max_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

}  // namespace

// Compressed data is inflated only as far as the dims say, plus one byte to detect more:
// memory is bounded by the declared size, which is checked first against a limit (16 GiB)
// and against what the gzip file could hold (deflate inflates at most 1032:1).
TEST(DataIdx, GzipInflatesOnlyWhatTheHeaderDeclares) {
  TempDir dir;
  // 256 MiB of zeros (a file of about 250 KB) under a header that declares 10 bytes
  const std::string bomb = dir.file("bomb-idx1-ubyte.gz");
  write_gz_idx(bomb, {10}, uint64_t(256) << 20);
  EXPECT_LT(fs::file_size(bomb), 2u << 20);
  const long before = max_rss_kib();
  const std::string msg = error_of([&] { data::read_idx(bomb); });
  const long grew_mib = (max_rss_kib() - before) / 1024;
  EXPECT_TRUE(has(msg, "[read_idx] " + bomb + ": dims [10] need 10 bytes of data but the file has more (trailing data)"))
      << msg;
  EXPECT_LT(grew_mib, 64) << "reading the 10 declared bytes grew the peak memory by " << grew_mib << " MiB";

  // dims that declare far more than the small gzip file can inflate to: refused before allocating
  const std::string liar = dir.file("liar-idx3-ubyte.gz");
  write_gz_idx(liar, {1000, 1000, 1000}, 100);
  const std::string msg2 = error_of([&] { data::read_idx(liar); });
  EXPECT_TRUE(has(msg2, liar + ": dims [1000, 1000, 1000] need 1000000000 bytes of data, more than a gzip file of ")) << msg2;
  EXPECT_TRUE(has(msg2, "bytes can inflate to (at most 1032:1)")) << msg2;

  // dims over the limit, and dims whose product overflows 64 bits (it wrapped to 0 and loaded)
  const std::string huge = dir.file("huge-idx3-ubyte.gz");
  write_gz_idx(huge, {1u << 16, 1u << 16, 1u << 8}, 0);
  EXPECT_AG_ERROR(data::read_idx(huge), "dims [65536, 65536, 256] are implausibly large: they need 1099511627776 bytes");
  const std::string wrap = dir.file("wrap-idx3-ubyte");
  write_bytes(wrap, {0, 0, 8, 3, 0, 0x10, 0, 0, 0, 0x08, 0, 0, 0x40, 0, 0, 0});  // 2^20 * 2^19 * 2^30 = 2^69
  EXPECT_AG_ERROR(data::read_idx(wrap), "dims [1048576, 524288, 1073741824] are implausibly large: they need more than 2^64 bytes");
  // a plain file's size is checked before allocating, too
  const std::string plain = dir.file("plain-idx3-ubyte");
  write_bytes(plain, {0, 0, 8, 3, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 1, 2, 3});
  EXPECT_AG_ERROR(data::read_idx(plain), "dims [1024, 1024, 1024] need 1073741824 bytes of data but the file has 3 (truncated)");

  // what the header declares, exactly, still loads; and a file that is whole zeros does too
  const std::string exact = dir.file("exact-idx2-ubyte.gz");
  write_gz_idx(exact, {1000, 1000}, 1000000);
  const Tensor t = data::read_idx(exact);
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{1000, 1000}));
  EXPECT_EQ(t.sum().item<int64_t>(), 0);
}

// ---- DataLoader -------------------------------------------------------------------------------

namespace {

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = i;
  return v;
}

}  // namespace

TEST(DataLoader, SequentialCoversEveryExampleInOrder) {
  data::DataLoader loader(numbered(23), {.batch_size = 5, .shuffle = false});
  EXPECT_EQ(loader.num_batches(), 5);
  EXPECT_EQ(loader.batch_size(), 5);
  EXPECT_EQ(loader.dataset().size(), 23);
  auto b = epoch(loader);
  ASSERT_EQ(b.size(), 5u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(b[i].size(), 5u);
  EXPECT_EQ(b[4], (std::vector<int64_t>{20, 21, 22}));
  EXPECT_EQ(flat(b), iota(23));
  // a second epoch is the same
  EXPECT_EQ(epoch(loader), b);
}

TEST(DataLoader, ShuffleCoversEveryExampleOnce) {
  manual_seed(3);
  data::DataLoader loader(numbered(103), {.batch_size = 10, .shuffle = true});
  auto e1 = flat(epoch(loader));
  auto e2 = flat(epoch(loader));
  for (auto* e : {&e1, &e2}) {
    ASSERT_EQ(e->size(), 103u);
    auto sorted = *e;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, iota(103));
    EXPECT_NE(*e, iota(103));
  }
  EXPECT_NE(e1, e2);  // each epoch draws a new order
}

TEST(DataLoader, DropLastAndNumBatches) {
  data::DataLoader drop(numbered(23), {.batch_size = 5, .shuffle = false, .drop_last = true});
  EXPECT_EQ(drop.num_batches(), 4);
  auto b = epoch(drop);
  ASSERT_EQ(b.size(), 4u);
  for (auto& x : b) EXPECT_EQ(x.size(), 5u);
  EXPECT_EQ(flat(b), iota(20));
  manual_seed(4);
  data::DataLoader sdrop(numbered(23), {.batch_size = 5, .shuffle = true, .drop_last = true});
  auto s = flat(epoch(sdrop));
  EXPECT_EQ(s.size(), 20u);
  EXPECT_EQ(std::set<int64_t>(s.begin(), s.end()).size(), 20u);
  // exact multiples, batches larger than the dataset
  EXPECT_EQ(data::DataLoader(numbered(20), {.batch_size = 5}).num_batches(), 4);
  EXPECT_EQ(data::DataLoader(numbered(20), {.batch_size = 5, .drop_last = true}).num_batches(), 4);
  data::DataLoader big(numbered(7), {.batch_size = 10});
  EXPECT_EQ(big.num_batches(), 1);
  EXPECT_EQ(flat(epoch(big)), iota(7));
  data::DataLoader none(numbered(7), {.batch_size = 10, .drop_last = true});
  EXPECT_EQ(none.num_batches(), 0);
  EXPECT_TRUE(epoch(none).empty());
  EXPECT_TRUE(none.begin() == none.end());
  EXPECT_AG_ERROR(data::DataLoader(numbered(7), {.batch_size = 0}), "batch_size must be positive, got 0");
  EXPECT_AG_ERROR(data::DataLoader(nullptr), "dataset is null");
}

TEST(DataLoader, SeedDeterminesOrder) {
  auto ds = numbered(50);
  auto order = [&](uint64_t seed) {
    manual_seed(seed);
    data::DataLoader loader(ds, {.batch_size = 8, .shuffle = true});
    return flat(epoch(loader));
  };
  EXPECT_EQ(order(7), order(7));
  EXPECT_NE(order(7), order(8));
  auto p1 = (manual_seed(9), data::random_permutation(1000));
  auto p2 = (manual_seed(9), data::random_permutation(1000));
  EXPECT_EQ(p1, p2);
  auto sorted = p1;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, iota(1000));
  EXPECT_NE(p1, iota(1000));
  EXPECT_TRUE(data::random_permutation(0).empty());
  EXPECT_EQ(data::random_permutation(1), (std::vector<int64_t>{0}));
}

TEST(DataLoader, PrefetchOnAndOffGiveSameBatches) {
  auto ds = numbered(61);
  for (bool shuffle : {false, true}) {
    manual_seed(10);
    data::DataLoader on(ds, {.batch_size = 7, .shuffle = shuffle, .prefetch = true});
    auto a = epoch(on);
    manual_seed(10);
    data::DataLoader off(ds, {.batch_size = 7, .shuffle = shuffle, .prefetch = false});
    auto b = epoch(off);
    EXPECT_EQ(a, b) << "shuffle " << shuffle;
    EXPECT_EQ(a.size(), 9u);
  }
  // abandoning an epoch midway with a batch in flight is fine
  data::DataLoader on(ds, {.batch_size = 7, .prefetch = true});
  auto it = on.begin();
  ++it;
  EXPECT_EQ(it->target.to_vector<int64_t>()[0], 7);
}

// A dataset that notes the kernel thread of each get_batch and fails on one sample.
class WatchedDataset : public data::Dataset {
 public:
  explicit WatchedDataset(int64_t fail_on = -1) : inner_(numbered(61)), fail_on_(fail_on) {}
  int64_t size() const override { return inner_->size(); }
  data::Batch get_batch(const std::vector<int64_t>& indices) const override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tids_.push_back(int64_t(::gettid()));
    }
    for (int64_t i : indices)
      if (i == fail_on_.load()) AG_ERROR("WatchedDataset", "sample ", i, " is unreadable");
    return inner_->get_batch(indices);
  }
  std::vector<int64_t> tids() const {
    std::lock_guard<std::mutex> lock(mu_);
    return tids_;
  }
  void fail_on(int64_t i) { fail_on_ = i; }

 private:
  std::shared_ptr<data::TensorDataset> inner_;
  std::atomic<int64_t> fail_on_;
  mutable std::mutex mu_;
  mutable std::vector<int64_t> tids_;
};

// With prefetch the first batch of an epoch is fetched by the caller and every later one by
// one background thread of that epoch, not a thread per batch; a new epoch starts another.
TEST(DataLoader, PrefetchRunsOneThreadPerEpoch) {
  auto ds = std::make_shared<WatchedDataset>();
  data::DataLoader loader(ds, {.batch_size = 7, .prefetch = true});
  for (int e = 0; e < 2; ++e) {
    const size_t seen = ds->tids().size();
    EXPECT_EQ(epoch(loader).size(), 9u);
    const std::vector<int64_t> all = ds->tids();
    const std::vector<int64_t> tids(all.begin() + ptrdiff_t(seen), all.end());
    ASSERT_EQ(tids.size(), 9u);
    EXPECT_EQ(tids[0], int64_t(::gettid())) << "epoch " << e;
    const std::set<int64_t> background(tids.begin() + 1, tids.end());
    EXPECT_EQ(background.size(), 1u) << "epoch " << e;
    EXPECT_EQ(background.count(int64_t(::gettid())), 0u) << "epoch " << e;
  }
}

// A batch that fails on the prefetch thread fails the ++ that hands it out, with the
// dataset's own error; once the dataset reads again, the loader's next epoch runs as usual.
TEST(DataLoader, PrefetchedBatchErrorReachesTheCaller) {
  for (bool prefetch : {true, false}) {
    auto ds = std::make_shared<WatchedDataset>(/*fail_on=*/23);  // in the fourth batch of 7
    data::DataLoader loader(ds, {.batch_size = 7, .prefetch = prefetch});
    {
      auto it = loader.begin();
      ++it;
      ++it;
      EXPECT_AG_ERROR(++it, "sample 23 is unreadable");
    }
    ds->fail_on(-1);
    EXPECT_EQ(epoch(loader).size(), 9u) << "prefetch " << prefetch;
  }
}

// Unset, prefetch follows the cores: a background thread only where the OpenMP team leaves
// a hardware thread free (or the step runs on an accelerator: DataLoader.CudaDevice checks
// that). Set, it is what was asked.
TEST(DataLoader, PrefetchByDefaultOnlyWithACoreToSpare) {
  auto ds = numbered(10);
  const unsigned hw = std::thread::hardware_concurrency();
  const int before = omp_get_max_threads();
  omp_set_num_threads(int(std::max(1u, hw)));
  EXPECT_FALSE(data::DataLoader(ds, {.batch_size = 3}).prefetches());
  EXPECT_FALSE(data::DataLoader(ds, {.batch_size = 3, .device = Device(kCPU)}).prefetches());
  EXPECT_TRUE(data::DataLoader(ds, {.batch_size = 3, .prefetch = true}).prefetches());
  if (hw >= 2) {
    omp_set_num_threads(int(hw) - 1);
    EXPECT_TRUE(data::DataLoader(ds, {.batch_size = 3}).prefetches());
    EXPECT_FALSE(data::DataLoader(ds, {.batch_size = 3, .prefetch = false}).prefetches());
  }
  omp_set_num_threads(before);
}

// Every batch's bytes, in order, and whether each batch's tensors are pinned.
struct Epoch {
  std::vector<std::vector<float>> inputs;
  std::vector<std::vector<int64_t>> targets;
  std::vector<bool> pinned;
};
Epoch bytes_of(const data::DataLoader& loader) {
  Epoch e;
  for (const data::Batch& b : loader) {
    e.inputs.push_back(b.input.to_vector<float>());
    e.targets.push_back(b.target.to_vector<int64_t>());
    e.pinned.push_back(b.input.is_pinned() && b.target.is_pinned());
  }
  return e;
}

TEST(DataLoader, PinnedAndMovedBatchesAreTheSameBatches) {
  auto ds = numbered(61);
  for (bool shuffle : {false, true}) {
    for (bool prefetch : {true, false}) {
      manual_seed(11);
      const Epoch plain = bytes_of(data::DataLoader(ds, {.batch_size = 7, .shuffle = shuffle, .prefetch = prefetch}));
      manual_seed(11);
      const Epoch pinned = bytes_of(data::DataLoader(
          ds, {.batch_size = 7, .shuffle = shuffle, .prefetch = prefetch, .pin_memory = true}));
      manual_seed(11);
      data::DataLoader moved(ds, {.batch_size = 7, .shuffle = shuffle, .prefetch = prefetch, .pin_memory = true,
                                  .device = Device(kCPU)});
      const Epoch both = bytes_of(moved);
      const std::string where = "shuffle " + std::to_string(shuffle) + " prefetch " + std::to_string(prefetch);
      ASSERT_EQ(plain.inputs.size(), 9u) << where;
      EXPECT_EQ(pinned.inputs, plain.inputs) << where;  // bit for bit, in the same order
      EXPECT_EQ(pinned.targets, plain.targets) << where;
      EXPECT_EQ(both.inputs, plain.inputs) << where;
      EXPECT_EQ(both.targets, plain.targets) << where;
      EXPECT_EQ(plain.pinned, std::vector<bool>(9, false)) << where;
      EXPECT_EQ(pinned.pinned, std::vector<bool>(9, true)) << where;
      EXPECT_EQ(both.pinned, std::vector<bool>(9, true)) << where;
    }
  }
}

TEST(DataLoader, DeviceOptionRunsTheStreamPath) {
  auto ds = numbered(30);
  data::DataLoader plain(ds, {.batch_size = 4});
  EXPECT_FALSE(plain.side_stream().has_value());
  for (bool prefetch : {true, false}) {
    data::DataLoader loader(ds, {.batch_size = 4, .prefetch = prefetch, .device = Device(kCPU)});
    ASSERT_TRUE(loader.side_stream().has_value());
    const Stream side = *loader.side_stream();
    EXPECT_EQ(side.device(), Device(kCPU));
    EXPECT_FALSE(side.is_default());
    const Stream consumer = create_stream(kCPU);
    {
      StreamGuard g(consumer);  // the stream the training step would run on
      const MemoryStats before = memory_stats(kCPU);
      int64_t n = 0;
      const uint64_t syncs = host_sync_count();
      for (const data::Batch& b : loader) {
        for (const Tensor* t : {&b.input, &b.target}) {
          const Storage& st = *t->unsafe_impl()->storage;
          EXPECT_EQ(st.stream, side);  // prepared on the side stream, in the prefetch thread or not
          EXPECT_EQ(st.stream_uses, std::vector<Stream>{consumer}) << "batch " << n;  // and used on ours
        }
        ++n;
      }
      EXPECT_EQ(host_sync_count(), syncs) << "handing out batches makes no host sync";
      EXPECT_EQ(n, 8);
      // Each batch's two storages were freed after an event on the consumer stream.
      EXPECT_EQ(memory_stats(kCPU).deferred_frees, before.deferred_frees + 2 * 8);
      EXPECT_EQ(current_stream(kCPU), consumer);  // the loader's guards did not leak
      synchronize(kCPU);
      EXPECT_EQ(memory_stats(kCPU).pending_frees, 0u);
    }
    destroy_stream(consumer);
  }
}

TEST(DataLoader, CudaDevice) {
  auto ds = numbered(4);
  if (!built_with_cuda()) {
    EXPECT_AG_ERROR(data::DataLoader(ds, {.device = Device(kCUDA)}), "[create_stream] ampgrad was built without CUDA");
  } else if (hw::query().cuda.empty()) {
    EXPECT_AG_ERROR(data::DataLoader(ds, {.device = Device(kCUDA)}), "[create_stream] no CUDA device is available");
  } else {
    data::DataLoader loader(ds, {.batch_size = 2, .pin_memory = true, .device = Device(kCUDA)});
    EXPECT_TRUE(loader.prefetches());  // the step runs on the GPU: the CPU has time to spare
    std::vector<int64_t> ids;
    for (const data::Batch& b : loader) {
      EXPECT_EQ(b.input.device(), Device(kCUDA));
      for (int64_t v : b.target.to_vector<int64_t>()) ids.push_back(v);
    }
    EXPECT_EQ(ids, iota(4));
  }
}

// A CUDA loader copies each batch on its own stream and makes the consumer's stream wait
// for it (an Event). Read here by kernels on the consumer's stream, in the test binary's
// strict emulation (docs/cuda-emulator.md), where queued work runs only when something
// waits for it: with pageable batches and no prefetch nothing else runs the copy first, so
// a missing wait reads poison. (A pinned batch's next allocation queries the events of the
// pinned copies before it, which runs them: that loader would hide a missing wait.)
TEST(DataLoader, CudaBatchesAreReadyOnTheConsumersStream) {
  if (!built_with_cuda()) AGT_SKIP_BUILD() << "built without CUDA";
  if (hw::query().cuda.empty()) AGT_SKIP_HARDWARE() << "no CUDA device";
  for (bool pin : {false, true}) {
    SCOPED_TRACE(pin ? "pinned" : "pageable");
    data::DataLoader loader(numbered(6), {.batch_size = 2, .prefetch = false, .pin_memory = pin, .device = Device(kCUDA)});
    std::vector<int64_t> ids;
    for (const data::Batch& b : loader) {
      const Tensor target = b.target + 0, input = b.input * 1.0;  // kernels on the consumer's stream
      const std::vector<int64_t> t = target.to_vector<int64_t>();
      const std::vector<double> in = input.to(kFloat64).to_vector<double>();
      ASSERT_EQ(in.size(), 2 * t.size());
      for (size_t i = 0; i < t.size(); ++i) {
        EXPECT_EQ(in[2 * i], double(t[i]));
        EXPECT_EQ(in[2 * i + 1], -double(t[i]));
      }
      ids.insert(ids.end(), t.begin(), t.end());
    }
    EXPECT_EQ(ids, iota(6));
  }
}

TEST(DataTensorDataset, BatchesAndShapeCheck) {
  Tensor x = arange(12, kFloat32).view({4, 3});
  Tensor y = from_vector<int64_t>({10, 11, 12, 13}, {4});
  data::TensorDataset ds(x, y);
  EXPECT_EQ(ds.size(), 4);
  auto b = ds.get_batch({3, 1, 3});
  EXPECT_EQ(b.input.sizes(), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(b.input.to_vector<double>(), (std::vector<double>{9, 10, 11, 3, 4, 5, 9, 10, 11}));
  EXPECT_EQ(b.target.to_vector<int64_t>(), (std::vector<int64_t>{13, 11, 13}));
  EXPECT_AG_ERROR(data::TensorDataset(x, zeros({3})), "must share their first dim");
}

// ---- text -------------------------------------------------------------------------------------

TEST(DataCharDataset, EncodeDecodeAndShift) {
  data::CharDataset ds("hello world", 4);
  EXPECT_EQ(ds.vocab_size(), 8);  // " dehlorw"
  EXPECT_EQ(ds.block_size(), 4);
  EXPECT_EQ(ds.encode(" dehlorw"), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(ds.encode("hello"), (std::vector<int64_t>{3, 2, 4, 4, 5}));
  EXPECT_EQ(ds.decode(ds.encode("world hello")), "world hello");
  EXPECT_EQ(ds.size(), 7);  // 11 characters, windows of 4 + 1
  auto b = ds.get_batch({0, 6, 2});
  EXPECT_EQ(b.input.dtype(), kInt64);
  EXPECT_EQ(b.input.sizes(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(b.target.sizes(), (std::vector<int64_t>{3, 4}));
  auto x = b.input.to_vector<int64_t>(), y = b.target.to_vector<int64_t>();
  auto row = [](const std::vector<int64_t>& v, size_t r) { return std::vector<int64_t>(v.begin() + long(4 * r), v.begin() + long(4 * r + 4)); };
  EXPECT_EQ(ds.decode(row(x, 0)), "hell");
  EXPECT_EQ(ds.decode(row(y, 0)), "ello");
  EXPECT_EQ(ds.decode(row(x, 1)), "worl");
  EXPECT_EQ(ds.decode(row(y, 1)), "orld");
  EXPECT_EQ(ds.decode(row(x, 2)), "llo ");
  EXPECT_EQ(ds.decode(row(y, 2)), "lo w");
  EXPECT_AG_ERROR(ds.encode("hi"), "character 105 is not in the vocabulary");
  EXPECT_AG_ERROR(ds.decode({8}), "token 8 is out of range for a vocabulary of 8");
  EXPECT_AG_ERROR(ds.get_batch({7}), "index 7 is out of range for 7 examples");
  EXPECT_AG_ERROR(data::CharDataset("abcd", 4), "fewer than block_size + 1 = 5");
  // batches through a loader
  manual_seed(1);
  data::DataLoader loader(std::make_shared<data::CharDataset>("abcdefghij", 3), {.batch_size = 4, .shuffle = true});
  int64_t n = 0;
  for (const auto& batch : loader) {
    auto xi = batch.input.to_vector<int64_t>(), yi = batch.target.to_vector<int64_t>();
    for (size_t i = 0; i < xi.size(); ++i) EXPECT_EQ(yi[i], xi[i] + 1);  // consecutive letters
    n += batch.input.size(0);
  }
  EXPECT_EQ(n, 7);
}

TEST(DataText, ReadTextFileAndDirectory) {
  TempDir dir;
  fs::create_directories(dir.path() / "fortunes");
  std::ofstream(dir.file("fortunes/b")) << "second\n";
  std::ofstream(dir.file("fortunes/a")) << "first\n";
  std::ofstream(dir.file("fortunes/a.dat")) << "INDEX";
  EXPECT_EQ(data::read_text(dir.file("fortunes")), "first\nsecond\n");
  EXPECT_EQ(data::read_text(dir.file("fortunes/b")), "second\n");
  const std::string missing = dir.file("absent.txt");
  EXPECT_AG_ERROR(data::read_text(missing), missing + ": no such file or directory");
}

TEST(DataFashionMnist, MissingDirectoryNamesThePackage) {
  TempDir dir;
  const std::string d = dir.file("no-fashion-here");
  const std::string msg = error_of([&] { data::fashion_mnist(true, d); });
  EXPECT_TRUE(has(msg, "dataset-fashion-mnist")) << msg;
  EXPECT_TRUE(has(msg, d)) << msg;
  EXPECT_TRUE(has(msg, "train-images-idx3-ubyte.gz")) << msg;
  const std::string msg2 = error_of([&] { data::fashion_mnist(false, d); });
  EXPECT_TRUE(has(msg2, "t10k-images-idx3-ubyte.gz")) << msg2;
  EXPECT_TRUE(has(msg2, "dataset-fashion-mnist")) << msg2;
}

TEST(DataFashionMnist, SmallFakeCopyLoadsNormalised) {
  TempDir dir;
  // three 28x28 images of constant values 0, 255 and 73, labels 9, 0, 4
  std::vector<uint8_t> pix;
  for (int v : {0, 255, 73})
    for (int i = 0; i < 784; ++i) pix.push_back(uint8_t(v));
  data::write_idx(dir.file("t10k-images-idx3-ubyte.gz"), from_vector<uint8_t>(pix, {3, 28, 28}));
  data::write_idx(dir.file("t10k-labels-idx1-ubyte.gz"), from_vector<uint8_t>({9, 0, 4}, {3}));
  auto ds = data::fashion_mnist(false, dir.path().string());
  EXPECT_EQ(ds->size(), 3);
  EXPECT_EQ(ds->inputs().sizes(), (std::vector<int64_t>{3, 1, 28, 28}));
  EXPECT_EQ(ds->inputs().dtype(), kFloat32);
  EXPECT_EQ(ds->targets().dtype(), kInt64);
  EXPECT_EQ(ds->targets().to_vector<int64_t>(), (std::vector<int64_t>{9, 0, 4}));
  auto x = ds->inputs().to_vector<double>();
  EXPECT_NEAR(x[0], (0 - 0.2860) / 0.3530, 1e-5);
  EXPECT_NEAR(x[784], (1 - 0.2860) / 0.3530, 1e-5);
  EXPECT_NEAR(x[2 * 784 + 5], (73 / 255.0 - 0.2860) / 0.3530, 1e-5);
  // labels that do not match the images
  data::write_idx(dir.file("t10k-labels-idx1-ubyte.gz"), from_vector<uint8_t>({9, 0}, {2}));
  EXPECT_AG_ERROR(data::fashion_mnist(false, dir.path().string()), "expected 3 labels, got shape [2]");
  // labels are classes 0 to 9; another value would index past the 10 logits
  const std::string labels = dir.file("t10k-labels-idx1-ubyte.gz");
  data::write_idx(labels, from_vector<uint8_t>({9, 10, 4}, {3}));
  EXPECT_AG_ERROR(data::fashion_mnist(false, dir.path().string()),
                  "[fashion_mnist] " + labels + ": label 10 at index 1 is out of range (the 10 classes are 0 to 9)");
  data::write_idx(labels, from_vector<uint8_t>({9, 0, 255}, {3}));
  EXPECT_AG_ERROR(data::fashion_mnist(false, dir.path().string()), "label 255 at index 2 is out of range");
}

// Shards (what Lite's "ddp" gives each rank): with one shuffle_seed the loaders of all
// shards agree on each epoch's order, so together they hold every example, the padding
// repeats the order's start, and the next epoch has another order.
TEST(DataLoader, ShardsOfOneSeedCoverEveryExampleOncePerEpoch) {
  const int64_t size = 10, shards = 3;  // 4 per shard: 2 padded
  auto ds = std::make_shared<data::TensorDataset>(arange(0, double(size)).reshape({size, 1}), zeros({size}, kInt64));
  std::vector<data::DataLoader> loaders;
  for (int64_t s = 0; s < shards; ++s)
    loaders.emplace_back(ds, data::DataLoaderOptions{.batch_size = 3, .shuffle = true, .num_shards = shards, .shard = s,
                                                     .shuffle_seed = 1234});
  std::vector<std::vector<double>> epochs;
  for (int e = 0; e < 2; ++e) {
    std::vector<double> seen;
    for (auto& l : loaders) {
      EXPECT_EQ(l.shard_size(), 4);
      EXPECT_EQ(l.num_batches(), 2);
      for (const auto& b : l)
        for (double v : b.input.to_vector<double>()) seen.push_back(v);
    }
    ASSERT_EQ(seen.size(), size_t(12));
    std::vector<int> count(size, 0);
    for (double v : seen) ++count[size_t(v)];
    EXPECT_EQ(std::count(count.begin(), count.end(), 0), 0);
    EXPECT_EQ(std::count(count.begin(), count.end(), 2), 2);  // the two padded slots
    epochs.push_back(seen);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_AG_ERROR(data::DataLoader(ds, {.num_shards = 2, .shard = 2}), "shard must be in [0, num_shards)");
}
