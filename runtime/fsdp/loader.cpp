#include "runtime/fsdp/loader.h"

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>

#include "runtime/comm/agree.h"
#include "runtime/device/device.h"
#include "runtime/memory/tracker.h"
#include "util/error.h"
#include "util/parse_named.h"
#include "util/widen.h"

namespace tessera::fsdp {

LoadMode parse_load_mode(const std::string& s) {
  return util::parse_named<LoadMode>(load_mode_names(), s, "model.load");
}

std::string to_string(LoadMode m) { return util::name_of(load_mode_names(), m); }

PlanSizes plan_sizes(const std::vector<UnitDef>& units, int world, int64_t align) {
  PlanSizes s;
  for (const auto& u : units) {
    std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
    for (const auto& [name, p] : u.params) shapes.emplace_back(name, p.sizes().vec());
    const ShardPlan plan = ShardPlan::make(shapes, world, align);
    s.total_elements += plan.total;
    s.per_rank_elements += plan.chunk;
    s.largest_unit_elements = std::max(s.largest_unit_elements, plan.padded_total);
  }
  return s;
}

namespace {

// Host memory the loader fills for a unit's shard: the master itself on CPU, else a pinned host
// buffer that is copied to the master's device once complete (asynchronously: DMA from pinned
// memory, which the host caching allocator keeps until the copy is done).
at::Tensor host_shard(const UnitShard& u) {
  return u.master.device().is_cpu() ? u.master : device::host_buffer({u.plan.chunk}, at::kFloat, u.master.device());
}
void finish_shard(const UnitShard& u, const at::Tensor& host) {
  if (!host.is_same(u.master)) u.master.copy_(host, /*non_blocking=*/true);
}

// Zeroes the elements of rank's shard that hold no parameter (alignment gaps, end padding).
void zero_gaps(const ShardPlan& plan, int rank, float* shard) {
  int64_t pos = 0;
  for (const auto& s : plan.slices(rank)) {
    std::fill(shard + pos, shard + s.shard_offset, 0.0f);
    pos = s.shard_offset + s.length;
  }
  std::fill(shard + pos, shard + plan.chunk, 0.0f);
}

// Reads this rank's slices from the source (converted to fp32 per slice) and zeroes the rest.
int64_t read_own_slices(const ShardPlan& plan, int rank, WeightSource& source, float* shard) {
  int64_t read = 0;
  for (const auto& s : plan.slices(rank)) {
    const auto& slot = plan.params[s.param];
    source.read(slot.name, slot.shape, s.param_offset, s.length, shard + s.shard_offset);
    read += s.length;
  }
  zero_gaps(plan, rank, shard);
  return read;
}

// Writes the whole unit, laid out as in its plan, into flat[0, padded_total): parameters read
// from the source (converted to fp32 per slice), alignment gaps and end padding zeroed.
int64_t read_flat_unit(const ShardPlan& plan, WeightSource& source, float* flat) {
  int64_t pos = 0, read = 0;
  for (const auto& slot : plan.params) {
    std::fill(flat + pos, flat + slot.offset, 0.0f);
    source.read(slot.name, slot.shape, 0, slot.numel, flat + slot.offset);
    read += slot.numel;
    pos = slot.offset + slot.numel;
  }
  std::fill(flat + pos, flat + plan.padded_total, 0.0f);
  return read;
}

// Direct route in batches: the flat range of rank r's shard is cut into pieces of `batch`
// elements (the last one shorter); batch j of every rank travels in the j-th scatter_pieces of the
// unit. A receiver lands 16-bit slices in a small bounce buffer at their offset inside the batch
// and widens them from there (still in cache) into its master, so the 16-bit data never makes a
// round trip through main memory.
int64_t batch_count(const ShardPlan& plan, int64_t batch) { return (plan.chunk + batch - 1) / batch; }
// Slices of rank r's batch j; shard_offset counts from the batch's first element.
std::vector<ShardSlice> batch_slices(const ShardPlan& plan, int r, int64_t j, int64_t batch) {
  const int64_t begin = plan.shard_begin(r) + j * batch;
  return plan.slices_in(begin, std::min(begin + batch, plan.shard_begin(r) + plan.chunk));
}

// The root's read error on every rank of the shard group and then of the replicate group (their
// union is every rank), so that a failure stops every rank before the next collective instead of
// leaving the others waiting in a scatter; it keeps its kind (runtime/comm/agree.h). `wire` is the
// root's encode_error() string, "" when it has none (always "" on the other ranks).
void agree_on_read(comm::Communicator& shard, comm::Communicator& replicate, const std::string& wire) {
  auto agreed = agree_on_error(shard, wire);
  if (replicate.size() > 1) agreed = agree_on_error(replicate, agreed ? encode_error(agreed->kind, agreed->message) : "");
  if (agreed)
    throw Error(agreed->kind, "loading weights (model.load=rank0), error on the reading rank: " + agreed->message);
}

// How the root sends a unit: Direct* when the source has in-memory views of every parameter in
// that one dtype -- each rank's slices go out as they are stored, with no copy on the root, and
// receivers widen 16-bit ones -- or Staged: the root reads the unit into an fp32 staging buffer
// and scatters that. Travels as one byte per unit.
enum class Route : uint8_t { Staged = 0, DirectBF16, DirectF16, DirectF32 };

// The dtype a route sends as stored; nullopt for a staged unit.
std::optional<at::ScalarType> route_wire(Route r) {
  switch (r) {
    case Route::DirectBF16: return at::kBFloat16;
    case Route::DirectF16: return at::kHalf;
    case Route::DirectF32: return at::kFloat;
    case Route::Staged: break;
  }
  return std::nullopt;
}

// The root's route for a unit, with the views it sends from (empty when staged).
Route unit_route(const ShardPlan& plan, WeightSource& source, std::vector<at::Tensor>& views) {
  views.clear();
  for (const auto& slot : plan.params) {
    at::Tensor v = source.view(slot.name, 0, slot.numel);
    const bool usable = v.defined() && (v.scalar_type() == at::kBFloat16 || v.scalar_type() == at::kHalf ||
                                        v.scalar_type() == at::kFloat);
    if (!usable || (!views.empty() && v.scalar_type() != views[0].scalar_type())) {
      views.clear();
      return Route::Staged;
    }
    views.push_back(v);
  }
  if (views.empty()) return Route::Staged;
  const at::ScalarType t = views[0].scalar_type();
  return t == at::kBFloat16 ? Route::DirectBF16 : t == at::kHalf ? Route::DirectF16 : Route::DirectF32;
}

// The root decides every unit's route up front (views are only pointers into the mapping, and
// taking them checks every tensor); every rank gets the routes -- or the root's error -- before
// any scatter. Returns the routes on every rank and fills the root's views.
std::vector<Route> share_routes(const std::vector<UnitShard>& units, WeightSource* source, bool root,
                                comm::Communicator& shard, comm::Communicator& replicate,
                                std::vector<std::vector<at::Tensor>>& views) {
  at::Tensor routes = at::zeros({static_cast<int64_t>(units.size())}, at::kByte);
  views.assign(units.size(), {});
  agree_on_read(shard, replicate, capture_error([&] {
    if (!root) return;
    TESSERA_CHECK(source != nullptr, "model.load=rank0: the reading rank has no weight source");
    for (size_t ui = 0; ui < units.size(); ++ui)
      routes.data_ptr<uint8_t>()[ui] = static_cast<uint8_t>(unit_route(units[ui].plan, *source, views[ui]));
  }));
  if (units.empty()) return {};
  shard.broadcast(routes, 0)->wait();
  if (replicate.size() > 1) replicate.broadcast(routes, 0)->wait();
  std::vector<Route> out(units.size());
  for (size_t ui = 0; ui < units.size(); ++ui) {
    const uint8_t r = routes.data_ptr<uint8_t>()[ui];
    TESSERA_CHECK(r <= static_cast<uint8_t>(Route::DirectF32), "rank0 load: unit route " + std::to_string(r));
    out[ui] = static_cast<Route>(r);
  }
  return out;
}

// model.load=rank0: the root (rank 0 of the shard group and of the replicate group) reads every
// unit and scatters it over its shard group; the other replicas receive the finished shards by
// broadcast over the replicate group.
class Rank0Load {
 public:
  Rank0Load(Engine& engine, WeightSource* source, comm::Communicator& shard, comm::Communicator& replicate,
            int64_t batch);
  LoadStats run();

 private:
  // A unit whose scatters may still be in flight: the root releases its views once they complete,
  // receivers then zero their shard's gaps.
  struct Pending {
    size_t unit = 0;
    std::vector<comm::WorkPtr> works;
    at::Tensor host;
    std::vector<at::Tensor> views;
    std::optional<at::ScalarType> wire;  // sent as stored in this dtype; nullopt: staged fp32
  };
  // Replicate-group broadcasts of finished host shards; a receiving replica copies its host shard
  // into the master (on the engine's device) once the broadcast completes.
  struct Broadcast {
    comm::WorkPtr work;
    size_t unit = 0;
    at::Tensor host;
  };

  void post(size_t ui, Route route);
  void complete(Pending& p);
  void post_direct(const UnitShard& u, Pending& p);
  void send_direct(const UnitShard& u, Pending& p);
  void receive_direct(const UnitShard& u, Pending& p);
  std::vector<at::Tensor> receive_targets(const UnitShard& u, const Pending& p, int64_t j,
                                          const std::vector<ShardSlice>& slices);
  void widen_direct(const UnitShard& u, const Pending& p, const std::vector<std::vector<ShardSlice>>& slices,
                    const std::vector<comm::WorkPtr>& works);
  uint16_t* landing(const UnitShard& u, float* host, int64_t j) const;
  void post_staged(size_t ui, const UnitShard& u, Pending& p);
  at::Tensor& staging_buffer(size_t ui);

  WeightSource* source_;
  comm::Communicator& shard_;
  comm::Communicator& replicate_;
  const int64_t batch_;
  const std::vector<UnitShard>& units_;
  LoadStats st_;
  const bool reader_replica_;  // the replica whose shard group the root scatters over
  // Replicas receive finished shards, so with replicas every unit completes before the next.
  const size_t max_pending_;
  std::vector<Pending> pending_;
  std::string root_error_;  // of the root's own reads during the loop, agreed on at the end
  std::array<at::Tensor, 2> staging_;  // the root's fp32 buffers for staged units (unit u uses u % 2)
  std::vector<Broadcast> broadcasts_;
  std::vector<std::vector<at::Tensor>> all_views_;  // the root's views, per unit, until posted
};

Rank0Load::Rank0Load(Engine& engine, WeightSource* source, comm::Communicator& shard, comm::Communicator& replicate,
                     int64_t batch)
    : source_(source),
      shard_(shard),
      replicate_(replicate),
      batch_(batch),
      units_(engine.shards()),
      reader_replica_(replicate.rank() == 0),
      max_pending_(replicate.size() > 1 ? 1 : 2) {
  st_.root = shard.rank() == 0 && replicate.rank() == 0;
}

LoadStats Rank0Load::run() {
  const std::vector<Route> route = share_routes(units_, source_, st_.root, shard_, replicate_, all_views_);
  for (size_t ui = 0; ui < units_.size(); ++ui) {
    if (!reader_replica_) {  // the other replicas only receive the finished shard by broadcast
      const at::Tensor host = host_shard(units_[ui]);
      broadcasts_.push_back({replicate_.broadcast(host, 0), ui, host});
      continue;
    }
    post(ui, route[ui]);
    if (pending_.size() >= max_pending_) {
      complete(pending_.front());
      pending_.erase(pending_.begin());
    }
  }
  for (auto& p : pending_) complete(p);
  agree_on_read(shard_, replicate_, root_error_);  // errors of the root's reads during the loop
  for (auto& b : broadcasts_) {
    b.work->wait();
    if (b.host.defined()) finish_shard(units_[b.unit], b.host);
  }
  return st_;
}

// Posts unit ui's scatters on the reader replica and queues it as pending.
void Rank0Load::post(size_t ui, Route route) {
  const UnitShard& u = units_[ui];
  Pending p;
  p.unit = ui;
  p.host = host_shard(u);
  p.wire = route_wire(route);
  p.views = std::move(all_views_[ui]);
  if (p.wire)
    post_direct(u, p);
  else
    post_staged(ui, u, p);
  pending_.push_back(std::move(p));
}

// Waits for a pending unit's scatters and finishes its shard; with replicas, broadcasts it to them.
void Rank0Load::complete(Pending& p) {
  const UnitShard& u = units_[p.unit];
  for (auto& w : p.works) w->wait();
  if (st_.root) {
    for (size_t i = 0; i < p.views.size(); ++i) source_->release(u.plan.params[i].name, 0, u.plan.params[i].numel);
    p.views.clear();
  } else if (p.wire) {
    zero_gaps(u.plan, u.shard_rank, p.host.data_ptr<float>());
  }
  finish_shard(u, p.host);
  if (replicate_.size() > 1) broadcasts_.push_back({replicate_.broadcast(p.host, 0), p.unit, at::Tensor()});
}

// Direct route: each rank's slices straight from the root's views, in batches (see
// batch_slices); the root posts every batch of the unit and converts its own slices from the
// source while the others receive. Receivers land fp32 slices at their place in their shard and
// 16-bit ones inside their shard too, widened in place: no buffer besides the shards.
void Rank0Load::post_direct(const UnitShard& u, Pending& p) {
  if (st_.root)
    send_direct(u, p);
  else
    receive_direct(u, p);
}

void Rank0Load::send_direct(const UnitShard& u, Pending& p) {
  const int64_t batches = batch_count(u.plan, batch_);
  for (int64_t j = 0; j < batches; ++j) {
    std::vector<std::vector<at::Tensor>> pieces(shard_.size());
    for (int r = 1; r < shard_.size(); ++r)
      for (const auto& s : batch_slices(u.plan, r, j, batch_)) {
        pieces[r].push_back(p.views[s.param].narrow(0, s.param_offset, s.length));
        st_.elements_read += s.length;
      }
    p.works.push_back(shard_.scatter_pieces({}, std::move(pieces), 0));
  }
  try {
    st_.elements_read += read_own_slices(u.plan, 0, *source_, p.host.data_ptr<float>());
  } catch (const std::exception& e) {
    root_error_ = encode_error(e);
  }
}

// Receivers: every batch of the unit is posted at once (each lands in its own part of the
// shard), then waited for and widened in order, so batch j+1 arrives while j is widened.
void Rank0Load::receive_direct(const UnitShard& u, Pending& p) {
  const int64_t batches = batch_count(u.plan, batch_);
  std::vector<std::vector<ShardSlice>> slices(batches);
  std::vector<comm::WorkPtr> works(batches);
  for (int64_t j = 0; j < batches; ++j) {
    slices[j] = batch_slices(u.plan, u.shard_rank, j, batch_);
    works[j] = shard_.scatter_pieces(receive_targets(u, p, j, slices[j]), {}, 0);
  }
  if (*p.wire == at::kFloat) {  // complete with the unit (the next unit's receives queue up meanwhile)
    p.works = std::move(works);
    return;
  }
  widen_direct(u, p, slices, works);
}

// Where batch j's slices land on a receiver.
std::vector<at::Tensor> Rank0Load::receive_targets(const UnitShard& u, const Pending& p, int64_t j,
                                                   const std::vector<ShardSlice>& slices) {
  const at::ScalarType wire = *p.wire;
  float* host = p.host.data_ptr<float>();
  std::vector<at::Tensor> out;
  for (const auto& s : slices)
    out.push_back(wire == at::kFloat  // nothing to widen: straight to the slice's place
                      ? p.host.narrow(0, j * batch_ + s.shard_offset, s.length)
                      : at::from_blob(landing(u, host, j) + s.shard_offset, {s.length},
                                      at::TensorOptions().dtype(wire)));
  return out;
}

// 16-bit slices land in the upper half of their batch's fp32 region: a batch of len elements
// spans 2*len 16-bit places, and slice s (offset o, length L) lands at place len + o and widens
// to element o. Widening runs forward and every write ends at or before the unread 16-bit data
// (4(o+L) <= 2(len+o+L) as o+L <= len), which is the overlap widen_to_f32 allows.
uint16_t* Rank0Load::landing(const UnitShard& u, float* host, int64_t j) const {  // batch j's 16-bit landing zone
  return reinterpret_cast<uint16_t*>(host + j * batch_) + std::min(batch_, u.plan.chunk - j * batch_);
}

// Waits for each batch in order and widens its 16-bit slices in place.
void Rank0Load::widen_direct(const UnitShard& u, const Pending& p, const std::vector<std::vector<ShardSlice>>& slices,
                             const std::vector<comm::WorkPtr>& works) {
  const auto kind = *p.wire == at::kBFloat16 ? util::Float16Kind::BF16 : util::Float16Kind::F16;
  float* host = p.host.data_ptr<float>();
  for (int64_t j = 0; j < static_cast<int64_t>(slices.size()); ++j) {
    works[j]->wait();
    for (const auto& s : slices[j])
      util::widen_to_f32(landing(u, host, j) + s.shard_offset, kind, host + j * batch_ + s.shard_offset, s.length);
  }
}

// Staged route: the root reads the whole unit into one of its two fp32 buffers and scatters it.
void Rank0Load::post_staged(size_t ui, const UnitShard& u, Pending& p) {
  at::Tensor flat;
  if (st_.root) {
    // The previous user of this buffer (unit ui-2) completed before pending had room for ui.
    flat = staging_buffer(ui).narrow(0, 0, u.plan.padded_total);
    try {
      st_.elements_read += read_flat_unit(u.plan, *source_, flat.data_ptr<float>());
    } catch (const std::exception& e) {
      root_error_ = encode_error(e);  // the scatter still runs (garbage), the final agreement throws
    }
  }
  p.works.push_back(shard_.scatter_into(p.host, flat, 0));
}

// The root's staging buffer for unit ui, allocated at the largest unit's size on first use.
at::Tensor& Rank0Load::staging_buffer(size_t ui) {
  at::Tensor& buffer = staging_[ui % 2];
  if (!buffer.defined()) {
    int64_t largest = 0;
    for (const auto& x : units_) largest = std::max(largest, x.plan.padded_total);
    buffer = at::empty({largest}, at::TensorOptions().dtype(at::kFloat));
    st_.staging_bytes += largest * static_cast<int64_t>(sizeof(float));
  }
  return buffer;
}

LoadStats load_rank0(Engine& engine, WeightSource* source, comm::Communicator& shard, comm::Communicator& replicate,
                     int64_t batch) {
  return Rank0Load(engine, source, shard, replicate, batch).run();
}

LoadStats load_parallel(Engine& engine, WeightSource& source) {
  LoadStats st;
  for (auto& u : engine.shards()) {
    at::Tensor host = host_shard(u);
    st.elements_read += read_own_slices(u.plan, u.shard_rank, source, host.data_ptr<float>());
    finish_shard(u, host);
  }
  return st;
}

LoadStats load_naive(Engine& engine, WeightSource& source) {
  LoadStats st;
  // Every tensor of the model, whole, in fp32: the memory a "load everything, then shard" loader needs.
  std::map<std::string, at::Tensor> full;
  for (const auto& u : engine.shards())
    for (const auto& slot : u.plan.params) {
      at::Tensor t = at::empty({slot.numel}, at::TensorOptions().dtype(at::kFloat));
      source.read(slot.name, slot.shape, 0, slot.numel, t.data_ptr<float>());
      st.elements_read += slot.numel;
      st.staging_bytes += slot.numel * static_cast<int64_t>(sizeof(float));
      full.emplace(slot.name, std::move(t));
    }
  for (auto& u : engine.shards()) {
    at::Tensor host = host_shard(u);
    float* dst = host.data_ptr<float>();
    for (const auto& s : u.plan.slices(u.shard_rank)) {
      const float* src = full.at(u.plan.params[s.param].name).data_ptr<float>() + s.param_offset;
      std::copy(src, src + s.length, dst + s.shard_offset);
    }
    zero_gaps(u.plan, u.shard_rank, dst);
    finish_shard(u, host);
  }
  return st;
}

// The frozen groups (LoRA's base), one unit at a time through an fp32 chunk per rank that the
// engine encodes into its storage: in rank0 mode the root reads the whole unit into an fp32 staging
// buffer and scatters it over the shard group (its read error agreed on first), and replicas get
// the chunk by broadcast; otherwise each rank reads its own slices.
void load_frozen(Engine& engine, WeightSource* source, LoadMode mode, comm::Communicator& shard,
                 comm::Communicator& replicate, LoadStats& st) {
  const bool root = shard.rank() == 0 && replicate.rank() == 0;
  for (size_t ui = 0; ui < engine.frozen_shards().size(); ++ui) {
    const FrozenShard& fz = engine.frozen_shards()[ui];
    if (!fz.stored.defined()) continue;
    at::Tensor chunk = at::zeros({fz.plan.chunk}, at::TensorOptions().dtype(at::kFloat));
    if (mode != LoadMode::Rank0) {
      st.elements_read += read_own_slices(fz.plan, fz.shard_rank, *source, chunk.data_ptr<float>());
    } else {
      at::Tensor flat;
      std::string wire;
      if (root && replicate.rank() == 0) {
        flat = at::empty({fz.plan.padded_total}, at::TensorOptions().dtype(at::kFloat));
        st.staging_bytes = std::max<int64_t>(st.staging_bytes, flat.nbytes());
        try {
          st.elements_read += read_flat_unit(fz.plan, *source, flat.data_ptr<float>());
        } catch (const std::exception& e) {
          wire = encode_error(e);
        }
      }
      agree_on_read(shard, replicate, wire);
      if (replicate.rank() == 0) shard.scatter_into(chunk, flat, 0)->wait();
      if (replicate.size() > 1) replicate.broadcast(chunk, 0)->wait();
    }
    engine.set_frozen(static_cast<int>(ui), chunk);
  }
}

}  // namespace

LoadStats load_weights(Engine& engine, WeightSource* source, LoadMode mode, const comm::ProcessGroups* host_groups,
                       int64_t batch_elems) {
  memory::Scope memory_scope(memory::Category::Loader);
  TESSERA_CHECK(batch_elems > 0, "load_weights: batch_elems must be positive");
  const auto t0 = std::chrono::steady_clock::now();
  LoadStats st;
  if (mode == LoadMode::Rank0) {
    comm::Communicator* shard = &engine.shard_group();
    comm::Communicator* replicate = &engine.replicate_group();
    GroupLayout host;  // the engine's layout over the host groups
    if (host_groups) {
      host = layout_for(engine.options().strategy, *host_groups);
      shard = host.shard.get();
      replicate = host.replicate.get();
    }
    TESSERA_CHECK(shard->device().is_cpu() && replicate->device().is_cpu(),
                  "model.load=rank0 moves host memory: pass the CPU (MPI) groups when the engine's groups live on " +
                      shard->device().str());
    TESSERA_CHECK(shard->size() == engine.shard_group().size() && shard->rank() == engine.shard_group().rank() &&
                      replicate->size() == engine.replicate_group().size() &&
                      replicate->rank() == engine.replicate_group().rank(),
                  "load_weights: the host groups do not match the engine's shard/replicate layout");
    st = load_rank0(engine, source, *shard, *replicate, batch_elems);
    load_frozen(engine, source, mode, *shard, *replicate, st);
  } else {
    TESSERA_CHECK(source != nullptr, "model.load=" + to_string(mode) + " needs a weight source on every rank");
    st = mode == LoadMode::Naive ? load_naive(engine, *source) : load_parallel(engine, *source);
    load_frozen(engine, source, mode, engine.shard_group(), engine.replicate_group(), st);
  }
  for (const auto& u : engine.shards()) {
    st.shard_bytes += u.master.numel() * static_cast<int64_t>(sizeof(float));
    st.largest_unit_bytes = std::max<int64_t>(st.largest_unit_bytes, u.plan.padded_total * sizeof(float));
  }
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

}  // namespace tessera::fsdp
