// A square matmul timed on a rank's device: the denominator of metrics' "mfu_of_measured_gemm", a
// diagnostic beside MFU (which divides by the hardware's peak: peak_flops.h).
#pragma once
#include <ATen/core/Tensor.h>

namespace tessera::device {

// FLOP/s of an n x n matmul in `dtype` on `device` over ~0.15 s (n = 512 on a CPU, 4096 on a GPU).
double measure_gemm_flops(at::ScalarType dtype, at::Device device);

}  // namespace tessera::device
