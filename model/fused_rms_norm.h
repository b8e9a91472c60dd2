// RMSNorm as one kernel forward and one backward (util::DeviceKernels' contract): autograd keeps the
// input and one fp32 rstd per row, where the composite (ops::rms_norm) keeps an fp32 copy of the
// input, its normalised form and rstd, and runs ~7 kernels forward and ~12 backward.
//
// ops::rms_norm takes it for device tensors where a device kernel is installed (runtime/gpu's
// rms_norm.cu on a CUDA device); the CPU keeps the composite. The reference below is the kernel's
// contract in plain loops: the CPU build tests it against the composite (unit.test_llama,
// FusedRmsNorm), and the GPU run tests the device kernel against it (FsdpDevice).
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

}  // namespace tessera::model::ops
