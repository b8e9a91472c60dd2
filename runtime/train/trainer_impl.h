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

// One optimizer step as queued: what is needed to turn it into a StepRecord.
struct QueuedStep {
  Clock::time_point t0;
  at::Tensor loss_sum;   // [1] double on the device: cross entropy summed over the step's targets, all ranks
  int64_t targets = 0;   // target tokens of the step, all ranks and micro-steps
  at::Tensor grad_norm;  // 0-dim double on the device
  double loss = 0, norm = 0;  // on the host after the step's one synchronisation (skip_step): loss per target
  double lr = 0;
  bool skipped = false;       // the numerics guard skipped the optimizer (numerics.h)
  int64_t skipped_total = 0;  // skipped steps of the run so far
  float loss_scale = 1;       // the loss scale the step ran with
  int64_t overlapped_updates = 0;  // optim.in_backward under offload (HostUpdateThread::overlapped)
  bool abandoned = false;  // stopped at a micro-batch boundary (preemption): nothing of it was applied
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
    lm.set_layout({device::to_device(b.position_ids, device), device::to_device(b.document_ids, device)});
  }
  // Forward of one batch: cross entropy summed over its targets (a 0-dim fp32 tensor on the device).
  // grad_scale: the loss scale backward will carry (fp16), a hint for the fused head.
  at::Tensor summed_loss(const data::Batch& b, double grad_scale = 1.0);

  // The step, in the order it runs (queue_step): the batches, forward and backward of each, the
  // optimizer.
  QueuedStep queue_step();
  std::vector<data::Batch> next_batches(QueuedStep& q);
  bool abandon_if_preempted(size_t micro_step, QueuedStep& q);
  void seed_layer_rng(int64_t micro);  // step.cpp
  at::Tensor forward(const data::Batch& b, double scale, bool last, QueuedStep& q);
  void backward(const at::Tensor& loss, double scale, QueuedStep& q);
  void optimizer_step(QueuedStep& q);
  // optim.in_backward (optim::Options::in_backward): the step's loss agreed before the last
  // backward, each unit's update from the engine's on_grad_ready hook, the norm checked after.
  bool loss_finite_before_update(QueuedStep& q);
  void update_in_backward(int unit);
  void update_unit(int unit, const std::vector<optim::ParamShard>& shards);
  void finish_in_backward(QueuedStep& q);
  // fsdp.offload with optim.in_backward: the thread that runs update_unit while backward goes on
  // (host_update.h); null otherwise (the hook updates on the thread that runs backward).
  std::unique_ptr<HostUpdateThread> host_updates;
  struct InBackward {
    bool open = false;            // the hook updates units (the last micro-step's backward)
    int64_t step_count = 0;       // AdamW's step count before this step (each unit takes step + 1)
    double lr = 0;
    std::vector<at::Tensor> square_sums;  // per updated unit: its gradient shard's sum of squares
    QueuedStep* q = nullptr;
  } in_bwd;

  // Everything a checkpoint saves and restores: the engine's masters and the optimizer's state.
  std::vector<NamedShards> checkpoint_state() {
    std::vector<NamedShards> kinds = {engine->named_state()};
    for (auto& k : adamw->state(engine->optimizer_view().shards)) kinds.push_back(std::move(k));
    return kinds;
  }
  StepRecord record(const QueuedStep& q);
  // The numerics guard's agreed decision for the queued step (host sync on a device; numerics.h).
  bool skip_step(QueuedStep& q);
  // train.max_skipped_steps reached: the same CollectiveError on every rank.
  bool trace_around(int64_t next, bool before);
  profile::KernelTrace kernel_trace;  // the kernels of train.profile_steps (profile/kernel_trace.h)
  bool validate_if_due(Trainer& self, StepRecord& r, bool stopping);
  bool checkpoint_due(bool stopping, bool new_best) const;
  void sample_if_due(StepRecord& r, bool stopping);
  void check_skip_limit() const {
    if (guard.exhausted()) throw CollectiveError(ErrorKind::Input, guard.stop_message(last_checkpoint));
  }
};

}  // namespace tessera::train
