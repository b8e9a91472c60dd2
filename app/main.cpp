// tessera: one binary, many subcommands. Errors from any rank end every rank: an error raised on all
// ranks together (CollectiveError) exits cleanly with its code; an error on one rank aborts the world
// so that no rank waits forever in a collective. Before that, the failing rank writes its flight
// record (runtime/comm/flight_recorder.h); after a collective timeout the failing ranks wait a short
// grace period for the other ranks' records, and the lowest rank with a record prints what they say
// (the collective that did not complete, the ranks without a record or behind, or a desync) as its
// last line.
#include <c10/util/Exception.h>
#include <mpi.h>
#include <torch/version.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>
#include <thread>

#include "benchmarks/bench.h"
#include "launcher/bootstrap.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "model/errors.h"
#include "runtime/comm/flight_recorder.h"
#include "runtime/gpu/gpu.h"
#include "runtime/memory/tracker.h"
#include "tools/flight_report.h"
#include "util/error.h"

using namespace tessera;
using namespace tessera::launcher;

namespace {

// launcher's commands and `bench` (benchmarks/, which builds on launcher/) after `ckpt`.
const std::vector<CommandInfo>& all_commands() {
  static const std::vector<CommandInfo> list = [] {
    std::vector<CommandInfo> v = commands();
    auto at = std::find_if(v.begin(), v.end(), [](const CommandInfo& c) { return c.name == "ckpt"; });
    v.insert(at == v.end() ? at : at + 1, bench::bench_command());
    return v;
  }();
  return list;
}

void print_usage() {
  std::cout << "tessera - fully sharded data-parallel fine-tuning of Llama 2 (FSDP / ZeRO-3)\n\n"
               "usage: tessera <command> [options]      (tessera <command> --help for its options; tessera --version)\n\n"
               "commands:\n";
  for (const auto& c : all_commands()) {
    std::string name = c.name;
    name.resize(14, ' ');
    std::cout << "  " << name << c.summary << "\n";
  }
  std::cout << "\nMPI commands run under `mpirun -np N tessera ...` or `srun --mpi=pmix tessera ...` and accept\n"
               "--ranks-per-node N (emulate nodes of N consecutive ranks) and --threads N (torch threads per rank).\n";
}

int report(int code, const std::string& what, bool collective, bool timeout = false) {
  const auto& b = current();
  bool print = !collective || b.world_rank == 0;
  // An error of this rank alone: its flight record first (a timeout has written it already).
  if (!collective) comm::flight::dump(timeout ? "timeout" : "error", what);
  if (print) {
    if (collective || b.world_size == 1)
      std::cerr << "tessera: error: " << what << std::endl;
    else
      std::cerr << "tessera: error on rank " << b.world_rank << " (" << b.host << "): " << what << std::endl;
  }
  const std::string flight_dir = comm::flight::dump_dir();
  if (!collective && timeout && b.world_size > 1 && !flight_dir.empty())
    tools::diagnose_after_timeout(flight_dir, b.world_size, b.world_rank);
  if (!collective && b.world_size > 1) abort_all(code);
  finalize();
  return code;
}

// `tessera --version`: what was built, from what, against what (CMakeLists.txt defines both for this
// file; a compile of it elsewhere, as unit.torch26_syntax's, gets these).
#ifndef TESSERA_VERSION
#define TESSERA_VERSION "unknown"
#endif
#ifndef TESSERA_GIT
#define TESSERA_GIT ""
#endif
void print_version() {
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(mpi, &len);
  std::string mpi_line(mpi, std::min<size_t>(std::strlen(mpi), std::strcspn(mpi, ",\n")));
  const char* device = tessera::gpu::built() ? "CUDA + NCCL" : "CPU only";
  std::cout << "tessera " << TESSERA_VERSION << " (" << (*TESSERA_GIT ? TESSERA_GIT : "unknown commit") << "), LibTorch "
            << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR << "." << TORCH_VERSION_PATCH << " (" << device
            << "), C++" << __cplusplus / 100 % 100 << ", " << mpi_line << std::endl;
}

// Ends the process with `rc` once the command is done: its output flushed, but no static destructors
// run. LibTorch's would deregister its ~2,000 operators one by one: ~10% of the CPU time of a short
// command (measurements: docs/PERFORMANCE.md#build-suite-and-start-up-measurements). Nothing of Tessera's is left for them: the command's objects (checkpoint writer,
// communicator threads, report and metrics files) are destroyed and MPI is finalised before this
// runs, and the process-lifetime state (memory tracker, profiler, flight recorder) is never
// destroyed anyway. Sanitizer builds (TESSERA_SANITIZE, scripts/sanitize.sh: CMakeLists.txt defines
// TESSERA_EXIT_NORMALLY) exit normally.
[[noreturn]] void exit_now(int rc) {
  std::cout.flush();
  std::cerr.flush();
  std::clog.flush();
  std::fflush(nullptr);
#ifdef TESSERA_EXIT_NORMALLY
  std::exit(rc);
#else
  std::_Exit(rc);
#endif
}

int run_command_line(int argc, char** argv) {
  memory::configure_process_allocators();  // first: before any thread allocates
  std::vector<std::string> all(argv + 1, argv + argc);
  if (!all.empty() && (all[0] == "--version" || all[0] == "version")) {
    print_version();
    return 0;
  }
  if (all.empty() || all[0] == "--help" || all[0] == "-h" || all[0] == "help") {
    print_usage();
    return all.empty() ? 2 : 0;
  }
  const CommandInfo* cmd = nullptr;
  for (const auto& c : all_commands())
    if (c.name == all[0]) cmd = &c;
  if (!cmd) {
    std::vector<std::string> names;
    for (const auto& c : all_commands()) names.push_back(c.name);
    std::string hint = closest_match(all[0], names);
    std::cerr << "tessera: error: unknown command '" << all[0] << "'"
              << (hint.empty() ? "" : " (did you mean '" + hint + "'?)") << "; see tessera --help" << std::endl;
    return 2;
  }
  std::vector<std::string> args(all.begin() + 1, all.end());
  try {
    if (cmd->needs_mpi) {
      // A launcher that stops reading a rank's output (srun ending a step, mpirun on Ctrl-C, a
      // closed `| head`) must not kill the rank with SIGPIPE before it saves or writes its flight
      // record: a write to the gone pipe fails with EPIPE instead and the run goes on (as Python does).
      signal(SIGPIPE, SIG_IGN);
      args = take_global_options(args);
      BootstrapOptions opts;
      opts.ranks_per_node = global_options().ranks_per_node;
      opts.threads = global_options().threads;
      opts.init_mpi = !(cmd->without_mpi && cmd->without_mpi(args));
      if (opts.init_mpi)
        collectively([&] { bootstrap(argc, argv, opts); });
      else
        bootstrap(argc, argv, opts);
    } else {
      BootstrapOptions opts;
      opts.init_mpi = false;
      bootstrap(argc, argv, opts);
    }
    int rc = cmd->run(args);
    finalize();
    return rc;
  } catch (const CollectiveError& e) {
    return report(e.exit_code(), e.what(), true);
  } catch (const Error& e) {
    return report(e.exit_code(), e.what(), false, e.kind() == ErrorKind::Timeout);
  } catch (const model::ModelError& e) {
    return report(2, e.what(), false);
  } catch (const c10::Error& e) {
    return report(1, e.what_without_backtrace(), false);
  } catch (const std::exception& e) {
    return report(1, e.what(), false);
  }
}

}  // namespace

int main(int argc, char** argv) { exit_now(run_command_line(argc, argv)); }
