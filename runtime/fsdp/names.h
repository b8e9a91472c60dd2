// The FSDP enums that configuration names (fsdp.strategy, fsdp.accumulate, fsdp.offload, model.load) and their
// names, in enum order (util/enum_names.h): one list each that the parsers (fsdp.cpp, loader.cpp),
// the configuration schema (launcher/config.cpp), the memory model and `bench step --peer` read.
// Header-only and dependency-free (the config fuzz harness compiles config.cpp without the runtime).
#pragma once
#include "util/enum_names.h"

namespace tessera::fsdp {

enum class Strategy { FullShard, ShardGradOp, NoShard, HybridShard };
TESSERA_ENUM_NAMES(strategy_names, "full_shard", "shard_grad_op", "no_shard", "hybrid_shard")

enum class Accumulate { Sharded, Unsharded };
TESSERA_ENUM_NAMES(accumulate_names, "sharded", "unsharded")

// fsdp.offload: where the shard state lives (fsdp.h, "Host offload"). none: everything on the device;
// optimizer: fp32 master, gradient shard and optimizer state in (pinned) host memory, AdamW on the
// host, a compute-dtype copy of the parameter shard on the device; params: that copy on the host too.
enum class Offload { None, Optimizer, Params };
TESSERA_ENUM_NAMES(offload_names, "none", "optimizer", "params")

// How weights reach the shards (loader.h).
enum class LoadMode { Rank0, Parallel, Naive };
TESSERA_ENUM_NAMES(load_mode_names, "rank0", "parallel", "naive")

}  // namespace tessera::fsdp
