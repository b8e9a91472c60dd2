#include "benchmarks/bench_memory.h"

#include <mpi.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "launcher/cli.h"
#include "launcher/config.h"
#include "launcher/plan.h"
#include "model/config.h"
#include "runtime/planner/memory_formula.h"
#include "util/error.h"
#include "util/file_tree.h"
#include "util/json.h"

namespace tessera::bench {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// One measured configuration: a training run (or an evaluation) under mpirun.
struct Case {
  std::string name;
  std::string model;  // a preset name, or "mid" (hidden 512, 8 layers, vocab 32000: written with init-model)
  int world = 1, ranks_per_node = 0;  // 0: all on one node
  json set;                            // config keys (flattened "a.b": value)
  bool eval = false;
};

std::vector<Case> cases(bool quick) {
  auto train = [](std::string name, std::string model, int W, json set, int rpn = 0) {
    Case c;
    c.name = std::move(name);
    c.model = std::move(model);
    c.world = W;
    c.ranks_per_node = rpn;
    c.set = std::move(set);
    return c;
  };
  std::vector<Case> v = {
      train("small W1 full_shard fp32", "small", 1, {{"fsdp.mixed_precision", "fp32"}}),
      train("small W2 full_shard bf16 accum2", "small", 2,
            {{"fsdp.mixed_precision", "bf16"}, {"fsdp.reduce_dtype", "bf16"}, {"train.grad_accum", 2}}),
      train("small W4 shard_grad_op fp32", "small", 4, {{"fsdp.strategy", "shard_grad_op"}}),
      train("small W2 no_shard bf16", "small", 2,
            {{"fsdp.strategy", "no_shard"}, {"fsdp.mixed_precision", "bf16"}, {"fsdp.reduce_dtype", "bf16"}}),
      train("mid W2 full_shard bf16 unsharded accum2 AC", "mid", 2,
            {{"fsdp.mixed_precision", "bf16"}, {"fsdp.accumulate", "unsharded"}, {"train.grad_accum", 2},
             {"fsdp.activation_checkpointing", "true"}}),
      train("mid W4 hybrid 2x2 bf16 state bf16", "mid", 4,
            {{"fsdp.strategy", "hybrid_shard"}, {"fsdp.mixed_precision", "bf16"}, {"fsdp.reduce_dtype", "bf16"},
             {"optim.state_dtype", "bf16"}}, 2),
      train("small W2 long sequences fp32", "small", 2, {{"data.seq_len", 512}, {"train.micro_batch", 2}}),
      // LoRA: a frozen bf16 base (no master, gradient or moments) beside fp32 adapters.
      train("mid W2 full_shard bf16 LoRA r16", "mid", 2,
            {{"fsdp.mixed_precision", "bf16"}, {"fsdp.reduce_dtype", "bf16"}, {"lora.rank", 16}}),
      // QLoRA: the decoder's projections stored as NF4 (gathered as bytes, decoded per unit), the
      // rest of the base in bf16.
      train("mid W2 full_shard bf16 QLoRA r16 nf4", "mid", 2,
            {{"fsdp.mixed_precision", "bf16"}, {"fsdp.reduce_dtype", "bf16"}, {"lora.rank", 16}, {"lora.base_dtype", "nf4"}}),
  };
  Case e;
  e.name = "mid W2 eval bf16";
  e.model = "mid";
  e.world = 2;
  e.eval = true;
  v.push_back(e);
  if (!quick) {
    v.push_back(train("mid W1 full_shard bf16", "mid", 1, {{"fsdp.mixed_precision", "bf16"}, {"fsdp.reduce_dtype", "bf16"}}));
    v.push_back(train("mid W2 full_shard bf16", "mid", 2, {{"fsdp.mixed_precision", "bf16"}, {"fsdp.reduce_dtype", "bf16"}}));
    v.push_back(train("mid W4 full_shard bf16", "mid", 4, {{"fsdp.mixed_precision", "bf16"}, {"fsdp.reduce_dtype", "bf16"}}));
    v.push_back(train("mid W2 full_shard bf16 fp32-reduce", "mid", 2, {{"fsdp.mixed_precision", "bf16"}}));
    v.push_back(train("mid W2 full_shard bf16 state int8", "mid", 2,
                      {{"fsdp.mixed_precision", "bf16"}, {"fsdp.reduce_dtype", "bf16"}, {"optim.state_dtype", "int8"}}));
    for (const char* offload : {"optimizer", "params"})
      v.push_back(train(std::string("mid W2 full_shard bf16 offload ") + offload, "mid", 2,
                        {{"fsdp.mixed_precision", "bf16"}, {"fsdp.reduce_dtype", "bf16"}, {"fsdp.offload", offload}}));
    // optim.in_backward (it needs train.clip = 0): one unit's gradient shard alive at a time. Then
    // every memory mode at once, as the 70B one-node plan uses them.
    v.push_back(train("mid W2 full_shard bf16 in_backward", "mid", 2,
                      {{"fsdp.mixed_precision", "bf16"}, {"fsdp.reduce_dtype", "bf16"}, {"optim.in_backward", true},
                       {"train.clip", 0.0}}));
    v.push_back(train("mid W2 full_shard bf16 combined: in_backward int8 offload params", "mid", 2,
                      {{"fsdp.mixed_precision", "bf16"}, {"fsdp.reduce_dtype", "bf16"}, {"optim.in_backward", true},
                       {"train.clip", 0.0}, {"optim.state_dtype", "int8"}, {"fsdp.offload", "params"}}));
    v.push_back(train("mid W2 full_shard fp32 AC", "mid", 2, {{"fsdp.activation_checkpointing", "true"}}));
    v.push_back(train("mid W2 full_shard bf16 QLoRA r16 nf4 double quant offload params", "mid", 2,
                      {{"fsdp.mixed_precision", "bf16"}, {"fsdp.reduce_dtype", "bf16"}, {"lora.rank", 16},
                       {"lora.base_dtype", "nf4"}, {"lora.double_quant", true}, {"fsdp.offload", "params"}}));
  }
  return v;
}

std::string self_exe() { return fs::read_symlink("/proc/self/exe").string(); }

// This process may be an MPI singleton: its children must not take its identity for theirs.
void forget_mpi_identity() {
  std::vector<std::string> drop;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    if ((key.rfind("OMPI_", 0) == 0 && key.rfind("OMPI_MCA_", 0) != 0) || key.rfind("PMIX_", 0) == 0) drop.push_back(key);
  }
  for (const auto& k : drop) unsetenv(k.c_str());
}

// Runs a shell command, returns (exit code, stdout + stderr).
std::pair<int, std::string> run_command(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  TESSERA_CHECK(p != nullptr, "bench memory: cannot run " + cmd);
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128, out};
}

std::string mpirun(int world, int rpn) {
  // Emulated nodes share one host: TCP loopback between them, as the test suite does (the loopback
  // subnet: Open MPI 5's TCP BTL finds no reachable pairing on "lo" by name, and its launcher, PRRTE,
  // no out-of-band interface when limited to "lo"; oob stays on lo for 4.x).
#if defined(OMPI_MAJOR_VERSION) && OMPI_MAJOR_VERSION < 5
  const char* oob = " --mca oob_tcp_if_include lo";
#else
  const char* oob = "";
#endif
  std::string cmd = "mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -np " + std::to_string(world) +
                    (rpn > 0 ? std::string(" --mca btl self,tcp --mca btl_tcp_if_include 127.0.0.1/8") + oob : std::string());
  return cmd + " " + self_exe();
}

// The line of a failed child's output that says why (its "error:" line), else its last line.
std::string why(const std::string& out) {
  std::istringstream in(out);
  std::string line, last, err;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    last = line;
    if (err.empty() && line.find("error:") != std::string::npos) err = line;
  }
  return err.empty() ? last : err;
}

std::string mib(int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", static_cast<double>(b) / (1 << 20));
  return buf;
}

}  // namespace

namespace {

using launcher::Config;

// The mid-size model (hidden 512, 8 layers, vocab 32000: 58M parameters, bf16 on disk) and token ids
// for evaluation (4 sequences of 256 tokens), once, in `dir`.
fs::path make_mid_model(const fs::path& dir, const std::string& exe) {
  const fs::path mid = dir / "mid";
  json c = {{"model_type", "llama"}, {"vocab_size", 32000}, {"hidden_size", 512}, {"intermediate_size", 1376},
            {"num_hidden_layers", 8}, {"num_attention_heads", 8}, {"num_key_value_heads", 8},
            {"max_position_embeddings", 1024}, {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0},
            {"torch_dtype", "bfloat16"}, {"architectures", {"LlamaForCausalLM"}}};
  std::ofstream(dir / "mid.json") << c.dump();
  auto [rc, out] = run_command(exe + " init-model --config " + (dir / "mid.json").string() + " --out " + mid.string() +
                               " --dtype bf16");
  TESSERA_CHECK(rc == 0, "bench memory: init-model failed: " + why(out));
  std::ofstream t(dir / "tokens.txt");
  for (int s = 0; s < 4; ++s)
    for (int i = 0; i < 256; ++i) t << (i * 7919 + s * 104729) % 32000 << (i + 1 < 256 ? " " : "\n");
  return mid;
}

// Runs one configuration under mpirun and returns rank 0's measured breakdown at its peak (train:
// the last record of metrics.jsonl; eval: its JSON line). `conf` is set to what ran.
json measure_case(const Case& c, Config& conf, const fs::path& dir, const fs::path& run_dir, const fs::path& mid) {
  const std::string rpn_flag = c.ranks_per_node > 0 ? " --ranks-per-node " + std::to_string(c.ranks_per_node) : "";
  if (c.eval) {
    auto [rc, out] = run_command(mpirun(c.world, c.ranks_per_node) + " eval --model " + mid.string() + " --tokens " +
                                 (dir / "tokens.txt").string() + " --dtype bf16" + rpn_flag);
    TESSERA_CHECK(rc == 0, "bench memory: " + c.name + " failed: " + why(out));
    const size_t brace = out.rfind("\n{");
    conf.fsdp.mixed_precision = util::FloatType::BF16;
    conf.data.seq_len = 255;  // 256 tokens: 255 predicted
    return util::parse_json(out.substr(brace == std::string::npos ? out.find('{') : brace + 1)).at("memory");
  }
  const std::string cmd = mpirun(c.world, c.ranks_per_node) + " train --config " + (run_dir / "run.json").string() + rpn_flag;
  auto [rc, out] = run_command(cmd);
  TESSERA_CHECK(rc == 0, "bench memory: " + c.name + " failed (exit " + std::to_string(rc) + "): " + why(out) + " [" + cmd + "]");
  std::ifstream m(run_dir / "metrics.jsonl");
  std::string line, last;
  while (std::getline(m, line))
    if (!line.empty()) last = line;
  return util::parse_json(last).at("memory");
}

// The configuration of a case, written to run_dir/run.json.
Config case_config(const Case& c, const fs::path& run_dir, const fs::path& mid, int steps) {
  json cfg = {{"data", {{"seq_len", 64}, {"tokenizer", "bytes"}}},  // presets and init-model dirs have no tokenizer
              {"log", {{"dir", run_dir.string()}}},
              {"train", {{"steps", steps}, {"micro_batch", 1}, {"warmup_steps", 1}, {"device", "cpu"}}}};
  if (c.model == "mid") cfg["model"] = {{"path", mid.string()}};
  else cfg["model"] = {{"preset", c.model}};
  Config conf = Config::from_json(cfg, "bench memory");
  for (auto it = c.set.begin(); it != c.set.end(); ++it) conf.set(it.key(), it.value());
  std::ofstream(run_dir / "run.json") << conf.json().dump(1);
  return conf;
}

// The plan's prediction against what was measured: one row.
json compare_with_plan(const Case& c, const Config& conf, const json& measured, const fs::path& mid) {
  model::ModelConfig mc = c.model == "mid"
                              ? model::ModelConfig::load((mid / "config.json").string())
                              : model::ModelConfig::preset(c.model);
  launcher::PlanRequest req;
  req.world = c.world;
  req.ranks_per_node = c.ranks_per_node > 0 ? c.ranks_per_node : c.world;
  req.stored_bytes = c.model == "mid" ? 2 : 4;
  const planner::Plan plan = launcher::plan_run(conf, mc, req);
  const planner::PhaseEstimate& est = c.eval ? plan.eval_host : plan.train_host;
  const int64_t peak = measured.at("peak_rss").get<int64_t>(), base = measured.at("process_base").get<int64_t>();
  const int64_t predicted = est.total();
  const int64_t floor = (c.eval ? plan.eval_floor : plan.train_floor) + base;
  return {{"name", c.name}, {"phase", c.eval ? "eval" : "train"}, {"world", c.world},
          {"measured_peak_bytes", peak}, {"predicted_bytes", predicted},
          {"prediction_error", static_cast<double>(predicted - peak) / static_cast<double>(peak)},
          {"floor_bytes", floor}, {"measured_over_floor", static_cast<double>(peak) / static_cast<double>(floor)},
          {"goal_over_floor", c.eval ? 1.15 : 1.10}, {"measured", measured}, {"predicted", est.to_json()}};
}

void print_row(const json& row) {
  const json& measured = row["measured"];
  std::string breakdown;
  for (auto it = measured.begin(); it != measured.end(); ++it)
    if (it->is_number_integer() && it.key() != "peak_rss" && it.key() != "tracked" && it->get<int64_t>() >= (1 << 20))
      breakdown += it.key() + " " + mib(it->get<int64_t>()) + ", ";
  // Which of them live in host memory on a GPU run (fsdp.offload's shard state, loading, checkpoints).
  if (measured.contains("placement"))
    for (const auto& [cat, bytes] : measured["placement"]["host"].items())
      if (bytes.get<int64_t>() >= (1 << 20)) breakdown += "host " + cat + " " + mib(bytes.get<int64_t>()) + ", ";
  std::printf("%-44s %9s %9s %+6.1f%% %9s %7.3f  %s(peak at %s)\n", row["name"].get<std::string>().c_str(),
              mib(row["measured_peak_bytes"].get<int64_t>()).c_str(), mib(row["predicted_bytes"].get<int64_t>()).c_str(),
              100 * row["prediction_error"].get<double>(), mib(row["floor_bytes"].get<int64_t>()).c_str(),
              row["measured_over_floor"].get<double>(), breakdown.c_str(), measured.value("peak_phase", "?").c_str());
  std::fflush(stdout);
}

}  // namespace

int run_bench_memory(const std::vector<std::string>& args) {
  using namespace tessera::launcher;
  po::options_description desc("bench memory options");
  desc.add_options()("quick", "the configurations the test suite runs (small models)")(
      "steps", po::value<int>()->default_value(3), "training steps per configuration (the last one is measured)")(
      "dir", po::value<std::string>()->default_value("/tmp"), "scratch directory (models, configs, logs)")(
      "json", "print one JSON object")(
      "only", po::value<std::string>()->default_value(""), "only the configurations whose name contains this text");
  auto vm = parse_command("tessera bench memory [--quick] [--steps 3] [--dir /tmp] [--json]", desc, args);
  if (!vm) return 0;
  const bool quick = vm->count("quick") > 0, as_json = vm->count("json") > 0;
  const int steps = (*vm)["steps"].as<int>();
  TESSERA_CHECK_INPUT(steps >= 2, "--steps must be >= 2 (the first step allocates the optimizer state)");
  const fs::path dir = fs::path((*vm)["dir"].as<std::string>()) / ("tessera-bench-memory-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string exe = self_exe();
  forget_mpi_identity();
  const fs::path mid = make_mid_model(dir, exe);
  json rows = json::array();
  if (!as_json)
    std::printf("%-44s %9s %9s %7s %9s %7s  %s\n", "configuration", "measured", "plan", "error", "floor", "/floor",
                "measured breakdown at the peak (MiB)");
  int index = 0;
  const std::string only = (*vm)["only"].as<std::string>();
  for (const Case& c : cases(quick)) {
    if (!only.empty() && c.name.find(only) == std::string::npos) continue;
    const fs::path run_dir = dir / ("case-" + std::to_string(index++));
    fs::create_directories(run_dir);
    Config conf = case_config(c, run_dir, mid, steps);
    const json measured = measure_case(c, conf, dir, run_dir, mid);
    rows.push_back(compare_with_plan(c, conf, measured, mid));
    if (!as_json) print_row(rows.back());
  }
  if (as_json) std::cout << json{{"configurations", rows}}.dump(1) << std::endl;
  else
    std::printf("MiB per rank (rank 0). plan = tessera plan's host prediction for the phase; floor = shard state + the\n"
                "gathered units the strategy must hold and their gradients + activations + the measured process base;\n"
                "goals: measured/floor <= 1.10 (train), <= 1.15 (eval); |error| <= 10%%.\n");
  std::error_code ec;
  tessera::util::remove_tree(dir, ec);
  return 0;
}

}  // namespace tessera::bench
