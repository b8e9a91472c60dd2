// `tessera init-model` (write a freshly initialised Hugging Face model directory) and
// `tessera eval` (next-token loss of a model directory on a token file or on training data).
#pragma once
#include <string>
#include <vector>

namespace tessera::launcher {

// tessera init-model --preset NAME|--config config.json --out DIR [--dtype fp32|bf16|fp16]
//                    [--seed N] [--max-shard-size 2GB]
// Streams one tensor at a time (peak memory ~ the largest tensor), so it works for 70B.
int run_init_model(const std::vector<std::string>& args);

// tessera eval --model DIR (--tokens FILE | --data PATH [--config run.json] [--set k=v]... [--all-tokens])
//              [--dtype fp32|bf16]
// --tokens: prints {"per_sequence_loss": [...], "mean_loss": x, "tokens": n, "scored": "all tokens"}
// on stdout, where mean_loss is the token-weighted mean over all n predicted tokens (sum of T-1
// over the sequences): a token file has no targets.
// --data: the data as `tessera train` reads it with the configuration's data.* keys (chat and
// prompt/completion records masked as in training); prints {"mean_loss": x, "tokens": n,
// "sequences": s, "scored": "target tokens"}: training's validation loss (Trainer::evaluate) over
// the n target tokens, or over every token with --all-tokens ("scored": "all tokens").
int run_eval(const std::vector<std::string>& args);

}  // namespace tessera::launcher
