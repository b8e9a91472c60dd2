// `tessera lora`: offline tools for LoRA adapters in Hugging Face PEFT's format (model/peft_adapter.h),
// single process, no MPI world needed.
//   tessera lora merge --model BASE --adapter ADAPTER_DIR --out HF_DIR [--dtype bf16|fp16|fp32] [--max-shard-size 2GB]
//   tessera lora export --checkpoint DIR/step-N --out ADAPTER_DIR [--dtype fp32|bf16|fp16]
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
//
// export: the adapters of a LoRA checkpoint (its manifest's state.lora; every checksum verified first)
// as a PEFT adapter directory (adapter_config.json + adapter_model.safetensors, --dtype default fp32),
// read by peft and by --adapter; base_model_name_or_path is the run's model.path. Refuses a checkpoint
// without LoRA (full weights: tessera ckpt consolidate) and an existing non-empty --out.
int run_lora(const std::vector<std::string>& args);

// export_lora_checkpoint(ckpt, out, dtype): export's work (also what a LoRA run calls at its end);
// returns the number of adapted weights.
int64_t export_lora_checkpoint(const std::string& ckpt, const std::string& out, const std::string& dtype);

}  // namespace tessera::launcher
