#include "launcher/cli.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "util/error.h"

namespace tessera::launcher {

std::string closest_match(const std::string& key, const std::vector<std::string>& candidates) {
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= b.size(); ++j)
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      std::swap(prev, cur);
    }
    return prev[b.size()];
  };
  std::string best;
  size_t best_d = std::string::npos;
  for (const auto& c : candidates) {
    size_t d = distance(key, c);
    if (d < best_d) best_d = d, best = c;
  }
  // Accept when the edit distance is small relative to the key (or the key is a prefix).
  if (best.empty()) return "";
  bool prefix = best.rfind(key, 0) == 0 && !key.empty();
  return (prefix || best_d <= std::max<size_t>(2, key.size() / 3)) ? best : "";
}

std::optional<po::variables_map> parse_command(const std::string& usage, po::options_description desc,
                                               const std::vector<std::string>& args,
                                               const po::positional_options_description* pos) {
  desc.add_options()("help,h", "show this help");
  po::variables_map vm;
  try {
    po::command_line_parser parser(args);
    parser.options(desc).style(po::command_line_style::default_style &
                               ~po::command_line_style::allow_guessing);
    if (pos) parser.positional(*pos);
    const po::parsed_options parsed = parser.run();
    // Without a positional description Boost keeps a bare word as an option without a name, which
    // po::store then drops: `tessera train run.json` would ignore the file. Refused instead.
    for (const auto& o : parsed.options)
      if (o.string_key.empty() && !o.original_tokens.empty())
        throw TESSERA_INPUT_ERROR("unexpected argument '" + o.original_tokens.front() + "' (options are given as " +
                                  "--name value); see " + usage.substr(0, usage.find(" --")) + " --help");
    po::store(parsed, vm);
    if (vm.count("help")) {
      std::cout << "usage: " << usage << "\n\n" << desc << std::endl;
      return std::nullopt;
    }
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    std::string opt = e.get_option_name();
    std::vector<std::string> names;
    for (const auto& o : desc.options()) names.push_back("--" + o->long_name());
    std::string hint = closest_match(opt, names);
    throw TESSERA_INPUT_ERROR("unknown option '" + opt + "'" +
                              (hint.empty() ? "" : " (did you mean '" + hint + "'?)") + "; see " +
                              usage.substr(0, usage.find(" --")) + " --help");
  } catch (const po::error& e) {
    throw TESSERA_INPUT_ERROR(std::string(e.what()) + "; see " + usage.substr(0, usage.find(" --")) +
                              " --help");
  }
  return vm;
}

uint64_t parse_byte_size(const std::string& text, const std::string& what, bool bare_bytes) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit((unsigned char)text[i]) || text[i] == '.')) ++i;
  std::string num = text.substr(0, i), unit = text.substr(i);
  for (auto& c : unit) c = std::toupper((unsigned char)c);
  double mult = 0;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else if (unit == "TB") mult = 1e12;
  else if (unit == "KIB" || unit == "K") mult = 1024.0;
  else if (unit == "MIB" || unit == "M") mult = 1024.0 * 1024;
  else if (unit == "GIB" || unit == "G") mult = 1024.0 * 1024 * 1024;
  else if (unit == "TIB" || unit == "T") mult = 1024.0 * 1024 * 1024 * 1024;
  double v = 0;
  try {
    size_t used = 0;
    v = num.empty() ? -1 : std::stod(num, &used);
    if (used != num.size()) v = -1;
  } catch (...) {
    v = -1;
  }
  if (unit.empty() && !bare_bytes && v > 0)
    throw TESSERA_INPUT_ERROR(what + ": '" + text + "' has no unit (it would be " + text +
                              " bytes); write it with one, e.g. " + num + "GiB, " + num + "GB or " + num + "MiB");
  if (mult == 0 || v <= 0)
    throw TESSERA_INPUT_ERROR(what + ": '" + text + "' is not a size (examples: 2GB, 500MB, 64MiB, 80GiB, 1TiB, 1048576B)");
  return static_cast<uint64_t>(v * mult);
}

int run_action(const std::string& command, const std::string& usage,
               const std::vector<std::pair<std::string, Action>>& actions, const std::vector<std::string>& args) {
  std::vector<std::string> names;
  for (const auto& a : actions) names.push_back(a.first);
  std::string listed, alternatives;  // "a, b or c", "a, b, c"
  for (size_t i = 0; i < names.size(); ++i) {
    listed += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
    alternatives += (i ? ", " : "") + names[i];
  }
  if (args.empty())
    throw TESSERA_INPUT_ERROR("tessera " + command + " needs an action: " + listed + " (see tessera " + command + " --help)");
  if (args[0] == "--help" || args[0] == "-h") {
    std::printf("%s", usage.c_str());
    return 0;
  }
  for (const auto& [name, action] : actions)
    if (args[0] == name) return action(std::vector<std::string>(args.begin() + 1, args.end()));
  const std::string hint = closest_match(args[0], names);
  throw TESSERA_INPUT_ERROR("unknown " + command + " action '" + args[0] + "'" +
                            (hint.empty() ? "" : " (did you mean '" + hint + "'?)") + "; one of " + alternatives);
}

}  // namespace tessera::launcher
