#include "launcher/commands.h"

#include <iostream>

#include "launcher/accelerate.h"
#include "launcher/cli.h"
#include "launcher/cmd_chat_template.h"
#include "launcher/cmd_ckpt.h"
#include "launcher/cmd_lora.h"
#include "launcher/cmd_model.h"
#include "launcher/cmd_tokenize.h"
#include "launcher/config.h"
#include "launcher/plan.h"
#include "util/error.h"

namespace tessera::launcher {

GlobalOptions& global_options() {
  static GlobalOptions g;
  return g;
}

namespace {
int positive(const po::variables_map& vm, const char* name) {
  const std::string value = vm[name].as<std::string>();
  size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || value.empty() || v <= 0)
    throw TESSERA_INPUT_ERROR(std::string("--") + name + " '" + value + "' must be a positive integer");
  return v;
}
}  // namespace

std::vector<std::string> take_global_options(const std::vector<std::string>& args) {
  po::options_description desc;
  desc.add_options()("ranks-per-node", po::value<std::string>())("threads", po::value<std::string>());
  po::variables_map vm;
  std::vector<std::string> rest;
  try {
    // Exact names only (no guessing: a command's own --t... stays its own); the rest passes through.
    const auto style = po::command_line_style::unix_style & ~po::command_line_style::allow_guessing;
    const po::parsed_options parsed = po::command_line_parser(args).options(desc).style(style).allow_unregistered().run();
    po::store(parsed, vm);
    rest = po::collect_unrecognized(parsed.options, po::include_positional);
  } catch (const po::error& e) {
    throw TESSERA_INPUT_ERROR(e.what());
  }
  if (vm.count("ranks-per-node")) global_options().ranks_per_node = positive(vm, "ranks-per-node");
  if (vm.count("threads")) global_options().threads = positive(vm, "threads");
  return rest;
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

const std::vector<CommandInfo>& commands() {
  static const std::vector<CommandInfo> list = {
      {"topo", "print the discovered world: hosts, nodes, local ranks, process groups, threads, GPUs", true, run_topo},
      {"train", "fine-tune with FSDP (mpirun -np N / srun): tessera train --config run.json", true, run_train},
      {"eval", "per-sequence next-token loss of a model on token ids (single process or mpirun, sharded)", true, run_eval},
      {"generate", "text from a model or a sharded checkpoint (KV cache; single process or mpirun, sharded)", true, run_generate},
      {"init-model", "write a Hugging Face model directory with the Llama initialisation", false, run_init_model},
      {"tokenize", "pre-tokenise a corpus (text, JSONL chat/prompt-completion/text) into a token file that train maps", false, run_tokenize},
      {"chat-template", "render a model's chat template on a conversation, as Hugging Face's apply_chat_template does", false, run_chat_template},
      {"report", "write a run's HTML report (loss, validation, lr, grad norm, tokens/s, MFU, memory, config, topology)", false, run_report},
      {"ckpt", "sharded checkpoints: consolidate (to Hugging Face), inspect, verify", false, run_ckpt},
      {"lora", "LoRA adapters (Hugging Face PEFT format): merge into the base model's weights", false, run_lora},
      {"config", "print the configuration reference, validate a config file, or translate an Accelerate FSDP config", false, run_config},
      {"plan", "predict per-rank GPU memory and host RAM of a run, say whether it fits and what would make it fit", false, run_plan},
      {"diagnose", "after a hang or crash: which ranks were behind in which collective, or disagreed (flight records)", false, run_diagnose},
  };
  return list;
}

}  // namespace tessera::launcher
