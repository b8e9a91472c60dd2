// The trainer's state, shared by its rooms and private to runtime/train (nothing outside includes
// this header; trainer.h keeps Impl opaque):
//   trainer.cpp   construction, loading, resume, checkpoints, and run(): the loop and its "when"
//                 (trace, validation, checkpoint, stop)
//   step.cpp      one optimizer step: batches, forward and backward per micro-batch, the optimizer
//                 (after backward, or in backward), the numerics guard, the step's record
//   run_log.cpp   rank 0's account: metrics.jsonl, TensorBoard, the lines for people (Console)
//   evaluate.cpp  validation loss and per-sequence losses (forward only)
//   preemption.cpp  the stop-request signal handlers
// THREADS: see trainer.h; everything here is touched by the trainer's thread, except what
// host_update.h hands to the host optimizer thread.
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/data/dataset.h"
#include "runtime/data/sampler.h"
#include "runtime/device/device.h"
#include "runtime/device/peak_flops.h"
#include "runtime/optim/adamw.h"
#include "runtime/optim/shard_view.h"
#include "runtime/profile/kernel_trace.h"
#include "runtime/train/host_update.h"
#include "runtime/train/numerics.h"
#include "runtime/train/trainer.h"

namespace tessera::train {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A step's micro-batches and the target tokens they hold on all ranks.
struct Batches {
  std::vector<data::Batch> list;
  int64_t targets = 0;
};

// What the optimizer's part of a step decided, on the host after the step's synchronisation
// (agree_on_step, or open_in_backward and finish_in_backward with optim.in_backward).
struct Verdict {
  double loss = 0;            // cross entropy per target, all ranks
  double norm = 0;            // global gradient norm (NaN for a step skipped before its backward)
  double lr = 0;
  bool skipped = false;       // the numerics guard skipped the optimizer (numerics.h)
  int64_t skipped_total = 0;  // skipped steps of the run so far
  int64_t overlapped_updates = 0;  // optim.in_backward under offload (HostUpdateThread::overlapped)
};

// One optimizer step as queued (queue_step's value): what record() turns into a StepRecord.
struct QueuedStep {
  Clock::time_point t0;
  int64_t targets = 0;     // target tokens of the step, all ranks and micro-steps
  float loss_scale = 1;    // the loss scale the step ran with
  bool abandoned = false;  // stopped at a micro-batch boundary (preemption): nothing of it was applied
  Verdict verdict;         // empty when abandoned
};

struct Trainer::Impl {
  CausalLm lm;
  comm::ProcessGroups groups;  // the engine's (device) communicators
  comm::ProcessGroups host;    // MPI/self communicators over the same ranks
  at::Device device = at::kCPU;
  fsdp::Options fopts;
  Settings cfg;          // the run's settings (options.h), each part read by its owner
  Console console;       // where rank 0's lines for people go (set_console; default: nowhere)
  SampleHook samples;    // train.sample_every's generation (set_samples; empty: none)
  std::shared_ptr<const data::TokenDataset> dataset, val;
  nlohmann::json run_state;
  std::unique_ptr<fsdp::Engine> engine;
  std::unique_ptr<optim::AdamW> adamw;
  std::unique_ptr<data::DistributedSampler> sampler;
  std::unique_ptr<checkpoint::Checkpointer> checkpointer;
  int64_t step = 0;
  device::Peak peak;       // MFU's denominator per rank (flops 0: unknown)
  double gemm_flops = 0;    // a matmul's measured throughput (mfu_of_measured_gemm)
  int64_t base_rss = 0;           // resident set before the engine allocated anything
  int64_t lifetime_peak_rss = 0;  // peak resident set of the phases before the current step
  int64_t best_step = -1;  // lowest validation loss so far (-1: none)
  double best_val_loss = 0;
  LossScaler scaler;         // fp16 dynamic loss scaling (disabled: scale 1)
  NumericsGuard guard;       // skips steps with a non-finite loss or gradient norm
  std::string last_checkpoint;  // saved or resumed from (for the guard's stop message)

  nlohmann::json state_json() const {
    nlohmann::json s = run_state;
    s["step"] = step;
    s["sampler"] = sampler ? sampler->state() : nlohmann::json(nullptr);
    s["optimizer"] = {{"step_count", adamw->step_count()}};
    s["rng"] = {{"data_seed", cfg.train.seed}};
    s["strategy"] = fsdp::to_string(fopts.strategy);
    s["world_size"] = groups.world->size();
    // checkpoint.keep_best: the checkpoint named here survives pruning (checkpoint.cpp prune()).
    if (cfg.checkpoint.keep_best && best_step >= 0) s["best"] = {{"step", best_step}, {"val_loss", best_val_loss}};
    s["numerics"] = guard.state();
    if (scaler.enabled()) s["numerics"]["loss_scale"] = scaler.state();
    return s;
  }

  // Tells the model how this batch's tokens are laid out (packed documents or plain rows).
  void set_layout(const data::Batch& b) {
    if (!b.packed) {
      if (lm.set_layout) lm.set_layout({});
      return;
    }
    TESSERA_CHECK(lm.set_layout, "this model cannot take packed batches (CausalLm::set_layout is empty)");
    lm.set_layout({device::to_device(b.position_ids, device), device::to_device(b.document_ids, device),
                   device::to_device(b.cu_seqlens, device), b.max_seqlen});
  }
  // Forward of one batch: cross entropy summed over its targets (a 0-dim fp32 tensor on the device).
  // grad_scale: the loss scale backward will carry (fp16), a hint for the fused head.
  at::Tensor summed_loss(const data::Batch& b, double grad_scale = 1.0);

  // The step, in the order it runs (queue_step, which alone assembles its QueuedStep from the values
  // these return): the batches, forward and backward of each, the optimizer. `factor` is what a
  // micro-batch's summed loss is multiplied by before backward: world size / targets x loss scale.
  QueuedStep queue_step();
  Batches next_batches();
  bool stop_requested_mid_step(size_t micro_step);
  void seed_layer_rng(int64_t micro);
  at::Tensor forward(const data::Batch& b, double factor, bool last);
  void backward(const at::Tensor& loss, double factor);
  // loss_sum: [1] double on the device, the step's summed cross entropy on this rank (all-reduced
  // in place). The step's host synchronisation and the vote on it happen in agree_on_step.
  Verdict optimizer_step(const at::Tensor& loss_sum, int64_t targets);
  Verdict agree_on_step(const at::Tensor& loss_sum, const at::Tensor& grad_norm, int64_t targets);
  // optim.in_backward (optim::Options::in_backward): the step's loss agreed before the last
  // backward (open_in_backward: loss, lr and whether it is skipped), each unit's update from the
  // engine's on_grad_ready hook, the norm checked after (finish_in_backward completes the verdict).
  Verdict open_in_backward(const at::Tensor& loss_sum, int64_t targets);
  void update_in_backward(int unit);
  void update_unit(int unit, const std::vector<optim::ParamShard>& shards);
  Verdict finish_in_backward(Verdict v, const at::Tensor& loss_sum);
  // fsdp.offload with optim.in_backward: the thread that runs update_unit while backward goes on
  // (host_update.h); null otherwise (the hook updates on the thread that runs backward).
  std::unique_ptr<HostUpdateThread> host_updates;
  struct InBackward {
    bool open = false;            // the hook updates units (the last micro-step's backward)
    int64_t step_count = 0;       // AdamW's step count before this step (each unit takes step + 1)
    double lr = 0;
    std::vector<at::Tensor> square_sums;  // per updated unit: its gradient shard's sum of squares
  } in_bwd;

  // Everything a checkpoint saves and restores: the engine's masters and the optimizer's state.
  std::vector<NamedShards> checkpoint_state() {
    std::vector<NamedShards> kinds = {engine->named_state()};
    for (auto& k : adamw->state(engine->optimizer_view().shards)) kinds.push_back(std::move(k));
    return kinds;
  }
  StepRecord record(const QueuedStep& q);
  // train.profile_steps: the traces start before step `next` when it is in the window; after it,
  // the window's last step (or the run's) writes them and returns true.
  void start_trace_if_due(int64_t next);
  bool write_trace_if_due(int64_t next);
  profile::KernelTrace kernel_trace;  // the kernels of train.profile_steps (profile/kernel_trace.h)
  bool validate_if_due(Trainer& self, StepRecord& r, bool stopping);
  bool checkpoint_due(bool stopping, bool new_best) const;
  void sample_if_due(StepRecord& r, bool stopping);
  // train.max_skipped_steps reached: the same CollectiveError on every rank.
  void check_skip_limit() const {
    if (guard.exhausted()) throw CollectiveError(ErrorKind::Input, guard.stop_message(last_checkpoint));
  }
};

}  // namespace tessera::train
