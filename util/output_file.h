// Opening the files Tessera writes, never through a link planted at their names.
//
// On a shared scratch file system another user may plant `metrics.jsonl -> ~/.bashrc` or
// `latest.tmp -> /home/you/notes` in a folder Tessera writes to: open(O_TRUNC), fopen("w") or an
// ofstream would then truncate or append to whatever the link points at. Every output Tessera
// writes into checkpoint.dir, log.dir or a path given on the command line is opened here, one of
// three ways:
//  - create_fresh: a new file, at a name only Tessera writes (a temporary, a rank file, latest.tmp).
//    Whatever is at the name (a crash's leftover, or a planted link) is unlinked first: a link
//    goes, its target stays. Then O_CREAT | O_EXCL | O_NOFOLLOW: a link planted between the two
//    makes the open fail; it is never written through.
//  - open_append: a file that a resumed run appends to (metrics.jsonl, a TensorBoard event file):
//    O_NOFOLLOW, so a link there is refused, and anything but a regular file (a FIFO, a device) too.
//  - replace_file: a file replaced whole (run_info.json, a trace, report.html, a converted config):
//    written to a fresh temporary beside it (mkstemp, O_EXCL), fsynced and renamed over the name;
//    rename replaces a link there, never follows it.
// These return errors rather than throw (util/ is below runtime/'s error types); output_error()
// is the phrase for the caller's one-line error.
#pragma once
#include <cstddef>
#include <string>

namespace tessera::util {

// A new regular file at `path` (mode 0644, read-write, O_CLOEXEC), as described above; -1 with
// errno set on failure. Async-signal-safe (the flight recorder dumps from a signal handler).
int create_fresh(const char* path);

// `path` opened write-only for appending (O_APPEND, created 0644 when missing), never through a
// link and only as a regular file; -1 with errno set on failure (ELOOP: a link; EINVAL: a FIFO,
// socket, device or directory).
int open_append(const char* path);

// What is wrong with writing `path` after one of the calls above failed with `err`: "it is a
// symbolic link to 'T' (Tessera never writes through a link: remove it)", "it is a FIFO, not a
// regular file", or strerror(err).
std::string output_error(const std::string& path, int err);

// "a FIFO", "a socket", "a character device", "a block device", "a directory", "a symbolic link",
// "a regular file" for an st_mode.
std::string file_kind(unsigned mode);

// All of `n` bytes to `fd` (EINTR retried); false with errno set on failure.
bool write_all(int fd, const void* data, size_t n);

// `text` becomes the content of `path`, as described above (mode 0644); false with `why` set to
// one phrase naming the file and the reason (the temporary is removed).
bool replace_file(const std::string& path, const std::string& text, std::string& why);

// An output file opened by create_fresh or open_append, closed on destruction. Unbuffered: every
// write() reaches the file (a crashed run keeps what it logged).
class OutputFile {
 public:
  enum class Mode { Fresh, Append };
  OutputFile() = default;
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile() { close(); }
  // false with `why` (output_error's phrase, without the path) when it cannot be opened.
  bool open(const std::string& path, Mode mode, std::string& why);
  bool is_open() const { return fd_ >= 0; }
  // false with errno set on failure.
  bool write(const std::string& bytes) { return write_all(fd_, bytes.data(), bytes.size()); }
  void close();

 private:
  int fd_ = -1;
};

}  // namespace tessera::util
