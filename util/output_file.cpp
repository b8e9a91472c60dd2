#include "util/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <vector>

namespace tessera::util {

int create_fresh(const char* path) {
  ::unlink(path);  // a stale file, or a planted link (removed; never its target)
  return ::open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
}

int open_append(const char* path) {
  // O_NONBLOCK: opening a FIFO must not wait for a reader; it is refused below anyway.
  const int fd = ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  struct stat st {};
  const int err = ::fstat(fd, &st) != 0 ? errno : S_ISREG(st.st_mode) ? 0 : EINVAL;
  if (err != 0) {
    ::close(fd);
    errno = err;
    return -1;
  }
  ::fcntl(fd, F_SETFL, O_WRONLY | O_APPEND);
  return fd;
}

std::string file_kind(unsigned mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

std::string output_error(const std::string& path, int err) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    std::vector<char> target(PATH_MAX + 1, '\0');
    const ssize_t n = ::readlink(path.c_str(), target.data(), PATH_MAX);
    return "it is a symbolic link to '" + std::string(target.data(), n > 0 ? static_cast<size_t>(n) : 0) +
           "' (Tessera never writes through a link: remove it)";
  }
  if ((err == EEXIST || err == EINVAL || err == EISDIR || err == ENXIO) && ::lstat(path.c_str(), &st) == 0 &&
      !S_ISREG(st.st_mode))
    return "it is " + file_kind(st.st_mode) + ", not a regular file";
  return std::strerror(err);
}

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool replace_file(const std::string& path, const std::string& text, std::string& why) {
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmp.data());  // O_CREAT | O_EXCL, a name nobody could plant in advance
  if (fd < 0) {
    why = "cannot create a temporary beside " + path + ": " + std::strerror(errno);
    return false;
  }
  bool ok = ::fchmod(fd, 0644) == 0 && write_all(fd, text.data(), text.size()) && ::fsync(fd) == 0;
  int err = errno;
  if (::close(fd) != 0 && ok) ok = false, err = errno;
  if (ok && ::rename(tmp.c_str(), path.c_str()) == 0) return true;
  why = "cannot write " + path + ": " + (ok ? output_error(path, errno) : std::string(std::strerror(err)));
  ::unlink(tmp.c_str());
  return false;
}

bool OutputFile::open(const std::string& path, Mode mode, std::string& why) {
  close();
  fd_ = mode == Mode::Fresh ? create_fresh(path.c_str()) : open_append(path.c_str());
  if (fd_ < 0) why = output_error(path, errno);
  return fd_ >= 0;
}

void OutputFile::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace tessera::util
