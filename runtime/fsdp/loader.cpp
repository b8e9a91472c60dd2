#include "runtime/fsdp/loader.h"

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <map>

#include "runtime/error.h"

namespace tessera::fsdp {

LoadMode parse_load_mode(const std::string& s) {
  if (s == "rank0") return LoadMode::Rank0;
  if (s == "parallel") return LoadMode::Parallel;
  if (s == "naive") return LoadMode::Naive;
  throw TESSERA_INPUT_ERROR("model.load '" + s + "' is not one of rank0, parallel, naive");
}

std::string to_string(LoadMode m) {
  switch (m) {
    case LoadMode::Rank0: return "rank0";
    case LoadMode::Parallel: return "parallel";
    case LoadMode::Naive: return "naive";
  }
  return "?";
}

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

// The root's read error (empty when none) on every rank of the shard group and then of the
// replicate group, so that a failure stops every rank before the next collective instead of
// leaving the others waiting in a scatter. Encoded as "<exit code>|message".
void agree_on_read(Engine& engine, bool root, const std::string& root_error) {
  std::string status = engine.shard_group().broadcast_string(root ? root_error : std::string(), 0);
  if (engine.replicate_group().size() > 1) status = engine.replicate_group().broadcast_string(status, 0);
  if (status.empty()) return;
  const auto bar = status.find('|');
  const int code = std::stoi(status.substr(0, bar));
  throw Error(code == 2 ? ErrorKind::Input : ErrorKind::Internal,
              "loading weights (model.load=rank0), error on the reading rank: " + status.substr(bar + 1));
}

LoadStats load_rank0(Engine& engine, WeightSource* source) {
  comm::Communicator& shard = engine.shard_group();
  comm::Communicator& replicate = engine.replicate_group();
  LoadStats st;
  st.root = shard.rank() == 0 && replicate.rank() == 0;
  const bool reader_replica = replicate.rank() == 0;  // the replica whose shard group the root scatters over
  auto& units = engine.shards();

  // The root's two staging buffers (unit u uses buffer u % 2), sized for the largest unit.
  std::array<at::Tensor, 2> staging;
  std::array<comm::WorkPtr, 2> in_flight;  // the scatter reading each staging buffer
  if (st.root) {
    int64_t largest = 0;
    for (const auto& u : units) largest = std::max(largest, u.plan.padded_total);
    for (auto& b : staging) b = at::empty({largest}, at::TensorOptions().dtype(at::kFloat));
    st.staging_bytes = 2 * largest * static_cast<int64_t>(sizeof(float));
  }

  std::vector<comm::WorkPtr> broadcasts;
  for (size_t ui = 0; ui < units.size(); ++ui) {
    UnitShard& u = units[ui];
    const int b = static_cast<int>(ui % 2);
    at::Tensor flat;
    std::string error;
    if (st.root) {
      if (in_flight[b]) in_flight[b]->wait();  // unit ui-2's scatter has finished with this buffer
      flat = staging[b].narrow(0, 0, u.plan.padded_total);
      try {
        TESSERA_CHECK(source != nullptr, "model.load=rank0: the reading rank has no weight source");
        st.elements_read += read_flat_unit(u.plan, *source, flat.data_ptr<float>());
      } catch (const Error& e) {
        error = std::to_string(e.exit_code()) + "|" + e.what();
      } catch (const std::exception& e) {  // model/ format errors are bad input
        error = "2|" + std::string(e.what());
      }
    }
    agree_on_read(engine, st.root, error);
    if (reader_replica) in_flight[b] = shard.scatter_into(u.master, flat, 0);
    if (replicate.size() > 1) {
      // Replicas receive the same shard from the reading replica's rank with the same shard rank.
      if (reader_replica) in_flight[b]->wait();
      broadcasts.push_back(replicate.broadcast(u.master, 0));
    }
  }
  for (auto& w : in_flight)
    if (w) w->wait();
  for (auto& w : broadcasts) w->wait();
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
    float* dst = u.master.data_ptr<float>();
    u.master.zero_();
    for (const auto& s : u.plan.slices(u.shard_rank)) {
      const float* src = full.at(u.plan.params[s.param].name).data_ptr<float>() + s.param_offset;
      std::copy(src, src + s.length, dst + s.shard_offset);
    }
  }
  return st;
}

}  // namespace

LoadStats load_weights(Engine& engine, WeightSource* source, LoadMode mode) {
  const auto t0 = std::chrono::steady_clock::now();
  LoadStats st;
  if (mode == LoadMode::Rank0) {
    st = load_rank0(engine, source);
  } else {
    TESSERA_CHECK(source != nullptr, "model.load=" + to_string(mode) + " needs a weight source on every rank");
    if (mode == LoadMode::Naive) {
      st = load_naive(engine, *source);
    } else {
      for (auto& u : engine.shards()) u.master.zero_();  // gaps and padding; slices overwrite the rest
      engine.load(*source);
      for (const auto& u : engine.shards()) st.elements_read += u.plan.chunk - u.plan.padding(u.shard_rank);
    }
  }
  for (const auto& u : engine.shards()) {
    st.shard_bytes += u.master.numel() * static_cast<int64_t>(sizeof(float));
    st.largest_unit_bytes = std::max<int64_t>(st.largest_unit_bytes, u.plan.padded_total * sizeof(float));
  }
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

}  // namespace tessera::fsdp
