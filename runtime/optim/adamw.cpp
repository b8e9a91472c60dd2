#include "runtime/optim/adamw.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>

#include "runtime/error.h"
#include "runtime/memory/tracker.h"
#include "util/dtype_names.h"

namespace tessera::optim {

namespace {

struct Coefficients {
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, sqrt_bias_correction2, eps, neg_step_size;
  float grad_scale;  // gradient-norm clipping's coefficient, applied as each gradient is read
};

inline float load(float x) { return x; }
inline float load(c10::BFloat16 x) { return static_cast<float>(x); }
inline void store(float& dst, float x) { dst = x; }
inline void store(c10::BFloat16& dst, float x) { dst = c10::BFloat16(x); }  // round to nearest even

// Elements [begin, end) of one shard, all with or all without decay: one pass per element.
template <class S>
void update_span(float* p, const float* g, S* m, S* v, int64_t begin, int64_t end, bool decay, const Coefficients& c) {
  for (int64_t i = begin; i < end; ++i) {
    float pi = p[i];
    if (decay) pi = pi * c.decay;
    const float gi = g[i] * c.grad_scale;  // x * 1.0f == x: unclipped steps are unchanged
    const float mi = load(m[i]) * c.beta1 + c.one_minus_beta1 * gi;
    const float vi = load(v[i]) * c.beta2 + c.one_minus_beta2 * gi * gi;
    const float denom = std::sqrt(vi) / c.sqrt_bias_correction2 + c.eps;
    p[i] = pi + c.neg_step_size * (mi / denom);
    store(m[i], mi);
    store(v[i], vi);
  }
}

// Splits [begin, end) at the boundaries of the decay ranges.
template <class S>
void update_cpu(float* p, const float* g, S* m, S* v, int64_t begin, int64_t end, const std::vector<Range>& decay,
                const Coefficients& c) {
  // First range ending after `begin`.
  auto it = std::lower_bound(decay.begin(), decay.end(), begin,
                             [](const Range& r, int64_t x) { return r.first + r.second <= x; });
  int64_t i = begin;
  while (i < end) {
    if (it == decay.end() || it->first >= end) {
      update_span(p, g, m, v, i, end, false, c);
      return;
    }
    if (i < it->first) {
      update_span(p, g, m, v, i, it->first, false, c);
      i = it->first;
    }
    const int64_t stop = std::min(end, it->first + it->second);
    update_span(p, g, m, v, i, stop, true, c);
    i = stop;
    ++it;
  }
}

// The same formula as tensor ops over blocks (devices without the CPU loop).
void update_blocks(const ParamShard& s, at::Tensor& m_all, at::Tensor& v_all, const Coefficients& c) {
  const int64_t n = s.param.numel();
  for (int64_t b = 0; b < n; b += AdamW::kBlockElems) {
    const int64_t len = std::min(AdamW::kBlockElems, n - b);
    at::Tensor p = s.param.narrow(0, b, len), g = s.grad.narrow(0, b, len);
    if (c.grad_scale != 1.0f) g = g * c.grad_scale;
    for (const Range& r : s.decay) {
      const int64_t lo = std::max(b, r.first), hi = std::min(b + len, r.first + r.second);
      if (lo < hi) p.narrow(0, lo - b, hi - lo).mul_(c.decay);
    }
    at::Tensor m = m_all.narrow(0, b, len).to(at::kFloat), v = v_all.narrow(0, b, len).to(at::kFloat);
    m.mul_(c.beta1).add_(g, c.one_minus_beta1);
    v.mul_(c.beta2).addcmul_(g, g, c.one_minus_beta2);
    const at::Tensor denom = (v.sqrt() / c.sqrt_bias_correction2).add_(c.eps);
    p.addcdiv_(m, denom, c.neg_step_size);
    if (m_all.scalar_type() != at::kFloat) {
      m_all.narrow(0, b, len).copy_(m);
      v_all.narrow(0, b, len).copy_(v);
    }
  }
}

}  // namespace

at::ScalarType parse_state_dtype(const std::string& s) {
  const auto t = util::float_type_named(s);
  if (t == util::FloatType::F32) return at::kFloat;
  if (t == util::FloatType::BF16) return at::kBFloat16;
  throw TESSERA_INPUT_ERROR("optim.state_dtype '" + s + "' is not one of fp32, bf16");
}

AdamW::AdamW(AdamWOptions options) : options_(options) {
  TESSERA_CHECK_INPUT(options_.state_dtype == at::kFloat || options_.state_dtype == at::kBFloat16,
                      "AdamW state dtype must be fp32 or bf16");
}

int64_t AdamW::state_bytes_per_element() const { return 2 * c10::elementSize(options_.state_dtype); }

void AdamW::ensure_state(const std::vector<ParamShard>& shards) {
  if (exp_avg_.size() < shards.size()) {
    exp_avg_.resize(shards.size());
    exp_avg_sq_.resize(shards.size());
  }
  memory::Scope scope(memory::Category::Optimizer);
  for (size_t i = 0; i < shards.size(); ++i) {
    const at::Tensor& p = shards[i].param;
    auto opts = p.options().dtype(options_.state_dtype);
    if (!exp_avg_[i].defined()) exp_avg_[i] = at::zeros({p.numel()}, opts);
    if (!exp_avg_sq_[i].defined()) exp_avg_sq_[i] = at::zeros({p.numel()}, opts);
    TESSERA_CHECK(exp_avg_[i].numel() == p.numel(), "AdamW state does not match shard " + std::to_string(i));
  }
}

std::vector<NamedShards> AdamW::state(const std::vector<ParamShard>& shards) {
  ensure_state(shards);
  return {{"exp_avg", std::vector<at::Tensor>(exp_avg_.begin(), exp_avg_.begin() + shards.size())},
          {"exp_avg_sq", std::vector<at::Tensor>(exp_avg_sq_.begin(), exp_avg_sq_.begin() + shards.size())}};
}

void AdamW::step(const std::vector<ParamShard>& shards, double lr, float grad_scale) {
  ++step_count_;
  const auto& o = options_;
  const double bias_correction1 = 1 - std::pow(o.beta1, double(step_count_));
  const double bias_correction2 = 1 - std::pow(o.beta2, double(step_count_));
  Coefficients c;
  c.decay = static_cast<float>(o.weight_decay != 0 ? 1 - lr * o.weight_decay : 1.0);
  c.beta1 = static_cast<float>(o.beta1);
  c.one_minus_beta1 = static_cast<float>(1 - o.beta1);
  c.beta2 = static_cast<float>(o.beta2);
  c.one_minus_beta2 = static_cast<float>(1 - o.beta2);
  c.sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2));
  c.eps = static_cast<float>(o.eps);
  c.neg_step_size = static_cast<float>(-lr / bias_correction1);
  c.grad_scale = grad_scale;
  static const std::vector<Range> kNoDecay;

  at::NoGradGuard no_grad;
  ensure_state(shards);
  memory::Scope scope(memory::Category::Optimizer);
  for (size_t i = 0; i < shards.size(); ++i) {
    const ParamShard& s = shards[i];
    if (!s.grad.defined()) continue;
    const at::Tensor& p = s.param;
    TESSERA_CHECK(p.scalar_type() == at::kFloat && s.grad.scalar_type() == at::kFloat && p.is_contiguous() &&
                      s.grad.is_contiguous() && s.grad.numel() == p.numel(),
                  "AdamW shards must be contiguous float32 with matching param/grad shapes");
    const std::vector<Range>& decay = o.weight_decay != 0 ? s.decay : kNoDecay;
    at::Tensor& m = exp_avg_[i];
    at::Tensor& v = exp_avg_sq_[i];
    if (!p.is_cpu() || !o.fused_cpu) {
      update_blocks({p, s.grad, decay}, m, v, c);
      continue;
    }
    float* pp = p.data_ptr<float>();
    const float* gp = s.grad.data_ptr<float>();
    at::parallel_for(0, p.numel(), /*grain=*/int64_t(1) << 15, [&](int64_t begin, int64_t end) {
      if (m.scalar_type() == at::kFloat)
        update_cpu(pp, gp, m.data_ptr<float>(), v.data_ptr<float>(), begin, end, decay, c);
      else
        update_cpu(pp, gp, m.data_ptr<c10::BFloat16>(), v.data_ptr<c10::BFloat16>(), begin, end, decay, c);
    });
  }
}

}  // namespace tessera::optim
