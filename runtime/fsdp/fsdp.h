// The FSDP engine: each unit (the "root" unit of embeddings/final norm/lm_head, and one unit per
// decoder layer) keeps its parameters as ONE flat fp32 master shard per rank (ShardPlan) and gathers
// the full parameters in the compute dtype only while they are needed:
//
//   strategy        gather for forward  free after forward  free after backward  grads
//   full_shard      all-gather (world)  yes                 yes                  reduce-scatter (world)
//   shard_grad_op   all-gather (world)  no                  yes                  reduce-scatter (world)
//   no_shard        local copy          no                  yes                  all-reduce (world)
//   hybrid_shard    all-gather (intra)  yes                 yes                  reduce-scatter (intra) + all-reduce (inter)
//
// Decoder-layer units run through a custom autograd function: its forward gathers (or waits for a
// prefetched gather), runs the layer, frees; its backward gathers again, recomputes the layer when
// activation checkpointing is on, computes the layer's input and parameter gradients with
// torch::autograd::grad, and issues the reduce-scatter asynchronously. The model is not aware of
// any of it: the runtime swaps the layer's parameter tensors for views of the gathered buffer
// (Tensor::set_data) and frees/re-allocates that buffer's storage in place.
//
// Collectives are issued in the same order on every rank because every rank runs the same
// sequence of units (forward 0..L, backward L..0).
//
// Device: every tensor the engine owns (fp32 masters, gradients, AdamW moments, decay masks,
// gathered buffers, reduction buffers) lives on Options::device, and the model's parameters become
// views of buffers there, so a model built on the meta device is materialised on that device. The
// communicators must take tensors on it (MPI/self: CPU; NCCL: the rank's GPU). The engine itself
// never synchronises the host with the device: Work::wait() on the NCCL backend only orders the
// caller's (compute) stream after the collective's stream, so all-gathers, compute and
// reduce-scatters overlap as far as the prefetch limit allows.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/fsdp/shard_plan.h"

namespace tessera::fsdp {

enum class Strategy { FullShard, ShardGradOp, NoShard, HybridShard };
Strategy parse_strategy(const std::string& s);
std::string to_string(Strategy s);
at::ScalarType parse_dtype(const std::string& s);  // fp32 | bf16 | fp16

// The groups a strategy shards over and replicates across, taken from `groups` (a size-1 self
// communicator where the strategy has none): full_shard / shard_grad_op (world, self), no_shard
// (self, world), hybrid_shard (intra, inter).
struct GroupLayout {
  comm::CommPtr shard, replicate;
};
GroupLayout layout_for(Strategy s, const comm::ProcessGroups& groups);

struct Options {
  Strategy strategy = Strategy::FullShard;
  at::ScalarType param_dtype = at::kFloat;   // gathered parameters and compute
  at::ScalarType reduce_dtype = at::kFloat;  // gradient reduction
  bool activation_checkpointing = false;
  bool prefetch = true;
  int limit_all_gathers = 2;  // decoder-layer units gathered at once (full_shard / hybrid_shard)
  int64_t align = 16;         // elements; parameter offsets in the flat buffer are multiples of this
  at::Device device = at::Device(at::kCPU);  // where shards, optimizer state and gathered buffers live
};

// One unit as the caller describes it: its parameters (tensors owned by the model's modules, may
// be on the meta device) with the names used for loading, checkpoints and weight decay.
struct UnitDef {
  std::string name;
  std::vector<std::pair<std::string, at::Tensor>> params;
};

// Reads elements [offset, offset+count) of a named parameter (row-major) as fp32 into dst.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual void read(const std::string& name, const std::vector<int64_t>& shape, int64_t offset, int64_t count,
                    float* dst) = 0;
  // The stored bytes of elements [offset, offset+count), in place (e.g. a memory-mapped file), as an
  // unowned READ-ONLY CPU tensor in the stored dtype; undefined when the source has no such view,
  // and then only read() is used. Lets the rank0 loader send checkpoint bytes without copying them.
  virtual at::Tensor view(const std::string& name, int64_t offset, int64_t count) { return {}; }
  // The caller no longer uses views of that range (the source may drop their pages).
  virtual void release(const std::string& name, int64_t offset, int64_t count) {}
};

// What the optimizer and checkpoints see of a unit: this rank's fp32 shard and its state.
struct UnitShard {
  std::string name;
  ShardPlan plan;        // over the shard group
  int shard_rank = 0;    // this rank's index in the shard group
  // All on Options::device (code reading them through data_ptr must stage CPU copies elsewhere).
  at::Tensor master;     // fp32 [chunk]
  at::Tensor grad;       // fp32 [chunk]
  at::Tensor exp_avg, exp_avg_sq;  // fp32 [chunk], AdamW moments
  at::Tensor decay_mask;           // fp32 [chunk], 1 where weight decay applies
};

struct MemoryStats {
  int64_t gathered_layers_now = 0, gathered_layers_peak = 0;  // decoder-layer units with live full params
  int64_t gathered_bytes_now = 0, gathered_bytes_peak = 0;    // bytes of live gathered buffers (all units)
};

class Engine {
 public:
  using LayerFn = std::function<at::Tensor(int64_t layer, const at::Tensor& h)>;
  using DecayFn = std::function<bool(const std::string& param_name)>;

  // units[0] is the root unit (kept gathered from begin_forward to finish_backward), units[1..] are
  // the decoder layers in forward order; layer_fn(i, h) runs decoder layer i (unit i+1).
  Engine(std::vector<UnitDef> units, LayerFn layer_fn, const comm::ProcessGroups& groups, Options opts,
         DecayFn decay);
  ~Engine();

  // ---- one micro-step -------------------------------------------------------------------------
  // sync=false: gradients accumulate locally (no communication, like no_sync); sync=true: this
  // micro-step's backward reduces the accumulated gradients into the shards.
  void begin_forward(bool sync);
  at::Tensor run_layer(int64_t layer, const at::Tensor& h);  // autograd-aware
  // After loss.backward(): reduces the root unit's gradients and waits for every reduction.
  void finish_backward();
  // After a forward without grad (evaluation): frees everything gathered.
  void reshard_all();
  // After the optimizer changed the master shards: drops every gathered copy.
  void after_step() { reshard_all(); }
  void zero_grad();

  std::vector<UnitShard>& shards();
  const Options& options() const { return opts_; }
  comm::Communicator& shard_group();
  comm::Communicator& replicate_group();
  int64_t num_layers() const;
  MemoryStats memory() const;
  void reset_peaks();
  // Full (unsharded) value of one parameter, gathered over the shard group: for tests/exports.
  at::Tensor gather_param(int unit, int param);
  // Bytes of the live gathered storage of a unit (0 when resharded): measured, not tracked.
  int64_t live_bytes(int unit) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  Options opts_;
};

}  // namespace tessera::fsdp
