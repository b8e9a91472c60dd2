#include "benchmarks/bench.h"

#include <iostream>

#include "benchmarks/bench_checkpoint.h"
#include "benchmarks/bench_collectives.h"
#include "benchmarks/bench_generate.h"
#include "benchmarks/bench_load.h"
#include "benchmarks/bench_memory.h"
#include "benchmarks/bench_optim.h"
#include "benchmarks/bench_step.h"
#include "launcher/cli.h"
#include "util/error.h"

namespace tessera::bench {
namespace {

// Benchmarks that print ratios against a baseline measured in the same run.
int run_bench(const std::vector<std::string>& args) {
  static const std::vector<std::pair<std::string, int (*)(const std::vector<std::string>&)>> benches = {
      {"collectives", run_bench_collectives},
      {"checkpoint", run_bench_checkpoint},
      {"step", run_bench_step},
      {"load", run_bench_load},
      {"memory", run_bench_memory},
      {"optim", run_bench_optim},
      {"generate", run_bench_generate},
  };
  std::vector<std::string> names;
  for (const auto& b : benches) names.push_back(b.first);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << "usage: tessera bench <collectives|checkpoint|step|load|memory|optim|generate> [options]   (tessera bench <name> --help)" << std::endl;
    return args.empty() ? 2 : 0;
  }
  for (const auto& b : benches)
    if (b.first == args[0]) return b.second(std::vector<std::string>(args.begin() + 1, args.end()));
  std::string hint = launcher::closest_match(args[0], names);
  throw TESSERA_INPUT_ERROR("unknown benchmark '" + args[0] + "'" + (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
}

// Benchmarks that launch their own ranks (mpirun ... tessera) run as one plain process, not an MPI
// singleton (a singleton's children would inherit its MPI identity).
bool bench_is_driver(const std::vector<std::string>& args) {
  return bench_step_is_driver(args) || (!args.empty() && args[0] == "memory");
}

}  // namespace

launcher::CommandInfo bench_command() {
  return {"bench", "benchmarks: collectives, checkpoint, step (--peer: vs PyTorch DDP), load, memory, optim, generate", true, run_bench,
          bench_is_driver};
}

}  // namespace tessera::bench
