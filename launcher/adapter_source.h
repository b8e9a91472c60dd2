// `--adapter DIR` for `tessera generate` and `tessera eval`: a PEFT LoRA adapter (model/peft_adapter.h,
// validated against the base model) applied to the base weights as they are read, so every adapted
// weight arrives as W + (lora_alpha / r) B A, computed in fp32, and everything else as the base
// stores it. For inference this is exactly the adapted model (what PEFT's merge_and_unload and
// `tessera lora merge` compute), with no merged copy on disk and no more memory than the base: the
// loader asks for one slice of one tensor at a time, and the delta is made for that slice's rows.
#pragma once
#include <map>
#include <memory>
#include <string>

#include "model/peft_adapter.h"
#include "runtime/fsdp/fsdp.h"

namespace tessera::launcher {

class AdapterWeightSource : public fsdp::WeightSource {
 public:
  AdapterWeightSource(std::unique_ptr<fsdp::WeightSource> base, std::shared_ptr<const model::PeftAdapter> adapter);
  void read(const std::string& name, const std::vector<int64_t>& shape, int64_t offset, int64_t count,
            float* dst) override;
  // The base's view, except for adapted weights (undefined: their values exist only through read()).
  at::Tensor view(const std::string& name, int64_t offset, int64_t count) override;
  void release(const std::string& name, int64_t offset, int64_t count) override { base_->release(name, offset, count); }

 private:
  std::unique_ptr<fsdp::WeightSource> base_;
  std::shared_ptr<const model::PeftAdapter> adapter_;
  std::map<std::string, const model::LoraTarget*> by_weight_;
};

// The adapter at `adapter_dir` for the base model in `model_dir` (Error(Input) naming what does not
// match), and a line for people saying what it adapts.
std::shared_ptr<const model::PeftAdapter> open_adapter(const std::string& adapter_dir, const model::ModelConfig& base,
                                                       const std::string& model_dir);
std::string describe_adapter(const model::PeftAdapter& a, const std::string& adapter_dir);

}  // namespace tessera::launcher
