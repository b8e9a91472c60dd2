#include "launcher/model_lm.h"

#include <torch/torch.h>

#include "launcher/test_seams.h"
#include "model/activations.h"
#include "model/registry.h"
#include "model/safetensors.h"
#include "runtime/data/dataset.h"
#include "util/error.h"

namespace tessera::launcher {

namespace {
// LoRA: a unit's adapters are its trainable group, everything else frozen (no gradient): QLoRA's
// quantized weights (lora::quantized_weight, given `linears`) in the quantized group, the rest in
// the frozen group.
fsdp::UnitDef split_unit(std::string name, const model::NamedTensors& params, bool lora,
                         const std::vector<lora::TargetShape>* linears) {
  fsdp::UnitDef u{std::move(name), {}, {}, {}};
  if (!lora) {
    u.params = params;
    return u;
  }
  for (const auto& [n, t] : params) {
    if (lora::is_adapter(n)) {
      u.params.emplace_back(n, t);
    } else {
      t.set_requires_grad(false);
      (linears && lora::quantized_weight(n, *linears) ? u.quantized : u.frozen).emplace_back(n, t);
    }
  }
  return u;
}
}  // namespace

train::CausalLm make_causal_lm(const model::ModelConfig& cfg, const lora::Options& lora, bool varlen_attention) {
  const model::ModelSpec* spec = &cfg.spec();
  std::shared_ptr<model::CausalLmModule> m = spec->build(cfg, torch::kMeta);
  if (lora.enabled()) spec->add_lora(*m, lora);
  train::CausalLm lm;
  const std::vector<lora::TargetShape> linears = lora.quantized() ? spec->lora_targets(cfg) : std::vector<lora::TargetShape>{};
  const auto* q = lora.quantized() ? &linears : nullptr;
  lm.units.push_back(split_unit("root", m->root_parameters(), lora.enabled(), q));
  for (int64_t i = 0; i < m->num_layers(); ++i)
    lm.units.push_back(split_unit("model.layers." + std::to_string(i), m->layer_parameters(i), lora.enabled(), q));
  model::CausalLmModule* impl = m.get();
  // The current micro-batch's layout (packed documents): set before its forward, read by every
  // layer call of that micro-batch, including the activation-checkpointing recompute in backward.
  auto layout = std::make_shared<model::TokenLayout>();
  layout->varlen = varlen_attention;
  lm.embed = [impl](const at::Tensor& tokens) { return impl->embed(tokens); };
  lm.layer = [impl, layout](int64_t i, const at::Tensor& h) { return impl->layer_forward(i, h, *layout); };
  lm.set_layout = [layout](const train::BatchLayout& c) {
    layout->position_ids = c.position_ids;
    layout->document_ids = c.document_ids;
    layout->cu_seqlens = c.cu_seqlens;
    layout->max_seqlen = c.max_seqlen;
    layout->cache.reset();
  };
  // The generation's KV cache, kept between set_cache calls of the same capacity.
  auto kept = std::make_shared<std::shared_ptr<model::KvCache>>();
  lm.set_cache = [layout, kept, layers = m->num_layers(), varlen_attention](int64_t capacity, int64_t start) {
    *layout = model::TokenLayout{};
    layout->varlen = varlen_attention;
    if (capacity <= 0) return kept->reset();
    if (!*kept || (*kept)->capacity != capacity) *kept = std::make_shared<model::KvCache>(layers, capacity);
    if (start < 0) return;  // kept, unused by the next forwards
    (*kept)->start = start;
    layout->cache = *kept;
  };
  lm.head = [impl](const at::Tensor& h) { return impl->head(h); };
  lm.head_loss = [impl](const at::Tensor& h, const at::Tensor& labels, double grad_scale, bool device_rows) {
    model::HeadLoss how;
    how.ignore_index = data::Batch::kIgnore;
    how.grad_scale = grad_scale;
    how.device_rows = device_rows;
    return impl->head_loss(h, labels, how);
  };
  lm.set_training = [impl](bool training) { impl->train(training); };
  lm.decay = [spec](const std::string& name) { return spec->decays(name); };
  lm.flops_per_token = [cfg, spec](int64_t seq_len) { return spec->train_flops_per_token(cfg, seq_len); };
  lm.keep_alive = m;
  return with_test_seams(std::move(lm));  // test binaries' fault decorators (test_seams.h); else unchanged
}

planner::ModelShape memory_shape(const model::ModelConfig& cfg, const lora::Options& lora) {
  planner::ModelShape s;
  if (lora.enabled()) {  // the adapters are what trains; the base is frozen (planner::ModelShape)
    const std::vector<lora::TargetShape> linears = lora.quantized() ? cfg.spec().lora_targets(cfg) : std::vector<lora::TargetShape>{};
    for (const model::UnitSpec& u : model::unit_specs(cfg)) {
      s.frozen.emplace_back();
      s.quantized.emplace_back();
      for (const model::TensorSpec& t : u.tensors)
        (lora::quantized_weight(t.name, linears) ? s.quantized : s.frozen).back().emplace_back(t.name, t.shape);
    }
    for (const model::UnitSpec& u : model::lora_unit_specs(cfg, lora)) {
      s.units.emplace_back();
      for (const model::TensorSpec& t : u.tensors) s.units.back().emplace_back(t.name, t.shape), s.parameters += t.numel();
    }
    return s;
  }
  const std::vector<model::UnitSpec> units = model::unit_specs(cfg);
  for (size_t u = 0; u < units.size(); ++u) {
    s.units.emplace_back();
    for (const model::TensorSpec& t : units[u].tensors) {
      s.units.back().emplace_back(t.name, t.shape);
      s.parameters += t.numel();
      // Root tensors other than the embedding belong to the head (final norm, lm_head); a tied
      // embedding is the embedding's tensor and counted there.
      if (u == 0) s.root_param_in_head.push_back(t.name.rfind("model.embed_tokens", 0) != 0);
    }
  }
  return s;
}

planner::ActivationTerms activation_terms(const model::ModelConfig& cfg, int64_t B, int64_t T, int elem,
                                               model::Kernels kernels, bool frozen_head) {
  const model::ActivationBytes a = model::activation_bytes(cfg, B, T, elem, kernels, frozen_head);
  planner::ActivationTerms t;
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
    cached_ = spec_->init_tensor({name, shape}, seed_).contiguous();
    cached_name_ = name;
  }
  TESSERA_CHECK(offset + count <= cached_.numel(), "slice out of range for " + name);
  std::memcpy(dst, cached_.data_ptr<float>() + offset, count * sizeof(float));
}

void AdapterInitSource::read(const std::string& name, const std::vector<int64_t>& shape, int64_t offset,
                             int64_t count, float* dst) {
  if (!lora::is_adapter(name)) return base_->read(name, shape, offset, count, dst);
  if (name != cached_name_) {
    cached_ = (start_ ? start_(name, shape).to(at::kFloat) : lora::init_adapter(name, shape, seed_)).contiguous();
    cached_name_ = name;
  }
  TESSERA_CHECK(offset + count <= cached_.numel(), "slice out of range for " + name);
  std::memcpy(dst, cached_.data_ptr<float>() + offset, count * sizeof(float));
}

at::Tensor AdapterInitSource::view(const std::string& name, int64_t offset, int64_t count) {
  return lora::is_adapter(name) ? at::Tensor() : base_->view(name, offset, count);
}

void AdapterInitSource::release(const std::string& name, int64_t offset, int64_t count) {
  if (!lora::is_adapter(name)) base_->release(name, offset, count);
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
