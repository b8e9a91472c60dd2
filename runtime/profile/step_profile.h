// Where a training step's time goes, and a Chrome trace of chosen steps.
//
// The step-time breakdown: the step's wall-clock time (from the trainer's start of the step to its
// record) is split into exclusive parts of the thread that drives the step -- data, forward,
// backward, recompute (activation checkpointing's forward inside backward), gather_wait (compute
// blocked on an all-gather), reduce_wait (blocked on reduce-scatters / replica all-reduces: the
// in-flight bound during backward and the drain at its end), optimizer (norm, clipping, AdamW and
// their collectives), sync_wait (the step's small agreements between ranks -- target count, gradient
// norm, loss, skip vote -- which wait for the slowest rank: skew between ranks shows here) -- and
// idle (the rest: time in no part). A part opened inside another takes
// its time from the enclosing one until it closes, so the parts and idle add up to the step.
// Communication is measured on the communicators' side, from the flight recorder
// (runtime/comm/flight_recorder.h): comm_s is the time during the step in which at least one
// operation of any communicator was executing (the union of their start..end intervals), exposed_s
// the part of it the compute waited for (gather_wait + reduce_wait), and overlap = 1 - exposed_s /
// comm_s the fraction that ran behind compute.
//
// The trace: between start_trace() and write_trace() every part of the step thread(s) and every
// communication operation that ended in a traced step is kept, and write_trace writes them as a
// Chrome trace (the JSON of chrome://tracing and ui.perfetto.dev): one process per rank, one track
// per thread -- "compute" (the step's thread; on a GPU also autograd's device thread) and one per
// communicator ("comm <group> (<backend>)": the MPI backend runs each on its own thread).
//
// THREADS. Scope may be opened by the thread that drives the step and by a thread it waits for
// (on a GPU, autograd's device thread runs the engine's backward while the step thread is blocked in
// backward()): the accounting is one stack under a mutex, not per thread, so time is never counted
// twice. begin_step / end_step / start_trace / write_trace: the step's thread only. Nothing here
// is called from the communication threads; their side is read from the flight recorder.
// The overhead is a mutex and a clock read per scope (a few dozen per layer and step) and one
// flight-recorder snapshot per step.
#pragma once
#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace tessera::profile {

enum class Part : int { Data, Forward, Backward, Recompute, GatherWait, ReduceWait, Optimizer, SyncWait };
constexpr int kParts = 8;
const char* part_name(Part p);  // "data", "forward", "backward", "recompute", "gather_wait", ...

// Time goes to `p` while the scope is open (exclusive of scopes opened inside it).
class Scope {
 public:
  explicit Scope(Part p);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  size_t depth_;
};

struct Breakdown {
  int64_t step = 0;
  double step_s = 0;
  std::array<double, kParts> part_s{};
  double idle_s = 0;      // step_s minus the parts (>= 0)
  double comm_s = 0;      // union of the communicators' busy intervals within the step
  double exposed_s = 0;   // gather_wait + reduce_wait
  double overlap = 0;     // 1 - exposed_s / comm_s, clamped to [0, 1] (0 without communication)
  double part(Part p) const { return part_s[static_cast<int>(p)]; }
  double compute_s() const;  // forward + backward + recompute
  // {"step_s", "data_s", "forward_s", ..., "idle_s", "comm_s", "exposed_comm_s", "overlap"}
  nlohmann::json to_json() const;
  // "compute 81% (forward 27, backward 50, recompute 4) | gather wait 3% | reduce wait 5% |
  //  optimizer 9% | sync wait 1% | data 0% | idle 1% | comm 0.410 s/step, 88% overlapped"
  std::string summary() const;
};
// Element-wise median of several steps' breakdowns (the end-of-run summary, bench step).
Breakdown median(const std::vector<Breakdown>& steps);

// The step's thread: a step begins (accumulators reset) and ends (its breakdown).
void begin_step(int64_t step);
Breakdown end_step();

// Tracing (see above): from start_trace() on, steps are recorded; write_trace(path, rank) writes
// what was recorded since start_trace() and stops recording. Returns the number of events written.
void start_trace();
bool tracing();
int64_t write_trace(const std::string& path, int rank);

}  // namespace tessera::profile
