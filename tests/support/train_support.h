// The trainer-level helpers the tests/mpi training tests share, beside tests/support/test_support.h
// (which it includes). A header of its own because these reach into launcher/ (bootstrap groups, the
// init weight source) and runtime/train/, which the unit tests of runtime/ and model/ must not pull
// in (tests/CMakeLists.txt links the launcher only into tests that include a launcher/ header).
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "launcher/bootstrap.h"
#include "launcher/model_lm.h"
#include "runtime/data/dataset.h"
#include "runtime/train/trainer.h"
#include "text/tokenizer.h"
#include "tests/support/test_support.h"

namespace tessera::test {

// The process groups the MPI test main bootstrapped (world, intra- and inter-node).
inline const comm::ProcessGroups& world_groups() { return launcher::current().groups; }

// A dataset read from a file `name` holding `contents` (its format by its name, as data.path's
// files are read), byte tokenizer, rows of `seq_len` tokens. The file is gone when this returns.
inline std::shared_ptr<data::TokenDataset> dataset_of(const std::string& name, const std::string& contents,
                                                      int64_t seq_len) {
  static const text::ByteTokenizer tok;
  data::PackOptions po;
  po.seq_len = seq_len;
  const TempDir dir("tessera-dataset");
  return data::load_dataset({dir.write(name, contents)}, tok, po);
}

// The 4-layer tiny model of the step tests (in_backward, offload), made once.
inline const model::ModelConfig& four_layer_model() {
  static const model::ModelConfig c = tiny_model(4);
  return c;
}

// 200 short numbered lines ("<word> <k> of the <what> test"), as 32-token rows, made once per process.
inline std::shared_ptr<data::TokenDataset> numbered_rows(const std::string& word, int mul, int mod, const std::string& what) {
  static std::shared_ptr<data::TokenDataset> d;
  if (d) return d;
  std::string text;
  for (int i = 0; i < 200; ++i) text += word + " " + std::to_string(i * mul % mod) + " of the " + what + " test\n";
  return d = dataset_of("rows.txt", text, 32);
}

// optim.state_dtype of the moments' tensor dtype (kFloat, kBFloat16, kByte: 8-bit).
inline optim::StateDtype state_dtype_of(at::ScalarType t) {
  return t == at::kByte ? optim::StateDtype::Int8 : t == at::kBFloat16 ? optim::StateDtype::BF16 : optim::StateDtype::F32;
}

// The rows of the tests' datasets (short_run's data.seq_len).
constexpr int64_t kSeqLen = 32;

// A short run: 5 steps of 2 micro-batches of 1 row (of kSeqLen tokens), lr 2e-3 after 1 warmup
// step (the trainer prints nothing unless given a Console); a test changes what it needs.
inline train::Settings short_run() {
  train::Settings t;
  t.train.steps = 5;
  t.train.micro_batch = 1;
  t.train.grad_accum = 2;
  t.schedule.lr = 2e-3;
  t.schedule.warmup_steps = 1;
  return t;
}

// Loads `cfg`'s initial weights into the trainer as `tessera train` does without model.path
// (launcher::InitWeightSource), with the tests' seed.
inline void init_weights(train::Trainer& tr, const model::ModelConfig& cfg, uint64_t seed = 1234) {
  launcher::InitWeightSource src(cfg, seed);
  tr.load_weights(src);
}

// This rank's optimizer-visible state: every kind's tensor of every unit (masters, moments), cloned.
inline std::vector<torch::Tensor> local_state(train::Trainer& tr) {
  std::vector<torch::Tensor> out;
  for (const auto& kind : tr.state())
    for (const auto& t : kind.per_unit) out.push_back(t.defined() ? t.clone() : t);
  return out;
}
inline bool bit_identical(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].defined() != b[i].defined() || (a[i].defined() && !torch::equal(a[i], b[i]))) return false;
  return true;
}

// TESSERA_TEST_FAULT for the scope (tests/support/fault_env.cpp reads it; every rank sets the same
// value, the fault names the rank).
struct FaultScope {
  explicit FaultScope(const std::string& v) { setenv("TESSERA_TEST_FAULT", v.c_str(), 1); }
  ~FaultScope() { unsetenv("TESSERA_TEST_FAULT"); }
  FaultScope(const FaultScope&) = delete;
  FaultScope& operator=(const FaultScope&) = delete;
};

}  // namespace tessera::test
