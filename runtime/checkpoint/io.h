// Small POSIX file helpers for checkpoints: every failure throws Error(Input) naming the path and
// the OS reason (disk full, permission denied, missing file are the user's to fix).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera::checkpoint::io {

// An open file descriptor, closed on destruction.
class File {
 public:
  // Only a regular file (links followed): a FIFO, socket, device or directory is refused, naming the
  // path and what it is, without blocking on it.
  static File open_read(const std::string& path);
  // A new file (util::create_fresh: whatever is at `path`, a stale file or a planted link, is
  // unlinked, never followed; then O_CREAT | O_EXCL | O_NOFOLLOW), 0644.
  static File create(const std::string& path);
  File(File&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
  File(const File&) = delete;
  ~File();

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // A full file system (ENOSPC, EDQUOT) names the path, the bytes still to write and the bytes free.
  void write_all(const void* data, size_t n);
  // Allocates the file's first `bytes` on disk now (fallocate), so that a full file system fails here,
  // naming the path, the bytes needed and the bytes free, not halfway through the data. Returns false
  // (and does nothing) where the file system cannot preallocate; throws Error(Input) when it is full.
  bool reserve(uint64_t bytes);
  // Exactly n bytes at `offset`; a short file is an error naming the path.
  void pread_all(void* data, size_t n, uint64_t offset) const;
  size_t read_some(void* data, size_t n);  // sequential read, 0 at end of file
  uint64_t size() const;  // fstat
  void truncate(uint64_t bytes);  // the file's size becomes `bytes` (ftruncate)
  void fsync();
  void close();  // checks close() errors (delayed write errors surface here)

 private:
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

// Buffered sequential writer that keeps a running CRC32C of everything written.
class ChecksumWriter {
 public:
  explicit ChecksumWriter(File& f, size_t buffer_bytes = 8u << 20);
  void write(const void* data, size_t n);
  void flush();
  uint32_t crc() const { return crc_; }
  // A second checksum over what was written since start_piece() (one manifest slice).
  void start_piece() { piece_crc_ = 0; }
  uint32_t piece_crc() const { return piece_crc_; }
  uint64_t bytes() const { return bytes_; }

 private:
  File& f_;
  std::string buf_;
  size_t used_ = 0;
  uint32_t crc_ = 0, piece_crc_ = 0;
  uint64_t bytes_ = 0;
};

// The whole of the regular file `path` (File::open_read's checks), or Error(Input) naming it when it
// holds more than max_bytes.
std::string read_all(const std::string& path, uint64_t max_bytes);
void fsync_dir(const std::string& dir);
// Bytes an unprivileged writer may still use on the file system holding `path` (statvfs f_bavail);
// -1 if unknown.
int64_t free_bytes(const std::string& path);
// errno is a full file system (ENOSPC, EDQUOT).
bool no_space(int err);
// Evicts the file's clean pages from the page cache (posix_fadvise DONTNEED; best effort, silent if
// the file cannot be opened), so that the next read comes from the disk. Used by the benchmarks.
void drop_page_cache(const std::string& path);
std::string errno_message();

}  // namespace tessera::checkpoint::io
