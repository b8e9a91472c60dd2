// Runs another program to completion, for benchmark drivers that launch their own ranks (`mpirun
// ... tessera`, a Python peer): its stdout and stderr are captured in files (no pipe can fill up and
// stall it), a wall-clock limit ends it, and it shares this process's group, so Ctrl-C reaches it.
#pragma once
#include <string>
#include <vector>

namespace tessera::bench {

struct ChildResult {
  int exit_code = -1;  // the child's exit status; 128 + N when signal N ended it
  bool timed_out = false;
  std::string out, err;  // everything it wrote to stdout / stderr
};

// Starts argv[0] (looked up in PATH) with `argv` and this environment plus `extra_env`
// ("NAME=value", replacing a variable of that name), waits for it, and returns its output. Past
// `timeout_s` it gets SIGTERM (mpirun and the peer's launcher then end their ranks), 10 s later
// SIGKILL. `scratch_dir` holds the capture files (removed afterwards). Throws Error(Input) when
// argv[0] cannot be started.
ChildResult run_child(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
                      double timeout_s, const std::string& scratch_dir);

// The last non-empty line of `text` ("" if none): a child's result line.
std::string last_line(const std::string& text);
// A failed child's one-line error: its first line containing "error:" (mpirun appends notices
// after the ranks' messages), else its last non-empty line.
std::string error_line(const std::string& text);

}  // namespace tessera::bench
