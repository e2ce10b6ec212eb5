#include "ampgrad/nn/serialize.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unordered_set>
#include <nlohmann/json.hpp>
#include <tuple>

#include "ampgrad/autograd.h"
#include "ampgrad/factories.h"
#include "input_file.h"

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

// Deeper JSON is refused before a tree is built (safetensors headers nest three levels):
// nothing that recurses (dump(), a recursive walk) then meets an unbounded depth.
constexpr int kMaxDepth = 64;

// The first pass over a header, as nlohmann SAX events: linear in the header's size, with
// no tree. Records the first problem in `error`.
struct HeaderScan {
  using json = nlohmann::json;
  int depth = 0;
  std::unordered_set<std::string> top_keys;
  std::string error;

  bool open() {
    if (++depth <= kMaxDepth) return true;
    error = "JSON nested deeper than " + std::to_string(kMaxDepth) + " levels";
    return false;
  }
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const json::string_t&) { return true; }
  bool string(json::string_t&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) { return open(); }
  bool start_array(std::size_t) { return open(); }
  bool end_object() { return --depth, true; }
  bool end_array() { return --depth, true; }
  bool key(json::string_t& k) {
    if (depth != 1 || top_keys.insert(k).second) return true;
    error = "the name '" + k + "' appears twice";
    return false;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    error = e.what();
    return false;
  }
};

// A header value for an error message, bounded in length: scalars and short flat lists in
// JSON, anything else described.
std::string show(const nlohmann::json& v) {
  const auto scalar = [](const nlohmann::json& x) {
    if (x.is_string() && x.get_ref<const std::string&>().size() > 64)
      return nlohmann::json(x.get_ref<const std::string&>().substr(0, 64))
                 .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "...";
    return x.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  if (v.is_primitive()) return scalar(v);
  if (v.is_array() && v.size() <= 16 &&
      std::all_of(v.begin(), v.end(), [](const nlohmann::json& x) { return x.is_primitive(); })) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + scalar(v[i]);
    return s + "]";
  }
  return std::string(v.is_array() ? "a list" : "an object") + " of " + std::to_string(v.size()) +
         (v.size() == 1 ? " item" : " items");
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
  AG_CHECK(ok, "load", path, ": tensor '", name, "' has ", field, " ", show(v),
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
  // The rename is durable only once the folder's entry is on disk: without this a power
  // cut can leave the old name pointing at nothing.
  const std::string::size_type slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    const int rc = ::fsync(dfd);
    const int err = errno;
    ::close(dfd);
    AG_CHECK(rc == 0 || err == EINVAL, "save", path, ": fsync of the folder failed: ", std::strerror(err));
  }
}

namespace {

// A tensor's place in the data, from a header that passed every check.
struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};
struct Header {
  uint64_t hlen = 0;
  std::vector<Entry> entries;  // sorted by offset, tiling the data exactly
  Metadata meta;
};

// The header's length from the file's first 8 bytes (little-endian), checked against the
// file's size and the format's limit.
uint64_t read_header_length(const detail::InputFile& in, uint64_t size, const std::string& path) {
  AG_CHECK(size >= 8, "load", path, ": too short for a safetensors file (", size, " bytes)");
  unsigned char len[8];
  in.read_at(0, len, 8, "the header length");
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= uint64_t(len[i]) << (8 * i);
  AG_CHECK(hlen <= size - 8, "load", path, ": header length ", hlen, " exceeds the file size ", size);
  // Checked before allocating the header: a corrupt length must not ask for gigabytes.
  AG_CHECK(hlen <= kMaxHeader, "load", path, ": header length ", hlen, " is over the safetensors limit of ",
           kMaxHeader, " bytes");
  return hlen;
}

// The header's text: an object, with no NUL byte in it.
std::string read_header_text(const detail::InputFile& in, uint64_t hlen, const std::string& path) {
  std::string h(hlen, '\0');
  in.read_at(8, h.data(), hlen, "the header");
  AG_CHECK(!h.empty() && h[0] == '{', "load", path, ": header does not start with '{'");
  // nlohmann's parser stops at a NUL byte and would accept "{...}\0garbage"; JSON text has
  // no raw NUL, and the padding the spec allows is spaces.
  const size_t nul = h.find('\0');
  AG_CHECK(nul == std::string::npos, "load", path, ": malformed header: a NUL byte at offset ", nul,
           " (the padding must be spaces)");
  return h;
}

// The header's JSON tree. First pass (SAX, no tree): syntax, nesting depth, and names given
// twice, which a JSON object would silently keep the last of. The tree is built only after
// it passes, with no parser callback (nlohmann's callback parser rescans the enclosing object
// at the end of every value, which is quadratic in the number of tensors).
nlohmann::json parse_header(const std::string& h, const std::string& path) {
  HeaderScan scan;
  bool parsed = false;
  try {
    parsed = nlohmann::json::sax_parse(h, &scan);  // the trailing space padding is JSON whitespace
  } catch (const std::exception& e) {
    AG_ERROR("load", path, ": malformed header: ", e.what());
  }
  AG_CHECK(scan.error.empty(), "load", path, ": malformed header: ", scan.error);
  AG_CHECK(parsed, "load", path, ": malformed header");
  try {
    return nlohmann::json::parse(h);
  } catch (const std::exception& e) {
    AG_ERROR("load", path, ": malformed header: ", e.what());
  }
}

// The __metadata__ entry: a map of strings, into meta.
void read_metadata(const nlohmann::json& value, const std::string& path, Metadata& meta) {
  AG_CHECK(value.is_object(), "load", path, ": __metadata__ is not a map of strings");
  for (auto m = value.begin(); m != value.end(); ++m) {
    AG_CHECK(m.value().is_string(), "load", path, ": __metadata__ value of '", m.key(),
             "' is not a string: ", show(m.value()));
    meta[m.key()] = m.value().get<std::string>();
  }
}

// A tensor's entry: a known dtype, a shape and data offsets within the data_size bytes of
// data, which hold exactly the shape's bytes.
Entry read_entry(const std::string& name, const nlohmann::json& e, uint64_t data_size, const std::string& path) {
  try {
    const DType dt = st_dtype(e.at("dtype").get<std::string>(), path);
    // Dims within int64 (ag's shape type), offsets any u64; both checked before use.
    const auto dims = uints(e.at("shape"), uint64_t(INT64_MAX), path, name, "shape");
    const auto offs = uints(e.at("data_offsets"), UINT64_MAX, path, name, "data_offsets");
    AG_CHECK(offs.size() == 2 && offs[0] <= offs[1] && offs[1] <= data_size, "load", path, ": tensor '", name,
             "' has data offsets ", show(e.at("data_offsets")), " outside the file's ", data_size, " data bytes");
    std::vector<int64_t> shape(dims.begin(), dims.end());
    // numel * itemsize in u64 with overflow checks: a huge shape must not wrap around to a match.
    uint64_t nbytes = itemsize(dt);
    bool overflow = false;
    for (uint64_t d : dims) overflow |= __builtin_mul_overflow(nbytes, d, &nbytes);
    AG_CHECK(!overflow && nbytes == offs[1] - offs[0], "load", path, ": tensor '", name, "' of dtype ", st_name(dt),
             " and shape ", shape, " needs ", overflow ? std::string("more than 2^64") : std::to_string(nbytes),
             " bytes but has ", offs[1] - offs[0]);
    return {name, dt, std::move(shape), offs[0], offs[1]};
  } catch (const nlohmann::json::exception& ex) {
    AG_ERROR("load", path, ": malformed entry '", name, "': ", ex.what());
  }
}

// Sorts the entries by offset and checks the spec's rule: tensors tile the data buffer
// exactly, in any order in the header, with no overlap (one byte read as two tensors) and
// no hole (bytes that belong to nothing).
void sort_and_check_tiling(std::vector<Entry>& entries, uint64_t data_size, const std::string& path) {
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  uint64_t covered = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    AG_CHECK(e.begin >= covered, "load", path, ": tensors '", entries[i - 1].name, "' and '", e.name,
             "' overlap: data offsets [", entries[i - 1].begin, ", ", entries[i - 1].end, ") and [", e.begin, ", ",
             e.end, ")");
    AG_CHECK(e.begin == covered, "load", path, ": hole in the data: bytes [", covered, ", ", e.begin,
             ") belong to no tensor");
    covered = e.end;
  }
  AG_CHECK(covered == data_size, "load", path, ": hole in the data: bytes [", covered, ", ", data_size,
           ") belong to no tensor");
}

// Reads and checks the whole header (nothing of the data): both load() and
// load_metadata() refuse the same files.
Header read_header(const detail::InputFile& in, const std::string& path) {
  const uint64_t size = in.size();
  const uint64_t hlen = read_header_length(in, size, path);
  const nlohmann::json header = parse_header(read_header_text(in, hlen, path), path);
  // First the whole header is checked, then the data is read: a bad file allocates nothing.
  const uint64_t data_size = size - 8 - hlen;
  Header hd{hlen, {}, {}};
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") read_metadata(it.value(), path, hd.meta);
    else hd.entries.push_back(read_entry(it.key(), it.value(), data_size, path));
  }
  sort_and_check_tiling(hd.entries, data_size, path);
  return hd;
}

}  // namespace

Metadata load_metadata(const std::string& path) {
  const detail::InputFile in(path, "load");
  return read_header(in, path).meta;
}

StateDict load(const std::string& path, Metadata* metadata) {
  const detail::InputFile in(path, "load");
  const Header hd = read_header(in, path);
  const uint64_t hlen = hd.hlen;
  const Metadata& meta = hd.meta;
  const std::vector<Entry>& entries = hd.entries;
  StateDict out;
  for (const Entry& e : entries) {
    Tensor t = empty(e.shape, e.dtype);
    if (t.nbytes() > 0) in.read_at(8 + hlen + e.begin, t.raw_data(), t.nbytes(), "tensor '" + e.name + "'");
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
