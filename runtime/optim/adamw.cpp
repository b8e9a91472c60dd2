#include "runtime/optim/adamw.h"

#include <ATen/ATen.h>

#include <cmath>

#include "runtime/error.h"

namespace tessera::optim {

void init_state(ShardState& s) {
  TESSERA_CHECK(s.param.defined(), "shard has no parameter tensor");
  if (!s.exp_avg.defined()) s.exp_avg = at::zeros_like(s.param, at::MemoryFormat::Contiguous);
  if (!s.exp_avg_sq.defined()) s.exp_avg_sq = at::zeros_like(s.param, at::MemoryFormat::Contiguous);
}

void AdamW::step(std::vector<ShardState*>& shards, double lr) {
  ++step_count_;
  const auto& o = options_;
  const double bias_correction1 = 1 - std::pow(o.beta1, double(step_count_));
  const double bias_correction2 = 1 - std::pow(o.beta2, double(step_count_));
  const double step_size = lr / bias_correction1;
  const double decay_factor = 1 - lr * o.weight_decay;

  at::NoGradGuard no_grad;
  for (ShardState* s : shards) {
    if (!s->grad.defined()) continue;
    init_state(*s);
    at::Tensor& p = s->param;
    TESSERA_CHECK(p.scalar_type() == at::kFloat && s->grad.sizes() == p.sizes() && s->exp_avg.sizes() == p.sizes() &&
                      s->exp_avg_sq.sizes() == p.sizes(),
                  "AdamW shards must be float32 with matching param/grad/state shapes");
    if (o.weight_decay != 0) {
      if (!s->decay_mask.defined()) {
        p.mul_(decay_factor);
      } else {
        TESSERA_CHECK(s->decay_mask.sizes() == p.sizes(), "decay_mask shape differs from its shard");
        // Same rounding as p.mul_(decay_factor) on the decayed elements, untouched elsewhere.
        p.copy_(at::where(s->decay_mask > 0.5, p * decay_factor, p));
      }
    }
    s->exp_avg.mul_(o.beta1).add_(s->grad, 1 - o.beta1);
    s->exp_avg_sq.mul_(o.beta2).addcmul_(s->grad, s->grad, 1 - o.beta2);
    const at::Tensor denom = (s->exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(o.eps);
    p.addcdiv_(s->exp_avg, denom, -step_size);
  }
}

}  // namespace tessera::optim
