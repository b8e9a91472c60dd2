// LoRA in `tessera train`: the base model's identity a LoRA checkpoint records, and the refusal of a
// resume that does not match (launcher/cmd_train.cpp calls both before anything is written).
//
// A LoRA checkpoint holds the adapters, their optimizer state and the data position, never the base
// (the engine's checkpointed state is its trainable groups: runtime/fsdp/fsdp.h); its manifest's
// state carries "lora": {rank, alpha, dropout, targets, base_dtype, double_quant, base: {path, hash}},
// where hash is a 64-bit FNV-1a (hex) over the base's config.json (as the family writes it) and its
// tensor index (every tensor's name, dtype and shape in file order; for a preset, the initialisation
// seed instead of dtypes). A resume against another base (another hash), a LoRA checkpoint resumed
// without LoRA, or a full checkpoint resumed with LoRA is refused in one line naming the checkpoint.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "launcher/config.h"
#include "model/config.h"

namespace tessera::model {
class ModelDir;
}

namespace tessera::launcher {

// {"path": model.path (or "preset:<name>"), "hash": "<16 hex digits>"}. `dir` null: the preset of
// cfg.model.preset initialised from cfg.model.seed.
nlohmann::json base_identity(const Config& cfg, const model::ModelConfig& mc, const model::ModelDir* dir);
// The manifest state's "lora" object of a run (cfg.lora enabled).
nlohmann::json lora_state(const Config& cfg, const nlohmann::json& base);
// Error(Input) naming `ckpt` when its state's "lora" does not match `current` (null: LoRA off):
// with/without LoRA, another base, or another rank/targets (the adapters' shapes).
void check_lora_resume(const std::string& ckpt, const nlohmann::json& current);

}  // namespace tessera::launcher
