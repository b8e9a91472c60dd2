#pragma once
#include <string>
#include <vector>

namespace tessera::bench {

// `tessera bench optim` (one process, no MPI collectives): AdamW's step over one flat shard for
// each optim.state_dtype (fp32, bf16, int8) on the fused CPU loop and on the tensor-op path (what a
// GPU runs), in interleaved rounds; prints ns per element (median) and the ratio to the fp32 fused
// loop measured in the same run, with each mode's state bytes per parameter.
int run_bench_optim(const std::vector<std::string>& args);

}  // namespace tessera::bench
