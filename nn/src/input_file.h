// One way for loaders to open what they read (safetensors files, IDX files, and through
// nn::load the Lite and optimizer checkpoints): only regular files, refused by name
// otherwise before anything reads (a FIFO would block, a directory reads as garbage);
// errors from errno ("permission denied", "no such file"); every read checked for length.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ampgrad::detail {

class InputFile {
 public:
  /// Opens `path` for reading; throws "[op] path: cannot open: <reason>", or
  /// "[op] path: is a <kind>, not a regular file".
  InputFile(const std::string& path, const char* op);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  int fd() const { return fd_; }
  /// The size fstat reported at open.
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  /// Reads exactly n bytes at `offset`; a short read or an error throws, naming `what`.
  void read_at(uint64_t offset, void* buf, size_t n, const std::string& what) const;

 private:
  std::string path_;
  const char* op_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

}  // namespace ampgrad::detail
