// Shared CLI plumbing for subcommands (Boost.Program_options). Every subcommand has the signature
//   int run_<name>(const std::vector<std::string>& args)   // args after the subcommand name
// and uses parse_command() so that --help, unknown options (with the closest valid one suggested)
// and bad values behave the same everywhere: bad input throws tessera::Error(Input) -> exit 2.
#pragma once
#include <boost/program_options.hpp>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace tessera::launcher {

namespace po = boost::program_options;

// Parses `args` against `desc` (which gets --help added). Returns nullopt after printing help
// (the caller returns 0). `usage` is the first help line, e.g. "tessera eval --model DIR ...".
std::optional<po::variables_map> parse_command(const std::string& usage, po::options_description desc,
                                               const std::vector<std::string>& args,
                                               const po::positional_options_description* pos = nullptr);

// Closest string to `key` among `candidates` (Levenshtein), or "" if nothing is reasonably close.
std::string closest_match(const std::string& key, const std::vector<std::string>& candidates);

// A command made of actions (`tessera ckpt verify DIR`, `tessera lora merge ...`): runs the action
// args[0] names with the arguments after it. --help / -h prints `usage`; no action, or an unknown one
// (the closest suggested), is Error(Input): "tessera ckpt needs an action: consolidate, inspect or
// verify (see tessera ckpt --help)", "unknown ckpt action 'x' (did you mean ...?); one of ...".
using Action = std::function<int(const std::vector<std::string>&)>;
int run_action(const std::string& command, const std::string& usage,
               const std::vector<std::pair<std::string, Action>>& actions, const std::vector<std::string>& args);

// Parses a size like "2GB", "500MB", "64MiB", "1024B" into bytes; throws Error(Input) naming `what`.
// A number without a unit ("80") is refused, naming the sizes it could have meant ("80GiB"), unless
// `bare_bytes` (nccl-tests' -b/-e convention: "1024" is 1024 bytes).
uint64_t parse_byte_size(const std::string& text, const std::string& what, bool bare_bytes = false);

}  // namespace tessera::launcher
