// `tessera bench step`: training-step throughput (see bench_step.h). Two modes:
//  - in process, under `mpirun -np W tessera bench step`: FSDP at W ranks against one plain
//    LibTorch process (--baseline single), or FSDP alone (--baseline none: what the driver runs);
//  - the peer driver, `tessera bench step --peer` as one plain process: interleaved rounds of
//    Tessera (mpirun of this binary in the first mode) and the PyTorch DDP peer
//    (benchmarks/torch_peer.py), medians per configuration, ratios and the goals.
#include "benchmarks/bench_step.h"

#include <mpi.h>
#include <torch/torch.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "benchmarks/bench_step_modes.h"
#include "benchmarks/bench_util.h"
#include "benchmarks/child_process.h"
#include "launcher/bootstrap.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "launcher/model_lm.h"
#include "model/registry.h"
#include "runtime/data/dataset.h"
#include "runtime/data/token_file.h"
#include "runtime/memory/tracker.h"
#include "runtime/profile/op_count.h"
#include "runtime/profile/phase.h"
#include "runtime/train/trainer.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/file_tree.h"
#include "util/json.h"

#ifndef TESSERA_PEER_SCRIPT
#define TESSERA_PEER_SCRIPT "benchmarks/torch_peer.py"
#endif

namespace tessera::bench {
namespace {
using Clock = std::chrono::steady_clock;
using nlohmann::json;
namespace fs = std::filesystem;

const char* const kDtypes[] = {"fp32", "bf16"};

// Waits at a barrier without spinning a core (Open MPI's blocking barrier busy-polls), so the
// single-process baseline on rank 0 has the whole machine.
void idle_barrier() {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  int done = 0;
  while (!done) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (!done) usleep(2000);
  }
}

// This process's minor page faults so far (every thread): each is a page the kernel zeroed and
// mapped on first touch.
int64_t minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out = split_on(s, ',');
  out.erase(std::remove(out.begin(), out.end(), std::string()), out.end());
  return out;
}

// Options of both modes (the driver passes the shared ones on to its Tessera runs).
launcher::po::options_description step_options() {
  namespace po = launcher::po;
  po::options_description desc("bench step options");
  desc.add_options()  //
      ("preset", po::value<std::string>()->default_value("small"), "model preset")  //
      ("model-config", po::value<std::string>(), "Hugging Face config.json instead of --preset")  //
      ("seq-len", po::value<int64_t>()->default_value(256), "tokens per sequence")  //
      ("steps", po::value<int>()->default_value(4), "timed steps")  //
      ("warmup", po::value<int>()->default_value(1), "untimed steps first")  //
      ("dtype", po::value<std::string>()->default_value("fp32"), "in process: compute dtype (fsdp.mixed_precision), fp32 or bf16")  //
      ("data", po::value<std::string>()->default_value("/usr/share/common-licenses"), "text or token file to train on")  //
      ("json", "print one JSON object")
      // in process
      ("micro-batch", po::value<int64_t>()->default_value(2), "in process: sequences per rank per step")  //
      ("strategy", po::value<std::string>()->default_value("full_shard"), "in process: FSDP strategy")  //
      ("op-counts", po::value<bool>()->default_value(true),
       "in process: also count operators and host syncs per step (the CPU step, the step as on a GPU, eager)")  //
      ("baseline", po::value<std::string>()->default_value("single"),
       "in process: single (also time one plain LibTorch process with the same global batch) or none")  //
      ("modes", po::value<std::string>(),
       "in process: time these modes against the default in interleaved rounds instead (default, in_backward, int8, "
       "bf16, offload_optimizer, offload_params, or several joined by '+'; see bench_step_modes.h)")
      // peer driver
      ("peer", "run as the driver: Tessera (mpirun) against the PyTorch DDP peer in interleaved rounds")  //
      ("np", po::value<int>()->default_value(2), "peer: ranks per run (hybrid_shard: 2 emulated nodes of --np ranks)")  //
      ("global-batch", po::value<int64_t>()->default_value(4), "peer: sequences per step, all ranks together")  //
      ("rounds", po::value<int>()->default_value(3), "peer and --modes: rounds (each runs every configuration once, shuffled)")  //
      ("strategies", po::value<std::string>()->default_value("full_shard,shard_grad_op,no_shard,hybrid_shard"),
       "peer: Tessera strategies to measure")  //
      ("dtypes", po::value<std::string>()->default_value("fp32,bf16"), "peer: dtypes to measure")  //
      ("python", po::value<std::string>()->default_value("/usr/bin/python3"), "peer: Python with torch (python3-torch)")  //
      ("peer-script", po::value<std::string>()->default_value(TESSERA_PEER_SCRIPT), "peer: the PyTorch peer")  //
      ("mpirun", po::value<std::string>()->default_value("mpirun"), "peer: Open MPI's launcher")  //
      ("timeout", po::value<double>()->default_value(900), "peer: seconds one run may take")  //
      ("verbose", "peer: print every run's command and result");
  return desc;
}

model::ModelConfig model_config(const launcher::po::variables_map& vm) {
  return vm.count("model-config") ? model::ModelConfig::load(vm["model-config"].as<std::string>())
                                  : model::ModelConfig::preset(vm["preset"].as<std::string>());
}

std::string model_name(const launcher::po::variables_map& vm) {
  return vm.count("model-config") ? vm["model-config"].as<std::string>() : vm["preset"].as<std::string>();
}

// ------------------------------------------------------------------------------------------------
// In process: FSDP at W ranks (and optionally one plain LibTorch process)
// ------------------------------------------------------------------------------------------------

// ---- operators and host synchronisations per step (runtime/profile/op_count.h) ------------------

// One counted run of `step` after one uncounted (warm caches, built tables): this rank's counts.
profile::ops::Counts count_ops(const std::function<void()>& step) {
  step();
  profile::ops::start();
  step();
  profile::ops::stop();
  return profile::ops::snapshot();
}

json counts_json(const profile::ops::Counts& c, int64_t layers, int64_t units) {
  json sites = json::object();
  for (const auto& [site, n] : c.sync_sites) sites[site] = n;
  return {{"layer_forward", c.layer_forward},     {"layer_backward", c.layer_backward},
          {"per_layer", layers ? double(c.layer_forward + c.layer_backward) / double(layers) : 0.0},
          {"forward_other", c.forward_other},     {"backward_other", c.backward_other},
          {"optimizer", c.optimizer},             {"optimizer_per_unit", units ? double(c.optimizer) / double(units) : 0.0},
          {"other", c.other},                     {"step_thread_total", c.step_thread_total()},
          {"comm_threads", c.comm_threads},       {"syncs_forward_backward", c.syncs_forward_backward},
          {"syncs_per_step", c.syncs_total},      {"sync_sites", sites}};
}

// The goals of issue 34 on the step as a GPU runs it.
bool op_goals_met(const json& device) {
  return device["optimizer_per_unit"].get<double>() <= 10 && device["syncs_forward_backward"].get<int64_t>() == 0 &&
         device["syncs_per_step"].get<int64_t>() <= 2;
}

std::string fmt(const char* f, double x);  // below

void print_op_counts(const json& ops) {
  printf("operators dispatched per step (rank 0; ATen top-level calls, each >= 1 kernel launch on a GPU) and host syncs:\n");
  printf("  %-44s %9s %9s %9s %10s %9s %7s %7s %9s %9s\n", "", "per layer", "fwd rest", "bwd rest", "optim+norm",
         "per unit", "other", "total", "syncs f/b", "syncs");
  for (const char* k : {"cpu_step", "device_step", "eager"}) {
    if (!ops.contains(k)) continue;
    const json& c = ops[k];
    const std::string per_layer = c["layer_forward"].get<int64_t>() + c["layer_backward"].get<int64_t>() > 0
                                      ? fmt("%.1f", c["per_layer"].get<double>())
                                      : "-";  // eager: its layers are not marked
    printf("  %-44s %9s %9ld %9ld %10ld %9.1f %7ld %7ld %9ld %9ld\n", c["label"].get<std::string>().c_str(),
           per_layer.c_str(), (long)c["forward_other"].get<int64_t>(), (long)c["backward_other"].get<int64_t>(),
           (long)c["optimizer"].get<int64_t>(), c["optimizer_per_unit"].get<double>(), (long)c["other"].get<int64_t>(),
           (long)c["step_thread_total"].get<int64_t>(), (long)c["syncs_forward_backward"].get<int64_t>(),
           (long)c["syncs_per_step"].get<int64_t>());
  }
  const json& d = ops["device_step"];
  printf("  device step's syncs at: %s\n", d["sync_sites"].dump().c_str());
  printf("  goals (device step): optimizer + norm <= 10 per FSDP unit, 0 syncs in forward/backward, <= 2 per step: %s\n",
         op_goals_met(d) ? "met" : "NOT met");
}

// The FSDP step's operator counts as configured (the CPU's fused AdamW loop and host-side norm) and
// as a GPU runs it (train.device_step: the norm, clipping and skip as tensor ops on the device, handed
// to the fused optimizer, for which the CPU loop stands).
json fsdp_op_counts(const model::ModelConfig& cfg, const comm::ProcessGroups& groups, const fsdp::Options& fopts,
                    train::Settings topts, const std::shared_ptr<data::TokenDataset>& dataset) {
  json out;
  for (bool device_step : {false, true}) {
    topts.train.device_step = device_step;
    topts.train.steps = 3;
    train::Trainer trainer(launcher::make_causal_lm(cfg), groups, fopts, topts, dataset, {});
    launcher::InitWeightSource src(cfg, 1);
    trainer.load_weights(src);
    const profile::ops::Counts c = count_ops([&] { trainer.train_step(); });
    json j = counts_json(c, cfg.num_hidden_layers, cfg.num_hidden_layers + 1);
    j["label"] = device_step ? "Tessera FSDP, device step (as on a GPU)" : "Tessera FSDP, CPU step (fused AdamW loop)";
    out[device_step ? "device_step" : "cpu_step"] = j;
  }
  return out;
}

// The baseline: one plain LibTorch process (torch::optim::AdamW, clip_grad_norm_) on the same global
// batch with all the threads; its tokens/s, and its operator counts (eager) into (*ops)["eager"] (ops
// non-null).
double single_process_tps(const model::ModelConfig& cfg, at::ScalarType dtype, const train::Settings& topts,
                          data::TokenDataset& dataset, int64_t global_batch, int warmup, int steps, int threads,
                          json* ops) {
  const int saved = torch::get_num_threads();
  torch::set_num_threads(threads);
  std::shared_ptr<model::CausalLmModule> m = cfg.spec().build(cfg, torch::kCPU);
  {
    torch::NoGradGuard no_grad;
    for (auto& [name, t] : m->named_hf_parameters()) t.copy_(cfg.spec().init_tensor({name, t.sizes().vec()}, 1));
  }
  if (dtype != at::kFloat) m->to(dtype);
  torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(topts.schedule.lr));
  std::vector<int64_t> idx(global_batch);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>(i % dataset.num_sequences());
  const data::Batch batch = dataset.batch(idx);
  namespace F = torch::nn::functional;
  auto one_step = [&] {
    opt.zero_grad();
    torch::Tensor loss;
    {
      profile::Phase forward(profile::Part::Forward);
      auto logits = m->forward(batch.inputs).to(torch::kFloat32);
      loss = F::cross_entropy(logits.reshape({-1, logits.size(-1)}), batch.labels.reshape({-1}),
                              F::CrossEntropyFuncOptions().ignore_index(data::Batch::kIgnore));
    }
    {
      profile::Phase backward(profile::Part::Backward);
      loss.backward();
    }
    profile::Phase optimizer(profile::Part::Optimizer);
    torch::nn::utils::clip_grad_norm_(m->parameters(), 1.0);
    opt.step();
  };
  for (int i = 0; i < std::max(warmup, 1); ++i) one_step();
  auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) one_step();
  const double tps = double(global_batch * dataset.seq_len()) * steps / std::chrono::duration<double>(Clock::now() - t0).count();
  if (ops != nullptr) {
    json eager = counts_json(count_ops(one_step), 0, cfg.num_hidden_layers + 1);
    eager["label"] = "plain LibTorch eager (torch::optim::AdamW)";
    (*ops)["eager"] = eager;
  }
  torch::set_num_threads(saved);
  return tps;
}

// The FSDP step at W ranks, timed: tokens/s, each timed step's time and breakdown (rank 0), and
// rank 0's page faults per timed step and its allocations of >= 1 MiB served again from the
// allocator's cache / mapped anew (memory::reuse_large_blocks).
struct FsdpTiming {
  double tps = 0, faults_per_step = 0;
  std::vector<double> step_times;
  std::vector<profile::Breakdown> times;
  int64_t cache_hits = 0, cache_misses = 0;
};

FsdpTiming time_fsdp(const model::ModelConfig& cfg, const fsdp::Options& fopts, const train::Settings& topts,
                     const std::shared_ptr<data::TokenDataset>& dataset, int warmup, int steps, double global_tokens) {
  const launcher::Bootstrap& b = launcher::current();
  FsdpTiming t;
  train::Trainer trainer(launcher::make_causal_lm(cfg), b.groups, fopts, topts, dataset, {});
  launcher::InitWeightSource src(cfg, 1);
  trainer.load_weights(src);
  for (int i = 0; i < warmup; ++i) trainer.train_step();
  MPI_Barrier(MPI_COMM_WORLD);
  const int64_t faults0 = minor_faults();
  const memory::CacheStats cache0 = memory::cache_stats();
  auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) {
    const train::StepRecord r = trainer.train_step();
    t.step_times.push_back(r.step_time_s);
    t.times.push_back(r.time);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  t.tps = global_tokens * steps / std::chrono::duration<double>(Clock::now() - t0).count();
  t.faults_per_step = static_cast<double>(minor_faults() - faults0) / steps;
  const memory::CacheStats cache1 = memory::cache_stats();
  t.cache_hits = cache1.hits - cache0.hits;
  t.cache_misses = cache1.misses - cache0.misses;
  return t;
}

// What run_in_process measured, for its report (rank 0).
struct StepBench {
  std::string model, strategy, dtype, baseline;
  int64_t parameters = 0, T = 0, M = 0;
  int W = 0, nodes = 0, threads = 0, total_threads = 0, warmup = 0, steps = 0;
  FsdpTiming fsdp;
  double single_tps = 0;
  json ops;  // null unless --op-counts
};

void report_step_bench(const StepBench& s, bool as_json) {
  const double ratio = s.fsdp.tps / s.single_tps;
  if (as_json) {
    json j{{"model", s.model}, {"parameters", s.parameters}, {"world_size", s.W},
           {"nodes", s.nodes}, {"seq_len", s.T}, {"global_batch", s.W * s.M}, {"threads_per_rank", s.threads},
           {"threads_total", s.total_threads}, {"strategy", s.strategy}, {"dtype", s.dtype}, {"warmup", s.warmup},
           {"steps", s.steps}, {"fsdp_tokens_per_s", s.fsdp.tps}, {"step_time_s", s.fsdp.step_times},
           {"time", profile::median(s.fsdp.times).to_json()}, {"page_faults_per_step", s.fsdp.faults_per_step},
           {"large_allocations", {{"reused", s.fsdp.cache_hits}, {"mapped", s.fsdp.cache_misses}}}};
    if (s.baseline == "single")
      j.update({{"single_tokens_per_s", s.single_tps}, {"ratio", ratio}, {"goal", 0.85}, {"goal_met", ratio >= 0.85}});
    if (!s.ops.is_null()) j["ops"] = s.ops;
    std::cout << j.dump() << std::endl;
    return;
  }
  printf("# bench step: %s, seq_len %ld, global batch %d x %ld sequences, %s, %d threads in total\n", s.model.c_str(),
         static_cast<long>(s.T), s.W, static_cast<long>(s.M), s.dtype.c_str(), s.total_threads);
  printf("%-34s %12.1f tokens/s\n", ("FSDP " + s.strategy + ", W=" + std::to_string(s.W)).c_str(), s.fsdp.tps);
  const profile::Breakdown m = profile::median(s.fsdp.times);
  printf("FSDP step time (median of %d, rank 0): %.3f s: %s\n", s.steps, m.step_s, m.summary().c_str());
  printf("rank 0 per timed step: %.0f page faults; allocations of >= 1 MiB: %ld reused, %ld mapped anew\n",
         s.fsdp.faults_per_step, static_cast<long>(s.fsdp.cache_hits), static_cast<long>(s.fsdp.cache_misses));
  if (s.baseline == "single") {
    printf("%-34s %12.1f tokens/s\n", "single process (plain LibTorch)", s.single_tps);
    printf("ratio FSDP / single: %.3f (goal >= 0.85: %s)\n", ratio, ratio >= 0.85 ? "met" : "NOT met");
  }
  if (!s.ops.is_null()) print_op_counts(s.ops);
}

// --data as byte tokens in rows of seq_len (one text piece per row: plain causal attention).
std::shared_ptr<data::TokenDataset> bench_dataset(const launcher::po::variables_map& vm, const model::ModelConfig& cfg,
                                                  int64_t seq_len) {
  text::ByteTokenizer tok;
  TESSERA_CHECK_INPUT(tok.vocab_size() <= cfg.vocab_size,
                      "bench step: byte tokens need a vocab_size of at least " + std::to_string(tok.vocab_size()) +
                          ", model " + model_name(vm) + " has " + std::to_string(cfg.vocab_size));
  data::PackOptions pack;
  pack.seq_len = seq_len;
  pack.packing = false;
  pack.vocab_limit = cfg.vocab_size;
  return data::load_dataset({vm["data"].as<std::string>()}, tok, pack);
}

// --modes: the default's options as run_in_process built them, handed to bench_step_modes.cpp.
int run_modes(const launcher::po::variables_map& vm, const std::vector<StepMode>& modes, const StepBench& s,
              const model::ModelConfig& cfg, const fsdp::Options& fopts, const train::Settings& topts,
              std::shared_ptr<data::TokenDataset> dataset) {
  StepModesRun r;
  r.cfg = cfg, r.model = model_name(vm), r.strategy = vm["strategy"].as<std::string>(), r.dtype = s.dtype;
  r.fopts = fopts, r.topts = topts, r.dataset = std::move(dataset);
  r.warmup = s.warmup, r.steps = s.steps, r.rounds = vm["rounds"].as<int>();
  r.seq_len = s.T, r.micro_batch = s.M, r.json = vm.count("json") > 0;
  return run_step_modes(r, modes);
}

int run_in_process(const launcher::po::variables_map& vm) {
  using namespace tessera::launcher;
  const Bootstrap& b = current();
  const auto cfg = model_config(vm);
  StepBench s;
  s.T = vm["seq-len"].as<int64_t>(), s.M = vm["micro-batch"].as<int64_t>();
  s.steps = vm["steps"].as<int>(), s.warmup = vm["warmup"].as<int>();
  s.baseline = vm["baseline"].as<std::string>(), s.dtype = vm["dtype"].as<std::string>();
  std::vector<StepMode> modes;
  collectively([&] {  // bad input: one line (rank 0's), exit code 2 on every rank
    TESSERA_CHECK_INPUT(s.T > 0 && s.M > 0 && s.steps > 0 && s.warmup >= 0,
                        "--seq-len, --micro-batch and --steps must be positive, --warmup >= 0");
    TESSERA_CHECK_INPUT(s.baseline == "single" || s.baseline == "none", "--baseline must be single or none, got '" + s.baseline + "'");
    if (vm.count("modes")) modes = parse_step_modes(vm["modes"].as<std::string>());
  });
  fsdp::Options fopts;
  fopts.strategy = fsdp::parse_strategy(vm["strategy"].as<std::string>());
  fopts.param_dtype = fsdp::parse_dtype(s.dtype);
  auto dataset = bench_dataset(vm, cfg, s.T);
  s.W = b.world_size;
  MPI_Allreduce(&b.threads, &s.total_threads, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  train::Settings topts;
  topts.train.steps = s.warmup + s.steps;
  topts.train.micro_batch = s.M;
  if (!modes.empty()) return run_modes(vm, modes, s, cfg, fopts, topts, dataset);
  s.fsdp = time_fsdp(cfg, fopts, topts, dataset, s.warmup, s.steps, static_cast<double>(s.W * s.M * s.T));
  // Operators and host syncs per step; then one plain process, same global batch, all the threads.
  const bool counted = vm["op-counts"].as<bool>();
  if (counted) s.ops = fsdp_op_counts(cfg, b.groups, fopts, topts, dataset);
  if (s.baseline == "single" && b.world_rank == 0)
    s.single_tps = single_process_tps(cfg, fopts.param_dtype, topts, *dataset, s.W * s.M, s.warmup, s.steps,
                                      s.total_threads, counted ? &s.ops : nullptr);
  idle_barrier();
  if (b.world_rank != 0) return 0;
  s.model = model_name(vm), s.strategy = vm["strategy"].as<std::string>(), s.parameters = cfg.num_parameters();
  s.nodes = b.num_nodes, s.threads = b.threads;
  report_step_bench(s, vm.count("json") > 0);
  return 0;
}

// ------------------------------------------------------------------------------------------------
// The peer driver
// ------------------------------------------------------------------------------------------------

// One configuration the driver measures: Tessera with a strategy, or the peer (always DDP).
struct RunSpec {
  bool peer = false;
  std::string strategy;  // Tessera's strategy; "ddp" for the peer
  std::string dtype;
  int ranks = 0;
  int nodes = 1;           // 2: emulated nodes of ranks / 2 ranks each, over TCP loopback
  bool reference = false;  // full_shard at hybrid_shard's ranks: measured as that goal's baseline
  std::vector<json> samples;  // what the run printed, one per round

  std::string label() const {
    std::string s = (peer ? "peer DDP " : "Tessera " + strategy + " ") + dtype + " at " + std::to_string(ranks) + " ranks";
    return nodes > 1 ? s + " (" + std::to_string(nodes) + " nodes over TCP)" : s;
  }
  const char* rate_key() const { return peer ? "tokens_per_s" : "fsdp_tokens_per_s"; }
  // Median over rounds of a numeric field of the runs' JSON (a JSON pointer, e.g. "/tokens_per_s").
  double median(const std::string& pointer) const {
    std::vector<double> v;
    for (const auto& s : samples)
      if (s.contains(json::json_pointer(pointer))) v.push_back(s.at(json::json_pointer(pointer)).get<double>());
    return median_of(v);
  }
  double tokens_per_s() const { return median(std::string("/") + rate_key()); }
};

// One line of the table: a Tessera configuration, its DDP peer (same dtype and ranks), its goal.
struct Row {
  const RunSpec* tessera;
  const RunSpec* peer;
  const RunSpec* peer_fp32;  // DDP fp32 at the same ranks (bf16 rows: the baseline), may be null
  double goal = 0;           // 0: none
  double ratio() const { return tessera->tokens_per_s() / peer->tokens_per_s(); }
  // What the goal is measured on: the baseline is DDP in fp32 (its bf16 figure, 1.9-2.1x,
  // is Tessera bf16 against DDP fp32), so a bf16 row's goal uses peer_fp32.
  const RunSpec* goal_peer() const { return tessera->dtype == "fp32" ? peer : peer_fp32; }
  double goal_ratio() const { return tessera->tokens_per_s() / goal_peer()->tokens_per_s(); }
};

// The goals: Tessera / DDP at --np ranks.
double goal_vs_ddp(const std::string& strategy, const std::string& dtype) {
  if (strategy == "no_shard" && dtype == "fp32") return 1.15;
  if (strategy == "full_shard" && dtype == "fp32") return 1.25;
  if (strategy == "full_shard" && dtype == "bf16") return 2.2;
  return 0;
}
constexpr double kHybridGoal = 0.9;  // hybrid_shard 2 x np over TCP / full_shard 2np over shared memory

struct Driver {
  launcher::po::variables_map vm;
  model::ModelConfig cfg;
  int np = 2, rounds = 3, steps = 4, warmup = 1, threads = 1;
  int64_t T = 256, global_batch = 4;
  std::vector<std::string> strategies, dtypes;
  std::string work, config_path, tokens_path, self_exe;
  std::vector<RunSpec> runs;
  std::string peer_torch = "?";

  std::vector<std::string> tessera_command(const RunSpec& r) const {
    std::vector<std::string> c = {vm["mpirun"].as<std::string>(), "-np", std::to_string(r.ranks), "--oversubscribe",
                                  "--bind-to", "none"};
    auto add = [&c](std::initializer_list<std::string> more) { c.insert(c.end(), more); };
    // Open MPI 5's launcher (PRRTE) finds no out-of-band interface when limited to "lo", and its TCP
    // BTL no reachable pairing on "lo" by name: the loopback subnet serves 4.1 and 5; oob on lo for 4.x.
#if defined(OMPI_MAJOR_VERSION) && OMPI_MAJOR_VERSION < 5
    add({"--mca", "oob_tcp_if_include", "lo"});
#endif
    if (geteuid() == 0) add({"--allow-run-as-root"});
    if (r.nodes > 1) add({"--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "127.0.0.1/8"});
    add({self_exe, "bench", "step", "--baseline", "none", "--op-counts", "false", "--json", "--strategy", r.strategy, "--dtype", r.dtype,
         "--model-config", config_path, "--data", tokens_path, "--seq-len", std::to_string(T), "--micro-batch",
         std::to_string(global_batch / r.ranks), "--steps", std::to_string(steps), "--warmup", std::to_string(warmup),
         "--threads", std::to_string(threads)});
    if (r.nodes > 1) add({"--ranks-per-node", std::to_string(r.ranks / r.nodes)});
    return c;
  }

  std::vector<std::string> peer_command(const RunSpec& r) const {
    const train::Settings d;  // Tessera's hyper-parameters, the same for the peer
    auto num = [](double x) {  // shortest text that reads back as the same double
      char buf[32];
      return std::string(buf, std::to_chars(buf, buf + sizeof(buf), x).ptr);
    };
    return {vm["python"].as<std::string>(), vm["peer-script"].as<std::string>(), "run", "--config", config_path,
            "--tokens", tokens_path, "--seq-len", std::to_string(T), "--global-batch", std::to_string(global_batch),
            "--nproc", std::to_string(r.ranks), "--threads", std::to_string(threads), "--dtype", r.dtype,
            "--warmup", std::to_string(warmup), "--steps", std::to_string(steps),
            "--total-steps", std::to_string(warmup + steps), "--lr", num(d.schedule.lr), "--min-lr", num(d.schedule.min_lr),
            "--warmup-steps", std::to_string(d.schedule.warmup_steps), "--schedule", util::name_of(optim::schedule_names(), d.schedule.kind),
            "--weight-decay", num(d.optim.weight_decay), "--beta1", num(d.optim.beta1), "--beta2", num(d.optim.beta2),
            "--eps", num(d.optim.eps), "--clip", num(d.optim.clip)};
  }

  // Runs one configuration once; its JSON line joins the samples.
  void measure(RunSpec& r) {
    const auto cmd = r.peer ? peer_command(r) : tessera_command(r);
    std::string line;
    for (const auto& a : cmd) line += (line.empty() ? "" : " ") + a;
    if (vm.count("verbose")) std::cerr << "# run: " << line << std::endl;
    const double timeout = vm["timeout"].as<double>();
    const ChildResult res = run_child(cmd, {"OMP_NUM_THREADS=" + std::to_string(threads)}, timeout, work);
    const std::string why = res.timed_out ? "ran past --timeout " + std::to_string((int)timeout) + " s"
                                          : "exit code " + std::to_string(res.exit_code);
    if (res.exit_code != 0 || res.timed_out)  // the child's own exit code 2 (bad input) stays 2
      throw Error(res.exit_code == 2 ? ErrorKind::Input : ErrorKind::Internal,
                  "bench step --peer: " + r.label() + " failed (" + why + "): " +
                      error_line(res.err.empty() ? res.out : res.err) + " [command: " + line + "]");
    json out;
    try {
      out = util::parse_json(last_line(res.out));
      out.at(r.rate_key()).get<double>();
    } catch (const std::exception&) {
      throw Error(ErrorKind::Internal, "bench step --peer: " + r.label() + " printed no result line: '" +
                                           last_line(res.out) + "' [command: " + line + "]");
    }
    if (r.peer && out.contains("torch")) peer_torch = out["torch"].get<std::string>();
    if (vm.count("verbose")) std::cerr << "# " << r.label() << ": " << out.dump() << std::endl;
    r.samples.push_back(std::move(out));
  }

  const RunSpec* find(bool peer, const std::string& strategy, const std::string& dtype, int ranks, int nodes) const {
    for (const auto& r : runs)
      if (r.peer == peer && (peer || r.strategy == strategy) && r.dtype == dtype && r.ranks == ranks && r.nodes == nodes)
        return &r;
    return nullptr;
  }
};

void parse_driver(Driver& d) {
  const auto& vm = d.vm;
  const auto& g = launcher::global_options();
  TESSERA_CHECK_INPUT(g.ranks_per_node == 0,
                      "bench step --peer: --ranks-per-node does not apply (hybrid_shard runs 2 emulated nodes of --np ranks)");
  d.np = vm["np"].as<int>();
  d.rounds = vm["rounds"].as<int>();
  d.steps = vm["steps"].as<int>();
  d.warmup = vm["warmup"].as<int>();
  d.T = vm["seq-len"].as<int64_t>();
  d.global_batch = vm["global-batch"].as<int64_t>();
  TESSERA_CHECK_INPUT(d.np >= 1 && d.rounds >= 1 && d.steps >= 1 && d.warmup >= 0 && d.T >= 1,
                      "bench step --peer: --np, --rounds, --steps and --seq-len must be >= 1, --warmup >= 0");
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  d.threads = g.threads > 0 ? g.threads : static_cast<int>(std::max(1u, cores / static_cast<unsigned>(d.np)));
  auto check_list = [](const std::vector<std::string>& got, const auto& valid, const std::string& option,
                       const std::string& what) {
    const std::vector<std::string> names(std::begin(valid), std::end(valid));
    TESSERA_CHECK_INPUT(!got.empty(), "bench step --peer: " + option + " is empty");
    for (const auto& s : got)
      if (std::find(names.begin(), names.end(), s) == names.end()) {
        const std::string hint = launcher::closest_match(s, names);
        throw TESSERA_INPUT_ERROR("bench step --peer: unknown " + what + " '" + s + "' in " + option +
                                  (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
      }
  };
  d.strategies = split_list(vm["strategies"].as<std::string>());
  d.dtypes = split_list(vm["dtypes"].as<std::string>());
  check_list(d.strategies, fsdp::strategy_names(), "--strategies", "strategy");
  check_list(d.dtypes, kDtypes, "--dtypes", "dtype");
  const bool hybrid = std::count(d.strategies.begin(), d.strategies.end(), "hybrid_shard") > 0;
  const int64_t need = hybrid ? 2 * d.np : d.np;
  TESSERA_CHECK_INPUT(d.global_batch >= need && d.global_batch % need == 0 && (d.global_batch % d.np) == 0,
                      "bench step --peer: --global-batch " + std::to_string(d.global_batch) + " must be a multiple of " +
                          std::to_string(need) + " (the ranks of every run" + (hybrid ? ", hybrid_shard: 2 x --np" : "") + ")");
  d.cfg = model_config(vm);
  for (const char* f : {"peer-script"})
    TESSERA_CHECK_INPUT(fs::is_regular_file(vm[f].as<std::string>()),
                        "bench step --peer: --" + std::string(f) + " " + vm[f].as<std::string>() + ": no such file");
}

// config.json and a token file of (warmup + steps) global batches, read by both sides.
void write_inputs(Driver& d) {
  char tmpl[] = "/tmp/tessera-bench-step.XXXXXX";
  TESSERA_CHECK(mkdtemp(tmpl) != nullptr, "cannot create a temporary directory in /tmp");
  d.work = tmpl;
  d.config_path = d.work + "/config.json";
  d.tokens_path = d.work + "/tokens.bin";
  std::ofstream(d.config_path) << d.cfg.to_json().dump(2) << std::endl;
  // The --data documents' tokens one after another, repeated to the length the runs need, as one
  // plain-text document: both sides read sequence i as tokens [i*T, i*T + T + 1).
  text::ByteTokenizer tok;
  TESSERA_CHECK_INPUT(tok.vocab_size() <= d.cfg.vocab_size,
                      "bench step --peer: byte tokens need a vocab_size of at least " + std::to_string(tok.vocab_size()) +
                          ", model " + model_name(d.vm) + " has " + std::to_string(d.cfg.vocab_size));
  data::ReadStats stats;
  std::vector<int32_t> stream;
  for (const auto& store : data::load_documents({d.vm["data"].as<std::string>()}, tok, *text::make_chat_template("llama2"), stats))
    for (int64_t i = 0; i < store->num_tokens(); ++i) stream.push_back(store->id(i));
  TESSERA_CHECK_INPUT(static_cast<int64_t>(stream.size()) > d.T,
                      "bench step --peer: --data " + d.vm["data"].as<std::string>() + " has " + std::to_string(stream.size()) +
                          " tokens, fewer than one sequence of --seq-len " + std::to_string(d.T) + " + 1");
  const size_t n = static_cast<size_t>(d.global_batch * (d.warmup + d.steps) * d.T + 1);
  std::vector<int32_t> tokens(n);
  for (size_t i = 0; i < n; ++i) tokens[i] = stream[i % stream.size()];
  data::TokenFileWriter out(d.tokens_path, static_cast<uint32_t>(tok.vocab_size()));
  out.begin_document(/*text=*/true, 0);
  out.append(tokens.data(), std::vector<uint8_t>(n, 1).data(), n);
  out.end_document();
  out.finish();
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  TESSERA_CHECK(len > 0, "cannot read /proc/self/exe");
  d.self_exe.assign(exe, static_cast<size_t>(len));
}

// What runs: every requested strategy x dtype (hybrid_shard on 2 x np ranks over TCP, with
// full_shard on the same ranks over shared memory as its reference) and the DDP peer at every rank
// count and dtype that occurs.
void plan(Driver& d) {
  const bool hybrid = std::count(d.strategies.begin(), d.strategies.end(), "hybrid_shard") > 0;
  for (const auto& dt : d.dtypes) {
    for (const auto& s : d.strategies) {
      RunSpec r;
      r.strategy = s, r.dtype = dt;
      r.ranks = s == "hybrid_shard" ? 2 * d.np : d.np;
      r.nodes = s == "hybrid_shard" ? 2 : 1;
      d.runs.push_back(r);
    }
    if (hybrid && !d.find(false, "full_shard", dt, 2 * d.np, 1)) d.runs.push_back({false, "full_shard", dt, 2 * d.np, 1, true});
    std::set<int> ranks;
    for (const auto& r : d.runs)
      if (!r.peer && r.dtype == dt) ranks.insert(r.ranks);
    for (int n : ranks) d.runs.push_back({true, "ddp", dt, n, 1, false});
  }
}

std::vector<Row> rows_of(const Driver& d) {
  std::vector<Row> rows;
  for (const auto& r : d.runs) {
    if (r.peer) continue;
    Row row{&r, d.find(true, "", r.dtype, r.ranks, 1), d.find(true, "", "fp32", r.ranks, 1),
            r.reference ? 0 : goal_vs_ddp(r.strategy, r.dtype)};
    if (!row.goal_peer()) row.goal = 0;  // bf16 without fp32 runs: no DDP fp32 to hold it against
    rows.push_back(row);
  }
  return rows;
}

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, x);
  return buf;
}

std::string goal_text(double ratio, double goal) {
  if (goal <= 0) return "";
  return fmt(">= %.2fx: ", goal) + (ratio >= goal ? "met" : "NOT met");
}

// The table's columns: header and cell. A new column (e.g. a step-time breakdown field that both
// runs print in their JSON) is one more entry: Row's RunSpecs give medians over rounds of any field.
struct Column {
  std::string header;
  int width;
  std::function<std::string(const Row&)> cell;
};

std::vector<Column> columns() {
  return {
      {"strategy", 14, [](const Row& r) { return r.tessera->strategy; }},
      {"ranks", 6,
       [](const Row& r) {
         return r.tessera->nodes > 1 ? std::to_string(r.tessera->nodes) + "x" + std::to_string(r.tessera->ranks / r.tessera->nodes)
                                     : std::to_string(r.tessera->ranks);
       }},
      {"link", 5, [](const Row& r) { return std::string(r.tessera->nodes > 1 ? "tcp" : "shm"); }},
      {"dtype", 6, [](const Row& r) { return r.tessera->dtype; }},
      {"Tessera tok/s", 14, [](const Row& r) { return fmt("%.1f", r.tessera->tokens_per_s()); }},
      {"DDP tok/s", 10, [](const Row& r) { return fmt("%.1f", r.peer->tokens_per_s()); }},
      {"Tessera/DDP", 12, [](const Row& r) { return fmt("%.2fx", r.ratio()); }},
      {"vs DDP fp32", 12,
       [](const Row& r) {
         return r.tessera->dtype == "fp32" || !r.peer_fp32 ? std::string("")
                                                           : fmt("%.2fx", r.tessera->tokens_per_s() / r.peer_fp32->tokens_per_s());
       }},
      {"goal", 24, [](const Row& r) { return r.goal > 0 ? "vs DDP " + r.goal_peer()->dtype + " " + goal_text(r.goal_ratio(), r.goal) : ""; }},
  };
}

// A Tessera configuration's step-time breakdown: medians over rounds of each field of "time".
profile::Breakdown breakdown_of(const RunSpec& r) {
  profile::Breakdown b;
  b.step_s = r.median("/time/step_s");
  for (int i = 0; i < profile::kParts; ++i)
    b.part_s[i] = r.median(std::string("/time/") + profile::part_name(static_cast<profile::Part>(i)) + "_s");
  b.idle_s = r.median("/time/idle_s");
  b.comm_s = r.median("/time/comm_s");
  b.exposed_s = r.median("/time/exposed_comm_s");
  b.overlap = r.median("/time/overlap");
  return b;
}

// hybrid_shard (2 nodes over TCP) against full_shard at the same ranks over shared memory.
struct HybridGoal {
  std::string dtype;
  double ratio;
};
std::vector<HybridGoal> hybrid_goals(const Driver& d) {
  std::vector<HybridGoal> out;
  for (const auto& dt : d.dtypes) {
    const RunSpec* h = d.find(false, "hybrid_shard", dt, 2 * d.np, 2);
    const RunSpec* f = d.find(false, "full_shard", dt, 2 * d.np, 1);
    if (h && f) out.push_back({dt, h->tokens_per_s() / f->tokens_per_s()});
  }
  return out;
}

// Every run once per round, in a shuffled order (see shuffle_order).
void measure_rounds(Driver& d) {
  std::vector<size_t> order(d.runs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::mt19937 rng(20261201);
  for (int round = 0; round < d.rounds; ++round) {
    shuffle_order(order, rng);
    const auto t0 = Clock::now();
    for (size_t k : order) d.measure(d.runs[k]);
    std::cerr << "# bench step --peer: round " << round + 1 << "/" << d.rounds << " done ("
              << d.runs.size() << " runs, " << fmt("%.0f", std::chrono::duration<double>(Clock::now() - t0).count())
              << " s)" << std::endl;
  }
}

json peer_json(const Driver& d, const std::vector<Row>& rows, const std::vector<HybridGoal>& hybrid) {
  json configs = json::array(), goals = json::array();
  auto samples = [](const RunSpec* s) {
    json v = json::array();
    for (const auto& x : s->samples) v.push_back(x.at(s->rate_key()));
    return v;
  };
  for (const auto& r : rows) {
    json c{{"strategy", r.tessera->strategy}, {"dtype", r.tessera->dtype}, {"ranks", r.tessera->ranks},
           {"reference", r.tessera->reference},
           {"nodes", r.tessera->nodes}, {"link", r.tessera->nodes > 1 ? "tcp" : "shm"},
           {"tessera_tokens_per_s", r.tessera->tokens_per_s()}, {"peer_tokens_per_s", r.peer->tokens_per_s()},
           {"ratio", r.ratio()}, {"tessera_samples", samples(r.tessera)}, {"peer_samples", samples(r.peer)},
           {"tessera_time", breakdown_of(*r.tessera).to_json()}};
    if (r.tessera->dtype != "fp32" && r.peer_fp32)
      c["ratio_vs_peer_fp32"] = r.tessera->tokens_per_s() / r.peer_fp32->tokens_per_s();
    if (r.goal > 0) {
      c["goal"] = r.goal;
      c["goal_met"] = r.goal_ratio() >= r.goal;
      goals.push_back({{"what", r.tessera->strategy + " " + r.tessera->dtype + " / DDP " + r.goal_peer()->dtype},
                       {"ratio", r.goal_ratio()}, {"goal", r.goal}, {"met", r.goal_ratio() >= r.goal}});
    }
    configs.push_back(c);
  }
  for (const auto& h : hybrid)
    goals.push_back({{"what", "hybrid_shard 2x" + std::to_string(d.np) + " tcp / full_shard " + std::to_string(2 * d.np) +
                                  " shm " + h.dtype},
                     {"ratio", h.ratio}, {"goal", kHybridGoal}, {"met", h.ratio >= kHybridGoal}});
  return {{"bench", "step"},
          {"model", model_name(d.vm)},
          {"parameters", d.cfg.num_parameters()},
          {"seq_len", d.T},
          {"global_batch", d.global_batch},
          {"threads_per_rank", d.threads},
          {"np", d.np},
          {"rounds", d.rounds},
          {"warmup", d.warmup},
          {"steps", d.steps},
          {"peer", {{"what", "PyTorch DistributedDataParallel over gloo"}, {"torch", d.peer_torch},
                    {"script", d.vm["peer-script"].as<std::string>()}}},
          {"configs", configs},
          {"goals", goals}};
}

void print_peer_table(const Driver& d, const std::vector<Row>& rows, const std::vector<HybridGoal>& hybrid) {
  printf("# bench step --peer: %s (%.1fM parameters), seq_len %ld, global batch %ld sequences (%.0f tokens/step), "
         "%d torch thread(s) per rank\n",
         model_name(d.vm).c_str(), d.cfg.num_parameters() / 1e6, static_cast<long>(d.T),
         static_cast<long>(d.global_batch), static_cast<double>(d.global_batch * d.T), d.threads);
  printf("# Tessera: mpirun -np R tessera bench step (shm: one node, Open MPI's shared memory; hybrid_shard: 2 emulated\n"
         "#   nodes of %d ranks, --mca btl self,tcp on loopback). Peer: PyTorch %s DistributedDataParallel over gloo\n"
         "#   (benchmarks/torch_peer.py: the same Llama equations, AdamW, clipping, schedule, tokens and threads).\n"
         "#   DDP is the peer of every strategy: it is the baseline users compare a sharded trainer against.\n",
         d.np, d.peer_torch.c_str());
  printf("# %d round(s), each running every configuration once in a shuffled order; per run %d warm-up + %d timed steps;\n"
         "#   medians over rounds. Measured on a shared machine: expect noise between invocations.\n",
         d.rounds, d.warmup, d.steps);
  const auto cols = columns();
  auto pad = [](std::string cell, int width) { return cell.append(std::max<int>(1, width - (int)cell.size()), ' '); };
  std::string head;
  for (const auto& c : cols) head += pad(c.header, c.width);
  printf("%s\n", head.c_str());
  for (const auto& r : rows) {
    std::string line;
    for (const auto& c : cols) line += pad(c.cell(r), c.width);
    if (r.tessera->reference) line += "(reference of hybrid_shard)";
    printf("%s\n", line.c_str());
  }
  for (const auto& h : hybrid)
    printf("hybrid_shard 2x%d over TCP / full_shard at %d ranks over shared memory, %s: %.2fx (goal %s)\n", d.np,
           2 * d.np, h.dtype.c_str(), h.ratio, goal_text(h.ratio, kHybridGoal).c_str());
  printf("# Where Tessera's step time goes (rank 0, medians over rounds of each run's median step):\n");
  for (const auto& r : rows) {
    const profile::Breakdown b = breakdown_of(*r.tessera);
    printf("%-44s %.3f s: %s\n", r.tessera->label().c_str(), b.step_s, b.summary().c_str());
  }
}

int run_driver(Driver& d) {
  parse_driver(d);
  write_inputs(d);
  plan(d);
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      tessera::util::remove_tree(dir, ec);
    }
  } cleanup{d.work};
  measure_rounds(d);
  const auto rows = rows_of(d);
  const auto hybrid = hybrid_goals(d);
  if (d.vm.count("json"))
    std::cout << peer_json(d, rows, hybrid).dump() << std::endl;
  else
    print_peer_table(d, rows, hybrid);
  return 0;
}

// --modes runs in process and replaces the single-process baseline and the operator counts; --rounds
// applies to it and to --peer.
void check_modes_options(const launcher::po::variables_map& vm, bool peer) {
  auto given = [&](const char* o) { return vm.count(o) && !vm[o].defaulted(); };
  const bool modes = vm.count("modes") > 0;
  TESSERA_CHECK_INPUT(!peer || !modes, "bench step: --modes does not apply with --peer (it runs under mpirun)");
  TESSERA_CHECK_INPUT(peer || modes || !given("rounds"), "bench step: --rounds applies only with --peer or --modes");
  TESSERA_CHECK_INPUT(!modes || vm["rounds"].as<int>() >= 1, "bench step: --rounds must be >= 1");
  TESSERA_CHECK_INPUT(!modes || !given("baseline") || vm["baseline"].as<std::string>() == "none",
                      "bench step: --modes times the modes against the default step: --baseline must be none");
  TESSERA_CHECK_INPUT(!modes || !given("op-counts") || !vm["op-counts"].as<bool>(),
                      "bench step: --modes does not count operators: --op-counts must be false");
}

}  // namespace

bool bench_step_is_driver(const std::vector<std::string>& args) {
  return !args.empty() && args[0] == "step" && std::find(args.begin(), args.end(), "--peer") != args.end();
}

int run_bench_step(const std::vector<std::string>& args) {
  auto vm = launcher::parse_command(
      "tessera bench step [--preset small] [--seq-len 256] [--micro-batch 2] [--steps 4] [--strategy S] [--dtype fp32|bf16] "
      "(under mpirun), or as one plain process: tessera bench step --peer [--np 2] [--global-batch 4] [--rounds 3] "
      "[--strategies a,b] [--dtypes fp32,bf16] [--threads N] [--json]; under mpirun with --baseline none --modes "
      "default,in_backward,int8,bf16,offload_optimizer,offload_params [--rounds 3]: each mode's step time / the default's",
      step_options(), args);
  if (!vm) return 0;
  const bool peer = vm->count("peer") > 0;
  // Options of the other mode are errors, not silently ignored (with the option to use instead).
  const std::vector<std::pair<const char*, const char*>> in_process_only = {
      {"micro-batch", "--global-batch"}, {"strategy", "--strategies"}, {"dtype", "--dtypes"}, {"baseline", nullptr},
      {"op-counts", nullptr}};
  const char* const driver_only[] = {"np", "global-batch", "strategies", "dtypes", "python",
                                     "peer-script", "mpirun", "timeout", "verbose"};
  auto given = [&](const char* o) { return vm->count(o) && !(*vm)[o].defaulted(); };
  for (const auto& [o, instead] : in_process_only)
    TESSERA_CHECK_INPUT(!peer || !given(o), std::string("bench step: --") + o + " does not apply with --peer" +
                                                (instead ? std::string(" (use ") + instead + ")" : ""));
  for (const char* o : driver_only)
    TESSERA_CHECK_INPUT(peer || !given(o), std::string("bench step: --") + o + " applies only with --peer");
  launcher::collectively([&] { check_modes_options(*vm, peer); });
  if (peer) {
    // Under mpirun or srun every rank would launch the whole benchmark: refuse, one line from rank 0.
    for (const char* rank_var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
      if (const char* rank = std::getenv(rank_var)) {
        if (std::string(rank) != "0") return 2;
        throw TESSERA_INPUT_ERROR("bench step --peer launches its own ranks (mpirun for Tessera, Python processes for "
                                  "the peer): run it as one plain process, not under mpirun or srun");
      }
    Driver d;
    d.vm = *vm;
    return run_driver(d);
  }
  return run_in_process(*vm);
}

}  // namespace tessera::bench
