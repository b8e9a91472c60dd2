#include "launcher/llama_lm.h"

#include <torch/torch.h>

#include "model/activations.h"
#include "model/llama.h"
#include "model/safetensors.h"
#include "runtime/error.h"

namespace tessera::launcher {

train::CausalLm make_llama_lm(const model::LlamaConfig& cfg) {
  auto llama = std::make_shared<model::Llama>(cfg, torch::kMeta);
  model::Llama& m = *llama;
  train::CausalLm lm;
  lm.units.push_back({"root", m->root_parameters()});
  for (int64_t i = 0; i < m->num_layers(); ++i)
    lm.units.push_back({"model.layers." + std::to_string(i), m->layer_parameters(i)});
  model::LlamaImpl* impl = m.get();
  lm.embed = [impl](const at::Tensor& tokens) { return impl->embed(tokens); };
  lm.layer = [impl](int64_t i, const at::Tensor& h) { return impl->layer(i)->forward(h); };
  lm.head = [impl](const at::Tensor& h) { return impl->head(h); };
  lm.decay = [](const std::string& name) { return !model::is_norm_weight(name); };
  lm.vocab_size = cfg.vocab_size;
  lm.flops_per_token = [cfg](int64_t seq_len) { return cfg.train_flops_per_token(seq_len); };
  lm.keep_alive = llama;
  return lm;
}

memory::ModelShape llama_memory_shape(const model::LlamaConfig& cfg) {
  model::Llama m(cfg, torch::kMeta);
  memory::ModelShape s;
  auto add_unit = [&](const model::NamedTensors& params) {
    s.units.emplace_back();
    for (const auto& [name, p] : params) {
      s.units.back().emplace_back(name, p.sizes().vec());
      s.parameters += p.numel();
    }
  };
  add_unit(m->root_parameters());
  for (const auto& [name, p] : m->root_parameters()) s.root_param_in_head.push_back(name.rfind("model.embed_tokens", 0) != 0);
  for (int64_t i = 0; i < m->num_layers(); ++i) add_unit(m->layer_parameters(i));
  return s;
}

memory::ActivationTerms llama_activation_terms(const model::LlamaConfig& cfg, int64_t B, int64_t T, int elem,
                                               bool fused_attention) {
  const model::ActivationBytes a = model::llama_activation_bytes(cfg, B, T, elem, fused_attention);
  memory::ActivationTerms t;
  t.layer_input = a.layer_input;
  t.layer_saved = a.layer_saved;
  t.layer_forward_transient = a.layer_forward_transient;
  t.layer_backward_transient = a.layer_backward_transient;
  t.head_saved = a.head_saved;
  t.head_forward_transient = a.head_forward_transient;
  t.head_backward_transient = a.head_backward_transient;
  t.logits = a.logits;
  return t;
}

void InitWeightSource::read(const std::string& name, const std::vector<int64_t>& shape, int64_t offset,
                            int64_t count, float* dst) {
  if (name != cached_name_) {
    cached_ = model::init_tensor({name, shape}, seed_).contiguous();
    cached_name_ = name;
  }
  TESSERA_CHECK(offset + count <= cached_.numel(), "slice out of range for " + name);
  std::memcpy(dst, cached_.data_ptr<float>() + offset, count * sizeof(float));
}

void HfWeightSource::read(const std::string& name, const std::vector<int64_t>& shape, int64_t offset,
                          int64_t count, float* dst) {
  dir_->read_into(name, offset, count, dst, model::DType::F32);
}

}  // namespace tessera::launcher

namespace tessera::launcher {

at::Tensor HfWeightSource::view(const std::string& name, int64_t offset, int64_t count) {
  const auto dtype = model::to_torch(dir_->info(name).dtype);
  // from_blob never writes; the mapping is PROT_READ, so the tensor must only be read.
  return at::from_blob(const_cast<void*>(dir_->mapped(name, offset, count)), {count},
                       at::TensorOptions().dtype(dtype));
}

void HfWeightSource::release(const std::string& name, int64_t offset, int64_t count) {
  dir_->release(name, offset, count);
}

}  // namespace tessera::launcher
