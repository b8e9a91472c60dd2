// LoRA: the lora.* keys and their refusals (launcher/config.cpp, model/lora.h's validate), the
// adapters a family adds (model/llama.cpp), PEFT's initialisation, and the adapted forward against
// the merged weights W + (alpha / r) B A computed here.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>

#include "launcher/config.h"
#include "model/errors.h"
#include "model/llama.h"
#include "model/lora.h"
#include "model/registry.h"
#include "util/error.h"

namespace test_lora {

using namespace tessera;

model::ModelConfig tiny(int64_t layers = 2) {
  model::ModelConfig c = model::ModelConfig::preset("tiny");
  c.num_hidden_layers = layers;
  return c;
}

std::string config_error(const nlohmann::json& j, const std::vector<std::string>& sets = {}) {
  try {
    launcher::Config::from_json(j, "run.json", sets);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(LoraConfig, KeysBindToTheOwner) {
  const auto c = launcher::Config::from_json({{"lora", {{"rank", 4}, {"alpha", 16}, {"dropout", 0.1}, {"targets", {"q_proj", "v_proj"}}}}},
                                             "run.json");
  EXPECT_EQ(c.lora.rank, 4);
  EXPECT_EQ(c.lora.alpha, 16.0);
  EXPECT_EQ(c.lora.dropout, 0.1);
  EXPECT_EQ(c.lora.targets, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_DOUBLE_EQ(c.lora.scale(), 4.0);
  const auto d = launcher::Config::from_json(nlohmann::json::object(), "run.json", {"lora.rank=8", "lora.targets=q_proj,o_proj"});
  EXPECT_EQ(d.lora.targets, (std::vector<std::string>{"q_proj", "o_proj"}));
  const auto e = launcher::Config::from_json(nlohmann::json::object(), "run.json", {"lora.rank=8", "lora.targets=[\"k_proj\"]"});
  EXPECT_EQ(e.lora.targets, (std::vector<std::string>{"k_proj"}));
  // Defaults: off, PEFT's alpha 8 and dropout 0, all seven projections.
  const launcher::Config none;
  EXPECT_FALSE(none.lora.enabled());
  EXPECT_EQ(none.lora.alpha, 8.0);
  EXPECT_EQ(none.lora.targets.size(), 7u);
  EXPECT_EQ(none.json()["lora"]["rank"], 0);
}

TEST(LoraConfig, RefusesBadInputNamingTheKey) {
  EXPECT_NE(config_error({{"lora", {{"rank", 4}, {"alpha", 0}}}}).find("lora.alpha must be > 0"), std::string::npos);
  EXPECT_NE(config_error({{"lora", {{"rank", 4}, {"alpha", -2}}}}).find("lora.alpha"), std::string::npos);
  const std::string off = config_error({{"lora", {{"alpha", 32}}}});
  EXPECT_NE(off.find("lora.alpha is set but lora.rank is 0"), std::string::npos) << off;
  EXPECT_NE(config_error({{"lora", {{"targets", {"q_proj"}}}}}).find("lora.targets is set but lora.rank is 0"), std::string::npos);
  EXPECT_NE(config_error({{"lora", {{"rank", -1}}}}).find("lora.rank"), std::string::npos);
  EXPECT_NE(config_error({{"lora", {{"rank", 2}, {"base_dtype", "int4"}}}}).find("lora.base_dtype"), std::string::npos);
  EXPECT_NE(config_error({{"lora", {{"rank", 2}, {"double_quant", true}}}}).find("lora.double_quant needs lora.base_dtype=nf4"),
            std::string::npos);
  EXPECT_NE(config_error({{"lora", {{"rank", 2}, {"targets", {"q_proj", 3}}}}}).find("lora.targets"), std::string::npos);
  for (const std::string& e : {config_error({{"lora", {{"alpha", 32}}}}), config_error({{"lora", {{"rank", 4}, {"alpha", 0}}}})})
    EXPECT_EQ(e.find('\n'), std::string::npos) << "one line: " << e;
}

TEST(LoraConfig, RefusesTargetsAndRanksTheModelCannotTake) {
  const model::ModelConfig m = tiny();
  lora::Options o;
  o.rank = 4;
  o.targets = {"q_proj", "qkv_proj"};
  try {
    lora::validate(o, &m, "config");
    FAIL() << "an unknown target was accepted";
  } catch (const model::ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("lora.targets names 'qkv_proj'"), std::string::npos) << e.what();
  }
  o.targets = {"k_proj"};
  const int64_t kv = m.num_key_value_heads * m.head_dim();
  o.rank = std::min(kv, m.hidden_size) + 1;
  EXPECT_THROW(lora::validate(o, &m, "config"), model::ModelError);
  o.rank = std::min(kv, m.hidden_size);
  EXPECT_NO_THROW(lora::validate(o, &m, "config"));
  o.targets = {"k_proj", "k_proj"};
  EXPECT_THROW(lora::validate(o, &m, "config"), model::ModelError);
}

TEST(LoraModel, AdaptersFollowTheModuleTreeAndTheArithmetic) {
  const model::ModelConfig m = tiny();
  lora::Options o;
  o.rank = 3;
  o.targets = {"q_proj", "down_proj"};
  auto mod = m.spec().build(m, torch::kMeta);
  m.spec().add_lora(*mod, o);
  const auto specs = model::lora_unit_specs(m, o);
  ASSERT_EQ(specs.size(), static_cast<size_t>(m.num_hidden_layers + 1));
  EXPECT_TRUE(specs[0].tensors.empty());
  for (int64_t i = 0; i < m.num_hidden_layers; ++i) {
    std::vector<std::pair<std::string, std::vector<int64_t>>> found;
    for (const auto& [name, t] : mod->layer_parameters(i))
      if (lora::is_adapter(name)) found.emplace_back(name, t.sizes().vec());
    ASSERT_EQ(found.size(), specs[1 + i].tensors.size());
    for (size_t k = 0; k < found.size(); ++k) {
      EXPECT_EQ(found[k].first, specs[1 + i].tensors[k].name);
      EXPECT_EQ(found[k].second, specs[1 + i].tensors[k].shape);
    }
  }
  const std::string p = "model.layers.1.";
  EXPECT_EQ(specs[2].tensors[0].name, p + "self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(specs[2].tensors[0].shape, (std::vector<int64_t>{3, m.hidden_size}));
  EXPECT_EQ(specs[2].tensors[3].name, p + "mlp.down_proj.lora_B.weight");
  EXPECT_EQ(specs[2].tensors[3].shape, (std::vector<int64_t>{m.hidden_size, 3}));
}

TEST(LoraModel, PeftInitialisation) {
  const auto a = lora::init_adapter("model.layers.0.self_attn.q_proj.lora_A.weight", {8, 400}, 7);
  const auto a2 = lora::init_adapter("model.layers.0.self_attn.q_proj.lora_A.weight", {8, 400}, 7);
  const auto other = lora::init_adapter("model.layers.0.self_attn.k_proj.lora_A.weight", {8, 400}, 7);
  EXPECT_TRUE(a.equal(a2));
  EXPECT_FALSE(a.equal(other));
  // kaiming_uniform_(a = sqrt(5)) over fan_in 400: U(-1/20, 1/20), variance bound^2 / 3.
  const double bound = 1.0 / std::sqrt(400.0);
  EXPECT_LE(a.abs().max().item<double>(), bound);
  EXPECT_GT(a.abs().max().item<double>(), 0.95 * bound);
  EXPECT_NEAR(a.var().item<double>(), bound * bound / 3, 0.1 * bound * bound / 3);
  EXPECT_TRUE(lora::init_adapter("x.q_proj.lora_B.weight", {400, 8}, 7).eq(0).all().item<bool>());
}

// The adapted model (B random, so the adapters matter) against a plain model holding the merged
// weights W + (alpha / r) B A, computed here; and with B = 0 (PEFT's start) against the base itself.
TEST(LoraModel, ForwardEqualsMergedWeights) {
  const model::ModelConfig m = tiny();
  lora::Options o;
  o.rank = 4;
  o.alpha = 12;
  auto adapted = m.spec().build(m, torch::kCPU);
  auto base = m.spec().build(m, torch::kCPU);
  model::init_weights(*adapted, 11);
  model::init_weights(*base, 11);
  m.spec().add_lora(*adapted, o);
  torch::NoGradGuard no_grad;
  const auto tokens = torch::randint(0, m.vocab_size, {2, 12}, torch::kLong);
  for (auto& [name, t] : adapted->named_hf_parameters())
    if (lora::is_adapter(name)) t.copy_(lora::init_adapter(name, t.sizes().vec(), 5));
  EXPECT_TRUE(adapted->forward(tokens).equal(base->forward(tokens))) << "B = 0: the step-0 model is the base";

  std::map<std::string, torch::Tensor> params;
  for (auto& [name, t] : adapted->named_hf_parameters()) {
    params[name] = t;
    if (name.find(".lora_B.") != std::string::npos) t.normal_(0.0, 0.05);
  }
  const auto before = base->forward(tokens);
  int merged = 0;
  for (auto& [name, W] : base->named_hf_parameters()) {
    const std::string stem = name.substr(0, name.size() - std::string(".weight").size());
    if (!params.count(stem + ".lora_A.weight")) continue;
    const auto A = params[stem + ".lora_A.weight"], B = params[stem + ".lora_B.weight"];
    W.copy_(W + torch::matmul(B, A) * (o.alpha / o.rank));  // the published W' = W + (alpha / r) B A
    EXPECT_TRUE(lora::merged_weight(W - torch::matmul(B, A) * (o.alpha / o.rank), A, B, o.alpha / o.rank).allclose(W, 0, 1e-6));
    ++merged;
  }
  EXPECT_EQ(merged, 7 * m.num_hidden_layers);
  const auto out = adapted->forward(tokens);
  EXPECT_GT((out - before).abs().max().item<double>(), 1e-3) << "the adapters change the output";
  EXPECT_LT((out - base->forward(tokens)).abs().max().item<double>(), 1e-5);
}

}  // namespace test_lora
