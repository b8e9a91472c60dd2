// `--adapter DIR` for `tessera generate` and `tessera eval`: a PEFT LoRA adapter (model/peft_adapter.h,
// validated against the base model) applied to the base weights as they are read, so every adapted
// weight arrives as W + (lora_alpha / r) B A, computed in fp32, and everything else as the base
// stores it. For inference this is exactly the adapted model (what PEFT's merge_and_unload and
// `tessera lora merge` compute), with no merged copy on disk and no more memory than the base: the
// loader asks for one slice of one tensor at a time, and the delta is made for that slice's rows.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/lora.h"
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

// `tessera train --adapter`: the adapters' starting values from a PEFT adapter (for AdapterInitSource),
// its A and B by the module tree's names; Error(Input) for a name the adapter does not have.
std::function<at::Tensor(const std::string& name, const std::vector<int64_t>& shape)> peft_start(
    std::shared_ptr<const model::PeftAdapter> adapter, const std::string& adapter_dir);

// The lora.* --set entries that make a run's LoRA the adapter's (r, lora_alpha, lora_dropout,
// target_modules: "all-linear" is every projection, "self_attn.q_proj" is q_proj), from
// ADAPTER_DIR/adapter_config.json (read_adapter_config, read once); and the check, once the configuration is read, that lora.* still
// says so (Error(Input) naming the key and both values when a --set or the file changed one).
model::PeftConfig read_adapter_config(const std::string& adapter_dir);  // Error(Input) "--adapter: ..."
std::vector<std::string> adapter_lora_sets(const model::PeftConfig& adapter);
void check_adapter_lora(const std::string& adapter_dir, const model::PeftConfig& adapter, const lora::Options& run);

// The adapter at `adapter_dir` for the base model in `model_dir` (Error(Input) naming what does not
// match), and a line for people saying what it adapts.
std::shared_ptr<const model::PeftAdapter> open_adapter(const std::string& adapter_dir, const model::ModelConfig& base,
                                                       const std::string& model_dir);
std::string describe_adapter(const model::PeftAdapter& a, const std::string& adapter_dir);

}  // namespace tessera::launcher
