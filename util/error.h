// Errors in Tessera are exceptions that carry what went wrong, where (file/key/tensor in the
// message, source location), and who (rank, host). launcher/ turns any of them into a one-line
// message and an exit code on every rank (2 for bad input, 1 for internal faults, 3 for timeouts).
#pragma once
#include <stdexcept>
#include <string>

namespace tessera {

enum class ErrorKind { Input, Internal, Timeout };

// The one mapping between error kinds and exit codes: Input 2, Internal 1, Timeout 3 (any other
// code maps back to Internal). runtime/comm/agree.h moves errors between ranks with it.
constexpr int exit_code_for(ErrorKind k) { return k == ErrorKind::Input ? 2 : k == ErrorKind::Timeout ? 3 : 1; }
constexpr ErrorKind error_kind_for_exit_code(int code) {
  return code == 2 ? ErrorKind::Input : code == 3 ? ErrorKind::Timeout : ErrorKind::Internal;
}
static_assert(error_kind_for_exit_code(exit_code_for(ErrorKind::Input)) == ErrorKind::Input &&
                  error_kind_for_exit_code(exit_code_for(ErrorKind::Internal)) == ErrorKind::Internal &&
                  error_kind_for_exit_code(exit_code_for(ErrorKind::Timeout)) == ErrorKind::Timeout,
              "exit codes map back to their kinds");

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what, const char* file = nullptr, int line = 0);
  ErrorKind kind() const { return kind_; }
  int exit_code() const { return exit_code_for(kind_); }
  int rank() const { return rank_; }
  const std::string& host() const { return host_; }
  const std::string& location() const { return location_; }  // "file.cpp:123" or ""

 private:
  ErrorKind kind_;
  int rank_;
  std::string host_;
  std::string location_;
};

// An error every rank of the world raised together (after an agreement step), so each rank can
// exit cleanly with the same message instead of aborting the others.
class CollectiveError : public Error {
 public:
  CollectiveError(ErrorKind kind, const std::string& what) : Error(kind, what) {}
};

// Process identity attached to every Error; set once by the bootstrap (rank -1 before).
void set_process_identity(int rank, const std::string& host);
int process_rank();
const std::string& process_host();

}  // namespace tessera

// Bad user input (config, files, CLI): exit code 2.
#define TESSERA_INPUT_ERROR(msg) ::tessera::Error(::tessera::ErrorKind::Input, (msg), __FILE__, __LINE__)
#define TESSERA_CHECK_INPUT(cond, msg)                     \
  do {                                                     \
    if (!(cond)) throw TESSERA_INPUT_ERROR(msg);           \
  } while (0)
// Broken invariant inside Tessera: exit code 1.
#define TESSERA_CHECK(cond, msg)                                                               \
  do {                                                                                         \
    if (!(cond))                                                                               \
      throw ::tessera::Error(::tessera::ErrorKind::Internal,                                   \
                             std::string("internal check failed: ") + #cond + ": " + (msg),    \
                             __FILE__, __LINE__);                                              \
  } while (0)
