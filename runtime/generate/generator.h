// Text generation over the FSDP engine (`tessera generate`, `tessera bench generate`): the model stays
// sharded and every unit is gathered for its use exactly as the training forward gathers it
// (fsdp.h: the root unit once per prompt, each decoder layer per forward under full_shard, or kept
// gathered across forwards under shard_grad_op), with the model's KV cache (model/registry.h
// KvCache, reached through CausalLm::set_cache).
//
// PROMPTS are generated one at a time (batch 1), each from an empty cache: no padding, so a prompt's
// tokens are those it gets alone, whatever else is in the file. The cache is allocated once, for the
// longest prompt plus max_new_tokens (reserve), and reused by every prompt. One prompt: one forward of
// the whole prompt (prefill), then one forward of one token per new token (decode), each reading the
// last position's logits only.
//
// RANKS. Every rank runs every forward (the engine's collectives in the same order on all); world
// rank 0 picks each token (sampling.h) and broadcasts it over the host world, so every rank feeds the
// same token and stops at the same step, whatever the arithmetic of its own logits. The broadcasts
// and gathers are Communicator operations: comm.timeout_s and the flight recorder apply to them as in
// training. Collective: every rank calls generate() with the same arguments.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/generate/sampling.h"
#include "runtime/train/trainer.h"

namespace tessera::generate {

// When a generation ends before max_new_tokens: at one of `eos` (the model's end-of-sequence ids;
// the id is kept as the last generated token), or when `stop` (rank 0 only: its answer is broadcast)
// says the tokens generated so far end it (a --stop string appeared in their text).
struct StopRule {
  std::vector<int64_t> eos;
  std::function<bool(const std::vector<int64_t>& generated)> stop;
};

struct Generation {
  std::vector<int64_t> tokens;  // generated, after the prompt
  std::string finish;           // "eos", "stop" or "length"
  double prefill_s = 0, decode_s = 0;
};

class Generator {
 public:
  // host_world: an MPI (or self) communicator over the engine's ranks, for the token broadcasts.
  // This one builds (and owns) the engine over lm's units.
  Generator(train::CausalLm lm, const comm::ProcessGroups& groups, fsdp::Options opts, comm::CommPtr host_world);
  // Over an engine someone else drives between its own forwards (a trainer's, for samples during
  // training): `lm` is a copy of the CausalLm that engine runs.
  Generator(train::CausalLm lm, fsdp::Engine& engine, comm::CommPtr host_world);
  ~Generator();
  fsdp::Engine& engine() { return *engine_; }
  // The KV cache's positions (the longest prompt plus max_new_tokens); allocated at the first forward.
  void reserve(int64_t capacity);
  // Frees the KV cache (a trainer's samples: the training steps between need the memory); reserve()
  // again before the next generate().
  void release();
  // One prompt (ids in the vocabulary, prompt.size() + max_new <= the reserved capacity); `stream`
  // picks the sampling stream (the prompt's index: prompts are independent of each other's draws).
  Generation generate(const std::vector<int64_t>& prompt, int64_t max_new, const Sampling& s, uint64_t stream,
                      const StopRule& stop);
  // The last position's logits [V] (fp32, host) of `tokens`, by one forward without a cache (the
  // recomputation a KV cache saves; bench generate's baseline).
  at::Tensor recompute_last_logits(const std::vector<int64_t>& tokens);

 private:
  at::Tensor forward_last(const std::vector<int64_t>& tokens);  // the current cache setting
  int64_t agree_token(int64_t mine);
  bool agree_flag(bool mine);

  train::CausalLm lm_;
  std::unique_ptr<fsdp::Engine> owned_;
  fsdp::Engine* engine_ = nullptr;
  comm::CommPtr host_world_;
  at::Device device_;
  int64_t capacity_ = 0;
};

}  // namespace tessera::generate
