// A decoder-only causal LM's hyper-parameters, read from / written to a Hugging Face config.json,
// plus the built-in presets. One struct serves every registered family (model/registry.h): Llama 2,
// Llama 3.x, Mistral and Qwen2 / 2.5 / 3 share the decoder and differ only in values (RoPE scaling,
// sliding window, tied embeddings, attention biases, q/k norms, head_dim). Which family a config belongs to is `model_type`, the config.json key; the
// family's ModelSpec parses, validates and writes it. Plain arithmetic: no tensors, no files opened
// except by load().
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::model {

class ModelSpec;

// config.json "rope_scaling". type "" = none (null, or rope_type "default"); "llama3" = Meta's
// Llama 3.1 frequency scaling (ops::rope_inv_freq has the formula). Other types are refused.
struct RopeScaling {
  std::string type;
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
  bool operator==(const RopeScaling& o) const {
    return type == o.type && factor == o.factor && low_freq_factor == o.low_freq_factor &&
           high_freq_factor == o.high_freq_factor &&
           original_max_position_embeddings == o.original_max_position_embeddings;
  }
};

struct ModelConfig {
  std::string model_type = "llama";  // config.json model_type: selects the family (registry.h)
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // < num_attention_heads means grouped-query attention
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  // > 0: sliding-window causal attention, each position attends to itself and the
  // sliding_window - 1 positions before it (Hugging Face's Mistral mask); 0: plain causal.
  int64_t sliding_window = 0;
  bool tie_word_embeddings = false;  // the head multiplies by the embedding matrix; no lm_head tensor
  // config.json head_dim when it is not hidden_size / num_attention_heads (Qwen3: 128 at hidden 1024
  // and 16 heads); 0: hidden_size / num_attention_heads. Read head_dim(), not this.
  int64_t explicit_head_dim = 0;
  // Biases on the q, k and v projections (Qwen2 / 2.5 always; attention_bias true in Qwen3) and on
  // o_proj (attention_bias true in Qwen3; never in Qwen2).
  bool qkv_bias = false, o_bias = false;
  // Qwen3: an RMSNorm over head_dim (weights self_attn.q_norm / k_norm [head_dim]) on every query
  // and key head, after the projection and before RoPE.
  bool qk_norm = false;
  std::string torch_dtype = "float32";  // "float32" | "bfloat16" | "float16" (storage dtype hint)
  int64_t bos_token_id = 1;
  std::vector<int64_t> eos_token_ids = {2};  // config.json eos_token_id: one id or a list (Llama 3.1 Instruct)

  // ---- Registry dispatch (model/registry.h) --------------------------------------------------
  // Every family's presets by name. Unknown -> ModelError listing the valid names.
  static ModelConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();  // registry order, each family's in size order
  // Parses HF config.json content with the family of its model_type (absent: "llama"). Unknown
  // keys are ignored; unsupported values (model_type, rope_scaling type, biases, activation) are
  // ModelErrors "<source_name>: <key> ...": the source (usually the file path) names the file.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source_name);
  static ModelConfig load(const std::string& config_json_path);
  nlohmann::json to_json() const;  // the family's config.json (architectures, model_type, ...)
  const ModelSpec& spec() const;   // the family; ModelError for an unregistered model_type

  int64_t head_dim() const { return explicit_head_dim > 0 ? explicit_head_dim : hidden_size / num_attention_heads; }
  int64_t num_parameters() const;  // exact: the sum over unit_specs (lm_head absent when tied)
  double train_flops_per_token(int64_t seq_len) const;  // spec().train_flops_per_token
  // Generic checks (positive sizes, heads divide hidden unless head_dim is explicit, kv heads divide
  // heads, even head_dim, dtype), then the family's (ModelSpec::validate). ModelError prefixed by `source_name`.
  void validate(const std::string& source_name = "config") const;

  bool operator==(const ModelConfig& o) const { return to_json() == o.to_json(); }
};

// ---- For family implementations (model/<family>.cpp) -------------------------------------------
// A config of these sizes: rms_norm_eps 1e-5, rope_theta 10000, untied, no RoPE scaling, no window.
ModelConfig sized_config(const std::string& model_type, int64_t vocab, int64_t hidden, int64_t intermediate,
                         int64_t layers, int64_t heads, int64_t kv_heads, int64_t max_positions, int64_t bos,
                         int64_t eos, const std::string& torch_dtype);
// The keys every registered family shares (sizes, norms, rope_theta (rope_keys), tied embeddings, dtype,
// bos/eos ids, attention_bias into qkv_bias and o_bias, head_dim into explicit_head_dim when it is
// not hidden_size / num_attention_heads; hidden_act must be silu, mlp_bias false). model_type,
// rope_scaling and sliding_window are left to the family, and so is refusing attention_bias or
// head_dim where the family has no such thing. Does not validate.
ModelConfig read_common_keys(const nlohmann::json& j, const std::string& source_name);
// For a family whose attention is Llama's: ModelError "<source>: attention_bias true is not supported
// ..." (or the q/k norms, or a head_dim other than hidden / heads) when the config has them.
void refuse_attention_extras(const ModelConfig& c, const std::string& source_name);
// The shared keys as config.json content (the inverse of read_common_keys).
nlohmann::json common_keys_json(const ModelConfig& c);
// j[key] unless absent or null.
const nlohmann::json* config_key(const nlohmann::json& j, const std::string& key);
// RoPE as config.json gives it: transformers >= 5 writes rope_parameters {"rope_theta", "rope_type",
// the scaling's keys} (rope_type absent: default); earlier versions a top-level rope_theta and
// rope_scaling {"rope_type" (older files: "type"), ...} (null: none). Both shapes read the same; a
// file with both must agree (rope_theta, rope_type), and rope_parameters per layer type (Gemma 3's
// {"full_attention": {...}, ...}) is refused. ModelError naming the file and the key.
struct RopeKeys {
  double theta = 10000.0;                    // rope_parameters.rope_theta, else rope_theta, else 10000
  const nlohmann::json* scaling = nullptr;   // the object holding the scaling's keys; nullptr: none
  std::string key;                           // its name in messages: "rope_parameters" or "rope_scaling"
  std::string type;                          // its rope_type; "" for none and for "default"
  std::string type_key;                      // "rope_parameters.rope_type", "rope_scaling.type", ...
};
RopeKeys rope_keys(const nlohmann::json& j, const std::string& source_name);
// ModelError "<source>: <type_key> \"<type>\" is not supported for model_type \"<model_type>\"
// (supported: <supported>)" when `r` has a rope_type that is not in `supported` (besides default).
void refuse_rope_type(const RopeKeys& r, const std::string& source_name, const std::string& model_type,
                      const std::vector<std::string>& supported = {});
// An integer key; `fallback` when absent/null (null fallback: ModelError "missing required key").
int64_t config_int(const nlohmann::json& j, const std::string& key, const std::string& source_name,
                   const int64_t* fallback);
double config_number(const nlohmann::json& j, const std::string& key, const std::string& source_name,
                     const double* fallback);

}  // namespace tessera::model
