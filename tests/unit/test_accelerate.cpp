// YAML configs and `tessera config --from-accelerate`:
//  - every Accelerate fixture (tests/unit/fixtures/accelerate/*.yaml: our own copies of the shapes of
//    Accelerate's documented configs) translates to exactly its .json twin, accounts for every key
//    it holds in one report line, and prints the right SLURM layout;
//  - bad Accelerate configs (not FSDP, unknown keys and values, contradicting keys, uneven layouts)
//    fail with one line naming file, position and key;
//  - YAML run configs load into the same Config as their JSON twins, with plain scalars typed by the
//    schema, and YAML that is not YAML names line and column.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <unistd.h>

#include "launcher/accelerate.h"
#include "launcher/config.h"
#include "launcher/yaml_config.h"
#include "util/error.h"
#include "tests/support/test_support.h"

namespace test_accelerate {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace tessera;
using namespace tessera::launcher;
namespace fs = std::filesystem;
using nlohmann::json;
using tessera::test::error_of;
using tessera::test::TempDir;

namespace {

// The repository's fixtures (ctest sets TESSERA_TEST_SRC; run by hand, the working directory's).
fs::path fixtures() {
  const char* src = std::getenv("TESSERA_TEST_SRC");
  return fs::path(src ? src : ".") / "tests/unit/fixtures/accelerate";
}

AccelerateTranslation translate_text(const std::string& yaml, const std::string& source = "acc.yaml") {
  YamlPositions pos;
  json doc = parse_yaml_text(yaml, source, {}, &pos);
  return translate_accelerate(doc, source, pos);
}
std::string translate_error(const std::string& yaml) {
  return error_of([&] { translate_text(yaml); });
}

std::string report_line(const AccelerateTranslation& t, const std::string& key) {
  for (const auto& l : t.report)
    if (l.rfind(key + ": ", 0) == 0) return l;
  return "<no line for " + key + ">";
}

}  // namespace

TEST(Accelerate, FixturesTranslateExactly) {
  int n = 0;
  for (const auto& entry : fs::directory_iterator(fixtures())) {
    if (entry.path().extension() != ".yaml" || !fs::exists(fs::path(entry.path()).replace_extension(".json"))) continue;
    SCOPED_TRACE(entry.path().filename().string());
    const AccelerateTranslation t = translate_accelerate_file(entry.path().string());
    EXPECT_EQ(t.config, read_json_file(fs::path(entry.path()).replace_extension(".json").string()));
    // Every key of the file gets exactly one line: top-level keys, and fsdp_config's /
    // parallelism_config's own keys (the two sections themselves get none).
    YamlPositions pos;
    read_yaml_file(entry.path().string(), {}, &pos);
    std::multiset<std::string> reported;
    for (const auto& l : t.report) reported.insert(l.substr(0, l.find(": ")));
    std::multiset<std::string> keys;
    for (const auto& [path, where] : pos) {
      const std::string head = path.substr(0, path.find('.'));
      const bool section = head == "fsdp_config" || head == "parallelism_config";
      if (path == head ? !section : section && std::count(path.begin(), path.end(), '.') == 1) keys.insert(path);
    }
    EXPECT_EQ(reported, keys);
    ++n;
  }
  EXPECT_GE(n, 7);
}

TEST(Accelerate, ReportsWhatItCannotHonourAndWhy) {
  const AccelerateTranslation off = translate_accelerate_file((fixtures() / "offload.yaml").string());
  EXPECT_NE(report_line(off, "fsdp_config.offload_params").find("true -> fsdp.offload = \"params\" (master, gradient shard"), std::string::npos);
  EXPECT_EQ(off.config["fsdp"]["offload"], "params");
  EXPECT_NE(report_line(off, "fsdp_config.sharding_strategy").find("HYBRID_SHARD_ZERO2 -> fsdp.strategy = \"hybrid_shard\" (nearest equivalent"),
            std::string::npos);
  EXPECT_NE(report_line(off, "fsdp_config.auto_wrap_policy").find("not honoured: Tessera always makes one unit per decoder layer"),
            std::string::npos);
  const AccelerateTranslation full = translate_accelerate_file((fixtures() / "full_shard_bf16_2nodes.yaml").string());
  EXPECT_NE(report_line(full, "fsdp_config.fsdp_use_orig_params").find("not honoured: no meaning here"), std::string::npos);
  EXPECT_NE(report_line(full, "main_process_ip").find("not honoured: no rendezvous to configure"), std::string::npos);
  EXPECT_NE(report_line(full, "fsdp_config.fsdp_sharding_strategy").find("FULL_SHARD -> fsdp.strategy = \"full_shard\""), std::string::npos);
  EXPECT_NE(report_line(full, "fsdp_config.fsdp_cpu_ram_efficient_loading").find("true -> model.load = \"rank0\""), std::string::npos);
  // Lines come in file order.
  EXPECT_EQ(full.report.front().rfind("compute_environment: ", 0), 0u);
  EXPECT_EQ(full.report.back().rfind("use_cpu: ", 0), 0u);
  const AccelerateTranslation legacy = translate_accelerate_file((fixtures() / "legacy_integer.yaml").string());
  EXPECT_NE(report_line(legacy, "fsdp_config.fsdp_state_dict_type").find("FULL_STATE_DICT -> not honoured: checkpoints are always sharded; tessera ckpt consolidate"),
            std::string::npos);
}

TEST(Accelerate, MachinesAndProcessesBecomeTheSlurmLayout) {
  auto full = translate_accelerate_file((fixtures() / "full_shard_bf16_2nodes.yaml").string());
  EXPECT_EQ(full.submit_line("run.json"), "make -f Makefile.slurm submit CONFIG=run.json NODES=2 GPUS_PER_NODE=8");
  auto cpu = translate_accelerate_file((fixtures() / "cpu.yaml").string());
  EXPECT_EQ(cpu.submit_line("r.json"), "make -f Makefile.slurm submit CONFIG=r.json NODES=2 GPUS_PER_NODE=0 TASKS_PER_NODE=2");
  auto unknown = translate_text("distributed_type: FSDP\nnum_machines: 3\nnum_processes: -1\n");
  EXPECT_EQ(unknown.submit_line("run.json"),
            "make -f Makefile.slurm submit CONFIG=run.json NODES=3 GPUS_PER_NODE=<GPUs per node>   (num_processes was not given)");
  EXPECT_EQ(unknown.config, json::object());
  // gpu_ids that are not the ranks' consecutive GPUs are reported, not translated.
  auto ids = translate_text("distributed_type: FSDP\nnum_processes: 2\ngpu_ids: 1,3\n");
  EXPECT_EQ(ids.config, json::object());
  EXPECT_NE(report_line(ids, "gpu_ids").find("not honoured: Tessera gives local rank r GPU N+r"), std::string::npos);
  EXPECT_EQ(translate_text("distributed_type: FSDP\nnum_processes: 2\ngpu_ids: 0,1\n").config, json::parse(R"({"train": {"device": "cuda"}})"));
}

TEST(Accelerate, ValuesAsAccelerateReadsThem) {
  // Names in any case, legacy numbers as ints or strings, booleans as Accelerate's str_to_bool reads them.
  for (const char* s : {"full_shard", "1", "'1'"})
    EXPECT_EQ(translate_text(std::string("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: ") + s + "\n")
                  .config.at("fsdp").at("strategy"), "full_shard") << s;
  for (int i = 1; i <= 5; ++i) {
    static const char* const want[] = {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard"};
    EXPECT_EQ(translate_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_reshard_after_forward: " + std::to_string(i) + "\n")
                  .config.at("fsdp").at("strategy"), want[i - 1]);
  }
  EXPECT_EQ(translate_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_activation_checkpointing: 'True'\n").config,
            json::parse(R"({"fsdp": {"activation_checkpointing": "true"}})"));
  // Unquoted `no` is YAML 1.1's false, which Accelerate reads as no mixed precision.
  EXPECT_EQ(translate_text("distributed_type: FSDP\nmixed_precision: no\n").config.at("fsdp").at("mixed_precision"), "fp32");
  EXPECT_EQ(translate_text("distributed_type: FSDP\nmixed_precision: fp8\n").config.at("fsdp").at("mixed_precision"), "bf16");
  // Both prefetch keys agreeing, the same FSDP1 strategy under both of its keys: fine.
  EXPECT_EQ(translate_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_backward_prefetch: BACKWARD_PRE\n"
                           "  fsdp_backward_prefetch_policy: BACKWARD_PRE\n  fsdp_sharding_strategy: 2\n"
                           "  fsdp_reshard_after_forward: SHARD_GRAD_OP\n").config,
            json::parse(R"({"fsdp": {"prefetch": true, "strategy": "shard_grad_op"}})"));
  // FSDP2 ignores the FSDP1 prefetch keys (it always prefetches) and fsdp_sharding_strategy.
  auto v2 = translate_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_backward_prefetch: NO_PREFETCH\n"
                           "  fsdp_sharding_strategy: NO_SHARD\n");
  EXPECT_EQ(v2.config, json::object());
  EXPECT_NE(report_line(v2, "fsdp_config.fsdp_sharding_strategy").find("not honoured: FSDP2 ignores it"), std::string::npos);
  // A parallelism config that is not "shard within a node, replicate across nodes" is reported.
  auto tp = translate_text("distributed_type: FSDP\nfsdp_config: {fsdp_version: 2}\nnum_machines: 2\nnum_processes: 8\n"
                           "parallelism_config: {parallelism_config_dp_replicate_size: 4, parallelism_config_dp_shard_size: 2, "
                           "parallelism_config_tp_size: 2}\n");
  EXPECT_EQ(tp.config, json::object());
  EXPECT_NE(report_line(tp, "parallelism_config.parallelism_config_tp_size").find("not honoured: no tensor"), std::string::npos);
  EXPECT_NE(report_line(tp, "parallelism_config.parallelism_config_dp_shard_size").find("not honoured: Tessera shards over every rank"),
            std::string::npos);
}

TEST(Accelerate, BadConfigsFailWithOneLineNamingFileAndKey) {
  const std::string fsdp = "distributed_type: FSDP\n";
  struct Case {
    std::string yaml, want;
  } cases[] = {
      {"compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n",
       "acc.yaml:2:1: distributed_type: DEEPSPEED is not an FSDP config; --from-accelerate translates distributed_type: FSDP only"},
      {"distributed_type: MULTI_GPU\n", "plain data parallelism is Tessera's fsdp.strategy no_shard"},
      {"num_processes: 2\n", "acc.yaml: no distributed_type"},
      {fsdp + "fsdp_config:\n  fsdp_sharding_strategy: FULL_SHAD\n",
       "acc.yaml:3:3: fsdp_config.fsdp_sharding_strategy: 'FULL_SHAD' is not one of FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, "
       "HYBRID_SHARD, HYBRID_SHARD_ZERO2 (or 1..5) (did you mean 'FULL_SHARD'?)"},
      {fsdp + "fsdp_config:\n  fsdp_sharding_strategy: 7\n", "fsdp_config.fsdp_sharding_strategy: 7 is not a strategy number (1..5)"},
      {fsdp + "fsdp_config:\n  fsdp_offload_param: true\n",
       "acc.yaml:3:3: fsdp_config.fsdp_offload_param: unknown Accelerate key (did you mean 'fsdp_offload_params'?)"},
      {fsdp + "num_machine: 2\n", "acc.yaml:2:1: num_machine: unknown Accelerate key (did you mean 'num_machines'?)"},
      {fsdp + "fsdp_config:\n  fsdp_offload_params: maybe\n", "fsdp_config.fsdp_offload_params: expected true or false, got \"maybe\""},
      {fsdp + "mixed_precision: fp64\n", "mixed_precision: 'fp64' is not one of NO, FP16, BF16, FP8"},
      {fsdp + "fsdp_config:\n  fsdp_backward_prefetch: BACKWARD_PREE\n", "(did you mean 'BACKWARD_PRE'?)"},
      {fsdp + "fsdp_config:\n  fsdp_state_dict_type: SHARDED\n", "fsdp_config.fsdp_state_dict_type: 'SHARDED' is not one of"},
      {fsdp + "fsdp_config:\n  fsdp_auto_wrap_policy: LAYER_WRAP\n", "fsdp_config.fsdp_auto_wrap_policy: 'LAYER_WRAP' is not one of"},
      {fsdp + "compute_environment: CLOUD\n", "compute_environment: 'CLOUD' is not one of LOCAL_MACHINE, AMAZON_SAGEMAKER"},
      {fsdp + "fsdp_config:\n  fsdp_version: 3\n", "fsdp_config.fsdp_version: 3 is not an FSDP version (1 or 2)"},
      {fsdp + "fsdp_config: [1]\n", "fsdp_config: expected a mapping of fsdp_* keys"},
      // Contradicting keys: one line naming both.
      {fsdp + "fsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_reshard_after_forward: SHARD_GRAD_OP\n",
       "acc.yaml:4:3: fsdp_config.fsdp_reshard_after_forward: SHARD_GRAD_OP contradicts fsdp_config.fsdp_sharding_strategy: "
       "FULL_SHARD (line 3); keep one of them"},
      {fsdp + "fsdp_config:\n  sharding_strategy: 1\n  fsdp_sharding_strategy: 1\n",
       "fsdp_config.sharding_strategy: the same key as fsdp_config.fsdp_sharding_strategy (line 4): Accelerate adds the fsdp_ prefix"},
      {fsdp + "fsdp_config:\n  fsdp_cpu_ram_efficient_loading: true\n  fsdp_sync_module_states: false\n",
       "acc.yaml:4:3: fsdp_config.fsdp_sync_module_states: false contradicts fsdp_config.fsdp_cpu_ram_efficient_loading: true (line 3)"},
      {fsdp + "fp16: true\nmixed_precision: bf16\n", "acc.yaml:2:1: fp16: true contradicts mixed_precision: bf16 (line 3)"},
      {fsdp + "fsdp_config:\n  fsdp_backward_prefetch: BACKWARD_PRE\n  fsdp_backward_prefetch_policy: NO_PREFETCH\n",
       "fsdp_config.fsdp_backward_prefetch_policy: NO_PREFETCH contradicts fsdp_config.fsdp_backward_prefetch: BACKWARD_PRE (line 3)"},
      {fsdp + "fsdp_config:\n  fsdp_reshard_after_forward: true\n",
       "fsdp_config.fsdp_reshard_after_forward: true is FSDP2's form; with fsdp_version 1 it takes a strategy name such as FULL_SHARD"},
      {fsdp + "fsdp_config:\n  fsdp_version: 2\n  fsdp_reshard_after_forward: FULL_SHARD\n",
       "fsdp_config.fsdp_reshard_after_forward: FULL_SHARD is FSDP1's form; with fsdp_version 2 it is true or false"},
      {fsdp + "parallelism_config: {parallelism_config_dp_replicate_size: 2}\n",
       "parallelism_config: needs fsdp_version 2 (Accelerate refuses a parallelism config with FSDP1)"},
      {fsdp + "num_machines: 2\nnum_processes: 7\n",
       "acc.yaml:3:1: num_processes: 7 processes do not split evenly over num_machines 2: Tessera runs the same number of ranks on every node"},
      {fsdp + "num_machines: 2\nmachine_rank: 2\n", "machine_rank: 2 is not below num_machines 2"},
      {fsdp + "num_processes: 0\n", "num_processes: must be >= 1 (or -1: given at launch)"},
      // YAML itself: a key twice, and text that is not YAML.
      {fsdp + "fsdp_config:\n  fsdp_sharding_strategy: 1\n  fsdp_sharding_strategy: 2\n",
       "acc.yaml:4:3: key 'fsdp_config.fsdp_sharding_strategy' appears twice (first at line 3)"},
      {fsdp + "fsdp_config:\n  fsdp_sharding_strategy: [FULL_SHARD\n", "acc.yaml:4:1: invalid YAML: end of sequence flow not found"},
      {fsdp + "fsdp_config:\n  a: 1\n b: 2\n", "acc.yaml:4:2: invalid YAML: end of map not found"},
  };
  for (const auto& c : cases) {
    const std::string e = translate_error(c.yaml);
    EXPECT_NE(e.find(c.want), std::string::npos) << c.yaml << "\n-> " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
}

TEST(YamlRunConfig, LoadsLikeItsJsonTwin) {
  TempDir d;
  const std::string yaml = d.write("run.yaml", R"(# a YAML run config: the JSON keys, as nested maps
model:
  preset: tiny
  load: parallel
data:
  seq_len: 64
  path: /usr/share/common-licenses
train:
  steps: 3
  lr: 3e-4            # a float, as YAML 1.2 reads it
  min_lr: 1.0e-5
  clip: 1             # int accepted for a float key
  device: cpu
  preempt_signal: USR1
fsdp:
  strategy: shard_grad_op
  mixed_precision: bf16
  activation_checkpointing: true    # the schema's string "true"
  prefetch: no                      # YAML 1.1 boolean, as PyYAML reads it
  limit_all_gathers: 0x3
checkpoint.dir: ""                  # dotted keys work as in JSON
)");
  const std::string json_path = d.write("run.json", R"({
  "model": {"preset": "tiny", "load": "parallel"},
  "data": {"seq_len": 64, "path": "/usr/share/common-licenses"},
  "train": {"steps": 3, "lr": 0.0003, "min_lr": 1e-05, "clip": 1.0, "device": "cpu", "preempt_signal": "USR1"},
  "fsdp": {"strategy": "shard_grad_op", "mixed_precision": "bf16", "activation_checkpointing": "true",
           "prefetch": false, "limit_all_gathers": 3},
  "checkpoint": {"dir": ""}
})");
  const Config from_yaml = Config::load(yaml), from_json = Config::load(json_path);
  EXPECT_EQ(from_yaml.json(), from_json.json());
  EXPECT_NE(from_yaml.json(), Config().json());
  EXPECT_EQ(from_yaml.fsdp.activation_checkpointing, Recompute::True);
  EXPECT_FALSE(from_yaml.fsdp.prefetch);
  EXPECT_DOUBLE_EQ(from_yaml.schedule.lr, 3e-4);
  // --set applies to YAML configs the same way.
  EXPECT_EQ(Config::load(yaml, {"train.steps=9"}).train.steps, 9);
  // An empty YAML file (or comments only) is the defaults, as `{}` is in JSON.
  EXPECT_EQ(Config::load(d.write("empty.yml", "# nothing yet\n")).json(), Config().json());
  // A .json file is still JSON, even when its text would be valid YAML.
  EXPECT_NE(error_of([&] { Config::load(d.write("yamlish.json", "train:\n  steps: 3\n")); }).find("invalid JSON"), std::string::npos);
}

TEST(YamlRunConfig, ErrorsNameFileKeyLineAndColumn) {
  TempDir d;
  struct Case {
    std::string text, want;
  } cases[] = {
      {"train:\n  steps: three\n", ": config key 'train.steps' must be int, got string \"three\""},
      {"train:\n  steps: \"3\"\n", ": config key 'train.steps' must be int, got string \"3\""},
      {"train:\n  stepz: 3\n", ": unknown config key 'train.stepz' (did you mean 'train.steps'?)"},
      {"fsdp:\n  strategy: full_shad\n", "(did you mean 'full_shard'?)"},
      {"model:\n  path:\n", ": config key 'model.path' must be string, got null"},
      {"train:\n  steps: 3\n  lr: [1, 2\n", ":4:1: invalid YAML: end of sequence flow not found"},
      {"train:\n  steps: 3\n   lr: 1\n", ":3:6: invalid YAML: "},
      {"train:\n  steps: 3\n  steps: 4\n", ":3:3: key 'train.steps' appears twice (first at line 2)"},
      {"- train\n- fsdp\n", ":1:1: the top level must be a mapping of keys, got a sequence"},
      {"train: {steps: 3}\n---\ntrain: {steps: 4}\n", ":3:1: a second YAML document; a config file holds one"},
  };
  int i = 0;
  for (const auto& c : cases) {
    const std::string path = d.write("bad" + std::to_string(i++) + ".yaml", c.text);
    const std::string e = error_of([&] { Config::load(path); });
    EXPECT_EQ(e.rfind(path, 0), 0u) << e;
    EXPECT_NE(e.find(c.want), std::string::npos) << c.text << "\n-> " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  EXPECT_NE(error_of([&] { Config::load(d / "nope.yaml"); }).find("nope.yaml: cannot open config file"),
            std::string::npos);
}

// Hostile YAML (issue 58): a 1 KB "billion laughs" file (each level a list of nine aliases of the
// one before) grew past 7 GiB while its aliases were converted to JSON; deep nesting recursed once
// per level. Both end in one line naming the file and the budget (util/budgets.h).
TEST(YamlRunConfig, AliasExpansionAndNestingAreBounded) {
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'j'; ++c) {
    bomb += std::string(1, c) + ": &" + c + " [";
    for (int i = 0; i < 9; ++i) bomb += std::string(i ? ", *" : "*") + char(c - 1);
    bomb += "]\n";
  }
  std::string e = error_of([&] { parse_yaml_text(bomb, "bomb.yaml"); });
  EXPECT_EQ(e.rfind("bomb.yaml:", 0), 0u) << e;
  EXPECT_NE(e.find("expands to more than 10000 nodes once its aliases (*name) are followed (budget kYamlExpandedNodes)"),
            std::string::npos) << e;
  // Nine levels of nine is within it; the same file's values are still read.
  EXPECT_EQ(parse_yaml_text("a: &a [1, 2]\nb: [*a, *a]\n", "ok.yaml")["b"], json::parse("[[1, 2], [1, 2]]"));
  // Nesting: a flow sequence and block mappings 300 deep (past kYamlDepth, within yaml-cpp's own guard).
  e = error_of([&] { parse_yaml_text("a: " + std::string(300, '[') + std::string(300, ']') + "\n", "flow.yaml"); });
  EXPECT_NE(e.find("YAML nested deeper than 256 levels (budget kYamlDepth)"), std::string::npos) << e;
  std::string block;
  for (int i = 0; i < 300; ++i) block += std::string(2 * i, ' ') + "k:\n";
  e = error_of([&] { parse_yaml_text(block, "block.yaml"); });
  EXPECT_NE(e.find("block.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("YAML nested deeper than 256 levels (budget kYamlDepth)"), std::string::npos) << e;
  // 100k deep: yaml-cpp's parser refuses first (its own depth guard, whose message is "bad file"),
  // in one line naming the file and the budget.
  e = error_of([&] { parse_yaml_text("a: " + std::string(100000, '[') + "\n", "deep.yaml"); });
  EXPECT_EQ(e.rfind("deep.yaml:", 0), 0u) << e;
  EXPECT_NE(e.find(": invalid YAML: nested deeper than yaml-cpp's parser allows ("), std::string::npos) << e;
  EXPECT_NE(e.find("the budget is 256 levels, kYamlDepth)"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

}  // namespace test_accelerate
