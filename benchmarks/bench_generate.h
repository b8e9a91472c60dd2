// `tessera bench generate [--preset small] [--prompt-len 128] [--new-tokens 32] [--recompute-tokens 8]
// [--rounds 3] [--dtype fp32|bf16] [--json]` (alone or under mpirun -np N): the speed of
// `tessera generate` (runtime/generate/generator.h) on a preset initialised in place, every number
// measured in the same run, in interleaved rounds (medians):
//   prefill tokens/s      the prompt in one forward, with the KV cache;
//   decode tokens/s       one forward per new token with the KV cache, the layers re-gathered per
//                         forward (full_shard) and kept gathered (shard_grad_op): the cost of
//                         re-gathering per token is their ratio;
//   recompute tokens/s    the same new tokens, each by one forward of the whole sequence without a
//                         cache (full_shard);
//   KV cache / recompute  the decode speed-up the cache gives.
#pragma once
#include <string>
#include <vector>

namespace tessera::bench {

int run_bench_generate(const std::vector<std::string>& args);

}  // namespace tessera::bench
