#include "runtime/profile/step_profile.h"

#include <c10/core/Device.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/comm/flight_recorder.h"
#include "runtime/profile/op_count.h"
#include "util/error.h"
#include "util/output_file.h"

namespace tessera::profile {
namespace {

const char* const kNames[kParts] = {"data",        "forward",     "backward",  "recompute",
                                    "gather_wait", "reduce_wait", "optimizer", "sync_wait"};

// A small number per thread for the trace's tracks (1: the first thread that opened a scope).
int thread_index() {
  static std::atomic<int> next{1};
  thread_local int index = next.fetch_add(1);
  return index;
}

struct Frame {
  Part part;
  int64_t begin_ns;
  int tid;
};
struct Span {
  std::string name;
  int64_t begin_ns, end_ns;
  int tid;
  nlohmann::json args;
};
struct CommSpan {
  std::string track;
  int64_t begin_ns, end_ns, queued_ns;
  std::string name;
  nlohmann::json args;
};

struct State {
  std::mutex mu;
  std::vector<Frame> stack;
  int64_t mark_ns = 0;                // when the time since went to stack.back()
  std::array<int64_t, kParts> acc{};  // nanoseconds per part since begin_step
  int64_t step = 0, step_begin_ns = 0;
  // The device clock (GPU TIMING): `clock` is installed, `step_clock` times the step under way (null
  // outside a step, without a clock, or once a stamp failed: the step is then host-timed).
  // stamp_part[i] is the part (-1: idle) of the interval that ends at stamp i; stamp 0 is begin_step's.
  std::shared_ptr<DeviceClock> clock, step_clock;
  std::vector<int8_t> stamp_part;
  bool tracing = false;
  std::vector<Span> spans;
  std::map<std::tuple<std::string, int, uint64_t>, CommSpan> comm;  // (group, instance, seq)
};
State& state() {
  static State* s = new State;  // never destroyed: scopes may close during static destruction
  return *s;
}

double seconds(int64_t ns) { return static_cast<double>(ns) * 1e-9; }

// Length of the union of [begin, end) intervals.
int64_t union_length(std::vector<std::pair<int64_t, int64_t>> v) {
  std::sort(v.begin(), v.end());
  int64_t total = 0, cur_b = 0, cur_e = -1;
  for (const auto& [b, e] : v) {
    if (e <= b) continue;
    if (b > cur_e) {
      if (cur_e > cur_b) total += cur_e - cur_b;
      cur_b = b;
      cur_e = e;
    } else {
      cur_e = std::max(cur_e, e);
    }
  }
  if (cur_e > cur_b) total += cur_e - cur_b;
  return total;
}

std::string track_of(const comm::flight::Record& r) {
  std::string t = "comm " + r.group + " (" + r.backend + ")";
  if (r.instance > 0) t += " #" + std::to_string(r.instance + 1);
  return t;
}

// Under s.mu: a device stamp ending the interval of the innermost open part (idle if none).
void stamp_locked(State& s) {
  if (!s.step_clock) return;
  const int8_t part = s.stack.empty() ? int8_t{-1} : static_cast<int8_t>(s.stack.back().part);
  const int id = s.step_clock->stamp();
  if (id != static_cast<int>(s.stamp_part.size())) {  // -1, or not the id expected: this step is host-timed
    s.step_clock = nullptr;
    return;
  }
  s.stamp_part.push_back(part);
}

// The step's parts on the device clock, from its stamps (see stamp_locked), into b; false (b as it
// was) if they cannot be read. Offsets are from stamp 0; an interval that comes out negative
// (stamps of two streams reached out of order) counts 0, so the intervals add up to the largest
// offset: the step.
bool device_parts(DeviceClock& clock, const std::vector<int8_t>& part, Breakdown& b) {
  const int last = static_cast<int>(part.size()) - 1;
  if (last >= 1) ops::note_sync("profile: end of step (device clock)");  // the host waits for the device
  if (last < 1 || !clock.wait(last)) return false;
  std::array<int64_t, kParts> acc{};
  int64_t reached = 0;
  for (int i = 1; i <= last; ++i) {
    const std::optional<int64_t> t = clock.elapsed_ns(0, i);
    if (!t) return false;
    if (*t > reached && part[i] >= 0) acc[part[i]] += *t - reached;
    reached = std::max(reached, *t);
  }
  b.step_s = seconds(reached);
  double parts = 0;
  for (int i = 0; i < kParts; ++i) parts += b.part_s[i] = seconds(acc[i]);
  b.idle_s = std::max(0.0, b.step_s - parts);
  b.clock = clock.name();
  return true;
}

// The communicators' side of the step [begin, end): comm_s and overlap from the flight recorder's
// operations that executed in it (returned, for the trace).
std::vector<comm::flight::Record> comm_part(Breakdown& b, int64_t begin, int64_t end) {
  std::vector<comm::flight::Record> records = comm::flight::snapshot(begin);
  std::vector<std::pair<int64_t, int64_t>> busy;
  for (const auto& r : records) {
    if (r.start_ns == 0 || r.end_ns == 0 || r.end_ns <= begin || r.start_ns >= end) continue;
    busy.emplace_back(std::max(r.start_ns, begin), std::min(r.end_ns, end));
  }
  b.comm_s = seconds(union_length(busy));
  b.overlap = b.comm_s > 0 ? std::clamp(1.0 - b.exposed_s / b.comm_s, 0.0, 1.0) : 0.0;
  return records;
}

// Under s.mu, while tracing: the step and its communication operations.
void trace_step_locked(State& s, const Breakdown& b, int64_t begin, int64_t end,
                       const std::vector<comm::flight::Record>& records) {
  s.spans.push_back({"step " + std::to_string(b.step), begin, end, 0, b.to_json()});
  for (const auto& r : records) {
    if (r.start_ns == 0 || r.end_ns == 0) continue;
    CommSpan c;
    c.track = track_of(r);
    c.begin_ns = r.start_ns;
    c.end_ns = r.end_ns;
    c.queued_ns = r.enqueue_ns;
    c.name = comm::flight::op_name(r.info.op);
    c.args = {{"seq", r.seq},
              {"bytes", r.info.bytes},
              {"count", r.info.count},
              {"step", r.step},
              {"phase", r.phase},
              {"queued_ms", r.enqueue_ns > 0 ? (r.start_ns - r.enqueue_ns) * 1e-6 : 0.0},
              {"ok", r.state == comm::flight::State::Completed}};
    s.comm[{r.group, r.instance, r.seq}] = std::move(c);
  }
}

}  // namespace

const char* part_name(Part p) { return kNames[static_cast<int>(p)]; }

namespace {
thread_local int t_part = kNoScopeEver;  // this thread's innermost open part (thread_part())
}  // namespace

int thread_part() { return t_part; }

Scope::Scope(Part p) : prev_thread_part_(t_part == kNoScopeEver ? -1 : t_part) {
  t_part = static_cast<int>(p);
  State& s = state();
  const int64_t now = comm::flight::now_ns();
  const int tid = thread_index();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.stack.empty()) s.acc[static_cast<int>(s.stack.back().part)] += now - s.mark_ns;
  stamp_locked(s);
  depth_ = s.stack.size();
  s.stack.push_back({p, now, tid});
  s.mark_ns = now;
}

Scope::~Scope() {
  t_part = prev_thread_part_;
  State& s = state();
  const int64_t now = comm::flight::now_ns();
  std::lock_guard<std::mutex> lock(s.mu);
  // Close this scope and any left open above it (a scope of another thread that outlived ours);
  // one device stamp ends the innermost's interval, the others take no time.
  if (s.stack.size() > depth_) stamp_locked(s);
  while (s.stack.size() > depth_) {
    const Frame f = s.stack.back();
    s.acc[static_cast<int>(f.part)] += now - s.mark_ns;
    s.mark_ns = now;
    s.stack.pop_back();
    if (s.tracing) s.spans.push_back({part_name(f.part), f.begin_ns, now, f.tid, nullptr});
  }
}

double Breakdown::compute_s() const { return part(Part::Forward) + part(Part::Backward) + part(Part::Recompute); }

nlohmann::json Breakdown::to_json() const {
  nlohmann::json j = {{"step_s", step_s}};
  for (int i = 0; i < kParts; ++i) j[std::string(kNames[i]) + "_s"] = part_s[i];
  j["idle_s"] = idle_s;
  j["comm_s"] = comm_s;
  j["exposed_comm_s"] = exposed_s;
  j["overlap"] = overlap;
  j["clock"] = clock;
  if (device_timed()) {
    nlohmann::json h = {{"step", host_step_s}, {"idle", host_idle_s}};
    for (int i = 0; i < kParts; ++i) h[kNames[i]] = host_part_s[i];
    j["host"] = std::move(h);
  }
  return j;
}

std::string Breakdown::summary() const {
  const double t = step_s > 0 ? step_s : 1;
  auto pct = [t](double x) { return 100.0 * x / t; };
  const std::string timed_by = device_timed() ? " | " + clock + " clock" : "";
  char buf[480];
  snprintf(buf, sizeof(buf),
           "compute %.0f%% (forward %.0f, backward %.0f, recompute %.0f) | gather wait %.0f%% | reduce wait %.0f%% | "
           "optimizer %.0f%% | sync wait %.0f%% | data %.0f%% | idle %.0f%%%s | comm %.3f s/step, %.0f%% overlapped",
           pct(compute_s()), pct(part(Part::Forward)), pct(part(Part::Backward)), pct(part(Part::Recompute)),
           pct(part(Part::GatherWait)), pct(part(Part::ReduceWait)), pct(part(Part::Optimizer)), pct(part(Part::SyncWait)), pct(part(Part::Data)),
           pct(idle_s), timed_by.c_str(), comm_s, 100.0 * overlap);
  return buf;
}

Breakdown median(const std::vector<Breakdown>& steps) {
  Breakdown m;
  if (steps.empty()) return m;
  auto med = [&](auto get) {
    std::vector<double> v;
    for (const auto& b : steps) v.push_back(get(b));
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  };
  m.step = steps.back().step;
  m.step_s = med([](const Breakdown& b) { return b.step_s; });
  for (int i = 0; i < kParts; ++i) m.part_s[i] = med([i](const Breakdown& b) { return b.part_s[i]; });
  m.idle_s = med([](const Breakdown& b) { return b.idle_s; });
  m.host_step_s = med([](const Breakdown& b) { return b.host_step_s; });
  for (int i = 0; i < kParts; ++i) m.host_part_s[i] = med([i](const Breakdown& b) { return b.host_part_s[i]; });
  m.host_idle_s = med([](const Breakdown& b) { return b.host_idle_s; });
  m.clock = steps.front().clock;
  for (const auto& b : steps)
    if (b.clock != m.clock) m.clock = "mixed";
  m.comm_s = med([](const Breakdown& b) { return b.comm_s; });
  m.exposed_s = med([](const Breakdown& b) { return b.exposed_s; });
  m.overlap = med([](const Breakdown& b) { return b.overlap; });
  return m;
}

void begin_step(int64_t step) {
  State& s = state();
  const int64_t now = comm::flight::now_ns();
  std::lock_guard<std::mutex> lock(s.mu);
  s.acc.fill(0);
  s.mark_ns = now;
  s.step = step;
  s.step_begin_ns = now;
  s.step_clock = s.clock;
  s.stamp_part.clear();
  if (s.step_clock) {
    s.step_clock->reset();
    stamp_locked(s);  // stamp 0: the step's start on the device
  }
}

Breakdown end_step() {
  State& s = state();
  const int64_t now = comm::flight::now_ns();
  Breakdown b;
  int64_t begin = 0;
  std::shared_ptr<DeviceClock> clock;
  std::vector<int8_t> stamp_part;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.stack.empty()) {  // a scope still open at the end of the step: its time so far counts
      s.acc[static_cast<int>(s.stack.back().part)] += now - s.mark_ns;
      s.mark_ns = now;
    }
    stamp_locked(s);  // the step's last stamp; none after it until the next begin_step
    clock = std::move(s.step_clock);  // (null after the move)
    stamp_part.swap(s.stamp_part);
    b.step = s.step;
    begin = s.step_begin_ns;
    b.host_step_s = seconds(now - begin);
    double parts = 0;
    for (int i = 0; i < kParts; ++i) parts += b.host_part_s[i] = seconds(s.acc[i]);
    b.host_idle_s = std::max(0.0, b.host_step_s - parts);
  }
  b.step_s = b.host_step_s;  // the host clock's, unless the device's can be read
  b.part_s = b.host_part_s;
  b.idle_s = b.host_idle_s;
  if (clock) device_parts(*clock, stamp_part, b);
  b.exposed_s = b.part(Part::GatherWait) + b.part(Part::ReduceWait);
  const std::vector<comm::flight::Record> records = comm_part(b, begin, now);
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.tracing) trace_step_locked(s, b, begin, now, records);
  return b;
}

void set_device_clock(std::shared_ptr<DeviceClock> clock) {
  State& s = state();
  std::shared_ptr<DeviceClock> old;  // released after the lock (a CUDA clock destroys its events)
  std::lock_guard<std::mutex> lock(s.mu);
  old = std::exchange(s.clock, std::move(clock));
}

std::shared_ptr<DeviceClock> device_clock() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.clock;
}

int ScriptedDeviceClock::stamp() {
  if (static_cast<int>(stamps_.size()) >= capacity_) return -1;
  stamps_.push_back(now_ns_.load());
  return static_cast<int>(stamps_.size()) - 1;
}

bool ScriptedDeviceClock::wait(int last) {
  last_waited_ = last;
  return last >= 0 && last < static_cast<int>(stamps_.size());
}

std::optional<int64_t> ScriptedDeviceClock::elapsed_ns(int from, int to) {
  const int n = static_cast<int>(stamps_.size());
  if (from < 0 || to < 0 || from >= n || to >= n || to > last_waited_ || from > last_waited_) return std::nullopt;
  return stamps_[to] - stamps_[from];
}

void ScriptedDeviceClock::reset() {
  stamps_.clear();
  last_waited_ = -1;
}

void start_trace() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.tracing = true;
  s.spans.clear();
  s.comm.clear();
}

bool tracing() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.tracing;
}

int64_t write_trace(const std::string& path, int rank) {
  State& s = state();
  std::vector<Span> spans;
  std::vector<CommSpan> comm_spans;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.tracing = false;
    spans.swap(s.spans);
    for (auto& [key, c] : s.comm) comm_spans.push_back(std::move(c));
    s.comm.clear();
  }
  // Chrome trace event format: "X" complete events in microseconds, "M" metadata naming tracks.
  // Steps (tid 0) and the step thread's parts share the "compute" track; other threads that
  // opened scopes get "compute (thread N)", each communicator its own track.
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"args", {{"name", "rank " + std::to_string(rank)}}}});
  events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rank}, {"args", {{"sort_index", rank}}}});
  int64_t t0 = INT64_MAX;
  for (const auto& sp : spans) t0 = std::min(t0, sp.begin_ns);
  for (const auto& c : comm_spans) t0 = std::min(t0, c.begin_ns);
  if (t0 == INT64_MAX) t0 = 0;
  // Timestamps stay CLOCK_MONOTONIC (ranks of one machine line up when their files are merged);
  // the first event's time is recorded for reference.
  auto us = [](int64_t ns) { return static_cast<double>(ns) * 1e-3; };
  std::map<int, int> compute_tid;  // thread index -> track id
  auto track_for_thread = [&](int thread) {
    auto it = compute_tid.find(thread);
    if (it != compute_tid.end()) return it->second;
    const int tid = static_cast<int>(compute_tid.size()) + 1;
    compute_tid[thread] = tid;
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", tid},
                      {"args", {{"name", tid == 1 ? std::string("compute") : "compute (thread " + std::to_string(tid) + ")"}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", rank}, {"tid", tid}, {"args", {{"sort_index", tid}}}});
    return tid;
  };
  // The step thread is the one that opened the first part scope; steps go on its track.
  int step_thread = 0;
  for (const auto& sp : spans)
    if (sp.tid != 0) {
      step_thread = sp.tid;
      break;
    }
  for (const auto& sp : spans) {
    const int tid = track_for_thread(sp.tid == 0 ? (step_thread ? step_thread : 1) : sp.tid);
    nlohmann::json e = {{"ph", "X"}, {"name", sp.name}, {"cat", sp.tid == 0 ? "step" : "compute"}, {"pid", rank},
                        {"tid", tid}, {"ts", us(sp.begin_ns)}, {"dur", us(sp.end_ns - sp.begin_ns)}};
    if (!sp.args.is_null()) e["args"] = sp.args;
    events.push_back(std::move(e));
  }
  std::map<std::string, int> comm_tid;
  for (const auto& c : comm_spans) {
    auto it = comm_tid.find(c.track);
    if (it == comm_tid.end()) {
      const int tid = 100 + static_cast<int>(comm_tid.size());
      it = comm_tid.emplace(c.track, tid).first;
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", tid}, {"args", {{"name", c.track}}}});
      events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", rank}, {"tid", tid}, {"args", {{"sort_index", tid}}}});
    }
    events.push_back({{"ph", "X"}, {"name", c.name}, {"cat", "comm"}, {"pid", rank}, {"tid", it->second},
                      {"ts", us(c.begin_ns)}, {"dur", us(c.end_ns - c.begin_ns)}, {"args", c.args}});
  }
  const int64_t n = static_cast<int64_t>(spans.size() + comm_spans.size());
  const nlohmann::json doc = {{"traceEvents", events},
                              {"displayTimeUnit", "ms"},
                              {"otherData", {{"rank", rank}, {"clock", "CLOCK_MONOTONIC"}, {"first_event_us", us(t0)}}}};
  std::string why;  // a fresh temporary renamed over the name: never through a link (util/output_file.h)
  if (!util::replace_file(path, doc.dump() + "\n", why)) throw TESSERA_INPUT_ERROR(why + " (the trace of train.profile_steps)");
  return n;
}

}  // namespace tessera::profile
