#include "runtime/train/host_update.h"

#include <ATen/Parallel.h>

#include "util/error.h"

namespace tessera::train {

HostUpdateThread::HostUpdateThread() { thread_ = std::thread([this] { run(); }); }

HostUpdateThread::~HostUpdateThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

namespace {
HoldHook g_hold_hook = nullptr;
}  // namespace

void set_hold_hook(HoldHook hook) { g_hold_hook = hook; }
bool held_for_test(int rank, int64_t step) { return g_hold_hook && g_hold_hook(rank, step); }

void HostUpdateThread::begin(bool hold) {
  std::lock_guard<std::mutex> lock(mu_);
  TESSERA_CHECK(!busy_, "host optimizer thread: a window begins while a job is in hand");
  arrived_ = index_ = overlapped_ = 0;
  hold_ = hold;
  draining_ = false;
  error_ = nullptr;
}

void HostUpdateThread::submit(std::function<void()> job) {
  std::unique_lock<std::mutex> lock(mu_);
  ++arrived_;
  cv_.notify_all();  // a held job may start now
  cv_.wait(lock, [&] { return !busy_; });
  if (error_) {
    lock.unlock();  // dropped: its unit stays untouched (destroyed outside the lock)
    return;
  }
  job_ = std::move(job);
  index_ = arrived_ - 1;
  busy_ = true;
  lock.unlock();
  cv_.notify_all();
}

void HostUpdateThread::wait_idle(std::unique_lock<std::mutex>& lock) {
  draining_ = true;
  cv_.notify_all();
  cv_.wait(lock, [&] { return !busy_; });
  draining_ = false;
}

void HostUpdateThread::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  wait_idle(lock);
  if (!error_) return;
  std::exception_ptr e = error_;
  error_ = nullptr;
  std::rethrow_exception(e);
}

void HostUpdateThread::abandon() noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  wait_idle(lock);
  error_ = nullptr;
}

int64_t HostUpdateThread::overlapped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return overlapped_;
}

void HostUpdateThread::run() {
  at::init_num_threads();  // the trainer's intra-op thread count (at::set_num_threads) on this thread too
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (busy_ && job_ && (!hold_ || draining_ || arrived_ > index_ + 1)); });
    if (stop_) return;  // a job not yet started is dropped with this object
    std::function<void()> job = std::move(job_);
    job_ = nullptr;
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    job = nullptr;  // what the job held (a gradient shard) is freed before the job counts as done
    lock.lock();
    if (error && !error_) error_ = error;
    if (!draining_) ++overlapped_;  // done while the driving thread was still in backward
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace tessera::train
