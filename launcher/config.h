// The run configuration, typed: one struct per section (model, data, train, fsdp, optim, checkpoint,
// eval, log, comm) whose fields the code reads, and one schema table (config.cpp: config_schema())
// that binds every key to its field with its type, default, bounds, choices and meaning. The table
// is the one place a key is declared: Config() takes its defaults from it, load() / from_json() /
// --set / set() validate through it, json() is written from the fields through it, and
// `tessera config --reference` prints it as the configuration reference (docs/CONFIGURATION.md,
// README). Unknown keys, wrong types, values out of bounds and names not among the choices are
// one-line errors naming the key.
//
// Enumerated keys are enums in their section; each enum's names are one list (util/enum_names.h)
// in its own dependency-free header (runtime/fsdp/names.h, runtime/data/names.h,
// runtime/optim/names.h, util/dtype_names.h, or below for the launcher's own) that the schema's
// choices, the parsers and the messages share.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/data/names.h"
#include "runtime/fsdp/names.h"
#include "runtime/optim/names.h"
#include "util/dtype_names.h"
#include "util/enum_names.h"

namespace tessera::launcher {

// fsdp.activation_checkpointing.
enum class Recompute { Auto, True, False };
TESSERA_ENUM_NAMES(recompute_names, "auto", "true", "false")
// data.train_on.
enum class TrainOn { Completion, All };
TESSERA_ENUM_NAMES(train_on_names, "completion", "all")
// train.preempt_signal.
enum class PreemptSignal { USR1, USR2 };
TESSERA_ENUM_NAMES(preempt_signal_names, "USR1", "USR2")

struct ModelSection {
  std::string path, preset;
  int64_t seed = 0;
  fsdp::LoadMode load{};
};
struct DataSection {
  std::string path, tokenizer;
  data::DataFormat format{};
  int64_t seq_len = 0;
  data::ChatTemplateKind chat_template{};
  TrainOn train_on{};
  bool packing = false;
  data::Truncation truncation{};
  std::string val_path;
  double val_fraction = 0;
  std::string split, val_split;  // a data directory's splits (runtime/data/splits.h)
};
struct TrainSection {
  int64_t steps = 0, micro_batch = 0, grad_accum = 0;
  double lr = 0, min_lr = 0;
  int64_t warmup_steps = 0;
  optim::Schedule schedule{};
  double weight_decay = 0, beta1 = 0, beta2 = 0, eps = 0, clip = 0;
  int64_t max_skipped_steps = 0, seed = 0;
  std::string device;
  PreemptSignal preempt_signal{};
  std::vector<int64_t> profile_steps;
  double peak_flops = 0;
};
struct FsdpSection {
  fsdp::Strategy strategy{};
  util::FloatType mixed_precision{}, reduce_dtype{};
  Recompute activation_checkpointing{};
  bool prefetch = false;
  int64_t limit_all_gathers = 0;
  fsdp::Accumulate accumulate{};
  fsdp::Offload offload{};
};
struct OptimSection {
  optim::StateDtype state_dtype{};
  bool in_backward = false;
};
struct CheckpointSection {
  std::string dir;
  int64_t every = 0, keep = 0;
  bool keep_best = false, async = false;
  std::string resume;
};
struct EvalSection {
  int64_t every = 0;
};
struct LogSection {
  std::string dir;
  int64_t every = 0;
  bool tensorboard = false;
};
struct CommSection {
  double timeout_s = 0;
};

class Config;

// One key of the schema. `store` writes a value that passed the checks into its field; `value`
// reads the field back as JSON.
struct ConfigKey {
  std::string key;          // dotted path, e.g. "train.lr": section and field
  std::string type;         // "int", "float", "bool", "string", "int list" (a JSON array of integers)
  nlohmann::json default_value;
  std::string help;
  std::vector<std::string> choices;  // allowed values for strings (empty: any)
  std::optional<double> min, max;    // bounds for numbers (inclusive; `max_open`: max excluded)
  bool max_open = false;
  std::function<void(Config&, const nlohmann::json&)> store;
  std::function<nlohmann::json(const Config&)> value;
};

const std::vector<ConfigKey>& config_schema();

class Config {
 public:
  ModelSection model;
  DataSection data;
  TrainSection train;
  FsdpSection fsdp;
  OptimSection optim;
  CheckpointSection checkpoint;
  EvalSection eval;
  LogSection log;
  CommSection comm;

  // Every key at its schema default.
  Config();
  // Reads a run config file (JSON; YAML when the name ends in .yaml/.yml; errors name file, line and
  // column), merges over the defaults, applies `--set key=value` overrides, validates every key.
  static Config load(const std::string& path, const std::vector<std::string>& overrides = {});
  static Config from_json(const nlohmann::json& j, const std::string& source,
                          const std::vector<std::string>& overrides = {});

  // Every key, from the fields: what run_info.json, checkpoints and `config --check` record.
  nlohmann::json json() const;
  // Sets one key from its JSON value, validated like --set (`tessera plan`'s suggestions).
  void set(const std::string& key, const nlohmann::json& v);

  // Markdown table of every key (for README).
  static std::string reference_markdown();
};

// Parses JSON text; on error throws Error(Input) "FILE:LINE:COL: <reason>".
nlohmann::json parse_json_text(const std::string& text, const std::string& source);
nlohmann::json read_json_file(const std::string& path);
// A run config file as JSON: YAML when the name ends in .yaml/.yml (plain scalars typed by the
// schema; yaml_config.cpp), else JSON.
nlohmann::json read_config_file(const std::string& path);

}  // namespace tessera::launcher
