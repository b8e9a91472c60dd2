// Llama 2 (Hugging Face LlamaForCausalLM semantics) as LibTorch modules.
//
// The module tree mirrors Hugging Face's, so named_parameters() ARE the Hugging Face tensor names
// ("model.embed_tokens.weight", "model.layers.3.self_attn.q_proj.weight", "lm_head.weight"): the
// name mapping lives in this module structure and nowhere else (hf_tensor_specs derives from it).
//
// Parameters are created with torch::empty on the requested device, so on torch::kMeta nothing is
// allocated (a 70B model is ~700 shape-only tensors). Decoder layers are independent callables:
// a runtime can materialise, shard or swap (param.set_data) one layer's parameters at a time and
// call layer(i)->forward(h) itself; no module caches anything derived from its parameters.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"
#include "model/safetensors.h"

namespace tessera::model {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// The math, as free functions (also what the modules call).
namespace ops {
// HF LlamaRMSNorm: x / sqrt(mean(x^2) + eps) computed in fp32, cast back to x's dtype, times weight.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
// cos/sin tables [T, head_dim] for positions 0..T-1 (fp32 math, then cast to dtype):
// angle(p, j) = p * theta^(-2(j mod head_dim/2)/head_dim), HF rotate-half layout (halves repeated).
std::pair<torch::Tensor, torch::Tensor> rotary_tables(int64_t T, int64_t head_dim, double theta,
                                                      torch::Dtype dtype, torch::Device device);
// The same angles at given positions: position_ids [B, T] int64 -> cos/sin [B, 1, T, head_dim]
// (rows of rotary_tables(max position + 1, ...), so both agree bit for bit).
std::pair<torch::Tensor, torch::Tensor> rotary_tables_at(const torch::Tensor& position_ids, int64_t head_dim,
                                                         double theta, torch::Dtype dtype);
// x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1); x is [..., T, head_dim].
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
// [B, kv_heads, T, D] -> [B, kv_heads * n_rep, T, D]; query head h uses KV head h / n_rep.
torch::Tensor repeat_kv(const torch::Tensor& x, int64_t n_rep);
// Causal softmax(q k^T / sqrt(D)) v for q, k, v [B, H, T, D] (same H): scaled_dot_product_attention
// when LibTorch has it, else explicit (softmax in fp32). With document_ids [B, T] (packed
// sequences), token i also attends to token j <= i only when both belong to the same document: an
// explicit block-diagonal causal mask [B, 1, T, T] (one byte per pair, shared by the heads), built
// per call. Without it, the plain causal mask [T, T].
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& document_ids = {});
// down(silu(x gate^T) * (x up^T)) with weights in [out, in] layout.
torch::Tensor swiglu(const torch::Tensor& x, const torch::Tensor& gate, const torch::Tensor& up,
                     const torch::Tensor& down);
}  // namespace ops

// y = x W^T, W [out, in], no bias.
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in, int64_t out, const torch::TensorOptions& opts);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
};
TORCH_MODULE(Linear);

class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t vocab, int64_t hidden, const torch::TensorOptions& opts);
  torch::Tensor forward(const torch::Tensor& tokens);
  torch::Tensor weight;
};
TORCH_MODULE(Embedding);

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t hidden, double eps, const torch::TensorOptions& opts);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

// How the tokens of a batch [B, T] are laid out when several documents are packed into one row:
// position_ids [B, T] (RoPE positions, restarting at 0 for each document) and document_ids [B, T]
// (a token attends only to earlier tokens of its own document). Undefined tensors (the default):
// one document per row at positions 0..T-1, i.e. plain causal attention.
struct TokenLayout {
  torch::Tensor position_ids, document_ids;
  bool packed() const { return document_ids.defined(); }
};

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const LlamaConfig& cfg, const torch::TensorOptions& opts);
  // [B, T, H] -> [B, T, H], causal, RoPE at 0..T-1 (or at layout's positions, within its documents).
  torch::Tensor forward(const torch::Tensor& x, const TokenLayout& layout = {});
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  int64_t num_heads, num_kv_heads, head_dim;
  double rope_theta;
};
TORCH_MODULE(Attention);

class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(const LlamaConfig& cfg, const torch::TensorOptions& opts);
  torch::Tensor forward(const torch::Tensor& x);
  Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Mlp);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const LlamaConfig& cfg, const torch::TensorOptions& opts);
  // h + attn(norm1(h)), then + mlp(norm2(.)): the whole decoder layer, [B, T, H] -> [B, T, H].
  torch::Tensor forward(const torch::Tensor& h, const TokenLayout& layout = {});
  Attention self_attn{nullptr};
  Mlp mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(DecoderLayer);

// HF's LlamaModel: the "model." prefix of the tensor names.
class LlamaModelImpl : public torch::nn::Module {
 public:
  LlamaModelImpl(const LlamaConfig& cfg, const torch::TensorOptions& opts);
  Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  std::vector<DecoderLayer> layer_list;  // same modules as `layers`, typed
  RMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaModel);

class LlamaImpl : public torch::nn::Module {
 public:
  explicit LlamaImpl(const LlamaConfig& cfg, torch::Device device = torch::kCPU,
                     torch::Dtype dtype = torch::kFloat32);

  const LlamaConfig& config() const { return cfg_; }
  torch::Tensor embed(const torch::Tensor& tokens);  // [B, T] int64 -> [B, T, H]
  int64_t num_layers() const { return (int64_t)model->layer_list.size(); }
  DecoderLayer& layer(int64_t i);
  torch::Tensor head(const torch::Tensor& h);        // final norm + lm_head -> logits [B, T, V]
  torch::Tensor forward(const torch::Tensor& tokens, const TokenLayout& layout = {});  // head(layers(embed(tokens)))

  // HF-named parameters. Roots: model.embed_tokens.weight, model.norm.weight and lm_head.weight
  // (absent when tie_word_embeddings: the head then uses the embedding weight).
  NamedTensors root_parameters();
  NamedTensors layer_parameters(int64_t i);  // model.layers.{i}.*
  NamedTensors named_hf_parameters();        // embed, layers 0..L-1, norm, lm_head (file order)

  LlamaModel model{nullptr};
  Linear lm_head{nullptr};  // null when tied

 private:
  LlamaConfig cfg_;
};
TORCH_MODULE(Llama);

// Every tensor of a checkpoint for `cfg`, HF names and shapes, in file order (embed, layers,
// norm, lm_head). Built from a meta-device Llama, so it cannot disagree with the modules.
std::vector<TensorSpec> hf_tensor_specs(const LlamaConfig& cfg);
// The specs of decoder layer i only ("model.layers.{i}.*").
std::vector<TensorSpec> hf_layer_specs(const LlamaConfig& cfg, int64_t i);
// True for RMSNorm weights (input_layernorm, post_attention_layernorm, model.norm): excluded from
// weight decay and initialised to 1.
bool is_norm_weight(const std::string& hf_name);

// Llama initialisation of one tensor, fp32 on CPU: norms = 1, everything else N(0, 0.02). The
// random stream depends only on (seed, name), so layers can be initialised one at a time, in any
// order, on any rank, and init-model and init_weights agree bit for bit.
torch::Tensor init_tensor(const TensorSpec& spec, uint64_t seed);
// Fills the given tensors (copying init_tensor into each, converting dtype).
void init_parameters(const NamedTensors& params, uint64_t seed);
// init_parameters(model->named_hf_parameters(), seed).
void init_weights(Llama& model, uint64_t seed);

}  // namespace tessera::model
