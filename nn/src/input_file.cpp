#include "input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ampgrad/error.h"

namespace ampgrad::detail {

namespace {

std::string reason(int err) {
  switch (err) {
    case ENOENT: return "no such file";
    case EACCES:
    case EPERM: return "permission denied";
    default: return std::strerror(err);
  }
}

// Empty for a regular file, else what the file is.
const char* not_regular(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}

}  // namespace

InputFile::InputFile(const std::string& path, const char* op) : path_(path), op_(op) {
  // stat first: a device or FIFO is refused without being opened (opening some has effects).
  struct stat st {};
  AG_CHECK(::stat(path.c_str(), &st) == 0, op, path, ": cannot open: ", reason(errno));
  const char* kind = not_regular(st.st_mode);
  AG_CHECK(!*kind, op, path, ": is ", kind, ", not a regular file");
  // O_NONBLOCK: should the path become a FIFO between the stat and the open, open returns
  // at once, and the fstat below refuses it.
  int fd;
  do fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  AG_CHECK(fd >= 0, op, path, ": cannot open: ", reason(errno));
  fd_ = fd;
  if (::fstat(fd_, &st) != 0 || *not_regular(st.st_mode)) {
    const std::string what = *not_regular(st.st_mode) ? std::string("is ") + not_regular(st.st_mode) + ", not a regular file"
                                                      : std::string("cannot stat: ") + std::strerror(errno);
    ::close(fd_);
    AG_ERROR(op, path, ": ", what);
  }
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
  size_ = uint64_t(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_at(uint64_t offset, void* buf, size_t n, const std::string& what) const {
  char* p = static_cast<char*>(buf);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd_, p + got, n - got, off_t(offset + got));
    if (r < 0 && errno == EINTR) continue;
    AG_CHECK(r >= 0, op_, path_, ": read failed for ", what, ": ", std::strerror(errno));
    AG_CHECK(r > 0, op_, path_, ": short read for ", what, ": got ", got, " of ", n, " bytes at offset ", offset,
             " (the file shrank while it was read?)");
    got += size_t(r);
  }
}

}  // namespace ampgrad::detail
