#include "launcher/adapter_source.h"

#include <cstring>

#include "model/errors.h"
#include "runtime/error.h"

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
