#include "runtime/fsdp/fsdp.h"

#include <c10/core/DeviceGuard.h>
#include <torch/torch.h>

#include "runtime/error.h"

namespace tessera::fsdp {

Strategy parse_strategy(const std::string& s) {
  if (s == "full_shard") return Strategy::FullShard;
  if (s == "shard_grad_op") return Strategy::ShardGradOp;
  if (s == "no_shard") return Strategy::NoShard;
  if (s == "hybrid_shard") return Strategy::HybridShard;
  throw TESSERA_INPUT_ERROR("fsdp.strategy '" + s + "' is not one of full_shard, shard_grad_op, no_shard, hybrid_shard");
}
std::string to_string(Strategy s) {
  switch (s) {
    case Strategy::FullShard: return "full_shard";
    case Strategy::ShardGradOp: return "shard_grad_op";
    case Strategy::NoShard: return "no_shard";
    case Strategy::HybridShard: return "hybrid_shard";
  }
  return "?";
}
at::ScalarType parse_dtype(const std::string& s) {
  if (s == "fp32" || s == "float32") return at::kFloat;
  if (s == "bf16" || s == "bfloat16") return at::kBFloat16;
  if (s == "fp16" || s == "float16") return at::kHalf;
  throw TESSERA_INPUT_ERROR("dtype '" + s + "' is not one of fp32, bf16, fp16");
}

namespace {

enum class GatherState { Free, Gathering, Gathered };

// A gradient reduction in flight: the reduce-scatter output is added into the fp32 shard gradient
// once complete (and all-reduced across replicas for hybrid / no_shard).
struct PendingReduce {
  int unit;
  comm::WorkPtr work;
  at::Tensor input, output;
};

}  // namespace

struct Engine::Impl {
  struct Unit {
    UnitShard* shard = nullptr;  // into Impl::shards
    std::vector<at::Tensor> params;  // the model's parameter tensors (now views of `full`)
    at::Tensor full;                 // gathered flat buffer, param dtype, storage freed when Free
    int64_t full_bytes = 0;
    GatherState state = GatherState::Free;
    comm::WorkPtr gather_work;
    at::Tensor gather_input;  // master cast to param dtype, alive while gathering
    at::Tensor accum;         // fp32 full-size gradient accumulated over no_sync micro-steps
  };

  Options opts;
  LayerFn layer_fn;
  comm::CommPtr shard_comm, replicate_comm;
  int dp_size = 1;  // data-parallel ranks = shard * replicate
  std::vector<UnitShard> shards;  // what the optimizer and checkpoints see
  std::vector<Unit> units;
  std::vector<PendingReduce> pending;
  bool sync = true;
  MemoryStats mem;

  bool reshard_after_forward() const {
    return opts.strategy == Strategy::FullShard || opts.strategy == Strategy::HybridShard;
  }

  // ---- storage of the gathered buffer ------------------------------------------------------
  void free_storage(Unit& u) {
    auto* impl = u.full.storage().unsafeGetStorageImpl();
    impl->set_data_ptr_noswap(at::DataPtr(nullptr, u.full.device()));
    impl->set_nbytes(0);
  }
  void alloc_storage(Unit& u) {
    // The storage's allocator (CUDA: the caching allocator) allocates on the current device.
    c10::OptionalDeviceGuard guard;
    if (!u.full.device().is_cpu()) guard.reset_device(u.full.device());
    auto* impl = u.full.storage().unsafeGetStorageImpl();
    impl->set_data_ptr_noswap(impl->allocator()->allocate(u.full_bytes));
    impl->set_nbytes(u.full_bytes);
  }

  bool is_layer(int ui) const { return ui > 0; }

  void gather_async(int ui) {
    Unit& u = units[ui];
    if (u.state != GatherState::Free) return;
    alloc_storage(u);
    u.gather_input = u.shard->master.scalar_type() == opts.param_dtype ? u.shard->master
                                                                      : u.shard->master.to(opts.param_dtype);
    u.gather_work = shard_comm->all_gather_into(u.full, u.gather_input);
    u.state = GatherState::Gathering;
    mem.gathered_bytes_now += u.full_bytes;
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
      u.gather_work->wait();
      u.gather_work.reset();
      u.gather_input = at::Tensor();
      u.state = GatherState::Gathered;
    }
  }

  void reshard(int ui) {
    Unit& u = units[ui];
    if (u.state == GatherState::Free) return;
    if (u.state == GatherState::Gathering) {
      u.gather_work->wait();
      u.gather_work.reset();
      u.gather_input = at::Tensor();
    }
    free_storage(u);
    u.state = GatherState::Free;
    mem.gathered_bytes_now -= u.full_bytes;
    if (is_layer(ui)) --mem.gathered_layers_now;
  }

  // Prefetch another layer unit if the in-flight limit allows it.
  void prefetch(int ui) {
    if (!opts.prefetch || ui < 1 || ui >= static_cast<int>(units.size())) return;
    if (units[ui].state != GatherState::Free) return;
    if (reshard_after_forward() && mem.gathered_layers_now >= opts.limit_all_gathers) return;
    gather_async(ui);
  }

  // ---- gradients ---------------------------------------------------------------------------
  // grads[k] is the gradient of units[ui].params[k] (undefined if unused).
  void accumulate_grads(int ui, const std::vector<at::Tensor>& grads) {
    Unit& u = units[ui];
    const ShardPlan& plan = u.shard->plan;
    auto add_into_accum = [&] {
      for (size_t k = 0; k < grads.size(); ++k)
        if (grads[k].defined())
          u.accum.narrow(0, plan.params[k].offset, plan.params[k].numel).add_(grads[k].reshape(-1).to(at::kFloat));
    };
    if (!sync) {
      if (!u.accum.defined()) u.accum = at::zeros({plan.padded_total}, u.shard->master.options());
      add_into_accum();
      return;
    }
    at::Tensor flat;
    if (u.accum.defined()) {
      add_into_accum();
      flat = u.accum.to(opts.reduce_dtype);
      u.accum = at::Tensor();
    } else {
      flat = at::zeros({plan.padded_total}, u.shard->master.options().dtype(opts.reduce_dtype));
      for (size_t k = 0; k < grads.size(); ++k)
        if (grads[k].defined())
          flat.narrow(0, plan.params[k].offset, plan.params[k].numel).copy_(grads[k].reshape(-1));
    }
    // Average over every data-parallel rank; dividing before the sum keeps fp16/bf16 in range.
    if (dp_size > 1) flat.div_(static_cast<double>(dp_size));
    at::Tensor out = at::empty({plan.chunk}, flat.options());
    auto work = shard_comm->reduce_scatter_into(out, flat, comm::ReduceOp::Sum);
    pending.push_back({ui, work, flat, out});
  }

  void drain_reductions() {
    for (auto& p : pending) {
      p.work->wait();
      if (replicate_comm->size() > 1) replicate_comm->all_reduce(p.output, comm::ReduceOp::Sum)->wait();
      units[p.unit].shard->grad.add_(p.output.to(at::kFloat));
    }
    pending.clear();
  }
};

// ---- the autograd function wrapping one decoder layer ------------------------------------------
namespace {

struct LayerFunction : public torch::autograd::Function<LayerFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, int64_t layer,
                               int64_t impl_ptr) {
    auto* impl = reinterpret_cast<Engine::Impl*>(impl_ptr);
    const int ui = static_cast<int>(layer) + 1;
    impl->wait_gathered(ui);
    impl->prefetch(ui + 1);
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["impl"] = impl_ptr;
    torch::Tensor y;
    if (impl->opts.activation_checkpointing) {
      torch::NoGradGuard no_grad;
      y = impl->layer_fn(layer, x);
      ctx->save_for_backward({x});
    } else {
      // Keep the layer's own graph for backward; its saved tensors that alias the gathered
      // parameters are valid again once the buffer is re-gathered in place.
      torch::Tensor x_in = x.detach().requires_grad_(true);
      {
        torch::AutoGradMode grad_on(true);
        y = impl->layer_fn(layer, x_in);
      }
      ctx->saved_data["x_in"] = x_in;
      ctx->saved_data["y"] = y;
      y = y.detach();
    }
    if (impl->reshard_after_forward()) impl->reshard(ui);
    if (ui + 1 == static_cast<int>(impl->units.size())) impl->prefetch(ui);  // first unit of backward
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto* impl = reinterpret_cast<Engine::Impl*>(ctx->saved_data["impl"].toInt());
    const int64_t layer = ctx->saved_data["layer"].toInt();
    const int ui = static_cast<int>(layer) + 1;
    impl->wait_gathered(ui);
    impl->prefetch(ui - 1);
    torch::Tensor x_in, y;
    if (impl->opts.activation_checkpointing) {
      x_in = ctx->get_saved_variables()[0].detach().requires_grad_(true);
      torch::AutoGradMode grad_on(true);
      y = impl->layer_fn(layer, x_in);
    } else {
      x_in = ctx->saved_data["x_in"].toTensor();
      y = ctx->saved_data["y"].toTensor();
    }
    auto& unit = impl->units[ui];
    std::vector<torch::Tensor> inputs = {x_in};
    inputs.insert(inputs.end(), unit.params.begin(), unit.params.end());
    auto grads = torch::autograd::grad({y}, inputs, {grad_out[0]}, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
    ctx->saved_data.erase("x_in");
    ctx->saved_data.erase("y");
    impl->accumulate_grads(ui, std::vector<torch::Tensor>(grads.begin() + 1, grads.end()));
    impl->reshard(ui);
    return {grads[0], torch::Tensor(), torch::Tensor()};
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
  im.shards.resize(defs.size());
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
    u.shard->master = at::zeros({plan.chunk}, f32);
    u.shard->grad = at::zeros({plan.chunk}, f32);
    u.shard->exp_avg = at::zeros({plan.chunk}, f32);
    u.shard->exp_avg_sq = at::zeros({plan.chunk}, f32);
    u.shard->decay_mask = at::zeros({plan.chunk}, f32);
    for (const auto& s : plan.slices(r))
      if (decay(plan.params[s.param].name)) u.shard->decay_mask.narrow(0, s.shard_offset, s.length).fill_(1.0f);
    // The model's parameters become views of the flat gathered buffer; its storage is then freed
    // and re-allocated in place by every gather/reshard.
    u.full = at::empty({plan.padded_total}, f32.dtype(opts.param_dtype));
    u.full_bytes = plan.padded_total * u.full.element_size();
    for (size_t k = 0; k < def.params.size(); ++k) {
      at::Tensor& p = def.params[k].second;
      const auto& slot = plan.params[k];
      // Tensor::set_data refuses a meta -> CPU/CUDA swap; the metadata copy it performs is done
      // directly (storage, sizes, strides, offset, device), keeping the parameter's autograd meta.
      at::Tensor view = u.full.narrow(0, slot.offset, slot.numel).view(slot.shape);
      p.unsafeGetTensorImpl()->shallow_copy_from(view.getIntrusivePtr());
      u.params.push_back(p);
    }
    im.free_storage(u);
    im.units.push_back(std::move(u));
  }
}

Engine::~Engine() = default;

void Engine::begin_forward(bool sync) {
  impl_->sync = sync;
  impl_->wait_gathered(0);
  impl_->prefetch(1);
}

at::Tensor Engine::run_layer(int64_t layer, const at::Tensor& h) {
  TESSERA_CHECK(layer >= 0 && layer < num_layers(), "layer index out of range");
  return LayerFunction::apply(h, layer, reinterpret_cast<int64_t>(impl_.get()));
}

void Engine::finish_backward() {
  Impl& im = *impl_;
  auto& root = im.units[0];
  std::vector<at::Tensor> grads;
  for (auto& p : root.params) {
    grads.push_back(p.grad());
    p.mutable_grad() = at::Tensor();
  }
  im.accumulate_grads(0, grads);
  im.drain_reductions();
  im.reshard(0);
  for (size_t ui = 1; ui < im.units.size(); ++ui) im.reshard(static_cast<int>(ui));
}

void Engine::reshard_all() {
  for (size_t ui = 0; ui < impl_->units.size(); ++ui) impl_->reshard(static_cast<int>(ui));
}

void Engine::zero_grad() {
  for (auto& u : impl_->units) u.shard->grad.zero_();
}

std::vector<UnitShard>& Engine::shards() { return impl_->shards; }
comm::Communicator& Engine::shard_group() { return *impl_->shard_comm; }
comm::Communicator& Engine::replicate_group() { return *impl_->replicate_comm; }
int64_t Engine::num_layers() const { return static_cast<int64_t>(impl_->units.size()) - 1; }
MemoryStats Engine::memory() const { return impl_->mem; }
void Engine::reset_peaks() {
  impl_->mem.gathered_layers_peak = impl_->mem.gathered_layers_now;
  impl_->mem.gathered_bytes_peak = impl_->mem.gathered_bytes_now;
}
int64_t Engine::live_bytes(int unit) const {
  return static_cast<int64_t>(impl_->units.at(unit).full.storage().nbytes());
}

at::Tensor Engine::gather_param(int unit, int param) {
  Impl& im = *impl_;
  const UnitShard& sh = im.shards.at(unit);
  at::Tensor full = at::empty({sh.plan.padded_total}, sh.master.options());
  im.shard_comm->all_gather_into(full, sh.master)->wait();
  const auto& slot = sh.plan.params.at(param);
  return full.narrow(0, slot.offset, slot.numel).view(slot.shape).clone();
}

}  // namespace tessera::fsdp
