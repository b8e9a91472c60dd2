// `tessera diagnose <log.dir>`: reads the flight records a failed run left in <log.dir>/flight
// (runtime/comm/flight_recorder.h) and says which collective did not complete, which ranks left no
// record or were behind, and whether ranks disagreed about a collective (a desync). Single process,
// no MPI.
#include <filesystem>
#include <iostream>

#include "launcher/cli.h"
#include "launcher/commands.h"
#include "runtime/comm/flight_report.h"
#include "runtime/error.h"

namespace tessera::launcher {

int run_diagnose(const std::vector<std::string>& args) {
  po::options_description desc("diagnose options");
  desc.add_options()("dir", po::value<std::string>()->required(),
                     "the run's log.dir (its flight/ folder is read), or the flight folder itself");
  po::positional_options_description pos;
  pos.add("dir", 1);
  auto vm = parse_command("tessera diagnose LOG_DIR", desc, args, &pos);
  if (!vm) return 0;
  const std::string dir = (*vm)["dir"].as<std::string>();
  std::error_code ec;
  const std::string flight = std::filesystem::is_directory(std::filesystem::path(dir) / "flight", ec)
                                 ? (std::filesystem::path(dir) / "flight").string()
                                 : dir;
  const auto dx = comm::flight::diagnose(comm::flight::read_dumps(flight));
  for (const auto& line : dx.lines) std::cout << line << "\n";
  std::cout << "summary: " << dx.summary << std::endl;
  return 0;
}

}  // namespace tessera::launcher
