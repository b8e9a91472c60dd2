// The Llama decoder (Hugging Face LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM /
// Qwen3ForCausalLM semantics) as LibTorch modules, and LlamaArchitecture, the ModelSpec base every
// family built from these modules shares (model/llama_family.cpp: Llama 2 and 3.x; model/mistral.cpp:
// Mistral; model/qwen.cpp: Qwen2 / 2.5 and Qwen3). Llama 3.x adds RoPE frequency scaling (rope_scaling
// type llama3) and tied embeddings, Mistral v0.1 a sliding window, Qwen2 biases on q/k/v, Qwen3 an
// RMSNorm per query/key head and a head_dim of its own; all are values of ModelConfig, so one module
// tree serves them all.
//
// The module tree mirrors Hugging Face's, so named_parameters() ARE the Hugging Face tensor names
// ("model.embed_tokens.weight", "model.layers.3.self_attn.q_proj.weight", "lm_head.weight").
// LlamaArchitecture::unit_specs states the same names and shapes by arithmetic; a test checks the
// two agree for every preset.
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
#include "model/lora.h"
#include "model/registry.h"
#include "model/safetensors.h"

namespace tessera::model {

// The math, as free functions (also what the modules call).
namespace ops {
// HF LlamaRMSNorm: x / sqrt(mean(x^2) + eps) computed in fp32, cast back to x's dtype, times weight.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
// RoPE inverse frequencies [head_dim / 2], fp32: f_i = theta^(-2i/head_dim), then, for
// rope_scaling type llama3 (Hugging Face's _compute_llama3_parameters, Meta's apply_scaling), with
// old context C = original_max_position_embeddings, factor s, low/high frequency factors lo/hi and
// wavelength w = 2 pi / f_i: w < C/hi keeps f_i; w > C/lo gives f_i / s; in between, with
// m = (C/w - lo) / (hi - lo), (1 - m) f_i / s + m f_i. Computed in fp64, rounded once to fp32.
torch::Tensor rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling, torch::Device device);
// cos/sin tables [T, head_dim] for positions 0..T-1 (fp32 math, then cast to dtype):
// angle(p, j) = p * f_(j mod head_dim/2) (rope_inv_freq), HF rotate-half layout (halves repeated).
std::pair<torch::Tensor, torch::Tensor> rotary_tables(int64_t T, int64_t head_dim, double theta,
                                                      torch::Dtype dtype, torch::Device device,
                                                      const RopeScaling& scaling = {});
// The same angles at given positions: position_ids [B, T] int64 -> cos/sin [B, 1, T, head_dim]
// (rows of rotary_tables(max position + 1, ...), so both agree bit for bit).
std::pair<torch::Tensor, torch::Tensor> rotary_tables_at(const torch::Tensor& position_ids, int64_t head_dim,
                                                         double theta, torch::Dtype dtype,
                                                         const RopeScaling& scaling = {});
// x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1); x is [..., T, head_dim].
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
// [B, kv_heads, T, D] -> [B, kv_heads * n_rep, T, D]; query head h uses KV head h / n_rep.
torch::Tensor repeat_kv(const torch::Tensor& x, int64_t n_rep);
// Causal softmax(q k^T / sqrt(D)) v for q, k, v [B, H, T, D] (same H): scaled_dot_product_attention
// when LibTorch has it, else explicit (softmax in fp32). window > 0: sliding window, query t sees
// keys t - window + 1 .. t only (Hugging Face's Mistral mask); 0: every earlier key. With
// document_ids [B, T] (packed sequences), token i also attends to token j <= i only when both
// belong to the same document: an explicit block-diagonal causal mask [B, 1, T, T] (one byte per
// pair, shared by the heads; the window applies within it), built per call. offset > 0 (a KV
// cache): the T queries are positions offset .. offset + T - 1 of the S = offset + T keys, query t
// sees keys 0 .. offset + t (within the window).
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               int64_t window = 0, const torch::Tensor& document_ids = {}, int64_t offset = 0);
// Causal attention within each document of q [N, nh, D] and k, v [N, nkv, D] (nkv dividing nh), the
// documents' rows at cu_seqlens (TokenLayout::cu_seqlens; max_seqlen the longest), with window > 0
// over each query's last `window` keys only: FlashAttention's variable-length kernel where
// varlen_kernel_runs (compat::flash_varlen), else the reference -- causal_attention on each
// document's rows, K and V repeated -- that the CPU build tests the kernel's contract with.
// Returns [N, nh, D].
torch::Tensor varlen_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& cu_seqlens, int64_t max_seqlen, int64_t window = 0);
// Whether the kernel runs for queries like q: LibTorch >= 2.6 on a CUDA device, bf16/fp16, head_dim
// a multiple of 8 up to 256. Attention then takes packed rows and sliding windows there.
bool varlen_kernel_runs(const torch::Tensor& q);
// Why it would not run on a CUDA device for compute in `dtype` with this head_dim ("" when it runs):
// what `tessera train` refuses at start where a GPU run would otherwise take the masked path.
std::string varlen_kernel_unavailable(torch::Dtype dtype, int64_t head_dim);
// residual + x W^T as one GEMM whose epilogue adds the residual (at::addmm, beta 1: cuBLAS reads the
// residual into its fp32 accumulator and rounds once) when `epilogue`; else the product, then the sum.
// The model asks for the epilogue on a device (the CPU keeps its product and sum, widened bf16
// products included); the CPU build tests the two against each other.
torch::Tensor linear_plus(const torch::Tensor& residual, const torch::Tensor& x, const torch::Tensor& w, bool epilogue);
// down(silu(x gate^T) * (x up^T)) with weights in [out, in] layout; plus `residual` when given
// (linear_plus on a device).
torch::Tensor swiglu(const torch::Tensor& x, const torch::Tensor& gate, const torch::Tensor& up,
                     const torch::Tensor& down, const torch::Tensor& residual = {});
}  // namespace ops

// A module of one parameter, "weight" (Hugging Face's name), of the given shape: what Linear,
// Embedding and RMSNorm hold; they differ in its shape and in forward.
class WeightImpl : public torch::nn::Module {
 public:
  WeightImpl(at::IntArrayRef shape, const torch::TensorOptions& opts);
  torch::Tensor weight;
};

// y = x W^T (+ b), W [out, in]; with_bias adds the parameter "bias" [out] (Qwen's attention).
// With LoRA adapters (add_lora, model/lora.h): y += scale * B(A(dropout(x))), dropout only while the
// module is in training mode (torch::nn::Module::is_training, the default).
struct LinearImpl : WeightImpl {
  LinearImpl(int64_t in, int64_t out, const torch::TensorOptions& opts, bool with_bias = false);
  torch::Tensor forward(const torch::Tensor& x);
  // residual + forward(x), on a device with the residual added in the GEMM's epilogue (ops::linear_plus)
  // where this Linear has neither bias nor LoRA.
  torch::Tensor forward_plus(const torch::Tensor& x, const torch::Tensor& residual);
  // Registers the submodules lora_A (weight [rank, in]) and lora_B (weight [out, rank]) on weight's
  // device and dtype (uninitialised: the caller loads them; lora::init_adapter has PEFT's values).
  void add_lora(int64_t rank, double scale, double dropout);
  bool has_lora() const { return lora_A != nullptr; }
  torch::Tensor bias;  // undefined without one
  std::shared_ptr<WeightImpl> lora_A, lora_B;  // null without LoRA
  double lora_scale = 0, lora_dropout = 0;
};
TORCH_MODULE(Linear);

// The rows of W [vocab, hidden] that the token ids name.
struct EmbeddingImpl : WeightImpl {
  EmbeddingImpl(int64_t vocab, int64_t hidden, const torch::TensorOptions& opts) : WeightImpl({vocab, hidden}, opts) {}
  torch::Tensor forward(const torch::Tensor& tokens);
};
TORCH_MODULE(Embedding);

// ops::rms_norm with W [hidden] and eps.
struct RMSNormImpl : WeightImpl {
  RMSNormImpl(int64_t hidden, double eps_, const torch::TensorOptions& opts) : WeightImpl({hidden}, opts), eps(eps_) {}
  torch::Tensor forward(const torch::Tensor& x);
  double eps;
};
TORCH_MODULE(RMSNorm);

// The cos/sin tables of one model's layers (ops::rotary_tables), built once per (length, dtype,
// device) and shared by them: after the first layer call of a shape, a layer's RoPE does no host
// work, no host -> device copy and no allocation (activation checkpointing's recompute included).
// Packed rows read the rows of the length-T table at their positions, which restart per document
// and so are < T: no max() read back to the host. Thread-safe (the recompute of backward may run on
// autograd's device thread).
class RotaryCache {
 public:
  RotaryCache(int64_t head_dim, double theta, RopeScaling scaling);
  std::pair<torch::Tensor, torch::Tensor> tables(int64_t T, torch::Dtype dtype, torch::Device device);
  // position_ids [B, T] int64, each < T -> cos/sin [B, 1, T, head_dim] (rows of tables(T)).
  std::pair<torch::Tensor, torch::Tensor> at(const torch::Tensor& position_ids, torch::Dtype dtype);

 private:
  struct Entry {
    int64_t T;
    torch::Dtype dtype;
    torch::Device device;
    torch::Tensor cos, sin;
  };
  int64_t head_dim_;
  double theta_;
  RopeScaling scaling_;
  std::mutex mu_;
  std::vector<Entry> entries_;
};

class AttentionImpl : public torch::nn::Module {
 public:
  // rope: the model's shared tables (null: this module keeps its own).
  AttentionImpl(const ModelConfig& cfg, const torch::TensorOptions& opts, std::shared_ptr<RotaryCache> rope = nullptr);
  // [B, T, H] -> [B, T, H], causal, RoPE at 0..T-1 (or at layout's positions, within its documents;
  // or, with layout.cache, at cache->start .. + T - 1, attending to the cached keys too).
  // Qwen3's q_norm / k_norm, when the config has them, normalise each head before RoPE.
  // o_proj's output plus `residual` when given (the decoder layer's residual stream, added in o_proj's
  // epilogue on a device).
  torch::Tensor forward(const torch::Tensor& x, const TokenLayout& layout = {}, const torch::Tensor& residual = {});
  std::vector<torch::Tensor> project(const torch::Tensor& x);  // q, k, v [B, T, features]
  torch::Tensor varlen(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const TokenLayout& layout) const;
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // [head_dim] each; null unless cfg.qk_norm
  int64_t num_heads, num_kv_heads, head_dim;
  double rope_theta;
  RopeScaling rope_scaling;
  int64_t sliding_window;  // 0: plain causal
  std::shared_ptr<RotaryCache> rope;
  int64_t layer_index = 0;  // its decoder layer: which layer of a KvCache it uses
};
TORCH_MODULE(Attention);

class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(const ModelConfig& cfg, const torch::TensorOptions& opts);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& residual = {});  // + residual (down_proj's epilogue)
  Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Mlp);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const ModelConfig& cfg, const torch::TensorOptions& opts, std::shared_ptr<RotaryCache> rope = nullptr);
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
  LlamaModelImpl(const ModelConfig& cfg, const torch::TensorOptions& opts);
  Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  std::vector<DecoderLayer> layer_list;  // same modules as `layers`, typed
  RMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaModel);

class LlamaImpl : public CausalLmModule {
 public:
  explicit LlamaImpl(const ModelConfig& cfg, torch::Device device = torch::kCPU,
                     torch::Dtype dtype = torch::kFloat32);

  const ModelConfig& config() const { return cfg_; }
  torch::Tensor embed(const torch::Tensor& tokens) override;  // [B, T] int64 -> [B, T, H]
  int64_t num_layers() const override { return (int64_t)model->layer_list.size(); }
  DecoderLayer& layer(int64_t i);
  torch::Tensor layer_forward(int64_t i, const torch::Tensor& h, const TokenLayout& layout) override {
    return layer(i)->forward(h, layout);
  }
  torch::Tensor head(const torch::Tensor& h) override;  // final norm + lm_head -> logits [B, T, V]
  // Final norm, then ops::linear_cross_entropy with the head's (or the tied embedding's) weight.
  using CausalLmModule::head_loss;
  torch::Tensor head_loss(const torch::Tensor& h, const torch::Tensor& labels, const HeadLoss& how) override;

  // HF-named parameters. Roots: model.embed_tokens.weight, model.norm.weight and lm_head.weight
  // (absent when tie_word_embeddings: the head then multiplies by the embedding weight, which is
  // one tensor of the root unit, so it is sharded, saved and written once).
  NamedTensors root_parameters() override;
  NamedTensors layer_parameters(int64_t i) override;  // model.layers.{i}.*

  LlamaModel model{nullptr};
  Linear lm_head{nullptr};  // null when tied

 private:
  ModelConfig cfg_;
};
TORCH_MODULE(Llama);

// True for RMSNorm weights (input_layernorm, post_attention_layernorm, model.norm, Qwen3's
// self_attn.q_norm / k_norm): excluded from weight decay and initialised to 1.
bool is_norm_weight(const std::string& hf_name);
// True for biases ("*.bias": Qwen's q/k/v): excluded from weight decay (as Hugging Face's Trainer
// does) and initialised to 0.
bool is_bias(const std::string& hf_name);

// Llama initialisation of one tensor, fp32 on CPU: norms = 1, biases = 0, everything else N(0, 0.02)
// (Hugging Face's _init_weights with initializer_range 0.02). The
// random stream depends only on (seed, name), so layers can be initialised one at a time, in any
// order, on any rank, and init-model and init_weights agree bit for bit.
torch::Tensor init_tensor(const TensorSpec& spec, uint64_t seed);
// The seed of tensor `name`'s random stream: splitmix64 over (seed, FNV-1a(name)) (init_tensor's,
// and LoRA's adapters', model/lora.h).
uint64_t tensor_seed(uint64_t seed, const std::string& name);
// Fills the given tensors (copying init_tensor into each, converting dtype).
void init_parameters(const NamedTensors& params, uint64_t seed);
// init_parameters(model.named_hf_parameters(), seed).
void init_weights(CausalLmModule& model, uint64_t seed);
inline void init_weights(Llama& model, uint64_t seed) { init_weights(*model, seed); }

// The ModelSpec of every family built from these modules: names and shapes, meta construction,
// decay rule (no decay on norm weights), initialisation, FLOPs, and config.json's frame (the keys
// every family shares, model_type = family(), architectures = [architecture()]). A family derives
// from it and adds its name, model_type(s), presets and its own config.json keys.
class LlamaArchitecture : public ModelSpec {
 public:
  ModelConfig from_json(const nlohmann::json& j, const std::string& source) const final;
  nlohmann::json to_json(const ModelConfig& c) const final;
  std::vector<UnitSpec> unit_specs(const ModelConfig& c) const override;
  // File order: embed, layers 0..L-1, norm, lm_head (absent when tied).
  std::vector<TensorSpec> tensor_specs(const ModelConfig& c) const override;
  std::shared_ptr<CausalLmModule> build(const ModelConfig& c, torch::Device device,
                                        torch::Dtype dtype = torch::kFloat32) const override;
  bool decays(const std::string& hf_name) const override { return !is_norm_weight(hf_name) && !is_bias(hf_name); }
  // q_proj, k_proj, v_proj, o_proj (self_attn.*), gate_proj, up_proj, down_proj (mlp.*).
  std::vector<lora::TargetShape> lora_targets(const ModelConfig& c) const override;
  void add_lora(CausalLmModule& m, const lora::Options& o) const override;
  torch::Tensor init_tensor(const TensorSpec& spec, uint64_t seed) const override;
  // 6 (forward 2 + backward 4 per multiply-add) x the weights every token is multiplied by (q, k,
  // v, o, gate, up, down and the head, tied or not; not the embedding lookup nor the norms) + 12 x
  // layers x hidden x the keys a query sees: seq_len, or the sliding window when smaller (causal
  // mask not discounted, as PaLM and torchtitan count).
  double train_flops_per_token(const ModelConfig& c, int64_t seq_len) const override;

 protected:
  virtual std::string architecture() const = 0;  // config.json "architectures": "LlamaForCausalLM"
  // The family's own config.json keys, into a config read_common_keys has filled (ModelError
  // "<source>: <key> ..." on bad input) / into a config.json common_keys_json has written.
  virtual void read_family_keys(const nlohmann::json& j, const std::string& source, ModelConfig& c) const = 0;
  virtual void write_family_keys(const ModelConfig& c, nlohmann::json& j) const = 0;
};

}  // namespace tessera::model
