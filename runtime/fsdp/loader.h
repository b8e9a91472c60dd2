// Loading checkpoint weights into an Engine's fp32 master shards (the engine was built on the meta
// device, so nothing is materialised before this point). Three modes (config `model.load`):
//
//   rank0     ONE rank (the root: rank 0 of both the shard and the replicate group, i.e. world rank
//             0 for every strategy built from the bootstrap's groups) streams the checkpoint unit
//             by unit over the shard group. When the source maps the file (WeightSource::view) and
//             a unit's tensors share one dtype, each rank's slices are sent as stored, straight
//             from the memory map (Communicator::scatter_pieces: no copy on the root, bf16 travels
//             as bf16) in batches of kLoadBatchElems; 16-bit slices land in the upper half of
//             their batch's own place in the rank's master and are widened there in place (fp32
//             ones land at their place directly), so receivers need no buffer at all; the root
//             converts its own slices directly. Otherwise
//             the root reads the unit into an fp32 staging buffer laid out like the unit's
//             ShardPlan and scatters it. Either way two units are in flight at most (the root's
//             mapped pages of a unit are released once its scatter completes), so the root's peak
//             is its shards + at most 2 x the largest unit and other ranks allocate nothing beyond
//             their shards. With replicas (no_shard, hybrid_shard) the scatter happens on the
//             root's replica and every finished shard is broadcast over the replicate group into
//             the other replicas' masters. Only the root needs a WeightSource.
//   parallel  every rank reads only the element ranges of its own slices: no
//             communication, no full tensor anywhere. Needs the checkpoint on every rank's disk.
//   naive     every rank reads every tensor of the model into memory (fp32), then copies out its
//             shards. Kept ONLY as the baseline of `tessera bench load`; never use it for real runs.
//
// All three give byte-identical master shards (padding and alignment gaps are zero). Checkpoint
// dtype conversion (bf16/fp16 -> fp32) happens per slice inside WeightSource::read, so there is no
// full-size temporary in any dtype. Validate the checkpoint BEFORE loading (ModelDir::validate()
// inside launcher::collectively()): a read that still fails during rank0 loading is agreed on by
// every rank before the next scatter, so all ranks throw the root's message instead of hanging.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/fsdp/fsdp.h"

namespace tessera::fsdp {

// LoadMode and its names: names.h.
LoadMode parse_load_mode(const std::string& s);  // rank0 | parallel | naive; Error(Input) otherwise
std::string to_string(LoadMode m);

struct LoadStats {
  double seconds = 0;
  int64_t shard_bytes = 0;         // this rank's fp32 master shard bytes, all units
  int64_t largest_unit_bytes = 0;  // fp32 bytes of the largest unit's padded flat buffer
  int64_t staging_bytes = 0;       // what this load allocated besides the shards (rank0 root: 2 units
                                   // if staged, else 0; rank0 receivers: 0; naive: the model)
  int64_t elements_read = 0;       // elements this rank read from its WeightSource
  bool root = false;               // this rank read for everyone (rank0 mode)
};

// rank0 mode's direct route moves each rank's shard in batches of this many flat elements
// (`batch_elems`; the default, 8 MiB of bf16 per batch, keeps the batch a receiver has just
// received inside the last-level cache while it widens it, while batches are few enough that
// per-batch hand-offs cost little).
constexpr int64_t kLoadBatchElems = int64_t(1) << 22;

// Loads every unit's master shard (masters on a device are filled through a host buffer per unit).
// `source` may be null on the ranks that do not read (rank0 mode, non-root ranks); it is required
// everywhere else. Collective over the shard and replicate groups in rank0 mode; local otherwise.
// rank0 mode moves host memory: for an engine whose groups live on a GPU (NCCL), pass the
// bootstrap's CPU (MPI) groups in `host_groups`; the engine's strategy picks the same layout from
// them. Null: the engine's own groups.
LoadStats load_weights(Engine& engine, WeightSource* source, LoadMode mode,
                       const comm::ProcessGroups* host_groups = nullptr, int64_t batch_elems = kLoadBatchElems);

// Shard arithmetic of a set of units at a group size, without any tensor (works on meta-device
// parameters): how much each rank holds, "on paper".
struct PlanSizes {
  int64_t total_elements = 0;          // parameters of every unit
  int64_t per_rank_elements = 0;       // sum over units of the padded chunk (what each rank stores)
  int64_t largest_unit_elements = 0;   // largest padded unit (what one gathered unit / staging buffer holds)
};
PlanSizes plan_sizes(const std::vector<UnitDef>& units, int world, int64_t align);

}  // namespace tessera::fsdp
