#include "ampgrad/nn/serialize.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ampgrad/autograd.h"
#include "ampgrad/factories.h"

namespace ampgrad::nn {

namespace {

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
    Tensor t = t0.detach().cpu().contiguous();
    header[name] = {{"dtype", st_name(t.dtype())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
    blobs.push_back(t);
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // align the data to 8 bytes
  const uint64_t hlen = h.size();

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
  std::string h(hlen, '\0');
  in.read(h.data(), std::streamsize(hlen));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(h);
  } catch (const std::exception& e) {
    AG_ERROR("load", path, ": malformed header: ", e.what());
  }
  const uint64_t data_size = size - 8 - hlen;
  StateDict out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (metadata)
        for (auto m = it.value().begin(); m != it.value().end(); ++m) (*metadata)[m.key()] = m.value().get<std::string>();
      continue;
    }
    try {
      const DType dt = st_dtype(it.value().at("dtype").get<std::string>(), path);
      const auto shape = it.value().at("shape").get<std::vector<int64_t>>();
      const auto offs = it.value().at("data_offsets").get<std::vector<uint64_t>>();
      AG_CHECK(offs.size() == 2 && offs[0] <= offs[1] && offs[1] <= data_size, "load", path, ": tensor '",
               it.key(), "' has data offsets outside the file");
      Tensor t = empty(shape, dt);
      AG_CHECK(uint64_t(t.nbytes()) == offs[1] - offs[0], "load", path, ": tensor '", it.key(), "' of shape ",
               shape, " needs ", t.nbytes(), " bytes but has ", offs[1] - offs[0]);
      in.seekg(std::streamoff(8 + hlen + offs[0]));
      in.read(static_cast<char*>(t.raw_data()), std::streamsize(t.nbytes()));
      AG_CHECK(in.good(), "load", path, ": read failed for tensor '", it.key(), "'");
      out[it.key()] = t;
    } catch (const nlohmann::json::exception& e) {
      AG_ERROR("load", path, ": malformed entry '", it.key(), "': ", e.what());
    }
  }
  return out;
}

}  // namespace ampgrad::nn
