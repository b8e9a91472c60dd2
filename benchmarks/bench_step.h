#pragma once
#include <string>
#include <vector>

namespace tessera::bench {

// `tessera bench step` under `mpirun -np W`: tokens/s of an FSDP training step at W ranks against one
// plain LibTorch process (no sharding, torch::optim::AdamW) running the same global batch with the
// same total threads, measured in the same run; prints both and the ratio.
int run_bench_step(const std::vector<std::string>& args);

}  // namespace tessera::bench
