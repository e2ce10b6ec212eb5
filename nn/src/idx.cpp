#include "ampgrad/data/idx.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <cstdio>
#include <filesystem>
#include <vector>

#include "ampgrad/factories.h"
#include "input_file.h"

namespace ampgrad::data {

namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const std::string x(suffix);
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

// An IDX file holds at most this many data bytes (16 GiB): the dims are checked against it
// before anything is allocated. Fashion-MNIST's largest file holds 47 MB.
constexpr uint64_t kMaxIdxData = uint64_t(1) << 34;
// zlib's FAQ: deflate inflates at most 1032:1, so a gzip file of n bytes holds at most
// 1032 n bytes; dims that declare more cannot be true, and are refused before allocating.
constexpr uint64_t kMaxInflateRatio = 1032;

// A gzFile over an InputFile's descriptor (gzread reads plain files too).
struct Gz {
  gzFile f = nullptr;
  explicit Gz(const detail::InputFile& in) {
    const int fd = ::dup(in.fd());
    AG_CHECK(fd >= 0, "read_idx", in.path(), ": cannot open: ", std::strerror(errno));
    f = gzdopen(fd, "rb");
    if (!f) ::close(fd);
    AG_CHECK(f != nullptr, "read_idx", in.path(), ": cannot open (out of memory)");
  }
  ~Gz() { gzclose(f); }
  Gz(const Gz&) = delete;
  Gz& operator=(const Gz&) = delete;
  // Up to n bytes; fewer only at the end of the data. A zlib error throws.
  size_t read(void* buf, size_t n, const std::string& path) {
    size_t got = 0;
    while (got < n) {
      const unsigned chunk = unsigned(std::min<size_t>(n - got, size_t(1) << 30));
      const int r = gzread(f, static_cast<char*>(buf) + got, chunk);
      int err = Z_OK;
      const char* msg = gzerror(f, &err);
      AG_CHECK(r >= 0 && err == Z_OK, "read_idx", path, ": corrupt or truncated gzip data (", msg ? msg : "", ")");
      if (r == 0) break;
      got += size_t(r);
    }
    return got;
  }
};

}  // namespace

Tensor read_idx(const std::string& path) {
  const detail::InputFile in(path, "read_idx");
  Gz gz(in);
  // The header: magic (0, 0, type, ndim), then ndim big-endian u32 dims.
  unsigned char head[4 + 4 * 255];
  const size_t n4 = gz.read(head, 4, path);
  AG_CHECK(n4 == 4, "read_idx", path, ": too short for an IDX header (", n4, " bytes)");
  AG_CHECK(head[0] == 0 && head[1] == 0, "read_idx", path, ": bad magic number (first bytes ", int(head[0]), ", ",
           int(head[1]), "; expected 0, 0)");
  AG_CHECK(head[2] == 0x08, "read_idx", path, ": element type 0x", std::hex, int(head[2]),
           " is not supported (only unsigned bytes, 0x08)");
  const int ndim = head[3];
  AG_CHECK(ndim >= 1 && ndim <= 8, "read_idx", path, ": bad number of dims ", ndim);
  const size_t header = 4 + 4 * size_t(ndim);
  const size_t nh = gz.read(head + 4, header - 4, path);
  AG_CHECK(nh == header - 4, "read_idx", path, ": truncated header (", 4 + nh, " bytes for ", ndim, " dims)");
  std::vector<int64_t> shape;
  uint64_t count = 1;
  bool overflow = false;
  for (int d = 0; d < ndim; ++d) {
    const unsigned char* p = &head[4 + 4 * size_t(d)];
    const uint32_t v = uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
    shape.push_back(int64_t(v));
    overflow |= __builtin_mul_overflow(count, uint64_t(v), &count);
  }
  AG_CHECK(!overflow && count <= kMaxIdxData, "read_idx", path, ": dims ", shape,
           " are implausibly large: they need ", overflow ? std::string("more than 2^64") : std::to_string(count),
           " bytes of data, over the limit of ", kMaxIdxData, " bytes");
  // Before allocating: a plain file must have exactly the data; a gzip file must be able to.
  if (gzdirect(gz.f)) {
    const uint64_t have = in.size() >= header ? in.size() - header : 0;
    AG_CHECK(have == count, "read_idx", path, ": dims ", shape, " need ", count, " bytes of data but the file has ",
             have, have < count ? " (truncated)" : " (trailing data)");
  } else {
    AG_CHECK(count / kMaxInflateRatio <= in.size(), "read_idx", path, ": dims ", shape, " need ", count,
             " bytes of data, more than a gzip file of ", in.size(), " bytes can inflate to (at most ",
             kMaxInflateRatio, ":1)");
  }
  Tensor t = empty(shape, kUInt8);
  const size_t have = gz.read(t.data_ptr<uint8_t>(), size_t(count), path);
  AG_CHECK(have == count, "read_idx", path, ": dims ", shape, " need ", count, " bytes of data but the file has ",
           have, " (truncated)");
  // One byte more, to detect trailing data; reading to the stream's end checks its CRC.
  unsigned char extra;
  AG_CHECK(gz.read(&extra, 1, path) == 0, "read_idx", path, ": dims ", shape, " need ", count,
           " bytes of data but the file has more (trailing data)");
  return t;
}

void write_idx(const std::string& path, const Tensor& t0) {
  AG_CHECK(t0.dtype() == kUInt8, "write_idx", "expected a uint8 tensor, got ", dtype_name(t0.dtype()));
  AG_CHECK(t0.dim() >= 1 && t0.dim() <= 8, "write_idx", "expected 1 to 8 dims, got ", t0.dim());
  const Tensor t = detail::host_values(t0, "write_idx").contiguous();
  std::vector<unsigned char> bytes{0, 0, 0x08, static_cast<unsigned char>(t.dim())};
  for (int64_t s : t.sizes())
    for (int k = 3; k >= 0; --k) bytes.push_back(static_cast<unsigned char>((uint64_t(s) >> (8 * k)) & 0xff));
  const uint8_t* p = t.data_ptr<uint8_t>();
  bytes.insert(bytes.end(), p, p + t.numel());
  const std::string tmp = path + ".tmp";
  gzFile f = gzopen(tmp.c_str(), ends_with(path, ".gz") ? "wb" : "wbT");
  AG_CHECK(f != nullptr, "write_idx", tmp, ": cannot open for writing");
  const bool ok = gzwrite(f, bytes.data(), unsigned(bytes.size())) == int(bytes.size());
  const bool closed = gzclose(f) == Z_OK;
  if (!ok || !closed) {
    std::remove(tmp.c_str());
    AG_ERROR("write_idx", path, ": write failed");
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace ampgrad::data
