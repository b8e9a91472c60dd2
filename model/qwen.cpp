// The Qwen families, both the Llama decoder with rope_theta 1e6 and, at the small sizes, a tied head:
// - "qwen2" (config.json model_type qwen2, Qwen2ForCausalLM): Qwen2 and Qwen2.5. Biases on the q, k
//   and v projections, not on o_proj, always (Hugging Face's Qwen2Attention hard-codes them; the
//   config has no key for them).
// - "qwen3" (model_type qwen3, Qwen3ForCausalLM): no biases unless attention_bias is true (then on
//   q, k, v and o, as Qwen3Attention); an RMSNorm over head_dim (self_attn.q_norm / k_norm) on every
//   query and key head after the projection and before RoPE; head_dim from config.json (128 at every
//   size, so 2048 query features at hidden 1024 in Qwen3-0.6B).
// Sliding-window attention (use_sliding_window true, or a layer_types entry other than
// full_attention) and rope_scaling / rope_parameters other than default (YaRN for long contexts) are
// refused by key; with use_sliding_window false, sliding_window is ignored, as Hugging Face does.
#include "model/errors.h"
#include "model/llama.h"

namespace tessera::model {

namespace {

// One Qwen size: bf16, rms_norm_eps 1e-6, rope_theta 1e6, <|endoftext|> as BOS (and as EOS for
// Qwen2.5's base models; Qwen3's is <|im_end|>). head_dim 0: hidden / heads.
struct QwenShape {
  int64_t vocab, hidden, inter, layers, heads, kv_heads, head_dim, max_pos, eos;
  bool tied;
};

ModelConfig qwen_config(const std::string& model_type, const QwenShape& s) {
  ModelConfig c = sized_config(model_type, s.vocab, s.hidden, s.inter, s.layers, s.heads, s.kv_heads, s.max_pos,
                               151643, s.eos, "bfloat16");
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.tie_word_embeddings = s.tied;
  if (s.head_dim * s.heads != s.hidden) c.explicit_head_dim = s.head_dim;
  c.qkv_bias = model_type == "qwen2";
  c.qk_norm = model_type == "qwen3";
  return c;
}

// tiny's sizes with byte-tokenizer ids (BOS 256, EOS 257), fp32: what the tests train.
ModelConfig tiny_qwen(const std::string& model_type, int64_t head_dim, bool tied) {
  ModelConfig c = qwen_config(model_type, {320, 128, 344, 2, 4, 2, head_dim, 512, 257, tied});
  c.bos_token_id = 256;
  c.torch_dtype = "float32";
  return c;
}

// use_sliding_window true, or layer_types naming anything but full_attention (transformers >= 4.53).
void refuse_sliding_window(const nlohmann::json& j, const std::string& src) {
  if (const auto* u = config_key(j, "use_sliding_window"); u && (!u->is_boolean() || u->get<bool>()))
    throw ModelError(src + ": use_sliding_window " + u->dump() +
                     " is not supported (Tessera's Qwen attends to every earlier position; Qwen's released "
                     "configs set it false)");
  if (const auto* types = config_key(j, "layer_types")) {
    if (!types->is_array()) throw ModelError(src + ": layer_types " + types->dump() + " must be a list");
    for (const auto& t : *types)
      if (!t.is_string() || t.get<std::string>() != "full_attention")
        throw ModelError(src + ": layer_types entry " + t.dump() + " is not supported (only full_attention)");
  }
}

class QwenFamily final : public LlamaArchitecture {
 public:
  explicit QwenFamily(bool qwen3) : qwen3_(qwen3) {}
  std::string family() const override { return qwen3_ ? "qwen3" : "qwen2"; }
  std::vector<std::string> model_types() const override { return {family()}; }

  std::vector<Preset> presets() const override {
    if (!qwen3_)
      return {
          // Untied, q/k/v biases, GQA.
          {"tiny-qwen2", tiny_qwen("qwen2", 32, false)},
          // Qwen2.5-0.5B (494,032,768 parameters, tied), 7B (7,615,616,512), 72B (72,706,203,648).
          {"qwen2.5-0.5b", qwen_config("qwen2", {151936, 896, 4864, 24, 14, 2, 64, 32768, 151643, true})},
          {"qwen2.5-7b", qwen_config("qwen2", {152064, 3584, 18944, 28, 28, 4, 128, 131072, 151643, false})},
          {"qwen2.5-72b", qwen_config("qwen2", {152064, 8192, 29568, 80, 64, 8, 128, 131072, 151643, false})},
      };
    return {
        // Tied, q/k norms, head_dim 48 apart from hidden / heads = 32.
        {"tiny-qwen3", tiny_qwen("qwen3", 48, true)},
        // Qwen3-0.6B (596,049,920 parameters, tied), 8B (8,190,735,360), 32B (32,762,123,264).
        {"qwen3-0.6b", qwen_config("qwen3", {151936, 1024, 3072, 28, 16, 8, 128, 40960, 151645, true})},
        {"qwen3-8b", qwen_config("qwen3", {151936, 4096, 12288, 36, 32, 8, 128, 40960, 151645, false})},
        {"qwen3-32b", qwen_config("qwen3", {151936, 5120, 25600, 64, 64, 8, 128, 40960, 151645, false})},
    };
  }

  // What model_type implies (a config built in code must agree), then what Tessera leaves out.
  void validate(const ModelConfig& c, const std::string& src) const override {
    const std::string type = "model_type \"" + family() + "\"";
    if (!qwen3_ && (!c.qkv_bias || c.o_bias || c.qk_norm))
      throw ModelError(src + ": " + type + " has biases on q, k and v only, and no q/k norms");
    if (qwen3_ && (!c.qk_norm || c.qkv_bias != c.o_bias))
      throw ModelError(src + ": " + type + " has q/k norms, and attention_bias on q, k, v and o together");
    if (c.sliding_window != 0) throw ModelError(src + ": use_sliding_window is not supported for " + type);
    if (!c.rope_scaling.type.empty())
      throw ModelError(src + ": rope_scaling type \"" + c.rope_scaling.type + "\" is not supported for " + type);
  }

 protected:
  std::string architecture() const override { return qwen3_ ? "Qwen3ForCausalLM" : "Qwen2ForCausalLM"; }
  void read_family_keys(const nlohmann::json& j, const std::string& src, ModelConfig& c) const override {
    refuse_rope_type(rope_keys(j, src), src, family());  // rope_scaling / rope_parameters: default only
    refuse_sliding_window(j, src);
    if (!qwen3_) {  // Qwen2Attention's, whatever attention_bias says
      c.qkv_bias = true;
      c.o_bias = false;
    }
    c.qk_norm = qwen3_;
  }
  void write_family_keys(const ModelConfig& c, nlohmann::json& j) const override {
    if (!qwen3_) j.erase("attention_bias");  // not a Qwen2 key: its biases are fixed
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_hidden_layers;
    j["rope_scaling"] = nullptr;
  }

 private:
  bool qwen3_;
};

}  // namespace

const ModelSpec& qwen2_family() {
  static const QwenFamily family(/*qwen3=*/false);
  return family;
}

const ModelSpec& qwen3_family() {
  static const QwenFamily family(/*qwen3=*/true);
  return family;
}

}  // namespace tessera::model
