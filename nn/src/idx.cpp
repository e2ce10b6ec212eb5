#include "ampgrad/data/idx.h"

#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <vector>

#include "ampgrad/factories.h"

namespace ampgrad::data {

namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const std::string x(suffix);
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

// The whole (decompressed) file. gzread reads plain files too.
std::vector<unsigned char> slurp(const std::string& path) {
  AG_CHECK(std::filesystem::exists(path), "read_idx", path, ": no such file");
  gzFile f = gzopen(path.c_str(), "rb");
  AG_CHECK(f != nullptr, "read_idx", path, ": cannot open");
  std::vector<unsigned char> out;
  unsigned char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + n);
  int err = 0;
  const char* msg = gzerror(f, &err);
  const std::string what = msg ? msg : "";
  gzclose(f);
  AG_CHECK(n == 0 && err == Z_OK, "read_idx", path, ": corrupt or truncated gzip data (", what, ")");
  return out;
}

}  // namespace

Tensor read_idx(const std::string& path) {
  const std::vector<unsigned char> bytes = slurp(path);
  AG_CHECK(bytes.size() >= 4, "read_idx", path, ": too short for an IDX header (", bytes.size(), " bytes)");
  AG_CHECK(bytes[0] == 0 && bytes[1] == 0, "read_idx", path, ": bad magic number (first bytes ",
           int(bytes[0]), ", ", int(bytes[1]), "; expected 0, 0)");
  AG_CHECK(bytes[2] == 0x08, "read_idx", path, ": element type 0x", std::hex, int(bytes[2]),
           " is not supported (only unsigned bytes, 0x08)");
  const int ndim = bytes[3];
  AG_CHECK(ndim >= 1 && ndim <= 8, "read_idx", path, ": bad number of dims ", ndim);
  const size_t header = 4 + 4 * size_t(ndim);
  AG_CHECK(bytes.size() >= header, "read_idx", path, ": truncated header (", bytes.size(), " bytes for ",
           ndim, " dims)");
  std::vector<int64_t> shape;
  uint64_t count = 1;
  for (int d = 0; d < ndim; ++d) {
    const unsigned char* p = &bytes[4 + 4 * size_t(d)];
    const uint32_t v = uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
    shape.push_back(int64_t(v));
    const bool wrapped = __builtin_mul_overflow(count, v, &count);  // a product past 2^64 wraps small
    AG_CHECK(!wrapped && count < (uint64_t(1) << 40), "read_idx", path, ": dims ", shape, " are implausibly large");
  }
  const uint64_t have = bytes.size() - header;
  AG_CHECK(have == count, "read_idx", path, ": dims ", shape, " need ", count, " bytes of data but the file has ",
           have, have < count ? " (truncated)" : " (trailing data)");
  Tensor t = empty(shape, kUInt8);
  std::copy(bytes.begin() + std::ptrdiff_t(header), bytes.end(), t.data_ptr<uint8_t>());
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
