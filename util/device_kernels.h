// Kernels of Tessera's own that model/ runs on a device without depending on runtime/, where they
// live: runtime/gpu installs them (gpu::install_kernels, called by the launcher when it picks a CUDA
// device). Where none is installed (a CPU build, a CPU run) the pointers are null and the model runs
// LibTorch's composite. Each kernel has a CPU reference with the same contract in model/ (the CPU
// build tests it against the composite; the GPU run tests the kernel against it).
//
// THREADS: installed once, before a model runs; read by the threads that run it.
#pragma once
#include <ATen/core/Tensor.h>

namespace tessera::util {

// RMSNorm over the last dimension of x [rows, n] (contiguous; fp32, bf16 or fp16) with weight w [n]
// of x's dtype, rounded as Hugging Face's LlamaRMSNorm: rstd = 1 / sqrt(mean(x^2) + eps) in fp32,
// h = x * rstd rounded to x's dtype, y = w * h rounded to x's dtype. Writes y [rows, n] and rstd
// [rows] (fp32, for backward), all allocated by the caller on x's device.
using RmsNormForward = void (*)(const at::Tensor& x, const at::Tensor& w, double eps, const at::Tensor& y,
                                const at::Tensor& rstd);
// Its backward from gy [rows, n]: gx [rows, n] (x's dtype) and gw [n] (fp32, summed over the rows),
// with g = gy * w rounded to x's dtype (as the composite's product), gx = rstd g - rstd^3 x sum(g x) / n.
using RmsNormBackward = void (*)(const at::Tensor& gy, const at::Tensor& x, const at::Tensor& w, const at::Tensor& rstd,
                                 const at::Tensor& gx, const at::Tensor& gw);

// SwiGLU of gate and up side by side, gu [rows, 2 I] (contiguous: gate in columns [0, I), up in
// [I, 2 I), as one product of the adjacent weights gives them): h [rows, I] = round(round(silu(g)) u)
// with silu(g) = g / (1 + exp(-g)) in fp32 -- the composite's roundings in gu's dtype.
using SwigluForward = void (*)(const at::Tensor& gu, const at::Tensor& h);
// Its backward from gh [rows, I] into ggu [rows, 2 I] (gate's gradient, then up's): with s = silu(g)
// and sg = 1 / (1 + exp(-g)), gs = round(gh u), g_up = round(gh round(s)),
// g_gate = round(gs sg (1 + g (1 - sg))).
using SwigluBackward = void (*)(const at::Tensor& gh, const at::Tensor& gu, const at::Tensor& ggu);

// RoPE of x [B, H, T, D] (any strides, the last dimension contiguous; fp32, bf16 or fp16) with
// Hugging Face's rotate-half, rounded as the composite: out = round(round(x cos) + round(r sin)),
// r = cat(-x2, x1) over the halves of D; cos and sin [R, D] contiguous in x's dtype, token (b, t)
// using row b T + t when R = B T (packed positions), else row t. out [B, H, T, D] is laid out
// [B, T, H, D] (the composite's layout for a transposed x).
using RopeForward = void (*)(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& out);
// Its backward from gout (as x: any strides) into gx (laid out as out): gx = round(round(g cos) +
// round(r' sin')) with, for the first half, r' sin' = g2 sin2, and for the second, -(g1 sin1).
using RopeBackward = void (*)(const at::Tensor& gout, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& gx);

// The head's cross entropy row by row over a chunk of logits z [rows, V] (fp32, contiguous), labels
// [rows] (int64, valid indices) and row weights w [rows] (fp32; undefined: all 1): loss_rows [rows]
// (fp32) = (m + log(s)) - z[label] with m the row's max and s = sum exp(z - m); with `grad`, z becomes
// in place ((exp(z - m) / s - onehot(label)) * w) * scale, in fp32 (model/linear_cross_entropy.cpp's
// composite, one kernel instead of about nine passes over z).
using CrossEntropyRows = void (*)(const at::Tensor& z, const at::Tensor& labels, const at::Tensor& weights, double scale,
                                  bool grad, const at::Tensor& loss_rows);

struct DeviceKernels {  // each kernel's forward and backward side by side
  RmsNormForward rms_norm_forward = nullptr; RmsNormBackward rms_norm_backward = nullptr;
  SwigluForward swiglu_forward = nullptr; SwigluBackward swiglu_backward = nullptr;
  RopeForward rope_forward = nullptr; RopeBackward rope_backward = nullptr;
  CrossEntropyRows cross_entropy_rows = nullptr;
};

inline DeviceKernels& device_kernels() {
  static DeviceKernels k;
  return k;
}

}  // namespace tessera::util
