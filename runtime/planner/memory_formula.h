// The memory model: per rank, per phase, what a rank of THIS implementation holds, by the same
// categories the tracker measures (runtime/memory/tracker.h). `tessera plan` predicts with it,
// `tessera bench memory` and tests/mpi compare it with measured peaks, and `tessera train` checks
// the host limit with it before loading. A byte that is in a rank but not in this formula is a bug
// in one or the other.
//
// Notation: P_u the padded flat size of unit u at the shard group size S (ShardPlan), c_u = P_u / S
// its shard, p / r / s the bytes of the compute (param) dtype, the reduce dtype and one optimizer
// moment, G = fsdp.limit_all_gathers, K = fsdp::kMaxReductionsInFlight, L layers.
//
// Static, every strategy (held from the first step on):
//   master 4 sum c_u      gradient shard 4 sum c_u      optimizer 2 s sum c_u (+ 8 sum c_u / B)
// so 16 bytes per parameter of the shard with fp32 moments, 12 with bf16 ones, 10 + 8 / B with
// 8-bit ones (s = 1, two fp32 absmax per block of B = 2048 elements); S = the world for
// full_shard / shard_grad_op, the node for hybrid_shard, 1 for no_shard. optim.in_backward with one
// micro-step: gradient shard 4 max c_u (each unit's shard is released at its update in backward).
// Training step (the maximum over the moments of forward, loss, backward and reductions, each the
// sum below; runtime/planner/memory_formula.cpp walks them in the order the engine runs):
//   gathered params  root P_0 p from the first forward to the end of backward, plus layers:
//                    full_shard / hybrid_shard: the running layer and the prefetched one
//                    (min(G, 2), 1 without prefetch); shard_grad_op / no_shard: every layer run so
//                    far in this forward, until its backward
//   unsharded grads  autograd's gradients of the unit in backward (its parameters x p), the root's
//                    (lm_head during backward, + the embedding's at the end), and the flat
//                    reduction inputs P_u r of up to K + 1 units (none when S = 1: no_shard adds
//                    straight into its gradient); fsdp.accumulate = unsharded: 4 P_u for every unit
//                    between micro-steps
//   comm buffers     reduce-scatter outputs c_u r (K + 1), the all-gather input cast c_u p
//   saved tensors    per layer, model/activations.h's layer_saved (layer_input with activation
//                    checkpointing), for the layers whose backward has not run yet
//   activations      the running layer's (or the head's) transient, recomputation under
//                    activation checkpointing, the gradient of the hidden state
// Evaluation: master + gathered params as in forward + one layer's inference working set + logits.
// Load (host): masters + the loader's staging (model.load: rank0 reading rank: 2 units as stored;
// parallel: none; naive: the whole model in fp32). Save (host): a snapshot of every kind
// (4 + 2 s) sum c_u when the save is asynchronous (checkpoint.async); a synchronous save writes
// host shards from their memory and streams a GPU's through one staging buffer
// (checkpoint::kStagingBytes, also what widens bf16 moments).
// Host backend (MPI): 16-bit reductions run in fp32 through an accumulator of at most
// kHostWidenedReductionBytes (4 P_u when smaller), and the ring's scratch (its 1/S of that,
// malloc'd: untracked) stays between steps.
// Host offload (fsdp.offload; fsdp.h "Host offload"): the same terms, placed. optimizer: master,
// gradient shard and optimizer state are host bytes (Snapshot::host_bytes); the device keeps the
// parameter shard in the compute dtype, param_shard p sum c_u, as the all-gather's input (no cast
// buffer); each retiring reduction stages its chunk on the host (grad_shard, c_u r; 4 c_u from a
// device chunk of 4 c_u, unsharded_grads, when S = 1). params: param_shard on the host (none when
// p = 4: the master is the shard) and a device buffer c_u p per gather. A GPU plan then has host
// bytes in its training step and evaluation; loading keeps the masters on the host, and a
// synchronous save writes them from there (no snapshot).
// PCIe bytes per rank and optimizer step (Plan::pcie; M micro-steps): down, the reduced chunks,
// M r sum c_u (r sum c_u once with unsharded accumulation; 4 M sum c_u when S = 1); up, the
// parameter shards: optimizer p sum c_u once (after the step), params M p (sum c_u + the layers'
// sum c_u again when the strategy re-gathers in backward); with replicas (R > 1) the final gradient
// shard r sum c_u up and down for the replica all-reduce.
// LoRA (ModelShape::frozen; F_u / f_u the frozen group's padded size and shard): every term above
// counts the adapters; the frozen base adds its stored shard (param_shard, frozen_bytes x sum f_u,
// from the load on), its gathered part beside each gathered unit (F_u p), and, at load, one fp32
// chunk per rank (4 f_u) and on the reading rank in rank0 mode one fp32 unit (4 F_u). The base has
// no master, gradient or optimizer state. QLoRA's quantized groups count the same at
// quantized_bytes per element, plus the gathered NF4 segments of one layer (S x its stored chunk)
// while they are decoded, in forward and in the backward's re-gather (comm_buffers).
// Plus, per process: the base (libraries, MPI, LibTorch: measured, kHostBaseBytes) and, on a GPU,
// the CUDA context and NCCL's buffers (kCudaContextBytes, kNcclBytesPerCommunicator).
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "runtime/fsdp/names.h"
#include "runtime/memory/tracker.h"

namespace tessera::planner {

// The tracker's categories and snapshots (runtime/memory/tracker.h): what a plan is measured against.
using memory::Category;
using memory::kNumCategories;
using memory::Snapshot;

// Resident set of a tessera process before it allocates anything for the model (LibTorch, Open
// MPI with its shared-memory transport, glibc; `process_base` in metrics.jsonl), with the build's
// lean libtorch_cpu (cmake/lean_libtorch.cmake): the middle of the ranges measured on two hosts
// (docs/PERFORMANCE.md#build-suite-and-start-up-measurements).
constexpr int64_t kHostBaseBytes = int64_t(112) << 20;
// What the tracker never sees on the host (MPI and BLAS internals, allocator slack with the fixed
// mmap threshold of configure_process_allocators): 25-45 MiB measured at 1-4 ranks.
constexpr int64_t kHostUntrackedBytes = int64_t(40) << 20;
// The same for evaluation (no backward, no optimizer: less allocator slack): 17 MiB measured at 2 ranks.
constexpr int64_t kHostEvalUntrackedBytes = int64_t(20) << 20;
// GPU-only constants, from vendor documentation and common reports, NOT measured by this project
// (no GPU has run it yet): a CUDA 12/13 context on Hopper, and NCCL's buffers per communicator
// (NCCL_BUFFSIZE 4 MiB x channels x 2 directions for a ring of NVLink peers).
constexpr int64_t kCudaContextBytes = int64_t(512) << 20;
constexpr int64_t kNcclBytesPerCommunicator = int64_t(256) << 20;

// Activation terms of the model family for one micro-batch (see model/activations.h).
struct ActivationTerms {
  int64_t layer_input = 0, layer_saved = 0, layer_forward_transient = 0, layer_backward_transient = 0;
  int64_t head_saved = 0, head_forward_transient = 0, head_backward_transient = 0, logits = 0;
};

// A model as the planner sees it: its FSDP units' parameter shapes ([0] the root: embeddings, final
// norm, lm_head; [1..] the decoder layers), which root parameters belong to the head (lm_head
// and the final norm: their gradients appear at the start of backward, the embedding's at its end)
// and the activation terms (a function of the micro-batch, so a callback).
// LoRA: `units` are the trainable parameters (the adapters) and `frozen` the frozen base, per unit
// (empty: none), each laid out by its own ShardPlan as the engine does; QLoRA's quantized weights
// are in `quantized` instead (fsdp::UnitDef::quantized), a group of their own per unit.
struct ModelShape {
  std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>> units;
  std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>> frozen;
  std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>> quantized;
  std::vector<bool> root_param_in_head;  // per root parameter
  int64_t parameters = 0;
};

using fsdp::LoadMode;

struct RunShape {
  fsdp::Strategy strategy = fsdp::Strategy::FullShard;
  int world = 1, ranks_per_node = 1;    // hybrid_shard shards over a node
  int param_bytes = 4, reduce_bytes = 4, state_bytes = 4;  // compute dtype, reduce dtype, one moment
  int64_t state_block = 0;  // 8-bit moments (state_bytes 1): elements per absmax block; 0: none
  int stored_bytes = 2;                  // the checkpoint's dtype on disk (loading)
  int limit_all_gathers = 2;
  bool prefetch = true, activation_checkpointing = false, accumulate_unsharded = false;
  bool optimizer_in_backward = false;  // optim.in_backward: one unit's gradient shard at a time
  fsdp::Offload offload = fsdp::Offload::None;  // fsdp.offload: shard state in host memory
  int64_t grad_accum = 1;
  bool checkpoint_async = false;
  LoadMode load = LoadMode::Rank0;
  bool gpu = false;  // shards, gathered units and activations on a GPU; host keeps base, load, save
  int64_t align = 16;
  // LoRA: bytes per element of the frozen base's stored shard (lora.base_dtype), and of QLoRA's
  // quantized weights (nf4: about 0.56 with its block scales, 0.52 with double quantization), whose
  // groups align to quantized_align elements (NF4's block).
  double frozen_bytes = 2, quantized_bytes = 0.5625;
  int64_t quantized_align = 64;
};

// One phase on one kind of memory: bytes per category at its peak and where that peak is.
struct PhaseEstimate {
  Snapshot bytes;          // the tracked categories (Snapshot::phase names the moment)
  int64_t base = 0;        // process base (host) or CUDA context + NCCL (GPU)
  int64_t untracked = 0;   // host allowance for what the tracker cannot see
  int64_t total() const { return bytes.total() + base + untracked; }
  nlohmann::json to_json() const;
};

// Host offload's copies between the device and the host, bytes per rank and optimizer step.
struct Pcie {
  int64_t up = 0, down = 0;  // host -> device, device -> host
  // Seconds per step at `bytes_per_s` each way, the two directions overlapping.
  double seconds(double bytes_per_s) const { return static_cast<double>(std::max(up, down)) / bytes_per_s; }
};
// A PCIe 4.0 x16 link (A100 nodes): 32 GB/s per direction nominal, ~25 GB/s reached by pinned
// copies in vendor benchmarks. Not measured by this project (no GPU has run it).
constexpr double kPcieBytesPerSecond = 25e9;

struct Plan {
  // Host: every phase; GPU (gpu runs only): train and eval.
  PhaseEstimate load_reader, load_other, train_host, save_host, eval_host;
  PhaseEstimate train_gpu, eval_gpu;
  // The floor of the training step and of evaluation, tracked bytes only (add the process base):
  // the shard state, the gathered units the strategy must hold (full_shard / hybrid_shard: the root
  // and min(G, 2) layers; the others: every layer) with their gradients in the compute dtype, and
  // the activations at the step's peak. What the estimate holds beyond it is the price of the
  // implementation (reduction buffers in the reduce dtype, collective buffers).
  int64_t train_floor = 0, eval_floor = 0;
  int shard_size = 1, replicate_size = 1;
  fsdp::Offload offload = fsdp::Offload::None;
  Pcie pcie;  // host offload's traffic per step (zero without offload)
  int64_t shard_elements = 0;   // sum of c_u
  int64_t peak_host() const;    // max over the host phases (the reading rank's load included)
  int64_t peak_gpu() const;     // 0 for CPU runs
};

// The activation terms come from the model family at (micro_batch, seq_len, compute bytes).
Plan estimate(const ModelShape& model, const ActivationTerms& act, const RunShape& run);

}  // namespace tessera::planner
