// Guarded numerics of a training step, kept out of the loop itself: trainer.cpp calls these at three
// points (scale the loss before backward; unscale the gradient shards before the norm and clipping;
// decide, after the norm, whether the optimizer runs).
//
// NumericsGuard -- a step whose loss or global gradient norm is not finite is SKIPPED on every rank:
// the optimizer does not run, so the fp32 masters and the AdamW moments stay bit-identical and
// AdamW's step count does not advance (as torch.cuda.amp.GradScaler.step skips optimizer.step());
// the loop's step, the data position and the LR schedule advance as for any step (as a PyTorch loop
// that calls scheduler.step() every iteration). The trainer agrees on the decision over the host
// world group (one 1-byte all-reduce per step, as FSDP's ShardedGradScaler all-reduces found_inf),
// so no rank can update while another skips. `train.max_skipped_steps` consecutive skips end the run
// (exhausted(), stop_message()): with fp16 each skip halves the loss scale, so that many in a row
// means the values are not finite at any usable scale.
//
// LossScaler -- dynamic loss scaling for fp16 (fsdp.mixed_precision or fsdp.reduce_dtype fp16),
// with torch.cuda.amp.GradScaler's defaults and state machine (FSDP's ShardedGradScaler is the same
// on shards): the loss is multiplied by scale() before backward; the gradient shards are multiplied
// by the fp32 inverse 1/scale (computed in double, rounded to float, as GradScaler) before the norm
// and clipping see them; update(found_inf): a non-finite step multiplies the scale by the backoff
// factor and restarts the growth count, growth_interval finite steps in a row multiply it by the
// growth factor (kept only if finite). The scale and growth count are saved in checkpoints
// (state()/load_state()). With a power-of-two scale and no overflow or underflow, scaling and
// unscaling are exact: an fp32 run with the scaler on computes the same update as without it.
//
// Both classes are plain state machines (no communication, no device synchronisation); the
// trainer feeds them values every rank agrees on.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera::train {

struct LossScaleOptions {
  float init_scale = 65536.0f;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class LossScaler {
 public:
  explicit LossScaler(bool enabled = false, LossScaleOptions options = {});

  bool enabled() const { return enabled_; }
  float scale() const { return enabled_ ? scale_ : 1.0f; }  // the loss multiplier
  int64_t growth_tracker() const { return growth_tracker_; }
  const LossScaleOptions& options() const { return options_; }

  // grads *= 1/scale in place (fp32 shards; undefined tensors skipped). No-op when disabled.
  void unscale(const std::vector<at::Tensor>& grads) const;
  // After the step's agreed outcome (found_inf: the step was skipped). No-op when disabled.
  void update(bool found_inf);

  // {"scale": S, "growth_tracker": N}; load_state refuses anything else (Error(Input) naming `where`).
  nlohmann::json state() const;
  void load_state(const nlohmann::json& j, const std::string& where);

 private:
  bool enabled_;
  LossScaleOptions options_;
  float scale_;
  int64_t growth_tracker_ = 0;
};

// What was not finite: "non-finite gradient norm (inf)", "non-finite loss (nan)", or both joined by
// " and "; "" when both are finite.
std::string non_finite_reason(double loss, double grad_norm);

class NumericsGuard {
 public:
  // max_consecutive: skips in a row that end the run (0: never).
  explicit NumericsGuard(int64_t max_consecutive = 10) : max_(max_consecutive) {}

  // The agreed outcome of optimizer step `step` (1-based, as logged), with its loss and gradient norm.
  void record(int64_t step, bool skipped, double loss, double grad_norm);

  int64_t total() const { return total_; }              // skipped steps of the run (checkpointed)
  int64_t consecutive() const { return consecutive_; }  // skipped steps in a row up to the last one
  int64_t max_consecutive() const { return max_; }
  const std::string& last_reason() const { return last_reason_; }
  bool exhausted() const { return max_ > 0 && consecutive_ >= max_; }
  // The one-line error when exhausted(): names train.max_skipped_steps, the steps and the reason,
  // and `checkpoint` (the last one saved, "" for none) as the state to resume from.
  std::string stop_message(const std::string& checkpoint) const;

  // {"skipped_steps": total, "consecutive_skipped": n, "first_skipped_step": s}; a checkpoint taken
  // during a streak resumes it (the limit counts across a restart).
  nlohmann::json state() const;
  void load_state(const nlohmann::json& j, const std::string& where);

 private:
  int64_t max_;
  int64_t total_ = 0, consecutive_ = 0, first_ = -1;  // first_: first step of the current streak
  std::string last_reason_;
};

}  // namespace tessera::train
