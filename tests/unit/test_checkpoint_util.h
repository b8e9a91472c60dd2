// Shared by tests/unit/test_checkpoint.cpp and tests/mpi/test_checkpoint*.cpp: an FSDP engine over
// the `tiny` Llama's real parameter names and shapes (CPU tensors, identity layers: checkpoints only
// touch the shards), filled with values that are a pure function of (seed, tensor, kind, element),
// so any rank at any world size knows what its shard must hold after a load. The helpers every
// test shares (files, error_of) are tests/support/test_support.h's.
#pragma once
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/llama.h"
#include "model/safetensors.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/fsdp/fsdp.h"
#include "util/error.h"
#include "tests/support/test_support.h"

namespace ckpt_test {

namespace fs = std::filesystem;
using namespace tessera;
using tessera::checkpoint::Checkpointer;
using tessera::checkpoint::latest;
using tessera::test::error_of;
using tessera::test::read_file;
using tessera::test::write_file;

inline model::ModelConfig tiny_config(int64_t hidden = 128) {
  model::ModelConfig c = model::ModelConfig::preset("tiny");
  c.hidden_size = hidden;
  return c;
}

// Root unit (embeddings, final norm, lm_head) then one unit per decoder layer, like the trainer.
inline std::vector<fsdp::UnitDef> llama_units(const model::ModelConfig& cfg) {
  std::vector<fsdp::UnitDef> units(1);
  units[0].name = "root";
  for (const auto& s : model::hf_tensor_specs(cfg))
    if (s.name.rfind("model.layers.", 0) != 0) units[0].params.emplace_back(s.name, at::empty(s.shape));
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    fsdp::UnitDef u;
    u.name = "layer." + std::to_string(i);
    for (const auto& s : model::hf_layer_specs(cfg, i)) u.params.emplace_back(s.name, at::empty(s.shape));
    units.push_back(std::move(u));
  }
  return units;
}

// An engine plus the optimizer-like state a trainer checkpoints with it: kinds[0] is the engine's
// "param" (its masters), kinds[1..2] two moment tensors per unit ("exp_avg", "exp_avg_sq").
struct TestEngine : fsdp::Engine {
  using fsdp::Engine::Engine;
  std::vector<NamedShards> kinds;
};

inline std::unique_ptr<TestEngine> make_engine(const comm::ProcessGroups& groups,
                                               fsdp::Strategy strategy = fsdp::Strategy::FullShard,
                                               const model::ModelConfig& cfg = tiny_config(), int64_t align = 16) {
  fsdp::Options o;
  o.strategy = strategy;
  o.align = align;
  auto e = std::make_unique<TestEngine>(
      llama_units(cfg), [](int64_t, const at::Tensor& h) { return h; }, groups, o,
      [](const std::string& n) { return !model::is_norm_weight(n); });
  e->kinds = {e->named_state(), {"exp_avg", {}}, {"exp_avg_sq", {}}};
  for (const auto& u : e->shards())
    for (int k = 1; k < 3; ++k) e->kinds[k].per_unit.push_back(at::zeros({u.plan.chunk}));
  return e;
}

inline comm::ProcessGroups self_groups() {
  return {comm::make_self_communicator("world"), comm::make_self_communicator("intra"),
          comm::make_self_communicator("inter")};
}

// Deterministic value of element `i` of tensor (name, kind) for `seed` (exactly representable).
inline float value(uint64_t seed, const std::string& name, int kind, int64_t i) {
  uint64_t h = 1469598103934665603ull ^ (seed * 0x9E3779B97F4A7C15ull);
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  h ^= static_cast<uint64_t>(kind + 1) * 0xC2B2AE3D27D4EB4Full + static_cast<uint64_t>(i) * 0x165667B19E3779F9ull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return static_cast<float>(static_cast<int64_t>(h % 2000001) - 1000000) / 65536.0f;
}

inline at::Tensor& kind_tensor(TestEngine& e, size_t unit, int k) { return e.kinds[k].per_unit[unit]; }

// Fills this rank's shards (params and moments) with value(seed, ...); padding stays zero.
inline void fill(TestEngine& e, uint64_t seed) {
  for (size_t ui = 0; ui < e.shards().size(); ++ui) {
    const auto& u = e.shards()[ui];
    for (int k = 0; k < 3; ++k) {
      at::Tensor& t = kind_tensor(e, ui, k);
      t.zero_();
      float* d = t.data_ptr<float>();
      for (const auto& s : u.plan.slices(u.shard_rank))
        for (int64_t j = 0; j < s.length; ++j) d[s.shard_offset + j] = value(seed, u.plan.params[s.param].name, k, s.param_offset + j);
    }
  }
}

// Elements of this rank's shards that differ from value(seed, ...) (padding must be zero).
inline int64_t mismatches(TestEngine& e, uint64_t seed) {
  int64_t bad = 0;
  for (size_t ui = 0; ui < e.shards().size(); ++ui) {
    const auto& u = e.shards()[ui];
    for (int k = 0; k < 3; ++k) {
      at::Tensor expect = at::zeros({u.plan.chunk});
      float* d = expect.data_ptr<float>();
      for (const auto& s : u.plan.slices(u.shard_rank))
        for (int64_t j = 0; j < s.length; ++j) d[s.shard_offset + j] = value(seed, u.plan.params[s.param].name, k, s.param_offset + j);
      bad += at::ne(expect, kind_tensor(e, ui, k)).sum().item<int64_t>();
    }
  }
  return bad;
}

// Full expected tensor of a parameter (kind 0) for `seed`.
inline at::Tensor expected_param(uint64_t seed, const std::string& name, const std::vector<int64_t>& shape) {
  at::Tensor t = at::empty(shape);
  float* d = t.data_ptr<float>();
  for (int64_t i = 0; i < t.numel(); ++i) d[i] = value(seed, name, 0, i);
  return t;
}

inline nlohmann::json test_state(int64_t step, const model::ModelConfig& cfg = tiny_config()) {
  return {{"step", step},
          {"sampler", {{"epoch", 1}, {"position", 40 + step}}},
          {"rng", {{"seed", 1234}}},
          {"config", {{"train", {{"steps", 100}}}}},
          {"model_config", cfg.to_json()},
          {"strategy", "full_shard"},
          {"optimizer", {{"step_count", step}}}};
}

// checkpoint.dir, keep and async of a test's checkpointer.
inline checkpoint::Policy test_policy(const std::string& dir, int64_t keep = 2, bool async = false) {
  checkpoint::Policy p;
  p.dir = dir, p.keep = keep, p.async = async;
  return p;
}

// A test with a checkpoint directory of its own, `dir` (fresh, removed after the test).
class CheckpointDirTest : public ::testing::Test {
 protected:
  // Saves `steps` (values seeded by the step) with a fresh engine into `root` (default: dir);
  // returns the last step's directory.
  std::string save_steps(const std::vector<int64_t>& steps, int64_t keep = 2, std::string root = "") {
    auto e = make_engine(self_groups());
    checkpoint::Checkpointer ck(test_policy(root.empty() ? dir : root, keep), self_groups());
    std::string last;
    for (int64_t s : steps) {
      fill(*e, s);
      last = ck.save(s, *e, e->kinds, test_state(s)).dir;
    }
    return last;
  }

  const tessera::test::TempDir tmp{"tessera-ckpt"};
  const std::string dir = tmp.str();
};

inline void flip_byte(const std::string& path, size_t at) {
  std::string b = read_file(path);
  b.at(at) ^= 0x5A;
  write_file(path, b);
}

}  // namespace ckpt_test
