// optim.state_dtype = int8 from the configuration to the runtime: the key's value reaches AdamW as
// the 8-bit state, the FSDP alignment becomes a whole block (so checkpoints reshard without
// re-quantizing), the planner counts 2 bytes per parameter plus the scales, a run that does not fit
// is offered int8, and a wrong value is one line naming the key and its choices.
#include <gtest/gtest.h>

#include "launcher/config.h"
#include "launcher/plan.h"
#include "launcher/run_options.h"
#include "model/config.h"
#include "runtime/optim/adamw.h"
#include "tests/support/test_support.h"

namespace test_optim_int8_config {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace tessera;
using namespace tessera::launcher;

TEST(Int8Config, ReachesTheOptimizerAndAlignsShardsToBlocks) {
  const Config c = Config::load("", {"optim.state_dtype=int8"});
  EXPECT_EQ(c.optim.state_dtype, optim::StateDtype::Int8);
  const model::ModelConfig mc = model::ModelConfig::preset("tiny");
  EXPECT_EQ(optim::AdamWOptions(c.optim).state_type(), at::kByte);  // what the trainer gives AdamW
  EXPECT_EQ(fsdp_options_from(c, mc).align % optim::q8::kDefaultBlock, 0);
  // The other dtypes keep the engine's alignment.
  const Config f = Config::load("", {"optim.state_dtype=bf16"});
  EXPECT_EQ(optim::AdamWOptions(f.optim).state_type(), at::kBFloat16);
  EXPECT_EQ(fsdp_options_from(f, mc).align, fsdp::Options{}.align);
}

TEST(Int8Config, WrongValueIsOneLineNamingTheKey) {
  EXPECT_INPUT_ERROR(Config::load("", {"optim.state_dtype=int4"}), "optim.state_dtype", "int8");
}

TEST(Int8Config, PlanCountsTwoBytesPerParameterAndTheScales) {
  // 70B-class shapes are not needed: the 7B preset on 8 ranks, fp32 vs int8 moments. The optimizer
  // category is 2 x 4 bytes (fp32) and 2 x 1 + 2 x 4 / 2048 bytes (int8) per element of the shard.
  const model::ModelConfig mc = model::ModelConfig::preset("llama2-7b");
  PlanRequest req;
  req.world = 8;
  req.ranks_per_node = 8;
  req.gpu = true;
  const int opt = static_cast<int>(memory::Category::Optimizer);
  const planner::Plan f32 = plan_run(Config::load("", {}), mc, req);
  const planner::Plan q8 = plan_run(Config::load("", {"optim.state_dtype=int8"}), mc, req);
  const int64_t elems = q8.shard_elements;
  EXPECT_EQ(q8.train_gpu.bytes.bytes[opt], 2 * elems + 8 * elems / 2048);
  EXPECT_EQ(f32.train_gpu.bytes.bytes[opt], 8 * f32.shard_elements);
  EXPECT_EQ(elems % 2048, 0) << "8-bit shards are whole blocks";
  // 6 bytes per parameter less than fp32 moments, and the peak falls by about that much.
  EXPECT_NEAR(static_cast<double>(f32.train_gpu.total() - q8.train_gpu.total()), 6.0 * f32.shard_elements,
              0.01 * 6.0 * f32.shard_elements);
}

}  // namespace test_optim_int8_config
