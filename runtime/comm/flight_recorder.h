// The collective flight recorder, part of the Communicator seam: every communicator of every
// backend records each operation it is asked for, so that after a timeout, an abort or a fatal
// signal every rank can say what it last did (as PyTorch's NCCL flight recorder does, but always on).
//
// What is kept: per communicator ("group"), the last kEntries operations in a ring, each with its
// sequence number in that group (1, 2, ...; the same operation has the same number on every member
// because collectives are issued in the same order everywhere), op, reduce op, dtype, element count,
// bytes, root, the activity (training step and phase, see set_activity) at enqueue, and enqueue /
// start / end times with a state: scheduled -> started -> completed (or failed).
//
// Who calls what (threads):
//   - the caller's thread (training loop, loader, checkpoint worker): Recorder::enqueue, when a
//     backend accepts an operation; set_activity (profile::Phase, per activity: step, save, load);
//   - the backend's communication thread (MPI) or watchdog (NCCL): Recorder::start / Recorder::end;
//   - any thread: dump (on a timeout or error before the process ends), snapshot (traces);
//   - a signal handler: the dump installed by install_signal_handlers.
// Every field is an atomic written with relaxed stores (a slot's sequence number is published last,
// with release order); the recorder never locks on the recording path and never allocates after a
// group is registered. A reader may see a slot being overwritten and skips it (seq changed).
//
// Dumps: dump() writes <dir>/rank-<world rank>.json (set_dump_dir; nothing without one) through a
// temporary file and rename. The writer is ASYNC-SIGNAL-SAFE: open/write/close/rename/
// clock_gettime only, formatting into a stack buffer, reading the fixed tables above (memory of a
// group is never freed, only reused), so the same code runs from a SIGSEGV/SIGBUS/SIGABRT/SIGTERM
// handler. The first "strong" dump of a process (timeout, error, fatal signal) wins; a SIGTERM dump
// is "weak": written only if nothing was dumped yet, and replaced by a later strong one. Limits of
// the signal path (best effort there): no alternate signal stack, so a SIGSEGV from a stack overflow
// dies without a record; a record read while another thread overwrites an entry skips that entry;
// a dump already in progress on another thread makes the handler skip its own.
// Format and analysis: tools/flight_report.h (`tessera diagnose`).
//
// Timestamps are CLOCK_MONOTONIC nanoseconds (now_ns()); a dump also records CLOCK_REALTIME at the
// same instant so records of several ranks can be put on one time line. Traces and step-time
// breakdowns can read the same records through snapshot().
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"

namespace tessera::comm::flight {

constexpr int kEntries = 1024;  // operations kept per group (a power of two)

enum class Op : uint8_t { Other, AllGather, ReduceScatter, AllReduce, Broadcast, Scatter, ScatterPieces, Barrier };
enum class State : uint8_t { Empty, Scheduled, Started, Completed, Failed };

const char* op_name(Op op);  // "all_gather", "reduce_scatter", ...
const char* state_name(State s);

// What one operation is, as the caller asked for it.
struct OpInfo {
  Op op = Op::Other;
  int reduce = -1;  // ReduceOp as int for reductions, -1 otherwise
  at::ScalarType dtype = at::kByte;
  int64_t count = 0;  // elements of the operation's main buffer (see tools/flight_report.h)
  int64_t bytes = 0;
  int root = -1;
};

// The OpInfo of an operation on `t` (count and bytes of t; reduce: a ReduceOp or -1).
inline OpInfo op_info(Op op, const at::Tensor& t, int reduce = -1, int root = -1) {
  OpInfo i;
  i.op = op;
  i.reduce = reduce;
  i.root = root;
  if (t.defined()) {
    i.dtype = t.scalar_type();
    i.count = t.numel();
    i.bytes = static_cast<int64_t>(t.nbytes());
  }
  return i;
}

// Monotonic clock of every record, nanoseconds.
int64_t now_ns();
// How often this process did not run for more than 2 s (stopped by SIGSTOP, or frozen), as seen by
// the heartbeat thread that install_signal_handlers starts (0 without it); last_stop_s() is how long
// the last such stop lasted. A SIGCONT to a running process (launchers send one before SIGTERM) is
// not a stop.
int64_t times_stopped();
double last_stop_s();

// The activity hook: what the process is doing, recorded with every operation enqueued after it.
// `phase` must be a string with static storage ("train step", "checkpoint save", ...). Set only
// through profile::Phase (runtime/profile/phase.h), which restores the previous activity when its
// scope closes; the comm layer knows nothing else about training. A ThreadContext overrides it for
// the current thread while it lives (Phase::activity_of_thread: a background checkpoint writer).
struct Activity {
  int64_t step;
  const char* phase;
};
Activity set_activity(int64_t step, const char* phase);  // returns the activity it replaced
int64_t context_step();
const char* context_phase();
class ThreadContext {
 public:
  ThreadContext(int64_t step, const char* phase);
  ~ThreadContext();
  ThreadContext(const ThreadContext&) = delete;
  ThreadContext& operator=(const ThreadContext&) = delete;

 private:
  int64_t prev_step_;
  const char* prev_phase_;
};

// One communicator's record. Registered on construction (a fixed slot; none left: records nothing),
// released on destruction. `world_ranks` are the members' world ranks in group-rank order.
class Recorder {
 public:
  Recorder(const std::string& name, const std::string& backend, int rank, int size, const std::vector<int>& world_ranks);
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  uint64_t enqueue(const OpInfo& op);  // caller's thread; returns the sequence number (0 when not recording)
  void start(uint64_t seq);            // communication thread
  void end(uint64_t seq, bool ok);     // communication thread
  // "#57 all_reduce(sum) 8 bytes float64 (1 element), step 31 (train step)" for messages.
  std::string describe(uint64_t seq) const;

 private:
  int slot_ = -1;
};

// Where dumps go (created if missing; Error(Input) if it cannot be); "" disables dumps. `run_id`
// tells records of this run from older ones in the same directory; `world_size` is recorded.
void set_dump_dir(const std::string& dir, const std::string& run_id, int world_size);
std::string dump_dir();
std::string run_id();
// Writes this rank's record (see above for strong/weak). `reason`: "timeout", "error", ...;
// `message`: one line (may be empty). Returns the file written, "" if none.
std::string dump(const char* reason, const std::string& message);
// Installs handlers that dump on SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT (then the previous
// handler or the default action runs) and SIGTERM (weak dump, then the previous handler: the
// trainer's preemption flag), and starts a heartbeat thread (10 wake-ups a second) that notices when
// the process did not run (times_stopped(), recorded in dumps, so a wait that timed out across a
// stop says so; SIGCONT is handled to notice the end of a stop at once). Idempotent; call it again
// after installing other handlers for these signals so that the flight recorder runs first and
// chains to them.
void install_signal_handlers();

// Every recorded operation of every live group (for traces, step-time breakdowns and tests);
// ended_after_ns > 0 leaves out operations that ended before that time (a step's window).
struct Record {
  std::string group, backend;
  int instance = 0;  // k-th group of this name and backend created in the process
  uint64_t seq = 0;
  OpInfo info;
  State state = State::Empty;
  int64_t step = -1;
  std::string phase;
  int64_t enqueue_ns = 0, start_ns = 0, end_ns = 0;  // 0: not reached
};
std::vector<Record> snapshot(int64_t ended_after_ns = 0);

}  // namespace tessera::comm::flight
