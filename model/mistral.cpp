// The "mistral" family (config.json model_type "mistral", MistralForCausalLM): Mistral 7B. The Llama
// decoder with GQA (8 KV heads) and, in v0.1, sliding-window attention (sliding_window 4096: each
// position attends to itself and the 4095 before it); v0.2 / v0.3 set sliding_window null (plain
// causal) and rope_theta 1e6, v0.3 a vocabulary of 32768. Tensor names are Llama's.
#include "model/errors.h"
#include "model/llama.h"

namespace tessera::model {

namespace {

class MistralFamily final : public LlamaArchitecture {
 public:
  std::string family() const override { return "mistral"; }
  std::vector<std::string> model_types() const override { return {"mistral"}; }

  std::vector<Preset> presets() const override {
    auto make = [](int64_t vocab, int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t kv_heads,
                   int64_t max_pos, int64_t window, int64_t bos, int64_t eos, const char* dtype) {
      ModelConfig c = sized_config("mistral", vocab, hidden, inter, layers, heads, kv_heads, max_pos, bos, eos, dtype);
      c.sliding_window = window;
      return c;
    };
    return {
        // tiny's sizes, one KV head (multi-query) and a window of 32, shorter than the sequences
        // the tests train on, so the window is exercised; byte-tokenizer ids.
        {"tiny-mistral", make(320, 128, 344, 2, 4, 1, 512, 32, 256, 257, "float32")},
        // Mistral-7B-v0.1 (7,241,732,096 parameters).
        {"mistral-7b", make(32000, 4096, 14336, 32, 32, 8, 32768, 4096, 1, 2, "bfloat16")},
    };
  }

  void validate(const ModelConfig& c, const std::string& src) const override {
    refuse_attention_extras(c, src);
    if (!c.rope_scaling.type.empty())
      throw ModelError(src + ": rope_scaling is not supported for model_type \"mistral\"");
  }

 protected:
  std::string architecture() const override { return "MistralForCausalLM"; }
  void read_family_keys(const nlohmann::json& j, const std::string& src, ModelConfig& c) const override {
    refuse_rope_type(rope_keys(j, src), src, "mistral");
    const int64_t none = 0;
    c.sliding_window = config_int(j, "sliding_window", src, &none);  // null: plain causal
    if (const auto* w = config_key(j, "sliding_window"); w && c.sliding_window <= 0)
      throw ModelError(src + ": sliding_window " + w->dump() + " must be a positive integer or null");
  }
  void write_family_keys(const ModelConfig& c, nlohmann::json& j) const override {
    j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
  }
};

}  // namespace

const ModelSpec& mistral_family() {
  static const MistralFamily family;
  return family;
}

}  // namespace tessera::model
