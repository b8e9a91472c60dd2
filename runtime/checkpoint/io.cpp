#include "runtime/checkpoint/io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "runtime/checkpoint/crc32c.h"
#include "runtime/error.h"

namespace tessera::checkpoint::io {

std::string errno_message() { return std::strerror(errno); }

File File::open_read(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw TESSERA_INPUT_ERROR("cannot open " + path + ": " + errno_message());
  return File(fd, path);
}

File File::create(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw TESSERA_INPUT_ERROR("cannot create " + path + ": " + errno_message());
  return File(fd, path);
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

void File::write_all(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw TESSERA_INPUT_ERROR("cannot write " + path_ + ": " + errno_message());
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void File::pread_all(void* data, size_t n, uint64_t offset) const {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::pread(fd_, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw TESSERA_INPUT_ERROR("cannot read " + path_ + ": " + errno_message());
    if (r == 0) throw TESSERA_INPUT_ERROR("file " + path_ + " is shorter than the manifest says (truncated?)");
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

size_t File::read_some(void* data, size_t n) {
  for (;;) {
    ssize_t r = ::read(fd_, data, n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw TESSERA_INPUT_ERROR("cannot read " + path_ + ": " + errno_message());
    return static_cast<size_t>(r);
  }
}

void File::fsync() {
  if (::fsync(fd_) != 0) throw TESSERA_INPUT_ERROR("cannot fsync " + path_ + ": " + errno_message());
}

void File::close() {
  int fd = fd_;
  fd_ = -1;
  if (fd >= 0 && ::close(fd) != 0) throw TESSERA_INPUT_ERROR("cannot close " + path_ + ": " + errno_message());
}

ChecksumWriter::ChecksumWriter(File& f, size_t buffer_bytes) : f_(f), buf_(buffer_bytes, '\0') {}

void ChecksumWriter::write(const void* data, size_t n) {
  crc_ = crc32c(data, n, crc_);
  bytes_ += n;
  if (used_ + n > buf_.size()) flush();
  if (n >= buf_.size()) {  // large pieces go straight to the file
    f_.write_all(data, n);
    return;
  }
  std::memcpy(&buf_[used_], data, n);
  used_ += n;
}

void ChecksumWriter::flush() {
  if (used_ > 0) f_.write_all(buf_.data(), used_);
  used_ = 0;
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw TESSERA_INPUT_ERROR("cannot open directory " + dir + ": " + errno_message());
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw TESSERA_INPUT_ERROR("cannot fsync directory " + dir + ": " + std::strerror(err));
}

void drop_page_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

}  // namespace tessera::checkpoint::io
