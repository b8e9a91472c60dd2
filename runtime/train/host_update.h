// The host optimizer thread of optim.in_backward under fsdp.offload: each unit's AdamW update (and
// its gradient shard's sum of squares) is a job that the thread driving backward hands over from
// the engine's on_grad_ready hook; this thread runs it while the backward goes on with the next
// units, as DeepSpeed's ZeRO-Offload overlaps its CPU Adam with the device's backward.
//
// One thread, one job in flight: submit() first waits until the job handed over before it is done,
// then hands its own over and returns. A unit's update so overlaps the backward of the units after
// it (in backward order) until the next unit's gradient shard is final; at most two units'
// gradient shards are alive at once (the one being updated and the one the backward completes
// meanwhile) where the update on the driving thread kept one; and when the host is slower than
// the device the backward waits for it there, unit by unit, instead of letting gradients pile up.
// One thread rather than a pool: each update already spreads over LibTorch's intra-op threads
// (AdamW's fused CPU loop is an at::parallel_for); the updates run in the order the units arrive,
// so their sums of squares are added in the order the inline update adds them (the same norm,
// bit for bit); and AdamW's state (its step count, moments allocated on first use, cached views)
// is touched by one thread at a time without locks.
//
// Errors: the first exception a job throws is kept, the jobs handed over after it are dropped
// (their units stay untouched), and drain() rethrows it on the driving thread: the same exception
// object, so the same type and message.
//
// Overlap, measured: overlapped() counts the jobs of the window (since begin()) that were done
// before drain() was called, i.e. that ran while the driving thread went on with the backward (what
// of them the backward still waited for, in submit(), is the trainer's optimizer time). An update
// on the driving thread is never counted. The root unit's, handed over at the very end of
// backward, is usually not. begin(hold = true), for tests: each job starts only once the next one
// has arrived or drain() was called, so every update but the last overlaps the backward.
//
// THREADS. begin, submit, drain, abandon and overlapped: the thread that drives the engine (the
// trainer's; on a GPU also autograd's device thread inside backward -- never both at once). Jobs
// run on this class's own thread, set up with at::init_num_threads (the intra-op thread count the
// trainer's thread uses, so a reduction splits the same way on both). A job may touch only what the
// driving thread leaves alone until drain() returns (the trainer: one unit's master, gradient
// shard and AdamW state); it opens its own memory::Scope (per thread) and never a profile::Phase
// (the profiler's parts are the step thread's). Handing a job over and taking it are ordered by one
// mutex. The destructor waits for the running job, drops one not yet started, and joins.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace tessera::train {

// Test binaries only (tests/support/fault_env.cpp's hold-host-update, for tests/mpi/test_offload.cpp):
// whether the window of optimizer step `step` (1-based) on world rank `rank` begins held. Null (every
// product binary): never. Not a collective; set during static initialisation.
using HoldHook = bool (*)(int rank, int64_t step);
void set_hold_hook(HoldHook hook);
bool held_for_test(int rank, int64_t step);

class HostUpdateThread {
 public:
  HostUpdateThread();  // starts the thread
  ~HostUpdateThread();
  HostUpdateThread(const HostUpdateThread&) = delete;
  HostUpdateThread& operator=(const HostUpdateThread&) = delete;

  // A window of jobs begins (the last micro-step's backward): counters reset. Idle only.
  void begin(bool hold = false);
  // Hands `job` over once the previous job is done; returns without running it. After a job threw,
  // `job` is dropped (destroyed here) and the error waits for drain().
  void submit(std::function<void()> job);
  // Waits until the job handed over is done; rethrows the window's first exception.
  void drain();
  // The same wait, keeping no error: the step is being abandoned by an exception of its own.
  void abandon() noexcept;
  int64_t overlapped() const;

 private:
  void run();
  void wait_idle(std::unique_lock<std::mutex>& lock);
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;  // handed over, not yet taken
  bool busy_ = false;          // a job is handed over or running
  bool stop_ = false, hold_ = false, draining_ = false;
  int64_t arrived_ = 0;     // submit() calls of the window (counted as each is entered)
  int64_t index_ = 0;       // the busy job's place in the window
  int64_t overlapped_ = 0;  // jobs done before drain() was called
  std::exception_ptr error_;
  std::thread thread_;  // started by the constructor, once the members above exist
};

}  // namespace tessera::train
