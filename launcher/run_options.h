// The FSDP section of the run configuration resolved into the engine's options (activation
// checkpointing's auto, the alignment the optimizer state needs), in one place for `train`, `eval`
// and `plan`. The loop's, the optimizer's and the checkpoint's settings need no conversion: Config
// is a train::Settings.
#pragma once
#include "launcher/config.h"
#include "model/config.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/train/trainer.h"

namespace tessera::launcher {

fsdp::Options fsdp_options_from(const Config& cfg, const model::ModelConfig& mc);

}  // namespace tessera::launcher
