// What a GPU step's cost is made of, counted on any device: the ATen operators the step dispatches
// (each is at least one kernel launch on a GPU) and its host synchronisation points (each stalls
// the host until the device has drained its queue). `tessera bench step` prints them per decoder
// layer, for the optimizer and gradient norm, and for the whole step.
//
// Operators: a global at::RecordFunction callback (scope FUNCTION) counts the top-level operators
// of each thread -- an operator called from inside another (aten::to inside aten::item) is part of
// it, as it is one dispatch from the caller. Attribution: the part of the step (profile::Part) the
// thread is in when the operator starts, and whether it runs inside a decoder layer (InLayer,
// opened by the FSDP engine around a layer's forward, recompute and backward). Operators of threads
// that never opened a profile::Scope (the communicators' threads) are counted apart.
//
// Synchronisation points, two sources:
//  - note_sync(site): Tessera's own device -> host reads (device::to_host and the like) and the
//    step-time breakdown's wait for the device clock's last event (GPUs only) call it wherever
//    they run, so a CPU run counts what a GPU run would wait for;
//  - inside forward, backward, recompute and the optimizer (where every tensor is the device's),
//    the operators that read device values on the host: aten::_local_scalar_dense (.item()),
//    aten::nonzero, aten::masked_select, aten::unique family, aten::is_nonzero, aten::equal -- at
//    any depth. (The step's agreements between ranks run on host tensors: not counted.)
// A pageable host -> device copy also synchronises; the step's only host -> device copies go
// through device::to_device (pinned, non-blocking), which counts none.
//
// THREADS. start()/stop()/snapshot(): one thread (bench step's). The callback runs on every thread
// that dispatches operators; its counters are atomics. InLayer: the thread running the layer.
#pragma once
#include <cstdint>
#include <map>
#include <string>

namespace tessera::profile::ops {

struct Counts {
  int64_t layer_forward = 0;   // inside decoder layers, forward
  int64_t layer_backward = 0;  // inside decoder layers, backward and recompute
  int64_t forward_other = 0;   // forward outside the layers: embedding, head and loss
  int64_t backward_other = 0;  // backward outside the layers (head, embedding, root reduction)
  int64_t optimizer = 0;       // unscale, gradient norm, clipping, AdamW
  int64_t other = 0;           // data, waits, agreements, the rest of the step thread
  int64_t comm_threads = 0;    // threads that never opened a profile::Scope
  int64_t syncs_forward_backward = 0;  // synchronisation points inside forward / backward / recompute
  int64_t syncs_total = 0;             // all of them, the step's included
  std::map<std::string, int64_t> sync_sites;  // where: note_sync's site or the operator's name
  int64_t step_thread_total() const {
    return layer_forward + layer_backward + forward_other + backward_other + optimizer + other;
  }
};

// Counting on (installs the callback the first time) / off; start() zeroes the counters.
void start();
void stop();
Counts snapshot();
bool counting();

// A host synchronisation point in Tessera's code (no-op unless counting).
void note_sync(const char* site);

// Marks the calling thread as running a decoder layer while alive (nestable).
class InLayer {
 public:
  InLayer();
  ~InLayer();
  InLayer(const InLayer&) = delete;
  InLayer& operator=(const InLayer&) = delete;
};

}  // namespace tessera::profile::ops
