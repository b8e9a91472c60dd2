#include "benchmarks/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "util/error.h"

extern char** environ;

namespace tessera::bench {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

ChildResult run_child(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
                      double timeout_s, const std::string& scratch_dir) {
  TESSERA_CHECK(!argv.empty(), "run_child needs a program");
  std::map<std::string, std::string> env;
  std::vector<std::string> order;
  auto put = [&](const std::string& kv) {
    const std::string name = kv.substr(0, kv.find('='));
    if (!env.count(name)) order.push_back(name);
    env[name] = kv;
  };
  for (char** e = environ; *e; ++e) put(*e);
  for (const auto& kv : extra_env) put(kv);
  std::vector<std::string> env_strings;
  for (const auto& name : order) env_strings.push_back(env[name]);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  const std::string out_path = scratch_dir + "/child.out", err_path = scratch_dir + "/child.err";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw TESSERA_INPUT_ERROR("cannot start '" + argv[0] + "': " + std::strerror(rc));

  ChildResult r;
  const auto t0 = std::chrono::steady_clock::now();
  int status = 0, signals_sent = 0;
  for (;;) {
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) TESSERA_CHECK(false, std::string("waitpid: ") + std::strerror(errno));
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (signals_sent == 0 && waited > timeout_s) {
      r.timed_out = true;
      kill(pid, SIGTERM);
      signals_sent = 1;
    } else if (signals_sent == 1 && waited > timeout_s + 10) {
      kill(pid, SIGKILL);
      signals_sent = 2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  unlink(out_path.c_str());
  unlink(err_path.c_str());
  return r;
}

std::string last_line(const std::string& text) {
  std::istringstream in(text);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return last;
}

std::string error_line(const std::string& text) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.find("error:") != std::string::npos) return line;
  return last_line(text);
}

}  // namespace tessera::bench
