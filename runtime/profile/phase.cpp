// See phase.h. The observers keep their own state (the profiler's stack of parts, the
// tracker's label, the flight recorder's context); Phase is the only code that sets them.
#include "runtime/profile/phase.h"

#include "runtime/comm/flight_recorder.h"
#include "runtime/memory/tracker.h"

namespace tessera::profile {

namespace {
// The memory label of a part: the step's own parts name their peaks, the waits inherit.
const char* default_label(Part part) {
  switch (part) {
    case Part::Forward: return "forward";
    case Part::Backward: return "backward";
    case Part::Optimizer: return "optimizer";
    default: return nullptr;
  }
}
}  // namespace

Phase::Phase(Part part, const char* label) {
  if (kernel_tracing()) annotation_ = annotate(std::string("tessera/") + part_name(part));
  part_.emplace(part);
  set_label(label ? label : default_label(part));
}

Phase::Phase(Kind kind, int64_t step, const char* name) {
  if (kernel_tracing() && kind != Kind::Thread)
    annotation_ = annotate("tessera/" + std::string(name) + (step >= 0 ? " " + std::to_string(step) : ""));
  if (kind == Kind::Process) {
    const comm::flight::Activity prev = comm::flight::set_activity(step, name);
    prev_step_ = prev.step;
    prev_activity_ = prev.phase;
    process_activity_ = true;
  } else if (kind == Kind::Thread) {
    thread_ = std::make_unique<comm::flight::ThreadContext>(step, name);
  }
  if (kind != Kind::Thread) set_label(name);
}

void Phase::set_label(const char* name) {
  if (!name) return;
  prev_label_ = memory::set_phase(name);
  labelled_ = true;
}

Phase::~Phase() {
  if (labelled_) memory::set_phase(prev_label_);
  if (process_activity_) comm::flight::set_activity(prev_step_, prev_activity_);
  thread_.reset();
  part_.reset();
  annotation_.reset();
}

}  // namespace tessera::profile
