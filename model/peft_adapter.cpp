// PEFT LoRA adapter files: see peft_adapter.h.
#include "model/peft_adapter.h"

#include <ATen/ops/matmul.h>

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include "model/errors.h"
#include "model/registry.h"
#include "util/json.h"
#include "util/output_file.h"

namespace tessera::model {

namespace fs = std::filesystem;

namespace {

// "key": refused unless absent/null or equal to `want` (a string or bool setting Tessera fixes).
void require_value(const nlohmann::json& j, const char* key, const nlohmann::json& want, const std::string& source,
                   const std::string& why) {
  if (!j.contains(key) || j[key].is_null() || j[key] == want) return;
  throw ModelError(source + ": " + key + " " + j[key].dump() + " is not supported (" + why + ")");
}
// "key": refused unless absent, null or empty (an object, array or string).
void require_empty(const nlohmann::json& j, const char* key, const std::string& source, const std::string& why) {
  if (!j.contains(key) || j[key].is_null() || ((j[key].is_object() || j[key].is_array() || j[key].is_string()) && j[key].empty()))
    return;
  throw ModelError(source + ": " + key + " " + j[key].dump() + " is not supported (" + why + ")");
}

std::vector<std::string> read_targets(const nlohmann::json& j, const std::string& source) {
  if (!j.contains("target_modules") || j["target_modules"].is_null())
    throw ModelError(source + ": target_modules is missing (list the adapted modules, e.g. [\"q_proj\", \"v_proj\"])");
  const auto& t = j["target_modules"];
  if (t.is_string()) {
    if (t.get<std::string>() == "all-linear") return {"all-linear"};
    throw ModelError(source + ": target_modules " + t.dump() +
                     " is a regular expression, which is not supported: list the module names");
  }
  std::vector<std::string> out;
  if (t.is_array())
    for (const auto& e : t)
      if (e.is_string() && !e.get<std::string>().empty()) out.push_back(e.get<std::string>());
  if (out.empty() || out.size() != t.size())
    throw ModelError(source + ": target_modules " + t.dump() + " must be a non-empty list of module names");
  std::sort(out.begin(), out.end());
  return out;
}

double number(const nlohmann::json& j, const char* key, double fallback, const std::string& source) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number()) throw ModelError(source + ": " + key + " " + j[key].dump() + " is not a number");
  return j[key].get<double>();
}

bool ends_with_module(const std::string& module, const std::string& entry) {
  return module == entry ||
         (module.size() > entry.size() && module.compare(module.size() - entry.size(), entry.size(), entry) == 0 &&
          module[module.size() - entry.size() - 1] == '.');
}

// The 2-D weights of the decoder layers, in the base model's tensor order.
std::vector<TensorSpec> layer_linears(const ModelConfig& base) {
  std::vector<TensorSpec> out;
  for (int64_t i = 0; i < base.num_hidden_layers; ++i)
    for (const auto& s : hf_layer_specs(base, i))
      if (s.shape.size() == 2 && s.name.size() > 7 && s.name.compare(s.name.size() - 7, 7, ".weight") == 0)
        out.push_back(s);
  return out;
}

}  // namespace

nlohmann::json PeftConfig::to_json() const {
  std::vector<std::string> targets = target_modules;  // PEFT keeps a set: written sorted
  std::sort(targets.begin(), targets.end());
  nlohmann::json alpha = lora_alpha;
  if (lora_alpha == std::floor(lora_alpha) && std::fabs(lora_alpha) < 1e15) alpha = static_cast<int64_t>(lora_alpha);
  return {{"peft_type", peft_type},
          {"task_type", task_type},
          {"r", r},
          {"lora_alpha", alpha},
          {"lora_dropout", lora_dropout},
          {"target_modules", targets.size() == 1 && targets[0] == "all-linear" ? nlohmann::json("all-linear")
                                                                                : nlohmann::json(targets)},
          {"bias", bias},
          {"base_model_name_or_path", base_model_name_or_path},
          {"fan_in_fan_out", fan_in_fan_out},
          {"inference_mode", inference_mode},
          {"use_rslora", use_rslora},
          {"use_dora", false},
          {"init_lora_weights", true},
          {"rank_pattern", nlohmann::json::object()},
          {"alpha_pattern", nlohmann::json::object()},
          {"modules_to_save", nullptr},
          {"layers_to_transform", nullptr},
          {"layers_pattern", nullptr},
          {"revision", nullptr}};
}

PeftConfig PeftConfig::from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw ModelError(source + ": not a JSON object");
  PeftConfig c;
  if (!j.contains("peft_type") || j["peft_type"] != "LORA")
    throw ModelError(source + ": peft_type " + (j.contains("peft_type") ? j["peft_type"].dump() : "(missing)") +
                     " is not supported (a LoRA adapter has \"LORA\")");
  require_value(j, "task_type", "CAUSAL_LM", source, "Tessera trains causal language models");
  require_value(j, "bias", "none", source, "Tessera's adapters have no bias terms");
  require_value(j, "fan_in_fan_out", false, source, "the weights are [out, in] linear layers");
  require_value(j, "use_rslora", false, source, "Tessera scales by lora_alpha / r, not lora_alpha / sqrt(r)");
  require_value(j, "use_dora", false, source, "DoRA's magnitude vectors are not implemented");
  require_value(j, "lora_bias", false, source, "Tessera's adapters have no bias terms");
  require_empty(j, "rank_pattern", source, "one r for every module");
  require_empty(j, "alpha_pattern", source, "one lora_alpha for every module");
  require_empty(j, "modules_to_save", source, "only LoRA pairs are read, no fully trained modules");
  require_empty(j, "layers_to_transform", source, "every layer is adapted");
  require_empty(j, "layers_pattern", source, "every layer is adapted");
  if (!j.contains("r") || !j["r"].is_number_integer() || j["r"].get<int64_t>() <= 0)
    throw ModelError(source + ": r " + (j.contains("r") ? j["r"].dump() : "(missing)") + " must be a positive integer");
  c.r = j["r"].get<int64_t>();
  c.lora_alpha = number(j, "lora_alpha", 8.0, source);  // PEFT's default
  if (!(c.lora_alpha > 0) || !std::isfinite(c.lora_alpha))
    throw ModelError(source + ": lora_alpha " + j["lora_alpha"].dump() + " must be positive");
  c.lora_dropout = number(j, "lora_dropout", 0.0, source);
  if (!(c.lora_dropout >= 0 && c.lora_dropout < 1))
    throw ModelError(source + ": lora_dropout " + j["lora_dropout"].dump() + " must be in [0, 1)");
  c.target_modules = read_targets(j, source);
  if (j.contains("base_model_name_or_path") && j["base_model_name_or_path"].is_string())
    c.base_model_name_or_path = j["base_model_name_or_path"].get<std::string>();
  if (j.contains("inference_mode") && j["inference_mode"].is_boolean()) c.inference_mode = j["inference_mode"].get<bool>();
  return c;
}

std::vector<LoraTarget> lora_targets(const ModelConfig& base, const PeftConfig& cfg, const std::string& source) {
  const bool all = cfg.target_modules.size() == 1 && cfg.target_modules[0] == "all-linear";
  std::set<std::string> used;
  std::vector<LoraTarget> out;
  for (const auto& w : layer_linears(base)) {
    const std::string module = w.name.substr(0, w.name.size() - 7);
    bool hit = all;
    for (const auto& e : cfg.target_modules)
      if (ends_with_module(module, e)) {
        used.insert(e);
        hit = true;
      }
    if (!hit) continue;
    const int64_t out_f = w.shape[0], in_f = w.shape[1];
    out.push_back({module, w.name, {module + ".lora_A.weight", {cfg.r, in_f}}, {module + ".lora_B.weight", {out_f, cfg.r}}});
  }
  if (all) return out;
  for (const auto& e : cfg.target_modules)
    if (!used.count(e))
      throw ModelError(source + ": target_modules names \"" + e +
                       "\", which matches no linear module of the model's decoder layers (e.g. q_proj, k_proj, "
                       "v_proj, o_proj, gate_proj, up_proj, down_proj)");
  return out;
}

void write_peft_adapter(const std::string& dir, const PeftConfig& cfg, const ModelConfig& base, DType dtype,
                        const std::function<at::Tensor(const TensorSpec&)>& produce) {
  const std::vector<LoraTarget> targets = lora_targets(base, cfg, dir);
  std::vector<TensorSpec> specs;  // file keys
  for (const auto& t : targets)
    for (const TensorSpec* s : {&t.a, &t.b}) specs.push_back({kPeftKeyPrefix + s->name, s->shape});
  const size_t prefix = std::string(kPeftKeyPrefix).size();
  write_directory_atomically(dir, [&](const std::string& tmp) {
    std::string why;
    if (!util::replace_file(tmp + "/adapter_config.json", cfg.to_json().dump(2) + "\n", why)) throw ModelError(why);
    write_safetensors_file(tmp + "/adapter_model.safetensors", specs, dtype, [&](const TensorSpec& s) {
      return produce(TensorSpec{s.name.substr(prefix), s.shape});
    });
  });
}

namespace {

std::string last_component(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

// The adapter's base_model_name_or_path against the base directory (see the header).
void check_base_name(const std::string& name, const std::string& base_dir, const std::string& source) {
  if (name.empty()) return;
  std::set<std::string> accepted = {last_component(base_dir)};
  std::error_code ec;
  const fs::path canonical = fs::weakly_canonical(base_dir, ec);
  if (!ec) accepted.insert(last_component(canonical.string()));
  std::ifstream in(base_dir + "/config.json");
  const std::string text(std::istreambuf_iterator<char>(in), {});
  const nlohmann::json c = util::parse_json_or_discarded(text);  // unreadable: no name from it
  if (c.is_object() && c.contains("_name_or_path") && c["_name_or_path"].is_string())
    accepted.insert(last_component(c["_name_or_path"].get<std::string>()));
  if (accepted.count(last_component(name))) return;
  throw ModelError(source + ": base_model_name_or_path \"" + name + "\" does not name the base model " + base_dir +
                   " (compared: the last path component, also with the base's config.json _name_or_path)");
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ModelError(path + ": cannot read (a PEFT adapter directory has adapter_config.json)");
  const std::string text(std::istreambuf_iterator<char>(in), {});
  nlohmann::json j = util::parse_json_or_discarded(text);
  if (j.is_discarded()) throw ModelError(path + ": not valid JSON (or nested too deeply)");
  return j;
}

}  // namespace

PeftAdapter::PeftAdapter(const std::string& dir, const ModelConfig& base, const std::string& base_dir) : dir_(dir) {
  const std::string config_path = dir + "/adapter_config.json", weights = dir + "/adapter_model.safetensors";
  cfg_ = PeftConfig::from_json(read_json_file(config_path), config_path);
  check_base_name(cfg_.base_model_name_or_path, base_dir, config_path);
  targets_ = lora_targets(base, cfg_, config_path);
  std::error_code ec;
  if (!fs::exists(weights, ec))
    throw ModelError(weights + ": missing" +
                     (fs::exists(dir + "/adapter_model.bin", ec)
                          ? std::string(" (the adapter is in PEFT's pickle format, adapter_model.bin: save it with "
                                        "safe_serialization=True)")
                          : std::string()));
  file_ = std::make_unique<SafetensorsFile>(weights);
  std::map<std::string, const TensorSpec*> expected;
  for (const auto& t : targets_)
    for (const TensorSpec* s : {&t.a, &t.b}) expected[kPeftKeyPrefix + s->name] = s;
  for (const auto& [key, entry] : file_->entries()) {
    const auto it = expected.find(key);
    if (it == expected.end())
      throw ModelError(weights + ": tensor " + key + " is not a LoRA tensor of the adapter's target_modules in this model" +
                       (key.find(".default.") != std::string::npos ? " (PEFT saves keys without the adapter name)" : ""));
    if (entry.shape != it->second->shape)
      throw ModelError(weights + ": tensor " + key + " has shape " + shape_str(entry.shape) + ", the base model needs " +
                       shape_str(it->second->shape) + " (r = " + std::to_string(cfg_.r) + ")");
  }
  for (const auto& [key, spec] : expected)
    if (!file_->has(key)) throw ModelError(weights + ": tensor " + key + " is missing");
}

PeftAdapter::~PeftAdapter() = default;

namespace {
at::Tensor read_f32(const SafetensorsFile& f, const TensorSpec& s) {
  at::Tensor t = at::empty(s.shape, at::TensorOptions().dtype(at::kFloat));
  f.read_into(kPeftKeyPrefix + s.name, 0, t.numel(), t.data_ptr(), DType::F32);
  return t;
}
}  // namespace

at::Tensor PeftAdapter::read_a(const LoraTarget& t) const { return read_f32(*file_, t.a); }
at::Tensor PeftAdapter::read_b(const LoraTarget& t) const { return read_f32(*file_, t.b); }

at::Tensor PeftAdapter::delta(const LoraTarget& t, int64_t row0, int64_t rows) const {
  at::Tensor b = read_b(t);
  if (rows < 0) rows = b.size(0) - row0;
  return at::matmul(b.narrow(0, row0, rows), read_a(t)).mul_(static_cast<float>(cfg_.scale()));
}

}  // namespace tessera::model
