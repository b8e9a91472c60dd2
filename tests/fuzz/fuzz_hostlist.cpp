// libFuzzer harness: SLURM environment parsing (launcher/slurm_env.cpp): hostlists, tasks-per-node
// and the SLURM_* variables a job step hands to its tasks.
//
// Input without '=': the whole input is given to expand_hostlist() and expand_tasks_per_node().
// Input with '=': NAME=value lines form the environment that read_slurm_env() sees (its getenv is
// the map, the process environment is never touched).
// Error messages must be one line here: they quote the variables' text, control characters escaped.
#include <map>
#include <string>

#include "launcher/slurm_env.h"
#include "tests/fuzz/fuzz_common.h"

using namespace tessera;
using namespace tessera::launcher;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (text.find('=') == std::string::npos) {
    fuzz::expect_input_error(
        [&] {
          const auto hosts = expand_hostlist(text);
          for (const auto& h : hosts)
            if (h.empty() || h.find_first_of(",[]") != std::string::npos) fuzz::finding("bad host name '" + h + "'");
        },
        {"hostlist"}, false);
    fuzz::expect_input_error([&] { (void)expand_tasks_per_node(text); }, {"tasks-per-node"}, false);
    return 0;
  }
  std::map<std::string, std::string> env;
  size_t start = 0;
  while (start <= text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(start, nl - start);
    const size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
    start = nl + 1;
  }
  fuzz::expect_input_error(
      [&] {
        const SlurmEnv e = read_slurm_env([&](const char* name) -> const char* {
          auto it = env.find(name);
          return it == env.end() ? nullptr : it->second.c_str();
        });
        if (e.present && !e.nodes.empty() && e.nnodes > 0 && static_cast<int>(e.nodes.size()) != e.nnodes)
          fuzz::finding("node list and node count disagree but were accepted");
      },
      {"SLURM"}, false);
  return 0;
}
