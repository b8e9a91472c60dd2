#include "runtime/optim/clip.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "runtime/comm/communicator.h"
#include "runtime/error.h"

namespace tessera::optim {

namespace {

// Every rank's sum of squares of its gradient shards, in double on the gradients' device, as a
// [size] tensor in rank order (the raw bits are all-gathered, so every rank adds the same numbers
// in the same order and gets the same norm); [1] without a group.
at::Tensor partial_square_sums(const std::vector<at::Tensor>& grads, comm::Communicator* shard_group) {
  at::NoGradGuard no_grad;
  at::Device device = at::kCPU;
  for (const at::Tensor& g : grads)
    if (g.defined()) {
      device = g.device();
      break;
    }
  at::Tensor local = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device));
  // In blocks: the widened copy is never larger than kSquareSumBlock elements (a whole-shard double
  // temporary would be 2x the fp32 gradient shard).
  constexpr int64_t kSquareSumBlock = int64_t(1) << 20;
  for (const at::Tensor& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    const at::Tensor flat = g.reshape(-1);
    for (int64_t b = 0; b < flat.numel(); b += kSquareSumBlock) {
      const at::Tensor g64 = flat.narrow(0, b, std::min(kSquareSumBlock, flat.numel() - b)).to(at::kDouble);
      local.add_((g64 * g64).sum());
    }
  }
  if (shard_group == nullptr || shard_group->size() == 1) return local;
  const at::Tensor bits_in = local.view(at::kLong);
  at::Tensor bits_out = at::empty({shard_group->size()}, bits_in.options());
  shard_group->all_gather_into(bits_out, bits_in)->wait();
  return bits_out.view(at::kDouble);
}

}  // namespace

double global_grad_norm(const std::vector<at::Tensor>& local_grad_shards, comm::Communicator* shard_group) {
  const at::Tensor partial = partial_square_sums(local_grad_shards, shard_group).cpu();
  const double* p = partial.data_ptr<double>();
  double total = 0;
  for (int64_t r = 0; r < partial.numel(); ++r) total += p[r];
  return std::sqrt(total);
}

double clip_grad_norm(std::vector<at::Tensor>& grads, double max_norm, comm::Communicator* shard_group) {
  TESSERA_CHECK_INPUT(max_norm > 0, "gradient clipping max_norm must be positive, got " + std::to_string(max_norm));
  const double norm = global_grad_norm(grads, shard_group);
  const double coef = max_norm / (norm + 1e-6);
  if (std::isfinite(norm) && coef < 1.0) {
    at::NoGradGuard no_grad;
    for (at::Tensor& g : grads)
      if (g.defined()) g.mul_(coef);
  }
  return norm;
}

at::Tensor clip_grad_norm_on_device(std::vector<at::Tensor>& grads, double max_norm, comm::Communicator* shard_group) {
  at::NoGradGuard no_grad;
  const at::Tensor partial = partial_square_sums(grads, shard_group);
  at::Tensor total = partial.narrow(0, 0, 1).clone();
  for (int64_t r = 1; r < partial.numel(); ++r) total.add_(partial.narrow(0, r, 1));  // rank order
  at::Tensor norm = total.sqrt().reshape({});
  if (max_norm > 0) {
    at::Tensor coef = at::full_like(norm, max_norm).div(norm + 1e-6).clamp_max(1.0);
    coef = at::where(at::isfinite(norm), coef, at::ones_like(coef)).to(at::kFloat);
    for (at::Tensor& g : grads)
      if (g.defined()) g.mul_(coef);
  }
  return norm;
}

}  // namespace tessera::optim
