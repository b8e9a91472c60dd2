// The training loop: FSDP forward/backward over micro-batches, gradient clipping, AdamW on the
// fp32 shards, LR schedule, progress line, metrics JSONL, checkpoints and preemption. It knows a
// causal language model only through CausalLm (embed -> layers -> head), not Llama.
//
// Device: the trainer runs on the engine's device (fsdp::Options::device). Batches are moved there;
// `groups` are the communicators the engine uses (NCCL on a GPU, MPI on CPU) and `host_groups` the
// MPI ones for everything that stays on the host (checkpoint agreement, preemption flags). On a
// device the step queues its work with one host synchronisation per step: the numerics guard
// reads the step's loss and gradient norm before the optimizer (numerics.h: a non-finite one skips
// the step on every rank, as torch.cuda.amp.GradScaler.step reads found_inf).
// fsdp.mixed_precision / reduce_dtype fp16 add dynamic loss scaling (the trainer derives it from the engine's dtypes).
//
// THREADS. A Trainer is built, driven and destroyed by one thread (the launcher's main thread) and
// is not thread-safe; it holds no locks. Every method is collective (all ranks call it in the same
// order) except engine(), state(), step() and process_base_rss(). Around it:
//  - The engine's collectives are issued from that thread, including those issued inside autograd's
//    backward (on a GPU by autograd's device thread while this thread waits in backward(); see
//    fsdp.h). The communicators execute them on their own threads (MPI) or streams (NCCL).
//  - Preemption: the handlers installed by install_preemption_handlers only store an atomic flag;
//    run() reads preemption_requested() once per step and the ranks agree on it with one
//    host_groups.world->any() before deciding to stop, so every rank stops after the same step.
//  - checkpoint.async: Checkpointer::save copies the shards and the optimizer state to host memory
//    on this thread, then one writer thread writes them and runs the save's agreements on the
//    Checkpointer's private duplicate of the host world (never the engine's communicators); the next
//    save, the end of run() or the Trainer's destruction joins it (runtime/checkpoint/checkpoint.h).
//  - optim.in_backward under fsdp.offload: one host optimizer thread per Trainer
//    (runtime/train/host_update.h), started by the constructor and joined first by the destructor.
//    The engine's on_grad_ready hook (on the thread that runs backward) hands it each unit's AdamW
//    update and gradient sum of squares, then releases the unit's gradient shard (engine calls stay
//    on the driving thread; the job holds the tensors it needs). The thread touches only that
//    unit's master, gradient shard and moments, and AdamW, which nothing else uses until
//    finish_in_backward drains it -- before the norm, the guard and Engine::after_step; a job's
//    exception is rethrown there, and a step that throws waits for the job in hand first. Without
//    in_backward the host AdamW runs after backward on this thread (clipping needs the global norm
//    first).
//  - Host memory tracking (runtime/memory/tracker.h): the memory::Scope the step opens is per
//    thread, so it covers CPU backward (same thread) but not the communication threads, which charge
//    comm_buffers; the host optimizer thread opens its own (optimizer, on the host).
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/fsdp/loader.h"
#include "runtime/memory/tracker.h"
#include "runtime/optim/names.h"
#include "runtime/profile/step_profile.h"
#include "runtime/train/options.h"
#include "runtime/train/preemption.h"

namespace tessera::data {
class TokenDataset;
}

namespace tessera::train {

// How the tokens of a batch are laid out when documents are packed into rows (data::Batch):
// position_ids [B, T] restart at 0 for each document, document_ids [B, T] say which tokens may
// attend to each other. Undefined tensors: one document per row at positions 0..T-1.
struct BatchLayout {
  at::Tensor position_ids, document_ids;
  at::Tensor cu_seqlens;   // data::Batch's document offsets (int32, on the device), for varlen attention
  int64_t max_seqlen = 0;  // the longest document
};

// A causal LM as the runtime sees it.
struct CausalLm {
  std::vector<fsdp::UnitDef> units;  // [0] root (embeddings, final norm, head), [1..] decoder layers
  std::function<at::Tensor(const at::Tensor& tokens)> embed;
  fsdp::Engine::LayerFn layer;
  std::function<at::Tensor(const at::Tensor& h)> head;
  // The summed cross entropy of head(h) against labels (Batch::kIgnore rows skipped), 0-dim fp32;
  // the model may fuse it so that the logits never exist (CausalLmModule::head_loss: its default
  // is head + cross_entropy). Training and validation call it. grad_scale: the loss scale backward
  // will carry (fp16), a hint for a fused head; device_rows: skip ignored rows as a GPU does, on any
  // device (LoopOptions::device_step) -- model::HeadLoss.
  std::function<at::Tensor(const at::Tensor& h, const at::Tensor& labels, double grad_scale, bool device_rows)> head_loss;
  // Called before every forward with that batch's layout; the model keeps it for the layer calls of
  // the micro-batch (activation-checkpointing recompute in its backward included). Empty: the model
  // cannot pack documents, and the trainer refuses packed batches.
  std::function<void(const BatchLayout&)> set_layout;
  // Generation (runtime/generate/generator.h): capacity > 0 gives the layer calls a KV cache of that
  // many positions (made once, kept until capacity changes) whose next forward's tokens are positions
  // start..; start < 0 keeps it unused; capacity 0 drops it. set_layout stops its use. Empty: no cache.
  std::function<void(int64_t capacity, int64_t start)> set_cache;
  // The random layers' mode (LoRA's dropout): false while evaluating, validating and generating
  // (EvalMode), as torch's model.eval(); true otherwise. Empty: the model has none.
  std::function<void(bool training)> set_training;
  std::function<bool(const std::string& param)> decay;  // weight decay applies
  std::function<double(int64_t seq_len)> flops_per_token;  // training FLOPs per token (MFU); may be empty
  std::shared_ptr<void> keep_alive;         // owner of the modules behind the callables
};

// For a scope: the model in evaluation mode (CausalLm::set_training(false)), training mode again
// at its end.
class EvalMode {
 public:
  explicit EvalMode(const CausalLm& lm) : lm_(lm) {
    if (lm_.set_training) lm_.set_training(false);
  }
  ~EvalMode() {
    if (lm_.set_training) lm_.set_training(true);
  }
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;

 private:
  const CausalLm& lm_;
};

// Where rank 0's lines for people go: `out` the progress line (every log.every steps), the peak
// line, checkpoint and trace notes, the time summary; `warn` a skipped step. The caller renders
// them (the launcher prints them); empty (the default): the trainer prints nothing.
struct Console {
  std::function<void(const std::string&)> out, warn;
};

// train.sample_every's generation after a step (launcher/train_samples.h): collective (every rank
// calls it with the same step, on the trainer's thread, between steps); returns a short line for
// people saying what it wrote.
using SampleHook = std::function<std::string(int64_t step)>;

struct StepRecord {
  int64_t step = 0;  // 1-based number of optimizer steps done
  double loss = 0, grad_norm = 0, lr = 0;  // loss: mean cross entropy over the step's target tokens
  int64_t target_tokens = 0;  // target tokens of the step, all ranks and micro-steps
  bool evaluated = false;     // validation ran after this step:
  double val_loss = 0;        //   mean cross entropy over the validation targets
  int64_t val_tokens = 0;     //   their number
  // mfu: model FLOP/s over the hardware's peak (0: peak unknown); mfu_of_measured_gemm: over the
  // throughput of a square matmul timed at the start of run() (a diagnostic, not MFU).
  double step_time_s = 0, tokens_per_s = 0, mfu = 0, mfu_of_measured_gemm = 0;
  profile::Breakdown time;  // where the step's time went (runtime/profile/step_profile.h)
  int64_t peak_rss_bytes = 0;     // the process's peak resident set so far (loading included)
  memory::Breakdown memory;       // host memory of this step: measured breakdown at its peak
  int64_t peak_gpu_mem_bytes = 0;  // LibTorch caching allocator peak on the device (0 on CPU)
  std::string device = "cpu";      // "cpu" or "cuda:N"
  bool skipped = false;       // non-finite loss or gradient norm: the optimizer did not run (every rank)
  int64_t skipped_steps = 0;  // skipped steps of the run so far (this one included)
  double loss_scale = 0;      // the fp16 loss scale this step ran with (0: no loss scaling)
  // optim.in_backward under fsdp.offload: units whose host AdamW update was done, on the host
  // optimizer thread, before the backward ended (it ran alongside the backward; host_update.h).
  // 0 otherwise: an update on the thread that runs backward never overlaps it.
  int64_t overlapped_updates = 0;
  // train.sample_every: seconds the samples after this step took (a pause between steps, outside
  // step_time_s and its breakdown; 0 when none were due).
  double sample_s = 0;
};

struct RunResult {
  int64_t start_step = 0, end_step = 0;
  bool preempted = false;
  std::vector<StepRecord> records;
  std::string last_checkpoint;
  int64_t best_step = -1;  // lowest validation loss (-1: never evaluated)
  double best_val_loss = 0;
};

class Trainer {
 public:
  // host_groups: MPI (or self) groups over the same ranks; empty (default): `groups` (CPU runs).
  // `settings` (options.h) are validated here too (validate(): the same check as the launcher's).
  Trainer(CausalLm lm, const comm::ProcessGroups& groups, fsdp::Options fsdp_opts, const Settings& settings,
          std::shared_ptr<const data::TokenDataset> dataset, nlohmann::json run_state,
          const comm::ProcessGroups& host_groups = {});
  ~Trainer();

  fsdp::Engine& engine();
  // Everything a checkpoint saves, per kind and unit: the engine's masters ("param") and the
  // optimizer's state (AdamW's moments, allocated at the first step). Live tensors, not copies.
  std::vector<NamedShards> state();
  // Every rank reads its own slices (model.load=parallel).
  void load_weights(fsdp::WeightSource& source);
  // Any model.load mode; in rank0 mode only the reading rank needs a source (others pass null).
  // Loading moves host memory, so it runs over the trainer's host groups.
  void load_weights(fsdp::WeightSource* source, fsdp::LoadMode mode);
  // Restores shards, optimizer and sampler from a checkpoint directory; returns its step.
  int64_t resume(const std::string& ckpt_dir);
  StepRecord train_step();  // one optimizer step (grad_accum micro-batches)
  RunResult run();          // from the current step to train.steps, with logging/checkpoints/signals
  void set_console(Console console);  // before run(); default: silent
  // Before run(): what generates train.sample_every's samples; run() refuses sample_every > 0 without it.
  void set_samples(SampleHook hook);
  std::string save_checkpoint();  // returns the directory written
  std::string save_abandoned(int64_t start_step);  // after a step abandoned on a stop request
  int64_t step() const;
  // Resident set of the process just before the engine allocated its first tensor.
  int64_t process_base_rss() const;

  // Forward only (no grad, FSDP-sharded): next-token cross entropy per sequence for [B, T] tokens.
  std::vector<double> sequence_losses(const at::Tensor& tokens);

  // The validation set: evaluated every eval.every steps and at the end of run().
  void set_validation(std::shared_ptr<const data::TokenDataset> val);
  // Mean cross entropy over every target token of the validation set (forward only, FSDP-sharded:
  // rank r evaluates rows r, r + W, ... in micro_batch-sized batches; all ranks run the same number
  // of forwards). Collective.
  struct EvalResult {
    double loss = 0;
    int64_t targets = 0;
  };
  EvalResult evaluate();

  // The state the trainer's rooms share (trainer_impl.h, included only inside runtime/train).
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::train
