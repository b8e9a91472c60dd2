// The run configuration (launcher/config.h) turned into the option structs of the runtime, in one
// place for `train`, `eval` and `plan`.
#pragma once
#include "launcher/config.h"
#include "model/config.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/train/trainer.h"

namespace tessera::launcher {

fsdp::Options fsdp_options_from(const Config& cfg, const model::ModelConfig& mc);
train::TrainOptions train_options_from(const Config& cfg);

}  // namespace tessera::launcher
