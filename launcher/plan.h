// `tessera plan`: predicts, per rank and phase, the GPU memory and host RAM of a run of THIS
// implementation from the memory model (runtime/planner/memory_formula.h), says whether it fits, and which
// knob makes it fit. `tessera train` runs the same prediction before loading, against the node's
// host memory limit, and stops with an explanation instead of meeting the OOM killer.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launcher/config.h"
#include "model/config.h"
#include "runtime/planner/memory_formula.h"

namespace tessera::launcher {

struct PlanRequest {
  int world = 1, ranks_per_node = 1;
  bool gpu = false;
  int64_t gpu_mem = 0;   // bytes per GPU; 0: not checked
  int64_t host_mem = 0;  // bytes per node; 0: not checked
  int stored_bytes = 4;  // checkpoint dtype on disk (what rank0 loading stages)
};

planner::RunShape run_shape_from(const Config& cfg, const model::ModelConfig& mc, const PlanRequest& req);
planner::Plan plan_run(const Config& cfg, const model::ModelConfig& mc, const PlanRequest& req);

// Host bytes of the busiest node: the reading rank's load phase plus the other local ranks'.
int64_t host_bytes_per_node(const planner::Plan& plan, const PlanRequest& req);

// "" when the plan fits the request's limits, else why not (one line).
std::string why_not_fit(const planner::Plan& plan, const PlanRequest& req);

// The memory limit of this node for this job, the tightest of: cgroup memory.max (v2, or v1's
// memory.limit_in_bytes) of this process's cgroup and its parents, SLURM_MEM_PER_NODE,
// SLURM_MEM_PER_CPU x SLURM_CPUS_ON_NODE (MB, as sbatch --mem / --mem-per-cpu export them); 0 if
// none. `source` says which.
int64_t detect_host_limit(std::string* source);

// Changes that make a run that does not fit fit ([{"change": "...", "peak_gpu_bytes_per_rank": ..,
// "peak_host_bytes_per_rank": ..}]): each knob alone, all of them, more ranks. Empty when nothing
// fits, with *impossible saying so.
nlohmann::json fitting_changes(const Config& cfg, const model::ModelConfig& mc, const PlanRequest& req,
                               std::string* impossible);

int run_plan(const std::vector<std::string>& args);

}  // namespace tessera::launcher
