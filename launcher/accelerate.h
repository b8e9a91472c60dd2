// `tessera config --from-accelerate fsdp_config.yaml`: translates a Hugging Face Accelerate config
// (what `accelerate config` writes and `accelerate launch --config_file` reads) into a Tessera run
// config, and accounts for every key it met in one line: the Tessera key it became, "same in
// Tessera" (nothing to set: Tessera already behaves so), or "not honoured" with the reason.
//
// Read as Accelerate reads it: the top-level keys of its ClusterConfig, `fsdp_config` keys with or
// without their `fsdp_` prefix, FSDP1 (`fsdp_sharding_strategy` / `fsdp_reshard_after_forward` as
// a strategy name FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2 or its
// legacy number 1..5) and FSDP2 (`fsdp_version: 2`, `fsdp_reshard_after_forward: true|false`,
// `parallelism_config` for hybrid sharding). Machines and processes become the SLURM layout
// (Makefile.slurm NODES / GPUS_PER_NODE), printed as the `make ... submit` line.
//
// Errors (Error(Input), exit 2), one line "FILE:LINE:COL: key: reason": a config that is not
// distributed_type FSDP, an unknown key or value (with the closest valid one), keys that contradict
// each other (naming both), a process count that does not split evenly over the machines.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "launcher/yaml_config.h"

namespace tessera::launcher {

struct AccelerateTranslation {
  nlohmann::json config = nlohmann::json::object();  // Tessera run config: only the keys translated
  std::vector<std::string> report;                    // one line per Accelerate key, in file order
  int nodes = 0;            // num_machines; 0: not given
  int ranks_per_node = 0;   // num_processes / num_machines; 0: not given
  bool cpu = false;         // use_cpu: CPU nodes (GPUS_PER_NODE=0 TASKS_PER_NODE=ranks_per_node)
  // `make -f Makefile.slurm submit CONFIG=<config_path> NODES=.. GPUS_PER_NODE=..`, or a sentence
  // saying what is missing when the config gives no process count.
  std::string submit_line(const std::string& config_path) const;
};

// `doc` is the Accelerate config as JSON (read_yaml_file without a scalar typer), `positions` where
// its keys were written (for the messages).
AccelerateTranslation translate_accelerate(const nlohmann::json& doc, const std::string& source,
                                           const YamlPositions& positions);
AccelerateTranslation translate_accelerate_file(const std::string& path);

// The command: the run config (only the translated keys) as JSON on stdout, or into `out` (a new
// file: an existing one is refused, and it is written whole or not at all); the report, one line per
// key, and the submit line on stderr. Returns the exit code.
int run_config_from_accelerate(const std::string& path, const std::string& out);

}  // namespace tessera::launcher
