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
// LoRA's part of it (train, eval, generate, plan): the frozen base stored in lora.base_dtype (empty:
// the compute dtype; nf4: the decoder's projections in NF4, the rest in the compute dtype) and the
// random number state kept for the recompute when dropout is on.
void apply_lora_storage(const lora::Options& lora, fsdp::Options& o);
// comm.timeout_s -> the default timeout of every Work::wait() (train, generate).
void apply_comm_timeout(const Config& cfg);
struct Bootstrap;
// One id for this run on every rank (rank 0's clock and pid) for its flight records. Collective.
std::string agree_run_id(const Bootstrap& b);

}  // namespace tessera::launcher
