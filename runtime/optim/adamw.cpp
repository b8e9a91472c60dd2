#include "runtime/optim/adamw.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard: ATen.h no longer brings it in LibTorch 2.11
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>

#include "runtime/gpu/adamw_math.h"
#include "runtime/gpu/gpu.h"
#include "runtime/memory/tracker.h"
#include "util/torch_compat.h"
#include "util/dtype_names.h"
#include "util/error.h"

namespace tessera::optim {

namespace {

using Coefficients = gpu::AdamWCoefficients;

inline float load(float x) { return x; }
inline float load(c10::BFloat16 x) { return static_cast<float>(x); }
inline void store(float& dst, float x) { dst = x; }
inline void store(c10::BFloat16& dst, float x) { dst = c10::BFloat16(x); }  // round to nearest even

// Elements [begin, end) of one shard, all with or all without decay: one pass per element, each
// through adamw_element (the GPU kernel's own code).
template <class S>
void update_span(float* p, const float* g, S* m, S* v, int64_t begin, int64_t end, bool decay, const Coefficients& c) {
  for (int64_t i = begin; i < end; ++i) {
    float mi = load(m[i]), vi = load(v[i]);
    p[i] = gpu::adamw_element(p[i], g[i], mi, vi, decay, c, c.grad_scale);
    store(m[i], mi);
    store(v[i], vi);
  }
}

// Calls span(lo, hi, decayed) for the pieces of [begin, end) cut at the boundaries of the decay
// ranges, in order.
template <class Span>
void for_decay_spans(int64_t begin, int64_t end, const std::vector<Range>& decay, Span&& span) {
  // First range ending after `begin`.
  auto it = std::lower_bound(decay.begin(), decay.end(), begin,
                             [](const Range& r, int64_t x) { return r.first + r.second <= x; });
  int64_t i = begin;
  while (i < end) {
    if (it == decay.end() || it->first >= end) {
      span(i, end, false);
      return;
    }
    if (i < it->first) {
      span(i, it->first, false);
      i = it->first;
    }
    const int64_t stop = std::min(end, it->first + it->second);
    span(i, stop, true);
    i = stop;
    ++it;
  }
}

template <class S>
void update_cpu(float* p, const float* g, S* m, S* v, int64_t begin, int64_t end, const std::vector<Range>& decay,
                const Coefficients& c) {
  for_decay_spans(begin, end, decay, [&](int64_t lo, int64_t hi, bool d) { update_span(p, g, m, v, lo, hi, d, c); });
}

// ---- 8-bit state, CPU: one block at a time -------------------------------------------------------

// One 8-bit shard as the CPU loop sees it.
struct Q8Shard {
  float* p;
  const float* g;
  uint8_t *qm, *qv;    // code bytes
  float *am, *av;      // absmax per block
  int64_t numel, block;
};

// Elements [lo, hi) of the block starting at b0: dequantize with the block's old absmax, the fp32
// update (update_span's arithmetic, in the same order), the new moments kept in mbuf / vbuf.
void update_span_q8(const Q8Shard& s, int64_t b0, int64_t lo, int64_t hi, bool decay, const Coefficients& c,
                    float* mbuf, float* vbuf, float& max_m, float& max_v) {
  const q8::Codebook& M = q8::signed_map();
  const q8::Codebook& V = q8::unsigned_map();
  const float sm = s.am[b0 / s.block], sv = s.av[b0 / s.block];
  for (int64_t i = lo; i < hi; ++i) {
    float mi = M.decode(s.qm[i]) * sm, vi = V.decode(s.qv[i]) * sv;
    s.p[i] = gpu::adamw_element(s.p[i], s.g[i], mi, vi, decay, c, c.grad_scale);
    mbuf[i - b0] = mi;
    vbuf[i - b0] = vi;
    max_m = std::max(max_m, std::fabs(mi));
    max_v = std::max(max_v, vi);
  }
}

// Blocks [first, last) of a shard: update, then the new absmax and codes of each block.
void update_blocks_q8(const Q8Shard& s, int64_t first, int64_t last, const std::vector<Range>& decay,
                      const Coefficients& c) {
  const q8::Codebook& M = q8::signed_map();
  const q8::Codebook& V = q8::unsigned_map();
  std::vector<float> buf(static_cast<size_t>(2 * s.block));
  float* mbuf = buf.data();
  float* vbuf = mbuf + s.block;
  for (int64_t b = first; b < last; ++b) {
    const int64_t b0 = b * s.block, b1 = std::min(s.numel, b0 + s.block);
    float max_m = 0, max_v = 0;
    for_decay_spans(b0, b1, decay, [&](int64_t lo, int64_t hi, bool d) {
      update_span_q8(s, b0, lo, hi, d, c, mbuf, vbuf, max_m, max_v);
    });
    s.am[b] = max_m;
    s.av[b] = max_v;
    const float inv_m = max_m > 0 ? 1.0f / max_m : 0.0f, inv_v = max_v > 0 ? 1.0f / max_v : 0.0f;
    for (int64_t i = b0; i < b1; ++i) {
      s.qm[i] = M.encode(mbuf[i - b0] * inv_m);
      s.qv[i] = V.encode(vbuf[i - b0] * inv_v);
    }
  }
}

// One piece of a shard for the tensor-op path: [begin, begin + len) of shard i.
struct Piece {
  size_t shard;
  int64_t begin, len;
};

// The shards cut into pieces of at most group_elems elements (rounded up to a multiple of
// `quantum`: 8-bit pieces hold whole blocks), gathered greedily into groups of at most that many
// elements together (in shard order): each group is one set of multi-tensor operations, and no
// temporary is larger than a group.
std::vector<std::vector<Piece>> group_pieces(const std::vector<ParamShard>& shards, int64_t group_elems,
                                             int64_t quantum) {
  const int64_t step = (group_elems + quantum - 1) / quantum * quantum;
  std::vector<std::vector<Piece>> groups(1);
  int64_t filled = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    if (!shards[i].grad.defined()) continue;
    const int64_t n = shards[i].param.numel();
    for (int64_t b = 0; b < n; b += step) {
      const int64_t len = std::min(step, n - b);
      if (filled + len > step && !groups.back().empty()) {
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

// How the tensor-op path reads a piece's moments as fp32 and writes them back: fp32 state is used
// in place, bf16 widened and narrowed, 8-bit dequantized into zero-padded fp32 temporaries of
// whole blocks and re-quantized from them.
struct MomentAccess {
  std::vector<at::Tensor>& m_all;
  std::vector<at::Tensor>& v_all;
  std::vector<at::Tensor>* am_all = nullptr;  // 8-bit: absmax per block
  std::vector<at::Tensor>* av_all = nullptr;
  const q8::CodebookTensors* cm = nullptr;
  const q8::CodebookTensors* cv = nullptr;
  int64_t block = 1;

  // fp32 moments of the piece: at least pc.len elements (8-bit: whole blocks, zero beyond pc.len).
  std::pair<at::Tensor, at::Tensor> load(const Piece& pc) const {
    const at::Tensor ms = piece_of(m_all[pc.shard], pc.begin, pc.len), vs = piece_of(v_all[pc.shard], pc.begin, pc.len);
    if (ms.scalar_type() == at::kFloat) return {ms, vs};
    if (!am_all) return {ms.to(at::kFloat), vs.to(at::kFloat)};
    const int64_t nb = (pc.len + block - 1) / block;
    // Whole blocks: every element is written below; a partial last block's tail must read as 0.
    const auto f32 = ms.options().dtype(at::kFloat);
    at::Tensor m = nb * block == pc.len ? at::empty({nb * block}, f32) : at::zeros({nb * block}, f32);
    at::Tensor v = nb * block == pc.len ? at::empty_like(m) : at::zeros_like(m);
    q8::dequantize_into(ms, (*am_all)[pc.shard].narrow(0, pc.begin / block, nb), block, *cm, m);
    q8::dequantize_into(vs, (*av_all)[pc.shard].narrow(0, pc.begin / block, nb), block, *cv, v);
    return {m, v};
  }
  void store(const Piece& pc, const at::Tensor& m, const at::Tensor& v) const {
    at::Tensor ms = piece_of(m_all[pc.shard], pc.begin, pc.len), vs = piece_of(v_all[pc.shard], pc.begin, pc.len);
    if (ms.scalar_type() == at::kFloat) return;
    if (!am_all) {
      ms.copy_(m);
      vs.copy_(v);
      return;
    }
    const int64_t nb = m.numel() / block;
    ms.copy_(q8::quantize(m, block, *cm, (*am_all)[pc.shard].narrow(0, pc.begin / block, nb)).narrow(0, 0, pc.len));
    vs.copy_(q8::quantize(v, block, *cv, (*av_all)[pc.shard].narrow(0, pc.begin / block, nb)).narrow(0, 0, pc.len));
  }
};

// The same formula as tensor ops (devices without the CPU loop): per group about ten multi-tensor
// (_foreach_) operations over all its pieces -- one kernel launch each on a GPU (a few for large
// lists) instead of several per block -- plus, for bf16 moments, a widening and a narrowing copy
// per piece (8-bit: a dequantization and a quantization, a few operations each). The operations,
// their order and their rounding are those of one whole-tensor update per piece, so the result
// does not depend on the grouping. decay_views(i): shard i's decayed ranges as views of its param
// (kept by AdamW across steps).
template <class DecayViews>
void update_group(const std::vector<ParamShard>& shards, const std::vector<Piece>& group, const MomentAccess& state,
                  const Coefficients& c, DecayViews&& decay_views) {
  std::vector<at::Tensor> p, g, m, v, decayed, m_full, v_full;
  for (const Piece& pc : group) {
    const ParamShard& s = shards[pc.shard];
    p.push_back(piece_of(s.param, pc.begin, pc.len));
    g.push_back(piece_of(s.grad, pc.begin, pc.len));
    auto [mf, vf] = state.load(pc);
    m.push_back(piece_of(mf, 0, pc.len));
    v.push_back(piece_of(vf, 0, pc.len));
    m_full.push_back(std::move(mf));
    v_full.push_back(std::move(vf));
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
  for (size_t k = 0; k < group.size(); ++k) state.store(group[k], m_full[k], v_full[k]);
}

Coefficients coefficients(const AdamWOptions& o, int64_t step, double lr, float grad_scale) {
  const double bias_correction1 = 1 - std::pow(o.beta1, double(step));
  const double bias_correction2 = 1 - std::pow(o.beta2, double(step));
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
  return c;
}

}  // namespace

at::ScalarType parse_state_dtype(const std::string& s) {
  const auto t = util::float_type_named(s);
  if (t == util::FloatType::F32) return at::kFloat;
  if (t == util::FloatType::BF16) return at::kBFloat16;
  if (s == "int8") return at::kByte;
  throw TESSERA_INPUT_ERROR("optim.state_dtype '" + s + "' is not one of fp32, bf16, int8");
}

at::ScalarType state_scalar_type(StateDtype d) {
  switch (d) {
    case StateDtype::F32: return at::kFloat;
    case StateDtype::BF16: return at::kBFloat16;
    case StateDtype::Int8: return at::kByte;
  }
  throw TESSERA_INPUT_ERROR("unknown optim.state_dtype");
}

bool device_update_is_tesseras(at::ScalarType state_dtype) { return !(compat::kHasFusedAdamW && state_dtype == at::kFloat); }

int64_t state_alignment(at::ScalarType state_dtype) { return state_dtype == at::kByte ? q8::kDefaultBlock : 1; }

double state_bytes_per_param(at::ScalarType state_dtype) {
  if (state_dtype == at::kByte) return 2.0 + 8.0 / static_cast<double>(q8::kDefaultBlock);
  return 2.0 * static_cast<double>(c10::elementSize(state_dtype));
}

AdamW::AdamW(AdamWOptions options) : options_(options) {
  const auto& o = options_;
  TESSERA_CHECK_INPUT(o.group_elems >= 1, "AdamW group_elems must be >= 1");
  TESSERA_CHECK_INPUT(o.block >= 1 && o.block <= q8::kMaxBlock && (o.block & (o.block - 1)) == 0,
                      "AdamW 8-bit block must be a power of two <= " + std::to_string(q8::kMaxBlock));
}

int64_t AdamW::state_bytes_per_element() const { return 2 * c10::elementSize(options_.state_type()); }

int64_t AdamW::state_bytes(int64_t numel) const {
  const int64_t blocks = quantized() ? (numel + options_.block - 1) / options_.block : 0;
  return state_bytes_per_element() * numel + 2 * 4 * blocks;
}

void AdamW::ensure_state(const std::vector<ParamShard>& shards) {
  if (exp_avg_.size() < shards.size()) {
    exp_avg_.resize(shards.size());
    exp_avg_sq_.resize(shards.size());
    absmax_avg_.resize(shards.size());
    absmax_avg_sq_.resize(shards.size());
  }
  for (size_t i = 0; i < shards.size(); ++i) {
    memory::Scope scope(memory::Category::Optimizer, shards[i].host ? memory::Where::Host : memory::Where::Device);
    const at::Tensor& p = shards[i].param;
    auto opts = p.options().dtype(options_.state_type());
    if (!exp_avg_[i].defined()) exp_avg_[i] = at::zeros({p.numel()}, opts);
    if (!exp_avg_sq_[i].defined()) exp_avg_sq_[i] = at::zeros({p.numel()}, opts);
    TESSERA_CHECK(exp_avg_[i].numel() == p.numel(), "AdamW state does not match shard " + std::to_string(i));
    if (!quantized()) continue;
    const int64_t blocks = (p.numel() + options_.block - 1) / options_.block;
    if (!absmax_avg_[i].defined()) absmax_avg_[i] = at::zeros({blocks}, p.options().dtype(at::kFloat));
    if (!absmax_avg_sq_[i].defined()) absmax_avg_sq_[i] = at::zeros({blocks}, p.options().dtype(at::kFloat));
  }
}

const std::vector<at::Tensor>& AdamW::decay_views_of(size_t i, const ParamShard& s) {
  if (decay_views_.size() <= i) decay_views_.resize(i + 1);
  DecayViews& d = decay_views_[i];
  if (d.data != s.param.data_ptr() || d.numel != s.param.numel() || d.ranges != s.decay) {
    d.views.clear();
    d.on_device = at::Tensor();
    for (const Range& r : s.decay) d.views.push_back(piece_of(s.param, r.first, r.second));
    d.data = s.param.data_ptr();
    d.numel = s.param.numel();
    d.ranges = s.decay;
  }
  return d.views;
}

const q8::CodebookTensors& AdamW::codebook_tensors(bool is_signed, const at::Device& device) {
  q8::CodebookTensors& t = is_signed ? codes_m_ : codes_v_;
  if (!t.value.defined() || t.value.device() != device)
    t = q8::codebook_tensors(is_signed ? q8::signed_map() : q8::unsigned_map(), device);
  return t;
}

std::vector<NamedShards> AdamW::state(const std::vector<ParamShard>& shards) {
  ensure_state(shards);
  auto first = [&](const std::vector<at::Tensor>& v) {
    return std::vector<at::Tensor>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(shards.size()));
  };
  if (!quantized()) return {{"exp_avg", first(exp_avg_)}, {"exp_avg_sq", first(exp_avg_sq_)}};
  return {{"exp_avg.q8", first(exp_avg_)},
          {"exp_avg.absmax", first(absmax_avg_), options_.block},
          {"exp_avg_sq.q8", first(exp_avg_sq_)},
          {"exp_avg_sq.absmax", first(absmax_avg_sq_), options_.block}};
}

std::vector<Range> ranges_outside(int64_t numel, const std::vector<Range>& ranges) {
  std::vector<Range> out;
  int64_t at = 0;
  for (const Range& r : ranges) {
    if (r.first > at) out.push_back({at, r.first - at});
    at = r.first + r.second;
  }
  if (numel > at) out.push_back({at, numel - at});
  return out;
}

// Every shard with a gradient on a GPU, one and the same, and fused kernels allowed.
bool AdamW::on_one_gpu(const std::vector<ParamShard>& tensor_path) const {
  if (!options_.fused_device) return false;
  const at::Tensor* first = nullptr;
  for (const ParamShard& s : tensor_path) {
    if (!s.grad.defined()) continue;
    if (!s.param.is_cuda() || (first && s.param.device() != first->device())) return false;
    first = &s.param;
  }
  return first != nullptr;
}

bool AdamW::uses_fused_kernel(const std::vector<ParamShard>& tensor_path) const {
  return options_.torch_fused && !device_update_is_tesseras(options_.state_type()) && on_one_gpu(tensor_path);
}

bool AdamW::uses_own_kernel(const std::vector<ParamShard>& tensor_path) const {
  return gpu::built() && !uses_fused_kernel(tensor_path) && on_one_gpu(tensor_path);
}

// Tessera's kernel: every shard with a gradient in one pass (a launch per kAdamWMaxShards shards),
// each with its decay ranges on the device (uploaded when they change, with the views).
void AdamW::own_step(const std::vector<ParamShard>& tensor_path, const gpu::AdamWCoefficients& c, const at::Tensor& found_inf,
                     const at::Tensor& device_scale) {
  std::vector<gpu::AdamWShard> shards;
  at::Device device = at::kCPU;
  for (size_t i = 0; i < tensor_path.size(); ++i) {
    const ParamShard& s = tensor_path[i];
    if (!s.grad.defined()) continue;
    device = s.param.device();
    gpu::AdamWShard k{s.param, s.grad, exp_avg_[i], exp_avg_sq_[i], {}, {}, {}};
    if (quantized()) k.absmax_avg = absmax_avg_[i], k.absmax_avg_sq = absmax_avg_sq_[i];
    decay_views_of(i, s);
    DecayViews& d = decay_views_[i];
    if (!s.decay.empty() && !d.on_device.defined()) {
      at::Tensor pairs = at::empty({2 * static_cast<int64_t>(s.decay.size())}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
      for (size_t r = 0; r < s.decay.size(); ++r)
        pairs.data_ptr<int64_t>()[2 * r] = s.decay[r].first, pairs.data_ptr<int64_t>()[2 * r + 1] = s.decay[r].second;
      d.on_device = pairs.to(device, /*non_blocking=*/true);
    }
    k.decay = d.on_device;
    shards.push_back(std::move(k));
  }
  gpu::Q8Codebooks q8;
  if (quantized()) {
    const q8::CodebookTensors &m = codebook_tensors(true, device), &v = codebook_tensors(false, device);
    q8 = {m.value, m.mid, v.value, v.mid, m.zero, v.zero, options_.block};
  }
  gpu::adamw_update(shards, c, device_scale, found_inf, quantized() ? &q8 : nullptr);
}

const AdamW::FusedLists& AdamW::fused_lists_of(const std::vector<ParamShard>& tensor_path) {
  std::vector<int64_t> key;  // per shard taking the step: its index, storages, size and decay ranges
  for (size_t i = 0; i < tensor_path.size(); ++i) {
    const ParamShard& s = tensor_path[i];
    if (!s.grad.defined()) continue;
    for (const void* p : {s.param.data_ptr(), exp_avg_[i].data_ptr(), exp_avg_sq_[i].data_ptr()})
      key.push_back(reinterpret_cast<int64_t>(p));
    key.insert(key.end(), {static_cast<int64_t>(i), s.param.numel(), static_cast<int64_t>(s.decay.size())});
    for (const Range& r : s.decay) key.insert(key.end(), {r.first, r.second});
  }
  if (key == fused_lists_.key) return fused_lists_;
  fused_lists_ = FusedLists{std::move(key), {}, {}};
  for (size_t i = 0; i < tensor_path.size(); ++i) {
    const ParamShard& s = tensor_path[i];
    if (!s.grad.defined()) continue;
    const at::Tensor* of[3] = {&s.param, &exp_avg_[i], &exp_avg_sq_[i]};
    for (int decayed = 0; decayed < 2; ++decayed)
      for (const Range& r : decayed ? s.decay : ranges_outside(s.param.numel(), s.decay)) {
        for (int k = 0; k < 3; ++k) fused_lists_.lists[decayed][k].push_back(piece_of(*of[k], r.first, r.second));
        fused_lists_.ranges[decayed].emplace_back(i, r);
      }
  }
  return fused_lists_;
}

// The fused kernel over views of every shard: the decayed ranges with the weight decay, the rest
// without. One kernel launch per class (multi_tensor_apply chunks long lists itself).
void AdamW::fused_step(const std::vector<ParamShard>& tensor_path, double lr, float grad_scale, const at::Tensor& found_inf,
                       const at::Tensor& device_scale) {
  const FusedLists& f = fused_lists_of(tensor_path);
  const std::vector<at::Tensor>& params = f.lists[0][0].empty() ? f.lists[1][0] : f.lists[0][0];
  if (params.empty()) return;  // only empty shards
  const at::Device device = params.front().device();
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  if (!step_tensor_.defined() || step_tensor_.device() != device) step_tensor_ = at::empty({}, f32);
  step_tensor_.fill_(static_cast<double>(step_count_));
  // The kernel divides by its grad_scale; clipping multiplies by ours (a rounding apart).
  const at::Tensor scale = device_scale.defined() ? device_scale.reciprocal()
                           : grad_scale != 1.0f   ? at::full({}, 1.0 / double(grad_scale), f32)
                                                  : at::Tensor();
  const auto& o = options_;
  for (int decayed = 0; decayed < 2; ++decayed) {
    const auto& l = f.lists[decayed];
    if (l[0].empty()) continue;
    std::vector<at::Tensor> grads;
    for (const auto& [i, r] : f.ranges[decayed]) grads.push_back(piece_of(tensor_path[i].grad, r.first, r.second));
    const std::vector<at::Tensor> steps(l[0].size(), step_tensor_);
    compat::fused_adamw(l[0], grads, l[1], l[2], steps, lr, o.beta1, o.beta2, decayed ? o.weight_decay : 0.0, o.eps, scale,
                        found_inf);
  }
}

bool AdamW::skips_itself(const std::vector<ParamShard>& shards, const at::Device& device) const {
  bool cpu_loop = false, on_device = false;
  for (const ParamShard& s : shards) {
    if (!s.grad.defined()) continue;
    if (s.param.is_cpu() && options_.fused_cpu) cpu_loop = true;
    else if (s.param.device() != device) return false;
    else on_device = true;
  }
  if (cpu_loop == on_device) return false;  // nothing to update, or both paths at once
  // The CPU loop reads a host flag (a device's would make the host wait); a device, the fused kernel.
  return cpu_loop ? device.is_cpu() : uses_fused_kernel(shards) || uses_own_kernel(shards);
}

// What skips itself on a device takes the device's coefficient too; the CPU loop on the host takes
// the host's float instead, unless it stands for a device's kernel.
bool AdamW::folds_clipping(const std::vector<ParamShard>& shards, const at::Device& device) const {
  return (device.is_cuda() || options_.cpu_stands_for_device) && skips_itself(shards, device);
}

void AdamW::step(const std::vector<ParamShard>& shards, double lr, float grad_scale, const at::Tensor& found_inf,
                 const at::Tensor& device_scale) {
  TESSERA_CHECK(!device_scale.defined() || folds_clipping(shards, device_scale.device()),
                "AdamW: a device's clipping coefficient given for shards that no fused kernel updates");
  if (found_inf.defined()) {
    TESSERA_CHECK(skips_itself(shards, found_inf.device()),
                  "AdamW: found_inf given for shards whose update cannot skip itself (the tensor-op path)");
    // The CPU loop reads the flag where it is (no operator, no synchronisation): nothing touched.
    if (found_inf.is_cpu() && *found_inf.contiguous().data_ptr<float>() != 0.0f) return;
  }
  // The CPU loop reads a coefficient on the CPU where it is (cpu_stands_for_device), as a kernel would.
  if (device_scale.defined() && device_scale.is_cpu()) grad_scale = *device_scale.contiguous().data_ptr<float>();
  ++step_count_;
  const auto& o = options_;
  const Coefficients c = coefficients(o, step_count_, lr, grad_scale);
  static const std::vector<Range> kNoDecay;

  at::NoGradGuard no_grad;
  ensure_state(shards);
  memory::Scope scope(memory::Category::Optimizer);
  // The shards for the tensor-op path, at their own indices (the others' gradients left undefined).
  std::vector<ParamShard> tensor_path(shards.size());
  bool any_tensor_path = false;
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
      any_tensor_path = true;
      continue;
    }
    float* pp = p.data_ptr<float>();
    const float* gp = s.grad.data_ptr<float>();
    at::Tensor& m = exp_avg_[i];
    at::Tensor& v = exp_avg_sq_[i];
    if (quantized()) {
      const Q8Shard q{pp, gp, m.data_ptr<uint8_t>(), v.data_ptr<uint8_t>(), absmax_avg_[i].data_ptr<float>(),
                      absmax_avg_sq_[i].data_ptr<float>(), p.numel(), o.block};
      const int64_t blocks = (p.numel() + o.block - 1) / o.block;
      at::parallel_for(0, blocks, /*grain=*/std::max<int64_t>(1, (int64_t(1) << 15) / o.block),
                       [&](int64_t first, int64_t last) { update_blocks_q8(q, first, last, decay, c); });
      continue;
    }
    at::parallel_for(0, p.numel(), /*grain=*/int64_t(1) << 15, [&](int64_t begin, int64_t end) {
      if (m.scalar_type() == at::kFloat)
        update_cpu(pp, gp, m.data_ptr<float>(), v.data_ptr<float>(), begin, end, decay, c);
      else
        update_cpu(pp, gp, m.data_ptr<c10::BFloat16>(), v.data_ptr<c10::BFloat16>(), begin, end, decay, c);
    });
  }
  if (!any_tensor_path) return;
  if (uses_fused_kernel(tensor_path)) return fused_step(tensor_path, lr, grad_scale, found_inf, device_scale);
  if (uses_own_kernel(tensor_path)) return own_step(tensor_path, c, found_inf, device_scale);
  MomentAccess access{exp_avg_, exp_avg_sq_};
  if (quantized()) {
    at::Device device = at::kCPU;
    for (const ParamShard& s : tensor_path)
      if (s.grad.defined()) device = s.param.device();
    access.am_all = &absmax_avg_;
    access.av_all = &absmax_avg_sq_;
    access.cm = &codebook_tensors(true, device);
    access.cv = &codebook_tensors(false, device);
    access.block = o.block;
  }
  auto decay_views = [&](size_t i) -> const std::vector<at::Tensor>& { return decay_views_of(i, tensor_path[i]); };
  for (const std::vector<Piece>& group : group_pieces(tensor_path, o.group_elems, access.block))
    if (!group.empty()) update_group(tensor_path, group, access, c, decay_views);
}

}  // namespace tessera::optim
