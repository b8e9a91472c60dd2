#include "runtime/fsdp/fsdp.h"

#include <c10/core/DeviceGuard.h>
#include <torch/torch.h>

#include <deque>
#include <numeric>
#include <functional>
#include <optional>

#include "runtime/device/device.h"
#include "runtime/fsdp/names.h"
#include "runtime/memory/tracker.h"
#include "runtime/profile/op_count.h"
#include "runtime/profile/phase.h"
#include "util/dtype_names.h"
#include "util/error.h"
#include "util/parse_named.h"

namespace tessera::fsdp {

Strategy parse_strategy(const std::string& s) {
  return util::parse_named<Strategy>(strategy_names(), s, "fsdp.strategy");
}
std::string to_string(Strategy s) { return strategy_names().at(static_cast<size_t>(s)); }
bool regathers_for_backward(Strategy s, int shard_size, Offload offload, bool frozen_groups) {
  if (s != Strategy::FullShard && s != Strategy::HybridShard) return false;
  return shard_size > 1 || offload != Offload::None || frozen_groups;
}
at::ScalarType scalar_type(util::FloatType t) {
  return t == util::FloatType::F32 ? at::kFloat : t == util::FloatType::BF16 ? at::kBFloat16 : at::kHalf;
}
at::ScalarType parse_dtype(const std::string& s) {  // the one table of names: util/dtype_names.h
  if (const auto t = util::float_type_named(s)) return scalar_type(*t);
  throw TESSERA_INPUT_ERROR("dtype '" + s + "' is not one of " + util::join_names(util::float_type_names()));
}

Accumulate parse_accumulate(const std::string& s) {
  return util::parse_named<Accumulate>(accumulate_names(), s, "fsdp.accumulate");
}
std::string to_string(Accumulate a) { return accumulate_names().at(static_cast<size_t>(a)); }
namespace {
// Plain elements of one dtype: encode and decode are casts.
class DtypeStorage final : public FrozenStorage {
 public:
  explicit DtypeStorage(at::ScalarType t) : dtype_(t) {}
  std::string name() const override {
    return util::short_name(dtype_ == at::kFloat ? util::FloatType::F32 : dtype_ == at::kBFloat16 ? util::FloatType::BF16 : util::FloatType::F16);
  }
  at::ScalarType stored_dtype() const override { return dtype_; }
  int64_t stored_numel(int64_t count) const override { return count; }
  void encode(const at::Tensor& fp32_values, at::Tensor& out) const override { out.copy_(fp32_values); }
  void decode(const at::Tensor& stored, const at::Tensor& dst) const override { dst.copy_(stored); }

 private:
  at::ScalarType dtype_;
};
}  // namespace

std::shared_ptr<const FrozenStorage> dtype_storage(at::ScalarType dtype) {
  return std::make_shared<DtypeStorage>(dtype);
}

Offload parse_offload(const std::string& s) { return util::parse_named<Offload>(offload_names(), s, "fsdp.offload"); }
std::string to_string(Offload o) { return offload_names().at(static_cast<size_t>(o)); }

namespace {

enum class GatherState { Free, Gathering, Gathered };

// One unit's gradient on its way into the fp32 shard (see the header: reductions).
struct Reduction {
  int unit = 0;
  bool final = false;   // last micro-step of the optimizer step: all-reduce across replicas after
  comm::WorkPtr work;   // the reduce-scatter, or the replica all-reduce
  at::Tensor flat;      // reduce-scatter input: the unit's full-size gradient (reduce dtype)
  at::Tensor out;       // this rank's chunk (reduce dtype), or the all-reduce buffer
};

// dst += src * scale (flat tensors of equal numel). LibTorch's CPU kernels widen an input of
// another dtype into a whole temporary copy first, so mixed dtypes go in blocks: the temporary
// never exceeds kWidenBlock elements.
constexpr int64_t kWidenBlock = int64_t(1) << 20;
void add_scaled(const at::Tensor& dst, const at::Tensor& src, double scale) {
  const int64_t n = dst.numel();
  const int64_t block = dst.scalar_type() == src.scalar_type() || !dst.is_cpu() ? n : kWidenBlock;
  for (int64_t b = 0; b < n; b += block) {
    const int64_t len = std::min(block, n - b);
    at::Tensor d = dst.narrow(0, b, len), s = src.narrow(0, b, len);
    if (scale == 1.0) d.add_(s);
    else d.add_(s, scale);
  }
}

// dst = src * scale: what add_scaled gives on a zero dst, bit for bit but a zero's sign (the product
// rounded once, in dst's dtype), without the zeroing pass and the read of dst.
void copy_scaled(const at::Tensor& dst, const at::Tensor& src, double scale) {
  dst.copy_(src);
  if (scale != 1.0) dst.mul_(scale);
}

// dst[slot] += grads[k] (scaled) for every defined gradient, each freed once added. `fresh`: dst
// holds nothing yet (its old bytes are garbage): the gradients are copied, and every element no
// gradient covers (padding, gaps, unused parameters) is zeroed, so dst is whole without a zeroing pass.
void add_into(at::Tensor& dst, const ShardPlan& plan, std::vector<at::Tensor>& grads, double scale, bool fresh = false) {
  int64_t written = 0;  // fresh: dst is written up to here (the plan's offsets increase with k)
  for (size_t k = 0; k < grads.size(); ++k) {
    if (!grads[k].defined()) continue;
    const ParamSlot& p = plan.params[k];
    at::Tensor slot = dst.narrow(0, p.offset, p.numel);
    if (fresh) {
      if (p.offset > written) dst.narrow(0, written, p.offset - written).zero_();
      copy_scaled(slot, grads[k].reshape(-1), scale);
      written = p.offset + p.numel;
    } else {
      add_scaled(slot, grads[k].reshape(-1), scale);
    }
    grads[k] = at::Tensor();
  }
  if (fresh && dst.numel() > written) dst.narrow(0, written, dst.numel() - written).zero_();
}

}  // namespace

struct Engine::Impl {
  // One frozen group of a unit, as gathered: the model's tensors are views of `full` (compute dtype,
  // storage freed when the unit is Free).
  struct FrozenGather {
    FrozenShard* shard = nullptr;  // into Impl::frozen
    std::vector<at::Tensor> params;
    at::Tensor full;
    int64_t full_bytes = 0;
    comm::WorkPtr work;
    at::Tensor input;  // the gather's input while gathering (a device copy under offload=params)
    at::Tensor wire;   // gathered stored segments, when the storage is not the compute dtype
  };
  struct Unit {
    UnitShard* shard = nullptr;  // into Impl::shards
    std::vector<at::Tensor> params;  // the model's parameter tensors (now views of `full`)
    at::Tensor full;                 // gathered flat buffer, param dtype, storage freed when Free
    int64_t full_bytes = 0;
    GatherState state = GatherState::Free;
    comm::WorkPtr gather_work;
    at::Tensor gather_input;  // master cast to param dtype, alive while gathering
    at::Tensor accum;         // unsharded accumulation: fp32 full-size gradient of earlier micro-steps
    // Host offload: the compute-dtype parameter shard (optimizer: on the device; params: on the
    // host), made again from the master before the next gather when `stale`.
    at::Tensor param_shard;
    bool stale = true;
    std::vector<FrozenGather> frozen;  // its frozen groups (fsdp.h: frozen parameters), 0 to 2
    // The gradient shard holds nothing of this step yet (zero_grad): the first gradient is copied
    // into it, not added, and a reader before that sees it zeroed (settle_grads).
    bool grad_fresh = true;
  };

  Options opts;
  LayerFn layer_fn;
  comm::CommPtr shard_comm, replicate_comm;
  int dp_size = 1;  // data-parallel ranks = shard * replicate
  std::vector<UnitShard> shards;  // what the optimizer and checkpoints see
  std::vector<FrozenShard> frozen;  // the frozen groups with parameters (Engine::frozen_shards)
  // Makes every layer's autograd function run backward even when its input needs no gradient (the
  // first layer after a frozen embedding): a leaf that needs one, whose gradient is never made.
  at::Tensor anchor = at::zeros({}, at::TensorOptions().dtype(at::kFloat)).requires_grad_(true);
  std::vector<Unit> units;
  std::deque<Reduction> reducing;     // reduce-scatters in flight, issue order
  std::deque<Reduction> replicating;  // replica all-reduces in flight, issue order
  bool sync = true;
  std::function<void(int)> grad_ready;  // Engine::on_grad_ready
  MemoryStats mem;
  Traffic traffic;  // host offload's copies

  bool offloaded() const { return opts.offload != Offload::None; }
  memory::Where state_where() const { return offloaded() ? memory::Where::Host : memory::Where::Device; }
  // fp32 shard state where Options::offload puts it: the device, or host memory (pinned for a GPU).
  at::Tensor state_zeros(int64_t n) const {
    if (!offloaded()) return at::zeros({n}, at::TensorOptions().dtype(at::kFloat).device(opts.device));
    return device::host_buffer({n}, at::kFloat, opts.device).zero_();
  }
  // Zero the gradient shards that zero_grad left fresh, before anyone outside reads them.
  void settle_grads() {
    for (Unit& u : units)
      if (u.grad_fresh && u.shard->grad.defined()) {
        u.shard->grad.zero_();
        u.grad_fresh = false;
      }
  }
  // The gradient shard += src (the whole chunk), or = src on the step's first gradient.
  void write_grad(Unit& u, const at::Tensor& src) {
    if (u.grad_fresh) copy_scaled(grad_shard(u), src, 1.0);
    else add_scaled(grad_shard(u), src, 1.0);
    u.grad_fresh = false;
  }
  void mark_stale() {
    for (Unit& u : units) u.stale = true;
  }

  // Evaluation's forward frees each unit after it under these two strategies; training's, where
  // regathers_for_backward (fsdp.h) says so.
  bool reshard_after_forward() const {
    return opts.strategy == Strategy::FullShard || opts.strategy == Strategy::HybridShard;
  }
  bool regathers() const {
    return regathers_for_backward(opts.strategy, shard_comm->size(), opts.offload, !frozen.empty());
  }

  // ---- storage of the gathered buffers -----------------------------------------------------
  static void free_storage(const at::Tensor& full) {
    auto* impl = full.storage().unsafeGetStorageImpl();
    impl->set_data_ptr_noswap(at::DataPtr(nullptr, full.device()));
    impl->set_nbytes(0);
  }
  static void alloc_storage(const at::Tensor& full, int64_t bytes) {
    // The storage's allocator (CUDA: the caching allocator) allocates on the current device.
    c10::OptionalDeviceGuard guard;
    if (!full.device().is_cpu()) guard.reset_device(full.device());
    memory::Scope scope(memory::Category::GatheredParams);
    auto* impl = full.storage().unsafeGetStorageImpl();
    impl->set_data_ptr_noswap(impl->allocator()->allocate(bytes));
    impl->set_nbytes(bytes);
  }
  void free_storage(Unit& u) {
    free_storage(u.full);
    for (FrozenGather& g : u.frozen) free_storage(g.full);
  }
  int64_t gathered_bytes(const Unit& u) const {
    int64_t n = u.full_bytes;
    for (const FrozenGather& g : u.frozen) n += g.full_bytes;
    return n;
  }
  bool identity(const FrozenStorage& st) const { return st.stored_dtype() == opts.param_dtype && st.stored_numel(1) == 1; }

  // A frozen group's all-gather, issued beside the trainable one: straight into the gathered buffer
  // when stored in the compute dtype, else into `wire` (decoded by frozen_wait).
  void gather_frozen_async(FrozenGather& g) {
    alloc_storage(g.full, g.full_bytes);
    g.input = g.shard->stored;
    if (opts.offload == Offload::Params) {  // the host's stored chunk, copied up for the gather
      memory::Scope scope(memory::Category::CommBuffers);
      g.input = at::empty_like(g.shard->stored, g.shard->stored.options().device(opts.device));
      g.input.copy_(g.shard->stored, /*non_blocking=*/true);
      traffic.up += g.input.nbytes();
    }
    at::Tensor out = g.full;
    if (!identity(*g.shard->storage)) {
      memory::Scope scope(memory::Category::CommBuffers);
      out = g.wire = at::empty({g.input.numel() * shard_comm->size()}, g.input.options());
    }
    g.work = shard_comm->all_gather_into(out, g.input);
  }
  void frozen_wait(Unit& u) {
    for (FrozenGather& g : u.frozen) {
      if (!g.work) continue;
      g.work->wait();
      g.work.reset();
      g.input = at::Tensor();
      if (!g.wire.defined()) continue;
      const int64_t chunk = g.shard->plan.chunk, seg = g.wire.numel() / shard_comm->size();
      for (int r = 0; r < shard_comm->size(); ++r)
        g.shard->storage->decode(g.wire.narrow(0, r * seg, seg), g.full.narrow(0, r * chunk, chunk));
      g.wire = at::Tensor();
    }
  }

  bool is_layer(int ui) const { return ui > 0; }
  // The generator a layer's random operators draw from (Options::preserve_rng).
  at::Generator rng() const { return at::globalContext().defaultGenerator(opts.device); }

  // A frozen group of a unit being built (its parameters `tensors`, stored as `st`): its plan
  // (aligned for the storage too), this rank's stored chunk (zero), the gathered buffer the model's
  // tensors become views of. Impl::frozen has room reserved (the pointers into it stay valid).
  void make_frozen(Unit& u, int ui, const std::string& name, std::vector<std::pair<std::string, at::Tensor>>& tensors,
                   std::shared_ptr<const FrozenStorage> st, int W, int r) {
    if (tensors.empty()) return;
    TESSERA_CHECK(st != nullptr, "fsdp: unit " + name + " has quantized parameters but Options::quantized_storage is not set");
    FrozenShard& fz = frozen.emplace_back();
    fz.name = name;
    fz.unit = ui;
    fz.shard_rank = r;
    fz.storage = std::move(st);
    std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
    for (auto& [n, p] : tensors) shapes.emplace_back(n, p.sizes().vec());
    fz.plan = ShardPlan::make(shapes, W, std::lcm(opts.align, fz.storage->align()));
    {
      memory::Scope scope(memory::Category::ParamShard, opts.offload == Offload::Params ? memory::Where::Host : memory::Where::Device);
      const int64_t n = fz.storage->stored_numel(fz.plan.chunk);
      const at::ScalarType dt = fz.storage->stored_dtype();
      fz.stored = opts.offload == Offload::Params ? device::host_buffer({n}, dt, opts.device).zero_()
                                                  : at::zeros({n}, at::TensorOptions().dtype(dt).device(opts.device));
    }
    FrozenGather& g = u.frozen.emplace_back();
    g.shard = &fz;
    g.full = at::empty({fz.plan.padded_total}, at::TensorOptions().dtype(opts.param_dtype).device(opts.device));
    g.full_bytes = fz.plan.padded_total * g.full.element_size();
    view_params(g.full, fz.plan, tensors, g.params);
  }
  // The model's tensors become views of the flat buffer `full` laid out by `plan`.
  static void view_params(const at::Tensor& full, const ShardPlan& plan,
                          std::vector<std::pair<std::string, at::Tensor>>& params, std::vector<at::Tensor>& out) {
    for (size_t k = 0; k < params.size(); ++k) {
      at::Tensor& p = params[k].second;
      const auto& slot = plan.params[k];
      // Tensor::set_data refuses a meta -> CPU/CUDA swap; the metadata copy it performs is done
      // directly (storage, sizes, strides, offset, device), keeping the parameter's autograd meta.
      at::Tensor view = full.narrow(0, slot.offset, slot.numel).view(slot.shape);
      p.unsafeGetTensorImpl()->shallow_copy_from(view.getIntrusivePtr());
      out.push_back(p);
    }
  }

  // ---- host offload ------------------------------------------------------------------------
  // The all-gather's input under offload: the device's parameter shard (optimizer), or the host's
  // copied up into a device buffer that lives while the gather runs (params).
  at::Tensor offloaded_gather_input(Unit& u) {
    if (u.stale) refresh_param_shard(u);
    if (opts.offload == Offload::Optimizer) return u.param_shard;
    at::Tensor in = own_slot(u);  // copied up straight into the gathered buffer
    in.copy_(u.param_shard, /*non_blocking=*/true);
    traffic.up += in.nbytes();
    return in;
  }
  // This rank's chunk of unit u's gathered buffer (allocated): the all-gather's input when the
  // shard is written there first, gathered in place -- no temporary, and at world size 1 no copy.
  at::Tensor own_slot(Unit& u) {
    const int64_t chunk = u.shard->plan.chunk;
    return u.full.narrow(0, shard_comm->rank() * chunk, chunk);
  }
  // The parameter shard made again from the (host) master: cast on the host, then copied up
  // (optimizer); params keeps it on the host (the master itself in fp32).
  void refresh_param_shard(Unit& u) {
    const at::Tensor& master = u.shard->master;
    const int64_t n = u.shard->plan.chunk;
    const bool device_side = opts.offload == Offload::Optimizer;
    if (!u.param_shard.defined()) {
      memory::Scope scope(memory::Category::ParamShard, device_side ? memory::Where::Device : memory::Where::Host);
      const auto dev = at::TensorOptions().dtype(opts.param_dtype).device(opts.device);
      if (device_side) u.param_shard = at::empty({n}, dev);
      else if (opts.param_dtype != at::kFloat) u.param_shard = device::host_buffer({n}, opts.param_dtype, opts.device);
    }
    if (!device_side && opts.param_dtype == at::kFloat) {
      u.param_shard = master;  // the host's fp32 shard is the master
    } else if (!device_side) {
      u.param_shard.copy_(master);  // the cast, on the host
    } else {
      at::Tensor cast;
      {
        memory::Scope scope(memory::Category::ParamShard, memory::Where::Host);
        cast = master.scalar_type() == opts.param_dtype ? master : master.to(opts.param_dtype);
      }
      u.param_shard.copy_(cast);
      traffic.up += u.param_shard.nbytes();
    }
    u.stale = false;
  }
  // A reduced gradient chunk on the device (any dtype) into the host gradient shard: copied down
  // into a host staging buffer, then added there.
  void add_down(Unit& u, const at::Tensor& chunk) {
    at::Tensor staged;
    {
      memory::Scope scope(memory::Category::GradShard, memory::Where::Host);
      staged = device::host_buffer({chunk.numel()}, chunk.scalar_type(), opts.device);
    }
    staged.copy_(chunk);
    traffic.down += staged.nbytes();
    write_grad(u, staged);
  }

  void gather_async(int ui) {
    Unit& u = units[ui];
    if (u.state != GatherState::Free) return;
    alloc_storage(u.full, u.full_bytes);
    for (FrozenGather& g : u.frozen) gather_frozen_async(g);
    if (offloaded()) {
      u.gather_input = offloaded_gather_input(u);
    } else if (u.shard->master.scalar_type() == opts.param_dtype) {
      u.gather_input = u.shard->master;  // fp32: the master itself
    } else {
      u.gather_input = own_slot(u);  // the master's cast, into this rank's slot
      u.gather_input.copy_(u.shard->master);
    }
    u.gather_work = shard_comm->all_gather_into(u.full, u.gather_input);
    u.state = GatherState::Gathering;
    mem.gathered_bytes_now += gathered_bytes(u);
    mem.gathered_bytes_peak = std::max(mem.gathered_bytes_peak, mem.gathered_bytes_now);
    if (is_layer(ui)) {
      ++mem.gathered_layers_now;
      mem.gathered_layers_peak = std::max(mem.gathered_layers_peak, mem.gathered_layers_now);
    }
  }

  void wait_gathered(int ui) {
    Unit& u = units[ui];
    if (u.state == GatherState::Free) gather_async(ui);
    if (u.state == GatherState::Gathering) {
      {
        profile::Phase waiting(profile::Part::GatherWait);
        u.gather_work->wait();
        frozen_wait(u);
      }
      u.gather_work.reset();
      u.gather_input = at::Tensor();
      u.state = GatherState::Gathered;
    }
  }

  void reshard(int ui) {
    Unit& u = units[ui];
    if (u.state == GatherState::Free) return;
    if (u.state == GatherState::Gathering) {
      profile::Phase waiting(profile::Part::GatherWait);
      u.gather_work->wait();
      u.gather_work.reset();
      u.gather_input = at::Tensor();
      frozen_wait(u);
    }
    free_storage(u);
    u.state = GatherState::Free;
    mem.gathered_bytes_now -= gathered_bytes(u);
    if (is_layer(ui)) --mem.gathered_layers_now;
  }

  // Prefetch another layer unit if the in-flight limit allows it (the limit holds where units are
  // freed after forward: in training's forward, or evaluation's).
  void prefetch(int ui, bool training) {
    if (!opts.prefetch || ui < 1 || ui >= static_cast<int>(units.size())) return;
    if (units[ui].state != GatherState::Free) return;
    if ((training ? regathers() : reshard_after_forward()) && mem.gathered_layers_now >= opts.limit_all_gathers) return;
    gather_async(ui);
  }

  // ---- gradients ---------------------------------------------------------------------------
  // A fresh shard is made uninitialised: its first write covers all of it (write_grad, add_into).
  at::Tensor& grad_shard(Unit& u) {
    if (!u.shard->grad.defined()) {
      memory::Scope scope(memory::Category::GradShard, state_where());
      const int64_t n = u.shard->plan.chunk;
      if (!u.grad_fresh) u.shard->grad = state_zeros(n);
      else if (offloaded()) u.shard->grad = device::host_buffer({n}, at::kFloat, opts.device);
      else u.shard->grad = at::empty({n}, at::TensorOptions().dtype(at::kFloat).device(opts.device));
    }
    return u.shard->grad;
  }

  // grads[k] is the gradient of units[ui].params[k] (undefined if unused); see the header.
  void accumulate_grads(int ui, std::vector<at::Tensor> grads) {
    retire_completed();
    Unit& u = units[ui];
    const ShardPlan& plan = u.shard->plan;
    for (const auto& g : grads) memory::retag(g, memory::Category::UnsharedGrads);
    const double scale = 1.0 / static_cast<double>(dp_size);
    if (shard_comm->size() == 1) {
      // The shard is the whole unit (no_shard, or one rank): add straight into the gradient (with
      // offload: into a device chunk, then down into the host's).
      if (offloaded()) {
        memory::Scope scope(memory::Category::UnsharedGrads);
        at::Tensor chunk = at::empty({plan.chunk}, at::TensorOptions().dtype(at::kFloat).device(opts.device));
        add_into(chunk, plan, grads, scale, /*fresh=*/true);
        add_down(u, chunk);
      } else {
        add_into(grad_shard(u), plan, grads, scale, u.grad_fresh);
        u.grad_fresh = false;
      }
      if (sync) final_grad(ui);
      return;
    }
    memory::Scope scope(memory::Category::UnsharedGrads);
    const auto reduce_opts = u.shard->master.options().dtype(opts.reduce_dtype);
    at::Tensor flat;
    if (opts.accumulate == Accumulate::Unsharded) {
      const bool first = !u.accum.defined();
      if (first) u.accum = at::empty({plan.padded_total}, u.shard->master.options());
      add_into(u.accum, plan, grads, 1.0, first);
      if (!sync) return;
      flat = u.accum.scalar_type() == opts.reduce_dtype ? u.accum : u.accum.to(opts.reduce_dtype);
      u.accum = at::Tensor();
      // Average over every data-parallel rank; dividing before the sum keeps fp16/bf16 in range.
      flat.div_(static_cast<double>(dp_size));
    } else {
      flat = at::empty({plan.padded_total}, reduce_opts);
      add_into(flat, plan, grads, scale, /*fresh=*/true);
    }
    Reduction r;
    r.unit = ui;
    r.final = sync;
    r.flat = flat;
    {
      memory::Scope comm_scope(memory::Category::CommBuffers);
      r.out = at::empty({plan.chunk}, reduce_opts);
    }
    r.work = shard_comm->reduce_scatter_into(r.out, r.flat, comm::ReduceOp::Sum);
    reducing.push_back(std::move(r));
    while (static_cast<int>(reducing.size()) > kMaxReductionsInFlight) retire_reduction();
  }

  // The oldest operation of `queue`, taken out once it has completed (the wait is ReduceWait's).
  static Reduction completed_front(std::deque<Reduction>& queue) {
    Reduction r = std::move(queue.front());
    queue.pop_front();
    profile::Phase waiting(profile::Part::ReduceWait);
    r.work->wait();
    return r;
  }

  // The oldest reduce-scatter: its chunk into the gradient shard; then the replica all-reduce.
  void retire_reduction() {
    Reduction r = completed_front(reducing);
    r.flat = at::Tensor();
    Unit& u = units[r.unit];
    if (offloaded()) add_down(u, r.out);
    else write_grad(u, r.out);
    r.out = at::Tensor();
    if (r.final) final_grad(r.unit);
  }

  // Unit ui's gradient shard holds this rank's reduced slice: replicas all-reduce it first; then it
  // is final and the on_grad_ready hook sees it.
  void final_grad(int ui) {
    if (replicate_comm->size() > 1) replicate(ui);
    else if (grad_ready) grad_ready(ui);
  }

  // All-reduce unit ui's gradient shard across replicas (in the reduce dtype), asynchronously.
  void replicate(int ui) {
    Unit& u = units[ui];
    Reduction r;
    r.unit = ui;
    {
      memory::Scope scope(memory::Category::CommBuffers, state_where());
      r.out = u.shard->grad.scalar_type() == opts.reduce_dtype ? u.shard->grad : u.shard->grad.to(opts.reduce_dtype);
    }
    if (offloaded()) {  // the host's shard (cast there) copied up for the device's all-reduce
      memory::Scope scope(memory::Category::CommBuffers);
      at::Tensor up = at::empty({r.out.numel()}, r.out.options().device(opts.device));
      up.copy_(r.out);
      traffic.up += up.nbytes();
      r.out = up;
    }
    r.work = replicate_comm->all_reduce(r.out, comm::ReduceOp::Sum);
    replicating.push_back(std::move(r));
    while (static_cast<int>(replicating.size()) > kMaxReductionsInFlight) retire_replication();
  }

  void retire_replication() {
    Reduction r = completed_front(replicating);
    at::Tensor& grad = units[r.unit].shard->grad;
    if (offloaded()) traffic.down += r.out.nbytes();  // the device's result back into the host shard
    if (!r.out.is_same(grad)) grad.copy_(r.out);
    if (grad_ready) grad_ready(r.unit);
  }

  // Retires, oldest first, the reductions that have already completed (no waiting): a finished
  // reduce-scatter's replica all-reduce is issued as soon as this rank looks, instead of when the
  // in-flight bound forces it, and finished buffers are freed. Which operations each communicator
  // gets, and their order, stay the same on every rank (retiring is FIFO per queue); only the time
  // of issue depends on progress.
  void retire_completed() {
    while (!reducing.empty() && reducing.front().work->is_completed()) retire_reduction();
    while (!replicating.empty() && replicating.front().work->is_completed()) retire_replication();
  }

  void drain_reductions() {
    while (!reducing.empty()) retire_reduction();
    while (!replicating.empty()) retire_replication();
  }
};

// ---- the autograd function wrapping one decoder layer ------------------------------------------
namespace {

// The engine as autograd carries it from forward to backward: a typed reference in the context's
// saved data (an IValue capsule), not an address passed as an integer.
struct EngineRef : torch::CustomClassHolder {
  explicit EngineRef(Engine::Impl* i) : impl(i) {}
  Engine::Impl* impl;
};

struct LayerFunction : public torch::autograd::Function<LayerFunction> {
  // `anchor` (Impl::anchor) only makes autograd call backward when x needs no gradient.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, torch::Tensor anchor,
                               int64_t layer, Engine::Impl* impl) {
    const int ui = static_cast<int>(layer) + 1;
    impl->wait_gathered(ui);
    impl->prefetch(ui + 1, true);
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["engine"] = c10::IValue::make_capsule(c10::make_intrusive<EngineRef>(impl));
    torch::Tensor y;
    std::optional<profile::ops::InLayer> in_layer(std::in_place);  // the layer's own operators (bench step)
    if (impl->opts.activation_checkpointing) {
      if (impl->opts.preserve_rng) ctx->saved_data["rng"] = impl->rng().get_state();
      torch::NoGradGuard no_grad;
      y = impl->layer_fn(layer, x);
      ctx->save_for_backward({x});
    } else {
      // Keep the layer's own graph for backward; its saved tensors that alias the gathered
      // parameters are valid again once the buffer is re-gathered in place.
      torch::Tensor x_in = x.detach().requires_grad_(x.requires_grad());
      {
        torch::AutoGradMode grad_on(true);
        y = impl->layer_fn(layer, x_in);
      }
      ctx->saved_data["x_in"] = x_in;
      ctx->saved_data["y"] = y;
      y = y.detach();
    }
    in_layer.reset();
    if (impl->regathers()) impl->reshard(ui);
    if (ui + 1 == static_cast<int>(impl->units.size())) impl->prefetch(ui, true);  // first unit of backward
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    Engine::Impl* impl = static_cast<EngineRef*>(ctx->saved_data["engine"].toCapsule().get())->impl;
    const int64_t layer = ctx->saved_data["layer"].toInt();
    const int ui = static_cast<int>(layer) + 1;
    profile::Phase backward = profile::Phase::label("backward");
    impl->wait_gathered(ui);
    impl->prefetch(ui - 1, true);
    torch::Tensor x_in, y;
    const bool input_grad = ctx->needs_input_grad(0);
    std::optional<profile::ops::InLayer> in_layer(std::in_place);  // until the layer's gradients exist
    if (impl->opts.activation_checkpointing) {
      x_in = ctx->get_saved_variables()[0].detach().requires_grad_(input_grad);
      torch::AutoGradMode grad_on(true);
      profile::Phase recompute(profile::Part::Recompute);
      if (impl->opts.preserve_rng) {  // the forward's random numbers again; the generator then goes on as it was
        const at::Tensor now = impl->rng().get_state();
        impl->rng().set_state(ctx->saved_data["rng"].toTensor());
        y = impl->layer_fn(layer, x_in);
        impl->rng().set_state(now);
      } else {
        y = impl->layer_fn(layer, x_in);
      }
    } else {
      x_in = ctx->saved_data["x_in"].toTensor();
      y = ctx->saved_data["y"].toTensor();
    }
    auto& unit = impl->units[ui];
    std::vector<torch::Tensor> inputs;
    if (input_grad) inputs.push_back(x_in);
    inputs.insert(inputs.end(), unit.params.begin(), unit.params.end());
    auto grads = torch::autograd::grad({y}, inputs, {grad_out[0]}, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
    torch::Tensor grad_x = input_grad ? grads[0] : torch::Tensor();
    in_layer.reset();
    ctx->saved_data.erase("x_in");
    ctx->saved_data.erase("y");
    x_in = y = torch::Tensor();
    inputs.clear();
    // The gathered parameters are not needed any more: free them before the reduction buffers exist.
    impl->reshard(ui);
    profile::Phase reduction = profile::Phase::label("layer reduction");
    // Moved out, so that each parameter gradient is freed as soon as it is added into the flat buffer.
    impl->accumulate_grads(ui, std::vector<torch::Tensor>(std::make_move_iterator(grads.begin() + (input_grad ? 1 : 0)),
                                                          std::make_move_iterator(grads.end())));
    return {grad_x, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

GroupLayout layout_for(Strategy s, const comm::ProcessGroups& groups) {
  switch (s) {
    case Strategy::FullShard:
    case Strategy::ShardGradOp: return {groups.world, comm::make_self_communicator("replicate")};
    case Strategy::NoShard: return {comm::make_self_communicator("shard"), groups.world};
    case Strategy::HybridShard: return {groups.intra, groups.inter};
  }
  TESSERA_CHECK(false, "unknown strategy");
  return {};
}

// ---- Engine -----------------------------------------------------------------------------------
Engine::Engine(std::vector<UnitDef> defs, LayerFn layer_fn, const comm::ProcessGroups& groups, Options opts,
               DecayFn decay)
    : impl_(std::make_unique<Impl>()), opts_(opts) {
  TESSERA_CHECK(!defs.empty(), "no units");
  TESSERA_CHECK(opts.limit_all_gathers >= 1, "limit_all_gathers must be >= 1");
  Impl& im = *impl_;
  im.opts = opts;
  im.layer_fn = std::move(layer_fn);
  if (opts.strategy == Strategy::HybridShard)
    TESSERA_CHECK_INPUT(groups.intra->size() * groups.inter->size() == groups.world->size(),
                        "hybrid_shard needs every node to run the same number of ranks (world " +
                            std::to_string(groups.world->size()) + ", this node " +
                            std::to_string(groups.intra->size()) + ")");
  const GroupLayout layout = layout_for(opts.strategy, groups);
  im.shard_comm = layout.shard;
  im.replicate_comm = layout.replicate;
  for (const comm::CommPtr& c : {im.shard_comm, im.replicate_comm})
    TESSERA_CHECK_INPUT(c->size() == 1 || c->device().type() == opts.device.type(),
                        "fsdp: the " + c->name() + " communicator (" + c->backend() + ") takes tensors on " +
                            c->device().str() + " but the engine's device is " + opts.device.str());
  im.dp_size = im.shard_comm->size() * im.replicate_comm->size();
  const int W = im.shard_comm->size(), r = im.shard_comm->rank();
  const auto frozen_st = opts.frozen_storage ? opts.frozen_storage : dtype_storage(opts.param_dtype);
  im.shards.resize(defs.size());
  im.frozen.reserve(2 * defs.size());
  for (size_t ui = 0; ui < defs.size(); ++ui) {
    auto& def = defs[ui];
    Impl::Unit u;
    u.shard = &im.shards[ui];
    std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
    for (auto& [name, p] : def.params) shapes.emplace_back(name, p.sizes().vec());
    u.shard->name = def.name;
    u.shard->plan = ShardPlan::make(shapes, W, opts.align);
    u.shard->shard_rank = r;
    const auto& plan = u.shard->plan;
    auto f32 = at::TensorOptions().dtype(at::kFloat).device(opts.device);
    {
      memory::Scope scope(memory::Category::Master, im.state_where());
      u.shard->master = im.state_zeros(plan.chunk);
    }
    // Weight decay by ranges of the shard (merged where adjacent slices both decay).
    for (const auto& s : plan.slices(r)) {
      if (!decay(plan.params[s.param].name)) continue;
      auto& d = u.shard->decay;
      if (!d.empty() && d.back().first + d.back().second == s.shard_offset) d.back().second += s.length;
      else d.emplace_back(s.shard_offset, s.length);
    }
    // The model's parameters become views of the flat gathered buffer; its storage is then freed
    // and re-allocated in place by every gather/reshard.
    u.full = at::empty({plan.padded_total}, f32.dtype(opts.param_dtype));
    u.full_bytes = plan.padded_total * u.full.element_size();
    Impl::view_params(u.full, plan, def.params, u.params);
    im.make_frozen(u, static_cast<int>(ui), def.name, def.frozen, frozen_st, W, r);
    im.make_frozen(u, static_cast<int>(ui), def.name, def.quantized, opts.quantized_storage, W, r);
    im.free_storage(u);
    im.units.push_back(std::move(u));
  }
}

Engine::~Engine() = default;

void Engine::begin_forward(bool sync) {
  impl_->sync = sync;
  impl_->wait_gathered(0);
  impl_->prefetch(1, at::GradMode::is_enabled());
}

at::Tensor Engine::run_layer(int64_t layer, const at::Tensor& h) {
  TESSERA_CHECK(layer >= 0 && layer < num_layers(), "layer index out of range");
  if (at::GradMode::is_enabled()) return LayerFunction::apply(h, impl_->anchor, layer, impl_.get());
  // Inference (evaluation): no autograd function, nothing saved; gather, run, reshard as forward.
  Impl& im = *impl_;
  const int ui = static_cast<int>(layer) + 1;
  im.wait_gathered(ui);
  im.prefetch(ui + 1, false);
  at::Tensor y = im.layer_fn(layer, h);
  if (im.reshard_after_forward()) im.reshard(ui);
  return y;
}

void Engine::finish_backward() {
  Impl& im = *impl_;
  auto& root = im.units[0];
  std::vector<at::Tensor> grads;
  for (auto& p : root.params) {
    grads.push_back(p.grad());
    p.mutable_grad() = at::Tensor();
  }
  profile::Phase reduction = profile::Phase::label("root reduction");
  im.drain_reductions();  // the layers' buffers go before the root's (largest) one is built
  // Every unit's gathered parameters are done with: free them before the root's reduction buffer.
  for (size_t ui = 0; ui < im.units.size(); ++ui) im.reshard(static_cast<int>(ui));
  im.accumulate_grads(0, std::move(grads));
  im.drain_reductions();
}

void Engine::reshard_all() {
  for (size_t ui = 0; ui < impl_->units.size(); ++ui) impl_->reshard(static_cast<int>(ui));
}

void Engine::after_step() {
  reshard_all();
  impl_->mark_stale();  // offload: the masters changed; the next gathers take them
}

void Engine::on_grad_ready(std::function<void(int unit)> hook) { impl_->grad_ready = std::move(hook); }

void Engine::release_grad(int unit) {
  impl_->units[unit].shard->grad = at::Tensor();
  impl_->units[unit].grad_fresh = true;
}

// No zeroing pass: each shard is marked fresh, and the step's first gradient is copied into it.
void Engine::zero_grad() {
  for (auto& u : impl_->units) u.grad_fresh = true;
}

// Whoever reaches the masters through shards() or named_state() may write them (the loader,
// checkpoint load): under offload the parameter shards are made from them again before the next
// gathers (a copy too many where they were only read).
const std::vector<UnitShard>& Engine::shards() const {
  impl_->mark_stale();
  impl_->settle_grads();
  return impl_->shards;
}

optim::ShardView Engine::optimizer_view() {
  impl_->settle_grads();
  optim::ShardView view;
  for (const UnitShard& sh : impl_->shards) view.shards.push_back({sh.master, sh.grad, sh.decay, impl_->offloaded()});
  view.group = &shard_group();
  view.device = opts_.device;
  return view;
}
NamedShards Engine::named_state() const {
  impl_->mark_stale();
  NamedShards s{"param", {}};
  for (const auto& u : impl_->shards) s.per_unit.push_back(u.master);
  return s;
}
const std::vector<FrozenShard>& Engine::frozen_shards() const { return impl_->frozen; }

void Engine::set_frozen(int group, const at::Tensor& fp32_chunk) {
  Impl& im = *impl_;
  FrozenShard& fz = im.frozen.at(group);
  TESSERA_CHECK(fp32_chunk.numel() == fz.plan.chunk,
                "set_frozen: unit " + fz.name + " takes " + std::to_string(fz.plan.chunk) + " values");
  im.reshard(fz.unit);  // a gathered copy of the old values is not used again
  fz.storage->encode(fp32_chunk.to(fz.stored.device()), fz.stored);
}

at::Tensor Engine::gather_frozen(int group, int param) {
  Impl& im = *impl_;
  const FrozenShard& fz = im.frozen.at(group);
  const int W = im.shard_comm->size();
  at::Tensor in = fz.stored.to(opts_.device);
  at::Tensor wire = at::empty({in.numel() * W}, in.options());
  im.shard_comm->all_gather_into(wire, in)->wait();
  at::Tensor full = at::empty({fz.plan.padded_total}, in.options().dtype(at::kFloat));
  for (int r = 0; r < W; ++r)
    fz.storage->decode(wire.narrow(0, r * in.numel(), in.numel()), full.narrow(0, r * fz.plan.chunk, fz.plan.chunk));
  const auto& slot = fz.plan.params.at(param);
  return full.narrow(0, slot.offset, slot.numel).view(slot.shape).clone();
}

comm::Communicator& Engine::shard_group() { return *impl_->shard_comm; }
comm::Communicator& Engine::replicate_group() { return *impl_->replicate_comm; }
int64_t Engine::num_layers() const { return static_cast<int64_t>(impl_->units.size()) - 1; }
MemoryStats Engine::memory() const { return impl_->mem; }
Traffic Engine::traffic() const { return impl_->traffic; }
int64_t Engine::live_bytes(int unit) const {
  return static_cast<int64_t>(impl_->units.at(unit).full.storage().nbytes());
}

at::Tensor Engine::gather_param(int unit, int param) {
  Impl& im = *impl_;
  const UnitShard& sh = im.shards.at(unit);
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(opts_.device);
  at::Tensor full = at::empty({sh.plan.padded_total}, f32);
  at::Tensor in = sh.master;
  if (im.offloaded()) in = at::empty({sh.plan.chunk}, f32).copy_(sh.master);  // the collective takes device tensors
  im.shard_comm->all_gather_into(full, in)->wait();
  const auto& slot = sh.plan.params.at(param);
  return full.narrow(0, slot.offset, slot.numel).view(slot.shape).clone();
}

}  // namespace tessera::fsdp
