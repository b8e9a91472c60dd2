// ModelConfig: presets, config.json parsing (required keys, defaults, unsupported features), validation.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "model/config.h"
#include "model/errors.h"
#include "model/registry.h"
#include "tests/support/test_support.h"

namespace test_model_config {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace tessera::model;
using tessera::test::error_of;
using tessera::test::TempDir;

namespace {
nlohmann::json llama7b_hf_config() {
  // The config.json shipped with meta-llama/Llama-2-7b-hf (plus an unknown key).
  return nlohmann::json::parse(R"({
    "_name_or_path": "meta-llama/Llama-2-7b-hf", "architectures": ["LlamaForCausalLM"],
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
    "tie_word_embeddings": false, "torch_dtype": "float16", "transformers_version": "4.31.0.dev0",
    "use_cache": true, "vocab_size": 32000, "some_future_key": {"x": 1}})");
}
}  // namespace

TEST(ModelConfig, ParsesRealHfConfigAndMatchesPreset) {
  auto c = ModelConfig::from_json(llama7b_hf_config(), "config.json");
  EXPECT_EQ(c, ModelConfig::preset("llama2-7b"));
  EXPECT_EQ(c.num_parameters(), 6738415616LL);
  EXPECT_EQ(c.head_dim(), 128);
}

TEST(ModelConfig, ToJsonRoundTripsAndHasHfKeys) {
  for (const auto& name : ModelConfig::preset_names()) {
    auto c = ModelConfig::preset(name);
    auto j = c.to_json();
    const std::map<std::string, std::string> architecture = {{"llama", "LlamaForCausalLM"}, {"mistral", "MistralForCausalLM"},
                                                             {"qwen2", "Qwen2ForCausalLM"}, {"qwen3", "Qwen3ForCausalLM"}};
    EXPECT_EQ(j["architectures"], nlohmann::json::array({architecture.at(c.model_type)})) << name;
    EXPECT_EQ(j["model_type"], c.model_type);
    EXPECT_EQ(ModelConfig::from_json(j, name), c) << name;
  }
  auto c70 = ModelConfig::preset("llama2-70b").to_json();
  EXPECT_EQ(c70["num_key_value_heads"], 8);
  EXPECT_EQ(c70["hidden_size"], 8192);
  EXPECT_EQ(c70["intermediate_size"], 28672);
}

TEST(ModelConfig, DefaultsForOptionalKeys) {
  auto j = llama7b_hf_config();
  j.erase("num_key_value_heads");
  j.erase("tie_word_embeddings");
  j["num_attention_heads"] = 16;
  auto c = ModelConfig::from_json(j, "cfg");
  EXPECT_EQ(c.num_key_value_heads, 16);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(ModelConfig, ErrorsNameSourceAndKey) {
  auto j = llama7b_hf_config();
  j.erase("hidden_size");
  EXPECT_EQ(error_of<ModelError>([&] { ModelConfig::from_json(j, "/m/config.json"); }),
            "/m/config.json: missing required key 'hidden_size'");
  j = llama7b_hf_config();
  j["vocab_size"] = "32000";
  EXPECT_NE(error_of<ModelError>([&] { ModelConfig::from_json(j, "c.json"); }).find("c.json: key 'vocab_size' must be an integer"),
            std::string::npos);
  j = llama7b_hf_config();
  j["num_key_value_heads"] = 5;
  EXPECT_NE(error_of<ModelError>([&] { ModelConfig::from_json(j, "c.json"); }).find("not divisible by num_key_value_heads 5"),
            std::string::npos);
  j = llama7b_hf_config();
  j["model_type"] = "gemma";
  EXPECT_EQ(error_of<ModelError>([&] { ModelConfig::from_json(j, "c.json"); }),
            "c.json: model_type \"gemma\" is not supported (supported: llama, mistral, qwen2, qwen3)");
  j = llama7b_hf_config();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_NE(error_of<ModelError>([&] { ModelConfig::from_json(j, "c.json"); }).find("rope_scaling"), std::string::npos);
  j = llama7b_hf_config();
  j["hidden_size"] = -4;
  EXPECT_NE(error_of<ModelError>([&] { ModelConfig::from_json(j, "c.json"); }).find("'hidden_size' must be positive"),
            std::string::npos);
  EXPECT_EQ(error_of<ModelError>([] { ModelConfig::preset("llama3"); }),
            "unknown model preset 'llama3' (valid: tiny, small, llama2-7b, llama2-13b, llama2-70b, tiny-llama3, "
            "llama3.2-1b, llama3-8b, llama3-70b, tiny-mistral, mistral-7b, tiny-qwen2, qwen2.5-0.5b, qwen2.5-7b, "
            "qwen2.5-72b, tiny-qwen3, qwen3-0.6b, qwen3-8b, qwen3-32b)");
}

// Every count is at least 1, named by its key, before anything divides by it: 0 heads with a
// head_dim said "head_dim 32 is not supported (only hidden_size / num_attention_heads = ?)" (issue 58).
TEST(ModelConfig, CountsBelowOneAreRefusedByKey) {
  auto j = llama7b_hf_config();
  j["head_dim"] = 128;
  j["num_attention_heads"] = 0;
  EXPECT_EQ(error_of<ModelError>([&] { ModelConfig::from_json(j, "/m/config.json"); }),
            "/m/config.json: 'num_attention_heads' must be positive, got 0");
  for (const char* key : {"num_hidden_layers", "hidden_size", "vocab_size", "num_key_value_heads", "intermediate_size"})
    for (int v : {0, -3}) {
      j = llama7b_hf_config();
      j[key] = v;
      EXPECT_EQ(error_of<ModelError>([&] { ModelConfig::from_json(j, "c.json"); }),
                "c.json: '" + std::string(key) + "' must be positive, got " + std::to_string(v));
    }
  j = llama7b_hf_config();
  j["num_key_value_heads"] = 64;  // more than the 32 heads: does not divide them
  EXPECT_EQ(error_of<ModelError>([&] { ModelConfig::from_json(j, "c.json"); }),
            "c.json: num_attention_heads 32 is not divisible by num_key_value_heads 64");
}

TEST(ModelConfig, LoadFromFile) {
  const TempDir dir("tessera_cfg");
  const std::string path = dir / "config.json";
  std::ofstream(path) << llama7b_hf_config().dump();
  EXPECT_EQ(ModelConfig::load(path), ModelConfig::preset("llama2-7b"));
  std::ofstream(path) << "{\"vocab_size\": 3,";
  EXPECT_NE(error_of<ModelError>([&] { ModelConfig::load(path); }).find(path + ": invalid JSON"), std::string::npos);
  EXPECT_NE(error_of<ModelError>([&] { ModelConfig::load(dir / "nope.json"); }).find("nope.json: cannot open"),
            std::string::npos);
}

// ---------------------------------------------------------------- Llama 3.x and Mistral

namespace {
// meta-llama/Llama-3.2-1B's config.json.
nlohmann::json llama32_1b_hf_config() {
  return nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})");
}
// mistralai/Mistral-7B-v0.1's config.json.
nlohmann::json mistral_v01_hf_config() {
  return nlohmann::json::parse(R"({
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "sliding_window": 4096, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000})");
}
// Qwen/Qwen2.5-7B's config.json (the base model).
nlohmann::json qwen25_7b_hf_config() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
    "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
    "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 152064})");
}
// Qwen/Qwen3-0.6B's config.json.
nlohmann::json qwen3_06b_hf_config() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
    "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936})");
}
}  // namespace

// Real Qwen config.json files read as their presets: Qwen2's q/k/v biases come with model_type (its
// config has no key for them), Qwen3's head_dim 128 is apart from hidden / heads = 64.
TEST(QwenConfig, ParsesRealConfigsAndMatchesPresets) {
  auto q2 = ModelConfig::from_json(qwen25_7b_hf_config(), "config.json");
  EXPECT_EQ(q2, ModelConfig::preset("qwen2.5-7b"));
  EXPECT_TRUE(q2.qkv_bias && !q2.o_bias && !q2.qk_norm);
  EXPECT_EQ(q2.sliding_window, 0);  // use_sliding_window false: the size is not used
  EXPECT_EQ(q2.num_parameters(), 7615616512LL);
  auto q3 = ModelConfig::from_json(qwen3_06b_hf_config(), "config.json");
  EXPECT_EQ(q3, ModelConfig::preset("qwen3-0.6b"));
  EXPECT_TRUE(!q3.qkv_bias && !q3.o_bias && q3.qk_norm && q3.tie_word_embeddings);
  EXPECT_EQ(q3.head_dim(), 128);
  EXPECT_EQ(q3.explicit_head_dim, 128);
  EXPECT_EQ(q3.rope_theta, 1e6);
  auto j = qwen3_06b_hf_config();
  j["attention_bias"] = true;  // Qwen3Attention: biases on q, k, v and o
  auto biased = ModelConfig::from_json(j, "config.json");
  EXPECT_TRUE(biased.qkv_bias && biased.o_bias);
  EXPECT_EQ(biased.num_parameters(), q3.num_parameters() + 28 * (2048 + 1024 + 1024 + 1024));
  EXPECT_EQ(biased.to_json()["attention_bias"], true);
}

// Unsupported Qwen options, and Qwen's pieces under Llama / Mistral, are one line naming the key.
TEST(QwenConfig, UnsupportedOptionsAreRefusedByKey) {
  auto err = [](nlohmann::json j) { return error_of<ModelError>([&] { ModelConfig::from_json(j, "c.json"); }); };
  auto j = qwen25_7b_hf_config();
  j["use_sliding_window"] = true;
  EXPECT_EQ(err(j).rfind("c.json: use_sliding_window true is not supported", 0), 0u) << err(j);
  j = qwen3_06b_hf_config();
  j["layer_types"] = std::vector<std::string>(27, "full_attention");
  j["layer_types"].push_back("sliding_attention");
  EXPECT_EQ(err(j), "c.json: layer_types entry \"sliding_attention\" is not supported (only full_attention)");
  j = qwen3_06b_hf_config();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  EXPECT_EQ(err(j), "c.json: rope_scaling.rope_type \"yarn\" is not supported for model_type \"qwen3\" (supported: default)");
  j["rope_scaling"] = {{"type", "default"}};
  EXPECT_NO_THROW(ModelConfig::from_json(j, "c.json"));
  j = qwen3_06b_hf_config();
  j["head_dim"] = "128";
  EXPECT_EQ(err(j), "c.json: head_dim \"128\" must be a positive integer");
  j = qwen3_06b_hf_config();
  j["model_type"] = "llama";
  EXPECT_EQ(err(j).rfind("c.json: head_dim 128 is not supported for model_type \"llama\"", 0), 0u) << err(j);
  j["head_dim"] = 64;
  j["attention_bias"] = true;
  EXPECT_EQ(err(j).rfind("c.json: attention_bias true is not supported for model_type \"llama\"", 0), 0u) << err(j);
}

TEST(Llama3Config, ParsesRealConfigsAndMatchesPresets) {
  auto c = ModelConfig::from_json(llama32_1b_hf_config(), "config.json");
  EXPECT_EQ(c, ModelConfig::preset("llama3.2-1b"));
  EXPECT_EQ(c.rope_scaling, (RopeScaling{"llama3", 32.0, 1.0, 4.0, 8192}));
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.spec().family(), "llama");
  EXPECT_EQ(c.num_parameters(), 1235814400LL);
  // Llama 3.1 8B Instruct: rope factor 8 and a list of end-of-turn ids, kept as a list.
  auto j = llama32_1b_hf_config();
  j["hidden_size"] = 4096, j["intermediate_size"] = 14336, j["num_hidden_layers"] = 32, j["head_dim"] = 128;
  j["rope_scaling"]["factor"] = 8.0, j["tie_word_embeddings"] = false;
  j["eos_token_id"] = {128001, 128008, 128009};
  auto c31 = ModelConfig::from_json(j, "config.json");
  EXPECT_EQ(c31.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(c31.to_json()["eos_token_id"], nlohmann::json({128001, 128008, 128009}));
  c31.eos_token_ids = {128001};
  EXPECT_EQ(c31, ModelConfig::preset("llama3-8b"));
  // Older files spell the type "type"; "default" means no scaling.
  j["rope_scaling"] = {{"type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  EXPECT_EQ(ModelConfig::from_json(j, "c").rope_scaling.type, "llama3");
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_TRUE(ModelConfig::from_json(j, "c").rope_scaling.type.empty());
}

// transformers >= 5 writes RoPE as rope_parameters {"rope_theta", "rope_type", the scaling's keys}
// instead of rope_theta and rope_scaling (and "dtype" for "torch_dtype", since 4.56): config.json
// files written that way (each family's real file converted as transformers 5 converts it) read as
// the same configs; an unknown rope_type, RoPE
// per layer type and a disagreeing rope_theta are refused in one line naming the file and the key.
TEST(ModelConfig, Transformers5RopeParameters) {
  TempDir dir;
  const std::string path = (dir.path() / "config.json").string();
  auto load = [&](const nlohmann::json& j) {
    std::ofstream(path) << j.dump(2);
    return ModelConfig::load(path);
  };
  auto err = [&](const nlohmann::json& j) { return error_of<ModelError>([&] { load(j); }); };
  // What transformers 5 writes: rope_theta and rope_scaling folded into rope_parameters.
  auto v5 = [](nlohmann::json j) {
    nlohmann::json p = j.contains("rope_scaling") && j["rope_scaling"].is_object() ? j["rope_scaling"]
                                                                                 : nlohmann::json{{"rope_type", "default"}};
    p["rope_theta"] = j.value("rope_theta", 10000.0);
    j["dtype"] = j["torch_dtype"];  // transformers >= 4.56's name
    j.erase("rope_scaling"), j.erase("rope_theta"), j.erase("torch_dtype");
    j["rope_parameters"] = p;
    j["transformers_version"] = "5.0.0";
    return j;
  };
  for (const auto& [name, j] : std::map<std::string, nlohmann::json>{
           {"llama3.2-1b", llama32_1b_hf_config()}, {"mistral-7b", mistral_v01_hf_config()},
           {"qwen2.5-7b", qwen25_7b_hf_config()}, {"qwen3-0.6b", qwen3_06b_hf_config()}}) {
    EXPECT_EQ(load(v5(j)), ModelConfig::preset(name)) << name;
    EXPECT_EQ(load(v5(j)), load(j)) << name;
  }
  EXPECT_EQ(load(v5(llama32_1b_hf_config())).rope_scaling, (RopeScaling{"llama3", 32.0, 1.0, 4.0, 8192}));
  EXPECT_EQ(load(v5(qwen3_06b_hf_config())).rope_theta, 1e6);
  EXPECT_EQ(load(v5(qwen3_06b_hf_config())).torch_dtype, "bfloat16");
  auto llama2 = v5(llama7b_hf_config());  // no rope_theta in the file: 10000 by default
  llama2["rope_parameters"].erase("rope_type");  // absent: default
  EXPECT_EQ(load(llama2).rope_theta, 10000.0);
  EXPECT_TRUE(load(llama2).rope_scaling.type.empty());
  llama2["rope_parameters"]["rope_theta"] = 20000.0;
  EXPECT_EQ(load(llama2).rope_theta, 20000.0);

  auto q3 = v5(qwen3_06b_hf_config());
  q3["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e6}, {"factor", 4.0}};
  EXPECT_EQ(err(q3), path + ": rope_parameters.rope_type \"yarn\" is not supported for model_type \"qwen3\" (supported: default)");
  auto l = v5(llama32_1b_hf_config());
  l["rope_parameters"]["rope_type"] = "linear";
  EXPECT_EQ(err(l), path + ": rope_parameters.rope_type \"linear\" is not supported for model_type \"llama\" (supported: llama3, default)");
  l = v5(llama32_1b_hf_config());
  l["rope_parameters"].erase("factor");
  EXPECT_EQ(err(l), path + ": rope_parameters: missing required key 'factor'");
  auto m = v5(mistral_v01_hf_config());
  m["rope_parameters"]["rope_type"] = "dynamic";
  EXPECT_EQ(err(m), path + ": rope_parameters.rope_type \"dynamic\" is not supported for model_type \"mistral\" (supported: default)");
  m["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e6}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  EXPECT_EQ(err(m).rfind(path + ": rope_parameters.full_attention: RoPE parameters per layer type are not supported", 0), 0u) << err(m);
  m["rope_parameters"] = "default";
  EXPECT_EQ(err(m), path + ": rope_parameters \"default\" must be an object or null");
  q3 = v5(qwen3_06b_hf_config());
  q3["rope_theta"] = 10000.0;
  EXPECT_EQ(err(q3), path + ": rope_parameters.rope_theta 1000000.0 and rope_theta 10000.0 differ: give one");
  q3["rope_theta"] = 1e6;  // both, agreeing: read
  EXPECT_EQ(load(q3), ModelConfig::preset("qwen3-0.6b"));
  l = v5(llama32_1b_hf_config());
  l["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(err(l), path + ": rope_parameters.rope_type and rope_scaling.rope_type differ: give one of rope_parameters and rope_scaling");
  q3["rope_parameters"]["rope_type"] = 3;
  EXPECT_EQ(err(q3), path + ": rope_parameters.rope_type 3 must be a string");
}

TEST(MistralConfig, SlidingWindowOrNot) {
  auto c = ModelConfig::from_json(mistral_v01_hf_config(), "config.json");
  EXPECT_EQ(c, ModelConfig::preset("mistral-7b"));
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.spec().family(), "mistral");
  EXPECT_EQ(c.num_parameters(), 7241732096LL);
  auto out = c.to_json();
  EXPECT_EQ(out["architectures"], nlohmann::json::array({"MistralForCausalLM"}));
  EXPECT_EQ(out["model_type"], "mistral");
  EXPECT_EQ(out["sliding_window"], 4096);
  // v0.3: no window (null), theta 1e6, vocab 32768.
  auto j = mistral_v01_hf_config();
  j["sliding_window"] = nullptr, j["rope_theta"] = 1000000.0, j["vocab_size"] = 32768;
  auto v3 = ModelConfig::from_json(j, "config.json");
  EXPECT_EQ(v3.sliding_window, 0);
  EXPECT_TRUE(v3.to_json()["sliding_window"].is_null());
  EXPECT_EQ(ModelConfig::from_json(v3.to_json(), "again"), v3);
  EXPECT_EQ(v3.num_parameters(), 7248023552LL);
}

TEST(Llama3Config, PresetsRoundTripThroughTheirFamily) {
  for (const auto& name : ModelConfig::preset_names()) {
    auto c = ModelConfig::preset(name);
    EXPECT_EQ(ModelConfig::from_json(c.to_json(), name), c) << name;
    EXPECT_EQ(c.to_json()["model_type"], c.model_type) << name;
  }
}

TEST(Llama3Config, UnsupportedValuesNameFileAndKey) {
  auto j = llama32_1b_hf_config();
  j["rope_scaling"]["rope_type"] = "yarn";
  EXPECT_EQ(error_of<ModelError>([&] { ModelConfig::from_json(j, "m/config.json"); }),
            "m/config.json: rope_scaling.rope_type \"yarn\" is not supported for model_type \"llama\" (supported: llama3, default)");
  j = llama32_1b_hf_config();
  j["rope_scaling"].erase("rope_type");
  j["rope_scaling"]["type"] = "linear";
  EXPECT_EQ(error_of<ModelError>([&] { ModelConfig::from_json(j, "c.json"); }),
            "c.json: rope_scaling.type \"linear\" is not supported for model_type \"llama\" (supported: llama3, default)");
  j = llama32_1b_hf_config();
  j["rope_scaling"].erase("factor");
  EXPECT_EQ(error_of<ModelError>([&] { ModelConfig::from_json(j, "c.json"); }), "c.json: rope_scaling: missing required key 'factor'");
  j = llama32_1b_hf_config();
  j["rope_scaling"]["high_freq_factor"] = 0.5;
  EXPECT_NE(error_of<ModelError>([&] { ModelConfig::from_json(j, "c.json"); }).find("rope_scaling.high_freq_factor"), std::string::npos);
  j = llama32_1b_hf_config();
  j["head_dim"] = 128;
  EXPECT_NE(error_of<ModelError>([&] { ModelConfig::from_json(j, "c.json"); }).find("c.json: head_dim 128 is not supported"),
            std::string::npos);
  j = llama32_1b_hf_config();
  j["eos_token_id"] = {128001, "x"};
  EXPECT_NE(error_of<ModelError>([&] { ModelConfig::from_json(j, "c.json"); }).find("'eos_token_id' must be an integer or a list"),
            std::string::npos);
  auto m = mistral_v01_hf_config();
  m["sliding_window"] = 0;
  EXPECT_NE(error_of<ModelError>([&] { ModelConfig::from_json(m, "c.json"); }).find("c.json: sliding_window 0 must be a positive"),
            std::string::npos);
  m = mistral_v01_hf_config();
  m["rope_scaling"] = {{"rope_type", "llama3"}};
  EXPECT_NE(error_of<ModelError>([&] { ModelConfig::from_json(m, "c.json"); }).find("not supported for model_type \"mistral\""),
            std::string::npos);
}

}  // namespace test_model_config
