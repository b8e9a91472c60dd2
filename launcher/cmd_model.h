// `tessera init-model` (write a freshly initialised Hugging Face model directory) and
// `tessera eval` (per-sequence next-token loss of a model directory on a token file).
#pragma once
#include <string>
#include <vector>

namespace tessera::launcher {

// tessera init-model --preset NAME|--config config.json --out DIR [--dtype fp32|bf16|fp16]
//                    [--seed N] [--max-shard-size 2GB]
// Streams one tensor at a time (peak memory ~ the largest tensor), so it works for 70B.
int run_init_model(const std::vector<std::string>& args);

// tessera eval --model DIR --tokens FILE [--dtype fp32|bf16]
// Prints {"per_sequence_loss": [...], "mean_loss": x, "tokens": n} on stdout, where mean_loss is
// the token-weighted mean over all n predicted tokens (sum of T-1 over the sequences).
int run_eval(const std::vector<std::string>& args);

}  // namespace tessera::launcher
