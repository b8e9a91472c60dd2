// fsdp.offload in the memory model and at config check: where each category's bytes live (device or
// host) alone and combined with optim.in_backward and optim.state_dtype, the PCIe bytes per step,
// the suggestions of a run that does not fit, and the key's bad input (one line naming it).
#include <gtest/gtest.h>

#include <cstdlib>

#include "launcher/config.h"
#include "launcher/model_lm.h"
#include "launcher/plan.h"
#include "launcher/run_options.h"
#include "model/config.h"
#include "runtime/checkpoint/layout.h"
#include "tests/support/test_support.h"

namespace test_offload_plan {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace tessera;
using namespace tessera::launcher;

namespace {

int cat(memory::Category c) { return static_cast<int>(c); }

// Llama 2 7B on one node of 8 GPUs, bf16 compute and reduction, with `sets` on top.
planner::Plan plan_7b(const std::vector<std::string>& more) {
  std::vector<std::string> sets = {"fsdp.mixed_precision=bf16", "fsdp.reduce_dtype=bf16", "model.preset=llama2-7b"};
  sets.insert(sets.end(), more.begin(), more.end());  // later --set values win
  PlanRequest req;
  req.world = req.ranks_per_node = 8;
  req.gpu = true;
  return plan_run(Config::load("", sets), model::ModelConfig::preset("llama2-7b"), req);
}

}  // namespace

TEST(OffloadPlan, OptimizerMovesTheShardStateToTheHost) {
  const planner::Plan none = plan_7b({}), opt = plan_7b({"fsdp.offload=optimizer"});
  const int64_t c = opt.shard_elements;
  ASSERT_EQ(c, none.shard_elements);
  const memory::Snapshot& gpu = opt.train_gpu.bytes;
  const memory::Snapshot& host = opt.train_host.bytes;
  for (const memory::Category k : {memory::Category::Master, memory::Category::GradShard, memory::Category::Optimizer})
    EXPECT_EQ(gpu.bytes[cat(k)], 0) << memory::name(k) << " stays on the GPU";
  EXPECT_EQ(host.bytes[cat(memory::Category::Master)], 4 * c);
  EXPECT_EQ(host.bytes[cat(memory::Category::Optimizer)], 8 * c);
  EXPECT_GE(host.bytes[cat(memory::Category::GradShard)], 4 * c);  // plus a chunk staged while it is added
  EXPECT_EQ(host.total(), host.host_total()) << "the host snapshot holds host bytes only";
  // The GPU keeps the bf16 parameter shard instead: 16 bytes per shard element go, 2 come.
  EXPECT_EQ(gpu.bytes[cat(memory::Category::ParamShard)], 2 * c);
  EXPECT_EQ(gpu.host_total(), 0);
  const int64_t saved = none.train_gpu.total() - opt.train_gpu.total();
  EXPECT_NEAR(static_cast<double>(saved), 14.0 * c, 0.02 * 14.0 * c);
  // Loading and a synchronous save keep the masters on the host, with no snapshot.
  EXPECT_EQ(opt.load_other.bytes.bytes[cat(memory::Category::Master)], 4 * c);
  EXPECT_EQ(opt.save_host.bytes.bytes[cat(memory::Category::Checkpoint)], 0);
}

// checkpoint.async is the knob of the save's host cost: a synchronous save streams a GPU's shards
// down through one staging buffer, an asynchronous one snapshots master and moments on the host.
TEST(OffloadPlan, ASynchronousSaveStreamsTheGpuShardsAnAsyncOneSnapshotsThem) {
  const planner::Plan sync = plan_7b({}), async = plan_7b({"checkpoint.async=true"});
  const int k = cat(memory::Category::Checkpoint);
  const int64_t c = sync.shard_elements;
  EXPECT_EQ(sync.save_host.bytes.bytes[k], checkpoint::kStagingBytes);
  EXPECT_EQ(async.save_host.bytes.bytes[k], 12 * c);  // fp32 master and two fp32 moments
  EXPECT_LT(sync.save_host.total() * 20, async.save_host.total());  // the process base and 4 MiB vs 9.6 GiB
  const planner::Plan q8 = plan_7b({"checkpoint.async=true", "optim.state_dtype=int8"});
  const int64_t c8 = q8.shard_elements;  // shards aligned to whole blocks of 2048
  EXPECT_EQ(q8.save_host.bytes.bytes[k], 6 * c8 + 8 * c8 / 2048);  // the master, 8-bit moments and their scales
}

TEST(OffloadPlan, ParamsAlsoMovesTheParameterShard) {
  const planner::Plan opt = plan_7b({"fsdp.offload=optimizer"}), par = plan_7b({"fsdp.offload=params"});
  const int64_t c = par.shard_elements;
  EXPECT_EQ(par.train_gpu.bytes.bytes[cat(memory::Category::ParamShard)], 0);
  EXPECT_EQ(par.train_host.bytes.bytes[cat(memory::Category::ParamShard)], 2 * c);
  EXPECT_LT(par.train_gpu.total(), opt.train_gpu.total());
  // fp32 compute: the master is the parameter shard, nothing more on the host.
  const planner::Plan f32 = plan_7b({"fsdp.offload=params", "fsdp.mixed_precision=fp32", "fsdp.reduce_dtype=fp32"});
  EXPECT_EQ(f32.train_host.bytes.bytes[cat(memory::Category::ParamShard)], 0);
}

TEST(OffloadPlan, CombinesWithInBackwardAndInt8Moments) {
  const planner::Plan opt = plan_7b({"fsdp.offload=optimizer"});
  const planner::Plan ib = plan_7b({"fsdp.offload=optimizer", "optim.in_backward=true", "train.clip=0"});
  const planner::Plan q8 = plan_7b({"fsdp.offload=optimizer", "optim.state_dtype=int8"});
  const int g = cat(memory::Category::GradShard), o = cat(memory::Category::Optimizer);
  // in_backward: one unit's gradient shard on the host instead of every unit's.
  EXPECT_LT(ib.train_host.bytes.bytes[g], opt.train_host.bytes.bytes[g] / 10);
  EXPECT_EQ(ib.train_gpu.bytes.bytes[g], 0);
  // ... and the next unit's too: the host optimizer thread updates one unit while the backward
  // reduces the next (a Llama 2 7B layer's shard over 8 ranks: 25.3M elements).
  const planner::Plan inline_ib = plan_7b({"optim.in_backward=true", "train.clip=0"});
  EXPECT_GT(ib.train_host.bytes.bytes[g], inline_ib.train_gpu.bytes.bytes[g] + 4 * 25'000'000);
  // int8 moments: 2 + 8/2048 bytes per element, on the host.
  EXPECT_EQ(q8.train_host.bytes.bytes[o], 2 * q8.shard_elements + 8 * q8.shard_elements / 2048);
  EXPECT_EQ(q8.train_gpu.bytes.bytes[o], 0);
  EXPECT_LT(q8.train_host.total(), opt.train_host.total());
}

TEST(OffloadPlan, PcieBytesPerStep) {
  const planner::Plan none = plan_7b({});
  EXPECT_EQ(none.pcie.up + none.pcie.down, 0);
  // optimizer: the bf16 gradient chunks down each micro-step, the bf16 parameter shard up once.
  const planner::Plan opt = plan_7b({"fsdp.offload=optimizer", "train.grad_accum=4"});
  const int64_t c = opt.shard_elements;
  EXPECT_EQ(opt.pcie.down, 4 * 2 * c);
  EXPECT_EQ(opt.pcie.up, 2 * c);
  // unsharded accumulation reduces (and copies down) once per step.
  EXPECT_EQ(plan_7b({"fsdp.offload=optimizer", "train.grad_accum=4", "fsdp.accumulate=unsharded"}).pcie.down, 2 * c);
  // params: the parameter shard up before every all-gather: each unit in forward, each layer again
  // in backward (full_shard), every micro-step.
  const model::ModelConfig mc = model::ModelConfig::preset("llama2-7b");
  const planner::ModelShape shape = memory_shape(mc);
  const int64_t root_chunk = fsdp::ShardPlan::make(shape.units[0], 8, fsdp::Options{}.align).chunk;
  const planner::Plan par = plan_7b({"fsdp.offload=params", "train.grad_accum=2"});
  EXPECT_EQ(par.pcie.up, 2 * 2 * (2 * c - root_chunk));
  EXPECT_EQ(par.pcie.down, 2 * 2 * c);
  // shard_grad_op keeps the layers gathered into backward: one copy up per unit and micro-step.
  EXPECT_EQ(plan_7b({"fsdp.offload=params", "fsdp.strategy=shard_grad_op"}).pcie.up, 2 * c);
  EXPECT_GT(opt.pcie.seconds(planner::kPcieBytesPerSecond), 0.0);
}

TEST(OffloadPlan, SuggestedWhenNothingElseFits) {
  // Llama 2 70B on one node of 8 x 80 GiB, fp32 moments and no recomputation knob left to turn:
  // offload is among the single changes that fit, and says what it puts on the host.
  const model::ModelConfig mc = model::ModelConfig::preset("llama2-70b");
  PlanRequest req;
  req.world = req.ranks_per_node = 8;
  req.gpu = true;
  req.gpu_mem = int64_t(80) << 30;
  const Config cfg = Config::load("", {"model.preset=llama2-70b", "fsdp.mixed_precision=bf16", "data.seq_len=4096",
                                       "train.micro_batch=1", "fsdp.activation_checkpointing=true"});
  ASSERT_FALSE(why_not_fit(plan_run(cfg, mc, req), req).empty());
  std::string impossible;
  const nlohmann::json fixes = fitting_changes(cfg, mc, req, &impossible);
  bool offered = false;
  for (const auto& f : fixes) offered |= f["change"].get<std::string>().rfind("fsdp.offload=", 0) == 0;
  EXPECT_TRUE(offered) << fixes.dump();
  // With a host limit the offloaded run's host memory is checked, and the reason names the key.
  req.host_mem = int64_t(512) << 30;
  const std::string why = why_not_fit(plan_run(Config::load("", {"model.preset=llama2-70b", "fsdp.offload=optimizer",
                                                                 "fsdp.mixed_precision=bf16"}),
                                               mc, req),
                                      req);
  EXPECT_NE(why.find("host RAM"), std::string::npos) << why;
  EXPECT_NE(why.find("fsdp.offload=optimizer"), std::string::npos) << why;
}

TEST(OffloadConfig, ReachesTheEngineAndRoundTrips) {
  const model::ModelConfig mc = model::ModelConfig::preset("tiny");
  EXPECT_EQ(fsdp_options_from(Config::load("", {}), mc).offload, fsdp::Offload::None);
  const Config c = Config::load("", {"fsdp.offload=params"});
  EXPECT_EQ(fsdp_options_from(c, mc).offload, fsdp::Offload::Params);
  EXPECT_EQ(c.json()["fsdp"]["offload"], "params");
  EXPECT_EQ(Config::from_json(c.json(), "run.json").fsdp.offload, fsdp::Offload::Params);
}

TEST(OffloadConfig, BadValueIsOneLineNamingTheKey) {
  EXPECT_INPUT_ERROR(Config::load("", {"fsdp.offload=cpu"}), "fsdp.offload", "none, optimizer, params");
  EXPECT_INPUT_ERROR(Config::from_json({{"fsdp", {{"offload", true}}}}, "run.json"), "run.json", "fsdp.offload", "string");
}

TEST(OffloadConfig, EveryCombinationThatWorksIsAccepted) {
  // The rule (docs/MEMORY.md#host-offload-fsdpoffload): offload combines with every strategy, compute dtype
  // (fp32 params: the master is the host's parameter shard), accumulation, optim.in_backward and
  // optim.state_dtype; what is refused is a value not among the choices, and a run whose host
  // memory the plan says does not fit (tessera train before loading, tessera plan).
  for (const char* strategy : {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard"})
    for (const char* offload : {"optimizer", "params"})
      for (const char* dtype : {"fp32", "bf16"})
        EXPECT_NO_THROW(Config::load("", {std::string("fsdp.strategy=") + strategy, std::string("fsdp.offload=") + offload,
                                          std::string("fsdp.mixed_precision=") + dtype, "optim.in_backward=true",
                                          "train.clip=0", "optim.state_dtype=int8", "fsdp.accumulate=unsharded"}))
            << strategy << " " << offload << " " << dtype;
}

TEST(OffloadPlan, TesseraPlanPrintsHostBytesAndPcie) {
  const char* bin = std::getenv("TESSERA_BIN");  // ctest sets it
  if (bin == nullptr) GTEST_SKIP() << "TESSERA_BIN is not set";
  const std::string out = test::run_capture(std::string(bin) +
                                            "/tessera plan --set model.preset=llama2-7b --set fsdp.mixed_precision=bf16 "
                                            "--set fsdp.offload=params --nodes 1 --gpus-per-node 8 --gpu-mem 80GiB");
  for (const char* line : {"fsdp.offload=params", "training step on the host by category: master ", "GPU per node: ",
                           "PCIe per rank and step (fsdp.offload=params): ", "down (gradient shards)", "up (parameter shards)"})
    EXPECT_NE(out.find(line), std::string::npos) << line << " in:\n" << out;
}

// The floor of optim.in_backward holds no gradient shard: each unit's is updated and released as
// its reduction retires, and the unit's full gradients (counted in the floor) outweigh it.
TEST(OffloadPlan, TheFloorOfInBackwardHasNoGradientShards) {
  const planner::Plan plain = plan_7b({"train.clip=0"}), ib = plan_7b({"optim.in_backward=true", "train.clip=0"});
  EXPECT_EQ(plain.train_floor - ib.train_floor, 4 * plain.shard_elements);
}

}  // namespace test_offload_plan
