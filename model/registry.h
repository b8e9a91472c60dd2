// The model registry: one ModelSpec per model family. train, eval, init-model, ckpt and the
// benchmarks ask it (through ModelConfig::spec()) for everything family-specific: config.json
// parsing and validation, presets, the module on the meta device, tensor names and shapes, the
// weight-decay rule, the initialisation and the FLOPs per token. The runtime never learns a
// family's name: launcher/model_lm.h turns a CausalLmModule into a train::CausalLm.
//
// Families: "llama" (model_type llama: Llama 2, Llama 3 / 3.1 / 3.2 / 3.3), "mistral" (model_type
// mistral: Mistral 7B v0.1 - v0.3), "qwen2" (Qwen2, Qwen2.5) and "qwen3" (Qwen3 dense). Adding one = a model/<family>.cpp defining
// `const ModelSpec& <family>_family()` plus its line in registry.cpp's TESSERA_MODEL_FAMILIES.
//
// Sizes without building anything (e.g. a memory planner):
//   ModelConfig c = ModelConfig::preset("llama3-70b");          // or ModelConfig::load("dir/config.json")
//   c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim(),
//   c.intermediate_size, c.vocab_size, c.tie_word_embeddings, c.sliding_window, c.qkv_bias, c.o_bias,
//   c.qk_norm, c.num_parameters()
//   std::vector<UnitSpec> units = unit_specs(c);   // [0] root, [1 + i] decoder layer i: names + shapes
// unit_specs is arithmetic (no module, no tensor); a test checks it equals the meta-device module's
// parameters for every preset.
#pragma once
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"
#include "model/lora.h"
#include "model/safetensors.h"  // TensorSpec

namespace tessera::model {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// One FSDP unit's tensors: "root" (embeddings, final norm, head when untied) or "model.layers.{i}".
// A tied embedding is one tensor in the root unit, used by both the embedding and the head.
struct UnitSpec {
  std::string name;
  std::vector<TensorSpec> tensors;
  int64_t numel() const;
};

// How the tokens of a batch [B, T] are laid out when several documents are packed into one row:
// position_ids [B, T] (RoPE positions, restarting at 0 for each document) and document_ids [B, T]
// (a token attends only to earlier tokens of its own document). Undefined tensors (the default):
// one document per row at positions 0..T-1, i.e. plain causal attention.
//
// With a KvCache (generation), a layer call's tokens [B, T] are positions start .. start + T - 1 of
// rows whose earlier positions' keys and values the cache holds: each layer writes its new keys and
// values there and attends to positions 0 .. start + T - 1. Not combined with packed documents.
struct KvCache;
struct TokenLayout {
  torch::Tensor position_ids, document_ids;
  std::shared_ptr<KvCache> cache;  // null: no cache (training, evaluation)
  // Packed rows for the variable-length attention kernel (ops::varlen_attention): the first token of
  // each document in the B x T tokens taken row by row, then B x T (int32, the tokens' device), and
  // the longest document. Undefined: the kernel is not used (the mask of document_ids is).
  torch::Tensor cu_seqlens;
  int64_t max_seqlen = 0;
  // Packed rows and sliding windows may take the variable-length kernel where it runs
  // (model.varlen_attention); false: the masked path.
  bool varlen = true;
  bool packed() const { return document_ids.defined(); }
};

// Keys and values of the positions a generation has run so far, per decoder layer, each
// [B, kv_heads, capacity, head_dim] in the layer's compute dtype and device: allocated once, by the
// first layer call that writes it, for `capacity` positions (the longest prompt plus the tokens to
// generate). The caller sets `start` before each forward (0 for a prompt's prefill, then the number
// of positions already in the cache): every layer of that forward reads and writes the same slots.
struct KvCache {
  KvCache(int64_t layers, int64_t capacity_) : capacity(capacity_), keys(layers), values(layers) {}
  int64_t capacity;
  int64_t start = 0;
  std::vector<torch::Tensor> keys, values;
  // Writes layer i's k, v [B, kv_heads, T, D] at positions start .. start + T - 1 and returns the
  // keys and values of positions 0 .. start + T - 1 (views of the cache).
  std::pair<torch::Tensor, torch::Tensor> append(int64_t layer, const torch::Tensor& k, const torch::Tensor& v);
  int64_t bytes() const;  // allocated so far
};

// What a family's module offers a runtime: layer-wise callables over Hugging Face-named parameters.
// Built on torch::kMeta it allocates nothing; a runtime swaps parameter storage (set_data) per unit.
// No module caches anything derived from its parameters or buffers (RoPE tables are computed per
// call), so nothing has to be recomputed after a meta-device build.
// How a model's head computes its loss (CausalLmModule::head_loss).
struct HeadLoss {
  int64_t ignore_index = -100;
  // The loss scale backward will carry (fp16 loss scaling; see linear_cross_entropy.h): a hint a
  // fused head uses to keep small gradients. The result is the same whatever it is.
  double grad_scale = 1.0;
  // Skip ignored rows as on a GPU (by weight, without nonzero()) even on the CPU: the trainer's
  // device_step, which runs the GPU's step on a CPU.
  bool device_rows = false;
};

class CausalLmModule : public torch::nn::Module {
 public:
  virtual int64_t num_layers() const = 0;
  virtual torch::Tensor embed(const torch::Tensor& tokens) = 0;                 // [B, T] int64 -> [B, T, H]
  // Decoder layer i, [B, T, H] -> [B, T, H], RoPE and attention per `layout` (TokenLayout).
  virtual torch::Tensor layer_forward(int64_t i, const torch::Tensor& h, const TokenLayout& layout) = 0;
  virtual torch::Tensor head(const torch::Tensor& h) = 0;                       // -> logits [B, T, V]
  // The summed cross entropy of head(h) against labels [B, T] (int64; ignore_index rows skipped),
  // 0-dim fp32. This one forms the logits and calls cross_entropy; a family may fuse the two
  // (Llama: ops::linear_cross_entropy, without the logits). HeadLoss says how (its defaults: -100
  // ignored, no loss scale, the device's own way of skipping ignored rows).
  virtual torch::Tensor head_loss(const torch::Tensor& h, const torch::Tensor& labels, const HeadLoss& how);
  torch::Tensor head_loss(const torch::Tensor& h, const torch::Tensor& labels, int64_t ignore_index) {
    HeadLoss how;
    how.ignore_index = ignore_index;
    return head_loss(h, labels, how);
  }
  virtual NamedTensors root_parameters() = 0;                                   // unit 0
  virtual NamedTensors layer_parameters(int64_t i) = 0;                         // unit 1 + i
  torch::Tensor forward(const torch::Tensor& tokens, const TokenLayout& layout = {});  // head(layers(embed(tokens)))
  NamedTensors named_hf_parameters();                  // every parameter once, HF names, file order
};

struct Preset {
  std::string name;
  ModelConfig config;
};

class ModelSpec {
 public:
  virtual ~ModelSpec() = default;
  virtual std::string family() const = 0;                    // "llama", "mistral", "qwen2", "qwen3"
  virtual std::vector<std::string> model_types() const = 0;  // config.json model_type values it reads
  virtual std::vector<Preset> presets() const = 0;           // in size order
  // config.json content -> validated config; ModelError "<source>: <key> ..." on bad input.
  virtual ModelConfig from_json(const nlohmann::json& j, const std::string& source) const = 0;
  virtual nlohmann::json to_json(const ModelConfig& c) const = 0;  // round-trips through from_json
  // The family's own checks (ModelConfig::validate runs the generic ones first).
  virtual void validate(const ModelConfig& c, const std::string& source) const = 0;
  // Tensors per FSDP unit ([0] root, [1 + i] layer i) and in checkpoint file order; arithmetic.
  virtual std::vector<UnitSpec> unit_specs(const ModelConfig& c) const = 0;
  virtual std::vector<TensorSpec> tensor_specs(const ModelConfig& c) const = 0;
  // The module (torch::kMeta: shapes only). Its parameters are exactly unit_specs(c).
  virtual std::shared_ptr<CausalLmModule> build(const ModelConfig& c, torch::Device device,
                                                torch::Dtype dtype = torch::kFloat32) const = 0;
  virtual bool decays(const std::string& hf_name) const = 0;  // AdamW weight decay applies
  // Initial value of one tensor (fp32, CPU), a pure function of (spec, seed): any order, any rank.
  virtual torch::Tensor init_tensor(const TensorSpec& spec, uint64_t seed) const = 0;
  // Training FLOPs per token for MFU (PaLM / torchtitan count; see the family's header).
  virtual double train_flops_per_token(const ModelConfig& c, int64_t seq_len) const = 0;
  // LoRA (model/lora.h): the Linear modules of a decoder layer an adapter may target (name, its
  // path in the layer, sizes), in the layer's module order.
  virtual std::vector<lora::TargetShape> lora_targets(const ModelConfig& c) const = 0;
  // Gives each targeted Linear of every decoder layer of `m` (built by build()) its adapters, on
  // the module's device and dtype. `o` is enabled and validated (lora::validate with the model).
  virtual void add_lora(CausalLmModule& m, const lora::Options& o) const = 0;
};

// The adapters' names and shapes per unit, arithmetic like unit_specs ([0] root: none, [1 + i]
// decoder layer i: for each target in the layer's module order, its lora_A [r, in] then lora_B
// [out, r]); the order in which the adapted module's parameters list them.
std::vector<UnitSpec> lora_unit_specs(const ModelConfig& c, const lora::Options& o);

// Every registered family, in registration order.
const std::vector<const ModelSpec*>& model_families();
// The family reading `model_type`; ModelError "<source>: model_type \"x\" is not supported
// (supported: llama, mistral, qwen2, qwen3)".
const ModelSpec& family_for(const std::string& model_type, const std::string& source);

// Shorthands: cfg.spec().unit_specs(cfg) / tensor_specs(cfg) / unit i + 1's tensors.
std::vector<UnitSpec> unit_specs(const ModelConfig& cfg);
std::vector<TensorSpec> hf_tensor_specs(const ModelConfig& cfg);
std::vector<TensorSpec> hf_layer_specs(const ModelConfig& cfg, int64_t i);

}  // namespace tessera::model
