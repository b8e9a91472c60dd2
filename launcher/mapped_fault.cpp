// SIGBUS on a memory-mapped file: one line naming the file, exit 2 (launcher/mapped_fault.h).
// Everything in the handler is async-signal-safe: open/read/write/_exit and arithmetic on static
// buffers prepared at install time.
#include "launcher/mapped_fault.h"

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstring>
#include <string>

#include "util/error.h"

namespace tessera::launcher {

namespace {

struct sigaction g_previous;
char g_who[256];  // "tessera: rank 1 (node2): "

size_t append(char* out, size_t at, size_t cap, const char* s) {
  while (*s && at + 1 < cap) out[at++] = *s++;
  out[at] = '\0';
  return at;
}

size_t append_u64(char* out, size_t at, size_t cap, uint64_t v) {
  char digits[24];
  int n = 0;
  do digits[n++] = static_cast<char>('0' + v % 10), v /= 10;
  while (v);
  while (n > 0 && at + 1 < cap) out[at++] = digits[--n];
  out[at] = '\0';
  return at;
}

uint64_t parse_hex(const char*& p) {
  uint64_t v = 0;
  for (;; ++p) {
    const char c = *p;
    if (c >= '0' && c <= '9') v = v * 16 + static_cast<uint64_t>(c - '0');
    else if (c >= 'a' && c <= 'f') v = v * 16 + static_cast<uint64_t>(c - 'a' + 10);
    else return v;
  }
}

// The line of /proc/self/maps holding `addr` ("start-end perms offset dev inode path"): the mapped
// file and the byte of it at addr. False if addr is in no file mapping (or the table is unreadable).
bool find_mapping(uintptr_t addr, char* path, size_t path_cap, uint64_t* byte) {
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  static char buf[1 << 16];
  static char line[4096];
  size_t len = 0;
  bool found = false;
  for (ssize_t n; !found && (n = ::read(fd, buf, sizeof buf)) > 0;)
    for (ssize_t i = 0; i < n && !found; ++i) {
      if (buf[i] != '\n') {
        if (len + 1 < sizeof line) line[len++] = buf[i];
        continue;
      }
      line[len] = '\0';
      len = 0;
      const char* p = line;
      const uint64_t start = parse_hex(p);
      const uint64_t end = *p == '-' ? parse_hex(++p) : 0;
      if (addr < start || addr >= end) continue;
      while (*p == ' ') ++p;
      while (*p && *p != ' ') ++p;  // permissions
      while (*p == ' ') ++p;
      const uint64_t offset = parse_hex(p);
      const char* slash = std::strchr(p, '/');
      if (!slash) break;  // anonymous memory: not ours to explain
      size_t k = 0;
      while (slash[k] && k + 1 < path_cap) path[k] = slash[k], ++k;
      path[k] = '\0';
      *byte = offset + (addr - start);
      found = true;
    }
  ::close(fd);
  return found;
}

extern "C" void on_mapped_file_fault(int sig, siginfo_t* info, void* ctx) {
  static char path[2048];
  uint64_t byte = 0;
  // A real access fault (not kill/raise) inside a file mapping: the file is to blame.
  if (info && info->si_code > 0 && find_mapping(reinterpret_cast<uintptr_t>(info->si_addr), path, sizeof path, &byte)) {
    static char out[3072];
    size_t n = append(out, 0, sizeof out, g_who);
    n = append(out, n, sizeof out, "file ");
    n = append(out, n, sizeof out, path);
    n = append(out, n, sizeof out, " can no longer be read at byte ");
    n = append_u64(out, n, sizeof out, byte);
    n = append(out, n, sizeof out,
               " (SIGBUS: it was truncated, replaced in place or its storage failed while this rank had it mapped);"
               " restore it and resume\n");
    (void)!::write(2, out, n);
    ::_exit(exit_code_for(ErrorKind::Input));
  }
  // Anything else: the previous handler, or the default action, as if this one were not there.
  if ((g_previous.sa_flags & SA_SIGINFO) && g_previous.sa_sigaction) {
    g_previous.sa_sigaction(sig, info, ctx);
    return;
  }
  ::sigaction(sig, &g_previous, nullptr);
  if (!info || info->si_code <= 0) ::raise(sig);  // a sent signal; a fault re-faults on return
}

}  // namespace

void install_mapped_file_fault_handler() {
  struct sigaction cur {};
  ::sigaction(SIGBUS, nullptr, &cur);
  if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_mapped_file_fault) return;
  const std::string who = "tessera: rank " + std::to_string(process_rank()) + " (" + process_host() + "): ";
  std::strncpy(g_who, who.c_str(), sizeof g_who - 1);
  struct sigaction sa {};
  sa.sa_sigaction = on_mapped_file_fault;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, &g_previous);
}

}  // namespace tessera::launcher
