#include "model/config.h"

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "model/errors.h"
#include "util/json.h"

namespace tessera::model {

namespace {

// Preset table. The Llama 2 rows are the published dimensions; tiny/small are test/demo sizes
// whose vocabularies cover the byte-level fallback tokenizer (ids 0..255, BOS 256, EOS 257).
LlamaConfig make(int64_t vocab, int64_t hidden, int64_t inter, int64_t layers, int64_t heads,
                 int64_t kv_heads, int64_t max_pos, int64_t bos, int64_t eos, const char* dtype) {
  LlamaConfig c;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.max_position_embeddings = max_pos;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = false;
  c.torch_dtype = dtype;
  c.bos_token_id = bos;
  c.eos_token_id = eos;
  return c;
}

const std::map<std::string, LlamaConfig>& presets() {
  static const std::map<std::string, LlamaConfig> table = {
      // 445,056 parameters; 2 KV heads for 4 query heads so GQA is exercised everywhere.
      {"tiny", make(320, 128, 344, 2, 4, 2, 512, 256, 257, "float32")},
      // ~22.7M parameters; vocab 32000 fits both the Llama tokenizer and the byte-level one.
      {"small", make(32000, 256, 688, 8, 8, 8, 1024, 1, 2, "float32")},
      {"llama2-7b", make(32000, 4096, 11008, 32, 32, 32, 4096, 1, 2, "float16")},
      {"llama2-13b", make(32000, 5120, 13824, 40, 40, 40, 4096, 1, 2, "float16")},
      {"llama2-70b", make(32000, 8192, 28672, 80, 64, 8, 4096, 1, 2, "float16")},
  };
  return table;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Typed accessors that name the source and key in every error.
const nlohmann::json* find(const nlohmann::json& j, const std::string& key) {
  auto it = j.find(key);
  return (it == j.end() || it->is_null()) ? nullptr : &*it;
}

int64_t get_int(const nlohmann::json& j, const std::string& key, const std::string& src,
                const int64_t* fallback) {
  const nlohmann::json* v = find(j, key);
  if (!v) {
    if (fallback) return *fallback;
    throw ModelError(src + ": missing required key '" + key + "'");
  }
  if (!v->is_number_integer())
    throw ModelError(src + ": key '" + key + "' must be an integer, got " + v->dump());
  return v->get<int64_t>();
}

double get_double(const nlohmann::json& j, const std::string& key, const std::string& src,
                  const double* fallback) {
  const nlohmann::json* v = find(j, key);
  if (!v) {
    if (fallback) return *fallback;
    throw ModelError(src + ": missing required key '" + key + "'");
  }
  if (!v->is_number()) throw ModelError(src + ": key '" + key + "' must be a number, got " + v->dump());
  return v->get<double>();
}

}  // namespace

std::vector<std::string> LlamaConfig::preset_names() {
  // Listed in size order rather than map order.
  return {"tiny", "small", "llama2-7b", "llama2-13b", "llama2-70b"};
}

LlamaConfig LlamaConfig::preset(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end())
    throw ModelError("unknown model preset '" + name + "' (valid: " + join(preset_names()) + ")");
  return it->second;
}

LlamaConfig LlamaConfig::from_json(const nlohmann::json& j, const std::string& src) {
  if (!j.is_object()) throw ModelError(src + ": expected a JSON object");
  if (const auto* mt = find(j, "model_type"); mt && (!mt->is_string() || mt->get<std::string>() != "llama"))
    throw ModelError(src + ": model_type " + mt->dump() + " is not supported (expected \"llama\")");
  if (const auto* act = find(j, "hidden_act"); act && (!act->is_string() || act->get<std::string>() != "silu"))
    throw ModelError(src + ": hidden_act " + act->dump() + " is not supported (expected \"silu\")");
  if (const auto* rs = find(j, "rope_scaling"))
    throw ModelError(src + ": rope_scaling " + rs->dump() + " is not supported");
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (const auto* b = find(j, key); b && (!b->is_boolean() || b->get<bool>()))
      throw ModelError(src + ": " + key + " " + b->dump() + " is not supported (Llama 2 has no biases)");

  LlamaConfig c;
  c.vocab_size = get_int(j, "vocab_size", src, nullptr);
  c.hidden_size = get_int(j, "hidden_size", src, nullptr);
  c.intermediate_size = get_int(j, "intermediate_size", src, nullptr);
  c.num_hidden_layers = get_int(j, "num_hidden_layers", src, nullptr);
  c.num_attention_heads = get_int(j, "num_attention_heads", src, nullptr);
  c.num_key_value_heads = get_int(j, "num_key_value_heads", src, &c.num_attention_heads);
  c.max_position_embeddings = get_int(j, "max_position_embeddings", src, nullptr);
  c.rms_norm_eps = get_double(j, "rms_norm_eps", src, nullptr);
  const double theta = 10000.0;
  c.rope_theta = get_double(j, "rope_theta", src, &theta);
  const int64_t bos = 1, eos = 2;
  c.bos_token_id = get_int(j, "bos_token_id", src, &bos);
  c.eos_token_id = get_int(j, "eos_token_id", src, &eos);
  if (const auto* t = find(j, "tie_word_embeddings")) {
    if (!t->is_boolean()) throw ModelError(src + ": key 'tie_word_embeddings' must be a boolean, got " + t->dump());
    c.tie_word_embeddings = t->get<bool>();
  }
  if (const auto* d = find(j, "torch_dtype")) {
    if (!d->is_string()) throw ModelError(src + ": key 'torch_dtype' must be a string, got " + d->dump());
    c.torch_dtype = d->get<std::string>();
  }
  c.validate(src);
  return c;
}

LlamaConfig LlamaConfig::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ModelError(path + ": cannot open config file");
  nlohmann::json j;
  try {
    j = util::parse_json(std::string(std::istreambuf_iterator<char>(in), {}));
  } catch (const nlohmann::json::exception& e) {
    throw ModelError(path + ": invalid JSON: " + e.what());
  }
  return from_json(j, path);
}

nlohmann::json LlamaConfig::to_json() const {
  return {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"max_position_embeddings", max_position_embeddings},
      {"rms_norm_eps", rms_norm_eps},
      {"rope_theta", rope_theta},
      {"rope_scaling", nullptr},
      {"tie_word_embeddings", tie_word_embeddings},
      {"torch_dtype", torch_dtype},
      {"bos_token_id", bos_token_id},
      {"eos_token_id", eos_token_id},
      {"initializer_range", 0.02},
      {"use_cache", true},
  };
}

int64_t LlamaConfig::num_parameters() const {
  const int64_t h = hidden_size, kv = num_key_value_heads * head_dim();
  const int64_t attention = h * h /*q*/ + 2 * h * kv /*k,v*/ + h * h /*o*/;
  const int64_t mlp = 3 * h * intermediate_size;
  const int64_t per_layer = attention + mlp + 2 * h /*two RMSNorm weights*/;
  const int64_t embeddings = vocab_size * h * (tie_word_embeddings ? 1 : 2);
  return embeddings + num_hidden_layers * per_layer + h /*final norm*/;
}

double LlamaConfig::train_flops_per_token(int64_t seq_len) const {
  const int64_t h = hidden_size, kv = num_key_value_heads * head_dim();
  const int64_t per_layer = 2 * h * h /*q, o*/ + 2 * h * kv /*k, v*/ + 3 * h * intermediate_size;
  const double matmul_weights = double(num_hidden_layers) * per_layer + double(vocab_size) * h /*lm_head*/;
  return 6.0 * matmul_weights + 12.0 * double(num_hidden_layers) * h * seq_len;
}

void LlamaConfig::validate(const std::string& src) const {
  auto positive = [&](const char* key, int64_t v) {
    if (v <= 0) throw ModelError(src + ": '" + key + "' must be positive, got " + std::to_string(v));
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("max_position_embeddings", max_position_embeddings);
  if (hidden_size % num_attention_heads != 0)
    throw ModelError(src + ": hidden_size " + std::to_string(hidden_size) +
                     " is not divisible by num_attention_heads " + std::to_string(num_attention_heads));
  if (num_attention_heads % num_key_value_heads != 0)
    throw ModelError(src + ": num_attention_heads " + std::to_string(num_attention_heads) +
                     " is not divisible by num_key_value_heads " + std::to_string(num_key_value_heads));
  if (head_dim() % 2 != 0)
    throw ModelError(src + ": head dimension " + std::to_string(head_dim()) + " must be even for rotary embeddings");
  if (!(rms_norm_eps > 0)) throw ModelError(src + ": 'rms_norm_eps' must be positive");
  if (!(rope_theta > 0)) throw ModelError(src + ": 'rope_theta' must be positive");
  if (torch_dtype != "float32" && torch_dtype != "bfloat16" && torch_dtype != "float16")
    throw ModelError(src + ": torch_dtype '" + torch_dtype + "' is not supported (float32, bfloat16, float16)");
  // Found by fuzzing model directories (tests/fuzz): sizes whose tensors overflow int64 made LibTorch
  // throw "Storage size calculation overflowed" instead of naming the keys, and 10^9 layers hung
  // building the meta-device model. Both limits are far beyond any Llama (405B: 126 layers, 2^39
  // parameters). The count is num_parameters()'s, in double so that it cannot overflow.
  if (num_hidden_layers > 1024)
    throw ModelError(src + ": 'num_hidden_layers' " + std::to_string(num_hidden_layers) + " is more than 1024");
  const double h = double(hidden_size);
  const double params = double(vocab_size) * h * 2 +
                        double(num_hidden_layers) * (4 * h * h + 3 * h * double(intermediate_size) + 2 * h) + h;
  if (params > 0x1p50) {
    char count[32];
    std::snprintf(count, sizeof count, "%.3g", params);
    throw ModelError(src + ": vocab_size, hidden_size, intermediate_size and num_hidden_layers describe " + count +
                     " parameters, more than 2^50");
  }
}

}  // namespace tessera::model
