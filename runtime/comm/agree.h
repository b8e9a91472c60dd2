// Agreeing on an error across ranks: the one wire form of an error, the one mapping between error
// kinds and exit codes (exit_code_for / error_kind_for_exit_code in error.h) and the one agreement
// over a Communicator. Whoever stops every rank on one rank's error (launcher's bootstrap and
// collectively(), the checkpointer and its reader, the rank0 loader) catches with capture_error()
// (or encode_error()), agrees with agree_on_error() / throw_if_any(), and so an Input error stays
// exit code 2, a Timeout 3 and anything else 1 on every rank. The agreement names the failing rank
// by its rank in the communicator it ran over; callers decide whether a message shows it.
#pragma once
#include <exception>
#include <functional>
#include <optional>
#include <string>

#include "util/error.h"

namespace tessera {

namespace comm {
class Communicator;
}

// "<exit code>|<message>" for a caught exception: a tessera::Error keeps its exit code; any other
// std::exception counts as bad input (2): model/ format errors, LibTorch argument checks on user data.
std::string encode_error(const std::exception& e);
std::string encode_error(ErrorKind kind, const std::string& message);

// Runs fn; "" when it returned, else encode_error() of what it threw (a std::exception).
std::string capture_error(const std::function<void()>& fn);

// True when `wire` is an encode_error() string (a nonempty "<digits>|..."), as opposed to "" (no
// error) or a caller's own payload.
bool is_encoded_error(const std::string& wire);

// The kind and message of an encode_error() string (is_encoded_error(wire) must hold).
struct DecodedError {
  ErrorKind kind;
  std::string message;
};
DecodedError decode_error(const std::string& wire);

// Collective over `comm` (its ordering contract): every rank passes its encode_error() string, or
// "" when it has none. Returns, on every rank, the error of the lowest failing rank (`rank` is its
// rank in `comm`), or nothing when no rank failed.
struct AgreedError {
  int rank = -1;
  ErrorKind kind = ErrorKind::Internal;
  std::string message;
};
std::optional<AgreedError> agree_on_error(comm::Communicator& comm, const std::string& wire);

// agree_on_error(), then every rank throws CollectiveError(kind, message) of the lowest failing rank
// when there is one (the message as it was: it names the file / key / tensor itself).
void throw_if_any(comm::Communicator& comm, const std::string& wire);

}  // namespace tessera
