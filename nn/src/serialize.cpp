#include "ampgrad/nn/serialize.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>

#include "ampgrad/autograd.h"
#include "ampgrad/factories.h"

namespace ampgrad::nn {

namespace {

// safetensors data is little-endian; tensors are written and read as they lie in memory.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

// The Python/Rust safetensors library refuses headers over 100 MB, writing or reading.
constexpr uint64_t kMaxHeader = 100'000'000;

const char* st_name(DType dt) {
  switch (dt) {
    case kFloat32: return "F32";
    case kFloat64: return "F64";
    case kFloat16: return "F16";
    case kBFloat16: return "BF16";
    case kInt64: return "I64";
    case kInt32: return "I32";
    case kUInt8: return "U8";
    case kBool: return "BOOL";
  }
  return "?";
}

DType st_dtype(const std::string& s, const std::string& path) {
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt64, kInt32, kUInt8, kBool})
    if (s == st_name(dt)) return dt;
  AG_ERROR("load", path, ": unsupported dtype '", s, "'");
}

// A header list of integers (shape, data_offsets). Each must be a non-negative JSON integer
// no larger than max: nlohmann would otherwise turn -1 or 2.5 silently into some u64.
std::vector<uint64_t> uints(const nlohmann::json& v, uint64_t max, const std::string& path,
                            const std::string& name, const char* field) {
  bool ok = v.is_array();
  std::vector<uint64_t> out;
  if (ok)
    for (const auto& x : v) {
      ok = ok && x.is_number_unsigned() && x.get<uint64_t>() <= max;
      if (ok) out.push_back(x.get<uint64_t>());
    }
  AG_CHECK(ok, "load", path, ": tensor '", name, "' has ", field, " ", v.dump(),
           ", not a list of non-negative integers");
  return out;
}

void write_all(int fd, const void* p, size_t n, const std::string& path) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) AG_ERROR("save", path, ": write failed: ", std::strerror(errno));
    c += w;
    n -= size_t(w);
  }
}

}  // namespace

void save(const std::string& path, const StateDict& tensors, const Metadata& metadata) {
  nlohmann::json header = nlohmann::json::object();
  std::vector<Tensor> blobs;
  size_t offset = 0;
  for (const auto& [name, t0] : tensors) {
    AG_CHECK(t0.defined(), "save", "tensor '", name, "' is undefined");
    // The header key __metadata__ is the metadata map: a tensor by that name would not load.
    AG_CHECK(name != "__metadata__", "save", path, ": '__metadata__' is reserved and cannot name a tensor");
    Tensor t = detail::host_values(t0.detach(), "save").contiguous();
    header[name] = {{"dtype", st_name(t.dtype())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
    blobs.push_back(t);
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string h;
  try {
    h = header.dump();
  } catch (const nlohmann::json::exception& e) {  // names and metadata must be valid UTF-8
    AG_ERROR("save", path, ": cannot write the header: ", e.what());
  }
  h.append((8 - h.size() % 8) % 8, ' ');  // the spec: spaces pad the header to a multiple of 8
  const uint64_t hlen = h.size();
  AG_CHECK(hlen <= kMaxHeader, "save", path, ": header of ", hlen, " bytes is over the safetensors limit of ",
           kMaxHeader, " bytes");

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  AG_CHECK(fd >= 0, "save", tmp, ": cannot create: ", std::strerror(errno));
  try {
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(hlen >> (8 * i));
    write_all(fd, len, 8, tmp);
    write_all(fd, h.data(), h.size(), tmp);
    for (const Tensor& t : blobs) write_all(fd, t.raw_data(), t.nbytes(), tmp);
    if (::fsync(fd) != 0) AG_ERROR("save", tmp, ": fsync failed: ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    std::remove(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    std::remove(tmp.c_str());
    AG_ERROR("save", path, ": cannot replace: ", err);
  }
}

StateDict load(const std::string& path, Metadata* metadata) {
  std::ifstream in(path, std::ios::binary);
  AG_CHECK(in.good(), "load", path, ": cannot open (no such file?)");
  in.seekg(0, std::ios::end);
  const uint64_t size = uint64_t(in.tellg());
  in.seekg(0);
  AG_CHECK(size >= 8, "load", path, ": too short for a safetensors file (", size, " bytes)");
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= uint64_t(len[i]) << (8 * i);
  AG_CHECK(hlen <= size - 8, "load", path, ": header length ", hlen, " exceeds the file size ", size);
  // Checked before allocating the header: a corrupt length must not ask for gigabytes.
  AG_CHECK(hlen <= kMaxHeader, "load", path, ": header length ", hlen, " is over the safetensors limit of ",
           kMaxHeader, " bytes");
  std::string h(hlen, '\0');
  in.read(h.data(), std::streamsize(hlen));
  AG_CHECK(!h.empty() && h[0] == '{', "load", path, ": header does not start with '{'");
  // nlohmann's parser stops at a NUL byte and would accept "{...}\0garbage"; JSON text has
  // no raw NUL, and the padding the spec allows is spaces.
  const size_t nul = h.find('\0');
  AG_CHECK(nul == std::string::npos, "load", path, ": malformed header: a NUL byte at offset ", nul,
           " (the padding must be spaces)");
  nlohmann::json header;
  // A name given twice would silently keep the last entry (as a JSON object does): refuse.
  std::string duplicate;
  std::set<std::string> top_keys;
  const auto check_keys = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key && !top_keys.insert(parsed.get<std::string>()).second &&
        duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  try {
    header = nlohmann::json::parse(h, check_keys);  // the trailing space padding is JSON whitespace
  } catch (const std::exception& e) {
    AG_ERROR("load", path, ": malformed header: ", e.what());
  }
  AG_CHECK(duplicate.empty(), "load", path, ": malformed header: the name '", duplicate, "' appears twice");

  // First the whole header is checked, then the data is read: a bad file allocates nothing.
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  const uint64_t data_size = size - 8 - hlen;
  std::vector<Entry> entries;
  Metadata meta;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      AG_CHECK(it.value().is_object(), "load", path, ": __metadata__ is not a map of strings");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        AG_CHECK(m.value().is_string(), "load", path, ": __metadata__ value of '", m.key(),
                 "' is not a string: ", m.value().dump());
        meta[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    try {
      const auto& e = it.value();
      const DType dt = st_dtype(e.at("dtype").get<std::string>(), path);
      // Dims within int64 (ag's shape type), offsets any u64; both checked before use.
      const auto dims = uints(e.at("shape"), uint64_t(INT64_MAX), path, name, "shape");
      const auto offs = uints(e.at("data_offsets"), UINT64_MAX, path, name, "data_offsets");
      AG_CHECK(offs.size() == 2 && offs[0] <= offs[1] && offs[1] <= data_size, "load", path, ": tensor '", name,
               "' has data offsets ", e.at("data_offsets").dump(), " outside the file's ", data_size,
               " data bytes");
      std::vector<int64_t> shape(dims.begin(), dims.end());
      // numel * itemsize in u64 with overflow checks: a huge shape must not wrap around to a match.
      uint64_t nbytes = itemsize(dt);
      bool overflow = false;
      for (uint64_t d : dims) overflow |= __builtin_mul_overflow(nbytes, d, &nbytes);
      AG_CHECK(!overflow && nbytes == offs[1] - offs[0], "load", path, ": tensor '", name, "' of dtype ",
               st_name(dt), " and shape ", shape, " needs ",
               overflow ? std::string("more than 2^64") : std::to_string(nbytes), " bytes but has ",
               offs[1] - offs[0]);
      entries.push_back({name, dt, std::move(shape), offs[0], offs[1]});
    } catch (const nlohmann::json::exception& e) {
      AG_ERROR("load", path, ": malformed entry '", name, "': ", e.what());
    }
  }
  // The spec: tensors tile the data buffer exactly, in any order in the header, with no
  // overlap (one byte read as two tensors) and no hole (bytes that belong to nothing).
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  uint64_t covered = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    AG_CHECK(e.begin >= covered, "load", path, ": tensors '", entries[i - 1].name, "' and '", e.name,
             "' overlap: data offsets [", entries[i - 1].begin, ", ", entries[i - 1].end, ") and [", e.begin,
             ", ", e.end, ")");
    AG_CHECK(e.begin == covered, "load", path, ": hole in the data: bytes [", covered, ", ", e.begin,
             ") belong to no tensor");
    covered = e.end;
  }
  AG_CHECK(covered == data_size, "load", path, ": hole in the data: bytes [", covered, ", ", data_size,
           ") belong to no tensor");

  StateDict out;
  for (const Entry& e : entries) {
    Tensor t = empty(e.shape, e.dtype);
    if (t.nbytes() > 0) {
      in.seekg(std::streamoff(8 + hlen + e.begin));
      in.read(static_cast<char*>(t.raw_data()), std::streamsize(t.nbytes()));
      AG_CHECK(in.good(), "load", path, ": read failed for tensor '", e.name, "'");
    }
    if (e.dtype == kBool) {  // a byte other than 0 or 1 is not a valid C++ bool; numpy reads it as true
      auto* b = static_cast<unsigned char*>(t.raw_data());
      for (size_t i = 0; i < t.nbytes(); ++i) b[i] = b[i] != 0;
    }
    out[e.name] = t;
  }
  if (metadata)
    for (auto& [k, v] : meta) (*metadata)[k] = v;
  return out;
}

}  // namespace ampgrad::nn
