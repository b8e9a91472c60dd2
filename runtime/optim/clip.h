// Global gradient-norm clipping over sharded gradients.
//
// Each rank holds disjoint shards of the gradients; the global L2 norm is
// sqrt(sum over ranks of the local sum of squares). Local sums are taken in double. They are then
// exchanged with an all-gather of their raw 8 bytes (the Communicator's reductions are for
// float/bf16/fp16, and gathering lets every rank add the partial sums in the same rank order), so
// every rank gets a bit-identical norm and a shard group of size 1 gives exactly the local norm.
#pragma once
#include <ATen/core/Tensor.h>

#include <vector>

namespace tessera::comm {
class Communicator;
}

namespace tessera::optim {

// L2 norm of all gradients of the shard group. `shard_group` null (or of size 1) -> local only.
// Collective over `shard_group`: every rank must call it. Undefined tensors are skipped.
double global_grad_norm(const std::vector<at::Tensor>& local_grad_shards, comm::Communicator* shard_group);

// min(1, max_norm / (norm + 1e-6)), torch's clipping coefficient; 1 for a non-finite norm or
// max_norm <= 0. The trainer on a CPU passes it to AdamW::step instead of scaling the gradients.
double clip_coefficient(double norm, double max_norm);

// Like torch::nn::utils::clip_grad_norm_(params, max_norm): computes the global norm, then scales
// every gradient in place by min(1, max_norm / (norm + 1e-6)). Returns the norm before clipping.
// A non-finite norm leaves the gradients untouched (the caller decides whether to skip the step).
double clip_grad_norm(std::vector<at::Tensor>& grads, double max_norm, comm::Communicator* shard_group);

// The same two operations without synchronising the host with the device (for gradients on a GPU):
// the norm stays a 0-dim double tensor on the gradients' device (the same partial sums summed by
// the same kernel, so the same value on every rank), and clipping multiplies by a device-side coefficient
// (1 where no clipping applies or the norm is not finite). max_norm <= 0: norm only. Tensor
// operations whatever the device: one norm per shard and a few per step (on CPU tensors too: the
// tensor-op path's clipping).
at::Tensor clip_grad_norm_on_device(std::vector<at::Tensor>& grads, double max_norm, comm::Communicator* shard_group);
// Its two halves: the norm (0-dim double on the gradients' device), and from it the coefficient as
// a 0-dim fp32 tensor on the same device (1 for a non-finite norm): clip_coefficient's value.
at::Tensor grad_norm_on_device(const std::vector<at::Tensor>& grads, comm::Communicator* shard_group);
at::Tensor clip_coefficient_on_device(const at::Tensor& norm, double max_norm);

// Every rank's `local` sum of squares ([1] double, on any device) as a [size] tensor in rank order:
// its raw bits all-gathered over `shard_group`, so every rank adds the same numbers in the same order
// (the norm is sqrt of their sum); `local` itself without a group. No host synchronisation.
at::Tensor gather_partials(const at::Tensor& local, comm::Communicator* shard_group);

}  // namespace tessera::optim
