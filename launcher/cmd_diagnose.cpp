// `tessera diagnose <log.dir>`: reads the flight records a failed run left in <log.dir>/flight
// (runtime/comm/flight_recorder.h) and says which collective did not complete, which ranks left no
// record or were behind, and whether ranks disagreed about a collective (a desync); and, from the
// run's metrics.jsonl, when the records are history (the run was resumed past them) or an interruption
// (SIGTERM on every rank, nothing pending). Single process, no MPI.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "launcher/cli.h"
#include "launcher/commands.h"
#include "runtime/checkpoint/checkpoint.h"
#include "tools/flight_report.h"
#include "tools/report.h"
#include "util/error.h"
#include "util/json.h"

namespace tessera::launcher {
namespace fs = std::filesystem;

namespace {

// The highest step <log_dir>/metrics.jsonl records (-1 without one).
int64_t last_logged_step(const std::string& log_dir) {
  std::ifstream in(fs::path(log_dir) / "metrics.jsonl");
  int64_t last = -1;
  for (std::string line; std::getline(in, line);) {
    const auto rec = util::parse_json_or_discarded(line);
    if (rec.is_object() && rec.contains("step") && rec["step"].is_number_integer())
      last = std::max(last, rec["step"].get<int64_t>());
  }
  return last;
}

// The step of a "step-N" checkpoint path (-1 otherwise).
int64_t step_of(const std::string& checkpoint) {
  const auto name = fs::path(checkpoint).filename().string();
  return name.rfind("step-", 0) == 0 ? std::atoll(name.c_str() + 5) : -1;
}

// Every rank's record says SIGTERM, written when the signal came (mid-step, a collective in flight).
// The run then finished step `step` (metrics.jsonl logs it) and saved, or was ended first: by mpirun,
// which kills its ranks odls_base_sigkill_timeout seconds after its SIGTERM (docs/TROUBLESHOOTING.md).
std::string interrupted(int64_t step, int64_t logged, bool pending, const std::string& latest) {
  const std::string head = "interrupted: every rank got SIGTERM at step " + std::to_string(step) +
                           " (Ctrl-C under mpirun, preemption or scancel), not a hang";
  if (logged >= step)
    return head + "; the run finished that step (metrics.jsonl logs it) and stopped; resume with --resume";
  if (!latest.empty() && step_of(latest) == step - 1)
    return head + "; the ranks stopped during that step and the last complete step is saved (" + latest +
           ", checkpoint.dir/latest); resume with --resume";
  if (!pending) return head + "; no collective was left pending; resume with --resume";
  return head + "; the ranks were ended before that step completed (under mpirun: give them time with "
                "--mca odls_base_sigkill_timeout, docs/TROUBLESHOOTING.md); resume from the last checkpoint";
}

// A string at a path of keys in `j` ("" if absent).
std::string text_at(const nlohmann::json& j, std::initializer_list<const char*> keys) {
  const nlohmann::json* at = &j;
  for (const char* k : keys) {
    if (!at->is_object() || !at->contains(k)) return "";
    at = &(*at)[k];
  }
  return at->is_string() ? at->get<std::string>() : "";
}

// The checkpoint a resume of the run would start from (checkpoint::latest of its checkpoint.dir),
// "" if none or if checkpoint.dir is refused.
std::string latest_checkpoint(const nlohmann::json& info) {
  const std::string dir = text_at(info, {"config", "checkpoint", "dir"});
  try {
    return dir.empty() ? "" : checkpoint::latest(dir);
  } catch (const std::exception&) {
    return "";
  }
}

int64_t started_ms(const std::string& run_id) { return std::atoll(run_id.c_str()); }

// Records of a start that never ran a step (every record at step -1) with an input error on a rank:
// the run was refused at start, one rank's check (its shard of a checkpoint, its device) failing
// while the others passed. Not a hang and not a crash of training. Returns "" otherwise.
std::string refused_start(const tools::Dumps& dumps) {
  const nlohmann::json* error = nullptr;
  for (const auto& r : dumps.records) {
    if (r.contains("context") && r["context"].value("step", int64_t{-1}) >= 0) return "";
    if (!error && r.value("reason", "") == "error") error = &r;
  }
  if (!error) return "";
  return "refused: the run was refused at start by an input error on rank " + std::to_string(error->value("rank", -1)) +
         " (" + error->value("message", std::string("?")) + "); no step ran and nothing hung: fix the input and start again";
}

// Records that a later run of this log.dir made stale: run_info.json names a run that started after them.
std::string stale_records(const nlohmann::json& info, const tools::Dumps& dumps) {
  const std::string mine = dumps.records.front().value("run_id", "");
  const std::string last = text_at(info, {"run_id"});
  if (last.empty() || last == mine || started_ms(last) <= started_ms(mine)) return "";
  return "history: these records are of an earlier run (run " + mine + "); a later run (run " + last +
         ", run_info.json) started in this log.dir since and left no flight record: nothing of it failed that a record shows";
}

// What the records mean for the run as a whole, or "" when they are the run's last word:
//  - "history:" the run went on past them (metrics.jsonl logs later steps: it was resumed), or a
//    later run started in the log.dir since (run_info.json names it);
//  - "refused:" the run stopped at start on one rank's input error, before any step;
//  - "interrupted:" every rank was stopped by SIGTERM (preemption, Ctrl-C under mpirun, scancel):
//    not a hang, whatever was in flight when the signal came (interrupted() says more).
std::string run_history(const std::string& log_dir, const tools::Dumps& dumps,
                        const tools::Diagnosis& dx) {
  if (dumps.records.empty()) return "";
  const auto info = tools::read_run_info(log_dir);
  if (auto stale = stale_records(info, dumps); !stale.empty()) return stale;
  if (auto refused = refused_start(dumps); !refused.empty()) return refused;
  int64_t step = -1;
  bool all_sigterm = true;
  for (const auto& r : dumps.records) {
    if (r.contains("context") && r["context"].value("step", int64_t{-1}) > step) step = r["context"]["step"];
    all_sigterm &= r.value("reason", "") == "signal SIGTERM";
  }
  const int64_t logged = last_logged_step(log_dir);
  if (step >= 0 && logged > step)
    return "history: these records are of a run that stopped at step " + std::to_string(step) +
           "; the run was resumed and has since logged up to step " + std::to_string(logged) +
           " (metrics.jsonl): nothing has failed since";
  // A rank with no record died first (SIGKILL, OOM), and one behind in a pending collective that had
  // been pending for kStalledS when the signal came stalled before it: those are failures that the
  // SIGTERMs of the cleanup only follow. Pending for less, ranks were only at different points of the
  // step (a busy host: one rank a reduce-scatter ahead of the other), which a signal always finds.
  constexpr double kStalledS = 5;
  const bool stalled = dx.pending && !dx.behind.empty() && dx.pending_wait_s >= kStalledS;
  const bool cleanup_of_failure = !dx.missing.empty() || (logged < step && stalled);
  if (all_sigterm && !dx.desync && !cleanup_of_failure) return interrupted(step, logged, dx.pending, latest_checkpoint(info));
  return "";
}

}  // namespace

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
  const std::string flight = fs::is_directory(fs::path(dir) / "flight", ec) ? (fs::path(dir) / "flight").string() : dir;
  const auto dumps = tools::read_dumps(flight);
  const auto dx = tools::diagnose(dumps);
  for (const auto& line : dx.lines) std::cout << line << "\n";
  const std::string history = run_history(fs::path(flight).parent_path().string(), dumps, dx);
  if (!history.empty()) std::cout << history << "\n";
  std::cout << "summary: " << (history.empty() ? dx.summary : history.substr(history.find(':') + 2)) << std::endl;
  return 0;
}

}  // namespace tessera::launcher
