#include "launcher/accelerate.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <iostream>
#include <map>

#include "launcher/cli.h"
#include "launcher/config.h"
#include "util/error.h"
#include "util/output_file.h"

namespace tessera::launcher {

using nlohmann::json;

namespace {

std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// A value as it was written (strings without quotes).
std::string shown(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "null";
  return v.dump();
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

// "a, b,c" -> {"a", "b", "c"}: Accelerate's comma-separated lists (gpu_ids, layer class names).
std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t comma = s.find(',', start);
    std::string part = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    part.erase(0, part.find_first_not_of(' '));
    part.erase(part.find_last_not_of(' ') + 1);
    out.push_back(part);
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

bool empty_value(const json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || ((v.is_object() || v.is_array()) && v.empty()) ||
         (v.is_string() && v.get<std::string>().empty());
}

// PyTorch's ShardingStrategy names in their enum order (Accelerate's legacy numbers are 1-based).
const std::vector<std::string> kStrategies = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                                              "HYBRID_SHARD_ZERO2"};
const std::vector<std::string> kPrefetch = {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"};
const std::vector<std::string> kStateDict = {"FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"};
const std::vector<std::string> kWrap = {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"};

const std::vector<std::string> kTopKeys = {
    "compute_environment", "distributed_type", "mixed_precision", "use_cpu", "debug", "num_processes",
    "machine_rank", "num_machines", "gpu_ids", "main_process_ip", "main_process_port", "rdzv_backend",
    "same_network", "main_training_function", "enable_cpu_affinity", "fp8_config", "deepspeed_config",
    "fsdp_config", "parallelism_config", "megatron_lm_config", "mpirun_config", "downcast_bf16", "tpu_name",
    "tpu_zone", "tpu_use_cluster", "tpu_use_sudo", "command_file", "commands", "tpu_vm", "tpu_env",
    "dynamo_config", "fp16", "dynamo_backend"};
const std::vector<std::string> kFsdpKeys = {
    "fsdp_version", "fsdp_sharding_strategy", "fsdp_reshard_after_forward", "fsdp_offload_params",
    "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap", "fsdp_min_num_params",
    "fsdp_backward_prefetch", "fsdp_backward_prefetch_policy", "fsdp_forward_prefetch", "fsdp_state_dict_type",
    "fsdp_use_orig_params", "fsdp_cpu_ram_efficient_loading", "fsdp_sync_module_states",
    "fsdp_activation_checkpointing", "fsdp_ignored_modules"};
const std::vector<std::string> kParallelismKeys = {"dp_replicate_size", "dp_shard_size", "tp_size", "cp_size",
                                                   "sp_size", "cp_comm_strategy", "sp_backend"};

const char* const kNoRendezvous =
    "not honoured: no rendezvous to configure: ranks find each other through MPI (PMIx under srun, "
    "mpirun's daemons)";
const char* const kTpuOnly = "TPU only";

class Translator {
 public:
  Translator(std::string source, const YamlPositions& positions) : source_(std::move(source)), pos_(positions) {}

  AccelerateTranslation run(const json& doc) {
    if (!doc.is_object()) throw TESSERA_INPUT_ERROR(source_ + ": the top level must be a mapping of keys");
    check_distributed_type(doc);
    read_fsdp_section(doc);
    read_layout(doc);
    for (auto it = doc.begin(); it != doc.end(); ++it) top_level(it.key(), it.value(), doc);
    translate_sharding();
    translate_prefetch();
    translate_loading();
    for (const auto& [key, entry] : fsdp_) fsdp_key(key, entry.first, entry.second);
    std::stable_sort(lines_.begin(), lines_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& l : lines_) t_.report.push_back(l.second);
    return t_;
  }

 private:
  // ---- messages ----------------------------------------------------------------------------------
  std::string at(const std::string& path) const {
    auto it = pos_.find(path);
    return it == pos_.end() ? source_ : source_ + ":" + it->second;
  }
  int line_of(const std::string& path) const {
    auto it = pos_.find(path);
    return it == pos_.end() ? 0 : std::stoi(it->second);
  }
  [[noreturn]] void fail(const std::string& path, const std::string& why) const {
    throw TESSERA_INPUT_ERROR(at(path) + ": " + path + ": " + why);
  }
  [[noreturn]] void conflict(const std::string& path, const json& v, const std::string& other, const json& ov) const {
    fail(path, shown(v) + " contradicts " + other + ": " + shown(ov) + " (line " + std::to_string(line_of(other)) +
                   "); keep one of them");
  }
  void say(const std::string& path, const json& v, const std::string& outcome) {
    auto it = pos_.find(path);
    std::pair<int, int> order{0, 0};
    if (it != pos_.end()) order = {std::stoi(it->second), std::stoi(it->second.substr(it->second.find(':') + 1))};
    lines_.push_back({order, path + ": " + shown(v) + " -> " + outcome});
  }
  // Sets a Tessera key ("fsdp.strategy"); the report line says so.
  std::string set(const std::string& key, const json& v) {
    auto dot = key.find('.');
    t_.config[key.substr(0, dot)][key.substr(dot + 1)] = v;
    return key + " = " + v.dump();
  }

  // ---- value readers (as Accelerate's str_to_bool / enum lookups accept them) -------------------------
  bool as_bool(const std::string& path, const json& v) const {
    if (v.is_boolean()) return v.get<bool>();
    if (v.is_number_integer() && (v == 0 || v == 1)) return v == 1;
    if (v.is_string()) {
      std::string s = upper(v.get<std::string>());
      for (const char* t : {"TRUE", "YES", "Y", "T", "ON", "1"})
        if (s == t) return true;
      for (const char* f : {"FALSE", "NO", "N", "F", "OFF", "0"})
        if (s == f) return false;
    }
    fail(path, "expected true or false, got " + v.dump());
  }
  int64_t as_int(const std::string& path, const json& v) const {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_string()) {
      const std::string s = v.get<std::string>();
      if (all_digits(s) && s.size() < 18) return std::stoll(s);
    }
    fail(path, "expected an integer, got " + v.dump());
  }
  // One of `names` (case-insensitive, as Accelerate upper-cases them); `numbered`: the legacy 1-based
  // numbers are accepted too. Returns the canonical name.
  std::string as_name(const std::string& path, const json& v, const std::vector<std::string>& names,
                      bool numbered = false) const {
    if (numbered && (v.is_number_integer() || (v.is_string() && all_digits(v.get<std::string>())))) {
      int64_t i = as_int(path, v);
      if (i >= 1 && i <= static_cast<int64_t>(names.size())) return names[i - 1];
      fail(path, shown(v) + " is not a strategy number (1.." + std::to_string(names.size()) + ")");
    }
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    if (!v.is_string()) fail(path, "expected one of " + list + ", got " + v.dump());
    const std::string s = upper(v.get<std::string>());
    if (std::find(names.begin(), names.end(), s) != names.end()) return s;
    std::string hint = closest_match(s, names);
    fail(path, "'" + v.get<std::string>() + "' is not one of " + list + (numbered ? " (or 1.." + std::to_string(names.size()) + ")" : "") +
                   (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
  }
  [[noreturn]] void unknown(const std::string& path, const std::string& key, const std::vector<std::string>& known) const {
    std::string hint = closest_match(key, known);
    fail(path, "unknown Accelerate key" + (hint.empty() ? std::string() : " (did you mean '" + hint + "'?)"));
  }

  // ---- distributed type, FSDP section, layout ---------------------------------------------------------
  void check_distributed_type(const json& doc) {
    if (!doc.contains("distributed_type"))
      throw TESSERA_INPUT_ERROR(source_ + ": no distributed_type (Accelerate needs one; an FSDP config says distributed_type: FSDP)");
    const json& v = doc["distributed_type"];
    const std::string dt = v.is_string() ? upper(v.get<std::string>()) : shown(v);
    if (dt != "FSDP") {
      std::string hint = dt == "DEEPSPEED"
                             ? " (ZeRO-3 is Tessera's fsdp.strategy full_shard, ZeRO-2 shard_grad_op: see docs/ACCELERATE.md)"
                         : dt == "MULTI_GPU" || dt == "MULTI_CPU" || dt == "NO"
                             ? " (plain data parallelism is Tessera's fsdp.strategy no_shard)"
                             : "";
      fail("distributed_type", shown(v) + " is not an FSDP config; --from-accelerate translates distributed_type: FSDP only" + hint);
    }
    say("distributed_type", v, "same in Tessera: fully sharded data parallelism is what it runs");
  }

  // fsdp_config keys by their canonical fsdp_ name, as Accelerate's launcher prefixes them.
  void read_fsdp_section(const json& doc) {
    if (!doc.contains("fsdp_config") || doc["fsdp_config"].is_null()) return;
    const json& f = doc["fsdp_config"];
    if (!f.is_object()) fail("fsdp_config", "expected a mapping of fsdp_* keys, got " + f.dump());
    for (auto it = f.begin(); it != f.end(); ++it) {
      const std::string path = "fsdp_config." + it.key();
      const std::string key = it.key().rfind("fsdp_", 0) == 0 ? it.key() : "fsdp_" + it.key();
      if (std::find(kFsdpKeys.begin(), kFsdpKeys.end(), key) == kFsdpKeys.end()) unknown(path, key, kFsdpKeys);
      auto [prev, fresh] = fsdp_.emplace(key, std::make_pair(path, it.value()));
      if (!fresh)
        fail(path, "the same key as " + prev->second.first + " (line " + std::to_string(line_of(prev->second.first)) +
                       "): Accelerate adds the fsdp_ prefix; keep one of them");
    }
    if (fsdp_.count("fsdp_version")) {
      const auto& [path, v] = fsdp_["fsdp_version"];
      version_ = static_cast<int>(as_int(path, v));
      if (version_ != 1 && version_ != 2) fail(path, shown(v) + " is not an FSDP version (1 or 2)");
    }
  }
  bool has(const std::string& key) const { return fsdp_.count(key) && !fsdp_.at(key).second.is_null(); }
  const std::string& path_of(const std::string& key) const { return fsdp_.at(key).first; }
  const json& value_of(const std::string& key) const { return fsdp_.at(key).second; }

  void read_layout(const json& doc) {
    int64_t machines = 1, processes = -1;
    if (doc.contains("num_machines") && !doc["num_machines"].is_null()) {
      machines = as_int("num_machines", doc["num_machines"]);
      if (machines < 1) fail("num_machines", "must be >= 1");
    }
    if (doc.contains("num_processes") && !doc["num_processes"].is_null()) {
      const json& v = doc["num_processes"];
      processes = v == -1 ? -1 : as_int("num_processes", v);
      if (processes == 0 || processes < -1) fail("num_processes", "must be >= 1 (or -1: given at launch)");
    }
    if (doc.contains("use_cpu") && !doc["use_cpu"].is_null()) t_.cpu = as_bool("use_cpu", doc["use_cpu"]);
    t_.nodes = static_cast<int>(machines);
    if (processes > 0) {
      if (processes % machines != 0)
        fail("num_processes", std::to_string(processes) + " processes do not split evenly over num_machines " +
                                  std::to_string(machines) + ": Tessera runs the same number of ranks on every node");
      t_.ranks_per_node = static_cast<int>(processes / machines);
    }
  }

  // ---- top-level keys -----------------------------------------------------------------------------
  void top_level(const std::string& key, const json& v, const json& doc) {
    const std::string& p = key;
    if (key == "distributed_type" || key == "fsdp_config") return;  // checked first / key by key
    if (key == "compute_environment") {
      std::string env = as_name(p, v, {"LOCAL_MACHINE", "AMAZON_SAGEMAKER"});
      say(p, v, env == "LOCAL_MACHINE" ? "same in Tessera: it runs on your own machines (sbatch + srun, or mpirun)"
                                       : "not honoured: Tessera does not launch on SageMaker; it runs under SLURM or mpirun");
    } else if (key == "mixed_precision" || key == "fp16") {
      mixed_precision(key, v, doc);
    } else if (key == "num_machines") {
      say(p, v, "NODES=" + std::to_string(t_.nodes) + " (SLURM nodes; see the submit line)");
    } else if (key == "num_processes") {
      if (t_.ranks_per_node == 0)
        say(p, v, "not honoured: the process count is left to launch time; pass NODES and GPUS_PER_NODE to make submit");
      else if (t_.cpu)
        say(p, v, "GPUS_PER_NODE=0 TASKS_PER_NODE=" + std::to_string(t_.ranks_per_node) + " (num_processes / num_machines ranks per CPU node)");
      else
        say(p, v, "GPUS_PER_NODE=" + std::to_string(t_.ranks_per_node) + " (num_processes / num_machines; one rank per GPU)");
    } else if (key == "machine_rank") {
      if (!v.is_null()) {
        int64_t r = as_int(p, v);
        if (r < 0 || r >= t_.nodes) fail(p, std::to_string(r) + " is not below num_machines " + std::to_string(t_.nodes));
      }
      say(p, v, "not honoured: no meaning here: srun or mpirun starts every node at once and each rank learns its place from Slurm/MPI");
    } else if (key == "main_process_ip" || key == "main_process_port" || key == "rdzv_backend" || key == "same_network") {
      say(p, v, v.is_null() ? std::string("nothing to do") : kNoRendezvous);
    } else if (key == "use_cpu") {
      say(p, v, t_.cpu ? set("train.device", "cpu") + " (CPU ranks, MPI collectives; GPUS_PER_NODE=0 on the submit line)"
                       : "same in Tessera: train.device auto uses the node's GPUs, one per rank");
    } else if (key == "gpu_ids") {
      gpu_ids(p, v);
    } else if (key == "downcast_bf16") {
      bool off = v.is_null() || (v.is_string() && upper(v.get<std::string>()) == "NO") || (v.is_boolean() && !v.get<bool>());
      say(p, v, off ? std::string("nothing to do (") + kTpuOnly + ")" : std::string("not honoured: ") + kTpuOnly + " (XLA_DOWNCAST_BF16)");
    } else if (key == "debug") {
      say(p, v, !as_bool(p, v) ? "nothing to do"
                               : "not honoured: no debug mode; a collective that does not complete within comm.timeout_s stops every rank with an error");
    } else if (key == "main_training_function") {
      say(p, v, "not honoured: no training script to call: tessera train is the training loop");
    } else if (key == "enable_cpu_affinity") {
      say(p, v, !as_bool(p, v) ? "nothing to do"
                               : "not honoured: bind ranks with srun --cpu-bind or mpirun --bind-to; tessera --threads sets the threads per rank");
    } else if (key.rfind("tpu_", 0) == 0 || key == "command_file" || key == "commands") {
      say(p, v, empty_value(v) ? std::string("nothing to do (") + kTpuOnly + ")" : std::string("not honoured: ") + kTpuOnly);
    } else if (key == "dynamo_config" || key == "dynamo_backend") {
      bool off = empty_value(v) || (v.is_string() && upper(v.get<std::string>()) == "NO");
      say(p, v, off ? "nothing to do" : "not honoured: no torch.compile: Tessera runs LibTorch's eager kernels");
    } else if (key == "deepspeed_config" || key == "megatron_lm_config") {
      say(p, v, empty_value(v) ? "nothing to do" : "not honoured: Accelerate reads it only when distributed_type is " +
                                                       std::string(key == "deepspeed_config" ? "DEEPSPEED" : "MEGATRON_LM"));
    } else if (key == "fp8_config") {
      say(p, v, empty_value(v) ? "nothing to do" : "not honoured: no fp8 matmuls; compute runs in fsdp.mixed_precision");
    } else if (key == "mpirun_config") {
      say(p, v, empty_value(v) ? "nothing to do"
                               : "not honoured: Accelerate's mpirun settings; launch with make -f Makefile.slurm submit LAUNCHER=mpirun, or mpirun yourself");
    } else if (key == "parallelism_config") {
      parallelism(v);
    } else {
      unknown(p, key, kTopKeys);
    }
  }

  // mixed_precision (no | fp16 | bf16 | fp8), and the legacy `fp16: true` of old configs.
  void mixed_precision(const std::string& key, const json& v, const json& doc) {
    std::string mp;
    if (key == "fp16") {
      if (!as_bool(key, v)) return say(key, v, "nothing to do (legacy key; mixed_precision decides)");
      mp = "FP16";
      if (doc.contains("mixed_precision") && !doc["mixed_precision"].is_null()) {
        const json& m = doc["mixed_precision"];
        if (!m.is_string() || upper(m.get<std::string>()) != "FP16") conflict(key, v, "mixed_precision", m);
      }
    } else if (v.is_null() || (v.is_boolean() && !v.get<bool>())) {
      mp = "NO";  // unquoted `no` reads as false in YAML 1.1
    } else {
      mp = as_name(key, v, {"NO", "FP16", "BF16", "FP8"});
    }
    const std::string dtype = mp == "NO" ? "fp32" : mp == "FP16" ? "fp16" : "bf16";
    std::string out = set("fsdp.mixed_precision", dtype) + ", " + set("fsdp.reduce_dtype", dtype);
    if (mp == "NO")
      out += " (full precision)";
    else if (mp == "FP8")
      out += " (not honoured as fp8: no fp8 matmuls here; bf16 is the dtype Accelerate's FSDP policy uses under fp8)";
    else
      out += " (as Accelerate's FSDP policy: parameters and gradient reduction in " + dtype +
             (mp == "FP16" ? "; with dynamic loss scaling as GradScaler; fp16 compute needs a GPU, bf16 runs everywhere)"
                            : ")");
    say(key, v, out);
  }

  // gpu_ids: "all", or a contiguous list that is exactly the ranks' GPUs -> train.device cuda:N.
  void gpu_ids(const std::string& p, const json& v) {
    if (t_.cpu) return say(p, v, "nothing to do: use_cpu is true");
    if (v.is_null() || (v.is_string() && v.get<std::string>() == "all"))
      return say(p, v, "same in Tessera: every rank on a node takes its own GPU (local rank r uses GPU r)");
    std::vector<int64_t> ids;
    for (const auto& part : split_list(shown(v))) ids.push_back(as_int(p, json(part)));
    bool contiguous = true;
    for (size_t i = 1; i < ids.size(); ++i) contiguous &= ids[i] == ids[0] + static_cast<int64_t>(i);
    if (contiguous && static_cast<int>(ids.size()) == t_.ranks_per_node)
      return say(p, v, set("train.device", ids[0] == 0 ? "cuda" : "cuda:" + std::to_string(ids[0])) +
                           " (local rank r uses GPU " + std::to_string(ids[0]) + "+r)");
    say(p, v, "not honoured: Tessera gives local rank r GPU N+r (train.device cuda:N), so only " +
                  std::to_string(t_.ranks_per_node) + " consecutive ids fit; choose GPUs with CUDA_VISIBLE_DEVICES or Slurm's allocation");
  }

  // parallelism_config (FSDP2 only): dp_replicate_size x dp_shard_size = nodes x ranks per node is
  // HSDP, Tessera's hybrid_shard (decided with the strategy, translate_sharding).
  void parallelism(const json& v) {
    const std::string p = "parallelism_config";
    if (empty_value(v)) return say(p, v, "nothing to do");
    if (!v.is_object()) fail(p, "expected a mapping, got " + v.dump());
    if (version_ != 2) fail(p, "needs fsdp_version 2 (Accelerate refuses a parallelism config with FSDP1)");
    std::map<std::string, int64_t> size = {{"dp_replicate_size", 1}, {"dp_shard_size", 1}};
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string path = p + "." + it.key();
      const std::string key = it.key().rfind("parallelism_config_", 0) == 0 ? it.key().substr(19) : it.key();
      if (std::find(kParallelismKeys.begin(), kParallelismKeys.end(), key) == kParallelismKeys.end())
        unknown(path, key, kParallelismKeys);
      if (key == "dp_replicate_size" || key == "dp_shard_size") {
        if (!it.value().is_null()) size[key] = as_int(path, it.value());
        dp_.push_back({path, it.value()});
      } else {
        bool off = it.value().is_null() || key == "cp_comm_strategy" || key == "sp_backend" || as_int(path, it.value()) == 1;
        say(path, it.value(), off ? "nothing to do"
                                  : "not honoured: no tensor, context or sequence parallelism: every rank is a data-parallel rank");
      }
    }
    const int64_t r = size["dp_replicate_size"], s = size["dp_shard_size"];
    hsdp_ = r > 1 && r == t_.nodes && s == t_.ranks_per_node && t_.ranks_per_node > 0;
    if (hsdp_) return;  // reported with the strategy
    const std::string why =
        r == 1 && (s == 1 || s == int64_t{t_.nodes} * t_.ranks_per_node)
            ? "same in Tessera: full_shard shards over every rank"
            : "not honoured: Tessera shards over every rank (full_shard) or over a node's ranks with replicas across nodes "
              "(hybrid_shard: dp_shard_size = ranks per node " + std::to_string(t_.ranks_per_node) + ", dp_replicate_size = nodes " +
                  std::to_string(t_.nodes) + ")";
    for (const auto& [path, value] : dp_) say(path, value, why);
  }

  // ---- FSDP keys ----------------------------------------------------------------------------------
  // fsdp.strategy from fsdp_sharding_strategy / fsdp_reshard_after_forward (FSDP1: a strategy name or
  // number; FSDP2: a bool) and parallelism_config's HSDP.
  void translate_sharding() {
    std::string name, from;  // the Accelerate strategy name it resolves to, and the key that decided
    if (version_ == 1) {
      std::string by_strategy, by_reshard;
      if (has("fsdp_sharding_strategy"))
        by_strategy = as_name(path_of("fsdp_sharding_strategy"), value_of("fsdp_sharding_strategy"), kStrategies, true);
      if (has("fsdp_reshard_after_forward")) {
        const json& v = value_of("fsdp_reshard_after_forward");
        if (v.is_boolean())
          fail(path_of("fsdp_reshard_after_forward"), shown(v) + " is FSDP2's form; with fsdp_version 1 it takes a strategy name such as FULL_SHARD");
        by_reshard = as_name(path_of("fsdp_reshard_after_forward"), v, kStrategies, true);
      }
      if (!by_strategy.empty() && !by_reshard.empty() && by_strategy != by_reshard)
        conflict(path_of("fsdp_reshard_after_forward"), value_of("fsdp_reshard_after_forward"),
                 path_of("fsdp_sharding_strategy"), value_of("fsdp_sharding_strategy"));
      name = by_strategy.empty() ? by_reshard : by_strategy;
    } else {
      bool reshard = true;
      if (has("fsdp_reshard_after_forward")) {
        const json& v = value_of("fsdp_reshard_after_forward");
        if (v.is_string() && std::find(kStrategies.begin(), kStrategies.end(), upper(v.get<std::string>())) != kStrategies.end())
          fail(path_of("fsdp_reshard_after_forward"), shown(v) + " is FSDP1's form; with fsdp_version 2 it is true or false");
        reshard = as_bool(path_of("fsdp_reshard_after_forward"), v);
        name = reshard ? "FULL_SHARD" : "SHARD_GRAD_OP";
      }
      if (hsdp_) name = reshard ? "HYBRID_SHARD" : "HYBRID_SHARD_ZERO2";
      if (has("fsdp_sharding_strategy"))
        say(path_of("fsdp_sharding_strategy"), value_of("fsdp_sharding_strategy"),
            "not honoured: FSDP2 ignores it (fsdp_reshard_after_forward decides)");
    }
    if (name.empty()) return;
    static const std::map<std::string, std::pair<std::string, std::string>> to_tessera = {
        {"FULL_SHARD", {"full_shard", "ZeRO-3: parameters, gradients and optimizer state sharded over every rank"}},
        {"SHARD_GRAD_OP", {"shard_grad_op", "ZeRO-2: parameters stay gathered from forward to backward"}},
        {"NO_SHARD", {"no_shard", "DDP: every rank holds everything, gradients all-reduced"}},
        {"HYBRID_SHARD", {"hybrid_shard", "full_shard within a node, replicas across nodes"}},
        {"HYBRID_SHARD_ZERO2",
         {"hybrid_shard", "nearest equivalent: Tessera's hybrid_shard also frees parameters after forward and gathers "
                          "them again within the node for backward: less memory, one more intra-node all-gather per layer"}}};
    const auto& [strategy, why] = to_tessera.at(name);
    const std::string out = set("fsdp.strategy", strategy) + " (" + why + ")";
    for (const char* k : {"fsdp_sharding_strategy", "fsdp_reshard_after_forward"})
      if (has(k) && (version_ == 1 || std::string(k) == "fsdp_reshard_after_forward")) say(path_of(k), value_of(k), out);
    if (hsdp_)
      for (const auto& [path, value] : dp_) say(path, value, out);
  }

  // fsdp.prefetch from fsdp_forward_prefetch and fsdp_backward_prefetch (one switch covers both).
  void translate_prefetch() {
    const std::string bkey = has("fsdp_backward_prefetch") ? "fsdp_backward_prefetch" : "fsdp_backward_prefetch_policy";
    if (has("fsdp_backward_prefetch") && has("fsdp_backward_prefetch_policy")) {
      const std::string a = as_name(path_of("fsdp_backward_prefetch"), value_of("fsdp_backward_prefetch"), kPrefetch);
      const std::string b = as_name(path_of("fsdp_backward_prefetch_policy"), value_of("fsdp_backward_prefetch_policy"), kPrefetch);
      if (a != b)
        conflict(path_of("fsdp_backward_prefetch_policy"), value_of("fsdp_backward_prefetch_policy"),
                 path_of("fsdp_backward_prefetch"), value_of("fsdp_backward_prefetch"));
      say(path_of("fsdp_backward_prefetch_policy"), value_of("fsdp_backward_prefetch_policy"),
          "same as fsdp_backward_prefetch (its older name)");
    }
    const bool has_b = has(bkey), has_f = has("fsdp_forward_prefetch");
    if (!has_b && !has_f) return;
    if (version_ == 2) {
      const std::string why = "not honoured: FSDP2 ignores it and always prefetches, as Tessera's fsdp.prefetch (default true) does";
      if (has_b) say(path_of(bkey), value_of(bkey), why);
      if (has_f) say(path_of("fsdp_forward_prefetch"), value_of("fsdp_forward_prefetch"), why);
      return;
    }
    const std::string b = has_b ? as_name(path_of(bkey), value_of(bkey), kPrefetch) : "NO_PREFETCH";
    const bool f = has_f && as_bool(path_of("fsdp_forward_prefetch"), value_of("fsdp_forward_prefetch"));
    const bool on = f || b != "NO_PREFETCH";
    const std::string out = set("fsdp.prefetch", on);
    const std::string one_switch = " Tessera has one switch for forward and backward prefetch)";
    if (has_b)
      say(path_of(bkey), value_of(bkey),
          out + (b == "BACKWARD_POST" ? " (in backward Tessera issues it before the current unit's gradient compute, BACKWARD_PRE's order)"
                 : (b != "NO_PREFETCH") != on ? " (fsdp_forward_prefetch turns it on:" + one_switch : ""));
    if (has_f)
      say(path_of("fsdp_forward_prefetch"), value_of("fsdp_forward_prefetch"),
          out + (f != on ? " (" + bkey + " turns it on:" + one_switch : ""));
  }

  // model.load from fsdp_cpu_ram_efficient_loading / fsdp_sync_module_states.
  void translate_loading() {
    const bool has_e = has("fsdp_cpu_ram_efficient_loading"), has_s = has("fsdp_sync_module_states");
    const bool e = has_e && as_bool(path_of("fsdp_cpu_ram_efficient_loading"), value_of("fsdp_cpu_ram_efficient_loading"));
    const bool s = has_s && as_bool(path_of("fsdp_sync_module_states"), value_of("fsdp_sync_module_states"));
    if (version_ == 1 && e && has_s && !s)
      conflict(path_of("fsdp_sync_module_states"), value_of("fsdp_sync_module_states"),
               path_of("fsdp_cpu_ram_efficient_loading"), value_of("fsdp_cpu_ram_efficient_loading"));
    if (has_e)
      say(path_of("fsdp_cpu_ram_efficient_loading"), value_of("fsdp_cpu_ram_efficient_loading"),
          e ? set("model.load", "rank0") + " (only rank 0 reads the checkpoint, one decoder layer at a time, and sends every rank its shard)"
            : "not honoured: no rank ever loads the whole model here (model.load naive is a benchmark baseline); model.load stays rank0, "
              "or parallel for every rank reading only its own slices from a shared file system");
    if (has_s) {
      std::string out;
      if (version_ == 2)
        out = "not honoured: obsolete in FSDP2 (Accelerate ignores it); every rank starts from the same weights anyway";
      else if (s)
        out = set("model.load", "rank0") + " (every rank gets rank 0's weights, sent unit by unit as shards)";
      else
        out = "same in Tessera: every rank gets its shard of the same weights; nothing is broadcast whole";
      say(path_of("fsdp_sync_module_states"), value_of("fsdp_sync_module_states"), out);
    }
  }

  void fsdp_key(const std::string& key, const std::string& p, const json& v) {
    if (key == "fsdp_version") {
      say(p, v, "nothing to set: it decides how fsdp_reshard_after_forward and the other keys read");
    } else if (key == "fsdp_offload_params") {
      say(p, v, !as_bool(p, v) ? "same in Tessera: shards, gradients and optimizer state stay on the rank's device"
                               : set("fsdp.offload", "params") + " (master, gradient shard, AdamW state and the parameter "
                                 "shard in host memory, AdamW on the host; docs/MEMORY.md#host-offload-fsdpoffload)");
    } else if (key == "fsdp_auto_wrap_policy") {
      std::string w = v.is_null() ? "NO_WRAP" : as_name(p, v, kWrap);
      say(p, v, w == "TRANSFORMER_BASED_WRAP"
                    ? "same in Tessera: one unit per decoder layer, plus one for embeddings, final norm and lm_head"
                    : "not honoured: Tessera always makes one unit per decoder layer, plus one for embeddings, final norm and lm_head");
    } else if (key == "fsdp_transformer_layer_cls_to_wrap") {
      bool decoder = v.is_string();
      if (decoder)
        for (const auto& c : split_list(v.get<std::string>()))
          decoder &= c.size() > 12 && c.compare(c.size() - 12, 12, "DecoderLayer") == 0;
      say(p, v, decoder ? "same in Tessera: each decoder layer of the model is one unit"
                        : "not honoured: Tessera wraps each decoder layer of the (Llama) model in model.path; this names no decoder layer");
    } else if (key == "fsdp_min_num_params") {
      say(p, v, "not honoured: only for SIZE_BASED_WRAP; Tessera wraps per decoder layer");
    } else if (key == "fsdp_state_dict_type") {
      std::string s = as_name(p, v, kStateDict);
      say(p, v, s == "SHARDED_STATE_DICT"
                    ? "same in Tessera: every rank writes its own shard plus a manifest (checkpoint.dir); resumes reshard to any world size"
                    : s == "FULL_STATE_DICT"
                          ? "not honoured: checkpoints are always sharded; tessera ckpt consolidate writes the full Hugging Face model offline"
                          : "not honoured: checkpoints are sharded with a manifest, so they load at any world size; tessera ckpt consolidate makes a full model");
    } else if (key == "fsdp_use_orig_params") {
      say(p, v, "not honoured: no meaning here: Tessera's AdamW steps on each unit's flat fp32 shard and every parameter "
                "is trained (no frozen parameters or per-parameter groups to keep)");
    } else if (key == "fsdp_activation_checkpointing") {
      bool on = as_bool(p, v);
      say(p, v, set("fsdp.activation_checkpointing", on ? "true" : "false") +
                    (on ? " (each decoder layer is recomputed in backward)" : ""));
    } else if (key == "fsdp_ignored_modules") {
      say(p, v, empty_value(v) ? "nothing to do" : "not honoured: every module of the model is sharded");
    }
    // fsdp_sharding_strategy, fsdp_reshard_after_forward, prefetch and loading keys: reported above.
  }

  std::string source_;
  const YamlPositions& pos_;
  AccelerateTranslation t_;
  std::vector<std::pair<std::pair<int, int>, std::string>> lines_;
  std::map<std::string, std::pair<std::string, json>> fsdp_;  // canonical key -> (path as written, value)
  int version_ = 1;
  bool hsdp_ = false;                                 // parallelism_config asks for Tessera's hybrid_shard
  std::vector<std::pair<std::string, json>> dp_;      // its dp_*_size keys (path, value)
};

}  // namespace

std::string AccelerateTranslation::submit_line(const std::string& config_path) const {
  const std::string head = "make -f Makefile.slurm submit CONFIG=" + config_path + " NODES=" + std::to_string(nodes);
  if (ranks_per_node == 0)
    return head + " GPUS_PER_NODE=<GPUs per node>   (num_processes was not given)";
  if (cpu) return head + " GPUS_PER_NODE=0 TASKS_PER_NODE=" + std::to_string(ranks_per_node);
  return head + " GPUS_PER_NODE=" + std::to_string(ranks_per_node);
}

AccelerateTranslation translate_accelerate(const json& doc, const std::string& source, const YamlPositions& positions) {
  AccelerateTranslation t = Translator(source, positions).run(doc);
  // The result must be a valid Tessera config: a renamed schema key fails here, not at train time.
  Config::from_json(t.config, source + " (translated)");
  return t;
}

AccelerateTranslation translate_accelerate_file(const std::string& path) {
  YamlPositions positions;
  json doc = read_yaml_file(path, {}, &positions);
  return translate_accelerate(doc, path, positions);
}

int run_config_from_accelerate(const std::string& path, const std::string& out) {
  namespace fs = std::filesystem;
  if (!out.empty() && fs::exists(fs::symlink_status(out)))
    throw TESSERA_INPUT_ERROR("--out " + out + " already exists; remove it or choose another name");
  const AccelerateTranslation t = translate_accelerate_file(path);
  const std::string text = t.config.dump(2) + "\n";
  if (out.empty()) {
    std::cout << text << std::flush;
  } else {
    std::string why;  // a fresh temporary (mkstemp) renamed to the name: never through a link
    if (!util::replace_file(out, text, why)) throw TESSERA_INPUT_ERROR("--out " + out + ": " + why);
  }
  std::cerr << "Accelerate config " << path << " -> Tessera run config " << (out.empty() ? "(stdout)" : out) << ":\n";
  for (const auto& line : t.report) std::cerr << "  " << line << "\n";
  std::cerr << "submit: " << t.submit_line(out.empty() ? "run.json" : out) << std::endl;
  return 0;
}

}  // namespace tessera::launcher
