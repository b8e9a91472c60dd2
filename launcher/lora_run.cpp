#include "launcher/lora_run.h"

#include <cstdio>

#include "model/registry.h"
#include "model/safetensors.h"
#include "runtime/checkpoint/checkpoint.h"
#include "util/error.h"

namespace tessera::launcher {

namespace {
uint64_t fnv1a(const std::string& text, uint64_t h = 1469598103934665603ULL) {
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ULL;
  return h;
}
}  // namespace

nlohmann::json base_identity(const Config& cfg, const model::ModelConfig& mc, const model::ModelDir* dir) {
  std::string index = mc.to_json().dump();
  for (const model::TensorSpec& t : model::hf_tensor_specs(mc)) {
    index += "\n" + t.name;
    for (int64_t d : t.shape) index += " " + std::to_string(d);
    if (dir) index += std::string(" ") + model::dtype_name(dir->info(t.name).dtype);
  }
  if (!dir) index += "\nseed " + std::to_string(cfg.model.seed);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a(index)));
  return {{"path", dir ? cfg.model.path : "preset:" + cfg.model.preset}, {"hash", hex}};
}

nlohmann::json lora_state(const Config& cfg, const nlohmann::json& base) {
  const lora::Options& o = cfg.lora;
  return {{"rank", o.rank},          {"alpha", o.alpha},           {"dropout", o.dropout},
          {"targets", o.targets},    {"base_dtype", o.base_dtype}, {"double_quant", o.double_quant},
          {"base", base}};
}

void check_lora_resume(const std::string& ckpt, const nlohmann::json& current) {
  const checkpoint::Reader r(ckpt);
  const nlohmann::json saved = r.state().value("lora", nlohmann::json());
  const std::string where = "cannot resume " + ckpt + ": ";
  if (saved.is_null() && current.is_null()) return;
  TESSERA_CHECK_INPUT(!saved.is_null(), where + "it is a full fine-tuning checkpoint (no LoRA) and lora.rank is " +
                                            std::to_string(current.value("rank", 0)) + ": resume it with lora.rank 0");
  TESSERA_CHECK_INPUT(!current.is_null(), where + "it is a LoRA checkpoint (lora.rank " + saved.value("rank", nlohmann::json()).dump() +
                                              ", adapters only) and lora.rank is 0: resume it with its lora.* settings");
  const nlohmann::json& a = saved.value("base", nlohmann::json::object());
  const nlohmann::json& b = current.at("base");
  TESSERA_CHECK_INPUT(a.value("hash", "") == b.value("hash", ""),
                      where + "its adapters were trained on base model " + a.value("path", "?") + " (hash " +
                          a.value("hash", "?") + "), not on " + b.value("path", "?") + " (hash " + b.value("hash", "?") + ")");
  for (const char* key : {"rank", "targets"})
    TESSERA_CHECK_INPUT(saved.value(key, nlohmann::json()) == current.at(key),
                        where + "it was saved with lora." + key + " " + saved.value(key, nlohmann::json()).dump() +
                            ", this run has " + current.at(key).dump());
}

}  // namespace tessera::launcher
