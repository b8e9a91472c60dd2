#include "runtime/planner/memory_formula.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/checkpoint/layout.h"
#include "runtime/comm/mpi_backend.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/fsdp/shard_plan.h"
#include "util/error.h"

namespace tessera::planner {

using namespace tessera::memory;  // the tracker's categories, placements and names

nlohmann::json PhaseEstimate::to_json() const {
  nlohmann::json j = {{"total", total()}, {"base", base}, {"untracked", untracked}, {"tracked", bytes.total()},
                      {"peak_at", bytes.phase}};
  for (int c = 0; c < kNumCategories; ++c)
    if (bytes.bytes[c] != 0) j[name(static_cast<Category>(c))] = bytes.bytes[c];
  j["placement"] = bytes.placement_json();
  return j;
}

int64_t Plan::peak_host() const {
  int64_t m = 0;
  for (const PhaseEstimate* p : {&load_reader, &load_other, &train_host, &save_host, &eval_host}) m = std::max(m, p->total());
  return m;
}
int64_t Plan::peak_gpu() const { return std::max(train_gpu.total(), eval_gpu.total()); }

namespace {

using C = Category;

// Which categories are host bytes (Where::Host, as the tracker places them): loading and
// checkpoint staging always; the shard state under host offload, and its parameter shard with params.
using Placement = std::array<bool, kNumCategories>;
Placement placement_of(const RunShape& run) {
  Placement host{};
  host[static_cast<int>(C::Loader)] = host[static_cast<int>(C::Checkpoint)] = true;
  if (run.offload != fsdp::Offload::None)
    for (C c : {C::Master, C::GradShard, C::Optimizer}) host[static_cast<int>(c)] = true;
  host[static_cast<int>(C::ParamShard)] = run.offload == fsdp::Offload::Params;
  return host;
}

// One moment of a phase: what is alive then.
struct Moment {
  Snapshot s;
  Placement host{};
  explicit Moment(const char* at, const Placement& where = {}) : host(where) { s.phase = at; }
  Moment& add(C c, int64_t b) {
    s.bytes[static_cast<int>(c)] += b;
    if (host[static_cast<int>(c)]) s.host_bytes[static_cast<int>(c)] += b;
    return *this;
  }
};

// Keeps the moment with the largest total, and those with the most device and the most host bytes.
struct Peak {
  Snapshot best, best_device, best_host;
  bool any = false;
  void offer(const Moment& m) {
    if (!any || m.s.total() > best.total()) best = m.s;
    if (!any || m.s.device_total() > best_device.device_total()) best_device = m.s;
    if (!any || m.s.host_total() > best_host.host_total()) best_host = m.s;
    any = true;
  }
};

// The device's or the host's part of a snapshot.
Snapshot device_part(Snapshot s) {
  for (int c = 0; c < kNumCategories; ++c) s.bytes[c] -= s.host_bytes[c];
  s.host_bytes = {};
  return s;
}
Snapshot host_part(Snapshot s) {
  s.bytes = s.host_bytes;
  return s;
}

struct Sizes {
  int S = 1, R = 1, L = 0;
  std::vector<int64_t> padded, chunk, numel;  // per unit
  int64_t sum_chunk = 0, sum_padded = 0, layer_padded = 0, layer_chunk = 0, layer_numel = 0;
  int64_t head_numel = 0, embed_numel = 0, max_numel = 0, max_chunk = 0, total = 0;
  // LoRA's frozen base, both groups (frozen, quantized): stored shard bytes (all units); gathered
  // elements of the root and of the largest layer; largest padded group and chunk (elements); the
  // quantized segments of the largest layer's gather, in bytes (decoded when it arrives).
  int64_t frozen_stored = 0, frozen_root = 0, frozen_layer = 0, frozen_max_padded = 0, frozen_max_chunk = 0;
  int64_t frozen_wire = 0, frozen_layer_stored = 0;  // and the largest layer's stored chunks, bytes
  // Gathered buffers of the root and of one (the largest) layer, both groups, in elements.
  int64_t gathered_root() const { return padded[0] + frozen_root; }
  int64_t gathered_layer() const { return layer_padded + frozen_layer; }
};

// The stored bytes of `n` elements at `bytes_per_element` (nf4: its block scales included), rounded up.
int64_t stored_bytes(double bytes_per_element, int64_t n) {
  return static_cast<int64_t>(std::ceil(bytes_per_element * static_cast<double>(n)));
}

void frozen_sizes(const ModelShape& model, const RunShape& run, Sizes& z) {
  for (size_t u = 0; u < std::max(model.frozen.size(), model.quantized.size()); ++u) {
    int64_t padded = 0, wire = 0, unit_stored = 0;
    for (const bool quantized : {false, true}) {
      const auto& groups = quantized ? model.quantized : model.frozen;
      if (u >= groups.size() || groups[u].empty()) continue;
      const int64_t align = quantized ? std::lcm(run.align, run.quantized_align) : run.align;
      const fsdp::ShardPlan plan = fsdp::ShardPlan::make(groups[u], z.S, align);
      const int64_t stored = stored_bytes(quantized ? run.quantized_bytes : run.frozen_bytes, plan.chunk);
      z.frozen_stored += stored;
      unit_stored += stored;
      if (quantized) wire = z.S * stored;
      padded += plan.padded_total;
      z.frozen_max_padded = std::max(z.frozen_max_padded, plan.padded_total);
      z.frozen_max_chunk = std::max(z.frozen_max_chunk, plan.chunk);
    }
    if (u == 0) z.frozen_root = padded;
    else z.frozen_layer = std::max(z.frozen_layer, padded), z.frozen_layer_stored = std::max(z.frozen_layer_stored, unit_stored);
    z.frozen_wire = std::max(z.frozen_wire, wire);
  }
}

Sizes sizes_of(const ModelShape& model, const RunShape& run) {
  TESSERA_CHECK_INPUT(!model.units.empty(), "memory model: no units");
  TESSERA_CHECK_INPUT(run.world >= 1 && run.ranks_per_node >= 1, "memory model: world and ranks per node must be >= 1");
  Sizes z;
  switch (run.strategy) {
    case fsdp::Strategy::FullShard:
    case fsdp::Strategy::ShardGradOp: z.S = run.world; z.R = 1; break;
    case fsdp::Strategy::NoShard: z.S = 1; z.R = run.world; break;
    case fsdp::Strategy::HybridShard:
      TESSERA_CHECK_INPUT(run.world % run.ranks_per_node == 0,
                          "hybrid_shard needs the same number of ranks on every node: " + std::to_string(run.world) +
                              " ranks do not split into nodes of " + std::to_string(run.ranks_per_node));
      z.S = run.ranks_per_node;
      z.R = run.world / run.ranks_per_node;
      break;
  }
  z.L = static_cast<int>(model.units.size()) - 1;
  for (size_t u = 0; u < model.units.size(); ++u) {
    const fsdp::ShardPlan plan = fsdp::ShardPlan::make(model.units[u], z.S, run.align);
    int64_t n = 0;
    for (const auto& prm : plan.params) n += prm.numel;
    z.padded.push_back(plan.padded_total);
    z.chunk.push_back(plan.chunk);
    z.numel.push_back(n);
    z.sum_chunk += plan.chunk;
    z.sum_padded += plan.padded_total;
    z.total += n;
    z.max_numel = std::max(z.max_numel, n);
    z.max_chunk = std::max(z.max_chunk, plan.chunk);
    if (u > 0) {
      z.layer_padded = std::max(z.layer_padded, plan.padded_total);
      z.layer_chunk = std::max(z.layer_chunk, plan.chunk);
      z.layer_numel = std::max(z.layer_numel, n);
    } else {
      for (size_t k = 0; k < plan.params.size(); ++k) {
        const bool head = k < model.root_param_in_head.size() && model.root_param_in_head[k];
        (head ? z.head_numel : z.embed_numel) += plan.params[k].numel;
      }
    }
  }
  frozen_sizes(model, run, z);
  return z;
}

// Evaluation frees each unit after its forward under these strategies; training where
// fsdp::regathers_for_backward says so (not over a shard group of one rank, unless offloaded or frozen).
bool reshards_after_forward(fsdp::Strategy strategy) {
  return strategy == fsdp::Strategy::FullShard || strategy == fsdp::Strategy::HybridShard;
}
bool regathers(const RunShape& run, const Sizes& z) {
  return fsdp::regathers_for_backward(run.strategy, z.S, run.offload, z.frozen_stored > 0);
}

// Decoder layers gathered while layer i runs forward (0-based; `frees`: units are freed after it)
// and while it runs backward.
int64_t layers_gathered_forward(const RunShape& run, const Sizes& z, int i, bool frees) {
  const bool next = run.prefetch && i + 1 < z.L;
  if (frees) return 1 + (next && run.limit_all_gathers >= 2 ? 1 : 0);
  return i + 1 + (next ? 1 : 0);
}
// The optimizer's state for `elems` shard elements: two moments of state_bytes each, and with
// 8-bit moments two fp32 absmax per block (the launcher aligns every shard to whole blocks).
int64_t optimizer_bytes(const RunShape& run, int64_t elems) {
  const int64_t blocks = run.state_block > 0 ? (elems + run.state_block - 1) / run.state_block : 0;
  return 2 * run.state_bytes * elems + 2 * 4 * blocks;
}

int64_t layers_gathered_backward(const RunShape& run, const Sizes& z, int i) {
  if (regathers(run, z)) return 1 + (run.prefetch && run.limit_all_gathers >= 2 && i > 0 ? 1 : 0);
  return i + 1;
}

// The parameter shard host offload keeps in the compute dtype (optimizer: on the device; params: on
// the host, none in fp32 where the master is that shard).
int64_t param_shard_bytes(const RunShape& run, const Sizes& z) {
  const int64_t frozen = z.frozen_stored;  // LoRA's base, stored
  if (run.offload == fsdp::Offload::Optimizer || (run.offload == fsdp::Offload::Params && run.param_bytes != 4))
    return frozen + run.param_bytes * z.sum_chunk;
  return frozen;
}
// The all-gather's input buffers while a layer gathers: none of the trainable group's (the master's
// cast, or under params offload its copy from the host, is written into this rank's slot of the
// gathered buffer and gathered in place; under optimizer offload the device's parameter shard is
// the input); LoRA's base: a quantized group's gathered segments until decoded, and under params
// offload the device copies of the stored chunks.
int64_t gather_input_bytes(const RunShape& run, const Sizes& z) {
  return z.frozen_wire + (run.offload == fsdp::Offload::Params ? z.frozen_layer_stored : 0);
}

// Host offload: a retiring reduction's chunk staged on the host (with one shard rank, from a device
// chunk in fp32).
void add_offload_staging(Moment& m, const RunShape& run, int64_t chunk, bool reduce_scatter) {
  if (run.offload == fsdp::Offload::None) return;
  if (reduce_scatter) m.add(C::GradShard, chunk * run.reduce_bytes);
  else m.add(C::UnsharedGrads, 4 * chunk).add(C::GradShard, 4 * chunk);
}

// The training step, every byte placed (the host's and the device's peaks may be different moments).
Peak train_step(const Sizes& z, const ActivationTerms& a, const RunShape& run) {
  const int64_t p = run.param_bytes, r = run.reduce_bytes, K = fsdp::kMaxReductionsInFlight;
  const bool ac = run.activation_checkpointing;
  const int64_t per_layer_saved = ac ? a.layer_input : a.layer_saved;
  const bool reduce_scatter = z.S > 1;
  // What every moment holds: the static shard state (the optimizer's from the first step on).
  // `layers_reduced`: the last micro-step's layer reductions are done, so with unsharded
  // accumulation only the root's accumulator is left.
  auto base = [&](const char* at, bool layers_reduced = false) {
    Moment m(at, placement_of(run));
    m.add(C::ParamShard, param_shard_bytes(run, z));
    // optim.in_backward with one micro-step: a unit's shard lives from its reduction to its update;
    // under offload the host optimizer thread updates one unit while the next is reduced (two).
    const bool one_grad = run.optimizer_in_backward && run.grad_accum == 1;
    const int64_t in_bwd_grads = run.offload != fsdp::Offload::None ? std::min(z.sum_chunk, z.max_chunk + z.layer_chunk) : z.max_chunk;
    m.add(C::Master, 4 * z.sum_chunk).add(C::GradShard, 4 * (one_grad ? in_bwd_grads : z.sum_chunk));
    m.add(C::Optimizer, optimizer_bytes(run, z.sum_chunk));
    if (run.accumulate_unsharded && run.grad_accum > 1 && reduce_scatter)
      m.add(C::UnsharedGrads, 4 * (layers_reduced ? z.padded[0] : z.sum_padded));
    return m;
  };
  // Reductions already in flight when layer i's gradient is reduced (issued by layers > i).
  auto in_flight = [&](int i) { return std::min<int64_t>(K, z.L - 1 - i); };
  // The host backend (MPI, runtime/comm/mpi_backend.cpp) reduces 16-bit floats in fp32: a widened
  // copy of the whole input (4 bytes per element) lives while it runs. NCCL reduces in place.
  const bool widen = !run.gpu && r != 4;
  // Unsharded accumulation (grad_accum > 1): a unit's fp32 accumulator, counted in base(), is the
  // reduction's input itself when the reduce dtype is fp32 (otherwise a cast copy of it).
  const bool flat_is_accum = run.accumulate_unsharded && run.grad_accum > 1 && r == 4;
  auto reductions = [&](Moment& m, int64_t n) {
    if (n > 0 || !reduce_scatter) add_offload_staging(m, run, z.layer_chunk, reduce_scatter);
    if (!reduce_scatter) return;
    if (!flat_is_accum) m.add(C::UnsharedGrads, n * z.layer_padded * r);
    m.add(C::CommBuffers, n * z.layer_chunk * r);
    if (widen && n > 0) m.add(C::CommBuffers, std::min(4 * z.layer_padded, comm::kHostWidenedReductionBytes));  // one at a time
    if (z.R > 1 && r != 4) m.add(C::CommBuffers, std::min<int64_t>(n, K) * z.layer_chunk * r);  // replica casts
  };
  const int64_t gather_cast = gather_input_bytes(run, z);
  Peak peak;
  // Forward.
  for (int i = 0; i < z.L; ++i) {
    Moment m = base("forward");
    m.add(C::GatheredParams, z.gathered_root() * p + layers_gathered_forward(run, z, i, regathers(run, z)) * z.gathered_layer() * p);
    m.add(C::CommBuffers, gather_cast);
    m.add(C::SavedTensors, i * per_layer_saved);
    if (ac) m.add(C::Activations, a.layer_input + a.layer_forward_transient + 2 * a.layer_input);
    else m.add(C::Activations, a.layer_saved + a.layer_forward_transient);
    peak.offer(m);
  }
  const int64_t gathered_for_backward =
      z.gathered_root() * p + (regathers(run, z) ? (run.prefetch ? 1 : 0) : z.L) * z.gathered_layer() * p;
  // Head and loss, then the head's backward.
  {
    Moment m = base("head and loss");
    m.add(C::GatheredParams, gathered_for_backward).add(C::SavedTensors, z.L * per_layer_saved + a.head_saved);
    m.add(C::Activations, a.head_forward_transient);
    peak.offer(m);
    Moment b = base("backward");
    b.add(C::GatheredParams, gathered_for_backward).add(C::SavedTensors, z.L * per_layer_saved + a.head_saved);
    // The head's parameter gradients are allocated once the logits' gradients are gone.
    b.add(C::Activations, a.head_backward_transient);
    peak.offer(b);
  }
  // Decoder layers' backward, last to first, each followed by its reduction.
  for (int i = z.L - 1; i >= 0; --i) {
    Moment m = base("backward");
    m.add(C::GatheredParams, z.gathered_root() * p + layers_gathered_backward(run, z, i) * z.gathered_layer() * p);
    m.add(C::SavedTensors, ac ? i * a.layer_input : (i + 1) * a.layer_saved);
    m.add(C::Activations, (ac ? a.layer_saved : 0) + a.layer_backward_transient + a.layer_input);
    m.add(C::UnsharedGrads, z.head_numel * p + z.layer_numel * p);
    if (regathers(run, z)) m.add(C::CommBuffers, z.frozen_wire);  // the re-gather's quantized segments
    reductions(m, in_flight(i));
    peak.offer(m);
    Moment red = base("layer reduction");
    const int64_t kept = regathers(run, z) ? (run.prefetch && run.limit_all_gathers >= 2 && i > 0 ? 1 : 0) : i;
    red.add(C::GatheredParams, z.gathered_root() * p + kept * z.gathered_layer() * p);
    red.add(C::SavedTensors, i * per_layer_saved).add(C::Activations, a.layer_input);
    red.add(C::UnsharedGrads, z.head_numel * p + z.layer_numel * p);
    reductions(red, in_flight(i) + 1);
    peak.offer(red);
  }
  // The embedding's backward completes the root's gradients; then the root is reduced.
  {
    Moment m = base("root reduction", /*layers_reduced=*/true);
    // The root's gradients move into its flat reduction buffer one by one (each freed once added):
    // at the reduction, the buffer and the backend's working copies.
    if (reduce_scatter) {
      if (!flat_is_accum) m.add(C::UnsharedGrads, z.padded[0] * r);
      m.add(C::CommBuffers, z.chunk[0] * r);
      if (widen) m.add(C::CommBuffers, std::min(4 * z.padded[0], comm::kHostWidenedReductionBytes));
    } else {
      m.add(C::UnsharedGrads, z.numel[0] * p);
    }
    add_offload_staging(m, run, z.chunk[0], reduce_scatter);
    if (z.R > 1 && r != 4) m.add(C::CommBuffers, z.chunk[0] * r);
    peak.offer(m);
  }
  peak.offer(base("optimizer"));
  return peak;
}

// Forward without gradients (evaluation, validation): masters, gathered units, one layer at work.
Peak eval_step(const Sizes& z, const ActivationTerms& a, const RunShape& run) {
  const int64_t p = run.param_bytes;
  const Placement where = placement_of(run);
  Peak peak;
  for (int i = 0; i < z.L; ++i) {
    Moment m("forward (no grad)", where);
    m.add(C::Master, 4 * z.sum_chunk).add(C::ParamShard, param_shard_bytes(run, z)).add(C::CommBuffers, gather_input_bytes(run, z));
    m.add(C::GatheredParams, z.gathered_root() * p + layers_gathered_forward(run, z, i, reshards_after_forward(run.strategy)) *
                                                         z.gathered_layer() * p);
    m.add(C::Activations, 3 * a.layer_input + a.layer_forward_transient);
    peak.offer(m);
  }
  Moment h("logits", where);
  h.add(C::Master, 4 * z.sum_chunk).add(C::ParamShard, param_shard_bytes(run, z)).add(C::GatheredParams, z.gathered_root() * p);
  h.add(C::Activations, a.layer_input + a.logits + (p == 4 ? 0 : 4 * a.logits / p));
  peak.offer(h);
  return peak;
}

// Host offload's PCIe bytes per optimizer step (memory_formula.h).
Pcie pcie_per_step(const Sizes& z, const RunShape& run) {
  Pcie t;
  if (run.offload == fsdp::Offload::None) return t;
  const int64_t p = run.param_bytes, r = run.reduce_bytes, M = run.grad_accum;
  if (z.S > 1) t.down = (run.accumulate_unsharded && M > 1 ? 1 : M) * z.sum_chunk * r;
  else t.down = M * z.sum_chunk * 4;
  if (z.R > 1) {
    t.up += z.sum_chunk * r;
    t.down += z.sum_chunk * r;
  }
  if (run.offload == fsdp::Offload::Optimizer) {
    t.up += z.sum_chunk * p;
  } else {
    const int64_t regathered = regathers(run, z) ? z.sum_chunk - z.chunk[0] : 0;
    t.up += M * (z.sum_chunk + regathered) * p;
  }
  return t;
}

PhaseEstimate host_phase(Snapshot s, int64_t untracked = kHostUntrackedBytes) {
  PhaseEstimate e;
  e.bytes = s;
  e.base = kHostBaseBytes;
  e.untracked = untracked;
  return e;
}

}  // namespace

Plan estimate(const ModelShape& model, const ActivationTerms& act, const RunShape& run) {
  const Sizes z = sizes_of(model, run);
  Plan plan;
  plan.shard_size = z.S;
  plan.replicate_size = z.R;
  plan.shard_elements = z.sum_chunk;
  plan.offload = run.offload;
  plan.pcie = pcie_per_step(z, run);
  const bool offload = run.offload != fsdp::Offload::None;
  const Placement where = placement_of(run);
  const int64_t state_kinds_bytes = 4 * z.sum_chunk + optimizer_bytes(run, z.sum_chunk);

  // Loading (host memory always: the loader moves host bytes, masters on a GPU go through a host
  // buffer of one unit's shard).
  Moment reader("load", where), other("load", where);
  const int64_t masters_on_host = run.gpu && !offload ? 2 * 4 * z.max_chunk : 4 * z.sum_chunk;
  reader.add(C::Master, masters_on_host);
  other.add(C::Master, masters_on_host);
  // LoRA's base: its stored shard, and an fp32 chunk per unit as it loads (the reader: a whole unit).
  const bool frozen_on_host = !run.gpu || run.offload == fsdp::Offload::Params;
  for (Moment* m : {&reader, &other})
    m->add(C::ParamShard, frozen_on_host ? z.frozen_stored : 0).add(C::Loader, 4 * z.frozen_max_chunk);
  if (run.load == LoadMode::Rank0 && z.frozen_max_padded > 0)
    reader.add(C::Loader, std::max<int64_t>(0, 4 * z.frozen_max_padded - 2 * z.max_numel * run.stored_bytes));
  switch (run.load) {
    case LoadMode::Rank0: reader.add(C::Loader, 2 * z.max_numel * run.stored_bytes); break;
    case LoadMode::Parallel: break;
    case LoadMode::Naive:
      reader.add(C::Loader, 4 * z.total);
      other.add(C::Loader, 4 * z.total);
      break;
  }
  plan.load_reader = host_phase(reader.s);
  plan.load_other = host_phase(other.s);

  // Saving: the host shard state (offload, CPU) is written as it is by a synchronous save.
  Moment save("save", where);
  if (!run.gpu || offload) {
    // optim.in_backward released every gradient shard at its update (between steps: none).
    const bool grads_kept = !run.optimizer_in_backward;
    save.add(C::Master, 4 * z.sum_chunk).add(C::GradShard, grads_kept ? 4 * z.sum_chunk : 0).add(C::Optimizer, optimizer_bytes(run, z.sum_chunk));
    if (run.offload == fsdp::Offload::Params) save.add(C::ParamShard, param_shard_bytes(run, z));
  }
  // A snapshot of every kind when asynchronous; a synchronous save streams a GPU's shards (and
  // widens bf16 moments) through one staging buffer of checkpoint::kStagingBytes.
  const bool staged = (run.gpu && !offload) || run.state_bytes == 2;
  if (run.checkpoint_async) save.add(C::Checkpoint, state_kinds_bytes);
  else if (staged) save.add(C::Checkpoint, checkpoint::kStagingBytes);
  plan.save_host = host_phase(save.s);

  const Peak train_peak = train_step(z, act, run), eval_peak = eval_step(z, act, run);
  const Snapshot& train = train_peak.best;
  const Snapshot& eval = eval_peak.best;
  {
    const int64_t p = run.param_bytes;
    const int64_t layers = regathers(run, z)
                               ? std::min<int64_t>(z.L, run.prefetch ? std::min(run.limit_all_gathers, 2) : 1)
                               : z.L;
    const int64_t gathered = z.gathered_root() * p + layers * z.gathered_layer() * p + z.frozen_stored;
    const auto at = [](const Snapshot& s, C c) { return s.bytes[static_cast<int>(c)]; };
    // Master and gradient shards; optim.in_backward holds no gradient shard beyond the unit being
    // reduced, whose full gradients the term after `gathered` already counts.
    const int64_t shards = (run.optimizer_in_backward ? 4 : 8) * z.sum_chunk;
    plan.train_floor = shards + optimizer_bytes(run, z.sum_chunk) + gathered + (z.numel[0] + z.layer_numel) * p +
                       at(train, C::SavedTensors) + at(train, C::Activations) +
                       // fsdp.accumulate = unsharded holds a full fp32 gradient by definition
                       (run.accumulate_unsharded && run.grad_accum > 1 && z.S > 1 ? 4 * z.sum_padded : 0);
    plan.eval_floor = 4 * z.sum_chunk + gathered + at(eval, C::Activations);
  }
  if (!run.gpu) {
    plan.train_host = host_phase(train);
    // The MPI backend's ring scratch buffers (malloc'd, kept and grown across calls, so untracked):
    // the shard group's reduce-scatter (the largest chunk, in fp32) and the replica group's
    // all-reduce (its share of that chunk).
    // Measured resident only where 16-bit reductions are widened (fp32 runs take paths that
    // leave the scratch untouched or small).
    if (run.reduce_bytes != 4) {
      int64_t max_chunk = 0;
      for (int64_t c : z.chunk) max_chunk = std::max(max_chunk, c);
      if (z.S > 1) plan.train_host.untracked += std::min(max_chunk * 4, comm::kHostWidenedReductionBytes / z.S);
      if (z.R > 1) plan.train_host.untracked += (max_chunk + z.R - 1) / z.R * 4;
    }
    plan.eval_host = host_phase(eval, kHostEvalUntrackedBytes);
    return plan;
  }
  // The host holds what offload placed there (its own peak moment), the GPU the rest.
  const auto host_of = [](const Peak& pk, const char* none) {
    return pk.best_host.host_total() > 0 ? host_part(pk.best_host) : Moment(none).s;
  };
  plan.train_host = host_phase(host_of(train_peak, "train"));
  plan.eval_host = host_phase(host_of(eval_peak, "eval"), kHostEvalUntrackedBytes);
  const int communicators = 1 + (z.S > 1 && z.R > 1 ? 2 : 0);  // world; hybrid adds intra and inter
  for (PhaseEstimate* e : {&plan.train_gpu, &plan.eval_gpu}) e->base = kCudaContextBytes + communicators * kNcclBytesPerCommunicator;
  plan.train_gpu.bytes = device_part(train_peak.best_device);
  plan.eval_gpu.bytes = device_part(eval_peak.best_device);
  return plan;
}

}  // namespace tessera::planner
