// Shared helpers of the libFuzzer harnesses in tests/fuzz (see tests/fuzz/README.md).
//
// Contract every harness checks, beyond "no crash, no sanitizer report, no hang, no huge
// allocation" (which libFuzzer/ASan/UBSan enforce): a parser given bad bytes may only fail with a
// bad-input error -- tessera::Error of kind Input or model::ModelError -- whose message is one line
// that names where the problem is (the file, the variable or the config source). Any other
// exception (std::out_of_range escaping from nlohmann, std::bad_alloc, std::length_error, an
// Internal tessera::Error, a c10::Error) aborts, so libFuzzer records the input as a finding.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "model/errors.h"
#include "util/error.h"
#include "util/file_tree.h"

namespace tessera::fuzz {

// Inputs that hold several files separate them with this line (dictionaries list it).
inline const std::string kSplit = "\n--8<--\n";

inline std::vector<std::string> split_parts(const uint8_t* data, size_t size, size_t max_parts) {
  const std::string s(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  size_t start = 0;
  while (parts.size() + 1 < max_parts) {
    const size_t at = s.find(kSplit, start);
    if (at == std::string::npos) break;
    parts.push_back(s.substr(start, at - start));
    start = at + kSplit.size();
  }
  parts.push_back(s.substr(start));
  return parts;
}

[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "\nFUZZ FINDING: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// A private scratch directory for this process; files are rewritten for every input.
class Scratch {
 public:
  Scratch() {
    const char* tmp = std::getenv("TMPDIR");
    std::string base = tmp && *tmp ? tmp : (std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp");
    dir_ = base + "/tessera-fuzz-" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
  }
  ~Scratch() {
    std::error_code ec;
    tessera::util::remove_tree(dir_, ec);
  }
  const std::string& dir() const { return dir_; }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  // Empties the directory (a previous input's files must not leak into this one).
  void clear() const {
    for (const auto& e : std::filesystem::directory_iterator(dir_)) tessera::util::remove_tree(e.path());
  }
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string p = path(name);
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) finding("harness cannot write " + p);
    return p;
  }

 private:
  std::string dir_;
};

// Runs fn(); returns true when it finished, false when it failed with an acceptable bad-input
// error. The message must be non-empty, and must contain one of `names` (the file or variable);
// a message of several lines is accepted only when the input itself carried the line break (a
// tensor or key name with a newline in it, quoted back verbatim).
// TESSERA_FUZZ_VERBOSE=1 prints each outcome (handy when replaying a corpus by hand).
inline bool verbose() {
  static const bool v = std::getenv("TESSERA_FUZZ_VERBOSE") != nullptr;
  return v;
}

template <typename F>
bool expect_input_error(F&& fn, std::initializer_list<std::string> names, bool input_has_newline = true) {
  std::string msg;
  try {
    fn();
    if (verbose()) std::fprintf(stderr, "  accepted\n");
    return true;
  } catch (const tessera::Error& e) {
    if (e.kind() != tessera::ErrorKind::Input)
      finding(std::string("non-input tessera::Error (exit code ") + std::to_string(e.exit_code()) + "): " + e.what());
    msg = e.what();
  } catch (const tessera::model::ModelError& e) {
    msg = e.what();
  } catch (const std::exception& e) {
    finding(std::string("unexpected exception type (not a bad-input error): ") + e.what());
  } catch (...) {
    finding("unexpected non-std exception");
  }
  if (verbose()) std::fprintf(stderr, "  input error: %s\n", msg.c_str());
  if (msg.empty()) finding("bad-input error with an empty message");
  if (!input_has_newline && msg.find('\n') != std::string::npos) finding("error message spans several lines: " + msg);
  bool named = false;
  for (const auto& n : names) named = named || msg.find(n) != std::string::npos;
  if (!named) {
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : " | ") + n;
    finding("error message names none of {" + list + "}: " + msg);
  }
  return false;
}

}  // namespace tessera::fuzz
