// The KV cache of generation (model/registry.h KvCache): a prompt prefilled in one pass and then one
// token per forward gives, at every new position, the logits of recomputing the whole sequence
// without a cache, within 1e-5 in fp32, for every family (grouped-query attention, Llama 3's RoPE
// scaling, Mistral's sliding window with the window smaller than the sequence, Qwen2's biases,
// Qwen3's q/k norms).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "model/config.h"
#include "model/llama.h"
#include "model/registry.h"

namespace test_kv_cache {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace tessera::model;

std::shared_ptr<CausalLmModule> random_model(const ModelConfig& cfg, uint64_t seed) {
  torch::manual_seed(seed);
  auto m = cfg.spec().build(cfg, torch::kCPU);
  torch::NoGradGuard g;
  for (auto& [name, t] : m->named_hf_parameters()) {
    if (is_norm_weight(name)) t.uniform_(0.5, 1.5);
    else t.normal_(0, 0.1);
  }
  return m;
}

torch::Tensor row(const std::vector<int64_t>& ids) { return torch::tensor(ids).unsqueeze(0); }

// The logits of one forward of `tokens` at cache position `start` (layer by layer, as a runtime calls it).
torch::Tensor cached_forward(CausalLmModule& m, const TokenLayout& layout, const torch::Tensor& tokens) {
  auto h = m.embed(tokens);
  for (int64_t i = 0; i < m.num_layers(); ++i) h = m.layer_forward(i, h, layout);
  return m.head(h);
}

std::vector<ModelConfig> families() {
  auto mistral = ModelConfig::preset("tiny-mistral");
  mistral.sliding_window = 3;  // smaller than the prompt: the window cuts into the cached keys
  return {ModelConfig::preset("tiny"), ModelConfig::preset("tiny-llama3"), mistral, ModelConfig::preset("tiny-qwen2"),
          ModelConfig::preset("tiny-qwen3")};
}

TEST(KvCache, PrefillThenOneTokenAtATimeEqualsRecomputation) {
  const std::vector<int64_t> seq = {3, 17, 200, 36, 5, 5, 21, 9, 30, 2, 11, 4};
  const int64_t prompt = 5;
  for (const ModelConfig& cfg : families()) {
    const std::string fam = cfg.spec().family() + (cfg.sliding_window ? " (window)" : "");
    auto m = random_model(cfg, 7);
    torch::NoGradGuard g;
    const torch::Tensor full = m->forward(row(seq))[0];  // [T, V], no cache
    TokenLayout layout;
    layout.cache = std::make_shared<KvCache>(m->num_layers(), (int64_t)seq.size() + 3);  // room to spare
    auto pre = cached_forward(*m, layout, row({seq.begin(), seq.begin() + prompt}))[0];
    double worst = (pre - full.narrow(0, 0, prompt)).abs().max().item<double>();
    for (int64_t p = prompt; p < (int64_t)seq.size(); ++p) {
      layout.cache->start = p;
      auto one = cached_forward(*m, layout, row({seq[p]}))[0][0];
      worst = std::max(worst, (one - full[p]).abs().max().item<double>());
    }
    EXPECT_LE(worst, 1e-5) << fam;
    EXPECT_GT(full.abs().max().item<double>(), 0.1) << fam << ": logits too small for the bound to mean anything";
    EXPECT_GT(layout.cache->bytes(), 0) << fam;
  }
}

// Without the cached keys a token's logits are those of a one-token sequence, far from the
// recomputation: the comparison above would see a cache that is not read.
TEST(KvCache, TheCachedKeysMatter) {
  auto m = random_model(ModelConfig::preset("tiny"), 8);
  torch::NoGradGuard g;
  const std::vector<int64_t> seq = {3, 17, 200, 36};
  const torch::Tensor full = m->forward(row(seq))[0];
  TokenLayout layout;
  layout.cache = std::make_shared<KvCache>(m->num_layers(), 4);
  cached_forward(*m, layout, row({3, 17, 200}));
  layout.cache->start = 3;
  auto with = cached_forward(*m, layout, row({36}))[0][0];
  layout.cache->keys.assign(m->num_layers(), torch::Tensor());  // a fresh cache: the prompt is gone
  layout.cache->values.assign(m->num_layers(), torch::Tensor());
  auto without = cached_forward(*m, layout, row({36}))[0][0];
  EXPECT_LE((with - full[3]).abs().max().item<double>(), 1e-5);
  EXPECT_GT((without - full[3]).abs().max().item<double>(), 1e-2);
}

TEST(KvCache, RefusesPositionsBeyondItsCapacity) {
  auto m = random_model(ModelConfig::preset("tiny"), 9);
  torch::NoGradGuard g;
  TokenLayout layout;
  layout.cache = std::make_shared<KvCache>(m->num_layers(), 4);
  cached_forward(*m, layout, row({1, 2, 3}));
  layout.cache->start = 3;
  EXPECT_THROW(cached_forward(*m, layout, row({4, 5})), c10::Error);
}

}  // namespace test_kv_cache
