// Rank 0's account of a run (metrics.jsonl, TensorBoard, the lines for people through the trainer's
// Console); other ranks keep nothing. Private to runtime/train (trainer_impl.h's rooms).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/train/trainer.h"

namespace tessera::train {

class RunLog {
 public:
  virtual ~RunLog() = default;
  virtual void step(const StepRecord& r, bool trace_done) = 0;  // after each step
  virtual void summary(const std::vector<StepRecord>& records) const = 0;  // at the end of run()
};

// Opens log.dir/metrics.jsonl (appended to, never through a link) and the TensorBoard file on rank 0,
// and prints which peak MFU divides by. Throws Error(Input) when a file cannot be opened.
std::unique_ptr<RunLog> open_run_log(const Trainer::Impl& im, int64_t start_step);

}  // namespace tessera::train
