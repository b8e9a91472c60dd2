#pragma once
#include <string>
#include <vector>

namespace tessera::bench {

// `tessera bench memory` (one process; it launches each configuration under mpirun itself):
// for FSDP training runs and an evaluation at 1, 2 and 4 ranks, the measured peak resident set per
// rank and its breakdown by category (metrics.jsonl's "memory"), the memory model's floor and the
// ratio to it, and `tessera plan`'s prediction with its error.
int run_bench_memory(const std::vector<std::string>& args);

}  // namespace tessera::bench
