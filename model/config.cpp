#include "model/config.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "model/errors.h"
#include "model/registry.h"
#include "util/json.h"

namespace tessera::model {

namespace {
std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}
}  // namespace

// ------------------------------------------------------------------------------------------------
// Typed accessors that name the source and key in every error.
// ------------------------------------------------------------------------------------------------

const nlohmann::json* config_key(const nlohmann::json& j, const std::string& key) {
  auto it = j.find(key);
  return (it == j.end() || it->is_null()) ? nullptr : &*it;
}

int64_t config_int(const nlohmann::json& j, const std::string& key, const std::string& src, const int64_t* fallback) {
  const nlohmann::json* v = config_key(j, key);
  if (!v) {
    if (fallback) return *fallback;
    throw ModelError(src + ": missing required key '" + key + "'");
  }
  if (!v->is_number_integer())
    throw ModelError(src + ": key '" + key + "' must be an integer, got " + v->dump());
  return v->get<int64_t>();
}

double config_number(const nlohmann::json& j, const std::string& key, const std::string& src, const double* fallback) {
  const nlohmann::json* v = config_key(j, key);
  if (!v) {
    if (fallback) return *fallback;
    throw ModelError(src + ": missing required key '" + key + "'");
  }
  if (!v->is_number()) throw ModelError(src + ": key '" + key + "' must be a number, got " + v->dump());
  return v->get<double>();
}

namespace {
// The rope_type of a rope_parameters / rope_scaling object (`key`), "" for default; `absent`: what a
// missing rope_type means ("default", or "" to refuse it).
std::string read_rope_type(const nlohmann::json& o, const std::string& key, const std::string& src,
                           const char* absent, std::string* type_key) {
  const nlohmann::json* type = config_key(o, "rope_type");  // Hugging Face reads "rope_type", and "type" in older files
  *type_key = key + ".rope_type";
  if (!type && (type = config_key(o, "type"))) *type_key = key + ".type";
  if (!type && !*absent) throw ModelError(src + ": " + key + " has no 'rope_type'");
  if (type && !type->is_string()) throw ModelError(src + ": " + *type_key + " " + type->dump() + " must be a string");
  const std::string t = type ? type->get<std::string>() : absent;
  return t == "default" ? "" : t;
}
}  // namespace

RopeKeys rope_keys(const nlohmann::json& j, const std::string& src) {
  RopeKeys r;
  const nlohmann::json* params = config_key(j, "rope_parameters");  // transformers >= 5
  const nlohmann::json* legacy = config_key(j, "rope_scaling");
  const double fallback = 10000.0;
  r.theta = config_number(j, "rope_theta", src, &fallback);
  if (legacy && !legacy->is_object())
    throw ModelError(src + ": rope_scaling " + legacy->dump() + " must be an object or null");
  if (legacy) r.type = read_rope_type(*legacy, "rope_scaling", src, "", &r.type_key), r.scaling = legacy, r.key = "rope_scaling";
  if (!params) return r;
  if (!params->is_object()) throw ModelError(src + ": rope_parameters " + params->dump() + " must be an object or null");
  for (const auto& [k, v] : params->items())
    if (v.is_object())
      throw ModelError(src + ": rope_parameters." + k + ": RoPE parameters per layer type are not supported (one "
                       "rope_parameters object for every layer)");
  std::string type_key;
  const std::string type = read_rope_type(*params, "rope_parameters", src, "default", &type_key);
  if (legacy && type != r.type)
    throw ModelError(src + ": " + type_key + " and " + r.type_key + " differ: give one of rope_parameters and rope_scaling");
  const double theta = config_number(*params, "rope_theta", src + ": rope_parameters", &r.theta);
  if (config_key(j, "rope_theta") && theta != r.theta)
    throw ModelError(src + ": rope_parameters.rope_theta " + nlohmann::json(theta).dump() + " and rope_theta " +
                     nlohmann::json(r.theta).dump() + " differ: give one");
  return RopeKeys{theta, params, "rope_parameters", type, type_key};
}

void refuse_rope_type(const RopeKeys& r, const std::string& src, const std::string& model_type,
                      const std::vector<std::string>& supported) {
  if (r.type.empty() || std::find(supported.begin(), supported.end(), r.type) != supported.end()) return;
  throw ModelError(src + ": " + r.type_key + " \"" + r.type + "\" is not supported for model_type \"" + model_type +
                   "\" (supported: " + (supported.empty() ? "" : join(supported) + ", ") + "default)");
}

// ------------------------------------------------------------------------------------------------
// The keys every family shares
// ------------------------------------------------------------------------------------------------

namespace {
// The integer sizes every family's config.json holds, read and written through this one list (in
// the order they are read); the key of `fallback`, when set, is the default of an absent key.
struct SizeKey {
  const char* name;
  int64_t ModelConfig::*field;
  int64_t ModelConfig::*fallback = nullptr;
};
const SizeKey kSizeKeys[] = {
    {"vocab_size", &ModelConfig::vocab_size},
    {"hidden_size", &ModelConfig::hidden_size},
    {"intermediate_size", &ModelConfig::intermediate_size},
    {"num_hidden_layers", &ModelConfig::num_hidden_layers},
    {"num_attention_heads", &ModelConfig::num_attention_heads},
    {"num_key_value_heads", &ModelConfig::num_key_value_heads, &ModelConfig::num_attention_heads},
    {"max_position_embeddings", &ModelConfig::max_position_embeddings},
};

// Every size is at least 1: checked as soon as they are read, before anything divides by one.
void check_sizes_positive(const ModelConfig& c, const std::string& src) {
  for (const SizeKey& k : kSizeKeys)
    if (c.*k.field <= 0)
      throw ModelError(src + ": '" + k.name + "' must be positive, got " + std::to_string(c.*k.field));
}
}  // namespace

ModelConfig read_common_keys(const nlohmann::json& j, const std::string& src) {
  if (!j.is_object()) throw ModelError(src + ": expected a JSON object");
  if (const auto* act = config_key(j, "hidden_act"); act && (!act->is_string() || act->get<std::string>() != "silu"))
    throw ModelError(src + ": hidden_act " + act->dump() + " is not supported (expected \"silu\")");
  if (const auto* b = config_key(j, "mlp_bias"); b && (!b->is_boolean() || b->get<bool>()))
    throw ModelError(src + ": mlp_bias " + b->dump() + " is not supported (the MLP has no biases)");

  ModelConfig c;
  for (const SizeKey& k : kSizeKeys) c.*k.field = config_int(j, k.name, src, k.fallback ? &(c.*k.fallback) : nullptr);
  check_sizes_positive(c, src);
  c.rms_norm_eps = config_number(j, "rms_norm_eps", src, nullptr);
  c.rope_theta = rope_keys(j, src).theta;
  const int64_t bos = 1;
  c.bos_token_id = config_int(j, "bos_token_id", src, &bos);
  if (const auto* eos = config_key(j, "eos_token_id")) {
    c.eos_token_ids.clear();
    for (const auto& id : eos->is_array() ? *eos : nlohmann::json::array({*eos})) {
      if (!id.is_number_integer())
        throw ModelError(src + ": key 'eos_token_id' must be an integer or a list of integers, got " + eos->dump());
      c.eos_token_ids.push_back(id.get<int64_t>());
    }
    if (c.eos_token_ids.empty()) throw ModelError(src + ": key 'eos_token_id' is an empty list");
  }
  if (const auto* t = config_key(j, "tie_word_embeddings")) {
    if (!t->is_boolean()) throw ModelError(src + ": key 'tie_word_embeddings' must be a boolean, got " + t->dump());
    c.tie_word_embeddings = t->get<bool>();
  }
  // transformers >= 4.56 writes "dtype" (and reads it before "torch_dtype" when both are there).
  for (const char* key : {"torch_dtype", "dtype"})
    if (const auto* d = config_key(j, key)) {
      if (!d->is_string()) throw ModelError(src + ": key '" + key + "' must be a string, got " + d->dump());
      c.torch_dtype = d->get<std::string>();
    }
  if (const auto* b = config_key(j, "attention_bias")) {
    if (!b->is_boolean()) throw ModelError(src + ": key 'attention_bias' must be a boolean, got " + b->dump());
    c.qkv_bias = c.o_bias = b->get<bool>();
  }
  if (const auto* hd = config_key(j, "head_dim")) {
    if (!hd->is_number_integer() || hd->get<int64_t>() <= 0)
      throw ModelError(src + ": head_dim " + hd->dump() + " must be a positive integer");
    const int64_t heads = c.num_attention_heads;
    const bool derived = c.hidden_size % heads == 0 && hd->get<int64_t>() == c.hidden_size / heads;
    if (!derived) c.explicit_head_dim = hd->get<int64_t>();
  }
  return c;
}

ModelConfig sized_config(const std::string& model_type, int64_t vocab, int64_t hidden, int64_t intermediate,
                         int64_t layers, int64_t heads, int64_t kv_heads, int64_t max_positions, int64_t bos,
                         int64_t eos, const std::string& torch_dtype) {
  ModelConfig c;
  c.model_type = model_type;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.max_position_embeddings = max_positions;
  c.torch_dtype = torch_dtype;
  c.bos_token_id = bos;
  c.eos_token_ids = {eos};
  return c;
}

nlohmann::json common_keys_json(const ModelConfig& c) {
  nlohmann::json j = {
      {"hidden_act", "silu"},
      {"attention_bias", c.qkv_bias && c.o_bias},
      {"head_dim", c.head_dim()},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"torch_dtype", c.torch_dtype},
      {"bos_token_id", c.bos_token_id},
      {"eos_token_id", c.eos_token_ids.size() == 1 ? nlohmann::json(c.eos_token_ids[0]) : nlohmann::json(c.eos_token_ids)},
      {"initializer_range", 0.02},
      {"use_cache", true},
  };
  for (const SizeKey& k : kSizeKeys) j[k.name] = c.*k.field;
  return j;
}

// ------------------------------------------------------------------------------------------------
// Registry dispatch
// ------------------------------------------------------------------------------------------------

std::vector<std::string> ModelConfig::preset_names() {
  std::vector<std::string> names;
  for (const ModelSpec* f : model_families())
    for (const auto& p : f->presets()) names.push_back(p.name);
  return names;
}

ModelConfig ModelConfig::preset(const std::string& name) {
  for (const ModelSpec* f : model_families())
    for (const auto& p : f->presets())
      if (p.name == name) return p.config;
  throw ModelError("unknown model preset '" + name + "' (valid: " + join(preset_names()) + ")");
}

ModelConfig ModelConfig::from_json(const nlohmann::json& j, const std::string& src) {
  if (!j.is_object()) throw ModelError(src + ": expected a JSON object");
  if (const auto* q = config_key(j, "quantization_config")) {
    const std::string method = q->is_object() ? q->value("quant_method", std::string("unnamed")) : q->dump();
    throw ModelError(src + ": a quantized checkpoint (quantization_config: quant_method " + method +
                     "): Tessera fine-tunes full-precision weights (F32/BF16/F16 safetensors); use the unquantized "
                     "model's directory");
  }
  std::string type = "llama";
  if (const auto* mt = config_key(j, "model_type")) {
    if (!mt->is_string()) throw ModelError(src + ": model_type " + mt->dump() + " must be a string");
    type = mt->get<std::string>();
  }
  return family_for(type, src).from_json(j, src);
}

ModelConfig ModelConfig::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ModelError(path + ": cannot open config file");
  nlohmann::json j;
  try {
    j = util::parse_json(in);
  } catch (const nlohmann::json::exception& e) {
    throw ModelError(path + ": invalid JSON: " + e.what());
  }
  return from_json(j, path);
}

const ModelSpec& ModelConfig::spec() const { return family_for(model_type, "model config"); }

nlohmann::json ModelConfig::to_json() const { return spec().to_json(*this); }

int64_t ModelConfig::num_parameters() const {
  int64_t n = 0;
  for (const auto& u : spec().unit_specs(*this)) n += u.numel();
  return n;
}

double ModelConfig::train_flops_per_token(int64_t seq_len) const { return spec().train_flops_per_token(*this, seq_len); }

void refuse_attention_extras(const ModelConfig& c, const std::string& src) {
  if (c.qkv_bias || c.o_bias)
    throw ModelError(src + ": attention_bias true is not supported for model_type \"" + c.model_type +
                     "\" (its attention has no biases; Qwen2 and Qwen3 have them)");
  if (c.qk_norm) throw ModelError(src + ": q/k norms are not part of model_type \"" + c.model_type + "\"");
  if (c.explicit_head_dim > 0)
    throw ModelError(src + ": head_dim " + std::to_string(c.explicit_head_dim) + " is not supported for model_type \"" +
                     c.model_type + "\" (only hidden_size / num_attention_heads = " +
                     std::to_string(c.hidden_size / c.num_attention_heads) + "; Qwen3 sets it apart)");
}

void ModelConfig::validate(const std::string& src) const {
  check_sizes_positive(*this, src);
  if (explicit_head_dim < 0) throw ModelError(src + ": 'head_dim' must be positive");
  if (explicit_head_dim == 0 && hidden_size % num_attention_heads != 0)
    throw ModelError(src + ": hidden_size " + std::to_string(hidden_size) +
                     " is not divisible by num_attention_heads " + std::to_string(num_attention_heads));
  if (num_attention_heads % num_key_value_heads != 0)
    throw ModelError(src + ": num_attention_heads " + std::to_string(num_attention_heads) +
                     " is not divisible by num_key_value_heads " + std::to_string(num_key_value_heads));
  if (head_dim() % 2 != 0)
    throw ModelError(src + ": head dimension " + std::to_string(head_dim()) + " must be even for rotary embeddings");
  if (!(rms_norm_eps > 0)) throw ModelError(src + ": 'rms_norm_eps' must be positive");
  if (!(rope_theta > 0)) throw ModelError(src + ": 'rope_theta' must be positive");
  if (sliding_window < 0) throw ModelError(src + ": 'sliding_window' must be positive or null");
  if (torch_dtype != "float32" && torch_dtype != "bfloat16" && torch_dtype != "float16")
    throw ModelError(src + ": torch_dtype '" + torch_dtype + "' is not supported (float32, bfloat16, float16)");
  spec().validate(*this, src);
  // Found by fuzzing model directories (tests/fuzz): sizes whose tensors overflow int64 made LibTorch
  // throw "Storage size calculation overflowed" instead of naming the keys, and 10^9 layers hung
  // building the meta-device model. Both limits are far beyond any Llama (405B: 126 layers, 2^39
  // parameters). The count is num_parameters()'s, in double so that it cannot overflow.
  if (num_hidden_layers > 1024)
    throw ModelError(src + ": 'num_hidden_layers' " + std::to_string(num_hidden_layers) + " is more than 1024");
  const double h = double(hidden_size), attn = 2.0 * (num_attention_heads + num_key_value_heads) * head_dim();
  const double params = double(vocab_size) * h * 2 +
                        double(num_hidden_layers) * (attn * h + 3 * h * double(intermediate_size) + 2 * h) + h;
  if (params > 0x1p50) {
    char count[32];
    std::snprintf(count, sizeof count, "%.3g", params);
    throw ModelError(src + ": vocab_size, hidden_size, intermediate_size, num_hidden_layers and the heads describe " + count +
                     " parameters, more than 2^50");
  }
}

}  // namespace tessera::model
