// Learning-rate schedules. Steps are 0-based optimizer steps.
//   warmup (step < warmup_steps): lr * (step + 1) / warmup_steps   (reaches lr at the last warmup step)
//   then, with progress = (step - warmup_steps) / (total_steps - warmup_steps) clamped to [0, 1]:
//     cosine:   min_lr + 0.5 * (lr - min_lr) * (1 + cos(pi * progress))
//     linear:   min_lr + (lr - min_lr) * (1 - progress)
//     constant: lr
//   If total_steps <= warmup_steps the decay phase is empty: cosine/linear give min_lr after warmup.
#pragma once
#include <cstdint>
#include <string>

#include "runtime/optim/names.h"

namespace tessera::optim {

// The schedule's settings, owned here: the schema binds train.lr, train.min_lr, train.warmup_steps
// and train.schedule to these fields (their defaults are these initialisers). The run's length
// (train.steps) is the loop's, passed to lr_at().
struct LrSchedule {
  double lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup_steps = 5;
  Schedule kind = Schedule::Cosine;  // names.h
};

// Throws Error(Input) for negative steps or lr, or min_lr > lr.
void validate(const LrSchedule& schedule);

// The learning rate of 0-based step `step` of a run of `total_steps`.
double lr_at(int64_t step, const LrSchedule& schedule, int64_t total_steps);

}  // namespace tessera::optim
