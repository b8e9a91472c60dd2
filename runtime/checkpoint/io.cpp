#include "runtime/checkpoint/io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "runtime/checkpoint/crc32c.h"
#include "util/error.h"
#include "util/output_file.h"

namespace tessera::checkpoint::io {

std::string errno_message() { return std::strerror(errno); }

File File::open_read(const std::string& path) {
  // O_NONBLOCK: a FIFO must not block the open (it is refused below); cleared for the reads.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw TESSERA_INPUT_ERROR("cannot open " + path + ": " + errno_message());
  File f(fd, path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw TESSERA_INPUT_ERROR("cannot stat " + path + ": " + errno_message());
  if (!S_ISREG(st.st_mode))
    throw TESSERA_INPUT_ERROR(path + " is " + util::file_kind(st.st_mode) + ", not a regular file: refused");
  ::fcntl(fd, F_SETFL, O_RDONLY);
  return f;
}

File File::create(const std::string& path) {
  int fd = util::create_fresh(path.c_str());
  if (fd < 0) throw TESSERA_INPUT_ERROR("cannot create " + path + ": " + util::output_error(path, errno));
  return File(fd, path);
}

uint64_t File::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw TESSERA_INPUT_ERROR("cannot stat " + path_ + ": " + errno_message());
  return static_cast<uint64_t>(st.st_size);
}

std::string read_all(const std::string& path, uint64_t max_bytes) {
  const File f = File::open_read(path);
  const uint64_t n = f.size();
  if (n > max_bytes)
    throw TESSERA_INPUT_ERROR(path + " holds " + std::to_string(n) + " bytes, more than the " + std::to_string(max_bytes) +
                              " it may");
  std::string text(static_cast<size_t>(n), '\0');
  f.pread_all(text.data(), text.size(), 0);
  return text;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

void File::write_all(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && no_space(errno)) {
      const std::string why = errno_message();
      throw TESSERA_INPUT_ERROR("cannot write " + path_ + ": " + why + " (" + std::to_string(n) + " more bytes needed, " +
                                std::to_string(std::max<int64_t>(free_bytes(path_), 0)) + " free)");
    }
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

bool File::reserve(uint64_t bytes) {
  if (bytes == 0) return true;
  int rc;
  do rc = ::fallocate(fd_, 0, 0, static_cast<off_t>(bytes));
  while (rc != 0 && errno == EINTR);
  if (rc == 0) return true;
  const int err = errno;
  if (err == EOPNOTSUPP || err == ENOSYS || err == EINVAL) return false;  // e.g. some network file systems
  throw TESSERA_INPUT_ERROR("cannot allocate " + std::to_string(bytes) + " bytes for " + path_ + ": " +
                            std::strerror(err) + " (" + std::to_string(std::max<int64_t>(free_bytes(path_), 0)) +
                            " bytes free)");
}

void File::truncate(uint64_t bytes) {
  if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0)
    throw TESSERA_INPUT_ERROR("cannot truncate " + path_ + ": " + errno_message());
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
  piece_crc_ = crc32c(data, n, piece_crc_);
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

int64_t free_bytes(const std::string& path) {
  struct statvfs st {};
  if (::statvfs(path.c_str(), &st) != 0) {
    const size_t slash = path.find_last_of('/');  // the file may not exist (yet): its directory
    if (slash == std::string::npos || ::statvfs(slash == 0 ? "/" : path.substr(0, slash).c_str(), &st) != 0) return -1;
  }
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

bool no_space(int err) { return err == ENOSPC || err == EDQUOT; }

void drop_page_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

}  // namespace tessera::checkpoint::io
