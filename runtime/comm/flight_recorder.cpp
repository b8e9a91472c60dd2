// Flight recorder (see flight_recorder.h). Fixed tables, atomics only on the recording path, and a
// dump writer restricted to async-signal-safe calls (open, write, close, rename, clock_gettime,
// getpid, sigaction, raise) so the same code serves timeouts, errors and signal handlers.
#include "runtime/comm/flight_recorder.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "runtime/comm/collective_checks.h"
#include "util/error.h"
#include "util/output_file.h"

namespace tessera::comm::flight {
namespace {

constexpr int kMaxGroups = 64;
constexpr uint64_t kMask = kEntries - 1;
static_assert((kEntries & (kEntries - 1)) == 0, "kEntries must be a power of two");

struct Entry {
  std::atomic<uint64_t> seq{0};  // 0: empty or being written; published last
  std::atomic<int64_t> count{0}, bytes{0}, step{-1}, t_enqueue{0}, t_start{0}, t_end{0};
  std::atomic<const char*> phase{nullptr};
  std::atomic<int32_t> root{-1};
  std::atomic<int16_t> dtype{0};
  std::atomic<int8_t> op{0}, reduce{-1}, state{0};
};

struct Slot {
  std::atomic<int> active{0};
  char name[48] = {0};
  char backend[16] = {0};
  int instance = 0, rank = 0, size = 1;
  std::atomic<int*> ranks{nullptr};  // world ranks of the members (capacity ranks_cap)
  int ranks_cap = 0;
  std::atomic<int> nranks{0};
  std::atomic<uint64_t> last_enqueued{0}, last_started{0}, last_completed{0};
  std::atomic<Entry*> ring{nullptr};  // allocated on first use, never freed
};

Slot g_slots[kMaxGroups];
std::mutex g_register_mutex;

std::atomic<int64_t> g_step{-1};
std::atomic<const char*> g_phase{""};
thread_local const char* t_phase = nullptr;  // non-null: a ThreadContext is active
thread_local int64_t t_step = -1;

// Dump state. Paths and identity are copied into fixed buffers by set_dump_dir (not in a handler).
char g_dir[1024] = {0};
char g_run_id[64] = {0};
char g_host[256] = {0};
char g_message[2048] = {0};
std::atomic<int> g_world_size{1};
std::atomic<bool> g_dump_busy{false};
std::atomic<int> g_dumped{0};  // 0 none, 1 weak, 2 strong
// Stops: a heartbeat thread (started by install_signal_handlers) stores the monotonic time every kBeatNs; a gap longer
// than kStopNs means the whole process did not run (SIGSTOP, or frozen). Whoever first sees the stale
// beat (the thread, a SIGCONT, a dump, a timed-out wait) swaps it for now and counts the stop, so a
// stop is counted once and a SIGCONT to a process that was running (launchers send SIGCONT before
// SIGTERM) counts nothing. Lock-free atomics only: used from signal handlers.
constexpr int64_t kBeatNs = 100'000'000, kStopNs = 2'000'000'000;
std::atomic<int64_t> g_beat_ns{0};
std::atomic<int> g_beat_pid{0};  // the process whose heartbeat thread runs (none in a forked child)
std::atomic<int64_t> g_stops{0}, g_stop_end_ns{0}, g_stop_len_ns{0};
std::mutex g_dir_mutex;

const char* dtype_name(int16_t t) {
  switch (static_cast<at::ScalarType>(t)) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kByte: return "uint8";
    case at::kChar: return "int8";
    case at::kBool: return "bool";
    default: return "other";
  }
}

const char* reduce_name(int r) { return r < 0 ? "" : detail::op_name(static_cast<ReduceOp>(r)); }

void copy_cstr(char* dst, size_t cap, const std::string& s) {
  size_t n = std::min(cap - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = 0;
}

int64_t clock_ns(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Appends decimal v to p (NUL-terminated), returns the new end.
char* append_uint(char* p, char* end, uint64_t v) {
  char tmp[24];
  int k = 0;
  do {
    tmp[k++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v);
  while (k && p + 1 < end) *p++ = tmp[--k];
  *p = 0;
  return p;
}
// ---- async-signal-safe JSON writer ----------------------------------------------------------

class Out {
 public:
  explicit Out(int fd) : fd_(fd) {}
  bool ok() const { return ok_; }
  void flush() {
    size_t off = 0;
    while (ok_ && off < n_) {
      ssize_t w = ::write(fd_, buf_ + off, n_ - off);
      if (w < 0) {
        if (errno == EINTR) continue;
        ok_ = false;
      } else {
        off += static_cast<size_t>(w);
      }
    }
    n_ = 0;
  }
  void c(char ch) {
    if (n_ == sizeof(buf_)) flush();
    buf_[n_++] = ch;
  }
  void s(const char* str) {
    for (; str && *str; ++str) c(*str);
  }
  void q(const char* str) {  // JSON string
    c('"');
    for (; str && *str; ++str) {
      unsigned char ch = static_cast<unsigned char>(*str);
      if (ch == '"' || ch == '\\') {
        c('\\');
        c(static_cast<char>(ch));
      } else if (ch < 0x20) {
        static const char hex[] = "0123456789abcdef";
        s("\\u00");
        c(hex[ch >> 4]);
        c(hex[ch & 15]);
      } else {
        c(static_cast<char>(ch));
      }
    }
    c('"');
  }
  void i(int64_t v) {
    if (v < 0) {
      c('-');
      u(static_cast<uint64_t>(-(v + 1)) + 1);
    } else {
      u(static_cast<uint64_t>(v));
    }
  }
  void u(uint64_t v) {
    char tmp[24];
    append_uint(tmp, tmp + sizeof(tmp), v);
    s(tmp);
  }
  void key(const char* k) {  // ,"k": (the caller writes the first key of an object by hand)
    c(',');
    q(k);
    c(':');
  }

 private:
  int fd_;
  char buf_[4096];
  size_t n_ = 0;
  bool ok_ = true;
};

char* append_str(char* p, char* end, const char* s) {
  while (*s && p + 1 < end) *p++ = *s++;
  *p = 0;
  return p;
}

void write_group(Out& o, const Slot& g) {
  o.s("{\"name\":");
  o.q(g.name);
  o.key("backend");
  o.q(g.backend);
  o.key("instance");
  o.i(g.instance);
  o.key("rank");
  o.i(g.rank);
  o.key("size");
  o.i(g.size);
  o.key("ranks");
  o.c('[');
  const int* ranks = g.ranks.load(std::memory_order_acquire);
  const int nr = g.nranks.load(std::memory_order_acquire);
  for (int k = 0; ranks && k < nr; ++k) {
    if (k) o.c(',');
    o.i(ranks[k]);
  }
  o.c(']');
  const uint64_t last = g.last_enqueued.load(std::memory_order_acquire);
  o.key("last_enqueued");
  o.u(last);
  o.key("last_started");
  o.u(g.last_started.load(std::memory_order_acquire));
  o.key("last_completed");
  o.u(g.last_completed.load(std::memory_order_acquire));
  o.key("entries");
  o.c('[');
  const Entry* ring = g.ring.load(std::memory_order_acquire);
  bool first = true;
  for (uint64_t seq = last > kEntries ? last - kEntries + 1 : 1; ring && seq <= last; ++seq) {
    const Entry& e = ring[seq & kMask];
    if (e.seq.load(std::memory_order_acquire) != seq) continue;
    const int8_t op = e.op.load(std::memory_order_relaxed), red = e.reduce.load(std::memory_order_relaxed),
                 st = e.state.load(std::memory_order_relaxed);
    const int16_t dt = e.dtype.load(std::memory_order_relaxed);
    const int64_t count = e.count.load(std::memory_order_relaxed), bytes = e.bytes.load(std::memory_order_relaxed),
                  step = e.step.load(std::memory_order_relaxed), te = e.t_enqueue.load(std::memory_order_relaxed),
                  ts = e.t_start.load(std::memory_order_relaxed), tn = e.t_end.load(std::memory_order_relaxed);
    const int32_t root = e.root.load(std::memory_order_relaxed);
    const char* phase = e.phase.load(std::memory_order_relaxed);
    if (e.seq.load(std::memory_order_acquire) != seq) continue;  // overwritten while read
    if (!first) o.c(',');
    first = false;
    o.s("{\"seq\":");
    o.u(seq);
    o.key("op");
    o.q(op_name(static_cast<Op>(op)));
    o.key("reduce");
    o.q(reduce_name(red));
    o.key("dtype");
    o.q(dtype_name(dt));
    o.key("count");
    o.i(count);
    o.key("bytes");
    o.i(bytes);
    o.key("root");
    o.i(root);
    o.key("state");
    o.q(state_name(static_cast<State>(st)));
    o.key("step");
    o.i(step);
    o.key("phase");
    o.q(phase ? phase : "");
    o.key("enqueue_ns");
    o.i(te);
    o.key("start_ns");
    o.i(ts);
    o.key("end_ns");
    o.i(tn);
    o.c('}');
  }
  o.s("]}");
}

// Counts a stop if the heartbeat is stale (see g_beat_ns). Async-signal-safe.
void catch_up_stop() {
  if (g_beat_pid.load() != static_cast<int>(getpid())) return;
  int64_t old = g_beat_ns.load();
  const int64_t now = clock_ns(CLOCK_MONOTONIC);
  if (now - old <= kStopNs || !g_beat_ns.compare_exchange_strong(old, now)) return;
  g_stop_len_ns.store(now - old);
  g_stop_end_ns.store(now);
  g_stops.fetch_add(1);
}

// The dump itself: async-signal-safe. strength 1 = weak (SIGTERM), 2 = strong.
bool dump_impl(int strength, const char* reason, const char* message, char* path_out, size_t path_cap) {
  if (!g_dir[0]) return false;
  int done = g_dumped.load();
  if (done == 2 || (strength == 1 && done != 0)) return false;
  bool expected = false;
  if (!g_dump_busy.compare_exchange_strong(expected, true)) return false;  // another dump in progress
  const int saved_errno = errno;
  catch_up_stop();  // a dump right after a SIGCONT, before the heartbeat thread ran again
  const int rank = process_rank() < 0 ? 0 : process_rank();
  char path[1200], tmp[1250];
  char* p = append_str(path, path + sizeof(path), g_dir);
  p = append_str(p, path + sizeof(path), "/rank-");
  p = append_uint(p, path + sizeof(path), static_cast<uint64_t>(rank));
  append_str(p, path + sizeof(path), ".json");
  char* t = append_str(tmp, tmp + sizeof(tmp), path);
  t = append_str(t, tmp + sizeof(tmp), ".tmp.");
  append_uint(t, tmp + sizeof(tmp), static_cast<uint64_t>(getpid()));
  bool ok = false;
  int fd = util::create_fresh(tmp);  // never through a link planted at the name
  if (fd >= 0) {
    Out o(fd);
    o.s("{\"format\":\"tessera-flight\",\"version\":1");
    o.key("rank");
    o.i(rank);
    o.key("world_size");
    o.i(g_world_size.load());
    o.key("host");
    o.q(g_host);
    o.key("pid");
    o.i(getpid());
    o.key("run_id");
    o.q(g_run_id);
    o.key("reason");
    o.q(reason);
    o.key("message");
    o.q(message ? message : "");
    o.key("context");
    o.s("{\"step\":");
    o.i(g_step.load());
    o.key("phase");
    o.q(g_phase.load());
    o.c('}');
    o.key("timeout_ms");  // comm.timeout_s: an operation older than this that did not time out was not waited on
    o.i(default_timeout().count());
    o.key("stops");  // how often this process did not run for more than kStopNs (stopped or frozen)
    o.i(g_stops.load());
    o.key("stop_end_ns");  // monotonic time the last stop ended
    o.i(g_stop_end_ns.load());
    o.key("stop_ns");  // how long the last stop lasted
    o.i(g_stop_len_ns.load());
    o.key("clock");
    o.s("{\"monotonic_ns\":");
    o.i(clock_ns(CLOCK_MONOTONIC));
    o.key("realtime_ns");
    o.i(clock_ns(CLOCK_REALTIME));
    o.c('}');
    o.key("groups");
    o.c('[');
    bool first = true;
    for (const Slot& g : g_slots) {
      if (!g.active.load(std::memory_order_acquire)) continue;
      if (!first) o.c(',');
      first = false;
      write_group(o, g);
    }
    o.s("]}\n");
    o.flush();
    ok = o.ok();
    ok = ::close(fd) == 0 && ok;
    if (ok) ok = ::rename(tmp, path) == 0;
    if (!ok) ::unlink(tmp);
  }
  if (ok) {
    g_dumped.store(strength);
    if (path_out) append_str(path_out, path_out + path_cap, path);
  }
  g_dump_busy.store(false);
  errno = saved_errno;
  return ok;
}

// ---- signal handlers --------------------------------------------------------------------------

struct sigaction g_old[NSIG];
constexpr int kFatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

const char* signal_reason(int sig) {
  switch (sig) {
    case SIGSEGV: return "signal SIGSEGV";
    case SIGBUS: return "signal SIGBUS";
    case SIGFPE: return "signal SIGFPE";
    case SIGILL: return "signal SIGILL";
    case SIGABRT: return "signal SIGABRT";
    case SIGTERM: return "signal SIGTERM";
    default: return "signal";
  }
}

extern "C" void on_flight_signal(int sig, siginfo_t* info, void* ctx) {
  const int saved_errno = errno;
  if (sig == SIGCONT) {  // perhaps the end of a stop: counted at once if the heartbeat is stale
    catch_up_stop();
    const struct sigaction& old = g_old[sig];
    if ((old.sa_flags & SA_SIGINFO) && old.sa_sigaction) old.sa_sigaction(sig, info, ctx);
    else if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) old.sa_handler(sig);
    errno = saved_errno;
    return;
  }
  if (sig == SIGTERM) {
    dump_impl(1, signal_reason(sig), "terminated by SIGTERM (launcher abort or preemption)", nullptr, 0);
    const struct sigaction& old = g_old[sig];
    if (old.sa_flags & SA_SIGINFO) {
      if (old.sa_sigaction) old.sa_sigaction(sig, info, ctx);
    } else if (old.sa_handler == SIG_DFL) {
      sigaction(sig, &old, nullptr);
      raise(sig);
    } else if (old.sa_handler != SIG_IGN) {
      old.sa_handler(sig);
    }
    errno = saved_errno;
    return;
  }
  char path[1200] = {0};
  const bool dumped = dump_impl(2, signal_reason(sig), "fatal signal", path, sizeof(path));
  {  // One line on stderr: who died of what, where, and where its record is.
    Out o(2);
    o.s("tessera: rank ");
    o.i(process_rank());
    o.s(" (");
    o.s(g_host[0] ? g_host : "?");
    o.s("): ");
    o.s(signal_reason(sig) + 7);  // "SIGSEGV"
    o.s(" at step ");
    o.i(context_step());
    o.s(" (");
    o.s(context_phase());
    o.s(")");
    if (dumped) {
      o.s("; flight record ");
      o.s(path);
    }
    o.c('\n');
    o.flush();
  }
  // The previous handler (or the default action) handles the signal from here: restored, re-raised.
  sigaction(sig, &g_old[sig], nullptr);
  raise(sig);
  errno = saved_errno;
}

}  // namespace

const char* op_name(Op op) {
  switch (op) {
    case Op::AllGather: return "all_gather";
    case Op::ReduceScatter: return "reduce_scatter";
    case Op::AllReduce: return "all_reduce";
    case Op::Broadcast: return "broadcast";
    case Op::Scatter: return "scatter";
    case Op::ScatterPieces: return "scatter_pieces";
    case Op::Barrier: return "barrier";
    case Op::Other: return "other";
  }
  return "other";
}

const char* state_name(State s) {
  switch (s) {
    case State::Scheduled: return "scheduled";
    case State::Started: return "started";
    case State::Completed: return "completed";
    case State::Failed: return "failed";
    case State::Empty: return "empty";
  }
  return "empty";
}

int64_t now_ns() { return clock_ns(CLOCK_MONOTONIC); }

int64_t times_stopped() {
  catch_up_stop();
  return g_stops.load();
}

double last_stop_s() { return g_stop_len_ns.load() / 1e9; }

Activity set_activity(int64_t step, const char* phase) {
  return {g_step.exchange(step), g_phase.exchange(phase ? phase : "")};
}
int64_t context_step() { return t_phase ? t_step : g_step.load(); }
const char* context_phase() { return t_phase ? t_phase : g_phase.load(); }

ThreadContext::ThreadContext(int64_t step, const char* phase) : prev_step_(t_step), prev_phase_(t_phase) {
  t_step = step;
  t_phase = phase ? phase : "";
}
ThreadContext::~ThreadContext() {
  t_step = prev_step_;
  t_phase = prev_phase_;
}

// ---- Recorder -----------------------------------------------------------------------------------

Recorder::Recorder(const std::string& name, const std::string& backend, int rank, int size,
                   const std::vector<int>& world_ranks) {
  static std::map<std::string, int> instances;
  std::lock_guard<std::mutex> lk(g_register_mutex);
  const int instance = instances[backend + "/" + name]++;
  for (int i = 0; i < kMaxGroups; ++i) {
    Slot& g = g_slots[i];
    if (g.active.load()) continue;
    copy_cstr(g.name, sizeof(g.name), name);
    copy_cstr(g.backend, sizeof(g.backend), backend);
    g.instance = instance;
    g.rank = rank;
    g.size = size;
    if (g.ranks_cap < static_cast<int>(world_ranks.size())) {  // the old array is leaked: a handler may read it
      g.ranks.store(new int[world_ranks.size()], std::memory_order_release);
      g.ranks_cap = static_cast<int>(world_ranks.size());
    }
    int* r = g.ranks.load();
    for (size_t k = 0; k < world_ranks.size(); ++k) r[k] = world_ranks[k];
    g.nranks.store(static_cast<int>(world_ranks.size()), std::memory_order_release);
    if (!g.ring.load()) g.ring.store(new Entry[kEntries], std::memory_order_release);
    Entry* ring = g.ring.load();
    for (int k = 0; k < kEntries; ++k) ring[k].seq.store(0, std::memory_order_relaxed);
    g.last_enqueued.store(0);
    g.last_started.store(0);
    g.last_completed.store(0);
    g.active.store(1, std::memory_order_release);
    slot_ = i;
    return;
  }
}

Recorder::~Recorder() {
  if (slot_ >= 0) g_slots[slot_].active.store(0, std::memory_order_release);
}

uint64_t Recorder::enqueue(const OpInfo& op) {
  if (slot_ < 0) return 0;
  Slot& g = g_slots[slot_];
  const uint64_t seq = g.last_enqueued.fetch_add(1, std::memory_order_acq_rel) + 1;
  Entry& e = g.ring.load(std::memory_order_relaxed)[seq & kMask];
  e.seq.store(0, std::memory_order_relaxed);
  e.op.store(static_cast<int8_t>(op.op), std::memory_order_relaxed);
  e.reduce.store(static_cast<int8_t>(op.reduce), std::memory_order_relaxed);
  e.dtype.store(static_cast<int16_t>(op.dtype), std::memory_order_relaxed);
  e.count.store(op.count, std::memory_order_relaxed);
  e.bytes.store(op.bytes, std::memory_order_relaxed);
  e.root.store(op.root, std::memory_order_relaxed);
  e.step.store(context_step(), std::memory_order_relaxed);
  e.phase.store(context_phase(), std::memory_order_relaxed);
  e.t_enqueue.store(now_ns(), std::memory_order_relaxed);
  e.t_start.store(0, std::memory_order_relaxed);
  e.t_end.store(0, std::memory_order_relaxed);
  e.state.store(static_cast<int8_t>(State::Scheduled), std::memory_order_relaxed);
  e.seq.store(seq, std::memory_order_release);
  return seq;
}

void Recorder::start(uint64_t seq) {
  if (slot_ < 0 || seq == 0) return;
  Slot& g = g_slots[slot_];
  Entry& e = g.ring.load(std::memory_order_relaxed)[seq & kMask];
  if (e.seq.load(std::memory_order_acquire) == seq) {
    e.t_start.store(now_ns(), std::memory_order_relaxed);
    e.state.store(static_cast<int8_t>(State::Started), std::memory_order_relaxed);
  }
  g.last_started.store(seq, std::memory_order_release);
}

void Recorder::end(uint64_t seq, bool ok) {
  if (slot_ < 0 || seq == 0) return;
  Slot& g = g_slots[slot_];
  Entry& e = g.ring.load(std::memory_order_relaxed)[seq & kMask];
  if (e.seq.load(std::memory_order_acquire) == seq) {
    e.t_end.store(now_ns(), std::memory_order_relaxed);
    e.state.store(static_cast<int8_t>(ok ? State::Completed : State::Failed), std::memory_order_relaxed);
  }
  if (ok) g.last_completed.store(seq, std::memory_order_release);
}

std::string Recorder::describe(uint64_t seq) const {
  if (slot_ < 0 || seq == 0) return "";
  const Slot& g = g_slots[slot_];
  const Entry& e = g.ring.load()[seq & kMask];
  if (e.seq.load() != seq) return "collective #" + std::to_string(seq);
  const int64_t step = e.step.load();
  const char* phase = e.phase.load();
  std::string s = "collective #" + std::to_string(seq) + " (" + std::to_string(e.bytes.load()) + " bytes of " +
                  dtype_name(e.dtype.load());
  if (step >= 0) s += ", step " + std::to_string(step);
  if (phase && *phase) s += std::string(", ") + phase;
  return s + ")";
}

// ---- dumps --------------------------------------------------------------------------------------

void set_dump_dir(const std::string& dir, const std::string& run_id, int world_size) {
  std::lock_guard<std::mutex> lk(g_dir_mutex);
  if (!dir.empty()) {
    struct stat st {};
    if (::lstat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))  // a link: the dumps would land where it points
      throw TESSERA_INPUT_ERROR("flight recorder directory '" + dir + "' is " + util::file_kind(st.st_mode) +
                                ", not a directory: refused");
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec || access(dir.c_str(), W_OK) != 0)
      throw TESSERA_INPUT_ERROR("flight recorder directory '" + dir + "' is not a writable directory");
    if (dir.size() + 64 >= sizeof(g_dir)) throw TESSERA_INPUT_ERROR("flight recorder directory path is too long: " + dir);
  }
  copy_cstr(g_run_id, sizeof(g_run_id), run_id);
  copy_cstr(g_host, sizeof(g_host), process_host());
  g_world_size.store(world_size);
  copy_cstr(g_dir, sizeof(g_dir), dir);
}

std::string dump_dir() {
  std::lock_guard<std::mutex> lk(g_dir_mutex);
  return g_dir;
}
std::string run_id() {
  std::lock_guard<std::mutex> lk(g_dir_mutex);
  return g_run_id;
}

std::string dump(const char* reason, const std::string& message) {
  std::lock_guard<std::mutex> lk(g_dir_mutex);  // one non-signal dump at a time; g_message is ours
  copy_cstr(g_message, sizeof(g_message), message);
  char path[1200] = {0};
  return dump_impl(2, reason, g_message, path, sizeof(path)) ? std::string(path) : std::string();
}

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_sigaction = on_flight_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  // Idempotent: a signal whose handler is already ours keeps the previous handler it chains to.
  auto install = [&](int sig) {
    struct sigaction cur {};
    sigaction(sig, nullptr, &cur);
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_flight_signal) return;
    sigaction(sig, &sa, &g_old[sig]);
  };
  for (int sig : kFatal) install(sig);
  install(SIGTERM);
  install(SIGCONT);
  // The heartbeat thread, once per process (again in a forked child, which has no threads but ours).
  const int pid = static_cast<int>(getpid());
  if (g_beat_pid.load() != pid) {
    std::lock_guard<std::mutex> lk(g_register_mutex);
    if (g_beat_pid.load() != pid) {
      g_beat_ns.store(clock_ns(CLOCK_MONOTONIC));
      g_beat_pid.store(pid);
      std::thread([] {
        sigset_t all;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, nullptr);  // signal handlers run on the other threads
        const struct timespec beat {0, kBeatNs};
        for (;;) {
          nanosleep(&beat, nullptr);
          catch_up_stop();
          int64_t old = g_beat_ns.load();
          const int64_t now = clock_ns(CLOCK_MONOTONIC);
          if (now > old) g_beat_ns.compare_exchange_strong(old, now);  // lost to catch_up_stop: it stored now
        }
      }).detach();
    }
  }
}

std::vector<Record> snapshot(int64_t ended_after_ns) {
  std::vector<Record> out;
  for (const Slot& g : g_slots) {
    if (!g.active.load(std::memory_order_acquire)) continue;
    const Entry* ring = g.ring.load(std::memory_order_acquire);
    const uint64_t last = g.last_enqueued.load(std::memory_order_acquire);
    const uint64_t first = last > kEntries ? last - kEntries + 1 : 1;
    // Operations of one group end in issue order: walk back from the newest until one ended before
    // ended_after_ns (all older ones did too), then copy forwards.
    uint64_t from = first;
    for (uint64_t seq = last; ring && ended_after_ns > 0 && seq >= first && seq > 0; --seq) {
      const Entry& e = ring[seq & kMask];
      const int64_t end = e.t_end.load();
      if (e.seq.load(std::memory_order_acquire) == seq && end != 0 && end < ended_after_ns) {
        from = seq + 1;
        break;
      }
    }
    for (uint64_t seq = from; ring && seq <= last; ++seq) {
      const Entry& e = ring[seq & kMask];
      if (e.seq.load(std::memory_order_acquire) != seq) continue;
      Record r;
      r.group = g.name;
      r.backend = g.backend;
      r.instance = g.instance;
      r.seq = seq;
      r.info.op = static_cast<Op>(e.op.load());
      r.info.reduce = e.reduce.load();
      r.info.dtype = static_cast<at::ScalarType>(e.dtype.load());
      r.info.count = e.count.load();
      r.info.bytes = e.bytes.load();
      r.info.root = e.root.load();
      r.state = static_cast<State>(e.state.load());
      r.step = e.step.load();
      const char* phase = e.phase.load();
      r.phase = phase ? phase : "";
      r.enqueue_ns = e.t_enqueue.load();
      r.start_ns = e.t_start.load();
      r.end_ns = e.t_end.load();
      if (e.seq.load(std::memory_order_acquire) == seq) out.push_back(std::move(r));
    }
  }
  return out;
}

}  // namespace tessera::comm::flight
