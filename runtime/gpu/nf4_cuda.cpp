// NF4 decode of CUDA tensors (gpu.h's nf4_decode): runtime/quant/nf4.cpp calls it for bytes on a
// GPU; it launches nf4_dequant.cu on the current stream of the bytes' device. The bytes and the
// output were checked by the caller (sizes, dtype, contiguity, same device). Empty unless
// TESSERA_WITH_CUDA.
#include "runtime/gpu/gpu.h"

#ifdef TESSERA_WITH_CUDA
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <string>

#include "util/error.h"

namespace tessera::gpu {

void nf4_decode(const at::Tensor& bytes, int64_t segments, const Nf4KernelLayout& l, bool double_quant,
                     const Nf4Tables& tables, const at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(bytes.device());
  const Nf4OutType type = out.scalar_type() == at::kFloat      ? Nf4OutType::F32
                          : out.scalar_type() == at::kBFloat16 ? Nf4OutType::BF16
                                                               : Nf4OutType::F16;
  const int rc = nf4_dequant_launch(bytes.data_ptr<uint8_t>(), segments, l, double_quant, tables, type, out.data_ptr(),
                                    c10::cuda::getCurrentCUDAStream(bytes.device().index()).stream());
  if (rc != 0)
    throw Error(ErrorKind::Internal, std::string("nf4 dequantize kernel launch failed: ") +
                                         cudaGetErrorString(static_cast<cudaError_t>(rc)));
}

}  // namespace tessera::gpu
#endif
