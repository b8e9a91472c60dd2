#include "util/error.h"

#include <cstring>

namespace tessera {
namespace {
int g_rank = -1;
std::string& host_ref() {
  static std::string h;
  return h;
}
}  // namespace

void set_process_identity(int rank, const std::string& host) {
  g_rank = rank;
  host_ref() = host;
}
int process_rank() { return g_rank; }
const std::string& process_host() { return host_ref(); }

Error::Error(ErrorKind kind, const std::string& what, const char* file, int line)
    : std::runtime_error(what), kind_(kind), rank_(g_rank), host_(host_ref()) {
  if (file) {
    const char* base = std::strrchr(file, '/');
    location_ = std::string(base ? base + 1 : file) + ":" + std::to_string(line);
  }
}

}  // namespace tessera
