// `tessera bench checkpoint` (run under mpirun -np W): throughput of sharded checkpoint save and
// load at W ranks against a dd-style sequential write (with fsync) and read of the same bytes per
// rank, measured in the same run, with the ratio (goal >= 0.7); and the time an async save blocks
// the caller as a fraction of a synchronous save (goal <= 0.2).
#pragma once
#include <string>
#include <vector>

namespace tessera::bench {

int run_bench_checkpoint(const std::vector<std::string>& args);

}  // namespace tessera::bench
