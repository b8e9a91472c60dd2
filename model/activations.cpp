#include "model/activations.h"

#include <algorithm>

#include "model/linear_cross_entropy.h"
#include "model/widened_gemm.h"
#include "util/torch_compat.h"

namespace tessera::model {

Kernels run_kernels(bool gpu, bool packed, bool fused_kernels, bool varlen) {
  Kernels k;
  k.fused_attention = gpu || compat::kHasSdpa;
  k.gqa_attention = gpu && compat::kHasSdpaGqa && !packed;
  k.varlen_attention = gpu && varlen && compat::kHasFlashVarlen;
  k.fused_norm = k.fused_swiglu = gpu && fused_kernels;  // installed when `tessera train` picks a GPU
  k.device_head = gpu;
  k.widened_gemm = !gpu && ops::cpu_widens_bf16();
  return k;
}

namespace {

// The most a widened product of the layer holds beyond LibTorch's own (model/widened_gemm.h): the
// projections, the mlp, and with explicit attention q k^T and probs v.
int64_t widened_layer_transient(const ModelConfig& cfg, int64_t B, int64_t T, int p, bool fused_attention) {
  const int64_t BT = B * T, H = cfg.hidden_size, I = cfg.intermediate_size;
  const int64_t Hq = cfg.num_attention_heads * cfg.head_dim(), Hkv = cfg.num_key_value_heads * cfg.head_dim();
  int64_t w = std::max({ops::widened_linear_transient(BT, H, Hq, p), ops::widened_linear_transient(BT, H, Hkv, p),
                        ops::widened_linear_transient(BT, Hq, H, p), ops::widened_linear_transient(BT, H, I, p),
                        ops::widened_linear_transient(BT, I, H, p)});
  if (!fused_attention) {
    const int64_t scores = B * cfg.num_attention_heads * T * T;
    w = std::max({w, ops::widened_matmul_transient(BT * Hq, BT * Hq, scores),
                  ops::widened_matmul_transient(scores, BT * Hq, BT * Hq)});
  }
  return w;
}

}  // namespace

// Counted from what autograd keeps for the ops of model/llama.cpp on LibTorch 1.13 (listed with
// torch.autograd's saved-tensor attributes on the same ops, and measured by
// tests/unit/test_memory_model.cpp with the allocation tracker). p = compute bytes; BT = B*T;
// Hq = heads x head_dim; "f32" = 4 bytes whatever the compute dtype.
//
// decoder layer forward
//   layer input x                 p BT H   kept only when p = 4 (the norm's fp32 "copy" is x itself);
//                                          otherwise only activation checkpointing keeps it
//   input_layernorm  x.to(fp32)   4 BT H   saved by pow and mul (absent when p = 4: it is x)
//                    x^2          4 BT H   saved by mean on 1.13; LibTorch 2.x's mean keeps only sizes
//                                          (compat::kMeanSavesInput), and x^2 is then a transient
//                    rsqrt        4 BT
//                    normalised   p BT H   cast back, saved by the weight multiply
//   its output r1                 p BT H   saved by the q/k/v projections
//   (biases on q/k/v/o: the sum saves nothing; q/k/v are the sums)
//   Qwen3's q_norm and k_norm, over Hq and Hkv = kv_heads x head_dim features: the projection's
//                 output in fp32 4 BT Hq (the cast, or q itself when p = 4: nothing else keeps it),
//                 its square 4 BT Hq (1.13), rsqrt 4 BT nh, normalised p BT Hq; the same for k. The
//                 norm's output goes to RoPE, which keeps only cos/sin.
//   q after RoPE                  p BT Hq  saved by q k^T (x*cos and rotated*sin save only cos/sin)
//   k^T after RoPE (and GQA repeat), made contiguous by matmul      p BT Hq
//   v (GQA: repeated), contiguous p BT Hq  saved by probs v
//   (Kernels::gqa_attention, Kernels::varlen_attention: k and v at their own heads, p BT Hkv each,
//   saved by the flash kernel; the variable-length one saves its [BT, heads, D] copies of q, k, v)
//   cos, sin tables               2 p T head_dim
//   explicit attention: mask T^2 (bool); softmax output in fp32 4 B nh T^2; its cast p B nh T^2
//                       (when p != 4)
//   fused attention (LibTorch >= 2): output and logsumexp p BT Hq + 4 B nh T; the CPU kernel returns
//                       its output [B, T, nh, D]-major, so merging the heads is a view and o_proj keeps
//                       that same tensor (measured on 2.6)
//   heads merged (o_proj input)   p BT Hq  (explicit attention only: a copy)
//   post_attention_layernorm      the residual sum's fp32 form 4 BT H, x^2 4 BT H (1.13), rsqrt 4 BT,
//                                 normalised p BT H, output r2 p BT H
//   (Kernels::fused_norm, a GPU's one-kernel RMSNorm: each norm keeps its input, p BT H, and rstd,
//   4 BT, instead of the fp32 form, x^2, rsqrt and the normalised form; Qwen3's q/k norms likewise)
//   mlp: gate, silu(gate), up, product   4 p BT I (Kernels::fused_swiglu: gate and up's one
//                                          product and the product of the two, 3 p BT I)
// The layer's output is the next layer's input (or the head's), counted there.
//
// head: final norm as post_attention_layernorm (its input's fp32 form is the input itself when
// p = 4) less the norm's output (the fused head and loss, ops::linear_cross_entropy, does not keep
// it), plus the gradients that op computes in forward and backward only scales: x's (p BT H, as the
// norm's output it replaces) and the head weight's (p V H). No logits-sized tensor is saved. While
// it runs: one fp32 chunk of logits (c rows of V, c = linear_cross_entropy_chunk_rows(V) or BT), the
// norm's output, the kept rows and their gradient before it is spread back to BT rows (2 p BT H),
// and with p != 4 the chunk's product in p, x's rows widened, the weight gradient's fp32
// accumulator (4 V H, less the p V H it becomes) and the head's input (alive where autograd does not
// keep it). Evaluation's logits (p BT V) are the `logits` term.
//
// Widened bf16 products (Kernels::widened_gemm, model/widened_gemm.h) keep the same tensors; the
// largest product's fp32 operands and result are added to the layer's forward and backward
// transients, and the head's widened blocks to the head's.
//
// The transient terms are upper bounds (the test checks that the tracker never sees more): the
// forward's excess is bounded by the softmax's working set (or two [BT, H] tensors when fused, plus
// the norm's x^2 in fp32 where mean does not keep it), the
// backward's by the score gradients and the mlp's [BT, I] gradients; the whole-step prediction built
// from them is checked against measured peaks by tests/mpi/memory_plan.sh.
ActivationBytes activation_bytes(const ModelConfig& cfg, int64_t B, int64_t T, int elem, Kernels k, bool frozen_head) {
  const bool fused_attention = k.fused_attention, widened = k.widened_gemm && elem != 4;
  const int64_t p = elem, BT = B * T, H = cfg.hidden_size, I = cfg.intermediate_size;
  const int64_t nh = cfg.num_attention_heads, hd = cfg.head_dim();
  const int64_t Hq = nh * hd, V = cfg.vocab_size;
  const int64_t f32_copy = p == 4 ? 0 : 4 * BT * H;  // x.to(fp32) allocates only when x is not fp32
  const int64_t scores = B * nh * T * T;
  // A norm's saved tensors beyond its input's fp32 form: x^2 (LibTorch 1.13), rsqrt, normalised, output.
  const int64_t norm_sq = 4 * BT * H;
  const int64_t norm = (compat::kMeanSavesInput ? norm_sq : 0) + 4 * BT + 2 * p * BT * H;

  // The fused kernel's norm keeps its input (p BT H: the layer's input, the residual sum, the head's
  // input), rstd and the output (or, in the head, x's gradient in its place).
  const int64_t fused_norm = 4 * BT + p * BT * H;

  ActivationBytes a;
  a.layer_input = p * BT * H;
  int64_t s = p == 4 || k.fused_norm ? a.layer_input : 0;
  s += k.fused_norm ? fused_norm : f32_copy + norm;  // input_layernorm
  // q, k^T, v (K and V at their own heads with GQA on the flash kernel), cos/sin
  const bool gqa = p != 4 && (k.varlen_attention || (k.gqa_attention && cfg.sliding_window == 0));
  const int64_t Hkv = (gqa ? cfg.num_key_value_heads : nh) * hd;
  s += p * BT * Hq + 2 * p * BT * Hkv + 2 * p * T * hd;
  if (cfg.qk_norm) {
    const int64_t kv = cfg.num_key_value_heads, features = BT * (nh + kv) * hd;
    s += (k.fused_norm ? p : 4 + (compat::kMeanSavesInput ? 4 : 0) + p) * features + 4 * BT * (nh + kv);  // q_norm, k_norm
  }
  if (fused_attention) s += p * BT * Hq + 4 * B * nh * T;  // its output is also o_proj's input
  else s += T * T + 4 * scores + (p == 4 ? 0 : p * scores) + p * BT * Hq;  // + merged heads (o_proj input)
  s += k.fused_norm ? p * BT * H + fused_norm : 4 * BT * H + norm;  // post_attention_layernorm
  s += (k.fused_swiglu ? 3 : 4) * p * BT * I;         // mlp
  a.layer_saved = s;

  a.layer_forward_transient = fused_attention ? 2 * p * BT * H + (compat::kMeanSavesInput ? 0 : norm_sq)
                                              : (p + (p == 4 ? 0 : 4)) * scores;
  a.layer_backward_transient = (fused_attention ? 0 : (8 + p) * scores) + 3 * p * BT * I + 4 * BT * H;
  if (widened) {
    const int64_t w = widened_layer_transient(cfg, B, T, p, fused_attention);
    a.layer_forward_transient += w;
    a.layer_backward_transient += w;
  }

  a.logits = p * BT * V;
  a.head_saved = (k.fused_norm ? p * BT * H + fused_norm : (p == 4 ? 4 * BT * H : f32_copy) + norm) + p * V * H;
  const int64_t c = std::min(BT, ops::linear_cross_entropy_chunk_rows(V, k.device_head));
  a.head_forward_transient = 4 * c * V + p * BT * H + 2 * p * BT * H + 32 * c + 16 * BT;
  // A 16-bit head also holds the chunk's logits in p bytes, its fp32 rows, the widened weight, and
  // oneDNN's packed copy of the chunk's input on CPUs with AMX (bf16 tiles; +26 KB measured there at
  // B*T = 128, H = 256, one thread: unit.test_memory_model).
  if (p != 4) a.head_forward_transient += p * c * V + 4 * c * H + (4 - p) * V * H + p * BT * H + p * c * H;
  // Widened (model/widened_gemm.h), the logits and x's gradient hold one widened block of W (nb
  // rows), its product and rounding, and x's gradient in fp32, instead of the chunk's product in p.
  // That term stays in the sum of this bound: the head's measured peak never held it, and is the
  // same to the byte with and without widening (mid W4 hybrid of `bench memory --quick`: 123,179,272
  // bytes of activations at both peaks).
  if (widened) {
    const int64_t nb = ops::widen_block_rows(V, H);
    a.head_forward_transient += 4 * c * H + 4 * nb * H + (4 + p) * c * nb;
  }
  // The gradients are scaled in place; what is left is the final norm's backward ([BT, H] fp32) and
  // its per-row fp32 temporaries (rsqrt's gradient; LibTorch 2.6 holds up to ~19 BT bytes of them at
  // the peak in unit.test_memory_model's T=256, H=128 case: 8 such rows counted).
  a.head_backward_transient = 4 * BT * H + 32 * BT;
  if (frozen_head) {  // no gradient of W: neither the saved p * V * H nor the fp32 accumulator's extra (4 - p) * V * H
    a.head_saved -= p * V * H;
    if (p != 4) a.head_forward_transient -= (4 - p) * V * H;
  }
  return a;
}

}  // namespace tessera::model
