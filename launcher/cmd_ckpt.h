// `tessera ckpt`: offline tools for sharded checkpoints (single process, no MPI world needed).
//   tessera ckpt consolidate --checkpoint DIR --out HFDIR [--dtype bf16|fp32|fp16] [--max-shard-size 2GB]
//   tessera ckpt inspect DIR
//   tessera ckpt verify DIR
#pragma once
#include <string>
#include <vector>

namespace tessera::launcher {

// args: everything after "ckpt" (the action first). Returns the exit code; bad input throws
// tessera::Error(Input) / model::ModelError (exit 2).
int run_ckpt(const std::vector<std::string>& args);

// A checkpoint directory (a manifest.json there), or Error(Input) saying what `dir` is instead, after
// `what` (e.g. a checkpoint.dir holding checkpoints: then it names them).
void require_checkpoint(const std::string& dir, const std::string& what);

// The tokenizer files of a model directory `dir` (tokenizer.json, tokenizer_config.json,
// special_tokens_map.json, tokenizer.model, generation_config.json: those there) copied into the
// exported model directory `out`; one line on stdout says which. Used by ckpt consolidate and lora merge.
void copy_tokenizer_files(const std::string& dir, const std::string& out);

}  // namespace tessera::launcher
