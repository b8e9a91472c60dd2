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
// in its own dependency-free header (runtime/fsdp/names.h, runtime/data/names.h, text/names.h,
// runtime/optim/names.h, util/dtype_names.h, or below for the launcher's own) that the schema's
// choices, the parsers and the messages share.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/lora.h"
#include "runtime/comm/emulation.h"
#include "runtime/comm/names.h"
#include "runtime/data/names.h"
#include "runtime/fsdp/names.h"
#include "runtime/optim/names.h"
#include "runtime/train/options.h"
#include "text/names.h"
#include "util/dtype_names.h"
#include "util/enum_names.h"

namespace tessera::launcher {

// fsdp.activation_checkpointing.
enum class Recompute { Auto, True, False };
TESSERA_ENUM_NAMES(recompute_names, "auto", "true", "false")
// data.train_on.
enum class TrainOn { Completion, All };
TESSERA_ENUM_NAMES(train_on_names, "completion", "all")

// The sections the launcher itself reads (model, data, fsdp, comm); the training loop's, the
// optimizer's and the checkpoint's are owned by those components (runtime/train/options.h) and
// reach Config through train::Settings. The initialisers are the defaults (config_schema() reads
// them: a key's default is its field in a default-constructed section).
struct ModelSection {
  std::string path, preset = "tiny";
  int64_t seed = 1234;
  fsdp::LoadMode load = fsdp::LoadMode::Rank0;
  bool fused_kernels = true;  // on a GPU, Tessera's own RMSNorm, SwiGLU, RoPE and cross-entropy kernels
  bool varlen_attention = true;  // on a GPU, packed rows and sliding windows on FlashAttention's varlen kernel
};
struct DataSection {
  std::string path = "/usr/share/common-licenses", tokenizer;
  data::DataFormat format = data::DataFormat::Auto;
  int64_t seq_len = 128;
  text::ChatTemplateKind chat_template = text::ChatTemplateKind::Auto;
  TrainOn train_on = TrainOn::Completion;
  bool packing = true;
  data::Truncation truncation = data::Truncation::Drop;
  std::string val_path;
  double val_fraction = 0;
  std::string split = "train", val_split;  // a data directory's splits (runtime/data/splits.h)
};
struct FsdpSection {
  fsdp::Strategy strategy = fsdp::Strategy::FullShard;
  util::FloatType mixed_precision = util::FloatType::F32, reduce_dtype = util::FloatType::F32;
  Recompute activation_checkpointing = Recompute::Auto;
  bool prefetch = true;
  int64_t limit_all_gathers = 2;
  fsdp::Accumulate accumulate = fsdp::Accumulate::Sharded;
  fsdp::Offload offload = fsdp::Offload::None;
};
struct CommSection {
  double timeout_s = 600.0;
  comm::DeviceBackend device_backend = comm::DeviceBackend::Nccl;
};

class Config;

// One key of the schema. `store` writes a value that passed the checks into its field; `value`
// reads the field back as JSON.
struct ConfigKey {
  std::string key;          // dotted path, e.g. "train.lr": section and field
  std::string type;         // "int", "float", "bool", "string", "int list", "string list" (JSON arrays)
  nlohmann::json default_value;
  std::string help;
  std::vector<std::string> choices;  // allowed values for strings (empty: any)
  std::optional<double> min, max;    // bounds for numbers (inclusive; `max_open`: max excluded)
  bool max_open = false;
  std::function<void(Config&, const nlohmann::json&)> store;
  std::function<nlohmann::json(const Config&)> value;
};

const std::vector<ConfigKey>& config_schema();

// train, schedule, optim, checkpoint, eval and log come from train::Settings (what the Trainer is
// given, runtime/train/options.h); the launcher's own sections are here.
class Config : public train::Settings {
 public:
  ModelSection model;
  DataSection data;
  FsdpSection fsdp;
  CommSection comm;
  comm::Emulation comm_emulation;  // comm.emulate_* (runtime/comm/emulation.h owns and validates them)
  lora::Options lora;  // lora.* (model/lora.h owns and validates them)

  // Every key at its default.
  Config() = default;
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

// fp16 anywhere in the gradient path (fsdp.mixed_precision or fsdp.reduce_dtype): the trainer turns
// on dynamic loss scaling (runtime/train/numerics.h).
bool loss_scaling(const Config& c);

// Parses JSON text; on error throws Error(Input) "FILE:LINE:COL: <reason>".
nlohmann::json parse_json_text(const std::string& text, const std::string& source);
nlohmann::json read_json_file(const std::string& path);
// A run config file as JSON: YAML when the name ends in .yaml/.yml (plain scalars typed by the
// schema; yaml_config.cpp), else JSON.
nlohmann::json read_config_file(const std::string& path);

}  // namespace tessera::launcher
