#include "runtime/profile/op_count.h"

#include <ATen/record_function.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "runtime/profile/step_profile.h"

namespace tessera::profile::ops {
namespace {

enum Bucket { kLayerForward, kLayerBackward, kForwardOther, kBackwardOther, kOptimizer, kOther, kComm, kBuckets };

struct State {
  std::atomic<bool> on{false};
  std::atomic<int64_t> bucket[kBuckets] = {};
  std::atomic<int64_t> syncs_fb{0}, syncs{0};
  std::mutex mu;  // sites
  std::map<std::string, int64_t> sites;
  std::once_flag installed;
};
State& state() {
  static State* s = new State;  // never destroyed: callbacks may run during static destruction
  return *s;
}

thread_local int t_depth = 0;     // operators open on this thread (top level: 0 at start)
thread_local int t_in_layer = 0;  // InLayer scopes open on this thread

bool in_forward_or_backward(int part) {
  return part == static_cast<int>(Part::Forward) || part == static_cast<int>(Part::Backward) ||
         part == static_cast<int>(Part::Recompute) || part == static_cast<int>(Part::GatherWait);
}

Bucket bucket_of(int part) {
  if (part == kNoScopeEver) return kComm;
  const bool forward = part == static_cast<int>(Part::Forward);
  const bool backward = part == static_cast<int>(Part::Backward) || part == static_cast<int>(Part::Recompute);
  if (t_in_layer > 0 && (forward || backward || part == static_cast<int>(Part::GatherWait)))
    return backward ? kLayerBackward : kLayerForward;
  if (forward) return kForwardOther;
  if (backward || part == static_cast<int>(Part::ReduceWait)) return kBackwardOther;
  if (part == static_cast<int>(Part::Optimizer)) return kOptimizer;
  return kOther;
}

void add_site(const char* site) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.sites[site];
}

// Operators that read a device value on the host (see the header).
bool reads_device_value(const char* name) {
  static const char* const kNames[] = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select",
                                       "aten::_unique",             "aten::_unique2", "aten::unique_dim",
                                       "aten::unique_consecutive",  "aten::is_nonzero", "aten::equal"};
  for (const char* n : kNames)
    if (std::strcmp(name, n) == 0) return true;
  return false;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  State& s = state();
  if (s.on.load(std::memory_order_relaxed)) {
    const int part = thread_part();
    if (t_depth == 0) s.bucket[bucket_of(part)].fetch_add(1, std::memory_order_relaxed);
    const bool fb = in_forward_or_backward(part);
    if ((fb || part == static_cast<int>(Part::Optimizer)) && reads_device_value(fn.name())) {
      if (fb) s.syncs_fb.fetch_add(1, std::memory_order_relaxed);
      s.syncs.fetch_add(1, std::memory_order_relaxed);
      add_site(fn.name());
    }
  }
  ++t_depth;
  return nullptr;
}

void on_end(const at::RecordFunction&, at::ObserverContext*) { --t_depth; }

}  // namespace

void start() {
  State& s = state();
  std::call_once(s.installed, [] {
    at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end).scopes({at::RecordScope::FUNCTION}));
  });
  for (auto& b : s.bucket) b.store(0);
  s.syncs_fb.store(0);
  s.syncs.store(0);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.sites.clear();
  }
  s.on.store(true);
}

void stop() { state().on.store(false); }
bool counting() { return state().on.load(std::memory_order_relaxed); }

Counts snapshot() {
  State& s = state();
  Counts c;
  c.layer_forward = s.bucket[kLayerForward].load();
  c.layer_backward = s.bucket[kLayerBackward].load();
  c.forward_other = s.bucket[kForwardOther].load();
  c.backward_other = s.bucket[kBackwardOther].load();
  c.optimizer = s.bucket[kOptimizer].load();
  c.other = s.bucket[kOther].load();
  c.comm_threads = s.bucket[kComm].load();
  c.syncs_forward_backward = s.syncs_fb.load();
  c.syncs_total = s.syncs.load();
  std::lock_guard<std::mutex> lock(s.mu);
  c.sync_sites = s.sites;
  return c;
}

void note_sync(const char* site) {
  State& s = state();
  if (!s.on.load(std::memory_order_relaxed)) return;
  if (in_forward_or_backward(thread_part())) s.syncs_fb.fetch_add(1);
  s.syncs.fetch_add(1);
  add_site(site);
}

InLayer::InLayer() { ++t_in_layer; }
InLayer::~InLayer() { --t_in_layer; }

}  // namespace tessera::profile::ops
