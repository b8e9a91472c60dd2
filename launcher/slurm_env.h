// What a SLURM job step tells its tasks through the environment, parsed and validated.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace tessera::launcher {

struct SlurmEnv {
  bool present = false;           // SLURM_JOB_ID is set
  bool in_step = false;           // SLURM_STEP_ID / SLURM_PROCID set (launched by srun)
  std::string job_id;
  int procid = -1, localid = -1, nodeid = -1;
  int ntasks = -1, nnodes = -1;
  std::string job_nodelist, step_nodelist;  // compressed form as given
  std::vector<std::string> nodes;           // expanded SLURM_STEP_NODELIST (else JOB_NODELIST)
  std::vector<int> tasks_per_node;          // expanded SLURM_TASKS_PER_NODE / STEP_TASKS_PER_NODE
  int gpus_on_node = -1;
  int restart_count = 0;
};

// Reads SLURM_* through `getenv` (defaults to ::getenv); throws tessera::Error(Input) naming the
// variable when a value is malformed (e.g. "SLURM_NTASKS=abc").
SlurmEnv read_slurm_env(const std::function<const char*(const char*)>& getenv_fn = {});

// Expands a Slurm hostlist: "gpu[001-004,010],login2" -> gpu001..gpu004, gpu010, login2.
// Several bracket groups are a cartesian product ("r[1-2]-n[01-02]" -> r1-n01, r1-n02, r2-n01, r2-n02);
// zero padding follows the lower bound's width. Throws tessera::Error(Input) on malformed input.
std::vector<std::string> expand_hostlist(const std::string& hostlist);

// Expands SLURM_TASKS_PER_NODE: "2(x3),1" -> {2,2,2,1}.
std::vector<int> expand_tasks_per_node(const std::string& spec);

}  // namespace tessera::launcher
