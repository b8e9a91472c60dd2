// read_slurm_env against the variable sets real Slurm 22.05 hands to a batch shell and to srun
// tasks (captured on the local cluster, see slurm/README.md), plus malformed and inconsistent ones.
#include <gtest/gtest.h>

#include <array>
#include <map>

#include "launcher/slurm_env.h"
#include "util/error.h"
#include "tests/support/test_support.h"

namespace test_slurm_env {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using tessera::launcher::read_slurm_env;
using tessera::launcher::SlurmEnv;
using Vars = std::map<std::string, std::string>;
using tessera::test::expect_input_error;

namespace {

SlurmEnv read(const Vars& vars) {
  return read_slurm_env([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

// Task 3 of `srun -N2 -n4` inside job 42 on nodes node[1-2] (as Slurm 22.05 sets it).
Vars srun_task3() {
  return {{"SLURM_JOB_ID", "42"},          {"SLURM_JOBID", "42"},
          {"SLURM_STEP_ID", "0"},          {"SLURM_PROCID", "3"},
          {"SLURM_LOCALID", "1"},          {"SLURM_NODEID", "1"},
          {"SLURM_NTASKS", "4"},           {"SLURM_NNODES", "2"},
          {"SLURM_STEP_NUM_TASKS", "4"},   {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_JOB_NODELIST", "node[1-2]"}, {"SLURM_STEP_NODELIST", "node[1-2]"},
          {"SLURM_TASKS_PER_NODE", "2(x2)"},   {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}};
}

}  // namespace

TEST(SlurmEnv, AbsentOutsideSlurm) {
  const SlurmEnv env = read({{"HOME", "/root"}, {"SLURM_PROCID", "garbage"}});
  EXPECT_FALSE(env.present);
  EXPECT_FALSE(env.in_step);
  EXPECT_EQ(env.procid, -1);
  EXPECT_TRUE(env.nodes.empty());
  EXPECT_EQ(env.restart_count, 0);
}

TEST(SlurmEnv, SrunTask) {
  const SlurmEnv env = read(srun_task3());
  EXPECT_TRUE(env.present);
  EXPECT_TRUE(env.in_step);
  EXPECT_EQ(env.job_id, "42");
  EXPECT_EQ(env.procid, 3);
  EXPECT_EQ(env.localid, 1);
  EXPECT_EQ(env.nodeid, 1);
  EXPECT_EQ(env.ntasks, 4);
  EXPECT_EQ(env.nnodes, 2);
  EXPECT_EQ(env.job_nodelist, "node[1-2]");
  EXPECT_EQ(env.step_nodelist, "node[1-2]");
  EXPECT_EQ(env.nodes, std::vector<std::string>({"node1", "node2"}));
  EXPECT_EQ(env.tasks_per_node, std::vector<int>({2, 2}));
  EXPECT_EQ(env.gpus_on_node, -1);
  EXPECT_EQ(env.restart_count, 0);
}

TEST(SlurmEnv, StepValuesWinOverTheAllocation) {
  // `srun -N1 -n2` inside a 3-node, 6-task allocation: the step is this world.
  Vars v = {{"SLURM_JOB_ID", "7"},
            {"SLURM_STEP_ID", "1"},
            {"SLURM_PROCID", "1"},
            {"SLURM_LOCALID", "1"},
            {"SLURM_NODEID", "0"},
            {"SLURM_NTASKS", "6"},
            {"SLURM_NNODES", "3"},
            {"SLURM_STEP_NUM_TASKS", "2"},
            {"SLURM_STEP_NUM_NODES", "1"},
            {"SLURM_JOB_NODELIST", "gpu[001-002],login2"},
            {"SLURM_STEP_NODELIST", "gpu002"},
            {"SLURM_TASKS_PER_NODE", "2(x3)"},
            {"SLURM_STEP_TASKS_PER_NODE", "2"},
            {"SLURM_GPUS_ON_NODE", "2"},
            {"SLURM_RESTART_COUNT", "3"}};
  const SlurmEnv env = read(v);
  EXPECT_EQ(env.ntasks, 2);
  EXPECT_EQ(env.nnodes, 1);
  EXPECT_EQ(env.nodes, std::vector<std::string>({"gpu002"}));
  EXPECT_EQ(env.job_nodelist, "gpu[001-002],login2");
  EXPECT_EQ(env.tasks_per_node, std::vector<int>({2}));
  EXPECT_EQ(env.gpus_on_node, 2);
  EXPECT_EQ(env.restart_count, 3);
}

TEST(SlurmEnv, BatchShellUsesTheAllocation) {
  // The batch script of `sbatch -N2 --ntasks-per-node=2`: no step variables.
  Vars v = {{"SLURM_JOB_ID", "9"},         {"SLURM_PROCID", "0"},    {"SLURM_LOCALID", "0"},
            {"SLURM_NODEID", "0"},         {"SLURM_NTASKS", "4"},    {"SLURM_NNODES", "2"},
            {"SLURM_JOB_NODELIST", "r[1-2]-n[01]"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}};
  const SlurmEnv env = read(v);
  EXPECT_TRUE(env.present);
  EXPECT_FALSE(env.in_step);
  EXPECT_EQ(env.nodes, std::vector<std::string>({"r1-n01", "r2-n01"}));
  EXPECT_EQ(env.step_nodelist, "");
  EXPECT_EQ(env.tasks_per_node, std::vector<int>({2, 2}));
}

TEST(SlurmEnv, LegacyNamesAreUnderstood) {
  Vars v = {{"SLURM_JOBID", "5"}, {"SLURM_NPROCS", "3"}, {"SLURM_JOB_NUM_NODES", "2"},
            {"SLURM_NODELIST", "a,b"}, {"SLURM_TASKS_PER_NODE", "2,1"}};
  const SlurmEnv env = read(v);
  EXPECT_EQ(env.job_id, "5");
  EXPECT_EQ(env.ntasks, 3);
  EXPECT_EQ(env.nnodes, 2);
  EXPECT_EQ(env.nodes, std::vector<std::string>({"a", "b"}));
}

TEST(SlurmEnv, MalformedValuesNameTheVariable) {
  for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{
           {"SLURM_PROCID", "abc"},
           {"SLURM_PROCID", "-1"},
           {"SLURM_LOCALID", "1x"},
           {"SLURM_NODEID", ""},
           {"SLURM_STEP_NUM_TASKS", "0"},
           {"SLURM_STEP_NUM_NODES", "99999999999"},
           {"SLURM_GPUS_ON_NODE", "two"},
           {"SLURM_RESTART_COUNT", "1.0"},
           {"SLURM_STEP_NODELIST", "node[1-2"},
           {"SLURM_STEP_TASKS_PER_NODE", "2(x2"}}) {
    Vars v = srun_task3();
    v[name] = value;
    expect_input_error([&] { read(v); }, {name + "="});
  }
  Vars v = srun_task3();
  v["SLURM_JOB_ID"] = "";
  expect_input_error([&] { read(v); }, {"SLURM_JOB_ID is set but empty"});
}

TEST(SlurmEnv, InconsistentCountsAreErrors) {
  // (variable, value in srun_task3's otherwise consistent set, what the error must say)
  for (const auto& [name, value, needle] : std::vector<std::array<std::string, 3>>{
           {"SLURM_STEP_NUM_NODES", "3", "node list has 2 hosts but node count is 3"},
           {"SLURM_STEP_TASKS_PER_NODE", "2(x3)", "covers 3 nodes"},
           {"SLURM_STEP_TASKS_PER_NODE", "2,1", "does not add up"},
           {"SLURM_PROCID", "4", "SLURM_PROCID=4 is not below the task count 4"},
           {"SLURM_NODEID", "2", "SLURM_NODEID=2"},
           {"SLURM_LOCALID", "2", "SLURM_LOCALID=2"}}) {
    Vars v = srun_task3();
    v[name] = value;
    expect_input_error([&] { read(v); }, {needle});
  }
}

TEST(SlurmEnv, ReadsTheProcessEnvironmentByDefault) {
  setenv("SLURM_JOB_ID", "77", 1);
  setenv("SLURM_RESTART_COUNT", "2", 1);
  const SlurmEnv env = read_slurm_env();
  unsetenv("SLURM_JOB_ID");
  unsetenv("SLURM_RESTART_COUNT");
  EXPECT_TRUE(env.present);
  EXPECT_EQ(env.job_id, "77");
  EXPECT_EQ(env.restart_count, 2);
}

}  // namespace test_slurm_env
