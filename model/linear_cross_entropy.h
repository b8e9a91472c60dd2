#pragma once
// The language-model head and its loss in one operation: the summed cross entropy of softmax(x W^T)
// against the labels, without ever holding the [N, V] logits.
//
// Unfused, the head's loss holds four logits-sized tensors at once (the logits, their fp32 log-
// softmax, the gradient nll_loss writes and log-softmax's backward output: 4 x N x V x 4 bytes, 524
// MB for 1,024 tokens of a 32,000-word vocabulary, 16 GiB for 8,192 tokens of Llama 3's 128,256)
// and streams each through memory several times. Here rows go in chunks of at most 64 MiB of fp32
// logits (512 MiB on a GPU: a few large products instead of many small ones, e.g. 2 chunks for
// 8,192 rows of a 32,000-word vocabulary); each chunk's logits become, in place, the gradient of the loss with respect to them
// (softmax - one-hot), which is multiplied into the gradients of x and W at once, while the chunk is
// hot (as Liger-Kernel's fused linear cross entropy does). So the forward computes the gradients;
// backward scales them by the incoming gradient. Rows whose label is `ignore_index` (prompt tokens,
// padding) are dropped before the multiply on the CPU (they cost nothing); on a device they are
// computed with a weight of 0 instead, since finding them (nonzero) would synchronise the host with
// the device once per micro-step (LceRows picks; both give the same loss and gradients to rounding).
//
// On a GPU with a bf16/fp16 compute dtype the weight-gradient GEMM (fp32 accumulation) runs with
// TF32; fp32 runs stay full fp32. grad_scale: the loss scale the caller will backpropagate with
// (fp16's dynamic loss scaling; 1 otherwise). The gradients computed in forward are multiplied by
// it before they are rounded to the compute dtype, and backward divides it out of the incoming
// gradient, so small fp16 gradients are not flushed to zero before the scale applies. With fp16 the
// two gradients are kept in fp32 until backward has scaled them, then rounded once.
//
// x [N, H] and weight [V, H] in the compute dtype (fp32 or bf16); labels [N] int64. The logits are
// upcast to fp32 for the softmax, as the unfused path does (.to(kFloat) before cross_entropy); the
// weight's gradient is multiplied and accumulated in fp32 (from the fp32 softmax gradient and x's
// rows widened), then cast to the weight's dtype: with bf16 it is more exact than the unfused
// path's bf16 product. Returns a 0-dim fp32 tensor: the sum over
// kept rows of logsumexp(logits) - logits[label]. Gradients flow to x and weight when they require
// them; a second backward through the same graph is refused (the gradients are scaled in place).
#include <torch/torch.h>

namespace tessera::model::ops {

// How ignored rows are skipped: Auto = Compact on the CPU, Weighted elsewhere.
enum class LceRows { Auto, Compact, Weighted };

// chunk_rows: rows per chunk, 0 = linear_cross_entropy_chunk_rows(V, x not on the CPU).
torch::Tensor linear_cross_entropy(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& labels,
                                   int64_t ignore_index, int64_t chunk_rows = 0, LceRows rows = LceRows::Auto,
                                   double grad_scale = 1.0);

// Rows per chunk for a vocabulary of V words: 64 MiB of fp32 logits on the CPU (cache-sized),
// 512 MiB on a device; at least 256 rows.
int64_t linear_cross_entropy_chunk_rows(int64_t V, bool device = false);

}  // namespace tessera::model::ops
