#include "model/llama.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "model/errors.h"
#include "model/fused_ops.h"
#include "model/linear_cross_entropy.h"
#include "model/stacked_linear.h"
#include "model/widened_gemm.h"
#include "util/torch_compat.h"

namespace tessera::model {

// ------------------------------------------------------------------------------------------------
// Math
// ------------------------------------------------------------------------------------------------
namespace ops {

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  if (fused_rms_norm_runs(x)) return fused_rms_norm(x, weight, eps);  // one kernel each way (model/fused_ops.h)
  auto h = x.to(torch::kFloat32);
  auto variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * torch::rsqrt(variance + eps);
  return weight * h.to(x.scalar_type());
}

torch::Tensor rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling, torch::Device device) {
  auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  auto inv_freq = 1.0 / torch::pow(theta, torch::arange(0, head_dim, 2, f64) / (double)head_dim);  // [D/2]
  if (scaling.type == "llama3") {
    const double C = (double)scaling.original_max_position_embeddings, s = scaling.factor;
    const double lo = scaling.low_freq_factor, hi = scaling.high_freq_factor;
    auto wavelen = 2.0 * M_PI / inv_freq;
    auto scaled = torch::where(wavelen > C / lo, inv_freq / s, inv_freq);
    auto m = (C / wavelen - lo) / (hi - lo);
    auto smoothed = (1.0 - m) * scaled / s + m * scaled;
    auto medium = (wavelen >= C / hi).logical_and(wavelen <= C / lo);
    inv_freq = torch::where(medium, smoothed, scaled);
  } else {
    TORCH_CHECK(scaling.type.empty(), "unsupported rope_scaling type ", scaling.type);
  }
  return inv_freq.to(torch::kFloat32).to(device);
}

std::pair<torch::Tensor, torch::Tensor> rotary_tables(int64_t T, int64_t head_dim, double theta,
                                                      torch::Dtype dtype, torch::Device device,
                                                      const RopeScaling& scaling) {
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  auto inv_freq = rope_inv_freq(head_dim, theta, scaling, device);    // [D/2]
  auto freqs = torch::outer(torch::arange(T, f32), inv_freq);          // [T, D/2]
  auto emb = torch::cat({freqs, freqs}, -1);                           // [T, D]
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

std::pair<torch::Tensor, torch::Tensor> rotary_tables_at(const torch::Tensor& position_ids, int64_t head_dim,
                                                         double theta, torch::Dtype dtype, const RopeScaling& scaling) {
  const int64_t B = position_ids.size(0), T = position_ids.size(1);
  const int64_t max_pos = position_ids.numel() ? position_ids.max().item<int64_t>() : 0;
  auto [cos, sin] = rotary_tables(max_pos + 1, head_dim, theta, dtype, position_ids.device(), scaling);
  auto flat = position_ids.reshape({-1});
  return {cos.index_select(0, flat).view({B, 1, T, head_dim}), sin.index_select(0, flat).view({B, 1, T, head_dim})};
}

}  // namespace ops

RotaryCache::RotaryCache(int64_t head_dim, double theta, RopeScaling scaling)
    : head_dim_(head_dim), theta_(theta), scaling_(std::move(scaling)) {}

std::pair<torch::Tensor, torch::Tensor> RotaryCache::tables(int64_t T, torch::Dtype dtype, torch::Device device) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Entry& e : entries_)
    if (e.T == T && e.dtype == dtype && e.device == device) return {e.cos, e.sin};
  torch::NoGradGuard no_grad;
  auto [cos, sin] = ops::rotary_tables(T, head_dim_, theta_, dtype, device, scaling_);
  entries_.push_back({T, dtype, device, cos, sin});
  return {cos, sin};
}

std::pair<torch::Tensor, torch::Tensor> RotaryCache::at(const torch::Tensor& position_ids, torch::Dtype dtype) {
  const int64_t B = position_ids.size(0), T = position_ids.size(1);
  auto [cos, sin] = tables(T, dtype, position_ids.device());
  auto flat = position_ids.reshape({-1});
  return {cos.index_select(0, flat).view({B, 1, T, head_dim_}), sin.index_select(0, flat).view({B, 1, T, head_dim_})};
}

namespace ops {

torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  if (fused_rope_runs(x) && x.dim() == 4 && x.stride(3) == 1) return fused_rope(x, cos, sin);  // model/fused_ops.h
  const int64_t half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  auto rotated = torch::cat({-x2, x1}, -1);
  return x * cos + rotated * sin;
}

torch::Tensor repeat_kv(const torch::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t B = x.size(0), KV = x.size(1), T = x.size(2), D = x.size(3);
  return x.unsqueeze(2).expand({B, KV, n_rep, T, D}).reshape({B, KV * n_rep, T, D});
}

namespace {
// [T, S] true where query t must not see key s: the future, and with a window keys t - s >= window.
// Query t is position offset + t of the keys.
torch::Tensor hidden_keys(int64_t T, int64_t S, int64_t window, torch::Device device, int64_t offset = 0) {
  auto ones = torch::ones({T, S}, torch::TensorOptions().dtype(torch::kBool).device(device));
  auto future = ones.triu(1 + offset);
  return window > 0 ? future.logical_or(ones.tril(offset - window)) : future;
}

// softmax(q k^T / sqrt(D)) v with the keys `hidden` marks (true) masked out; hidden broadcasts
// against [B, H, T, S].
torch::Tensor masked_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& hidden) {
  if constexpr (compat::kHasSdpa) return compat::sdpa(q, k, v, /*attn_mask=*/hidden.logical_not(), /*is_causal=*/false);
  auto scores = ops::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt((double)q.size(-1)));
  scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  auto probs = torch::softmax(scores, -1, torch::kFloat32).to(q.scalar_type());
  return ops::matmul(probs, v);
}
}  // namespace

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               int64_t window, const torch::Tensor& document_ids, int64_t offset) {
  const int64_t T = q.size(-2), S = k.size(-2);
  if (window >= S) window = 0;  // the window reaches back to position 0 for every query
  if (offset > 0) {
    TORCH_CHECK(!document_ids.defined() && S == offset + T, "causal_attention: offset ", offset, " needs ",
                offset + T, " keys of one document, got ", S);
    return masked_attention(q, k, v, hidden_keys(T, S, window, q.device(), offset));
  }
  if (document_ids.defined()) {
    // Packed documents: also hidden where query and key belong to different documents; [B, 1, T, S]
    // (one byte per pair, shared by the heads).
    auto other_doc = document_ids.unsqueeze(2) != document_ids.unsqueeze(1);  // [B, T, S]
    return masked_attention(q, k, v, hidden_keys(T, S, window, q.device()).logical_or(other_doc).unsqueeze(1));
  }
  if (compat::kHasSdpa && window == 0) return compat::sdpa(q, k, v, /*attn_mask=*/{}, /*is_causal=*/true);
  return masked_attention(q, k, v, hidden_keys(T, S, window, q.device()));
}

std::string varlen_kernel_unavailable(torch::Dtype dtype, int64_t head_dim) {
  if (!compat::kHasFlashVarlen)
    return "this LibTorch (" + std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) +
           ") has no variable-length flash attention (2.6 and later)";
  if (dtype != torch::kBFloat16 && dtype != torch::kHalf)
    return "flash attention computes in bf16 or fp16, not " + std::string(c10::toString(dtype));
  if (head_dim % 8 != 0 || head_dim > 256)
    return "flash attention takes head_dim a multiple of 8 up to 256, not " + std::to_string(head_dim);
  return "";
}

bool varlen_kernel_runs(const torch::Tensor& q) {
  return q.is_cuda() && varlen_kernel_unavailable(q.scalar_type(), q.size(-1)).empty();
}

torch::Tensor varlen_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& cu_seqlens, int64_t max_seqlen, int64_t window) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && q.size(1) % k.size(1) == 0, "varlen_attention: q [N, nh, D], k and v [N, nkv, D]");
  if (varlen_kernel_runs(q)) return compat::flash_varlen(q, k, v, cu_seqlens, max_seqlen, window);
  const at::Tensor starts = cu_seqlens.to(torch::kCPU, torch::kLong);  // the reference: one document at a time
  const int64_t* at = starts.data_ptr<int64_t>();
  const int64_t n_rep = q.size(1) / k.size(1);
  std::vector<torch::Tensor> out;
  for (int64_t d = 0; d + 1 < starts.numel(); ++d) {
    auto rows = [&](const torch::Tensor& t) { return t.narrow(0, at[d], at[d + 1] - at[d]).transpose(0, 1).unsqueeze(0); };
    out.push_back(causal_attention(rows(q), repeat_kv(rows(k), n_rep), repeat_kv(rows(v), n_rep), window)
                      .squeeze(0).transpose(0, 1));
  }
  return torch::cat(out, 0);
}

torch::Tensor linear_plus(const torch::Tensor& residual, const torch::Tensor& x, const torch::Tensor& w, bool epilogue) {
  if (!epilogue) return residual + ops::linear(x, w);
  const int64_t out = w.size(0);
  return torch::addmm(residual.reshape({-1, out}), x.reshape({-1, w.size(1)}), w.t()).view(residual.sizes());
}

torch::Tensor swiglu(const torch::Tensor& x, const torch::Tensor& gate, const torch::Tensor& up,
                     const torch::Tensor& down, const torch::Tensor& residual) {
  const torch::Tensor gate_up_rows = fused_swiglu_runs(x) ? stacked_rows({gate, up}) : torch::Tensor();
  torch::Tensor h;
  if (gate_up_rows.defined()) {  // one product, one kernel each way (model/fused_ops.h)
    h = fused_swiglu(ops::linear(x, gate_up_rows));
  } else {
    const std::vector<torch::Tensor> gate_up = linear_stacked(x, {gate, up});  // one product where adjacent
    h = torch::silu(gate_up[0]) * gate_up[1];
  }
  return residual.defined() ? linear_plus(residual, h, down, !x.is_cpu()) : ops::linear(h, down);
}

}  // namespace ops

// ------------------------------------------------------------------------------------------------
// Modules
// ------------------------------------------------------------------------------------------------

WeightImpl::WeightImpl(at::IntArrayRef shape, const torch::TensorOptions& opts) {
  weight = register_parameter("weight", torch::empty(shape, opts));
}
LinearImpl::LinearImpl(int64_t in, int64_t out, const torch::TensorOptions& opts, bool with_bias)
    : WeightImpl({out, in}, opts) {
  if (with_bias) bias = register_parameter("bias", torch::empty({out}, opts));
}
torch::Tensor LinearImpl::forward_plus(const torch::Tensor& x, const torch::Tensor& residual) {
  if (bias.defined() || lora_A) return residual + forward(x);
  return ops::linear_plus(residual, x, weight, !x.is_cpu());
}
torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = ops::linear(x, weight);
  if (bias.defined()) y = y + bias;
  if (!lora_A) return y;
  const torch::Tensor in = lora_dropout > 0 && is_training() ? torch::dropout(x, lora_dropout, true) : x;
  return y + ops::linear(ops::linear(in, lora_A->weight), lora_B->weight) * lora_scale;
}
void LinearImpl::add_lora(int64_t rank, double scale, double dropout) {
  TORCH_CHECK(!lora_A, "add_lora: this Linear already has adapters");
  const auto opts = weight.options();
  lora_A = register_module("lora_A", std::make_shared<WeightImpl>(at::IntArrayRef{rank, weight.size(1)}, opts));
  lora_B = register_module("lora_B", std::make_shared<WeightImpl>(at::IntArrayRef{weight.size(0), rank}, opts));
  lora_scale = scale;
  lora_dropout = dropout;
}
torch::Tensor EmbeddingImpl::forward(const torch::Tensor& tokens) { return torch::embedding(weight, tokens); }
torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) { return ops::rms_norm(x, weight, eps); }

AttentionImpl::AttentionImpl(const ModelConfig& cfg, const torch::TensorOptions& opts, std::shared_ptr<RotaryCache> rope_)
    : num_heads(cfg.num_attention_heads),
      num_kv_heads(cfg.num_key_value_heads),
      head_dim(cfg.head_dim()),
      rope_theta(cfg.rope_theta),
      rope_scaling(cfg.rope_scaling),
      sliding_window(cfg.sliding_window),
      rope(rope_ ? std::move(rope_) : std::make_shared<RotaryCache>(head_dim, rope_theta, rope_scaling)) {
  const int64_t h = cfg.hidden_size;
  // Registration order = Hugging Face's (Qwen3Attention: the projections, then q_norm, k_norm).
  q_proj = register_module("q_proj", Linear(h, num_heads * head_dim, opts, cfg.qkv_bias));
  k_proj = register_module("k_proj", Linear(h, num_kv_heads * head_dim, opts, cfg.qkv_bias));
  v_proj = register_module("v_proj", Linear(h, num_kv_heads * head_dim, opts, cfg.qkv_bias));
  o_proj = register_module("o_proj", Linear(num_heads * head_dim, h, opts, cfg.o_bias));
  if (cfg.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(head_dim, cfg.rms_norm_eps, opts));
    k_norm = register_module("k_norm", RMSNorm(head_dim, cfg.rms_norm_eps, opts));
  }
}

// q, k and v [B, T, features]: one product where the weights are adjacent (ops::linear_stacked;
// Llama's and Mistral's under FSDP), v then copied out of it so that attention does not keep q and k's
// part alive; else each its own product (biases, LoRA, Qwen3's q/k norms).
std::vector<torch::Tensor> AttentionImpl::project(const torch::Tensor& x) {
  const bool plain = !q_norm && !q_proj->bias.defined() && !q_proj->has_lora() && !k_proj->has_lora() && !v_proj->has_lora();
  if (!plain) return {q_proj(x), k_proj(x), v_proj(x)};
  std::vector<torch::Tensor> qkv = ops::linear_stacked(x, {q_proj->weight, k_proj->weight, v_proj->weight});
  if (qkv[2].is_alias_of(qkv[0])) qkv[2] = qkv[2].contiguous();  // one product: v out of it
  return qkv;
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const TokenLayout& layout, const torch::Tensor& residual) {
  const int64_t B = x.size(0), T = x.size(1);
  const std::vector<torch::Tensor> qkv = project(x);
  auto q = qkv[0].view({B, T, num_heads, head_dim});  // [B, T, nh, D]
  auto k = qkv[1].view({B, T, num_kv_heads, head_dim});
  if (q_norm) {  // Qwen3: per head, over D, before RoPE
    q = q_norm(q);
    k = k_norm(k);
  }
  q = q.transpose(1, 2);                      // [B, nh, T, D]
  k = k.transpose(1, 2);
  auto v = qkv[2].view({B, T, num_kv_heads, head_dim}).transpose(1, 2);
  KvCache* cache = layout.cache.get();
  TORCH_CHECK(!cache || !layout.position_ids.defined(), "a KV cache does not take packed documents");
  const int64_t start = cache ? cache->start : 0;
  // With a cache: rows start .. start + T - 1 of the table of its capacity (one table for the whole
  // generation; a row does not depend on the table's length).
  auto [cos, sin] = layout.position_ids.defined() ? rope->at(layout.position_ids, q.scalar_type())
                    : cache ? rope->tables(cache->capacity, q.scalar_type(), q.device())
                            : rope->tables(T, q.scalar_type(), q.device());
  if (cache) {
    cos = cos.narrow(0, start, T);
    sin = sin.narrow(0, start, T);
  }
  q = ops::apply_rotary(q, cos, sin);
  k = ops::apply_rotary(k, cos, sin);
  if (cache) std::tie(k, v) = cache->append(layer_index, k, v);
  const int64_t n_rep = num_heads / num_kv_heads;
  // Packed documents and sliding windows on the variable-length flash kernel where it runs (K and V
  // as they are); unmasked causal attention of a GQA model on SDPA's flash kernel (LibTorch >= 2.5 on
  // a GPU); everywhere else K and V are repeated to every query head.
  std::optional<torch::Tensor> flash;
  if (layout.varlen && !cache && (layout.cu_seqlens.defined() || sliding_window > 0) && ops::varlen_kernel_runs(q))
    flash = varlen(q, k, v, layout);
  else if (n_rep > 1 && sliding_window == 0 && !layout.document_ids.defined() && !cache)
    flash = compat::sdpa_gqa_on_flash(q, k, v);
  auto out = flash ? *flash
                   : ops::causal_attention(q, ops::repeat_kv(k, n_rep), ops::repeat_kv(v, n_rep), sliding_window,
                                           layout.document_ids, start);
  const torch::Tensor merged = out.transpose(1, 2).reshape({B, T, num_heads * head_dim});
  return residual.defined() ? o_proj->forward_plus(merged, residual) : o_proj(merged);
}

// q [B, nh, T, D], k and v [B, nkv, T, D] as the tokens of the B rows one after another, through
// ops::varlen_attention: the layout's documents, or each row one document (a sliding window).
// Returns [B, nh, T, D] (a view of the kernel's [B, T, nh, D] output, so merging the heads is free).
torch::Tensor AttentionImpl::varlen(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                    const TokenLayout& layout) const {
  const int64_t B = q.size(0), T = q.size(2);
  auto tokens = [&](const torch::Tensor& t) { return t.transpose(1, 2).reshape({B * T, t.size(1), head_dim}); };
  torch::Tensor cu = layout.cu_seqlens;
  int64_t longest = layout.max_seqlen;
  if (!cu.defined()) {
    cu = torch::arange(0, (B + 1) * T, T, torch::TensorOptions().dtype(torch::kInt).device(q.device()));
    longest = T;
  }
  return ops::varlen_attention(tokens(q), tokens(k), tokens(v), cu, longest, sliding_window)
      .view({B, T, num_heads, head_dim})
      .transpose(1, 2);
}

MlpImpl::MlpImpl(const ModelConfig& cfg, const torch::TensorOptions& opts) {
  gate_proj = register_module("gate_proj", Linear(cfg.hidden_size, cfg.intermediate_size, opts));
  up_proj = register_module("up_proj", Linear(cfg.hidden_size, cfg.intermediate_size, opts));
  down_proj = register_module("down_proj", Linear(cfg.intermediate_size, cfg.hidden_size, opts));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x, const torch::Tensor& residual) {
  if (gate_proj->has_lora() || up_proj->has_lora() || down_proj->has_lora()) {  // the same products, adapted
    const torch::Tensor h = torch::silu(gate_proj(x)) * up_proj(x);
    return residual.defined() ? down_proj->forward_plus(h, residual) : down_proj(h);
  }
  return ops::swiglu(x, gate_proj->weight, up_proj->weight, down_proj->weight, residual);
}

DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& cfg, const torch::TensorOptions& opts,
                                   std::shared_ptr<RotaryCache> rope) {
  // Registration order = HF module order = file order of the layer's tensors.
  self_attn = register_module("self_attn", Attention(cfg, opts, std::move(rope)));
  mlp = register_module("mlp", Mlp(cfg, opts));
  input_layernorm = register_module("input_layernorm", RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, opts));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, opts));
}

// The residual stream: each block's output projection adds it (in the GEMM's epilogue on a device).
torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& h, const TokenLayout& layout) {
  const torch::Tensor x = self_attn->forward(input_layernorm(h), layout, h);
  return mlp->forward(post_attention_layernorm(x), x);
}

LlamaModelImpl::LlamaModelImpl(const ModelConfig& cfg, const torch::TensorOptions& opts) {
  embed_tokens = register_module("embed_tokens", Embedding(cfg.vocab_size, cfg.hidden_size, opts));
  layers = register_module("layers", torch::nn::ModuleList());
  auto rope = std::make_shared<RotaryCache>(cfg.head_dim(), cfg.rope_theta, cfg.rope_scaling);  // one for all layers
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    layer_list.emplace_back(cfg, opts, rope);
    layer_list.back()->self_attn->layer_index = i;
    layers->push_back(layer_list.back());
  }
  norm = register_module("norm", RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, opts));
}

LlamaImpl::LlamaImpl(const ModelConfig& cfg, torch::Device device, torch::Dtype dtype) : cfg_(cfg) {
  cfg_.validate();
  auto opts = torch::TensorOptions().device(device).dtype(dtype);
  model = register_module("model", LlamaModel(cfg_, opts));
  if (!cfg_.tie_word_embeddings)
    lm_head = register_module("lm_head", Linear(cfg_.hidden_size, cfg_.vocab_size, opts));
}

torch::Tensor LlamaImpl::embed(const torch::Tensor& tokens) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == torch::kLong,
              "Llama::embed expects [B, T] int64 tokens, got ", tokens.sizes(), " ", tokens.scalar_type());
  return model->embed_tokens(tokens);
}

DecoderLayer& LlamaImpl::layer(int64_t i) {
  TORCH_CHECK(i >= 0 && i < num_layers(), "layer index ", i, " out of range [0, ", num_layers(), ")");
  return model->layer_list[i];
}

torch::Tensor LlamaImpl::head(const torch::Tensor& h) {
  auto x = model->norm(h);
  return cfg_.tie_word_embeddings ? ops::linear(x, model->embed_tokens->weight) : lm_head(x);
}

torch::Tensor LlamaImpl::head_loss(const torch::Tensor& h, const torch::Tensor& labels, const HeadLoss& how) {
  const torch::Tensor x = model->norm(h);
  const torch::Tensor& w = cfg_.tie_word_embeddings ? model->embed_tokens->weight : lm_head->weight;
  return ops::linear_cross_entropy(x.reshape({-1, x.size(-1)}), w, labels.reshape({-1}), how.ignore_index,
                                   /*chunk_rows=*/0, how.device_rows ? ops::LceRows::Weighted : ops::LceRows::Auto,
                                   how.grad_scale);
}

namespace {
NamedTensors prefixed(const torch::nn::Module& m, const std::string& prefix) {
  NamedTensors out;
  for (const auto& item : m.named_parameters(/*recurse=*/true)) out.emplace_back(prefix + item.key(), item.value());
  return out;
}
}  // namespace

NamedTensors LlamaImpl::root_parameters() {
  NamedTensors out = {{"model.embed_tokens.weight", model->embed_tokens->weight},
                      {"model.norm.weight", model->norm->weight}};
  if (lm_head) out.emplace_back("lm_head.weight", lm_head->weight);
  return out;
}

NamedTensors LlamaImpl::layer_parameters(int64_t i) {
  return prefixed(*layer(i), "model.layers." + std::to_string(i) + ".");
}

// ------------------------------------------------------------------------------------------------
// Names and initialisation
// ------------------------------------------------------------------------------------------------

bool is_norm_weight(const std::string& name) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with("layernorm.weight") || ends_with("self_attn.q_norm.weight") || ends_with("self_attn.k_norm.weight") ||
         name == "model.norm.weight";
}

bool is_bias(const std::string& name) {
  return name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
}

// splitmix64 finaliser over (seed, FNV-1a(name)): an independent, order-free stream per tensor.
uint64_t tensor_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (h | 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

torch::Tensor init_tensor(const TensorSpec& spec, uint64_t seed) {
  if (is_norm_weight(spec.name)) return torch::ones(spec.shape, torch::kFloat32);
  if (is_bias(spec.name)) return torch::zeros(spec.shape, torch::kFloat32);
  auto gen = at::detail::createCPUGenerator(tensor_seed(seed, spec.name));
  return torch::empty(spec.shape, torch::kFloat32).normal_(0.0, 0.02, gen);
}

void init_parameters(const NamedTensors& params, uint64_t seed) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : params) t.copy_(init_tensor({name, t.sizes().vec()}, seed));
}

void init_weights(CausalLmModule& model, uint64_t seed) { init_parameters(model.named_hf_parameters(), seed); }

// ------------------------------------------------------------------------------------------------
// LlamaArchitecture: the ModelSpec part every family of these modules shares
// ------------------------------------------------------------------------------------------------

ModelConfig LlamaArchitecture::from_json(const nlohmann::json& j, const std::string& source) const {
  ModelConfig c = read_common_keys(j, source);
  c.model_type = family();
  read_family_keys(j, source, c);
  c.validate(source);
  return c;
}

nlohmann::json LlamaArchitecture::to_json(const ModelConfig& c) const {
  nlohmann::json j = common_keys_json(c);
  j["architectures"] = {architecture()};
  j["model_type"] = family();
  write_family_keys(c, j);
  return j;
}

std::vector<UnitSpec> LlamaArchitecture::unit_specs(const ModelConfig& c) const {
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim(), kv = c.num_key_value_heads * c.head_dim();
  const int64_t inter = c.intermediate_size;
  std::vector<UnitSpec> units;
  UnitSpec root{"root", {{"model.embed_tokens.weight", {c.vocab_size, h}}, {"model.norm.weight", {h}}}};
  if (!c.tie_word_embeddings) root.tensors.push_back({"lm_head.weight", {c.vocab_size, h}});
  units.push_back(std::move(root));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i), a = p + ".self_attn.";
    UnitSpec layer{p, {}};
    // The module's order: each projection's weight, then its bias (Qwen), then Qwen3's q/k norms.
    auto proj = [&](const char* name, int64_t out, int64_t in, bool bias) {
      layer.tensors.push_back({a + name + ".weight", {out, in}});
      if (bias) layer.tensors.push_back({a + name + ".bias", {out}});
    };
    proj("q_proj", q, h, c.qkv_bias);
    proj("k_proj", kv, h, c.qkv_bias);
    proj("v_proj", kv, h, c.qkv_bias);
    proj("o_proj", h, q, c.o_bias);
    if (c.qk_norm) layer.tensors.insert(layer.tensors.end(), {{a + "q_norm.weight", {c.head_dim()}},
                                                               {a + "k_norm.weight", {c.head_dim()}}});
    layer.tensors.insert(layer.tensors.end(), {{p + ".mlp.gate_proj.weight", {inter, h}},
                                                {p + ".mlp.up_proj.weight", {inter, h}},
                                                {p + ".mlp.down_proj.weight", {h, inter}},
                                                {p + ".input_layernorm.weight", {h}},
                                                {p + ".post_attention_layernorm.weight", {h}}});
    units.push_back(std::move(layer));
  }
  return units;
}

std::vector<TensorSpec> LlamaArchitecture::tensor_specs(const ModelConfig& c) const {
  const auto units = unit_specs(c);
  const auto& root = units[0].tensors;  // embed, norm[, lm_head]
  std::vector<TensorSpec> specs = {root[0]};
  for (size_t u = 1; u < units.size(); ++u) specs.insert(specs.end(), units[u].tensors.begin(), units[u].tensors.end());
  specs.insert(specs.end(), root.begin() + 1, root.end());
  return specs;
}

std::shared_ptr<CausalLmModule> LlamaArchitecture::build(const ModelConfig& c, torch::Device device,
                                                         torch::Dtype dtype) const {
  return std::make_shared<LlamaImpl>(c, device, dtype);
}

torch::Tensor LlamaArchitecture::init_tensor(const TensorSpec& spec, uint64_t seed) const {
  return model::init_tensor(spec, seed);
}

std::vector<lora::TargetShape> LlamaArchitecture::lora_targets(const ModelConfig& c) const {
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim(), kv = c.num_key_value_heads * c.head_dim();
  const int64_t inter = c.intermediate_size;
  return {{"q_proj", "self_attn.q_proj", h, q},        {"k_proj", "self_attn.k_proj", h, kv},
          {"v_proj", "self_attn.v_proj", h, kv},       {"o_proj", "self_attn.o_proj", q, h},
          {"gate_proj", "mlp.gate_proj", h, inter},    {"up_proj", "mlp.up_proj", h, inter},
          {"down_proj", "mlp.down_proj", inter, h}};
}

void LlamaArchitecture::add_lora(CausalLmModule& m, const lora::Options& o) const {
  auto* llama = dynamic_cast<LlamaImpl*>(&m);
  TORCH_CHECK(llama != nullptr, "add_lora: not a module of this family");
  for (int64_t i = 0; i < llama->num_layers(); ++i) {
    DecoderLayer& layer = llama->layer(i);
    const std::vector<std::pair<std::string, Linear*>> linears = {
        {"q_proj", &layer->self_attn->q_proj}, {"k_proj", &layer->self_attn->k_proj},
        {"v_proj", &layer->self_attn->v_proj}, {"o_proj", &layer->self_attn->o_proj},
        {"gate_proj", &layer->mlp->gate_proj}, {"up_proj", &layer->mlp->up_proj},
        {"down_proj", &layer->mlp->down_proj}};
    for (const auto& [name, linear] : linears)
      if (std::find(o.targets.begin(), o.targets.end(), name) != o.targets.end())
        (*linear)->add_lora(o.rank, o.scale(), o.dropout);
  }
}

double LlamaArchitecture::train_flops_per_token(const ModelConfig& c, int64_t seq_len) const {
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim(), kv = c.num_key_value_heads * c.head_dim();
  const int64_t per_layer = 2 * h * q /*q, o*/ + 2 * h * kv /*k, v*/ + 3 * h * c.intermediate_size;
  const double matmul_weights = double(c.num_hidden_layers) * per_layer + double(c.vocab_size) * h /*head*/;
  const int64_t keys = c.sliding_window > 0 ? std::min(seq_len, c.sliding_window) : seq_len;
  // Attention: QK^T and AV over `keys` keys, 2 x 2 x q FLOPs a key forward, x 3 with backward
  // (torchtitan's 12 x layers x heads x head_dim x seq; llm-foundry's, with q = hidden).
  return 6.0 * matmul_weights + 12.0 * double(c.num_hidden_layers) * q * keys;
}

}  // namespace tessera::model
