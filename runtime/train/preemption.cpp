#include "runtime/train/preemption.h"

#include <unistd.h>

#include <atomic>
#include <csignal>

namespace tessera::train {

namespace {
std::atomic<bool> g_preempt{false};
std::atomic<int> g_preempt_signal{0};  // the first signal that asked to stop
extern "C" void on_preempt_signal(int sig) {
  const bool again = g_preempt.exchange(true);
  if (!again) g_preempt_signal.store(sig);
  if (sig != SIGINT) return;
  if (again) {  // a second Ctrl-C: quit at once
    signal(SIGINT, SIG_DFL);
    raise(SIGINT);
    return;
  }
  static const char msg[] =
      "\ntessera: interrupt: stopping at the next micro-batch boundary with a checkpoint (Ctrl-C again to quit at once)\n";
  ssize_t n = write(STDERR_FILENO, msg, sizeof(msg) - 1);
  (void)n;
}

}  // namespace

void install_preemption_handlers(int preempt_signal) {
  struct sigaction sa {};
  sa.sa_handler = on_preempt_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);  // Ctrl-C, also on a single process without mpirun
  if (preempt_signal > 0) sigaction(preempt_signal, &sa, nullptr);
}
bool preemption_requested() { return g_preempt.load(); }
int preemption_signal() { return g_preempt_signal.load(); }

}  // namespace tessera::train
