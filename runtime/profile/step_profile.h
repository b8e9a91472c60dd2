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
// GPU TIMING. On a GPU the host runs ahead of the device: an NCCL wait() only orders the compute
// stream after the collective, so gather_wait / reduce_wait take ~0 host time, and the step's one
// host synchronisation (sync_wait, reading back the loss) absorbs the forward and backward. A
// DeviceClock (set_device_clock(device::clock_for(the run's device)): CUDA events on a CUDA device,
// none on a CPU) times the same parts on the device: every Scope open / close and begin_step /
// end_step also enqueues a stamp on the calling thread's current stream and remembers which part
// the interval since the previous stamp belongs to (the innermost open one, as above; under the
// same lock, so the stamps follow the accounting's order). That interval is the device time of the
// work enqueued while the part was innermost, and of what the stream waited for in it: a wait
// scope's interval is the time the compute stream was blocked on the collective's event -- the
// exposed communication. end_step waits for the step's last stamp (so the device finishes the step,
// optimizer included, before end_step returns: one more host wait per step); step_s, part_s and
// idle_s are then device time from the step's first stamp to its last, parts and idle adding up to
// it. `clock` says which clock timed them ("cuda"; "host" without a device clock, or for a step one
// of whose stamps failed), and host_step_s / host_part_s / host_idle_s always hold the host
// clock's. Stamps of threads on different streams are compared on the device's one timeline; an
// interval that comes out negative (reached out of order) counts 0. Communication stays on the
// flight recorder's host clock (above): the MPI backend stamps start / end on its communication
// thread, when the operation runs; the NCCL backend never observes a start on the host (its records
// go scheduled -> completed, with no start time) and its end is when its watchdog (10 ms poll) or
// is_completed saw the completion event, only once wait() armed it. So with NCCL no record enters
// comm_s (0, and overlap 0) or the trace until the backend records device times for its
// collectives. The Chrome trace's parts stay on the host clock.
//
// THREADS. Scope may be opened by the thread that drives the step and by a thread it waits for
// (on a GPU, autograd's device thread runs the engine's backward while the step thread is blocked in
// backward()): the accounting is one stack under a mutex, not per thread, so time is never counted
// twice. begin_step / end_step / start_trace / write_trace: the step's thread only. Nothing here
// is called from the communication threads; their side is read from the flight recorder.
// The overhead is a mutex and a clock read per scope (a few dozen per layer and step) and one
// flight-recorder snapshot per step; with a device clock also an event record per scope (pooled:
// no event is created after the first steps) and, at end_step, one elapsed-time read per stamp.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace c10 {
struct Device;
}

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
  int prev_thread_part_;  // thread_part() before this scope
};

struct Breakdown {
  int64_t step = 0;
  // step_s, part_s, idle_s: on the device clock when clock != "host" (see GPU TIMING above).
  double step_s = 0;
  std::array<double, kParts> part_s{};
  double idle_s = 0;      // step_s minus the parts (>= 0)
  std::string clock = "host";  // what timed them: "host", or the device clock's name ("cuda")
  double host_step_s = 0;      // the host clock's figures, always (equal to the above when clock == "host")
  std::array<double, kParts> host_part_s{};
  double host_idle_s = 0;
  double comm_s = 0;      // union of the communicators' busy intervals within the step
  double exposed_s = 0;   // gather_wait + reduce_wait
  double overlap = 0;     // 1 - exposed_s / comm_s, clamped to [0, 1] (0 without communication)
  double part(Part p) const { return part_s[static_cast<int>(p)]; }
  double compute_s() const;  // forward + backward + recompute
  bool device_timed() const { return clock != "host"; }
  // {"step_s", "data_s", "forward_s", ..., "idle_s", "comm_s", "exposed_comm_s", "overlap", "clock"},
  // and when device-timed "host": {"step", "data", "forward", ..., "idle"} (the host clock's seconds;
  // no "_s" suffix there, so readers that sum a level's "_s" keys see only the step's parts).
  nlohmann::json to_json() const;
  // "compute 81% (forward 27, backward 50, recompute 4) | gather wait 3% | reduce wait 5% |
  //  optimizer 9% | sync wait 1% | data 0% | idle 1% | comm 0.410 s/step, 88% overlapped";
  // device-timed: "... | idle 1% | cuda clock | comm ...".
  std::string summary() const;
};
// Element-wise median of several steps' breakdowns (the end-of-run summary, bench step); clock:
// the steps' clock if they agree, else "mixed".
Breakdown median(const std::vector<Breakdown>& steps);

// A clock on the device's timeline (GPU TIMING above). stamp and reset are called under the
// profile's lock, by any thread that opens or closes a scope; wait and elapsed_ns by the step's
// thread in end_step, after the step's last stamp (no stamp comes until the next begin_step).
class DeviceClock {
 public:
  virtual ~DeviceClock() = default;
  virtual std::string name() const = 0;  // the Breakdown's clock: "cuda", ...
  // Enqueues a timestamp on the calling thread's current stream; returns its id (0, 1, ... since
  // reset()), or -1 when it cannot (the step is then reported on the host clock).
  virtual int stamp() = 0;
  // Blocks until stamps 0..last have been reached; false when they cannot be read.
  virtual bool wait(int last) = 0;
  // Device time from stamp `from` to stamp `to` (after wait; negative if `to` was reached first);
  // nullopt when it cannot be read.
  virtual std::optional<int64_t> elapsed_ns(int from, int to) = 0;
  // Forgets the stamps: ids start at 0 again, resources are reused (begin_step).
  virtual void reset() = 0;
};
// Installs `clock` (null: host clocks only, as without one); it times the steps that begin after.
void set_device_clock(std::shared_ptr<DeviceClock> clock);
std::shared_ptr<DeviceClock> device_clock();

// A device clock on a scripted timeline, for tests: device time starts at 0 and moves only by
// advance(); a stamp reads it. Stamps beyond `capacity` per step fail (-1).
class ScriptedDeviceClock : public DeviceClock {
 public:
  explicit ScriptedDeviceClock(int capacity = 1 << 20) : capacity_(capacity) {}
  void advance(int64_t ns) { now_ns_ += ns; }
  int stamps() const { return static_cast<int>(stamps_.size()); }  // since reset
  int last_waited() const { return last_waited_; }                  // -1: none since reset
  std::string name() const override { return "scripted"; }
  int stamp() override;
  bool wait(int last) override;
  std::optional<int64_t> elapsed_ns(int from, int to) override;
  void reset() override;

 private:
  int capacity_;
  std::atomic<int64_t> now_ns_{0};
  std::vector<int64_t> stamps_;
  int last_waited_ = -1;
};

// The step's thread: a step begins (accumulators reset) and ends (its breakdown).
void begin_step(int64_t step);
Breakdown end_step();

// Tracing (see above): from start_trace() on, steps are recorded; write_trace(path, rank) writes
// what was recorded since start_trace() and stops recording. Returns the number of events written.
void start_trace();
bool tracing();
int64_t write_trace(const std::string& path, int rank);

// The part the calling thread is in: its innermost open Scope's Part as an int, -1 when it has
// none open now, kNoScopeEver when it never opened one (a communicator's thread). For
// op_count.h's attribution; one thread-local read.
inline constexpr int kNoScopeEver = -2;
int thread_part();

}  // namespace tessera::profile
