#include "model/activations.h"

#include <torch/version.h>

#include <algorithm>

namespace tessera::model {

bool build_has_fused_attention() { return TORCH_VERSION_MAJOR >= 2; }

// Counted from the ops of model/llama.cpp, in the order they run (p = compute bytes; BT = B*T;
// Hq = heads x head_dim, Hkv = kv heads x head_dim; "saved" = kept by autograd for backward):
//
// decoder layer forward
//   input x                                  p BT H   (the layer's input, kept by its wrapper)
//   input_layernorm  x.to(fp32)              4 BT H   (saved by pow and mul; x itself when p = 4)
//                    rsqrt(mean(x^2) + eps)  4 BT
//                    normalised, cast back   p BT H   (saved by the weight multiply)
//   its output r1                            p BT H   (saved by q/k/v projections)
//   q = r1 Wq^T, rotate_half(q), q_rot       3 p BT Hq (x * cos, rotated * sin, matmul)
//   k likewise                               3 p BT Hkv
//   v                                        p BT Hkv
//   cos, sin tables                          2 p T head_dim
//   GQA: k, v repeated to Hq                 2 p BT Hq (only when heads > kv heads)
//   explicit attention: causal mask          T^2      (bool)
//                    softmax in fp32         4 B nh T^2
//                    probs cast back         p B nh T^2 (when p != 4)
//   fused attention: output, logsumexp       p BT Hq + 4 B nh T
//   attention output, heads merged           p BT Hq  (saved by o_proj)
//   post_attention_layernorm: input (fp32)   4 BT H   (its fp32 copy; h itself when p = 4)
//                    rsqrt                   4 BT
//                    normalised              p BT H
//   its output r2                            p BT H   (saved by gate/up)
//   mlp: gate, silu(gate), up, product       4 p BT I
// The layer's output is the next layer's input (or the head's), counted there.
//
// head: final norm as above (input p BT H + fp32 copy when p != 4, rsqrt, normalised, output),
// log-softmax of the fp32 logits 4 BT V. The logits themselves (p BT V) and their fp32 copy live
// only while the loss is formed.
ActivationBytes llama_activation_bytes(const LlamaConfig& cfg, int64_t B, int64_t T, int elem, bool fused_attention) {
  const int64_t p = elem, BT = B * T, H = cfg.hidden_size, I = cfg.intermediate_size;
  const int64_t nh = cfg.num_attention_heads, kv = cfg.num_key_value_heads, hd = cfg.head_dim();
  const int64_t Hq = nh * hd, Hkv = kv * hd, V = cfg.vocab_size;
  const int64_t f32_copy = p == 4 ? 0 : 4 * BT * H;  // x.to(fp32) allocates only when x is not fp32
  const int64_t norm = 4 * BT + p * BT * H;          // rsqrt and the normalised tensor
  const int64_t scores = B * nh * T * T;

  ActivationBytes a;
  a.layer_input = p * BT * H;
  int64_t s = a.layer_input;
  s += f32_copy + norm + p * BT * H;                 // input_layernorm and its output
  s += 3 * p * BT * Hq + 3 * p * BT * Hkv + p * BT * Hkv + 2 * p * T * hd;
  if (nh != kv) s += 2 * p * BT * Hq;
  if (fused_attention) s += p * BT * Hq + 4 * B * nh * T;
  else s += T * T + 4 * scores + (p == 4 ? 0 : p * scores);
  s += p * BT * Hq;                                  // merged heads (o_proj input)
  s += 4 * BT * H + norm + p * BT * H;               // post_attention_layernorm and its output
  s += 4 * p * BT * I;                               // mlp
  a.layer_saved = s;

  // Forward: the softmax holds the masked scores (p), their fp32 copy and its result at once.
  a.layer_forward_transient = fused_attention ? 2 * p * BT * H : (p + (p == 4 ? 0 : 4)) * scores;
  // Backward: gradients of the scores (fp32 and in p) and of the mlp's [BT, I] tensors dominate.
  a.layer_backward_transient =
      (fused_attention ? 0 : (8 + p) * scores) + 3 * p * BT * I + 4 * BT * H;

  a.logits = p * BT * V;
  a.head_saved = p * BT * H + f32_copy + norm + p * BT * H + 4 * BT * V;
  a.head_forward_transient = a.logits + (p == 4 ? 0 : 4 * BT * V);
  a.head_backward_transient = 8 * BT * V + a.logits;
  return a;
}

}  // namespace tessera::model
