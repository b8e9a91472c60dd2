// The numerics guard in the real trainer under mpirun (np 1, 2, 4): an inf injected into ONE rank's
// gradient shard (or a NaN into one rank's loss) at step 3 -- the test-only hook TESSERA_TEST_FAULT,
// tests/support/fault_env.cpp -- skips exactly step 3 on every rank, with every rank's fp32 masters
// and AdamW moments bit-identical across it and AdamW's step count not advanced;
// train.max_skipped_steps skips in a row end the run with the last checkpoint intact; fp32 loss
// scaling changes nothing (scale/unscale are exact); the fp16 loss scale survives a checkpoint.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "launcher/bootstrap.h"
#include "launcher/model_lm.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/data/dataset.h"
#include "runtime/train/trainer.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "tests/support/train_support.h"

namespace test_numerics_guard {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace tessera;
namespace fs = std::filesystem;

namespace {

model::ModelConfig test_config() { return test::tiny_model(2); }

const comm::ProcessGroups& world() { return test::world_groups(); }
int W() { return world().world->size(); }

std::shared_ptr<data::TokenDataset> dataset() {
  static const auto d = [] {
    std::string text;
    for (int i = 0; i < 300; ++i)
      text += "row " + std::to_string(i) + " of the numerics test " + std::to_string(i * 7919 % 1000) + "\n";
    return test::dataset_of("rows.txt", text, 32);
  }();
  return d;
}

std::unique_ptr<train::Trainer> make_trainer(const train::Settings& t, fsdp::Options fo = {}) {
  auto tr = std::make_unique<train::Trainer>(launcher::make_causal_lm(test_config()), world(), fo, t, dataset(),
                                             nlohmann::json::object());
  test::init_weights(*tr, test_config());
  return tr;
}

nlohmann::json manifest_state(const std::string& ckpt) {
  std::ifstream in(ckpt + "/manifest.json");
  return nlohmann::json::parse(in).at("state");
}

}  // namespace

// inf in the last rank's gradient shard (after the reduction: no other rank sees it in its own
// shard) and NaN in the last rank's local loss: in both cases exactly step 3 is skipped, on every rank.
TEST(NumericsGuard, InjectedNonFiniteSkipsExactlyThatStepOnEveryRank) {
  std::vector<double> clean;
  {
    auto tr = make_trainer(test::short_run());
    for (int s = 0; s < 4; ++s) clean.push_back(tr->train_step().loss);
  }
  for (const std::string kind : {"inf-grad", "nan-loss"}) {
    test::FaultScope fault(kind + "@" + std::to_string(W() - 1) + ":3");
    auto t = test::short_run();
    const test::SharedTempDir ck("tessera_numerics_skip_" + kind);
    t.checkpoint.dir = ck.str();
    auto tr = make_trainer(t);
    for (int s = 1; s <= 2; ++s) {
      train::StepRecord r = tr->train_step();
      EXPECT_FALSE(r.skipped) << kind << " step " << s;
      EXPECT_EQ(r.loss, clean[s - 1]) << kind << " step " << s;
    }
    const auto before = test::local_state(*tr);
    train::StepRecord r3 = tr->train_step();
    EXPECT_EQ(r3.step, 3);
    EXPECT_TRUE(test::on_every_rank(r3.skipped)) << kind;
    EXPECT_EQ(r3.skipped_steps, 1);
    if (kind == "inf-grad") {
      EXPECT_TRUE(std::isinf(r3.grad_norm)) << r3.grad_norm;
      EXPECT_EQ(r3.loss, clean[2]);  // the loss was fine; only the gradient was not
    } else {
      EXPECT_TRUE(std::isnan(r3.loss)) << r3.loss;
    }
    EXPECT_TRUE(test::on_every_rank(test::bit_identical(test::local_state(*tr), before)))
        << kind << ": masters or moments changed";
    // Step 3's checkpoint: the loop's step is 3, AdamW took 2 steps (GradScaler semantics).
    const std::string c3 = tr->save_checkpoint();
    MPI_Barrier(MPI_COMM_WORLD);
    nlohmann::json st = manifest_state(c3);
    EXPECT_EQ(st.at("step").get<int64_t>(), 3);
    EXPECT_EQ(st.at("optimizer").at("step_count").get<int64_t>(), 2);
    EXPECT_EQ(st.at("numerics").at("skipped_steps").get<int64_t>(), 1);
    train::StepRecord r4 = tr->train_step();
    EXPECT_FALSE(r4.skipped);
    EXPECT_EQ(r4.skipped_steps, 1);
    EXPECT_TRUE(std::isfinite(r4.loss) && std::isfinite(r4.grad_norm));
    // Step 4 moved every rank's masters (the guard does not stick).
    EXPECT_TRUE(test::on_every_rank(!test::bit_identical(test::local_state(*tr), before))) << kind;
  }
}

// train.max_skipped_steps 2, non-finite gradients at steps 3 and 4: the run stops at step 4 with one
// agreed Input error naming the key, before any save of step 4; step-3's checkpoint (saved after the
// first skip) holds exactly step-2's masters and moments, and is intact.
TEST(NumericsGuard, MaxSkippedStepsStopsTheRunAndKeepsTheLastCheckpoint) {
  test::FaultScope fault("inf-grad@0:3,inf-grad@0:4");
  auto t = test::short_run();
  t.train.steps = 6;
  t.train.max_skipped_steps = 2;
  const test::SharedTempDir ck("tessera_numerics_limit");
  t.checkpoint.dir = ck.str();
  t.checkpoint.every = 1;
  t.checkpoint.keep = 10;
  {
    auto tr = make_trainer(t);
    try {
      tr->run();
      ADD_FAILURE() << "the run did not stop";
    } catch (const CollectiveError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Input);
      const std::string m = e.what();
      EXPECT_NE(m.find("train.max_skipped_steps 2 reached: 2 optimizer steps in a row skipped (steps 3-4; last: "
                       "non-finite gradient norm (inf)); the weights and optimizer state are those after step 2; "
                       "last checkpoint " + t.checkpoint.dir + "/step-3"),
                std::string::npos)
          << m;
      EXPECT_EQ(m.find('\n'), std::string::npos);
    }
    EXPECT_EQ(tr->step(), 4);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_FALSE(fs::exists(t.checkpoint.dir + "/step-4"));
  EXPECT_TRUE(fs::exists(t.checkpoint.dir + "/step-2"));
  EXPECT_EQ(checkpoint::latest(t.checkpoint.dir), t.checkpoint.dir + "/step-3");
  std::vector<std::vector<torch::Tensor>> state;
  for (const char* step : {"step-2", "step-3"}) {
    auto again = t;
    again.checkpoint.dir.clear();
    auto tr = make_trainer(again);
    tr->resume(t.checkpoint.dir + "/" + step);
    state.push_back(test::local_state(*tr));
  }
  EXPECT_TRUE(test::on_every_rank(test::bit_identical(state[0], state[1])));
  nlohmann::json st = manifest_state(t.checkpoint.dir + "/step-3");
  EXPECT_EQ(st.at("numerics").at("consecutive_skipped").get<int64_t>(), 1);
  EXPECT_EQ(st.at("numerics").at("first_skipped_step").get<int64_t>(), 3);
}

// Loss scaling in an fp32 run: the power-of-two scale multiplies the backward and is divided out of
// the gradient shards before the norm and clipping, so losses, gradient norms and parameters equal
// the unscaled run's. (Without the unscale the norm would be 65536x and clipping would change the
// update.)
TEST(LossScaling, IsExactInFp32) {
  auto t = test::short_run();
  std::vector<train::StepRecord> plain, scaled;
  std::vector<torch::Tensor> plain_state, scaled_state;
  for (bool on : {false, true}) {
    t.train.loss_scaling = on;
    auto tr = make_trainer(t);
    auto& out = on ? scaled : plain;
    for (int s = 0; s < 4; ++s) out.push_back(tr->train_step());
    (on ? scaled_state : plain_state) = test::local_state(*tr);
  }
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(plain[i].loss_scale, 0.0);
    EXPECT_EQ(scaled[i].loss_scale, 65536.0);
    EXPECT_FALSE(scaled[i].skipped);
    EXPECT_EQ(scaled[i].loss, plain[i].loss) << "step " << i + 1;
    EXPECT_NEAR(scaled[i].grad_norm, plain[i].grad_norm, 1e-6 * plain[i].grad_norm) << "step " << i + 1;
  }
  EXPECT_GT(plain[0].grad_norm, t.optim.clip);  // clipping was active
  ASSERT_EQ(scaled_state.size(), plain_state.size());
  for (size_t i = 0; i < plain_state.size(); ++i) {
    if (!plain_state[i].defined()) continue;
    const double err = (scaled_state[i] - plain_state[i]).abs().max().item<double>();
    EXPECT_LE(err, 1e-6) << "tensor " << i;
  }
}

// fp16 gradient reduction (fsdp.reduce_dtype fp16 on CPU: a real Half path, no Half matmul) with
// loss scaling: an inf at step 2 halves the scale; the scale and the skip count are checkpointed and
// a resumed run continues with the same scale and the same losses as the run that never stopped.
TEST(LossScaling, Fp16ScaleSurvivesACheckpoint) {
  test::FaultScope fault("inf-grad@0:2");
  fsdp::Options fo;
  fo.reduce_dtype = at::kHalf;
  auto t = test::short_run();
  t.train.steps = 6;
  t.train.loss_scaling = true;
  std::vector<train::StepRecord> straight;
  {
    auto tr = make_trainer(t, fo);
    for (int s = 0; s < 6; ++s) straight.push_back(tr->train_step());
  }
  EXPECT_EQ(straight[0].loss_scale, 65536.0);
  EXPECT_FALSE(straight[0].skipped);
  EXPECT_TRUE(straight[1].skipped);
  EXPECT_EQ(straight[1].loss_scale, 65536.0);  // the scale the step ran with
  for (int s = 2; s < 6; ++s) {
    EXPECT_EQ(straight[s].loss_scale, 32768.0) << "step " << s + 1;
    EXPECT_FALSE(straight[s].skipped) << "step " << s + 1;
    EXPECT_TRUE(std::isfinite(straight[s].loss));
  }
  auto t2 = t;
  const test::SharedTempDir ck("tessera_numerics_scale");
  t2.checkpoint.dir = ck.str();
  std::string ckpt;
  {
    auto tr = make_trainer(t2, fo);
    for (int s = 0; s < 3; ++s) tr->train_step();
    ckpt = tr->save_checkpoint();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(manifest_state(ckpt).at("numerics").at("loss_scale").at("scale").get<double>(), 32768.0);
  {
    unsetenv("TESSERA_TEST_FAULT");
    train::Trainer tr(launcher::make_causal_lm(test_config()), world(), fo, t2, dataset(), nlohmann::json::object());
    EXPECT_EQ(tr.resume(ckpt), 3);
    for (int s = 3; s < 6; ++s) {
      train::StepRecord r = tr.train_step();
      EXPECT_EQ(r.loss_scale, 32768.0) << "step " << s + 1;
      EXPECT_EQ(r.loss, straight[s].loss) << "step " << s + 1;
      EXPECT_EQ(r.skipped_steps, 1);
    }
  }
}

}  // namespace test_numerics_guard
