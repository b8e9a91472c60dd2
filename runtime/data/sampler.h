// Deterministic distributed sampler over the sequences of a TokenDataset.
//
// EPOCHS. Epoch e visits the sequences in a permutation drawn from seed + e (splitmix64 +
// Fisher-Yates, implemented here so it is bit-identical on every platform and independent of torch's
// RNG); with shuffle=false the permutation is the identity. An epoch has
// steps_per_epoch = num_sequences / global_batch optimizer steps; the tail of the permutation that
// does not fill a global batch is dropped (and reshuffled into later epochs).
//
// GLOBAL BATCH. global_batch = world_size * micro_batch_size * grad_accum. Global step s (0-based,
// counting across epochs) is epoch e = s / steps_per_epoch, k = s % steps_per_epoch, and its global
// batch is perm_e[k*global_batch, (k+1)*global_batch).
//
// MICRO-BATCHES. The global batch is cut into world_size * grad_accum slots of micro_batch_size
// sequences. Rank r's micro-batch a (0 <= a < grad_accum) is slot j = a * world_size + r, i.e.
// global-batch positions [j*micro, (j+1)*micro). Consequences:
//  - the slots of all ranks and micro-steps are disjoint and together are exactly the global batch;
//  - a run with world_size W, micro m, accum a sees the same micro-batches as a run with W = 1,
//    micro m, accum a*W (rank r's micro-batch a there is micro-batch a*W + r here), so a sharded run
//    and a single-process run of the same global batch consume identical data.
//
// STATE. The sampler keeps a cursor (the next global step) for checkpoint/resume; micro_batch() is
// a pure function of (step, accum_index) and does not move it. Not thread-safe (it caches the
// current epoch's permutation).
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <vector>

namespace tessera::data {

// splitmix64: tiny, well-mixed 64-bit PRNG (Steele et al.), used for the permutations.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next();
  // Uniform integer in [0, n), n > 0, without modulo bias (rejection sampling).
  uint64_t uniform(uint64_t n);

 private:
  uint64_t state_;
};

// The permutation of [0, n) for `seed` (Fisher-Yates driven by SplitMix64(seed)).
std::vector<int64_t> permutation(int64_t n, uint64_t seed);

class DistributedSampler {
 public:
  // Throws Error(Input) if a size is not positive, rank is outside [0, world_size), or the dataset
  // holds fewer sequences than one global batch (the message names all the counts).
  DistributedSampler(int64_t num_sequences, int world_size, int rank, int micro_batch_size, int grad_accum,
                     uint64_t seed, bool shuffle = true);

  int64_t global_batch() const { return global_batch_; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t epoch_of(int64_t step) const { return step / steps_per_epoch_; }

  // Sequence indices of this rank's micro-batch `accum_index` of global step `step`.
  std::vector<int64_t> micro_batch(int64_t step, int accum_index) const;
  // All sequence indices of global step `step` (every rank's micro-batches, slot order).
  std::vector<int64_t> global_batch_indices(int64_t step) const;

  // Cursor: the next global step to run.
  int64_t step() const { return step_; }
  void set_step(int64_t step);
  void advance() { set_step(step_ + 1); }
  int64_t epoch() const { return epoch_of(step_); }

  // {"step", "epoch", "step_in_epoch", "seed", "shuffle", "num_sequences", "global_batch"}.
  nlohmann::json state() const;
  // Restores the cursor. Throws Error(Input) if the saved seed, shuffle, num_sequences or
  // global_batch differ from this sampler's (different data or batch settings than the checkpoint).
  void load_state(const nlohmann::json& state);

 private:
  const std::vector<int64_t>& epoch_permutation(int64_t epoch) const;

  int64_t num_sequences_;
  int world_size_, rank_, micro_, accum_;
  uint64_t seed_;
  bool shuffle_;
  int64_t global_batch_, steps_per_epoch_;
  int64_t step_ = 0;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_perm_;
};

}  // namespace tessera::data
