// Stop requests: SIGTERM, SIGINT and train.preempt_signal set a flag that the training loop reads
// at micro-batch boundaries; the ranks agree on it with one host all-reduce before they stop
// (trainer.cpp run(), step.cpp stop_requested_mid_step), so every rank stops at the same point with a
// checkpoint. A second SIGINT ends the process at once (the default action). (SIGPIPE is ignored
// from the start of every MPI command, app/main.cpp: a rank whose output pipe is gone keeps
// training until it is asked to stop, and then saves.)
//
// THREADS: the handlers run on whichever thread the signal lands on and only store atomics (and
// write(2) one line for SIGINT); preemption_requested() and preemption_signal() are read by the
// trainer's thread.
#pragma once

namespace tessera::train {

void install_preemption_handlers(int preempt_signal);  // preempt_signal: SIGUSR1 / SIGUSR2 (0: none)
bool preemption_requested();
int preemption_signal();  // the signal behind preemption_requested() on this rank (0: none)

}  // namespace tessera::train
