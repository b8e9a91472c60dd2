// AdamW on flat fp32 shards (each rank updates only the slice of each FSDP unit it owns). The
// optimizer owns its state: two moments per shard, allocated on first use (an evaluation never
// allocates them), in `state_dtype`: fp32, bf16 (to go below 16 bytes per parameter), or 8-bit
// block-wise quantized (at::kByte, `optim.state_dtype = int8`; quant8.h).
//
// The math is torch::optim::AdamW's (LibTorch 1.13, amsgrad off), per element:
//   t += 1 (one counter for all shards: every shard takes every step)
//   p *= 1 - lr * weight_decay                      (decoupled decay, only inside the decay ranges)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// On the CPU it runs as ONE pass over (p, g, m, v) per element, in parallel blocks, with no
// temporary larger than a few scalars per element. On a GPU with fp32 moments, where LibTorch has
// at::_fused_adamw_ (2.1 and later; util/torch_compat.h), it is that kernel, torch.optim.AdamW
// (fused=True)'s: two multi-tensor passes over views of every shard, one over the decayed ranges
// and one over the rest (weight decay 0), no temporary at all (the same formula in fp32; its decay
// is p -= lr * wd * p, a rounding apart from the multiply below). bf16 and 8-bit moments on a GPU
// (and fp32 ones where LibTorch has no _fused_adamw_) run Tessera's own kernel (runtime/gpu/adamw.cu):
// that kernel of LibTorch's takes moments of the parameters' dtype only, and the 8-bit blocks need
// their (de)quantization around the update. Tessera's kernel is one pass over every shard, a thread
// block per chunk (an 8-bit block is dequantized, updated and re-quantized in registers), and its
// per-element update is the CPU loop's own function (runtime/gpu/adamw_math.h): the same bits.
// Both kernels read the clipping coefficient and the skip flag on the device (folds_clipping,
// skips_itself), so no host wait and no separate clipping pass precede them.
// Elsewhere (fused_device false; CPU shards with fused_cpu false) the same formula runs as
// multi-tensor (_foreach_) ops over groups of shard pieces of at most group_elems elements in all:
// about ten operations per group (a handful per step for most models, against several per 1M-element
// block before), and no temporary larger than a group (fp32: the denominator, and the clipped
// gradient when clipping applies; bf16 moments add their two fp32 copies). The update is
// elementwise, so a sharded run and an unsharded one agree bit for bit; against torch's own AdamW
// (a sequence of whole-tensor ops) results agree to float rounding.
//
// bf16 state: m and v are stored in bf16 and widened to fp32 for each element's update, then
// rounded to nearest-even once. Equivalent to the fp32 run within the tolerance stated in
// tests/mpi/test_fsdp_train.cpp (BelowSixteenBytes).
//
// 8-bit state (Dettmers et al. 2021; quant8.h): per shard, blocks of `block` elements from the
// shard's start, each with an fp32 absmax; m in the signed dynamic map, v in the unsigned one. A
// step dequantizes a block, updates every element in fp32 exactly as above (the parameter update
// uses the fresh fp32 moments, as bitsandbytes does), then stores the block's new absmax and
// re-quantizes it. The CPU loop does this one block at a time (the block's fp32 moments stay in a
// per-thread buffer of 2 x block floats); the tensor-op path dequantizes a group's pieces into fp32
// temporaries, runs the same multi-tensor ops, and re-quantizes them with tensor ops (searchsorted
// on the code midpoints). 2 bytes per parameter plus 8 bytes per block of the two absmax.
// Checkpoints store the bytes and the absmax as they are (kinds "exp_avg.q8", "exp_avg.absmax",
// "exp_avg_sq.q8", "exp_avg_sq.absmax"), so a resume is bit-exact; with the FSDP alignment a
// multiple of the block (state_alignment()), the blocks are the same at every world size.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/gpu/adamw_math.h"
#include "runtime/named_shards.h"
#include "runtime/optim/names.h"
#include "runtime/optim/options.h"
#include "runtime/optim/quant8.h"

namespace tessera::optim {

// optim.state_dtype as a tensor dtype: kFloat, kBFloat16, kByte (8-bit).
at::ScalarType state_scalar_type(StateDtype d);

// The user's settings (options.h: betas, eps, weight decay, the moments' dtype) and the
// optimizer's own tuning. step() takes the scheduled learning rate.
struct AdamWOptions : Options {
  AdamWOptions() = default;
  explicit AdamWOptions(const Options& o) : Options(o) {}
  at::ScalarType state_type() const { return state_scalar_type(state_dtype); }  // kFloat, kBFloat16 or kByte
  int64_t block = q8::kDefaultBlock;        // 8-bit state: elements per absmax block (a power of two <= kMaxBlock)
  bool fused_cpu = true;  // CPU shards: the one-pass loop (false: the tensor-op path; for tests)
  int64_t group_elems = int64_t(1) << 25;  // tensor-op path: elements per group (32M: 128 MiB per fp32 temporary)
  // GPU shards: a fused kernel, at::_fused_adamw_ (fp32 moments, where LibTorch has it) or
  // Tessera's (the others); false: the tensor-op path
  bool fused_device = true;
  bool torch_fused = true;  // fp32 moments on a GPU: LibTorch's kernel where it has one (false: Tessera's; tests)
  // train.device_step: CPU shards stand for a GPU's and take its fused kernels' contract -- step()
  // takes the skip flag and the clipping coefficient as tensors, which the CPU loop reads where they
  // are, as the kernel reads device memory -- so the step's norm, clipping and skip stay tensor
  // operations with no host read before the update, as on a GPU (folds_clipping on the CPU).
  bool cpu_stands_for_device = false;
};

// [0, numel) less `ranges` (sorted, disjoint, inside it): the gaps between them, in order.
std::vector<std::pair<int64_t, int64_t>> ranges_outside(int64_t numel, const std::vector<std::pair<int64_t, int64_t>>& ranges);

// Elements [first, first + second) of a flat shard.
using Range = std::pair<int64_t, int64_t>;

// One flat shard as the optimizer sees it: all the same numel, param/grad float32 on one device.
struct ParamShard {
  at::Tensor param;          // fp32 master shard, updated in place
  at::Tensor grad;           // fp32 gradient shard; undefined -> the shard is skipped this step
  std::vector<Range> decay;  // where weight decay applies (sorted, disjoint); empty: nowhere
  // The shard lives in host memory (fsdp.offload): its moments are allocated beside it and charged
  // to host memory in the memory breakdown (memory::Where::Host); on a CPU shard the fused loop runs.
  bool host = false;
};

class AdamW {
 public:

  explicit AdamW(AdamWOptions options);

  // Increments the step count, then updates every shard with learning rate `lr`. Each gradient
  // element is multiplied by `grad_scale` as it is read (gradient clipping folded into the one pass:
  // the same float product torch's clip_grad_norm_ stores, so the result is the same bits as
  // clipping the gradients first); the gradients themselves are left as they are.
  //
  // `found_inf` (optional; a float scalar: 1 skips, 0 steps, as torch's GradScaler's): the step is skipped by the optimizer
  // itself -- masters, moments and the step count stay as they were -- so the caller can enqueue the
  // update before it reads the loss and norm back (no host wait before it on a GPU). Only where
  // skips_itself() says so: the fused kernel reads it on the device, the CPU loop on the host; the
  // tensor-op path would need extra passes to skip, and refuses it (the caller decides first). On the
  // device the host's step count cannot know: it is incremented, and a caller that learns of the skip
  // later puts it back (set_step_count).
  //
  // `device_scale` (optional; an fp32 0-dim tensor on the shards' device): the clipping coefficient
  // computed on the device, in place of grad_scale, only where folds_clipping() says so.
  void step(const std::vector<ParamShard>& shards, double lr, float grad_scale = 1.0f,
            const at::Tensor& found_inf = at::Tensor(), const at::Tensor& device_scale = at::Tensor());
  // Whether step() takes `found_inf` for these shards, with found_inf on `device`: every shard with a
  // gradient runs the CPU loop (found_inf on the CPU) or the fused kernel (found_inf on their device).
  bool skips_itself(const std::vector<ParamShard>& shards, const at::Device& device) const;
  // Whether step() takes a device's clipping coefficient (device_scale) for these shards: every
  // shard with a gradient is on `device`, a GPU, and runs a fused kernel (or, standing for one,
  // the CPU: cpu_stands_for_device with the CPU loop).
  bool folds_clipping(const std::vector<ParamShard>& shards, const at::Device& device) const;

  // The moments of every shard (per_unit[i] belongs to shards[i]), allocated (zeros) where not
  // yet: for checkpoints, which read or fill them. `shards` gives each shard's numel and device.
  // fp32 / bf16: "exp_avg", "exp_avg_sq". 8-bit: "exp_avg.q8", "exp_avg_sq.q8" (uint8, one per
  // element) and "exp_avg.absmax", "exp_avg_sq.absmax" (fp32, one per block: NamedShards::block).
  std::vector<NamedShards> state(const std::vector<ParamShard>& shards);
  // Bytes of state per parameter element, rounded down (8 for fp32 moments, 4 for bf16, 2 for
  // 8-bit); state_bytes() is exact.
  int64_t state_bytes_per_element() const;
  // Bytes of state for one shard of `numel` elements (8-bit: 2 x numel + 2 x 4 per block).
  int64_t state_bytes(int64_t numel) const;

  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t n) { step_count_ = n; }  // for checkpoint resume
  const AdamWOptions& options() const { return options_; }

 private:
  void ensure_state(const std::vector<ParamShard>& shards);
  // The tensor-op path's views of shard i's decayed ranges, made once (views are operator
  // dispatches too) and made again only if the shard's storage, size or ranges change.
  struct DecayViews {
    const void* data = nullptr;
    int64_t numel = -1;
    std::vector<Range> ranges;
    std::vector<at::Tensor> views;
    at::Tensor on_device;  // Tessera's kernel: the ranges as (begin, length) int64 pairs on the shard's device
  };
  const std::vector<at::Tensor>& decay_views_of(size_t i, const ParamShard& s);
  bool quantized() const { return options_.state_dtype == StateDtype::Int8; }
  const q8::CodebookTensors& codebook_tensors(bool is_signed, const at::Device& device);
  bool on_one_gpu(const std::vector<ParamShard>& tensor_path) const;
  bool uses_fused_kernel(const std::vector<ParamShard>& tensor_path) const;  // LibTorch's
  bool uses_own_kernel(const std::vector<ParamShard>& tensor_path) const;    // Tessera's
  void fused_step(const std::vector<ParamShard>& tensor_path, double lr, float grad_scale, const at::Tensor& found_inf,
                  const at::Tensor& device_scale);
  void own_step(const std::vector<ParamShard>& tensor_path, const gpu::AdamWCoefficients& c, const at::Tensor& found_inf,
                const at::Tensor& device_scale);
  // The fused kernel's views of the state it keeps ([decayed][param, exp_avg, exp_avg_sq]) and their
  // ranges, made once and made again only when a shard's storage, size or decay ranges change
  // (`key`), as DecayViews. The gradients' views are made per step: a view kept here would keep a
  // released gradient shard alive (optim.in_backward frees each unit's after its update).
  struct FusedLists {
    std::vector<int64_t> key;
    std::vector<at::Tensor> lists[2][3];
    std::vector<std::pair<size_t, Range>> ranges[2];  // (shard, range) of each view, in list order
  };
  const FusedLists& fused_lists_of(const std::vector<ParamShard>& tensor_path);
  FusedLists fused_lists_;
  at::Tensor step_tensor_;  // fused kernel: the step count as an fp32 scalar on the shards' device
  AdamWOptions options_;
  int64_t step_count_ = 0;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;        // the moments (8-bit: their code bytes)
  std::vector<at::Tensor> absmax_avg_, absmax_avg_sq_;  // 8-bit: each block's absmax (fp32)
  std::vector<DecayViews> decay_views_;
  q8::CodebookTensors codes_m_, codes_v_;  // 8-bit, tensor-op path: the codebooks on the shards' device
};

// Whether AdamW's update of shards on a GPU with moments of `state_dtype` is Tessera's own kernel
// (runtime/gpu/adamw.cu): bf16 and 8-bit moments, and fp32 ones where LibTorch has no _fused_adamw_.
bool device_update_is_tesseras(at::ScalarType state_dtype);

// fp32 | bf16 | int8 (the 8-bit state: at::kByte); Error(Input) otherwise.
at::ScalarType parse_state_dtype(const std::string& s);
// The FSDP alignment (elements) a state dtype needs so that its blocks are the same at every world
// size and checkpoints reshard them: the 8-bit block size (q8::kDefaultBlock), else 1.
int64_t state_alignment(at::ScalarType state_dtype);
// Optimizer-state bytes per parameter for the planner: 8 (fp32), 4 (bf16), 2 + 8 / 2048 (8-bit).
double state_bytes_per_param(at::ScalarType state_dtype);

}  // namespace tessera::optim
