#include "launcher/config.h"

#include <fstream>
#include <sstream>

#include "launcher/cli.h"
#include "model/config.h"
#include "runtime/error.h"
#include "runtime/fsdp/names.h"
#include "util/json.h"

namespace tessera::launcher {

using nlohmann::json;

const std::vector<ConfigKey>& config_schema() {
  static const std::vector<ConfigKey> schema = {
      // model
      {"model.path", "string", "", "Hugging Face model directory (config.json + safetensors). Empty: build `model.preset` from `model.seed`."},
      {"model.preset", "string", "tiny", "Preset used when model.path is empty (any family of the model registry).", model::ModelConfig::preset_names()},
      {"model.seed", "int", 1234, "Seed of the initialisation when model.path is empty."},
      {"model.load", "string", "rank0", "How weights are read: rank0 (rank 0 streams unit by unit and scatters shards), parallel (every rank reads only its byte ranges; shared file system), naive (every rank reads everything; benchmark baseline only).", {"rank0", "parallel", "naive"}},
      // data
      {"data.path", "string", "/usr/share/common-licenses", "Training data: a text file, a JSONL file (records `messages` (chat), `prompt`/`completion` or `text`, auto-detected per line), a token file from `tessera tokenize`, or a directory of them."},
      {"data.tokenizer", "string", "", "SentencePiece tokenizer.model (Llama 2 format), a Hugging Face byte-level BPE tokenizer.json (Llama 3; a *.json file or a directory holding tokenizer.json), or `bytes` (byte-level tokens 0-255, BOS 256, EOS 257). Its vocabulary must fit the model's vocab_size. Empty: the model directory's tokenizer.model, else its tokenizer.json; byte-level tokens when the model's vocabulary is the byte vocabulary (BOS 256, EOS 257: the tiny presets); otherwise an error naming the model's vocab size."},
      {"data.seq_len", "int", 128, "Tokens per training sequence (<= the model's max_position_embeddings)."},
      {"data.chat_template", "string", "llama2", "How `messages` records are rendered: llama2 (`<s>[INST] <<SYS>>...<</SYS>> user [/INST] assistant </s>`, as Meta and Hugging Face), llama3 (header and <|eot_id|> special tokens of the tokenizer), none (contents concatenated).", {"llama2", "llama3", "none"}},
      {"data.train_on", "string", "completion", "Loss targets: completion (assistant turns and completions; `text` records and text files entirely) or all (every token).", {"completion", "all"}},
      {"data.packing", "bool", true, "Pack several examples into each sequence (a token attends only within its example, positions restart per example); false: one example per sequence, padded."},
      {"data.truncation", "string", "drop", "An example (chat, prompt/completion) longer than seq_len + 1 tokens: drop (skip it with a warning naming file and line), left (keep its last seq_len + 1 tokens), error (stop). Text is cut into pieces instead.", {"drop", "left", "error"}},
      {"data.val_path", "string", "", "Validation data, in the formats of data.path."},
      {"data.val_fraction", "float", 0.0, "Fraction of data.path's examples held out for validation (a fixed hash per example; 0: none). Exclusive with data.val_path."},
      // train
      {"train.steps", "int", 20, "Optimizer steps."},
      {"train.micro_batch", "int", 2, "Sequences per rank per micro-step."},
      {"train.grad_accum", "int", 1, "Micro-steps per optimizer step (gradients are reduced once per step)."},
      {"train.lr", "float", 3e-4, "Peak learning rate."},
      {"train.min_lr", "float", 3e-5, "Learning rate at the end of the cosine decay."},
      {"train.warmup_steps", "int", 5, "Linear warmup steps."},
      {"train.schedule", "string", "cosine", "Learning-rate schedule after warmup.", {"cosine", "constant"}},
      {"train.weight_decay", "float", 0.1, "AdamW decoupled weight decay (not applied to norm weights)."},
      {"train.beta1", "float", 0.9, "AdamW beta1."},
      {"train.beta2", "float", 0.95, "AdamW beta2."},
      {"train.eps", "float", 1e-8, "AdamW epsilon."},
      {"train.clip", "float", 1.0, "Global gradient-norm clipping threshold (0 disables)."},
      {"train.max_skipped_steps", "int", 10, "A step whose loss or gradient norm is not finite is skipped on every rank (weights and optimizer state untouched; with fp16 the loss scale halves); this many skipped in a row stop the run with exit code 2, the last checkpoint kept (0: never stop)."},
      {"train.seed", "int", 42, "Seed of data shuffling."},
      {"train.device", "string", "auto", "Where shards, optimizer state and compute live: `auto` (cuda when this build has CUDA and a GPU is visible, else cpu), `cpu` (MPI collectives), `cuda` (local rank r uses GPU r; NCCL collectives), `cuda:N` (local rank r uses GPU N+r)."},
      {"train.preempt_signal", "string", "USR2", "Signal that makes the loop finish the step, checkpoint and exit for requeue (SIGTERM always does).", {"USR1", "USR2"}},
      // fsdp
      {"fsdp.strategy", "string", "full_shard", "full_shard (ZeRO-3), shard_grad_op (ZeRO-2), no_shard (DDP), hybrid_shard (full_shard in a node, replicate across nodes).", fsdp::strategy_names()},
      {"fsdp.mixed_precision", "string", "fp32", "Dtype of gathered parameters and compute; master shards and optimizer state are fp32. fp16 needs a GPU (refused on CPU: LibTorch has no fp16 matmul there).", {"fp32", "bf16", "fp16"}},
      {"fsdp.reduce_dtype", "string", "fp32", "Dtype of gradient reduction. fp16 here or in mixed_precision turns on dynamic loss scaling (as torch.cuda.amp.GradScaler: scale 65536, halved on a non-finite step, doubled after 2000 finite ones; checkpointed).", {"fp32", "bf16", "fp16"}},
      {"fsdp.activation_checkpointing", "string", "auto", "Recompute each decoder layer in backward: auto (on for hidden_size >= 4096: the 7B and larger presets), true, false.", {"auto", "true", "false"}},
      {"fsdp.prefetch", "bool", true, "Issue the next unit's all-gather before the current unit's compute (forward and backward)."},
      {"fsdp.limit_all_gathers", "int", 2, "Most decoder-layer units gathered at once (>= 1)."},
      {"fsdp.accumulate", "string", "sharded", "Gradient accumulation over train.grad_accum micro-steps: sharded (every micro-step reduce-scatters into the fp32 gradient shard; nothing model-sized is kept between micro-steps) or unsharded (micro-steps before the last accumulate a full-size fp32 gradient per unit locally, like no_sync(); one reduction per step: less traffic, 4 bytes per parameter more memory). no_shard adds into its (full) gradient either way.", fsdp::accumulate_names()},
      // optim
      {"optim.state_dtype", "string", "fp32", "Dtype of AdamW's two moments: fp32 (16 bytes per parameter with the fp32 master and gradient) or bf16 (12 bytes; each update is computed in fp32 and rounded once).", {"fp32", "bf16"}},
      // checkpoint
      {"checkpoint.dir", "string", "", "Directory of sharded checkpoints (step-<N>/). Empty: no checkpoints."},
      {"checkpoint.every", "int", 0, "Save every N steps (0: only at the end and on preemption)."},
      {"checkpoint.keep", "int", 2, "Complete checkpoints to retain."},
      {"checkpoint.keep_best", "bool", false, "Also keep the checkpoint with the lowest validation loss (saved whenever validation improves); needs validation data and checkpoint.dir."},
      {"checkpoint.async", "bool", false, "Snapshot shards to host memory and write on a background thread."},
      {"checkpoint.resume", "string", "auto", "auto: resume from the latest complete checkpoint in checkpoint.dir if any; never; or a checkpoint directory."},
      // eval
      {"eval.every", "int", 0, "Validation loss every N steps (0: only at the end of the run); needs data.val_path or data.val_fraction."},
      // log
      {"log.dir", "string", "", "Directory for metrics.jsonl (one record per step), run_info.json (config and topology) and report.html (`tessera report`). Empty: checkpoint.dir, else none."},
      {"log.every", "int", 1, "Progress line every N steps."},
      {"train.profile_steps", "int list", nlohmann::json::array(), "Steps [first, last] (1-based, inclusive) to trace: every rank writes log.dir/trace-rank-<r>.json, a Chrome trace (chrome://tracing, ui.perfetto.dev) with one track per thread (compute, each communicator's thread). Needs log.dir (or checkpoint.dir). []: no trace. The step-time breakdown in metrics.jsonl is always on."},
      // comm
      {"comm.timeout_s", "float", 600.0, "Seconds any wait on a collective may take (every backend; checkpoint save/load and error agreement included). The rank that times out writes its flight record to `<log.dir>/flight`, names the collective and the ranks that did not reach it, and ends every rank (exit code 3)."},
  };
  return schema;
}

namespace {

const ConfigKey* find_key(const std::string& key) {
  for (const auto& k : config_schema())
    if (k.key == key) return &k;
  return nullptr;
}

std::vector<std::string> all_keys() {
  std::vector<std::string> keys;
  for (const auto& k : config_schema()) keys.push_back(k.key);
  return keys;
}

[[noreturn]] void unknown_key(const std::string& key, const std::string& source) {
  std::string hint = closest_match(key, all_keys());
  throw TESSERA_INPUT_ERROR(source + ": unknown config key '" + key + "'" +
                            (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
}

std::string type_name(const json& v) {
  if (v.is_boolean()) return "bool";
  if (v.is_number_integer()) return "int";
  if (v.is_number()) return "float";
  if (v.is_string()) return "string";
  if (v.is_null()) return "null";
  return v.is_array() ? "array" : "object";
}

// Checks one value against its schema entry; returns it normalised (int accepted for float).
json check_value(const ConfigKey& k, const json& v, const std::string& source) {
  bool ok = (k.type == "int" && v.is_number_integer()) || (k.type == "float" && v.is_number()) ||
            (k.type == "bool" && v.is_boolean()) || (k.type == "string" && v.is_string()) ||
            (k.type == "int list" && v.is_array() &&
             std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_number_integer(); }));
  if (!ok)
    throw TESSERA_INPUT_ERROR(source + ": config key '" + k.key + "' must be " + k.type + ", got " +
                              type_name(v) + " " + v.dump());
  if (!k.choices.empty()) {
    std::string s = v.get<std::string>();
    if (std::find(k.choices.begin(), k.choices.end(), s) == k.choices.end()) {
      std::string list;
      for (const auto& c : k.choices) list += (list.empty() ? "" : ", ") + c;
      std::string hint = closest_match(s, k.choices);
      throw TESSERA_INPUT_ERROR(source + ": config key '" + k.key + "' is '" + s + "', expected one of " + list +
                                (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
    }
  }
  if (k.type == "float") return v.get<double>();
  return v;
}

void flatten(const json& j, const std::string& prefix, std::vector<std::pair<std::string, json>>& out,
             const std::string& source) {
  if (!j.is_object())
    throw TESSERA_INPUT_ERROR(source + ": '" + (prefix.empty() ? std::string("top level") : prefix) +
                              "' must be a JSON object, got " + type_name(j));
  for (auto it = j.begin(); it != j.end(); ++it) {
    std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it->is_object() && !find_key(key)) {
      bool is_section = false;
      for (const auto& k : config_schema()) is_section |= k.key.rfind(key + ".", 0) == 0;
      if (!is_section) unknown_key(key, source);
      flatten(*it, key, out, source);
    } else {
      out.emplace_back(key, *it);
    }
  }
}

json& slot(json& root, const std::string& key) {
  json* cur = &root;
  size_t start = 0;
  for (;;) {
    size_t dot = key.find('.', start);
    std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    cur = &(*cur)[part];
    if (dot == std::string::npos) return *cur;
    start = dot + 1;
  }
}

}  // namespace

json parse_json_text(const std::string& text, const std::string& source) {
  try {
    return util::parse_json(text);
  } catch (const json::parse_error& e) {
    size_t line = 1, col = 1, byte = std::min<size_t>(e.byte, text.size());
    for (size_t i = 0; i + 1 < byte; ++i) {
      if (text[i] == '\n') ++line, col = 1;
      else ++col;
    }
    std::string reason = e.what();
    auto p = reason.find("parse error");
    if (p != std::string::npos) reason = reason.substr(p);
    throw TESSERA_INPUT_ERROR(source + ":" + std::to_string(line) + ":" + std::to_string(col) +
                              ": invalid JSON: " + reason);
  } catch (const json::exception& e) {  // e.g. out_of_range 406 for 1e400 (found by fuzzing)
    throw TESSERA_INPUT_ERROR(source + ": invalid JSON: " + e.what());
  }
}

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw TESSERA_INPUT_ERROR(path + ": cannot open config file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_json_text(ss.str(), path);
}

Config::Config() {
  for (const auto& k : config_schema()) slot(j_, k.key) = k.default_value;
}

Config Config::from_json(const nlohmann::json& j, const std::string& source, const std::vector<std::string>& overrides) {
  Config c;
  std::vector<std::pair<std::string, nlohmann::json>> flat;
  flatten(j, "", flat, source);
  for (const auto& [key, value] : flat) {
    const ConfigKey* k = find_key(key);
    if (!k) unknown_key(key, source);
    slot(c.j_, key) = check_value(*k, value, source);
  }
  for (const auto& o : overrides) {
    auto eq = o.find('=');
    if (eq == std::string::npos || eq == 0)
      throw TESSERA_INPUT_ERROR("--set '" + o + "': expected key=value (e.g. --set train.lr=1e-4)");
    std::string key = o.substr(0, eq), text = o.substr(eq + 1);
    const ConfigKey* k = find_key(key);
    if (!k) unknown_key(key, "--set");
    nlohmann::json v;
    if (k->type == "string") {
      v = text;
    } else {
      try {
        v = util::parse_json(text);
      } catch (const nlohmann::json::exception&) {  // not JSON, or a number out of range (1e400)
        v = text;
      }
    }
    // A JSON file cannot hold invalid UTF-8, but a shell argument can: every later dump() of the
    // config (error messages, the checkpoint manifest) would throw json type_error 316 (found by fuzzing).
    try {
      (void)v.dump();
    } catch (const nlohmann::json::type_error&) {
      throw TESSERA_INPUT_ERROR("--set " + key + ": the value is not valid UTF-8");
    }
    slot(c.j_, key) = check_value(*k, v, "--set");
  }
  return c;
}

Config Config::load(const std::string& path, const std::vector<std::string>& overrides) {
  return from_json(path.empty() ? nlohmann::json::object() : read_config_file(path), path.empty() ? "config" : path,
                   overrides);
}

void Config::set(const std::string& key, const nlohmann::json& v) {
  const ConfigKey* k = find_key(key);
  if (!k) unknown_key(key, "config");
  slot(j_, key) = check_value(*k, v, "config");
}

const nlohmann::json& Config::at(const std::string& key) const {
  if (!find_key(key)) throw Error(ErrorKind::Internal, "config key not in schema: " + key, __FILE__, __LINE__);
  return j_.at(nlohmann::json::json_pointer("/" + [&] {
    std::string p = key;
    std::replace(p.begin(), p.end(), '.', '/');
    return p;
  }()));
}

int64_t Config::get_int(const std::string& key) const { return at(key).get<int64_t>(); }
double Config::get_float(const std::string& key) const { return at(key).get<double>(); }
bool Config::get_bool(const std::string& key) const { return at(key).get<bool>(); }
std::string Config::get_string(const std::string& key) const { return at(key).get<std::string>(); }
std::vector<int64_t> Config::get_int_list(const std::string& key) const { return at(key).get<std::vector<int64_t>>(); }

std::string Config::reference_markdown() {
  std::ostringstream os;
  os << "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const auto& k : config_schema()) {
    std::string help = k.help;
    if (!k.choices.empty()) {
      std::string list;
      for (const auto& c : k.choices) list += (list.empty() ? "" : ", ") + ("`" + c + "`");
      help += " One of " + list + ".";
    }
    os << "| `" << k.key << "` | " << k.type << " | `" << k.default_value.dump() << "` | " << help << " |\n";
  }
  return os.str();
}

}  // namespace tessera::launcher
