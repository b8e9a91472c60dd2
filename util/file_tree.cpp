#include "util/file_tree.h"
#include "util/output_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cerrno>
#include <filesystem>
#include <utility>

namespace tessera::util {
namespace {

constexpr std::uintmax_t kFailed = static_cast<std::uintmax_t>(-1);

std::error_code last_error() { return std::error_code(errno, std::generic_category()); }

// A directory opened at `parent_fd` / `name` (AT_FDCWD: a path), closed when it goes.
class OpenDir {
 public:
  OpenDir(int parent_fd, const std::string& name, int flags, std::error_code& ec) {
    const int fd = openat(parent_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | flags);
    if (fd >= 0) d_ = fdopendir(fd);
    if (!d_) {
      ec = last_error();
      if (fd >= 0) close(fd);
    }
  }
  ~OpenDir() {
    if (d_) closedir(d_);
  }
  OpenDir(const OpenDir&) = delete;
  OpenDir& operator=(const OpenDir&) = delete;
  explicit operator bool() const { return d_ != nullptr; }
  int fd() const { return dirfd(d_); }
  // Its entries' names, less "." and ".."; false on a read error (ec set).
  bool names(std::vector<std::string>& out, std::error_code& ec) {
    errno = 0;
    while (const dirent* e = readdir(d_)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") out.push_back(name);
      errno = 0;
    }
    if (errno) ec = last_error();
    return !ec;
  }

 private:
  DIR* d_ = nullptr;
};

// Removes everything inside the directory `name` of `parent` (open at `parent_fd`), then it.
std::uintmax_t remove_below(int parent_fd, const std::string& name, std::error_code& ec) {
  OpenDir dir(parent_fd, name, O_NOFOLLOW, ec);
  std::vector<std::string> names;
  if (!dir || !dir.names(names, ec)) return kFailed;
  std::uintmax_t count = 0;
  for (const auto& n : names) {
    struct stat st {};
    if (fstatat(dir.fd(), n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;  // gone meanwhile
      ec = last_error();
      return kFailed;
    }
    if (S_ISDIR(st.st_mode)) {
      const std::uintmax_t below = remove_below(dir.fd(), n, ec);
      if (below == kFailed) return kFailed;
      count += below;
    } else if (unlinkat(dir.fd(), n.c_str(), 0) == 0) {
      ++count;
    } else if (errno != ENOENT) {
      ec = last_error();
      return kFailed;
    }
  }
  if (unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR) != 0) {
    ec = last_error();
    return kFailed;
  }
  return count + 1;
}

struct Walk {
  TreeListing found;
  std::vector<std::pair<dev_t, ino_t>> open_dirs;  // the directories being walked (symlink loops)
  bool skip_hidden = true;
  std::string confined_to;  // not empty: the walk's root, resolved; links leaving it are listed
};

// A FIFO, socket or device named as util/output_file.h's file_kind names it; "" for anything else.
std::string kind_of(mode_t mode) {
  const bool special = S_ISFIFO(mode) || S_ISSOCK(mode) || S_ISCHR(mode) || S_ISBLK(mode);
  return special ? file_kind(mode) : "";
}

std::string resolved(const std::string& path) {
  char* real = ::realpath(path.c_str(), nullptr);
  if (!real) return "";
  std::string out = real;
  std::free(real);
  return out;
}

// With w.confined_to: true when `path` is a link whose target lies outside the root (listed).
bool leaves_root(const std::string& path, Walk& w) {
  struct stat lst {};
  if (w.confined_to.empty() || lstat(path.c_str(), &lst) != 0 || !S_ISLNK(lst.st_mode)) return false;
  const std::string target = resolved(path);
  const std::string& root = w.confined_to;
  if (target.empty() || target == root ||
      (target.compare(0, root.size(), root) == 0 && (root == "/" || target[root.size()] == '/')))
    return false;  // dangling (no file), or inside
  w.found.outside_links.emplace_back(path, target);
  return true;
}

void walk(const std::string& dir, Walk& w, std::error_code& ec) {
  OpenDir d(AT_FDCWD, dir, 0, ec);
  if (!d) return;
  struct stat self {};
  if (fstat(d.fd(), &self) != 0) {
    ec = last_error();
    return;
  }
  const std::pair<dev_t, ino_t> id{self.st_dev, self.st_ino};
  if (std::find(w.open_dirs.begin(), w.open_dirs.end(), id) != w.open_dirs.end()) return;
  std::vector<std::string> names;
  if (!d.names(names, ec)) return;
  w.open_dirs.push_back(id);
  for (const auto& n : names) {
    if (w.skip_hidden && n[0] == '.') continue;
    const std::string path = dir + (dir.empty() || dir.back() != '/' ? "/" : "") + n;
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) continue;  // a dangling link is no file
    if (leaves_root(path, w)) continue;
    if (S_ISDIR(st.st_mode))
      walk(path, w, ec);
    else if (S_ISREG(st.st_mode))
      w.found.files.push_back(path);
    else
      w.found.specials.push_back(path);
    if (ec) break;
  }
  w.open_dirs.pop_back();
}

}  // namespace

std::uintmax_t remove_tree(const std::string& path, std::error_code& ec) {
  ec.clear();
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return 0;
    ec = last_error();
    return kFailed;
  }
  if (!S_ISDIR(st.st_mode)) {
    if (unlink(path.c_str()) == 0) return 1;
    ec = last_error();
    return kFailed;
  }
  return remove_below(AT_FDCWD, path, ec);
}

std::uintmax_t remove_tree(const std::string& path) {
  std::error_code ec;
  const std::uintmax_t n = remove_tree(path, ec);
  if (ec) throw std::filesystem::filesystem_error("cannot remove", path, ec);
  return n;
}

std::vector<std::string> files_below(const std::string& dir, std::error_code& ec, bool skip_hidden) {
  ec.clear();
  Walk w;
  w.skip_hidden = skip_hidden;
  walk(dir, w, ec);
  std::sort(w.found.files.begin(), w.found.files.end());
  return w.found.files;
}

TreeListing list_tree(const std::string& dir, std::error_code& ec, bool skip_hidden) {
  ec.clear();
  Walk w;
  w.skip_hidden = skip_hidden;
  w.confined_to = resolved(dir);
  if (w.confined_to.empty()) {
    ec = last_error();
    return {};
  }
  walk(dir, w, ec);
  std::sort(w.found.files.begin(), w.found.files.end());
  std::sort(w.found.specials.begin(), w.found.specials.end());
  std::sort(w.found.outside_links.begin(), w.found.outside_links.end());
  return std::move(w.found);
}

std::string special_file_kind(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return "";
  return kind_of(st.st_mode);
}

std::string not_regular_file(const std::string& path, const std::string& what) {
  const std::string kind = special_file_kind(path);
  return kind.empty() ? "" : what + " " + path + " is " + kind + ", not a regular file";
}

}  // namespace tessera::util
