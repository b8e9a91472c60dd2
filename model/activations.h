// Activation memory of the Llama family in THIS implementation (model/llama.cpp on LibTorch):
// what autograd keeps from a decoder layer's forward for its backward, counted tensor by tensor
// from the ops the modules run (model/activations.cpp lists them), plus the largest temporaries a
// layer's forward and backward hold on top. The memory model (runtime/planner/memory_formula.h) builds its
// per-step peak from these; tests/unit/test_memory_model.cpp measures each term with the allocation
// tracker on real forward/backward passes and requires the formula to match.
//
// All sizes in bytes for one micro-batch of B sequences of T tokens, computed in a dtype of
// `elem` bytes (4 fp32, 2 bf16/fp16), with the kernels `k` says.
#pragma once
#include <cstdint>

#include "model/config.h"

namespace tessera::model {

struct ActivationBytes {
  int64_t layer_input = 0;               // a layer's input [B, T, H] (all activation checkpointing keeps)
  int64_t layer_saved = 0;               // kept from one layer's forward for its backward, input included
  int64_t layer_forward_transient = 0;   // most held beyond layer_saved while a layer runs forward
  int64_t layer_backward_transient = 0;  // most held beyond layer_saved while a layer runs backward
  int64_t head_saved = 0;                // final norm, lm_head input, fp32 log-softmax kept for backward
  int64_t head_forward_transient = 0;    // logits and their fp32 copy while the loss is formed
  int64_t head_backward_transient = 0;   // gradients of the logits while the head runs backward
  int64_t logits = 0;                    // [B, T, V] in the compute dtype (evaluation returns these)
};

// The kernels a run uses: they decide what autograd keeps and what the ops hold on top.
struct Kernels {
  // Attention through scaled_dot_product_attention without a T x T score matrix (LibTorch >= 2:
  // flash / memory-efficient kernels); false: the explicit softmax(q k^T) v (LibTorch 1.13).
  bool fused_attention = false;
  // bf16 products computed in fp32 (model/widened_gemm.h: a CPU without AVX-512); no effect in fp32.
  bool widened_gemm = false;
  // GQA attention keeps K and V at their own heads (SDPA's enable_gqa on the flash kernel: LibTorch
  // >= 2.5 on a GPU, 16-bit compute, rows not packed, no sliding window); false: repeated to every
  // query head.
  bool gqa_attention = false;
  // Packed rows and sliding windows run on the variable-length flash kernel (ops::varlen_attention:
  // LibTorch >= 2.6 on a GPU, 16-bit compute): K and V at their own heads, no mask.
  bool varlen_attention = false;
  // RMSNorm as one kernel (model/fused_ops.h: runtime/gpu's, installed on a CUDA device): it
  // keeps its input and an fp32 rstd per row instead of the input's fp32 form and its normalised form.
  bool fused_norm = false;
  // SwiGLU as one kernel over the one product of gate and up (model/fused_ops.h): it keeps that
  // product (2 I per row) instead of gate, silu(gate) and up.
  bool fused_swiglu = false;
  // The fused head's chunks are a device's (512 MiB of fp32 logits, not the CPU's 64 MiB:
  // ops::linear_cross_entropy_chunk_rows).
  bool device_head = false;
};

// frozen_head (LoRA: the head's weight is part of the frozen base): the fused loss makes no weight
// gradient, so neither its fp32 accumulator nor its saved copy in the compute dtype exists.
ActivationBytes activation_bytes(const ModelConfig& cfg, int64_t B, int64_t T, int elem, Kernels k,
                                 bool frozen_head = false);

// The kernels of a run of this build on a GPU (LibTorch >= 2's fused attention, bf16 products as
// they are, Tessera's own norm and SwiGLU kernels unless `fused_kernels` is off: model.fused_kernels;
// the variable-length flash kernel unless `varlen` is off: model.varlen_attention) or on this
// machine's CPU (fused attention when this build's LibTorch has it: >= 2).
Kernels run_kernels(bool gpu, bool packed = false, bool fused_kernels = true, bool varlen = true);

}  // namespace tessera::model
