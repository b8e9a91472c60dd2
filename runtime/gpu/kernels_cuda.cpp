// Tessera's own kernels for model/, installed into util::device_kernels() (gpu.h's install_kernels):
// the fused RMSNorm (rms_norm.cu), SwiGLU (swiglu.cu), RoPE (rope.cu) and the head's row-wise cross
// entropy (cross_entropy.cu) on the current stream of the input's device; and the optimizer's
// (gpu.h's adamw_update: adamw.cu, kAdamWMaxShards shards a launch), which runtime/optim/adamw.cpp
// calls for shards on a GPU whose moments LibTorch's fused kernel does not take. The caller
// (model/fused_ops.cpp, model/linear_cross_entropy.cpp) checked the inputs' layout and allocated the
// outputs on their device. Empty unless TESSERA_WITH_CUDA.
#include "runtime/gpu/gpu.h"

#ifdef TESSERA_WITH_CUDA
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "runtime/gpu/adamw_kernel.h"
#include "runtime/gpu/layer_kernels.h"
#include "util/device_kernels.h"
#include "util/error.h"

namespace tessera::gpu {

namespace {

KernelDtype kernel_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return KernelDtype::F32;
    case at::kBFloat16: return KernelDtype::BF16;
    case at::kHalf: return KernelDtype::F16;
    default: throw Error(ErrorKind::Internal, "layer kernels: fp32, bf16 or fp16 only, got " + std::string(c10::toString(t.scalar_type())));
  }
}

void check_launch(int rc, const char* what) {
  if (rc != 0)
    throw Error(ErrorKind::Internal, std::string(what) + " kernel launch failed: " + cudaGetErrorString(static_cast<cudaError_t>(rc)));
}

void* stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

void rms_norm_forward(const at::Tensor& x, const at::Tensor& w, double eps, const at::Tensor& y, const at::Tensor& rstd) {
  const c10::cuda::CUDAGuard guard(x.device());
  check_launch(rms_norm_forward_launch(x.data_ptr(), w.data_ptr(), x.size(0), x.size(1), static_cast<float>(eps), kernel_dtype(x),
                                       y.data_ptr(), rstd.data_ptr<float>(), stream_of(x)),
               "rms_norm forward");
}

void rms_norm_backward(const at::Tensor& gy, const at::Tensor& x, const at::Tensor& w, const at::Tensor& rstd,
                       const at::Tensor& gx, const at::Tensor& gw) {
  const c10::cuda::CUDAGuard guard(x.device());
  // The weight gradient in slices of at least 64 rows, at most 256 slices: partial sums, then their sum.
  const int64_t rows = x.size(0), chunks = std::max<int64_t>(1, std::min<int64_t>(256, rows / 64));
  const at::Tensor partial = at::empty({chunks, x.size(1)}, x.options().dtype(at::kFloat));
  check_launch(rms_norm_backward_launch(gy.data_ptr(), x.data_ptr(), w.data_ptr(), rstd.data_ptr<float>(), rows, x.size(1),
                                        kernel_dtype(x), gx.data_ptr(), partial.data_ptr<float>(), chunks, stream_of(x)),
               "rms_norm backward");
  at::sum_out(const_cast<at::Tensor&>(gw), partial, 0);
}

void swiglu_forward(const at::Tensor& gu, const at::Tensor& h) {
  const c10::cuda::CUDAGuard guard(gu.device());
  check_launch(swiglu_forward_launch(gu.data_ptr(), gu.size(0), gu.size(1) / 2, kernel_dtype(gu), h.data_ptr(), stream_of(gu)),
               "swiglu forward");
}

void swiglu_backward(const at::Tensor& gh, const at::Tensor& gu, const at::Tensor& ggu) {
  const c10::cuda::CUDAGuard guard(gu.device());
  check_launch(swiglu_backward_launch(gh.data_ptr(), gu.data_ptr(), gu.size(0), gu.size(1) / 2, kernel_dtype(gu), ggu.data_ptr(),
                                      stream_of(gu)),
               "swiglu backward");
}

// x [B, H, T, D] (strides as they come, the last 1) and the tables [R, D] checked by the caller.
void rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& o, bool backward) {
  const c10::cuda::CUDAGuard guard(x.device());
  RopeLayout l{x.size(0), x.size(1), x.size(2), x.size(3), cos.size(0), {}, {}};
  for (int d = 0; d < 4; ++d) l.sx[d] = x.stride(d), l.so[d] = o.stride(d);
  check_launch(rope_launch(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), l, backward, kernel_dtype(x), o.data_ptr(), stream_of(x)),
               backward ? "rope backward" : "rope forward");
}
void rope_forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& out) {
  rope(x, cos, sin, out, false);
}
void rope_backward(const at::Tensor& gout, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& gx) {
  rope(gout, cos, sin, gx, true);
}

void cross_entropy_rows(const at::Tensor& z, const at::Tensor& labels, const at::Tensor& weights, double scale, bool grad,
                        const at::Tensor& loss_rows) {
  const c10::cuda::CUDAGuard guard(z.device());
  check_launch(cross_entropy_rows_launch(z.data_ptr<float>(), labels.data_ptr<int64_t>(),
                                         weights.defined() ? weights.data_ptr<float>() : nullptr, z.size(0), z.size(1),
                                         static_cast<float>(scale), grad, loss_rows.data_ptr<float>(), stream_of(z)),
               "cross entropy");
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
  check_launch(adamw_launch(a, adamw_chunks(a), c10::cuda::getCurrentCUDAStream(device.index()).stream()), "adamw");
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
  const at::Tensor& m = shards.front().exp_avg;
  a.moments = m.scalar_type() == at::kByte ? MomentType::Q8 : kernel_dtype(m) == KernelDtype::BF16 ? MomentType::BF16 : MomentType::F32;
  TESSERA_CHECK(m.scalar_type() != at::kHalf, "adamw kernel: fp16 moments");
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

#ifndef TESSERA_CUDA_ARCHITECTURES
#define TESSERA_CUDA_ARCHITECTURES "unknown"
#endif

std::string kernels_unavailable(int device) {
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  int version = 0;
  const int rc = kernel_image_version(&version);
  if (rc == 0) return "";
  cudaDeviceProp prop{};
  std::string sm = "?";
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) sm = std::to_string(prop.major) + std::to_string(prop.minor);
  (void)cudaGetLastError();
  return "cuda:" + std::to_string(device) + " (" + prop.name + ", sm_" + sm + ") has no image of them in this build (" +
         cudaGetErrorString(static_cast<cudaError_t>(rc)) + "; built for CMAKE_CUDA_ARCHITECTURES " + TESSERA_CUDA_ARCHITECTURES +
         ")";
}

void install_kernels() {
  util::DeviceKernels& k = util::device_kernels();
  k.rms_norm_forward = &rms_norm_forward;
  k.rms_norm_backward = &rms_norm_backward;
  k.swiglu_forward = &swiglu_forward;
  k.swiglu_backward = &swiglu_backward;
  k.rope_forward = &rope_forward;
  k.rope_backward = &rope_backward;
  k.cross_entropy_rows = &cross_entropy_rows;
}

}  // namespace tessera::gpu
#endif
