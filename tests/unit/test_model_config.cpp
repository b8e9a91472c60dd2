// ModelConfig: presets, config.json parsing (required keys, defaults, unsupported features), validation.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "model/config.h"
#include "model/errors.h"

using namespace tessera::model;

namespace {
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ModelError& e) {
    return e.what();
  }
  return "<no error>";
}
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
    EXPECT_EQ(j["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
    EXPECT_EQ(j["model_type"], "llama");
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
  EXPECT_EQ(error_of([&] { ModelConfig::from_json(j, "/m/config.json"); }),
            "/m/config.json: missing required key 'hidden_size'");
  j = llama7b_hf_config();
  j["vocab_size"] = "32000";
  EXPECT_NE(error_of([&] { ModelConfig::from_json(j, "c.json"); }).find("c.json: key 'vocab_size' must be an integer"),
            std::string::npos);
  j = llama7b_hf_config();
  j["num_key_value_heads"] = 5;
  EXPECT_NE(error_of([&] { ModelConfig::from_json(j, "c.json"); }).find("not divisible by num_key_value_heads 5"),
            std::string::npos);
  j = llama7b_hf_config();
  j["model_type"] = "mistral";
  EXPECT_NE(error_of([&] { ModelConfig::from_json(j, "c.json"); }).find("model_type \"mistral\""), std::string::npos);
  j = llama7b_hf_config();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_NE(error_of([&] { ModelConfig::from_json(j, "c.json"); }).find("rope_scaling"), std::string::npos);
  j = llama7b_hf_config();
  j["hidden_size"] = -4;
  EXPECT_NE(error_of([&] { ModelConfig::from_json(j, "c.json"); }).find("'hidden_size' must be positive"),
            std::string::npos);
  EXPECT_EQ(error_of([] { ModelConfig::preset("llama3"); }),
            "unknown model preset 'llama3' (valid: tiny, small, llama2-7b, llama2-13b, llama2-70b)");
}

TEST(ModelConfig, LoadFromFile) {
  auto dir = std::filesystem::temp_directory_path() / ("tessera_cfg_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto path = (dir / "config.json").string();
  std::ofstream(path) << llama7b_hf_config().dump();
  EXPECT_EQ(ModelConfig::load(path), ModelConfig::preset("llama2-7b"));
  std::ofstream(path) << "{\"vocab_size\": 3,";
  EXPECT_NE(error_of([&] { ModelConfig::load(path); }).find(path + ": invalid JSON"), std::string::npos);
  EXPECT_NE(error_of([&] { ModelConfig::load((dir / "nope.json").string()); }).find("nope.json: cannot open"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}
