// The FSDP engine: each unit (the "root" unit of embeddings/final norm/lm_head, and one unit per
// decoder layer) keeps its parameters as ONE flat fp32 master shard per rank (ShardPlan) and gathers
// the full parameters in the compute dtype only while they are needed:
//
//   strategy        gather for forward  free after forward  free after backward  grads
//   full_shard      all-gather (world)  yes                 yes                  reduce-scatter (world)
//   shard_grad_op   all-gather (world)  no                  yes                  reduce-scatter (world)
//   no_shard        local copy          no                  yes                  all-reduce (world)
//   hybrid_shard    all-gather (intra)  yes                 yes                  reduce-scatter (intra) + all-reduce (inter)
//   (full_shard and hybrid_shard over a shard group of one rank keep training's units gathered from
//   forward to backward unless offloaded or frozen: regathers_for_backward below)
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
// Gradients: in backward each unit's parameter gradients (compute dtype) are copied into one flat
// buffer in the reduce dtype, divided by the data-parallel size and reduce-scattered over the
// shard group asynchronously; this rank's chunk is added into its fp32 gradient shard when the
// reduction is retired. At most kMaxReductionsInFlight reductions are in flight: issuing unit k's
// retires unit k - kMaxReductionsInFlight first (a fixed point in every rank's sequence, so the
// order of collectives on every communicator is the same on all ranks), and its flat buffer is
// freed then; before each unit's gradient is issued, reductions that have already completed are
// retired too (without waiting). With replicas (hybrid_shard, no_shard) the retired shard is
// all-reduced across them right away, overlapping the rest of backward, once per optimizer step (on the micro-step begun
// with sync=true): gradient accumulation (fsdp.accumulate) is
//   sharded    (default) every micro-step reduce-scatters into the fp32 gradient shard: nothing of
//              a unit's full size outlives its own backward; replicas all-reduce the accumulated
//              shard on the last micro-step only;
//   unsharded  micro-steps before the last add into a full-size fp32 buffer per unit (no
//              communication, like PyTorch's no_sync()), the last one reduces it: less traffic,
//              4 bytes per parameter of every unit held between micro-steps.
// no_shard's "shard" is the whole model, so both modes add into the gradient directly and
// all-reduce once per step. zero_grad() zeroes nothing: it marks the gradient shards fresh, and the
// step's first gradient of a unit is copied into its shard instead of added (the flat buffers are
// made uninitialised and written whole, padding zeroed): what adding into zeros gives, bit for bit
// but the sign of a zero (-0 stays -0), which no update, norm or clip can tell apart;
// shards() and optimizer_view() zero a shard still fresh before handing it out.
//
// Frozen parameters (UnitDef::frozen: LoRA's base): each unit holds a second flat group laid out by
// its own ShardPlan, with no master, gradient or optimizer state: this rank's chunk is kept as
// Options::frozen_storage encodes it (the compute dtype by default: 2 bytes per parameter in bf16,
// over the shard group; UnitDef::quantized, QLoRA's projections, a third group in
// Options::quantized_storage: NF4), all-gathered with the trainable group's gather and into its own gathered
// buffer (decoded per segment when the storage is not the compute dtype), and freed with it. The
// optimizer view, named_state() and so checkpoints cover only the trainable groups (the adapters);
// backward asks autograd for the trainable parameters' gradients only, and for the layer input's
// only where the input needs one (the first layer's input from a frozen embedding does not).
//
// Memory per rank (bytes; P_u a unit's padded size, c its shard chunk; runtime/planner/memory_formula.h
// states the whole formula, per strategy and phase, and tests/mpi check it against measurement):
//   master 4 x sum c, gradient shard 4 x sum c (allocated by the first backward: evaluation never
//   allocates it), gathered parameters (compute dtype) of the units the strategy keeps, autograd's
//   parameter gradients of one unit (compute dtype) + the flat buffers of the reductions in flight
//   (reduce dtype), and the reduce-scatter outputs (chunk, reduce dtype). Optimizer state is the
//   optimizer's (runtime/optim/adamw.h).
//
// Device: every tensor the engine owns (fp32 masters, gradients, gathered buffers, reduction
// buffers) lives on Options::device, and the model's parameters become views of buffers there, so
// a model built on the meta device is materialised on that device. The communicators must take
// tensors on it (MPI/self: CPU; NCCL: the rank's GPU). The engine itself never synchronises the
// host with the device: Work::wait() on the NCCL backend only orders the caller's (compute) stream
// after the collective's stream, so all-gathers, compute and reduce-scatters overlap as far as the
// prefetch limit allows.
//
// Host offload (Options::offload, fsdp.offload; the memory model's "Host offload" terms):
//   optimizer  the fp32 master and gradient shards live in host memory (pinned when the device is a
//              GPU) and the optimizer steps them there (AdamW's fused CPU loop; its moments follow
//              the shards). The device keeps the parameter shard in the compute dtype, the
//              all-gather's input: made from the master (cast on the host, copied up) before the
//              first gather after the master changed (after_step(), or any access through shards()
//              or named_state(), which the loader and checkpoints write through). Each reduced
//              gradient chunk is copied down (into a host staging buffer) when its reduce-scatter
//              retires and added into the host shard there; with one shard rank (no_shard, one
//              rank) the unit's gradient is gathered into a device chunk first and copied down the
//              same way; with replicas the final shard is copied up for the replica all-reduce and
//              back down.
//   params     as optimizer, and the compute-dtype parameter shard lives on the host too (the
//              master itself when the compute dtype is fp32): every all-gather, in forward and in
//              backward, first copies it up into this rank's slot of the gathered buffer and
//              gathers in place (as the master's cast is written there without offload).
// The copies are real copies between separate tensors also on a CPU-only machine (where "device"
// and "host" are the same memory), so the path and its arithmetic are the ones a GPU runs, and the
// losses equal those without offload bit for bit (the same additions in the same order: a
// reduced chunk is added into the gradient shard whether it arrives on the host or not). Every
// copy is counted (traffic()): what `tessera plan` predicts as PCIe bytes per step.
//
// Threads: one thread drives an Engine (the trainer's): begin_forward, run_layer, the layer's
// autograd backward (LibTorch runs CPU backward on the thread that called backward(); on a GPU,
// autograd's device thread for that GPU, one at a time), finish_backward and the accessors. The
// engine issues collectives from that thread only; the communicators run them on their own threads
// or streams and hand results back through Work.
//  - No locks: the Engine is not thread-safe and needs none. Its state (units, gathered buffers,
//    the reductions and gathers in flight, MemoryStats) is touched only by the driving thread; on a
//    GPU the hand-off between the trainer's thread and autograd's device thread is autograd's own
//    (the caller blocks in backward() until the device thread is done), so never two at once.
//  - What the engine shares with other threads is a buffer handed to a collective (a gather's
//    output, a reduction's flat input and output): it is not read, written or freed until that
//    operation's Work::wait() returned (reshard / retire_reduction free after the wait; on NCCL the
//    wait orders the compute stream and the caching allocator orders the free). The Work objects
//    themselves lock inside the backend.
//  - The loader (loader.h), the optimizer and checkpoint save/load read and write shards() from
//    the same thread, between steps (never during a forward or backward); an async checkpoint copies
//    the shards on this thread before its writer thread starts. The exception is on_grad_ready
//    (optim.in_backward): a unit's master and gradient shard are updated during backward, after its
//    hook: by the hook itself, or under offload on the trainer's host optimizer thread
//    (runtime/train/host_update.h), which touches only them.
//  - begin_forward, run_layer (and the backward it records), finish_backward and gather_param issue
//    collectives: every rank of the engine's groups calls them in the same order. reshard_all,
//    after_step and zero_grad are local (they only wait for gathers already issued); the
//    accessors are local.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/named_shards.h"
#include "runtime/fsdp/names.h"
#include "runtime/fsdp/shard_plan.h"
#include "runtime/optim/shard_view.h"
#include "util/dtype_names.h"

namespace tessera::fsdp {

// Strategy and Accumulate, and their names: names.h.
Strategy parse_strategy(const std::string& s);
std::string to_string(Strategy s);
Accumulate parse_accumulate(const std::string& s);  // sharded | unsharded
std::string to_string(Accumulate a);
Offload parse_offload(const std::string& s);  // none | optimizer | params
std::string to_string(Offload o);
// Whether training frees a unit's gathered parameters after its forward and gathers them again for
// its backward (the table above: full_shard, hybrid_shard). Not over a shard group of one rank with
// nothing offloaded and no frozen base: there the gathered parameters are only the master's cast,
// which backward would make again, so they stay from forward to backward as under shard_grad_op
// (2 bytes a parameter in bf16 until backward, what autocast's cache of eager PyTorch holds too;
// PyTorch FSDP1 runs NO_SHARD at world size 1). Offload and LoRA's frozen base keep freeing: there
// the memory is the point. Evaluation frees after forward under full_shard and hybrid_shard always.
bool regathers_for_backward(Strategy s, int shard_size, Offload offload, bool frozen_groups);
// Gradient reductions (flat buffers) in flight at once; see the header comment.
constexpr int kMaxReductionsInFlight = 2;
at::ScalarType parse_dtype(const std::string& s);  // fp32 | bf16 | fp16
at::ScalarType scalar_type(util::FloatType t);

// The groups a strategy shards over and replicates across, taken from `groups` (a size-1 self
// communicator where the strategy has none): full_shard / shard_grad_op (world, self), no_shard
// (self, world), hybrid_shard (intra, inter).
struct GroupLayout {
  comm::CommPtr shard, replicate;
};
GroupLayout layout_for(Strategy s, const comm::ProcessGroups& groups);

// How a unit's frozen group (fsdp.h's header: frozen parameters) is stored, sharded: this rank's
// chunk of `count` parameters (a multiple of align()) encoded into stored_numel(count) elements of
// stored_dtype(), all-gathered as stored, and each rank's gathered segment (self-contained) decoded
// into the compute dtype for the unit's use. The compute-dtype storage (dtype_storage) is the
// first; NF4 (QLoRA: bytes + scales) is another.
class FrozenStorage {
 public:
  virtual ~FrozenStorage() = default;
  virtual std::string name() const = 0;  // "bf16", "fp32", "nf4", ...
  virtual at::ScalarType stored_dtype() const = 0;
  virtual int64_t stored_numel(int64_t count) const = 0;
  virtual int64_t align() const { return 1; }  // chunk sizes are multiples of this
  // fp32 values [count] -> out [stored_numel(count)] (stored_dtype, any device).
  virtual void encode(const at::Tensor& fp32_values, at::Tensor& out) const = 0;
  // One segment [stored_numel(count)] -> dst [count] (dst's dtype and device).
  virtual void decode(const at::Tensor& stored, const at::Tensor& dst) const = 0;
};
// Stored as plain `dtype` elements (decode is a cast, none when dtype is the compute dtype).
std::shared_ptr<const FrozenStorage> dtype_storage(at::ScalarType dtype);

struct Options {
  Strategy strategy = Strategy::FullShard;
  at::ScalarType param_dtype = at::kFloat;   // gathered parameters and compute
  at::ScalarType reduce_dtype = at::kFloat;  // gradient reduction
  bool activation_checkpointing = false;
  bool prefetch = true;
  int limit_all_gathers = 2;  // decoder-layer units gathered at once (full_shard / hybrid_shard)
  Accumulate accumulate = Accumulate::Sharded;  // gradient accumulation over micro-steps
  int64_t align = 16;         // elements; parameter offsets in the flat buffer are multiples of this
  at::Device device = at::Device(at::kCPU);  // where shards, optimizer state and gathered buffers live
  Offload offload = Offload::None;  // host offload of the shard state (see the header comment)
  // Storage of the frozen groups (UnitDef::frozen); null: dtype_storage(param_dtype).
  std::shared_ptr<const FrozenStorage> frozen_storage;
  // Storage of the quantized groups (UnitDef::quantized: QLoRA's NF4 projections); needed when a
  // unit has one.
  std::shared_ptr<const FrozenStorage> quantized_storage;
  // Activation-checkpointing's recompute draws the same random numbers as the forward (the device's
  // default generator's state is saved per layer and restored): needed when a layer is random
  // (LoRA's dropout), as torch.utils.checkpoint's preserve_rng_state.
  bool preserve_rng = false;
};

// One unit as the caller describes it: its parameters (tensors owned by the model's modules, may
// be on the meta device) with the names used for loading, checkpoints and weight decay.
// `params` are trainable; `frozen` (LoRA's base) are sharded and gathered like them but have no
// master, gradient or optimizer state: they are stored as Options::frozen_storage says, and backward
// computes no gradient for them (the caller gives them requires_grad false). `quantized` are frozen
// too, in a group of their own stored as Options::quantized_storage says (QLoRA: the decoder's
// projections in NF4, while its norms and the root's embeddings and head stay in `frozen`).
struct UnitDef {
  std::string name;
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::vector<std::pair<std::string, at::Tensor>> frozen;
  std::vector<std::pair<std::string, at::Tensor>> quantized;
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

// What the optimizer, the loader and checkpoints see of a unit: this rank's fp32 shard. The engine
// owns the tensors; others read them and write their values (loader, checkpoint load, optimizer),
// never replace them.
struct UnitShard {
  std::string name;
  ShardPlan plan;        // over the shard group
  int shard_rank = 0;    // this rank's index in the shard group
  // On Options::device (code reading them through data_ptr must stage CPU copies elsewhere), or in
  // host memory under host offload (Options::offload).
  at::Tensor master;     // fp32 [chunk]
  at::Tensor grad;       // fp32 [chunk]; undefined until the first backward (evaluation: never)
  // Elements of the shard where weight decay applies: (offset, length), sorted and disjoint.
  std::vector<std::pair<int64_t, int64_t>> decay;
};

// One frozen group of a unit on this rank (UnitDef::frozen or ::quantized): its own ShardPlan (over
// the shard group), its storage and this rank's chunk as stored.
struct FrozenShard {
  std::string name;  // the unit's
  int unit = 0;
  ShardPlan plan;
  int shard_rank = 0;
  std::shared_ptr<const FrozenStorage> storage;
  at::Tensor stored;  // [storage.stored_numel(plan.chunk)]; on Options::device (host under offload=params)
};

// Bytes copied between the device and the host by host offload since the engine was built: `up`
// host -> device (parameter shards, replica all-reduce inputs), `down` device -> host (reduced
// gradient chunks, replica all-reduce results). Zero without offload.
struct Traffic {
  int64_t up = 0, down = 0;
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
  // sync=true on the last micro-step of an optimizer step: its backward completes the gradient
  // shards (unsharded accumulation reduces then; replicas all-reduce then). sync=false: a micro-step
  // before it (sharded accumulation still reduce-scatters into the shards; unsharded keeps them
  // locally, like no_sync()).
  void begin_forward(bool sync);
  at::Tensor run_layer(int64_t layer, const at::Tensor& h);  // autograd-aware
  // After loss.backward(): reduces the root unit's gradients and waits for every reduction.
  void finish_backward();
  // After a forward without grad (evaluation): frees everything gathered.
  void reshard_all();
  // After the optimizer changed the master shards: drops every gathered copy (and, under offload,
  // the parameter shards made from the old masters).
  void after_step();
  void zero_grad();  // marks the gradient shards fresh (see "Gradients" above)
  // optim.in_backward: `hook(unit)` runs as soon as that unit's gradient shard is final in the last
  // micro-step's backward (its reduce-scatter retired and, with replicas, its all-reduce), on the
  // thread that runs backward (the caller of backward(); autograd's device thread on a GPU). The
  // hook may update the unit's master and release_grad(unit): then the gradient shards of all units
  // are never alive together. The root unit's comes last, in finish_backward. Null: no hook. After
  // its hook the engine neither reads nor writes that unit's master or gradient shard until
  // after_step(), so the hook may hand them to another thread that updates them meanwhile (the
  // trainer's host optimizer thread under offload), if that thread is done before after_step().
  void on_grad_ready(std::function<void(int unit)> hook);
  void release_grad(int unit);  // drops shards()[unit].grad (zero_grad and the next backward make it again)

  const std::vector<UnitShard>& shards() const;
  // The frozen groups that have parameters, in unit order (a unit's `frozen` group before its
  // `quantized` one). set_frozen encodes this rank's chunk of group `group` from fp32 values
  // [plan.chunk] (the loader's way in).
  const std::vector<FrozenShard>& frozen_shards() const;
  void set_frozen(int group, const at::Tensor& fp32_chunk);
  // Full value of parameter `param` of frozen group `group` (decoded, fp32), gathered: for tests.
  at::Tensor gather_frozen(int group, int param);
  // What the optimizer steps: every shard's master, gradient and decay ranges, and shard_group().
  optim::ShardView optimizer_view();
  // The engine's state for checkpoints: {"param", every unit's master shard}.
  NamedShards named_state() const;
  const Options& options() const { return opts_; }
  comm::Communicator& shard_group();
  comm::Communicator& replicate_group();
  int64_t num_layers() const;
  MemoryStats memory() const;
  // Full (unsharded) value of one parameter, gathered over the shard group: for tests/exports.
  at::Tensor gather_param(int unit, int param);
  // Bytes of the live gathered storage of a unit (0 when resharded): measured, not tracked.
  int64_t live_bytes(int unit) const;
  // Host offload's copies so far (zero without offload).
  Traffic traffic() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  Options opts_;
};

}  // namespace tessera::fsdp
