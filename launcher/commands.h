// Subcommands of the `tessera` binary. Each takes the arguments after its name and returns the
// process exit code; bad input throws tessera::Error(Input) (exit 2).
#pragma once
#include <string>
#include <vector>

namespace tessera::launcher {

struct CommandInfo {
  std::string name;
  std::string summary;
  bool needs_mpi;  // bootstrap MPI (and process groups) before running
  int (*run)(const std::vector<std::string>& args);
  // For an MPI command: true when these arguments run it as one plain process without MPI (a
  // driver that launches ranks itself, e.g. `bench step --peer`). Null: always MPI.
  bool (*without_mpi)(const std::vector<std::string>& args) = nullptr;
};

const std::vector<CommandInfo>& commands();

// Global options accepted before or after the subcommand by MPI commands.
struct GlobalOptions {
  int ranks_per_node = 0;
  int threads = 0;
};
GlobalOptions& global_options();
// Takes --ranks-per-node N and --threads N (`--name N` or `--name=N`, anywhere among an MPI
// command's arguments) into global_options(), and returns the other arguments in their order. A
// missing value, or one that is not a positive integer, is Error(Input) naming the option.
std::vector<std::string> take_global_options(const std::vector<std::string>& args);

int run_topo(const std::vector<std::string>& args);
int run_config(const std::vector<std::string>& args);
int run_train(const std::vector<std::string>& args);
// In cmd_train.cpp with run_train (the same FSDP setup):
// tessera eval --model DIR (--tokens FILE | --data PATH [--config run.json] [--set k=v]... [--all-tokens])
//              [--dtype fp32|bf16]
// --tokens: prints {"per_sequence_loss": [...], "mean_loss": x, "tokens": n, "scored": "all tokens"}
// on stdout, where mean_loss is the token-weighted mean over all n predicted tokens (sum of T-1
// over the sequences): a token file has no targets.
// --data: the data as `tessera train` reads it with the configuration's data.* keys (chat and
// prompt/completion records masked as in training); prints {"mean_loss": x, "tokens": n,
// "sequences": s, "scored": "target tokens"}: training's validation loss (Trainer::evaluate) over
// the n target tokens, or over every token with --all-tokens ("scored": "all tokens").
int run_eval(const std::vector<std::string>& args);
int run_diagnose(const std::vector<std::string>& args);
// cmd_generate.cpp: tessera generate (--model DIR | --checkpoint DIR/step-N) (--prompt | --prompts | --prompt-ids)
int run_generate(const std::vector<std::string>& args);

}  // namespace tessera::launcher
