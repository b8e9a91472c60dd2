// The layer's glue as one kernel each way (util::DeviceKernels' contracts), on a device where
// runtime/gpu installed the kernels; the CPU keeps LibTorch's composites. The references below are
// the kernels' contracts in plain loops: the CPU build tests them against the composites
// (unit.test_llama: FusedRmsNorm, FusedSwiglu), and the GPU run tests each device kernel against its
// reference (mpi_tests DeviceKernels, in tests/gpu/run.sh's fsdp_train step).
//
// RMSNorm (rms_norm.cu): autograd keeps the input and one fp32 rstd per row, where the composite
// (ops::rms_norm) keeps an fp32 copy of the input, its normalised form and rstd, and runs ~7 kernels
// forward and ~12 backward. ops::rms_norm takes it where fused_rms_norm_runs.
//
// SwiGLU (swiglu.cu) over the one product of gate and up (model/stacked_linear.h): autograd keeps
// that product only (2 I per row), where the composite keeps gate, silu(gate) and up, and runs 2
// kernels forward and 4 backward (silu, the product; the product's two gradients, silu's, and the
// concatenation of gate's and up's). ops::swiglu takes it where fused_swiglu_runs.
//
// RoPE (rope.cu): q or k in one pass each way instead of ~5 kernels (two products, the halves'
// negation and concatenation, the sum); it keeps cos and sin only, as the composite does.
// ops::apply_rotary takes it where fused_rope_runs.
//
// The head's cross entropy (cross_entropy.cu): one block per row of a chunk of fp32 logits for the
// max, the sum of exponentials, the loss and, in place, the softmax's gradient, instead of about
// nine passes over the chunk (model/linear_cross_entropy.cpp takes it on a device where installed).
//
// THREADS: pure functions of their arguments (the reference splits rows over LibTorch's threads).
#pragma once

#include <torch/torch.h>

namespace tessera::model::ops {

// The reference forward and backward (util::RmsNormForward / RmsNormBackward) on CPU tensors.
void rms_norm_reference_forward(const at::Tensor& x, const at::Tensor& w, double eps, const at::Tensor& y,
                                const at::Tensor& rstd);
void rms_norm_reference_backward(const at::Tensor& gy, const at::Tensor& x, const at::Tensor& w, const at::Tensor& rstd,
                                 const at::Tensor& gx, const at::Tensor& gw);

// Whether ops::rms_norm runs x through the fused kernel: a device tensor with a kernel installed.
bool fused_rms_norm_runs(const torch::Tensor& x);

// RMSNorm over x's last dimension through the fused kernel: the installed one for device tensors,
// the reference for CPU ones. Differentiable in x and w.
torch::Tensor fused_rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps);

// SwiGLU's references (util::SwigluForward / SwigluBackward) on CPU tensors.
void swiglu_reference_forward(const at::Tensor& gu, const at::Tensor& h);
void swiglu_reference_backward(const at::Tensor& gh, const at::Tensor& gu, const at::Tensor& ggu);
// Whether ops::swiglu runs x through the fused kernel: a device tensor with a kernel installed.
bool fused_swiglu_runs(const torch::Tensor& x);
// silu(gate) * up of gu [..., 2 I] (gate's columns first) through the fused kernel: the installed
// one for device tensors, the reference for CPU ones. Differentiable in gu; [..., I].
torch::Tensor fused_swiglu(const torch::Tensor& gu);

// RoPE's references (util::RopeForward / RopeBackward) on CPU tensors.
void rope_reference_forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& out);
void rope_reference_backward(const at::Tensor& gout, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& gx);
// Whether ops::apply_rotary runs x through the fused kernel: a device tensor with a kernel installed.
bool fused_rope_runs(const torch::Tensor& x);
// x [B, H, T, D] rotated by cos, sin ([T, D], or [B, 1, T, D] at packed positions) through the fused
// kernel: the installed one for device tensors, the reference for CPU ones. Differentiable in x.
torch::Tensor fused_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// The head's row-wise cross entropy's reference (util::CrossEntropyRows) on CPU tensors.
void cross_entropy_rows_reference(const at::Tensor& z, const at::Tensor& labels, const at::Tensor& weights, double scale,
                                  bool grad, const at::Tensor& loss_rows);

}  // namespace tessera::model::ops
