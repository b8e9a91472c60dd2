// The helpers the C++ tests share (tests/unit, tests/mpi), so that no test file keeps its own copy:
//   - files and processes: TempDir (a fresh directory, removed with its contents at the end of its
//     scope), write_file / read_file, run_capture (a command-line tool's stdout, e.g. an oracle's);
//   - errors: error_of (the message of the error a call throws), expect_input_error and
//     EXPECT_INPUT_ERROR (a call fails with one line of bad-input error naming what it must name);
//   - models: tiny_model (the `tiny` preset with a given number of layers);
//   - MPI (tests/mpi, every rank calls): SharedTempDir, on_every_rank.
// The trainer-level helpers of the tests/mpi training tests (which link the launcher) are in
// tests/support/train_support.h, which includes this header.
// Bad input in Tessera is a tessera::Error of kind Input (util/error.h) or, from model/ (which
// has no runtime/ dependency), a model::ModelError; launcher/ exits 2 for both.
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "model/config.h"
#include "model/errors.h"
#include "util/error.h"
#include "util/file_tree.h"

namespace tessera::test {

// ---- files -------------------------------------------------------------------------------------

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
// Replaces the file's contents with `bytes` (the folder must exist).
inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// stdout of `cmd` (run by the shell); a non-zero exit status fails the test.
inline std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(pipe), 0) << cmd;
  return out;
}

// A new directory <temp>/<prefix>-XXXXXX (mkdtemp: unique across processes and calls), removed
// with everything in it when the TempDir goes.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "tessera") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp " + tmpl + " failed");
    dir_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    tessera::util::remove_tree(dir_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& str() const { return dir_; }
  std::filesystem::path path() const { return dir_; }
  std::string operator/(const std::string& name) const { return dir_ + "/" + name; }
  // Writes `bytes` to `name` inside (relative; its folders are created); returns its path.
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string p = *this / name;
    std::filesystem::create_directories(std::filesystem::path(p).parent_path());
    write_file(p, bytes);
    return p;
  }

 private:
  std::string dir_;
};

// ---- errors ------------------------------------------------------------------------------------

// For error_of<BadInput>: either kind of bad-input error (tessera::Error of the expected kind, or
// model::ModelError), for code that reaches both.
struct BadInput {};

// The message of what fn throws, if it throws: E is the error type the test expects (tessera::Error,
// whose kind must also be `kind`; model::ModelError; or BadInput for either). Any other exception
// fails the test (and its message is returned). std::nullopt if fn returns.
template <class E = Error, class Fn>
std::optional<std::string> thrown(Fn&& fn, ErrorKind kind = ErrorKind::Input) {
  constexpr bool want_error = std::is_same_v<E, Error> || std::is_same_v<E, BadInput>;
  constexpr bool want_model = std::is_same_v<E, model::ModelError> || std::is_same_v<E, BadInput>;
  static_assert(want_error || want_model, "E: tessera::Error, model::ModelError or BadInput");
  try {
    fn();
  } catch (const Error& e) {
    if (!want_error) ADD_FAILURE() << "expected a model::ModelError, got a tessera::Error: " << e.what();
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << e.what();
    return e.what();
  } catch (const model::ModelError& e) {
    if (!want_model) ADD_FAILURE() << "expected a tessera::Error, got a model::ModelError: " << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected exception type: " << e.what();
    return e.what();
  }
  return std::nullopt;
}

// The message of the error fn throws ("" if it throws none), as thrown<E> checks it.
template <class E = Error, class Fn>
std::string error_of(Fn&& fn, ErrorKind kind = ErrorKind::Input) {
  return thrown<E>(std::forward<Fn>(fn), kind).value_or("");
}

// fn fails with a bad-input error of type E (see thrown) whose message is one line holding every
// one of `needles`.
template <class E = Error, class Fn>
void expect_input_error(Fn&& fn, std::initializer_list<std::string> needles) {
  const std::optional<std::string> msg = thrown<E>(std::forward<Fn>(fn), ErrorKind::Input);
  if (!msg) {
    ADD_FAILURE() << "expected an input error";
    return;
  }
  EXPECT_EQ(msg->find('\n'), std::string::npos) << "message must be one line: " << *msg;
  for (const std::string& n : needles) EXPECT_NE(msg->find(n), std::string::npos) << "'" << n << "' not in: " << *msg;
}

}  // namespace tessera::test

// The statement form: `stmt` fails with one line of bad input (a tessera::Error of kind Input or a
// model::ModelError) holding each of the remaining arguments; a failure names this line.
#define EXPECT_INPUT_ERROR(stmt, ...)                                                                        \
  do {                                                                                                       \
    SCOPED_TRACE(#stmt);                                                                                     \
    ::tessera::test::expect_input_error<::tessera::test::BadInput>([&] { stmt; }, {__VA_ARGS__});           \
  } while (0)

namespace tessera::test {

// ---- models ------------------------------------------------------------------------------------

// The `tiny` preset (model/llama_family.cpp) with `layers` decoder layers.
inline model::ModelConfig tiny_model(int64_t layers) {
  model::ModelConfig c = model::ModelConfig::preset("tiny");
  c.num_hidden_layers = layers;
  return c;
}

// ---- MPI (tests/mpi: every rank of MPI_COMM_WORLD calls these together) ----------------------------

// true on every rank when `v` is true on every rank.
inline bool on_every_rank(bool v) {
  int mine = v ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

// A TempDir of rank 0 that every rank names: made before the others learn its name, removed
// after every rank is done with it.
class SharedTempDir {
 public:
  explicit SharedTempDir(const std::string& prefix) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::string name;
    if (rank == 0) {
      try {
        name = dir_.emplace(prefix).str();
      } catch (const std::exception&) {  // every rank fails below, none waits for rank 0
      }
    }
    int n = static_cast<int>(name.size());
    MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
    name.resize(n);
    MPI_Bcast(name.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (name.empty()) throw std::runtime_error("rank 0 could not make a directory " + prefix + "-XXXXXX");
    name_ = name;
  }
  ~SharedTempDir() { MPI_Barrier(MPI_COMM_WORLD); }  // then rank 0's TempDir goes
  const std::string& str() const { return name_; }
  std::string operator/(const std::string& name) const { return name_ + "/" + name; }

 private:
  std::optional<TempDir> dir_;
  std::string name_;
};

}  // namespace tessera::test
