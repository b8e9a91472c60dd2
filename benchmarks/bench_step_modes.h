// `tessera bench step --modes LIST` (in process, under mpirun): the step time of each memory mode of
// issue 36 as a ratio to the default step, measured in the same run.
//
// A mode is `default` or names joined by '+', each a change against the default:
//   in_backward        optim.in_backward = true (optim::Options::in_backward), with
//                      train.clip = 0, which it needs (the default keeps clipping at 1.0);
//   int8 | bf16        optim.state_dtype (optim::Options::state_dtype); int8 also aligns
//                      the shards to whole 2048-element blocks, as the launcher does;
//   offload_optimizer | offload_params   fsdp.offload (fsdp::Options::offload).
// One train::Trainer per mode (the same model, initial weights and dataset) is built and warmed up
// first; then each round runs every mode for --steps steps, in an order shuffled per round (the
// same on every rank). Tokens/s per mode is the median over rounds; the default is always measured
// (added first when the list lacks it). A mode's ratio is its step time / the default's, within each
// round (measured seconds apart, under the same load), and its median over rounds.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "runtime/data/dataset.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/train/trainer.h"

namespace tessera::bench {

struct StepMode {
  std::string name;  // canonical: "default", or its parts in the order of mode_parts(), joined by '+'
  bool in_backward = false;
  optim::StateDtype state_dtype = optim::StateDtype::F32;
  fsdp::Offload offload = fsdp::Offload::None;
  // The configuration keys this mode stands for ("" for the default).
  std::string keys() const;
  // The default's options changed as this mode says.
  void apply(fsdp::Options& f, train::Settings& t) const;
};

// The names a mode is made of ("default", "in_backward", "int8", ...).
const std::vector<std::string>& mode_parts();

// The --modes list, validated: unknown names, a part twice, two moment dtypes or two offloads in one
// mode, a mode listed twice (in any spelling) are one-line input errors naming --modes. The default
// comes first.
std::vector<StepMode> parse_step_modes(const std::string& list);

// What the in-process bench step prepared (the default's options), for the modes.
struct StepModesRun {
  model::ModelConfig cfg;
  std::string model, strategy, dtype;
  fsdp::Options fopts;
  train::Settings topts;
  std::shared_ptr<data::TokenDataset> dataset;
  int warmup = 1, steps = 4, rounds = 3;
  int64_t seq_len = 0, micro_batch = 0;
  bool json = false;
};

// Times the modes in interleaved rounds and prints (rank 0) the table or one JSON object.
int run_step_modes(const StepModesRun& run, const std::vector<StepMode>& modes);

}  // namespace tessera::bench
