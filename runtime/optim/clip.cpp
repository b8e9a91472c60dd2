#include "runtime/optim/clip.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard: ATen.h no longer brings it in LibTorch 2.11
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "runtime/comm/communicator.h"
#include "runtime/profile/phase.h"
#include "util/error.h"

namespace tessera::optim {

namespace {

// Sum of squares of CPU gradients in double, in one pass without temporaries: fixed blocks of
// kCpuBlock elements, each summed in order with 8 interleaved accumulators (so the compiler
// pipelines it), the block sums then added in block order -- the same result for any number of
// threads. Non-float or non-contiguous tensors go through a widened copy of their block.
double cpu_square_sum(const std::vector<at::Tensor>& grads) {
  constexpr int64_t kCpuBlock = int64_t(1) << 16;
  double total = 0;
  for (const at::Tensor& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    const at::Tensor flat = g.scalar_type() == at::kFloat && g.is_contiguous() ? g.reshape(-1)
                                                                                : g.reshape(-1).to(at::kFloat).contiguous();
    const float* x = flat.data_ptr<float>();
    const int64_t n = flat.numel(), blocks = (n + kCpuBlock - 1) / kCpuBlock;
    std::vector<double> block_sums(static_cast<size_t>(blocks));
    at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t lo = b * kCpuBlock, hi = std::min(n, lo + kCpuBlock);
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t i = lo;
        for (; i + 8 <= hi; i += 8)
          for (int k = 0; k < 8; ++k) acc[k] += static_cast<double>(x[i + k]) * static_cast<double>(x[i + k]);
        for (; i < hi; ++i) acc[0] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
        block_sums[static_cast<size_t>(b)] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      }
    });
    for (double v : block_sums) total += v;
  }
  return total;
}

// The same on a device, as tensor ops into `local` ([1] double): one norm per gradient shard,
// reduced in double inside the kernel (no widened copy), then squared and summed together -- a
// launch per shard and three per step instead of four per 1M-element block.
void device_square_sum(const std::vector<at::Tensor>& grads, at::Tensor& local) {
  std::vector<at::Tensor> norms;
  for (const at::Tensor& g : grads)
    if (g.defined() && g.numel() > 0)
      norms.push_back(at::linalg_vector_norm(g, 2, c10::nullopt, /*keepdim=*/false, at::kDouble));  // of all elements
  if (!norms.empty()) local.add_(at::stack(norms).square().sum());
}

// Every rank's sum of squares of its gradient shards, in double on the gradients' device, as a
// [size] tensor in rank order (the raw bits are all-gathered, so every rank adds the same numbers
// in the same order and gets the same norm); [1] without a group.
// tensor_ops: the device path even for CPU tensors (the trainer's device_step).
at::Tensor partial_square_sums(const std::vector<at::Tensor>& grads, comm::Communicator* shard_group, bool tensor_ops) {
  at::NoGradGuard no_grad;
  at::Device device = at::kCPU;
  for (const at::Tensor& g : grads)
    if (g.defined()) {
      device = g.device();
      break;
    }
  at::Tensor local = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device));
  if (device.is_cpu() && !tensor_ops) local.data_ptr<double>()[0] = cpu_square_sum(grads);
  else device_square_sum(grads, local);
  return gather_partials(local, shard_group);
}

}  // namespace

at::Tensor gather_partials(const at::Tensor& local, comm::Communicator* shard_group) {
  if (shard_group == nullptr || shard_group->size() == 1) return local;
  // Host gradients (fsdp.offload) on a device group: the partial sums travel through the group's device.
  const at::Tensor on_group = local.device() == shard_group->device() ? local : local.to(shard_group->device());
  const at::Tensor bits_in = on_group.view(at::kLong);
  at::Tensor bits_out = at::empty({shard_group->size()}, bits_in.options());
  {
    profile::Phase sync(profile::Part::SyncWait);  // the slowest rank's backward shows here
    shard_group->all_gather_into(bits_out, bits_in)->wait();
  }
  return bits_out.view(at::kDouble).to(local.device());
}

double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0 || !std::isfinite(norm)) return 1.0;
  return std::min(1.0, max_norm / (norm + 1e-6));
}

double global_grad_norm(const std::vector<at::Tensor>& local_grad_shards, comm::Communicator* shard_group) {
  const at::Tensor partial = partial_square_sums(local_grad_shards, shard_group, /*tensor_ops=*/false).cpu();
  const double* p = partial.data_ptr<double>();
  double total = 0;
  for (int64_t r = 0; r < partial.numel(); ++r) total += p[r];
  return std::sqrt(total);
}

double clip_grad_norm(std::vector<at::Tensor>& grads, double max_norm, comm::Communicator* shard_group) {
  TESSERA_CHECK_INPUT(max_norm > 0, "gradient clipping max_norm must be positive, got " + std::to_string(max_norm));
  const double norm = global_grad_norm(grads, shard_group);
  const double coef = clip_coefficient(norm, max_norm);
  if (coef < 1.0) {
    at::NoGradGuard no_grad;
    for (at::Tensor& g : grads)
      if (g.defined()) g.mul_(coef);
  }
  return norm;
}

at::Tensor grad_norm_on_device(const std::vector<at::Tensor>& grads, comm::Communicator* shard_group) {
  at::NoGradGuard no_grad;
  const at::Tensor partial = partial_square_sums(grads, shard_group, /*tensor_ops=*/true);
  // Every rank holds the same partial sums: one deterministic sum gives every rank the same norm.
  return partial.sum().sqrt_();
}

at::Tensor clip_coefficient_on_device(const at::Tensor& norm, double max_norm) {
  at::NoGradGuard no_grad;
  const at::Tensor coef = at::full_like(norm, max_norm).div_(norm + 1e-6).clamp_max_(1.0);
  return at::where(at::isfinite(norm), coef, at::ones_like(coef)).to(at::kFloat);
}

at::Tensor clip_grad_norm_on_device(std::vector<at::Tensor>& grads, double max_norm, comm::Communicator* shard_group) {
  at::NoGradGuard no_grad;
  const at::Tensor norm = grad_norm_on_device(grads, shard_group);
  if (max_norm > 0) {
    const at::Tensor coef = clip_coefficient_on_device(norm, max_norm);
    for (at::Tensor& g : grads)
      if (g.defined()) g.mul_(coef);
  }
  return norm;
}

}  // namespace tessera::optim
