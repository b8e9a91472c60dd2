// Choosing the checkpoint `tessera train` resumes from (launcher/resume.h).
#include "launcher/resume.h"

#include <algorithm>
#include <iostream>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/comm/agree.h"
#include "runtime/comm/communicator.h"
#include "runtime/train/trainer.h"
#include "util/error.h"

namespace tessera::launcher {

namespace {

// One line on stderr: the checkpoint skipped, why, and what comes next.
void say_skipped(const std::string& ckpt, const std::string& why, const std::string& next) {
  std::cerr << "tessera: checkpoint " << ckpt << " is damaged and skipped: " << why << "; "
            << (next.empty() ? std::string("no earlier intact checkpoint") : "resuming from " + next + " instead")
            << std::endl;
}

}  // namespace

std::vector<std::string> intact_resume_candidates(const std::string& root, bool print) {
  const std::vector<std::string> all = checkpoint::resume_candidates(root);
  std::vector<std::string> out;
  std::vector<std::pair<std::string, std::string>> skipped;  // (checkpoint, why), said once the next is known
  for (const std::string& c : all) {
    try {
      checkpoint::Reader r(c);
      out.push_back(c);
    } catch (const std::exception& e) {
      skipped.emplace_back(c, e.what());
    }
  }
  if (print)
    for (const auto& [c, why] : skipped) {
      std::string next;  // the first intact candidate after c
      for (size_t i = 0, seen = 0; i < all.size() && next.empty(); ++i) {
        if (all[i] == c) seen = 1;
        else if (seen && std::find(out.begin(), out.end(), all[i]) != out.end()) next = all[i];
      }
      say_skipped(c, why, next);
    }
  return out;
}

std::vector<std::string> drop_damaged_ends(std::vector<std::string> candidates, int64_t steps,
                                           comm::Communicator& world, bool print) {
  while (!candidates.empty()) {
    bool at_end = false;
    const std::string wire = capture_error([&] {
      const checkpoint::Reader r(candidates.front());
      at_end = r.step() >= steps;
      if (!at_end) return;
      const int files = static_cast<int>(r.files().size());
      for (int f = world.rank(); f < files; f += world.size()) r.verify_file(f);
    });
    const auto agreed = agree_on_error(world, wire);
    if (!agreed) break;  // before the end, or intact at it (the caller decides: finished, or refused)
    if (candidates.size() == 1 || agreed->kind != ErrorKind::Input) throw CollectiveError(agreed->kind, agreed->message);
    if (print) say_skipped(candidates.front(), agreed->message, candidates[1]);
    candidates.erase(candidates.begin());
  }
  return candidates;
}

SavedBatch saved_batch(const std::string& ckpt) {
  const checkpoint::Reader r(ckpt);
  const nlohmann::json& m = r.manifest();
  const nlohmann::json& st = r.state();
  SavedBatch b;
  try {
    b.world_size = m.at("world_size").get<int>();
    if (st.contains("sampler") && st["sampler"].is_object() && st["sampler"].contains("global_batch")) {
      b.global_batch = st["sampler"]["global_batch"].get<int64_t>();
    } else {
      const nlohmann::json& t = st.at("config").at("train");
      b.global_batch = t.at("micro_batch").get<int64_t>() * t.at("grad_accum").get<int64_t>() * b.world_size;
    }
  } catch (const nlohmann::json::exception& e) {
    throw TESSERA_INPUT_ERROR("checkpoint " + ckpt + "/manifest.json: no world size or global batch (" + e.what() + ")");
  }
  TESSERA_CHECK_INPUT(b.world_size >= 1 && b.global_batch >= 1,
                      "checkpoint " + ckpt + "/manifest.json: world_size " + std::to_string(b.world_size) +
                          " and global batch " + std::to_string(b.global_batch) + " must be positive");
  return b;
}

void keep_global_batch(const std::string& ckpt, int world_size, Config& cfg, bool print) {
  const SavedBatch saved = saved_batch(ckpt);
  const int64_t mb = cfg.train.micro_batch, ga = cfg.train.grad_accum;
  if (saved.world_size == world_size || world_size * mb * ga == saved.global_batch) return;
  const int64_t per_accum = world_size * mb;  // sequences of one micro-step over all ranks
  if (saved.global_batch % per_accum != 0)
    throw TESSERA_INPUT_ERROR(
        "cannot resume " + ckpt + " on " + std::to_string(world_size) + " ranks: it was trained by " +
        std::to_string(saved.world_size) + " ranks with a global batch of " + std::to_string(saved.global_batch) +
        " sequences, which is not a multiple of " + std::to_string(world_size) + " ranks x train.micro_batch " +
        std::to_string(mb) + "; run on a world size that divides " + std::to_string(saved.global_batch / mb) +
        ", or set train.micro_batch so that ranks x micro_batch divides " + std::to_string(saved.global_batch));
  const int64_t new_ga = saved.global_batch / per_accum;
  if (print)
    std::cout << "tessera: resuming " << ckpt << " (saved by " << saved.world_size << " ranks) on " << world_size
              << " ranks: train.grad_accum " << ga << " -> " << new_ga << " keeps the global batch of "
              << saved.global_batch << " sequences (micro_batch " << mb << " x grad_accum " << new_ga << " x "
              << world_size << " ranks)" << std::endl;
  cfg.train.grad_accum = new_ga;
}

std::string resume_first_intact(train::Trainer& trainer, const std::vector<std::string>& candidates, bool print) {
  TESSERA_CHECK(!candidates.empty(), "no checkpoint to resume from");
  for (size_t i = 0;; ++i) {
    try {
      trainer.resume(candidates[i]);
      return candidates[i];
    } catch (const checkpoint::DamagedCheckpoint& e) {
      if (i + 1 == candidates.size()) throw;  // its own error is the run's last line
      if (print) say_skipped(candidates[i], e.what(), candidates[i + 1]);
    }
  }
}

}  // namespace tessera::launcher
