// `tessera bench collectives`: nccl-tests-style sweep of the collectives FSDP uses (all-gather,
// reduce-scatter, all-reduce, broadcast) over the process groups (world, intra, inter), with
// correctness checks, algbw/busbw columns, and same-run baselines: raw MPI on the same buffers
// (called on the communicator's own MPI communicator and communication thread, timed there) and
// LibTorch's c10d Gloo backend (when its headers were available at build time).
#pragma once
#include <string>
#include <vector>

namespace tessera::bench {

// args: the options after "bench collectives" (-b -e -f -n -w --op --group --dtype --json ...).
// Uses the process groups of tessera::launcher::current(). Returns the exit code.
int run_bench_collectives(const std::vector<std::string>& args);

}  // namespace tessera::bench
