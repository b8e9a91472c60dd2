// Where `tessera train` resumes from, and with which batch settings (used by cmd_train.cpp):
//  - a damaged newest checkpoint is skipped for the previous intact one, with one line on stderr
//    (rank 0) naming the checkpoint, the file (and tensor) and why; nothing on disk is changed;
//  - a checkpoint at the end of the run (train.steps) is verified before the run decides it has
//    nothing to train: a damaged one is skipped the same way, and the run trains its last steps again;
//  - a checkpoint saved at another world size keeps its global batch (micro_batch x grad_accum x
//    world size): train.grad_accum is raised or lowered to match, or the resume is refused in one
//    line when no whole grad_accum does.
#pragma once
#include <string>
#include <vector>

#include "launcher/config.h"

namespace tessera::comm {
class Communicator;
}  // namespace tessera::comm

namespace tessera::train {
class Trainer;
}  // namespace tessera::train

namespace tessera::launcher {

// The checkpoints of `root` a resuming run tries, best first (checkpoint::resume_candidates), less
// those whose manifest or file sizes already fail (checkpoint::Reader); for each one left out, when
// `print`, one line on stderr says which and why. Empty: nothing intact to resume from.
std::vector<std::string> intact_resume_candidates(const std::string& root, bool print);

// `candidates` less the damaged ones at its front that are at or past `steps` (the end of the run):
// each such checkpoint's files are checked against their CRC32C, file f by the rank f % world size
// of `world`, and the ranks agree. A damaged one is dropped, said in one line by rank 0 (`print`)
// as resume_first_intact() says it; when it is the last candidate, its error is thrown (exit 2).
// Without this, a run whose final checkpoint was damaged after the save would be refused as
// finished instead of training its last steps again. Collective over `world`.
std::vector<std::string> drop_damaged_ends(std::vector<std::string> candidates, int64_t steps,
                                           comm::Communicator& world, bool print);

// The global batch (sequences per optimizer step) the checkpoint `ckpt` was trained with, and the
// world size that saved it.
struct SavedBatch {
  int64_t global_batch = 0;
  int world_size = 0;
};
SavedBatch saved_batch(const std::string& ckpt);

// Resuming `ckpt` on `world_size` ranks: when the world size differs from the one that saved it and
// world_size x train.micro_batch x train.grad_accum is not its global batch G, train.grad_accum
// becomes G / (world_size x micro_batch) in `cfg` and `topts` (the manifest of the next save records
// it), said in one line when `print`. Error(Input) in one line when that is not a whole number.
void keep_global_batch(const std::string& ckpt, int world_size, Config& cfg, bool print);

// trainer.resume() from the first of `candidates` that is not damaged: on
// checkpoint::DamagedCheckpoint (thrown on every rank together) the next one is tried, and rank 0
// (`print`) says on stderr which was skipped and why. Returns the checkpoint resumed from; when the
// last candidate is damaged too, its error is thrown (the run's one error line). Collective.
std::string resume_first_intact(train::Trainer& trainer, const std::vector<std::string>& candidates, bool print);

}  // namespace tessera::launcher
