// optim.in_backward under mpirun (np 1, 2, 4): each unit's AdamW update runs in backward as soon as
// its gradient shard is final (fsdp::Engine::on_grad_ready) and the shard is released.
//  - With clipping off it is the ordinary step, bit for bit: masters, moments and losses, under
//    full_shard, shard_grad_op and no_shard, fp32 and bf16 compute, with and without accumulation.
//  - The gradient shards of all units are never alive together: at the step's memory peak the
//    tracker holds fewer gradient-shard bytes than the ordinary step (and no more than the planner's
//    term, the largest unit's shard), and none after the step.
//  - A non-finite loss (known before backward) skips the step with every unit untouched; a
//    non-finite gradient with a finite loss stops the run on every rank.
//  - clip > 0 and fp16 are refused, at config check and by the trainer.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "launcher/config.h"
#include "runtime/memory/tracker.h"
#include "runtime/planner/memory_formula.h"
#include "util/error.h"
#include "tests/support/train_support.h"

namespace test_in_backward {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace tessera;

namespace {

const model::ModelConfig& four_layers() { return test::four_layer_model(); }
std::shared_ptr<data::TokenDataset> rows() { return test::numbered_rows("line", 31, 97, "in-backward"); }

// test::short_run, without clipping, `accum` micro-steps, 4 steps at lr 3e-3.
train::Settings options(bool in_backward, int64_t accum = 2) {
  train::Settings t = test::short_run();
  t.train.steps = 4;
  t.train.grad_accum = accum;
  t.schedule.lr = 3e-3;
  t.optim.clip = 0;
  t.optim.in_backward = in_backward;
  return t;
}

std::unique_ptr<train::Trainer> trainer(const train::Settings& t, fsdp::Options fo = {}) {
  auto tr = std::make_unique<train::Trainer>(launcher::make_causal_lm(four_layers()), test::world_groups(), fo, t,
                                             rows(), nlohmann::json::object());
  test::init_weights(*tr, four_layers());
  return tr;
}
const comm::ProcessGroups& world() { return test::world_groups(); }

void expect_same_bits(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << what << ": tensor " << i;
}

}  // namespace

TEST(InBackward, EqualsTheOrdinaryStepBitForBitWithoutClipping) {
  struct Case {
    fsdp::Strategy strategy;
    at::ScalarType dtype;
    int64_t accum;
  };
  for (const Case c : {Case{fsdp::Strategy::FullShard, at::kFloat, 2}, Case{fsdp::Strategy::FullShard, at::kBFloat16, 1},
                       Case{fsdp::Strategy::ShardGradOp, at::kFloat, 1}, Case{fsdp::Strategy::NoShard, at::kBFloat16, 2}}) {
    const std::string what = fsdp::to_string(c.strategy) + " " + c10::toString(c.dtype) + " accum " + std::to_string(c.accum);
    fsdp::Options fo;
    fo.strategy = c.strategy;
    fo.param_dtype = c.dtype;
    auto plain = trainer(options(false, c.accum), fo), early = trainer(options(true, c.accum), fo);
    for (int s = 0; s < 2; ++s) {
      const train::StepRecord a = plain->train_step(), b = early->train_step();
      EXPECT_EQ(a.loss, b.loss) << what << ", step " << s + 1;
      EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-9 * a.grad_norm) << what << ": the norm is summed per unit";
    }
    expect_same_bits(test::local_state(*plain), test::local_state(*early), what);
  }
}

TEST(InBackward, GradientShardsAreNeverAllAliveTogether) {
  auto grad_bytes_at_peak = [](bool in_backward) {
    auto tr = trainer(options(in_backward, 1));
    tr->train_step();
    const train::StepRecord r = tr->train_step();
    if (in_backward) {
      for (const auto& sh : tr->engine().shards()) EXPECT_FALSE(sh.grad.defined()) << sh.name << " kept its gradient";
    }
    return r.memory.tracked.bytes[static_cast<int>(memory::Category::GradShard)];
  };
  const int64_t plain = grad_bytes_at_peak(false), early = grad_bytes_at_peak(true);
  EXPECT_GT(plain, 0);
  EXPECT_LT(early, plain) << "gradient-shard bytes at the step's peak: in backward " << early << ", ordinary " << plain;
  // The planner's term: the largest unit's shard (4 bytes an element) instead of every unit's.
  planner::RunShape run;
  run.world = run.ranks_per_node = world().world->size();
  run.align = fsdp::Options{}.align;
  run.optimizer_in_backward = true;
  const planner::Plan plan = planner::estimate(launcher::memory_shape(four_layers()), {}, run);
  const int64_t predicted = plan.train_host.bytes.bytes[static_cast<int>(memory::Category::GradShard)];
  EXPECT_LE(early, predicted);
  run.optimizer_in_backward = false;
  EXPECT_LT(predicted, planner::estimate(launcher::memory_shape(four_layers()), {}, run)
                           .train_host.bytes.bytes[static_cast<int>(memory::Category::GradShard)]);
}

TEST(InBackward, NonFiniteLossSkipsTheStepWithEveryUnitUntouched) {
  const int last = world().world->size() - 1;
  test::FaultScope fault("nan-loss@" + std::to_string(last) + ":2");
  auto tr = trainer(options(true));
  tr->train_step();
  const auto before = test::local_state(*tr);
  const train::StepRecord r = tr->train_step();
  EXPECT_TRUE(r.skipped);
  expect_same_bits(before, test::local_state(*tr), "the skipped step");
  EXPECT_FALSE(tr->train_step().skipped);  // the next step trains
}

TEST(InBackward, NonFiniteGradientStopsTheRunOnEveryRank) {
  test::FaultScope fault("inf-grad@0:2");
  auto tr = trainer(options(true));
  tr->train_step();
  const std::string msg = test::error_of([&] { tr->train_step(); });
  EXPECT_NE(msg.find("non-finite gradient norm with optim.in_backward"), std::string::npos) << msg;
}

TEST(InBackward, ClippingAndFp16AreRefused) {
  test::expect_input_error([] { launcher::Config::from_json({{"optim", {{"in_backward", true}}}}, "run.json", {}); },
                           {"run.json", "optim.in_backward", "train.clip", "train.clip = 0"});
  test::expect_input_error(
      [] {
        launcher::Config::from_json({{"optim", {{"in_backward", true}}}, {"train", {{"clip", 0}}}},
                                    "run.json", {"fsdp.mixed_precision=fp16"});
      },
      {"optim.in_backward", "fp16", "fsdp.mixed_precision"});
  EXPECT_NO_THROW(launcher::Config::from_json({{"optim", {{"in_backward", true}}}, {"train", {{"clip", 0}}}}, "run.json", {}));
  auto t = options(true);
  t.optim.clip = 1.0;
  test::expect_input_error([&] { trainer(t); }, {"optim.in_backward", "train.clip"});
}

}  // namespace test_in_backward
