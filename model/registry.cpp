#include "model/registry.h"

#include <torch/torch.h>

#include "model/errors.h"

namespace tessera::model {

// ---- The registry: one line per family. X(name) refers to `const ModelSpec& name_family()`,
// defined in the family's own file.
#define TESSERA_MODEL_FAMILIES(X) \
  X(llama)   /* model/llama_family.cpp: Llama 2, Llama 3 / 3.1 / 3.2 / 3.3 */ \
  X(mistral) /* model/mistral.cpp: Mistral 7B v0.1 - v0.3 */ \
  X(qwen2)   /* model/qwen.cpp: Qwen2, Qwen2.5 */ \
  X(qwen3)   /* model/qwen.cpp: Qwen3 (dense) */

#define TESSERA_DECLARE_FAMILY(name) const ModelSpec& name##_family();
TESSERA_MODEL_FAMILIES(TESSERA_DECLARE_FAMILY)
#undef TESSERA_DECLARE_FAMILY

const std::vector<const ModelSpec*>& model_families() {
#define TESSERA_LIST_FAMILY(name) &name##_family(),
  static const std::vector<const ModelSpec*> families = {TESSERA_MODEL_FAMILIES(TESSERA_LIST_FAMILY)};
#undef TESSERA_LIST_FAMILY
  return families;
}

const ModelSpec& family_for(const std::string& model_type, const std::string& source) {
  std::string supported;
  for (const ModelSpec* f : model_families())
    for (const auto& t : f->model_types()) {
      if (t == model_type) return *f;
      supported += (supported.empty() ? "" : ", ") + t;
    }
  throw ModelError(source + ": model_type \"" + model_type + "\" is not supported (supported: " + supported + ")");
}

int64_t UnitSpec::numel() const {
  int64_t n = 0;
  for (const auto& t : tensors) n += t.numel();
  return n;
}

std::pair<torch::Tensor, torch::Tensor> KvCache::append(int64_t layer, const torch::Tensor& k, const torch::Tensor& v) {
  const int64_t T = k.size(2);
  TORCH_CHECK(layer >= 0 && layer < (int64_t)keys.size(), "KvCache: layer ", layer, " of ", keys.size());
  TORCH_CHECK(start >= 0 && start + T <= capacity, "KvCache: positions ", start, " .. ", start + T - 1,
              " outside its capacity ", capacity);
  torch::Tensor& K = keys[layer];
  torch::Tensor& V = values[layer];
  if (!K.defined() || K.size(0) != k.size(0) || K.scalar_type() != k.scalar_type()) {
    K = torch::zeros({k.size(0), k.size(1), capacity, k.size(3)}, k.options());
    V = torch::zeros({v.size(0), v.size(1), capacity, v.size(3)}, v.options());
  }
  K.narrow(2, start, T).copy_(k);
  V.narrow(2, start, T).copy_(v);
  return {K.narrow(2, 0, start + T), V.narrow(2, 0, start + T)};
}

int64_t KvCache::bytes() const {
  int64_t n = 0;
  for (size_t i = 0; i < keys.size(); ++i)
    if (keys[i].defined()) n += (keys[i].numel() + values[i].numel()) * (int64_t)keys[i].element_size();
  return n;
}

torch::Tensor CausalLmModule::forward(const torch::Tensor& tokens, const TokenLayout& layout) {
  auto h = embed(tokens);
  for (int64_t i = 0; i < num_layers(); ++i) h = layer_forward(i, h, layout);
  return head(h);
}

torch::Tensor CausalLmModule::head_loss(const torch::Tensor& h, const torch::Tensor& labels, const HeadLoss& how) {
  const int64_t ignore_index = how.ignore_index;
  const torch::Tensor logits = head(h);
  namespace F = torch::nn::functional;
  return F::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat), labels.reshape({-1}),
                          F::CrossEntropyFuncOptions().ignore_index(ignore_index).reduction(torch::kSum));
}

NamedTensors CausalLmModule::named_hf_parameters() {
  NamedTensors out;
  for (const auto& item : named_parameters(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
  return out;
}

std::vector<UnitSpec> unit_specs(const ModelConfig& cfg) { return cfg.spec().unit_specs(cfg); }

std::vector<UnitSpec> lora_unit_specs(const ModelConfig& cfg, const lora::Options& o) {
  std::vector<UnitSpec> units = {{"root", {}}};
  const std::vector<lora::TargetShape> targets = cfg.spec().lora_targets(cfg);
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    UnitSpec layer{p, {}};
    for (const lora::TargetShape& t : targets) {
      if (std::find(o.targets.begin(), o.targets.end(), t.name) == o.targets.end()) continue;
      layer.tensors.push_back({p + "." + t.path + ".lora_A.weight", {o.rank, t.in}});
      layer.tensors.push_back({p + "." + t.path + ".lora_B.weight", {t.out, o.rank}});
    }
    units.push_back(std::move(layer));
  }
  return units;
}

std::vector<TensorSpec> hf_tensor_specs(const ModelConfig& cfg) { return cfg.spec().tensor_specs(cfg); }

std::vector<TensorSpec> hf_layer_specs(const ModelConfig& cfg, int64_t i) {
  TORCH_CHECK(i >= 0 && i < cfg.num_hidden_layers, "layer index ", i, " out of range");
  return cfg.spec().unit_specs(cfg)[1 + i].tensors;
}

}  // namespace tessera::model
