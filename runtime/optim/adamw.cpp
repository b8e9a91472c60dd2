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

// One piece of a shard for the tensor-op path: [begin, begin + len) of shard i.
struct Piece {
  size_t shard;
  int64_t begin, len;
};

// The shards cut into pieces of at most group_elems elements, gathered greedily into groups
// of at most group_elems elements together (in shard order): each group is one set of multi-tensor
// operations, and no temporary is larger than a group.
std::vector<std::vector<Piece>> group_pieces(const std::vector<ParamShard>& shards, int64_t group_elems) {
  std::vector<std::vector<Piece>> groups(1);
  int64_t filled = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    if (!shards[i].grad.defined()) continue;
    const int64_t n = shards[i].param.numel();
    for (int64_t b = 0; b < n; b += group_elems) {
      const int64_t len = std::min(group_elems, n - b);
      if (filled + len > group_elems && !groups.back().empty()) {
        groups.emplace_back();
        filled = 0;
      }
      groups.back().push_back({i, b, len});
      filled += len;
    }
  }
  return groups;
}

// [begin, begin + len) of t: t itself when that is all of it (a view is an operator dispatch too).
at::Tensor piece_of(const at::Tensor& t, int64_t begin, int64_t len) {
  return begin == 0 && len == t.numel() ? t : t.narrow(0, begin, len);
}

// The same formula as tensor ops (devices without the CPU loop): per group about ten multi-tensor
// (_foreach_) operations over all its pieces -- one kernel launch each on a GPU (a few for large
// lists) instead of several per block -- plus, for bf16 moments, a widening and a narrowing copy
// per piece. The operations, their order and their rounding are those of one whole-tensor update
// per piece, so the result does not depend on the grouping. decay_views(i): shard i's decayed
// ranges as views of its param (kept by AdamW across steps).
template <class DecayViews>
void update_group(const std::vector<ParamShard>& shards, const std::vector<Piece>& group, std::vector<at::Tensor>& m_all,
                  std::vector<at::Tensor>& v_all, const Coefficients& c, DecayViews&& decay_views) {
  std::vector<at::Tensor> p, g, m, v, decayed, m_state, v_state;
  for (const Piece& pc : group) {
    const ParamShard& s = shards[pc.shard];
    p.push_back(piece_of(s.param, pc.begin, pc.len));
    g.push_back(piece_of(s.grad, pc.begin, pc.len));
    m_state.push_back(piece_of(m_all[pc.shard], pc.begin, pc.len));
    v_state.push_back(piece_of(v_all[pc.shard], pc.begin, pc.len));
    if (pc.begin == 0 && pc.len == s.param.numel()) {
      const std::vector<at::Tensor>& views = decay_views(pc.shard);
      decayed.insert(decayed.end(), views.begin(), views.end());
      continue;
    }
    for (const Range& r : s.decay) {
      const int64_t lo = std::max(pc.begin, r.first), hi = std::min(pc.begin + pc.len, r.first + r.second);
      if (lo < hi) decayed.push_back(s.param.narrow(0, lo, hi - lo));
    }
  }
  const bool widen = m_state.front().scalar_type() != at::kFloat;
  for (size_t k = 0; k < m_state.size(); ++k) {
    m.push_back(widen ? m_state[k].to(at::kFloat) : m_state[k]);
    v.push_back(widen ? v_state[k].to(at::kFloat) : v_state[k]);
  }
  if (c.grad_scale != 1.0f) g = at::_foreach_mul(g, c.grad_scale);
  if (!decayed.empty()) at::_foreach_mul_(decayed, c.decay);
  at::_foreach_mul_(m, c.beta1);
  at::_foreach_add_(m, g, c.one_minus_beta1);
  at::_foreach_mul_(v, c.beta2);
  at::_foreach_addcmul_(v, g, g, c.one_minus_beta2);
  std::vector<at::Tensor> denom = at::_foreach_sqrt(v);
  at::_foreach_div_(denom, c.sqrt_bias_correction2);
  at::_foreach_add_(denom, c.eps);
  at::_foreach_addcdiv_(p, m, denom, c.neg_step_size);
  if (widen)
    for (size_t k = 0; k < m.size(); ++k) {
      m_state[k].copy_(m[k]);
      v_state[k].copy_(v[k]);
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
  TESSERA_CHECK_INPUT(options_.group_elems >= 1, "AdamW group_elems must be >= 1");
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

const std::vector<at::Tensor>& AdamW::decay_views_of(size_t i, const ParamShard& s) {
  if (decay_views_.size() <= i) decay_views_.resize(i + 1);
  DecayViews& d = decay_views_[i];
  if (d.data != s.param.data_ptr() || d.numel != s.param.numel() || d.ranges != s.decay) {
    d.views.clear();
    for (const Range& r : s.decay) d.views.push_back(piece_of(s.param, r.first, r.second));
    d.data = s.param.data_ptr();
    d.numel = s.param.numel();
    d.ranges = s.decay;
  }
  return d.views;
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
  // The shards for the tensor-op path, at their own indices (the others' gradients left undefined).
  std::vector<ParamShard> tensor_path(shards.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    const ParamShard& s = shards[i];
    if (!s.grad.defined()) continue;
    const at::Tensor& p = s.param;
    TESSERA_CHECK(p.scalar_type() == at::kFloat && s.grad.scalar_type() == at::kFloat && p.is_contiguous() &&
                      s.grad.is_contiguous() && s.grad.numel() == p.numel(),
                  "AdamW shards must be contiguous float32 with matching param/grad shapes");
    const std::vector<Range>& decay = o.weight_decay != 0 ? s.decay : kNoDecay;
    if (!p.is_cpu() || !o.fused_cpu) {
      tensor_path[i] = {p, s.grad, decay};
      continue;
    }
    at::Tensor& m = exp_avg_[i];
    at::Tensor& v = exp_avg_sq_[i];
    float* pp = p.data_ptr<float>();
    const float* gp = s.grad.data_ptr<float>();
    at::parallel_for(0, p.numel(), /*grain=*/int64_t(1) << 15, [&](int64_t begin, int64_t end) {
      if (m.scalar_type() == at::kFloat)
        update_cpu(pp, gp, m.data_ptr<float>(), v.data_ptr<float>(), begin, end, decay, c);
      else
        update_cpu(pp, gp, m.data_ptr<c10::BFloat16>(), v.data_ptr<c10::BFloat16>(), begin, end, decay, c);
    });
  }
  auto decay_views = [&](size_t i) -> const std::vector<at::Tensor>& { return decay_views_of(i, tensor_path[i]); };
  for (const std::vector<Piece>& group : group_pieces(tensor_path, o.group_elems))
    if (!group.empty()) update_group(tensor_path, group, exp_avg_, exp_avg_sq_, c, decay_views);
}

}  // namespace tessera::optim
