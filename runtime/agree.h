// Agreeing on an error across ranks: the one wire form of an error and the one mapping between
// error kinds and exit codes (Error::exit_code() in error.h; kind_of_exit_code() is its inverse,
// derived from it). Whoever moves an error from one rank to the others (launcher's collectively(),
// the rank0 loader's agreement) encodes it with encode_error() and rebuilds it with
// decode_error(), so an Input error stays exit code 2, a Timeout 3 and anything else 1 on every
// rank. Transport is the caller's (raw MPI before communicators exist, a Communicator after).
#pragma once
#include <exception>
#include <string>

#include "runtime/error.h"

namespace tessera {

// The kind whose Error::exit_code() is `code`; Internal for a code no kind has.
ErrorKind kind_of_exit_code(int code);

// "<exit code>|<message>" for a caught exception: a tessera::Error keeps its exit code; any other
// std::exception counts as bad input (2): model/ format errors, LibTorch argument checks on user data.
std::string encode_error(const std::exception& e);

// True when `wire` is an encode_error() string (a nonempty "<digits>|..."), as opposed to "" (no
// error) or a caller's own payload.
bool is_encoded_error(const std::string& wire);

// The kind and message of an encode_error() string (is_encoded_error(wire) must hold).
struct DecodedError {
  ErrorKind kind;
  std::string message;
};
DecodedError decode_error(const std::string& wire);

}  // namespace tessera
