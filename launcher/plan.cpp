#include "launcher/plan.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>

#include "launcher/cli.h"
#include "launcher/model_lm.h"
#include "launcher/run_options.h"
#include "model/activations.h"
#include "runtime/fsdp/strategy_check.h"
#include "runtime/optim/quant8.h"
#include "util/error.h"

namespace tessera::launcher {

namespace {

std::string human(int64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f TiB", b / (1024.0 * 1024 * 1024 * 1024));
  else if (b >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.1f GiB", b / (1024.0 * 1024 * 1024));
  else std::snprintf(buf, sizeof buf, "%.0f MiB", b / (1024.0 * 1024));
  return buf;
}

int stored_bytes_of(const std::string& torch_dtype) { return torch_dtype == "float32" ? 4 : 2; }

}  // namespace

planner::RunShape run_shape_from(const Config& cfg, const model::ModelConfig& mc, const PlanRequest& req) {
  const fsdp::Options fo = fsdp_options_from(cfg, mc);
  const at::ScalarType state = optim::state_scalar_type(cfg.optim.state_dtype);
  planner::RunShape r;
  r.strategy = fo.strategy;
  r.world = req.world;
  r.ranks_per_node = req.ranks_per_node;
  r.param_bytes = static_cast<int>(c10::elementSize(fo.param_dtype));
  r.reduce_bytes = static_cast<int>(c10::elementSize(fo.reduce_dtype));
  r.state_bytes = static_cast<int>(c10::elementSize(state));  // int8: 1 (uint8 codes)
  r.state_block = state == at::kByte ? optim::q8::kDefaultBlock : 0;
  r.stored_bytes = req.stored_bytes;
  r.limit_all_gathers = fo.limit_all_gathers;
  r.prefetch = fo.prefetch;
  r.activation_checkpointing = fo.activation_checkpointing;
  r.accumulate_unsharded = fo.accumulate == fsdp::Accumulate::Unsharded;
  r.grad_accum = cfg.train.grad_accum;
  r.optimizer_in_backward = cfg.optim.in_backward;
  r.offload = fo.offload;
  r.checkpoint_async = cfg.checkpoint.async;
  r.load = cfg.model.path.empty() ? fsdp::LoadMode::Parallel : cfg.model.load;  // a preset is initialised in place
  r.gpu = req.gpu;
  r.align = fo.align;
  // Bytes per element of the stored base, from the storage's own size of a large chunk (nf4's scales included).
  const auto per_element = [](const fsdp::FrozenStorage& st) {
    constexpr int64_t kProbe = int64_t(1) << 24;
    return static_cast<double>(st.stored_numel(kProbe) * c10::elementSize(st.stored_dtype())) / kProbe;
  };
  r.frozen_bytes = fo.frozen_storage ? per_element(*fo.frozen_storage) : static_cast<double>(c10::elementSize(fo.param_dtype));
  if (fo.quantized_storage) {
    r.quantized_bytes = per_element(*fo.quantized_storage);
    r.quantized_align = fo.quantized_storage->align();
  }
  return r;
}

planner::Plan plan_run(const Config& cfg, const model::ModelConfig& mc, const PlanRequest& req) {
  const planner::RunShape run = run_shape_from(cfg, mc, req);
  // A GPU run uses LibTorch >= 2's fused attention; a CPU run this build's attention, and bf16
  // products widened to fp32 on a CPU without AVX-512.
  return planner::estimate(memory_shape(mc, cfg.lora),
                          activation_terms(mc, cfg.train.micro_batch, cfg.data.seq_len, run.param_bytes,
                                           model::run_kernels(req.gpu, cfg.data.packing, cfg.model.fused_kernels, cfg.model.varlen_attention), cfg.lora.enabled()),
                          run);
}

int64_t host_bytes_per_node(const planner::Plan& plan, const PlanRequest& req) {
  const int64_t others = std::max({plan.load_other.total(), plan.train_host.total(), plan.save_host.total(),
                                   plan.eval_host.total()});
  return plan.peak_host() + static_cast<int64_t>(req.ranks_per_node - 1) * others;
}

std::string why_not_fit(const planner::Plan& plan, const PlanRequest& req) {
  if (req.gpu && req.gpu_mem > 0 && plan.peak_gpu() > req.gpu_mem)
    return "GPU peak " + human(plan.peak_gpu()) + " per rank (" + std::string(plan.train_gpu.total() >= plan.eval_gpu.total()
                                                                         ? plan.train_gpu.bytes.phase
                                                                         : plan.eval_gpu.bytes.phase) +
           ") exceeds " + human(req.gpu_mem);
  if (req.host_mem > 0 && host_bytes_per_node(plan, req) > req.host_mem)
    return "host RAM " + human(host_bytes_per_node(plan, req)) + " per node (" + std::to_string(req.ranks_per_node) +
           " ranks" + (plan.offload != fsdp::Offload::None ? ", fsdp.offload=" + fsdp::to_string(plan.offload) + " keeps the shard state there" : "") +
           ") exceeds " + human(req.host_mem);
  return "";
}

int64_t detect_host_limit(std::string* source) {
  // cgroup: this process's own group and its parents (the tightest limit wins).
  std::ifstream cg("/proc/self/cgroup");
  std::string line;
  int64_t best = 0;
  std::string best_src;
  while (std::getline(cg, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    const bool v2 = controllers.empty();
    if (!v2 && controllers.find("memory") == std::string::npos) continue;
    const std::string root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    const std::string file = v2 ? "memory.max" : "memory.limit_in_bytes";
    for (;;) {
      std::ifstream f(root + path + "/" + file);
      std::string v;
      if (f >> v && v != "max") {
        try {
          const int64_t n = std::stoll(v);
          if (n > 0 && n < (int64_t(1) << 60) && (best == 0 || n < best)) {
            best = n;
            best_src = "cgroup " + root + path + "/" + file;
          }
        } catch (...) {
        }
      }
      if (path.empty() || path == "/") break;
      path = path.substr(0, path.find_last_of('/'));
    }
  }
  // Slurm's own figure for the job on this node; the tightest of all limits applies.
  auto offer = [&](int64_t n, const std::string& src) {
    if (n > 0 && (best == 0 || n < best)) {
      best = n;
      best_src = src;
    }
  };
  if (const char* m = std::getenv("SLURM_MEM_PER_NODE"))
    offer(static_cast<int64_t>(std::atoll(m)) << 20, "SLURM_MEM_PER_NODE=" + std::string(m));
  const char* per_cpu = std::getenv("SLURM_MEM_PER_CPU");
  const char* cpus = std::getenv("SLURM_CPUS_ON_NODE");
  if (per_cpu && cpus)
    offer((static_cast<int64_t>(std::atoll(per_cpu)) << 20) * std::atoll(cpus),
          "SLURM_MEM_PER_CPU=" + std::string(per_cpu) + " x SLURM_CPUS_ON_NODE=" + cpus);
  if (source) *source = best_src;
  return best;
}

namespace {

nlohmann::json plan_json(const planner::Plan& plan, const PlanRequest& req) {
  nlohmann::json phases = {
      {"load", {{"reading_rank", plan.load_reader.to_json()}, {"other_ranks", plan.load_other.to_json()}}},
      {"train", {{"host", plan.train_host.to_json()}}},
      {"save", {{"host", plan.save_host.to_json()}}},
      {"eval", {{"host", plan.eval_host.to_json()}}}};
  if (req.gpu) {
    phases["train"]["gpu"] = plan.train_gpu.to_json();
    phases["eval"]["gpu"] = plan.eval_gpu.to_json();
  }
  return phases;
}

struct Knob {
  std::string change;                       // what the user would set
  std::function<void(Config&, PlanRequest&)> apply;
};

// Single changes that may make a run fit, most conservative first (the caller keeps those that
// apply and fit).
std::vector<Knob> knobs(const Config& cfg, const model::ModelConfig& mc) {
  std::vector<Knob> k;
  const fsdp::Options fo = fsdp_options_from(cfg, mc);
  const train::LoopOptions& to = cfg.train;
  if (!fo.activation_checkpointing)
    k.push_back({"fsdp.activation_checkpointing=true", [](Config& c, PlanRequest&) { c.fsdp.activation_checkpointing = Recompute::True; }});
  if (fo.strategy != fsdp::Strategy::FullShard && fo.strategy != fsdp::Strategy::HybridShard)
    k.push_back({"fsdp.strategy=full_shard", [](Config& c, PlanRequest&) { c.fsdp.strategy = fsdp::Strategy::FullShard; }});
  if (fo.limit_all_gathers > 1)
    k.push_back({"fsdp.limit_all_gathers=1", [](Config& c, PlanRequest&) { c.fsdp.limit_all_gathers = 1; }});
  if (to.micro_batch > 1) {
    const int64_t mb = std::max<int64_t>(1, to.micro_batch / 2), ga = to.grad_accum * to.micro_batch / mb;
    k.push_back({"train.micro_batch=" + std::to_string(mb) + " train.grad_accum=" + std::to_string(ga) + " (same global batch)",
                 [mb, ga](Config& c, PlanRequest&) {
                   c.train.micro_batch = mb;
                   c.train.grad_accum = ga;
                 }});
  }
  if (cfg.optim.state_dtype == optim::StateDtype::F32)
    k.push_back({"optim.state_dtype=bf16", [](Config& c, PlanRequest&) { c.optim.state_dtype = optim::StateDtype::BF16; }});
  if (cfg.optim.state_dtype != optim::StateDtype::Int8)
    k.push_back({"optim.state_dtype=int8", [](Config& c, PlanRequest&) { c.optim.state_dtype = optim::StateDtype::Int8; }});
  if (!cfg.optim.in_backward && !loss_scaling(cfg))  // fp16 cannot (config check)
    k.push_back({"optim.in_backward=true train.clip=0 (no gradient clipping)", [](Config& c, PlanRequest&) {
                   c.optim.in_backward = true;
                   c.optim.clip = 0;
                 }});
  if (fo.accumulate == fsdp::Accumulate::Unsharded && to.grad_accum > 1)
    k.push_back({"fsdp.accumulate=sharded", [](Config& c, PlanRequest&) { c.fsdp.accumulate = fsdp::Accumulate::Sharded; }});
  if (fo.reduce_dtype == at::kFloat && fo.param_dtype != at::kFloat)
    k.push_back({"fsdp.reduce_dtype=" + std::string(util::short_name(cfg.fsdp.mixed_precision)),
                 [m = cfg.fsdp.mixed_precision](Config& c, PlanRequest&) { c.fsdp.reduce_dtype = m; }});
  if (cfg.checkpoint.async)
    k.push_back({"checkpoint.async=false", [](Config& c, PlanRequest&) { c.checkpoint.async = false; }});
  if (cfg.model.load == fsdp::LoadMode::Naive)
    k.push_back({"model.load=rank0", [](Config& c, PlanRequest&) { c.model.load = fsdp::LoadMode::Rank0; }});
  // Host offload last: it trades PCIe traffic and host memory for GPU memory (only a GPU run has any).
  if (fo.offload == fsdp::Offload::None)
    k.push_back({"fsdp.offload=optimizer", [](Config& c, PlanRequest&) { c.fsdp.offload = fsdp::Offload::Optimizer; }});
  if (fo.offload != fsdp::Offload::Params)
    k.push_back({"fsdp.offload=params", [](Config& c, PlanRequest&) { c.fsdp.offload = fsdp::Offload::Params; }});
  return k;
}

// The smallest world, in whole nodes (GPU) or doublings (CPU), at which the run fits; 0 if none
// up to 8192 ranks. Sharding over more ranks only helps strategies that shard over the world.
int ranks_that_fit(const Config& cfg, const model::ModelConfig& mc, PlanRequest req) {
  for (int world = req.world + req.ranks_per_node; world <= 8192; world += (req.gpu ? req.ranks_per_node : world)) {
    if (world % req.ranks_per_node != 0) continue;
    PlanRequest r = req;
    r.world = world;
    if (why_not_fit(plan_run(cfg, mc, r), r).empty()) return world;
  }
  return 0;
}

// One suggestion of `tessera plan`: the change and the peaks it leads to, host memory per node
// included (an offload trades GPU memory for it: the user must have it).
nlohmann::json suggestion(const std::string& change, const planner::Plan& p, const PlanRequest& r) {
  return {{"change", change}, {"peak_gpu_bytes_per_rank", p.peak_gpu()}, {"peak_host_bytes_per_rank", p.peak_host()},
          {"host_bytes_per_node", host_bytes_per_node(p, r)}};
}

}  // namespace

nlohmann::json fitting_changes(const Config& cfg, const model::ModelConfig& mc, const PlanRequest& req,
                               std::string* impossible) {
  nlohmann::json suggestions = nlohmann::json::array();
  Config all = cfg;
  PlanRequest all_req = req;
  std::vector<std::string> changes;  // "all of": a later knob of the same key (state_dtype=int8 after =bf16) replaces it
  for (const Knob& k : knobs(cfg, mc)) {
    Config c = cfg;
    PlanRequest r = req;
    k.apply(c, r);
    k.apply(all, all_req);
    const std::string key = k.change.substr(0, k.change.find('=') + 1);
    changes.erase(std::remove_if(changes.begin(), changes.end(), [&](const std::string& x) { return x.rfind(key, 0) == 0; }),
                  changes.end());
    changes.push_back(k.change);
    const planner::Plan p = plan_run(c, mc, r);
    if (why_not_fit(p, r).empty()) suggestions.push_back(suggestion(k.change, p, r));
  }
  std::string every;
  for (const std::string& x : changes) every += (every.empty() ? "" : ", ") + x;
  if (suggestions.empty() && !every.empty()) {
    const planner::Plan p = plan_run(all, mc, all_req);
    if (why_not_fit(p, all_req).empty()) suggestions.push_back(suggestion("all of: " + every, p, all_req));
  }
  const int world = ranks_that_fit(cfg, mc, req);
  if (world > 0) {
    PlanRequest r = req;
    r.world = world;
    const planner::Plan p = plan_run(cfg, mc, r);
    suggestions.push_back(suggestion(req.gpu ? "--nodes " + std::to_string(world / req.ranks_per_node) + " (" +
                                                   std::to_string(world) + " GPUs)"
                                             : "--ranks " + std::to_string(world),
                                     p, r));
  }
  if (suggestions.empty()) {
    const int w = ranks_that_fit(all, mc, all_req);
    if (w > 0) suggestions.push_back({{"change", "all of: " + every + "; and " + std::to_string(w) + " ranks"}});
    else if (impossible)
      *impossible = "and no setting of activation checkpointing, limit_all_gathers, micro-batch, optimizer state dtype, "
                    "optimizer in backward, "
                    "host offload, strategy or up to 8192 ranks brings it under the limit";
  }
  return suggestions;
}

namespace {

// The machines of `tessera plan`: --ranks [--ranks-per-node] or --nodes with --gpus-per-node, the
// device, and the memory per GPU and per node.
PlanRequest plan_request(const po::variables_map& vm, const Config& cfg, std::string* device_out) {
  PlanRequest req;
  const bool by_nodes = vm.count("nodes") || vm.count("gpus-per-node");
  if (by_nodes) {
    TESSERA_CHECK_INPUT(vm.count("nodes") && vm.count("gpus-per-node"), "plan: --nodes and --gpus-per-node go together");
    TESSERA_CHECK_INPUT(!vm.count("ranks") && !vm.count("ranks-per-node"),
                        "plan: give either --ranks [--ranks-per-node] or --nodes with --gpus-per-node, not both");
    const int nodes = vm["nodes"].as<int>(), g = vm["gpus-per-node"].as<int>();
    TESSERA_CHECK_INPUT(nodes >= 1 && g >= 1, "plan: --nodes and --gpus-per-node must be >= 1");
    req.world = nodes * g;
    req.ranks_per_node = g;
  } else {
    TESSERA_CHECK_INPUT(vm.count("ranks"), "plan: say how many ranks: --ranks N, or --nodes N --gpus-per-node G");
    req.world = vm["ranks"].as<int>();
    req.ranks_per_node = vm.count("ranks-per-node") ? vm["ranks-per-node"].as<int>() : req.world;
    TESSERA_CHECK_INPUT(req.world >= 1 && req.ranks_per_node >= 1, "plan: --ranks and --ranks-per-node must be >= 1");
    TESSERA_CHECK_INPUT(req.world % req.ranks_per_node == 0,
                        "plan: " + std::to_string(req.world) + " ranks do not divide into nodes of " +
                            std::to_string(req.ranks_per_node) + " (--ranks-per-node)");
  }
  const std::string device = vm.count("device") ? vm["device"].as<std::string>()
                             : (by_nodes || vm.count("gpu-mem")) ? "cuda"
                             : cfg.train.device == "cpu" || cfg.train.device == "auto" ? "cpu"
                                                                                        : "cuda";
  TESSERA_CHECK_INPUT(device == "cuda" || device == "cpu", "plan: --device '" + device + "' must be cuda or cpu");
  req.gpu = device == "cuda";
  if (vm.count("gpu-mem")) {
    TESSERA_CHECK_INPUT(req.gpu, "plan: --gpu-mem applies to GPU runs (--device cuda)");
    req.gpu_mem = static_cast<int64_t>(parse_byte_size(vm["gpu-mem"].as<std::string>(), "--gpu-mem"));
  }
  if (vm.count("host-mem")) req.host_mem = static_cast<int64_t>(parse_byte_size(vm["host-mem"].as<std::string>(), "--host-mem"));
  const int nodes = req.world / req.ranks_per_node;
  fsdp::validate_strategy(cfg.fsdp.strategy, {req.world, nodes, req.ranks_per_node});
  *device_out = device;
  return req;
}

// The model: a preset, or the config.json of model.path (the weights need not be there). Sets the
// request's stored bytes per parameter.
model::ModelConfig plan_model(const Config& cfg, PlanRequest& req, std::string* name) {
  if (cfg.model.path.empty()) {
    *name = cfg.model.preset;
    req.stored_bytes = 4;
    return model::ModelConfig::preset(*name);
  }
  *name = cfg.model.path;
  const std::string path = *name + "/config.json";
  std::ifstream in(path);
  TESSERA_CHECK_INPUT(static_cast<bool>(in), path + ": cannot open (tessera plan reads the model's config.json)");
  nlohmann::json j = parse_json_text(std::string(std::istreambuf_iterator<char>(in), {}), path);
  model::ModelConfig mc = model::ModelConfig::from_json(j, path);
  req.stored_bytes = stored_bytes_of(mc.torch_dtype);
  return mc;
}

// What plan --json prints.
struct PlanOutcome {
  std::string model_name, device, why;  // why: "" when it fits
  nlohmann::json suggestions;
};

nlohmann::json plan_as_json(const PlanOutcome& o, const model::ModelConfig& mc, const planner::Plan& plan,
                            const planner::RunShape& run, const PlanRequest& req) {
  return {{"model", {{"name", o.model_name}, {"parameters", mc.num_parameters()}}},
          {"layout", {{"world", req.world}, {"ranks_per_node", req.ranks_per_node}, {"nodes", req.world / req.ranks_per_node},
                      {"device", o.device}, {"strategy", fsdp::to_string(run.strategy)}, {"shard_group", plan.shard_size},
                      {"replicate_group", plan.replicate_size}}},
          {"phases", plan_json(plan, req)},
          {"peak_host_bytes_per_rank", plan.peak_host()},
          {"peak_gpu_bytes_per_rank", plan.peak_gpu()},
          {"host_bytes_per_node", host_bytes_per_node(plan, req)},
          {"gpu_bytes_per_node", plan.peak_gpu() * req.ranks_per_node},
          {"offload", fsdp::to_string(run.offload)},
          {"pcie_bytes_per_step", {{"up", plan.pcie.up}, {"down", plan.pcie.down},
                                   {"seconds_at_25GBps", plan.pcie.seconds(planner::kPcieBytesPerSecond)}}},
          {"gpu_mem", req.gpu_mem},
          {"host_mem", req.host_mem},
          {"fits", o.why.empty()},
          {"why_not", o.why},
          {"suggestions", o.suggestions}};
}

// Host offload's PCIe traffic per rank and step, and its time on a PCIe 4.0 x16 link.
void print_pcie(const planner::Plan& plan, const planner::RunShape& run) {
  if (run.offload == fsdp::Offload::None) return;
  char line[256];
  std::snprintf(line, sizeof line,
                "  PCIe per rank and step (fsdp.offload=%s): %s down (gradient shards), %s up (parameter shards), "
                ">= %.2f s at %.0f GB/s each way\n",
                fsdp::to_string(run.offload).c_str(), human(plan.pcie.down).c_str(), human(plan.pcie.up).c_str(),
                plan.pcie.seconds(planner::kPcieBytesPerSecond), planner::kPcieBytesPerSecond / 1e9);
  std::cout << line;
}

// The human table: one line about the run, a row per phase, the step's categories, host per node.
void print_plan_table(const PlanOutcome& o, const Config& cfg, const model::ModelConfig& mc, const planner::Plan& plan,
                      const planner::RunShape& run, const PlanRequest& req) {
  const train::LoopOptions& to = cfg.train;
  std::cout << "tessera plan: " << o.model_name << " (" << mc.num_parameters() << " parameters), " << fsdp::to_string(run.strategy) << " over "
            << req.world << " rank(s) (" << req.world / req.ranks_per_node << " node(s) x " << req.ranks_per_node << "), shard group "
            << plan.shard_size << ", " << (req.gpu ? "GPU" : "CPU") << ", compute " << run.param_bytes * 8
            << "-bit, reduce " << run.reduce_bytes * 8 << "-bit, moments " << run.state_bytes * 8 << "-bit, "
            << (run.activation_checkpointing ? "activation checkpointing" : "no activation checkpointing")
            << ", micro-batch " << to.micro_batch << " x " << cfg.data.seq_len << " tokens"
            << (run.offload != fsdp::Offload::None ? ", fsdp.offload=" + fsdp::to_string(run.offload) : std::string())
            << (!run.optimizer_in_backward ? ""
                : to.grad_accum == 1 ? ", optimizer in backward"
                                     : ", optimizer in backward (saves nothing at grad_accum " + std::to_string(to.grad_accum) +
                                           ": every gradient shard is kept across the micro-steps; it frees them only "
                                           "at grad_accum 1)")
            << std::endl;
  char line[256];
  std::snprintf(line, sizeof line, "  %-22s %14s %14s  %s\n", "phase", "GPU per rank", "host per rank", "peak at");
  std::cout << line;
  auto row = [&](const char* name, const planner::PhaseEstimate* gpu, const planner::PhaseEstimate& host) {
    std::snprintf(line, sizeof line, "  %-22s %14s %14s  %s\n", name, gpu ? human(gpu->total()).c_str() : "-",
                  human(host.total()).c_str(), gpu ? gpu->bytes.phase : host.bytes.phase);
    std::cout << line;
  };
  row("load (reading rank)", nullptr, plan.load_reader);
  row("load (other ranks)", nullptr, plan.load_other);
  row("training step", req.gpu ? &plan.train_gpu : nullptr, plan.train_host);
  row("checkpoint save", nullptr, plan.save_host);
  row("evaluation", req.gpu ? &plan.eval_gpu : nullptr, plan.eval_host);
  const planner::PhaseEstimate& t = req.gpu ? plan.train_gpu : plan.train_host;
  std::cout << "  training step peak by category:";
  for (int c = 0; c < memory::kNumCategories; ++c)
    if (t.bytes.bytes[c] > 0) std::cout << " " << memory::name(static_cast<memory::Category>(c)) << " " << human(t.bytes.bytes[c]) << ";";
  std::cout << " " << (req.gpu ? "CUDA context + NCCL " : "process base + untracked ") << human(t.base + t.untracked) << std::endl;
  if (req.gpu && plan.train_host.bytes.total() > 0) {  // host offload: the step's bytes in host memory
    std::cout << "  training step on the host by category:";
    for (int c = 0; c < memory::kNumCategories; ++c)
      if (plan.train_host.bytes.bytes[c] > 0)
        std::cout << " " << memory::name(static_cast<memory::Category>(c)) << " " << human(plan.train_host.bytes.bytes[c]) << ";";
    std::cout << std::endl;
  }
  if (req.gpu) std::cout << "  GPU per node: " << human(plan.peak_gpu() * req.ranks_per_node) << std::endl;
  std::cout << "  host per node: " << human(host_bytes_per_node(plan, req))
            << (req.host_mem ? " of " + human(req.host_mem) : std::string()) << std::endl;
  print_pcie(plan, run);
}

// "fits", or "does not fit: ..." and each change that would make it fit. The exit code.
int print_verdict(const PlanOutcome& o, const PlanRequest& req) {
  if (o.why.empty()) {
    std::cout << "fits" << (req.gpu_mem || req.host_mem ? "" : " (no --gpu-mem / --host-mem given: nothing to check)") << std::endl;
    return 0;
  }
  std::cout << "does not fit: " << o.why << std::endl;
  for (const auto& s : o.suggestions) {
    std::cout << "  would fit with " << s["change"].get<std::string>();
    if (s.contains("peak_gpu_bytes_per_rank") && req.gpu)
      std::cout << " (GPU peak " << human(s["peak_gpu_bytes_per_rank"].get<int64_t>()) << "; host "
                << human(s["host_bytes_per_node"].get<int64_t>()) << " per node"
                << (req.host_mem ? "" : ", not checked: no --host-mem given") << ")";
    else if (s.contains("peak_host_bytes_per_rank"))
      std::cout << " (host peak " << human(s["peak_host_bytes_per_rank"].get<int64_t>()) << " per rank)";
    std::cout << std::endl;
  }
  return 1;
}

}  // namespace

int run_plan(const std::vector<std::string>& args) {
  po::options_description desc("plan options");
  desc.add_options()("config,c", po::value<std::string>()->default_value(""), "run configuration (JSON or YAML)")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a config key: --set train.micro_batch=2")(
      "ranks", po::value<int>(), "total ranks (one per GPU on a GPU run)")(
      "ranks-per-node", po::value<int>(), "ranks per node with --ranks (default: all on one node)")(
      "nodes", po::value<int>(), "nodes (with --gpus-per-node)")(
      "gpus-per-node", po::value<int>(), "GPUs (= ranks) per node")(
      "device", po::value<std::string>(), "cuda or cpu (default: cuda with --gpus-per-node or --gpu-mem, else from train.device)")(
      "gpu-mem", po::value<std::string>(), "memory per GPU, e.g. 80GiB (A100/H100), 141GB (H200)")(
      "host-mem", po::value<std::string>(), "host RAM per node, e.g. 1TiB")(
      "json", "print the plan as JSON");
  auto vm = parse_command(
      "tessera plan --config run.json (--ranks N [--ranks-per-node R] | --nodes N --gpus-per-node G) [--gpu-mem 80GiB] "
      "[--host-mem 1TiB] [--device cuda|cpu] [--json]",
      desc, args);
  if (!vm) return 0;
  std::vector<std::string> sets;
  if (vm->count("set")) sets = (*vm)["set"].as<std::vector<std::string>>();
  const Config cfg = Config::load((*vm)["config"].as<std::string>(), sets);
  train::validate(cfg, loss_scaling(cfg));  // as train does
  PlanOutcome o;
  PlanRequest req = plan_request(*vm, cfg, &o.device);
  const model::ModelConfig mc = plan_model(cfg, req, &o.model_name);
  const planner::Plan plan = plan_run(cfg, mc, req);
  o.why = why_not_fit(plan, req);
  // What would make it fit: each knob alone, then all of them, then more ranks.
  std::string impossible;
  o.suggestions = o.why.empty() ? nlohmann::json::array() : fitting_changes(cfg, mc, req, &impossible);
  if (!impossible.empty()) throw TESSERA_INPUT_ERROR("plan: " + o.model_name + " cannot fit: " + o.why + ", " + impossible);
  const planner::RunShape run = run_shape_from(cfg, mc, req);
  if (vm->count("json")) {
    std::cout << plan_as_json(o, mc, plan, run, req).dump(2) << std::endl;
    return o.why.empty() ? 0 : 1;
  }
  print_plan_table(o, cfg, mc, plan, run, req);
  return print_verdict(o, req);
}

}  // namespace tessera::launcher
