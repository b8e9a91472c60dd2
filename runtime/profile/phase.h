// The one observation scope: what the process is doing, told once to the observers that
// want to know it.
//   - The profiler (step_profile.h) times a Part of the step, exclusive of the phases opened inside.
//   - The memory tracker (memory/tracker.h) labels a peak reached while a phase is open with its
//     name: the step's Forward, Backward and Optimizer parts by their name, finer moments by the
//     label they give ("head and loss", "layer reduction"); the wait parts (Data, GatherWait,
//     ReduceWait, SyncWait, Recompute) keep the label of the phase they are in.
//   - A kernel trace (kernel_trace.h), while one runs, holds a span named after each phase.
//   - The flight recorder (comm/flight_recorder.h) stamps every collective enqueued during an
//     activity ("train step", "checkpoint save", ...) with the activity's step and name, and a
//     fatal signal's message names them.
// Phases nest. Each restores on close what it overrode, on every path (RAII), so an activity ends
// when its scope does, not when the next one begins.
//
//   profile::Phase step = profile::Phase::activity(n, "train step");
//   { profile::Phase forward(profile::Part::Forward); ... }
//   { profile::Phase head = profile::Phase::label("head and loss"); ... }
//
// THREADS. A Part phase follows Scope's rule (step_profile.h): the thread that drives the step and
// the threads it waits for (autograd's device thread runs the engine's backward on a GPU). An
// activity is the process's: any thread's collectives and fatal-signal messages carry it. A
// background thread names its own work with `activity_of_thread` (the asynchronous checkpoint
// writer), which overrides the process's activity for that thread alone. The memory label is the
// process's (one atomic pointer). Nothing here is called from the communication threads.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>

#include "runtime/profile/kernel_trace.h"
#include "runtime/profile/step_profile.h"

namespace tessera::comm::flight {
class ThreadContext;
}

namespace tessera::profile {

class Phase {
 public:
  // A timed part of the step; `label` names memory peaks (default: the part's own for Forward,
  // Backward and Optimizer, none for the wait parts). `label` must be a string literal.
  explicit Phase(Part part, const char* label = nullptr);
  // What the process is doing: step `step` (as logged; -1 when none) of `name` (a string literal).
  static Phase activity(int64_t step, const char* name) { return Phase(Kind::Process, step, name); }
  // The same for the calling thread only, over the process's activity (a background writer).
  static Phase activity_of_thread(int64_t step, const char* name) { return Phase(Kind::Thread, step, name); }
  // A name for memory peaks only, within the current part.
  static Phase label(const char* name) { return Phase(Kind::Label, -1, name); }
  ~Phase();
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  enum class Kind { Label, Process, Thread };
  Phase(Kind kind, int64_t step, const char* name);
  void set_label(const char* name);
  std::optional<Scope> part_;
  const char* prev_label_ = nullptr;  // the memory label this phase replaced (restored on close)
  bool labelled_ = false;
  bool process_activity_ = false;     // restores the process's activity below on close
  int64_t prev_step_ = -1;
  const char* prev_activity_ = nullptr;
  std::unique_ptr<comm::flight::ThreadContext> thread_;  // the thread's own activity
  std::unique_ptr<KernelAnnotation> annotation_;          // its span in a kernel trace (kernel_trace.h)
};

}  // namespace tessera::profile
