#include "runtime/planner/memory_formula.h"

#include <algorithm>

#include "runtime/comm/mpi_backend.h"
#include "runtime/error.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/fsdp/shard_plan.h"

namespace tessera::memory {

nlohmann::json PhaseEstimate::to_json() const {
  nlohmann::json j = {{"total", total()}, {"base", base}, {"untracked", untracked}, {"tracked", bytes.total()},
                      {"peak_at", bytes.phase}};
  for (int c = 0; c < kNumCategories; ++c)
    if (bytes.bytes[c] != 0) j[name(static_cast<Category>(c))] = bytes.bytes[c];
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

// One moment of a phase: what is alive then.
struct Moment {
  Snapshot s;
  explicit Moment(const char* at) { s.phase = at; }
  Moment& add(C c, int64_t b) {
    s.bytes[static_cast<int>(c)] += b;
    return *this;
  }
};

// Keeps the moment with the largest total.
struct Peak {
  Snapshot best;
  bool any = false;
  void offer(const Moment& m) {
    if (!any || m.s.total() > best.total()) best = m.s;
    any = true;
  }
};

struct Sizes {
  int S = 1, R = 1, L = 0;
  std::vector<int64_t> padded, chunk, numel;  // per unit
  int64_t sum_chunk = 0, sum_padded = 0, layer_padded = 0, layer_chunk = 0, layer_numel = 0;
  int64_t head_numel = 0, embed_numel = 0, max_numel = 0, max_chunk = 0, total = 0;
};

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
  return z;
}

bool reshards_after_forward(fsdp::Strategy strategy) {
  return strategy == fsdp::Strategy::FullShard || strategy == fsdp::Strategy::HybridShard;
}

// Decoder layers gathered while layer i runs forward (0-based) and while it runs backward.
int64_t layers_gathered_forward(const RunShape& run, const Sizes& z, int i) {
  const bool next = run.prefetch && i + 1 < z.L;
  if (reshards_after_forward(run.strategy)) return 1 + (next && run.limit_all_gathers >= 2 ? 1 : 0);
  return i + 1 + (next ? 1 : 0);
}
// The optimizer's state for `elems` shard elements: two moments of state_bytes each, and with
// 8-bit moments two fp32 absmax per block (the launcher aligns every shard to whole blocks).
int64_t optimizer_bytes(const RunShape& run, int64_t elems) {
  const int64_t blocks = run.state_block > 0 ? (elems + run.state_block - 1) / run.state_block : 0;
  return 2 * run.state_bytes * elems + 2 * 4 * blocks;
}

int64_t layers_gathered_backward(const RunShape& run, const Sizes& z, int i) {
  if (reshards_after_forward(run.strategy)) return 1 + (run.prefetch && run.limit_all_gathers >= 2 && i > 0 ? 1 : 0);
  return i + 1;
}

// The training step on the memory that holds the shards (the host on CPU, the GPU otherwise).
Snapshot train_step(const Sizes& z, const ActivationTerms& a, const RunShape& run) {
  const int64_t p = run.param_bytes, r = run.reduce_bytes, K = fsdp::kMaxReductionsInFlight;
  const bool ac = run.activation_checkpointing;
  const int64_t per_layer_saved = ac ? a.layer_input : a.layer_saved;
  const bool reduce_scatter = z.S > 1;
  // What every moment holds: the static shard state (the optimizer's from the first step on).
  // `layers_reduced`: the last micro-step's layer reductions are done, so with unsharded
  // accumulation only the root's accumulator is left.
  auto base = [&](const char* at, bool layers_reduced = false) {
    Moment m(at);
    // optim.in_backward with one micro-step: a unit's shard lives from its reduction to its update.
    const bool one_grad = run.optimizer_in_backward && run.grad_accum == 1;
    m.add(C::Master, 4 * z.sum_chunk).add(C::GradShard, 4 * (one_grad ? z.max_chunk : z.sum_chunk));
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
    if (!reduce_scatter) return;
    if (!flat_is_accum) m.add(C::UnsharedGrads, n * z.layer_padded * r);
    m.add(C::CommBuffers, n * z.layer_chunk * r);
    if (widen && n > 0) m.add(C::CommBuffers, std::min(4 * z.layer_padded, comm::kHostWidenedReductionBytes));  // one at a time
    if (z.R > 1 && r != 4) m.add(C::CommBuffers, std::min<int64_t>(n, K) * z.layer_chunk * r);  // replica casts
  };
  const int64_t gather_cast = p == 4 ? 0 : z.layer_chunk * p;  // master cast while a layer gathers
  Peak peak;
  // Forward.
  for (int i = 0; i < z.L; ++i) {
    Moment m = base("forward");
    m.add(C::GatheredParams, z.padded[0] * p + layers_gathered_forward(run, z, i) * z.layer_padded * p);
    m.add(C::CommBuffers, gather_cast);
    m.add(C::SavedTensors, i * per_layer_saved);
    if (ac) m.add(C::Activations, a.layer_input + a.layer_forward_transient + 2 * a.layer_input);
    else m.add(C::Activations, a.layer_saved + a.layer_forward_transient);
    peak.offer(m);
  }
  const int64_t gathered_for_backward =
      z.padded[0] * p + (reshards_after_forward(run.strategy) ? (run.prefetch ? 1 : 0) : z.L) * z.layer_padded * p;
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
    m.add(C::GatheredParams, z.padded[0] * p + layers_gathered_backward(run, z, i) * z.layer_padded * p);
    m.add(C::SavedTensors, ac ? i * a.layer_input : (i + 1) * a.layer_saved);
    m.add(C::Activations, (ac ? a.layer_saved : 0) + a.layer_backward_transient + a.layer_input);
    m.add(C::UnsharedGrads, z.head_numel * p + z.layer_numel * p);
    reductions(m, in_flight(i));
    peak.offer(m);
    Moment red = base("layer reduction");
    const int64_t kept = reshards_after_forward(run.strategy) ? (run.prefetch && run.limit_all_gathers >= 2 && i > 0 ? 1 : 0) : i;
    red.add(C::GatheredParams, z.padded[0] * p + kept * z.layer_padded * p);
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
    if (z.R > 1 && r != 4) m.add(C::CommBuffers, z.chunk[0] * r);
    peak.offer(m);
  }
  peak.offer(base("optimizer"));
  return peak.best;
}

// Forward without gradients (evaluation, validation): masters, gathered units, one layer at work.
Snapshot eval_step(const Sizes& z, const ActivationTerms& a, const RunShape& run) {
  const int64_t p = run.param_bytes;
  Peak peak;
  for (int i = 0; i < z.L; ++i) {
    Moment m("forward (no grad)");
    m.add(C::Master, 4 * z.sum_chunk);
    m.add(C::GatheredParams, z.padded[0] * p + layers_gathered_forward(run, z, i) * z.layer_padded * p);
    m.add(C::Activations, 3 * a.layer_input + a.layer_forward_transient);
    peak.offer(m);
  }
  Moment h("logits");
  h.add(C::Master, 4 * z.sum_chunk).add(C::GatheredParams, z.padded[0] * p);
  h.add(C::Activations, a.layer_input + a.logits + (p == 4 ? 0 : 4 * a.logits / p));
  peak.offer(h);
  return peak.best;
}

PhaseEstimate host_phase(Snapshot s) {
  PhaseEstimate e;
  e.bytes = s;
  e.base = kHostBaseBytes;
  e.untracked = kHostUntrackedBytes;
  return e;
}

}  // namespace

Plan estimate(const ModelShape& model, const ActivationTerms& act, const RunShape& run) {
  const Sizes z = sizes_of(model, run);
  Plan plan;
  plan.shard_size = z.S;
  plan.replicate_size = z.R;
  plan.shard_elements = z.sum_chunk;
  const int64_t state_kinds_bytes = 4 * z.sum_chunk + optimizer_bytes(run, z.sum_chunk);

  // Loading (host memory always: the loader moves host bytes, masters on a GPU go through a host
  // buffer of one unit's shard).
  Moment reader("load"), other("load");
  const int64_t masters_on_host = run.gpu ? 2 * 4 * z.max_chunk : 4 * z.sum_chunk;
  reader.add(C::Master, masters_on_host);
  other.add(C::Master, masters_on_host);
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

  // Saving: a host snapshot of every kind when asynchronous or when the shards are on a GPU.
  Moment save("save");
  if (!run.gpu) save.add(C::Master, 4 * z.sum_chunk).add(C::GradShard, 4 * z.sum_chunk).add(C::Optimizer, optimizer_bytes(run, z.sum_chunk));
  if (run.checkpoint_async || run.gpu) save.add(C::Checkpoint, state_kinds_bytes);
  plan.save_host = host_phase(save.s);

  const Snapshot train = train_step(z, act, run);
  const Snapshot eval = eval_step(z, act, run);
  {
    const int64_t p = run.param_bytes;
    const int64_t layers = reshards_after_forward(run.strategy)
                               ? std::min<int64_t>(z.L, run.prefetch ? std::min(run.limit_all_gathers, 2) : 1)
                               : z.L;
    const int64_t gathered = z.padded[0] * p + layers * z.layer_padded * p;
    const auto at = [](const Snapshot& s, C c) { return s.bytes[static_cast<int>(c)]; };
    plan.train_floor = 8 * z.sum_chunk + optimizer_bytes(run, z.sum_chunk) + gathered + (z.numel[0] + z.layer_numel) * p +
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
    plan.eval_host = host_phase(eval);
    return plan;
  }
  plan.train_host = host_phase(Moment("train").s);
  plan.eval_host = host_phase(Moment("eval").s);
  const int communicators = 1 + (z.S > 1 && z.R > 1 ? 2 : 0);  // world; hybrid adds intra and inter
  for (PhaseEstimate* e : {&plan.train_gpu, &plan.eval_gpu}) e->base = kCudaContextBytes + communicators * kNcclBytesPerCommunicator;
  plan.train_gpu.bytes = train;
  plan.eval_gpu.bytes = eval;
  return plan;
}

}  // namespace tessera::memory
