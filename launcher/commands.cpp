#include "launcher/commands.h"

#include <iostream>

#include "launcher/cli.h"
#include "launcher/accelerate.h"
#include "benchmarks/bench_checkpoint.h"
#include "benchmarks/bench_collectives.h"
#include "benchmarks/bench_step.h"
#include "benchmarks/bench_load.h"
#include "benchmarks/bench_memory.h"
#include "launcher/cmd_ckpt.h"
#include "launcher/cmd_model.h"
#include "launcher/cmd_tokenize.h"
#include "launcher/config.h"
#include "launcher/plan.h"
#include "runtime/error.h"

namespace tessera::launcher {

GlobalOptions& global_options() {
  static GlobalOptions g;
  return g;
}

int run_config(const std::vector<std::string>& args) {
  po::options_description desc("config options");
  desc.add_options()("reference", "print every configuration key as a Markdown table")(
      "check", po::value<std::string>(), "validate a config file (JSON, or YAML: .yaml/.yml) and print it with defaults filled in")(
      "set", po::value<std::vector<std::string>>()->composing(), "override key=value")(
      "from-accelerate", po::value<std::string>(),
      "translate a Hugging Face Accelerate FSDP config (YAML) into a Tessera run config; a report of every key on stderr")(
      "out", po::value<std::string>(), "with --from-accelerate: write the run config to this new file instead of stdout");
  auto vm = parse_command(
      "tessera config --reference | --check run.json [--set key=value] | --from-accelerate fsdp_config.yaml [--out run.json]",
      desc, args);
  if (!vm) return 0;
  if (vm->count("from-accelerate")) {
    TESSERA_CHECK_INPUT(!vm->count("check") && !vm->count("reference") && !vm->count("set"),
                        "--from-accelerate takes no --check, --reference or --set (check the result with tessera config --check)");
    return run_config_from_accelerate((*vm)["from-accelerate"].as<std::string>(),
                                      vm->count("out") ? (*vm)["out"].as<std::string>() : "");
  }
  TESSERA_CHECK_INPUT(!vm->count("out"), "--out goes with --from-accelerate");
  if (vm->count("reference")) {
    std::cout << Config::reference_markdown();
    return 0;
  }
  std::vector<std::string> sets;
  if (vm->count("set")) sets = (*vm)["set"].as<std::vector<std::string>>();
  Config c = Config::load(vm->count("check") ? (*vm)["check"].as<std::string>() : "", sets);
  std::cout << c.json().dump(2) << std::endl;
  return 0;
}

// `tessera bench <what>`: benchmarks that print ratios against a baseline measured in the same run.
int run_bench(const std::vector<std::string>& args) {
  static const std::vector<std::pair<std::string, int (*)(const std::vector<std::string>&)>> benches = {
      {"collectives", bench::run_bench_collectives},
      {"checkpoint", bench::run_bench_checkpoint},
      {"step", bench::run_bench_step},
      {"load", bench::run_bench_load},
      {"memory", bench::run_bench_memory},
  };
  std::vector<std::string> names;
  for (const auto& b : benches) names.push_back(b.first);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << "usage: tessera bench <collectives|checkpoint|step|load|memory> [options]   (tessera bench <name> --help)" << std::endl;
    return args.empty() ? 2 : 0;
  }
  for (const auto& b : benches)
    if (b.first == args[0]) return b.second(std::vector<std::string>(args.begin() + 1, args.end()));
  std::string hint = closest_match(args[0], names);
  throw TESSERA_INPUT_ERROR("unknown benchmark '" + args[0] + "'" + (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
}

namespace {
// Benchmarks that launch their own ranks (mpirun ... tessera) run as one plain process, not an MPI
// singleton (a singleton's children would inherit its MPI identity).
bool bench_is_driver(const std::vector<std::string>& args) {
  return bench::bench_step_is_driver(args) || (!args.empty() && args[0] == "memory");
}
}  // namespace

const std::vector<CommandInfo>& commands() {
  static const std::vector<CommandInfo> list = {
      {"topo", "print the discovered world: hosts, nodes, local ranks, process groups, threads, GPUs", true, run_topo},
      {"train", "fine-tune with FSDP (mpirun -np N / srun): tessera train --config run.json", true, run_train},
      {"eval", "per-sequence next-token loss of a model on token ids (single process or mpirun, sharded)", true, run_eval},
      {"init-model", "write a Hugging Face model directory with the Llama initialisation", false, run_init_model},
      {"tokenize", "pre-tokenise a corpus (text, JSONL chat/prompt-completion/text) into a token file that train maps", false, run_tokenize},
      {"report", "write a run's HTML report (loss, validation, lr, grad norm, tokens/s, MFU, memory, config, topology)", false, run_report},
      {"ckpt", "sharded checkpoints: consolidate (to Hugging Face), inspect, verify", false, run_ckpt},
      {"bench", "benchmarks: collectives, checkpoint, step (--peer: vs PyTorch DDP), load, memory", true, run_bench,
       bench_is_driver},
      {"config", "print the configuration reference, validate a config file, or translate an Accelerate FSDP config", false, run_config},
      {"plan", "predict per-rank GPU memory and host RAM of a run, say whether it fits and what would make it fit", false, run_plan},
      {"diagnose", "after a hang or crash: which ranks were behind in which collective, or disagreed (flight records)", false, run_diagnose},
  };
  return list;
}

}  // namespace tessera::launcher
