// The "llama" family (config.json model_type "llama", LlamaForCausalLM): Llama 2 and Llama 3 / 3.1 /
// 3.2 / 3.3. Llama 3.x differs from Llama 2 only in values: rope_theta 500000, GQA at every size,
// vocab 128256, rope_scaling of type llama3 (3.1 and later) and tied embeddings (3.2 1B / 3B).
#include "model/errors.h"
#include "model/llama.h"

namespace tessera::model {

namespace {

ModelConfig make(int64_t vocab, int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t kv_heads,
                 int64_t max_pos, int64_t bos, int64_t eos, const char* dtype) {
  return sized_config("llama", vocab, hidden, inter, layers, heads, kv_heads, max_pos, bos, eos, dtype);
}

// Llama 3.x: theta 500000, <|begin_of_text|> / <|end_of_text|>, bf16; `factor` > 0 adds the
// rope_scaling of 3.1 and later (low 1, high 4, original context 8192).
ModelConfig llama3(int64_t vocab, int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t kv_heads,
                   int64_t max_pos, double factor, bool tied) {
  ModelConfig c = make(vocab, hidden, inter, layers, heads, kv_heads, max_pos, 128000, 128001, "bfloat16");
  c.rope_theta = 500000.0;
  if (factor > 0) c.rope_scaling = {"llama3", factor, 1.0, 4.0, 8192};
  c.tie_word_embeddings = tied;
  return c;
}

// rope_scaling (transformers < 5) or rope_parameters (>= 5): none, default or llama3.
RopeScaling parse_rope_scaling(const nlohmann::json& j, const std::string& src) {
  const RopeKeys r = rope_keys(j, src);
  refuse_rope_type(r, src, "llama", {"llama3"});
  if (r.type.empty()) return {};
  const std::string where = src + ": " + r.key;
  RopeScaling s;
  s.type = "llama3";
  s.factor = config_number(*r.scaling, "factor", where, nullptr);
  s.low_freq_factor = config_number(*r.scaling, "low_freq_factor", where, nullptr);
  s.high_freq_factor = config_number(*r.scaling, "high_freq_factor", where, nullptr);
  s.original_max_position_embeddings = config_int(*r.scaling, "original_max_position_embeddings", where, nullptr);
  return s;
}

class LlamaFamily final : public LlamaArchitecture {
 public:
  std::string family() const override { return "llama"; }
  std::vector<std::string> model_types() const override { return {"llama"}; }

  std::vector<Preset> presets() const override {
    ModelConfig tiny_llama3 = llama3(320, 128, 344, 2, 4, 2, 512, 0, /*tied=*/true);
    // Byte-tokenizer ids, and an original context of 64 so that at head_dim 32 every regime of
    // the llama3 scaling (kept, interpolated, divided) occurs.
    tiny_llama3.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 64};
    tiny_llama3.bos_token_id = 256;
    tiny_llama3.eos_token_ids = {257};
    tiny_llama3.torch_dtype = "float32";
    return {
        // 445,056 parameters; 2 KV heads for 4 query heads so GQA is exercised everywhere; the
        // vocabulary covers the byte-level tokenizer (ids 0..255, BOS 256, EOS 257).
        {"tiny", make(320, 128, 344, 2, 4, 2, 512, 256, 257, "float32")},
        // ~22.7M parameters; vocab 32000 fits both the Llama 2 tokenizer and the byte-level one.
        {"small", make(32000, 256, 688, 8, 8, 8, 1024, 1, 2, "float32")},
        {"llama2-7b", make(32000, 4096, 11008, 32, 32, 32, 4096, 1, 2, "float16")},
        {"llama2-13b", make(32000, 5120, 13824, 40, 40, 40, 4096, 1, 2, "float16")},
        {"llama2-70b", make(32000, 8192, 28672, 80, 64, 8, 4096, 1, 2, "float16")},
        // tiny's sizes with every Llama 3.x feature: tied embeddings, llama3 RoPE scaling, GQA.
        {"tiny-llama3", tiny_llama3},
        // Llama 3.2 1B (1,235,814,400 parameters, tied); 3.1 8B and 70B (= 3.3 70B; the same
        // tensors as Llama 3 8B / 70B, whose config has no rope_scaling and 8192 positions).
        {"llama3.2-1b", llama3(128256, 2048, 8192, 16, 32, 8, 131072, 32.0, /*tied=*/true)},
        {"llama3-8b", llama3(128256, 4096, 14336, 32, 32, 8, 131072, 8.0, false)},
        {"llama3-70b", llama3(128256, 8192, 28672, 80, 64, 8, 131072, 8.0, false)},
    };
  }

  void validate(const ModelConfig& c, const std::string& src) const override {
    refuse_attention_extras(c, src);
    if (c.sliding_window != 0)
      throw ModelError(src + ": sliding_window is not part of model_type \"llama\" (Mistral has it)");
    const RopeScaling& s = c.rope_scaling;
    if (s.type.empty()) return;
    if (s.type != "llama3")
      throw ModelError(src + ": rope_scaling.rope_type \"" + s.type + "\" is not supported (supported: llama3, default)");
    if (!(s.factor >= 1.0)) throw ModelError(src + ": rope_scaling.factor must be >= 1");
    if (!(s.low_freq_factor > 0)) throw ModelError(src + ": rope_scaling.low_freq_factor must be positive");
    if (!(s.high_freq_factor > s.low_freq_factor))
      throw ModelError(src + ": rope_scaling.high_freq_factor must exceed low_freq_factor");
    if (s.original_max_position_embeddings <= 0)
      throw ModelError(src + ": rope_scaling.original_max_position_embeddings must be positive");
  }

 protected:
  std::string architecture() const override { return "LlamaForCausalLM"; }
  void read_family_keys(const nlohmann::json& j, const std::string& src, ModelConfig& c) const override {
    c.rope_scaling = parse_rope_scaling(j, src);
  }
  void write_family_keys(const ModelConfig& c, nlohmann::json& j) const override {
    j["mlp_bias"] = false;
    if (c.rope_scaling.type.empty()) {
      j["rope_scaling"] = nullptr;
    } else {
      j["rope_scaling"] = {{"rope_type", c.rope_scaling.type},
                           {"factor", c.rope_scaling.factor},
                           {"low_freq_factor", c.rope_scaling.low_freq_factor},
                           {"high_freq_factor", c.rope_scaling.high_freq_factor},
                           {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
    }
  }
};

}  // namespace

const ModelSpec& llama_family() {
  static const LlamaFamily family;
  return family;
}

}  // namespace tessera::model
