// libFuzzer target: data::read_idx on arbitrary bytes as a plain file, as a gzip file (the
// decompressor's own checks and bounds), and gzip-compressed by the target (so the fuzzer
// explores the IDX layout behind the decompressor).
#include <zlib.h>

#include <ampgrad/ampgrad.h>
#include <ampgrad/data/idx.h>

#include <vector>

#include "fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (const char* suffix : {".idx", ".raw.gz"}) {
    try {
      (void)ag::data::read_idx(fuzz::as_file(data, size, suffix));
    } catch (const ag::Error&) {
    }
  }
  // gzip of the input (a valid stream, so the IDX checks behind zlib are what is fuzzed).
  std::vector<uint8_t> gz(compressBound(uLong(size)) + 32);
  z_stream zs{};
  if (deflateInit2(&zs, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return 0;
  zs.next_in = const_cast<Bytef*>(data);
  zs.avail_in = uInt(size);
  zs.next_out = gz.data();
  zs.avail_out = uInt(gz.size());
  const int st = deflate(&zs, Z_FINISH);
  const size_t n = gz.size() - zs.avail_out;
  deflateEnd(&zs);
  if (st != Z_STREAM_END) return 0;
  try {
    (void)ag::data::read_idx(fuzz::as_file(gz.data(), n, ".idx.gz"));
  } catch (const ag::Error&) {
  }
  return 0;
}
