#include "launcher/adapter_source.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "launcher/config.h"
#include "model/errors.h"
#include "util/error.h"

namespace tessera::launcher {

AdapterWeightSource::AdapterWeightSource(std::unique_ptr<fsdp::WeightSource> base,
                                         std::shared_ptr<const model::PeftAdapter> adapter)
    : base_(std::move(base)), adapter_(std::move(adapter)) {
  for (const model::LoraTarget& t : adapter_->targets()) by_weight_[t.base_weight] = &t;
}

void AdapterWeightSource::read(const std::string& name, const std::vector<int64_t>& shape, int64_t offset,
                               int64_t count, float* dst) {
  base_->read(name, shape, offset, count, dst);
  const auto it = by_weight_.find(name);
  if (it == by_weight_.end() || count == 0) return;
  // Elements [offset, offset + count) of the row-major [out, in] weight lie in rows row0 .. last.
  const int64_t in = shape.at(1), row0 = offset / in, last = (offset + count - 1) / in;
  const at::Tensor delta = adapter_->delta(*it->second, row0, last - row0 + 1).reshape({-1});
  const float* d = delta.data_ptr<float>() + (offset - row0 * in);
  for (int64_t i = 0; i < count; ++i) dst[i] += d[i];
}

at::Tensor AdapterWeightSource::view(const std::string& name, int64_t offset, int64_t count) {
  return by_weight_.count(name) ? at::Tensor() : base_->view(name, offset, count);
}

std::function<at::Tensor(const std::string&, const std::vector<int64_t>&)> peft_start(
    std::shared_ptr<const model::PeftAdapter> adapter, const std::string& adapter_dir) {
  return [adapter, adapter_dir](const std::string& name, const std::vector<int64_t>&) {
    for (const model::LoraTarget& t : adapter->targets()) {
      if (t.a.name == name) return adapter->read_a(t);
      if (t.b.name == name) return adapter->read_b(t);
    }
    throw TESSERA_INPUT_ERROR("--adapter " + adapter_dir + " has no tensor " + name);
  };
}

model::PeftConfig read_adapter_config(const std::string& adapter_dir) {
  const std::string path = adapter_dir + "/adapter_config.json";
  try {
    return model::PeftConfig::from_json(read_json_file(path), path);
  } catch (const model::ModelError& e) {
    throw TESSERA_INPUT_ERROR(std::string("--adapter: ") + e.what());
  }
}

namespace {

// target_modules as lora.targets names.
std::vector<std::string> lora_targets_of(const model::PeftConfig& c) {
  if (c.target_modules.size() == 1 && c.target_modules[0] == "all-linear") return lora::default_targets();
  std::vector<std::string> out;
  for (const std::string& t : c.target_modules) out.push_back(t.substr(t.rfind('.') + 1));
  return out;
}

}  // namespace

std::vector<std::string> adapter_lora_sets(const model::PeftConfig& c) {
  std::string targets;
  for (const std::string& t : lora_targets_of(c)) targets += (targets.empty() ? "" : ",") + t;
  return {"lora.rank=" + std::to_string(c.r), "lora.alpha=" + nlohmann::json(c.lora_alpha).dump(),
          "lora.dropout=" + nlohmann::json(c.lora_dropout).dump(), "lora.targets=" + targets};
}

void check_adapter_lora(const std::string& adapter_dir, const model::PeftConfig& c, const lora::Options& run) {
  std::vector<std::string> want = lora_targets_of(c), have = run.targets;
  std::sort(want.begin(), want.end());
  std::sort(have.begin(), have.end());
  const std::string at = "--adapter " + adapter_dir + ": ";
  TESSERA_CHECK_INPUT(run.rank == c.r, at + "its r is " + std::to_string(c.r) + ", lora.rank " + std::to_string(run.rank));
  TESSERA_CHECK_INPUT(run.alpha == c.lora_alpha, at + "its lora_alpha is " + nlohmann::json(c.lora_alpha).dump() +
                                                     ", lora.alpha " + nlohmann::json(run.alpha).dump());
  TESSERA_CHECK_INPUT(want == have, at + "its target_modules are " + nlohmann::json(want).dump() + ", lora.targets " +
                                        nlohmann::json(have).dump());
}

std::shared_ptr<const model::PeftAdapter> open_adapter(const std::string& adapter_dir, const model::ModelConfig& base,
                                                       const std::string& model_dir) {
  try {
    return std::make_shared<const model::PeftAdapter>(adapter_dir, base, model_dir);
  } catch (const model::ModelError& e) {
    throw TESSERA_INPUT_ERROR(std::string("--adapter: ") + e.what());
  }
}

std::string describe_adapter(const model::PeftAdapter& a, const std::string& adapter_dir) {
  const model::PeftConfig& c = a.config();
  char scale[32];
  std::snprintf(scale, sizeof(scale), "%g", c.scale());
  return "adapter " + adapter_dir + ": LoRA r " + std::to_string(c.r) + ", scale " + scale + " (lora_alpha / r), " +
         std::to_string(a.targets().size()) + " weights adapted (W + scale B A, applied as the base is read)";
}

}  // namespace tessera::launcher
