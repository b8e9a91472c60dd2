#include "runtime/optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace tessera::optim {

void validate(const LrSchedule& s) {
  TESSERA_CHECK_INPUT(s.lr >= 0 && std::isfinite(s.lr), "lr must be a finite non-negative number, got " + std::to_string(s.lr));
  TESSERA_CHECK_INPUT(s.min_lr >= 0 && s.min_lr <= s.lr,
                      "min_lr must be in [0, lr = " + std::to_string(s.lr) + "], got " + std::to_string(s.min_lr));
  TESSERA_CHECK_INPUT(s.warmup_steps >= 0, "warmup steps must be >= 0, got " + std::to_string(s.warmup_steps));
}

double lr_at(int64_t step, const LrSchedule& s, int64_t total_steps) {
  if (step < s.warmup_steps) return s.lr * double(step + 1) / double(s.warmup_steps);
  if (s.kind == Schedule::Constant) return s.lr;
  const int64_t decay_steps = total_steps - s.warmup_steps;
  const double progress =
      decay_steps <= 0 ? 1.0 : std::clamp(double(step - s.warmup_steps) / double(decay_steps), 0.0, 1.0);
  if (s.kind == Schedule::Linear) return s.min_lr + (s.lr - s.min_lr) * (1 - progress);
  return s.min_lr + 0.5 * (s.lr - s.min_lr) * (1 + std::cos(M_PI * progress));  // cosine
}

}  // namespace tessera::optim
