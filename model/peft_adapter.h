// LoRA adapters in Hugging Face PEFT's on-disk format (what peft.PeftModel.from_pretrained loads):
//
//   ADAPTER_DIR/adapter_config.json      {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r", "lora_alpha",
//                                         "lora_dropout", "target_modules", "bias": "none",
//                                         "base_model_name_or_path", "fan_in_fan_out": false,
//                                         "inference_mode": true, "use_rslora": false, "use_dora": false, ...}
//   ADAPTER_DIR/adapter_model.safetensors one pair per adapted linear module M of a decoder layer:
//       base_model.model.<M>.lora_A.weight  [r, in]     e.g. M = model.layers.3.self_attn.q_proj
//       base_model.model.<M>.lora_B.weight  [out, r]    (M.weight is [out, in] in the base model)
//     (no adapter name such as ".default." in the keys: PEFT saves without it).
//
// The adapted weight is W + (lora_alpha / r) * B A (PeftConfig::scale()).
//
// Targets: PEFT's rule for a list of target_modules: a module M is adapted when its name equals an
// entry or ends with "." + entry ("q_proj", "self_attn.q_proj"); the string "all-linear" means every
// linear module of the decoder layers. Only the decoder layers' 2-D linear weights can be targeted
// (not embed_tokens, lm_head or norms): an entry that matches none of them is refused.
//
// Reading refuses, naming the file and the key, what Tessera cannot honour: peft_type other than
// LORA, task_type other than CAUSAL_LM, bias other than "none", fan_in_fan_out, use_rslora, use_dora,
// lora_bias, non-empty rank_pattern / alpha_pattern / modules_to_save / layers_to_transform /
// layers_pattern, target_modules as a regular expression, a non-positive r or lora_alpha, dropout
// outside [0, 1); an adapter_model.bin without safetensors; an unknown or missing tensor key; a
// shape other than the base model's; and a base_model_name_or_path whose last path component is
// neither the base model directory's name nor its config.json _name_or_path's last component (an
// empty or absent name is accepted: shapes are then the only check). Keys PEFT adds that change
// nothing here (revision, init_lora_weights, ...) are ignored. Errors are model::ModelError.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/safetensors.h"

namespace tessera::model {

constexpr const char* kPeftKeyPrefix = "base_model.model.";

struct PeftConfig {
  int64_t r = 8;
  double lora_alpha = 16;
  double lora_dropout = 0;
  std::vector<std::string> target_modules;  // module names or suffixes; {"all-linear"}: every linear
  std::string base_model_name_or_path;
  // What PEFT writes and Tessera only supports with these values (checked on read).
  std::string peft_type = "LORA", task_type = "CAUSAL_LM", bias = "none";
  bool fan_in_fan_out = false, inference_mode = true, use_rslora = false;

  double scale() const { return lora_alpha / static_cast<double>(r); }
  nlohmann::json to_json() const;
  // ModelError "<source>: <key> ..." for anything above that Tessera cannot honour.
  static PeftConfig from_json(const nlohmann::json& j, const std::string& source);
};

// One adapted linear module.
struct LoraTarget {
  std::string module;       // module tree name, e.g. "model.layers.0.self_attn.q_proj"
  std::string base_weight;  // its weight in the base model: module + ".weight", [out, in]
  TensorSpec a, b;          // module + ".lora_A.weight" [r, in], module + ".lora_B.weight" [out, r]
};

// The targets of `cfg` in a model of config `base`, in the base model's tensor order. ModelError
// for a target_modules entry that matches no linear module of the decoder layers.
std::vector<LoraTarget> lora_targets(const ModelConfig& base, const PeftConfig& cfg, const std::string& source);

// Writes ADAPTER_DIR (new or empty; whole or not at all: model/safetensors.h
// write_directory_atomically): adapter_config.json and adapter_model.safetensors in `dtype`.
// produce(spec) is called once per tensor, A then B of each target in lora_targets order, with the
// module tree name (spec.name = target.a.name or target.b.name); the file key is kPeftKeyPrefix +
// that name. Streaming: one tensor at a time.
void write_peft_adapter(const std::string& dir, const PeftConfig& cfg, const ModelConfig& base, DType dtype,
                        const std::function<at::Tensor(const TensorSpec&)>& produce);

// A PEFT adapter directory validated against a base model (see the header comment for what is
// refused). base_dir: the base model's directory (its name and config.json _name_or_path are what
// base_model_name_or_path is compared with).
class PeftAdapter {
 public:
  PeftAdapter(const std::string& dir, const ModelConfig& base, const std::string& base_dir);
  ~PeftAdapter();

  const PeftConfig& config() const { return cfg_; }
  const std::vector<LoraTarget>& targets() const { return targets_; }
  // The target's A [r, in] and B [out, r], converted to fp32.
  at::Tensor read_a(const LoraTarget& t) const;
  at::Tensor read_b(const LoraTarget& t) const;

 private:
  std::string dir_;
  PeftConfig cfg_;
  std::vector<LoraTarget> targets_;
  std::unique_ptr<SafetensorsFile> file_;
};

}  // namespace tessera::model
