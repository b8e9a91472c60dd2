// Matmul probes of a rank's device: whether a dtype multiplies there at all (the launcher refuses a
// compute dtype that does not before anything runs), and a square matmul timed (the denominator of
// metrics' "mfu_of_measured_gemm", a diagnostic beside MFU, which divides by the hardware's peak:
// peak_flops.h).
#pragma once
#include <ATen/core/Tensor.h>

#include <string>

namespace tessera::device {

// FLOP/s of an n x n matmul in `dtype` on `device` over ~0.15 s (n = 512 on a CPU, 4096 on a GPU).
double measure_gemm_flops(at::ScalarType dtype, at::Device device);

// "" when `dtype` matmuls run on `device` with this LibTorch, else LibTorch's error (one line). A
// probe (one 2x2 matmul), not a version table: LibTorch 1.13 has no fp16 matmul on CPU
// ("addmm_impl_cpu_" not implemented for 'Half'), later versions may.
std::string unsupported_matmul(at::ScalarType dtype, at::Device device);

}  // namespace tessera::device
