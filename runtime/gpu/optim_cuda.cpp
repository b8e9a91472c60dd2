// Tessera's AdamW kernel for CUDA tensors (gpu.h's adamw_update): runtime/optim/adamw.cpp calls it
// for shards on a GPU whose moments LibTorch's fused kernel does not take (bf16, 8-bit; fp32 where
// LibTorch has no _fused_adamw_). It launches adamw.cu on the current stream of the shards'
// device, kAdamWMaxShards shards a launch. Empty unless TESSERA_WITH_CUDA.
#include "runtime/gpu/gpu.h"

#ifdef TESSERA_WITH_CUDA
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <string>

#include "runtime/gpu/adamw_kernel.h"
#include "util/error.h"

namespace tessera::gpu {

namespace {

MomentType moment_type(const at::Tensor& m) {
  switch (m.scalar_type()) {
    case at::kFloat: return MomentType::F32;
    case at::kBFloat16: return MomentType::BF16;
    case at::kByte: return MomentType::Q8;
    default: throw Error(ErrorKind::Internal, "adamw kernel: moments of " + std::string(c10::toString(m.scalar_type())));
  }
}

AdamWShardArgs shard_args(const AdamWShard& s) {
  AdamWShardArgs a{};
  a.param = s.param.data_ptr<float>();
  a.grad = s.grad.data_ptr<float>();
  a.exp_avg = s.exp_avg.data_ptr();
  a.exp_avg_sq = s.exp_avg_sq.data_ptr();
  if (s.absmax_avg.defined()) a.absmax_avg = s.absmax_avg.data_ptr<float>(), a.absmax_avg_sq = s.absmax_avg_sq.data_ptr<float>();
  if (s.decay.defined() && s.decay.numel() > 0) {
    a.decay = s.decay.data_ptr<int64_t>();
    a.decay_ranges = static_cast<int32_t>(s.decay.numel() / 2);
  }
  a.numel = s.param.numel();
  return a;
}

void launch(AdamWLaunch& a, const at::Device& device) {
  const int rc = adamw_launch(a, adamw_chunks(a), c10::cuda::getCurrentCUDAStream(device.index()).stream());
  if (rc != 0)
    throw Error(ErrorKind::Internal, std::string("adamw kernel launch failed: ") + cudaGetErrorString(static_cast<cudaError_t>(rc)));
  a.n = 0;
}

}  // namespace

void adamw_update(const std::vector<AdamWShard>& shards, const AdamWCoefficients& c, const at::Tensor& grad_scale,
                  const at::Tensor& found_inf, const Q8Codebooks* q8) {
  if (shards.empty()) return;
  const at::Device device = shards.front().param.device();
  const c10::cuda::CUDAGuard guard(device);
  AdamWLaunch a;
  a.c = c;
  a.grad_scale = grad_scale.defined() ? grad_scale.data_ptr<float>() : nullptr;
  a.found_inf = found_inf.defined() ? found_inf.data_ptr<float>() : nullptr;
  a.moments = moment_type(shards.front().exp_avg);
  if (q8) {
    a.block = q8->block;
    a.value_m = q8->value_m.data_ptr<float>(), a.mid_m = q8->mid_m.data_ptr<float>();
    a.value_v = q8->value_v.data_ptr<float>(), a.mid_v = q8->mid_v.data_ptr<float>();
    a.zero_m = q8->zero_m, a.zero_v = q8->zero_v;
  }
  TESSERA_CHECK((a.moments == MomentType::Q8) == (q8 != nullptr), "adamw kernel: 8-bit moments need their codebooks");
  for (const AdamWShard& s : shards) {
    if (s.param.numel() == 0) continue;
    a.shards[a.n++] = shard_args(s);
    if (a.n == kAdamWMaxShards) launch(a, device);
  }
  if (a.n > 0) launch(a, device);
}

}  // namespace tessera::gpu
#endif
