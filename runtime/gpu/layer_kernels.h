// The layer kernels' launch interface (rms_norm.cu, swiglu.cu, rope.cu, cross_entropy.cu), plain C++ so that nvcc compiles the
// kernels without LibTorch: kernels_cuda.cpp passes raw device pointers. The contracts are
// util/device_kernels.h's; model/fused_ops.cpp's loops are their references, with the same
// roundings. RMSNorm: rstd = 1 / sqrt(sum(x^2) / n + eps), h = round(x rstd), y = round(w h);
// g = round(gy w), gx = round(rstd g - rstd^3 x sum(g x) / n); gw = sum over rows of gy round(x rstd),
// in fp32 (sums in another order than the reference's: a block's tree). SwiGLU, RoPE: elementwise.
#pragma once
#include <cstdint>

namespace tessera::gpu {

enum class KernelDtype { F32 = 0, BF16 = 1, F16 = 2 };

// y, rstd from x [rows, n], w [n], asynchronously on `stream` (a cudaStream_t). Returns the launch's
// cudaError_t as an int (0: launched).
int rms_norm_forward_launch(const void* x, const void* w, int64_t rows, int64_t n, float eps, KernelDtype t, void* y,
                            float* rstd, void* stream);
// gx [rows, n], and the weight gradient's partial sums over `chunks` slices of the rows into
// gw_partial [chunks, n] (fp32; the caller sums them over the chunks).
int rms_norm_backward_launch(const void* gy, const void* x, const void* w, const float* rstd, int64_t rows, int64_t n,
                             KernelDtype t, void* gx, float* gw_partial, int64_t chunks, void* stream);

// h [rows, I] = silu(gate) * up of gu [rows, 2 I] (gate's columns first), and backward from gh into
// ggu [rows, 2 I].
int swiglu_forward_launch(const void* gu, int64_t rows, int64_t inter, KernelDtype t, void* h, void* stream);
int swiglu_backward_launch(const void* gh, const void* gu, int64_t rows, int64_t inter, KernelDtype t, void* ggu, void* stream);

// RoPE of the [B, H, T, D] view at x (strides sx, the last 1) into o (strides so) with tables [R, D]
// (row b T + t when R = B T, else t); backward (the gradient's formula) when `backward`.
struct RopeLayout {
  int64_t B, H, T, D, R;
  int64_t sx[4], so[4];
};
int rope_launch(const void* x, const void* cos, const void* sin, const RopeLayout& l, bool backward, KernelDtype t, void* o,
                void* stream);

// The head's cross entropy over z [rows, V] (fp32, in place with `grad`), labels [rows], row weights
// (null: 1), into loss_rows [rows] (util::CrossEntropyRows).
int cross_entropy_rows_launch(float* z, const int64_t* labels, const float* weights, int64_t rows, int64_t V, float scale,
                              bool grad, float* loss_rows, void* stream);

}  // namespace tessera::gpu
