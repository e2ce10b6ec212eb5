// What the file-loading fuzz targets share: the input bytes written to one file of this
// process (rewritten for every input), so that the loaders run exactly as on a user's file.
// The files go when the process exits normally; scripts/fuzz also gives each target its own
// TMPDIR and fails a run that leaves anything there.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

namespace fuzz {

/// The bytes as a file whose name ends in `suffix` (".gz" selects gzip in read_idx).
inline const std::string& as_file(const uint8_t* data, size_t size, const std::string& suffix = "") {
  struct Files {
    std::map<std::string, std::string> paths;  // one file per suffix
    ~Files() {
      for (const auto& [suffix, path] : paths) std::remove(path.c_str());
    }
  };
  static Files files;
  std::string& path = files.paths[suffix];
  if (path.empty()) {
    const char* dir = std::getenv("TMPDIR");
    path = std::string(dir && *dir ? dir : "/tmp") + "/ampgrad-fuzz-" + std::to_string(::getpid()) + suffix;
  }
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

}  // namespace fuzz
