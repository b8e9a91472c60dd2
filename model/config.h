// Llama 2 hyper-parameters, read from / written to a Hugging Face config.json, plus the built-in
// presets. Everything here is plain arithmetic: no tensors, no files opened except by load().
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::model {

struct LlamaConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // < num_attention_heads means grouped-query attention (70B)
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  std::string torch_dtype = "float32";  // "float32" | "bfloat16" | "float16" (storage dtype hint)
  int64_t bos_token_id = 1;
  int64_t eos_token_id = 2;

  // Built-in presets: tiny, small, llama2-7b, llama2-13b, llama2-70b. Unknown -> ModelError.
  static LlamaConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
  // Parses HF config.json content. Required keys: vocab_size, hidden_size, intermediate_size,
  // num_hidden_layers, num_attention_heads, max_position_embeddings, rms_norm_eps. Optional (HF
  // defaults): num_key_value_heads, rope_theta, tie_word_embeddings, torch_dtype, bos/eos ids.
  // Unknown keys are ignored; unsupported features (rope_scaling, attention_bias, other model
  // types/activations) are errors. `source_name` (usually the file path) prefixes every message.
  static LlamaConfig from_json(const nlohmann::json& j, const std::string& source_name);
  static LlamaConfig load(const std::string& config_json_path);
  nlohmann::json to_json() const;  // HF keys, incl. architectures and model_type

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t num_parameters() const;  // exact count, lm_head excluded when tied
  // Training FLOPs per token for MFU, the PaLM / torchtitan count: 6 (forward 2 + backward 4 per
  // multiply-add) x the weights every token is multiplied by (q, k, v, o, gate, up, down, lm_head;
  // not the embedding, a lookup, nor the norms) + 12 x layers x hidden x seq_len (attention scores
  // and their use on the values, causal mask not discounted).
  double train_flops_per_token(int64_t seq_len) const;
  // Throws ModelError when sizes are non-positive or inconsistent (heads divide hidden, kv heads
  // divide heads, even head_dim, ...). `source_name` prefixes the message.
  void validate(const std::string& source_name = "config") const;

  bool operator==(const LlamaConfig& o) const { return to_json() == o.to_json(); }
};

}  // namespace tessera::model
