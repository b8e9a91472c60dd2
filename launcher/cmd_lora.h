// `tessera lora`: offline tools for LoRA adapters in Hugging Face PEFT's format (model/peft_adapter.h),
// single process, no MPI world needed.
//   tessera lora merge --model BASE --adapter ADAPTER_DIR --out HF_DIR [--dtype bf16|fp16|fp32] [--max-shard-size 2GB]
#pragma once
#include <string>
#include <vector>

namespace tessera::launcher {

// args: everything after "lora" (the action first). Returns the exit code; bad input throws
// tessera::Error(Input) / model::ModelError (exit 2).
//
// merge: writes the Hugging Face model W + (lora_alpha / r) * B A for every adapted weight (in fp32,
// then rounded once to --dtype, default the base's config.json torch_dtype), every other tensor
// copied (bit for bit when --dtype is its stored dtype), streaming one tensor at a time; config.json
// as the base's (torch_dtype = --dtype) and the base's tokenizer files. Refuses an adapter that does
// not fit the base (model/peft_adapter.h), an --out that is the base directory, inside it or a
// symbolic link, and an existing non-empty --out; nothing is left behind on failure.
int run_lora(const std::vector<std::string>& args);

}  // namespace tessera::launcher
