// `tessera bench load --model DIR [--modes rank0,parallel,naive] [--json]` (under mpirun -np N):
// peak resident memory and time of loading a Hugging Face checkpoint into full_shard FSDP shards
// with each load mode, per rank, with the ratio of each mode's peak to `naive`'s and the goals of
// issue 5 checked in the output:
//   rank0 and parallel: every non-reading rank's peak <= base + shard + 64 MiB
//   rank0:              the reading rank's peak <= base + shard + 2 x largest unit + 64 MiB
//   rank0 and parallel: load throughput >= 0.7 x `cat FILES > /dev/null` measured in the same run
// base = VmRSS after the engine allocated its (zeroed) shard state, before any weight is read.
// The modes run one after another in ONE process: before each, freed heap is returned to the
// kernel (malloc_trim) and the peak is reset to the current RSS (`echo 5 > /proc/self/clear_refs`),
// so each mode's VmHWM is its own. The page cache is warm for both cat and the loaders.
#pragma once
#include <string>
#include <vector>

namespace tessera::bench {

int run_bench_load(const std::vector<std::string>& args);

}  // namespace tessera::bench
