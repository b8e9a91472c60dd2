#include "runtime/memory/tracker.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdlib>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <iterator>
#include <map>
#include <string>
#include <unordered_map>

#include "util/torch_compat.h"

namespace tessera::memory {

const char* name(Category c) {
  switch (c) {
    case Category::Other: return "other";
    case Category::Master: return "master";
    case Category::GradShard: return "grad_shard";
    case Category::Optimizer: return "optimizer";
    case Category::GatheredParams: return "gathered_params";
    case Category::UnsharedGrads: return "unsharded_grads";
    case Category::CommBuffers: return "comm_buffers";
    case Category::Activations: return "activations";
    case Category::SavedTensors: return "saved_tensors";
    case Category::Loader: return "loader";
    case Category::Checkpoint: return "checkpoint";
    case Category::ParamShard: return "param_shard";
    case Category::Count: break;
  }
  return "?";
}

int64_t Snapshot::total() const {
  int64_t t = 0;
  for (int64_t b : bytes) t += b;
  return t;
}
int64_t Snapshot::host_total() const {
  int64_t t = 0;
  for (int64_t b : host_bytes) t += b;
  return t;
}
nlohmann::json Snapshot::placement_json() const {
  nlohmann::json device = nlohmann::json::object(), host = nlohmann::json::object();
  for (int c = 0; c < kNumCategories; ++c) {
    const char* n = name(static_cast<Category>(c));
    if (bytes[c] != host_bytes[c]) device[n] = bytes[c] - host_bytes[c];
    if (host_bytes[c] != 0) host[n] = host_bytes[c];
  }
  return {{"device", device}, {"host", host}};
}

namespace {

std::atomic<const char*> g_phase{""};
thread_local Category t_default = Category::Other;
thread_local int t_depth = 0;
thread_local Category t_current = Category::Other;
thread_local Where t_where = Where::Device;

struct Entry {
  size_t bytes;
  Category cat;
  bool host;  // Where::Host
};

// The placement of an allocation of category c made under placement w.
bool on_host(Category c, Where w) { return w == Where::Host || c == Category::Loader || c == Category::Checkpoint; }

// Blocks of at least this size are the ones glibc maps and unmaps (the fixed mmap threshold of
// configure_process_allocators): the ones the cache keeps.
constexpr size_t kCachedMin = 1 << 20;

struct State {
  std::mutex mu;
  std::unordered_map<void*, Entry> entries;
  Snapshot live, peak;
  int64_t live_total = 0, peak_total = 0;
  // Freed large blocks by size, handed out again for the same size or a little less (take_cached).
  // Invariant: live_total + cached <= budget(): the higher of the peak since reset_peak() and the
  // peak of the window before it (a training step's window: the next step repeats the same sizes).
  bool caching = false;
  std::map<size_t, std::vector<void*>> cache;
  int64_t cached = 0;
  int64_t previous_peak_total = 0;
  CacheStats stats;

  int64_t budget() const { return std::max(peak_total, previous_peak_total); }
  // Takes cached blocks out until the invariant holds again, as few bytes as it can: the smallest
  // block that covers the excess, else the largest and again. (Largest first would throw out the
  // head's vocabulary-sized blocks for every small miss, and the next step maps them anew.) The
  // caller frees them after unlocking.
  void evict_over_budget(std::vector<void*>& out) {
    while (cached > 0 && live_total + cached > budget()) {
      auto pick = cache.lower_bound(static_cast<size_t>(live_total + cached - budget()));
      if (pick == cache.end()) pick = std::prev(cache.end());
      out.push_back(pick->second.back());
      pick->second.pop_back();
      cached -= static_cast<int64_t>(pick->first);
      ++stats.evicted;
      if (pick->second.empty()) cache.erase(pick);
    }
  }
  void evict_all(std::vector<void*>& out) {
    for (auto& [size, blocks] : cache) {
      out.insert(out.end(), blocks.begin(), blocks.end());
      stats.evicted += static_cast<int64_t>(blocks.size());
    }
    cache.clear();
    cached = 0;
  }

  void add(int c, int64_t n, bool host) {
    live.bytes[c] += n;
    if (host) live.host_bytes[c] += n;
    live_total += n;
    if (live_total > peak_total) {
      peak_total = live_total;
      peak = live;
      peak.phase = g_phase.load(std::memory_order_relaxed);
    }
  }
  void sub(int c, int64_t n, bool host) {
    live.bytes[c] -= n;
    if (host) live.host_bytes[c] -= n;
    live_total -= n;
  }
};

State& state() {
  static State* s = new State();  // never destroyed: frees may run during static destruction
  return *s;
}

void free_blocks(const std::vector<void*>& blocks) {
  for (void* p : blocks) c10::free_cpu(p);
}

void tracked_free(void* p) {
  if (p == nullptr) return;
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.entries.find(p);
    if (it != s.entries.end()) {
      const size_t bytes = it->second.bytes;
      s.sub(static_cast<int>(it->second.cat), static_cast<int64_t>(bytes), it->second.host);
      s.entries.erase(it);
      // It was live a moment ago, so keeping it cannot break the invariant.
      if (s.caching && bytes >= kCachedMin) {
        s.cache[bytes].push_back(p);
        s.cached += static_cast<int64_t>(bytes);
        return;
      }
    }
  }
  c10::free_cpu(p);
}

// A cached block for an allocation of n bytes, or nullptr: one of exactly n bytes, else, where the
// category may be charged a little more than it asked for, the smallest of at most n + n/8 (a
// step's sizes differ by a few rows or a padding: the root's gradient, its reduction buffer and the
// head's weight gradient are 65,536,000, 65,537,024 and 67,072,000 bytes on a 58M Llama). The
// block's whole size is charged, so the invariant and the resident set stay exact; the shard state
// (master, gradient shard, optimizer) only takes exact sizes, so its bytes are what the formula
// says to the byte. *size is the block's size.
void* take_cached(State& s, size_t n, Category c, size_t* size) {
  auto it = s.cache.lower_bound(n);
  if (it == s.cache.end()) return nullptr;
  const bool exact_only = c == Category::Master || c == Category::GradShard || c == Category::Optimizer;
  if (it->first != n && (exact_only || it->first > n + n / 8)) return nullptr;
  void* p = it->second.back();
  *size = it->first;
  it->second.pop_back();
  if (it->second.empty()) s.cache.erase(it);
  s.cached -= static_cast<int64_t>(*size);
  return p;
}

// Same memory as LibTorch's default CPU allocator (c10::alloc_cpu: aligned, zero-size safe), plus
// the bookkeeping. The context is the data pointer itself, so raw_allocate/raw_deleter work too.
class TrackingAllocator final : public compat::CpuAllocator {
 public:
  at::DataPtr allocate_bytes(size_t n) override {
    State& s = state();
    const Category c = current_category();
    const bool host = on_host(c, t_where);
    void* p = nullptr;
    if (n >= kCachedMin) {
      std::lock_guard<std::mutex> lock(s.mu);
      size_t block = n;
      if (s.caching && (p = take_cached(s, n, c, &block)) != nullptr) {
        ++s.stats.hits;
        s.entries[p] = {block, c, host};
        s.add(static_cast<int>(c), static_cast<int64_t>(block), host);
        return {p, p, &tracked_free, at::Device(at::DeviceType::CPU)};
      }
    }
    p = c10::alloc_cpu(n);
    std::vector<void*> evicted;
    if (p != nullptr) {
      std::lock_guard<std::mutex> lock(s.mu);
      if (n >= kCachedMin) ++s.stats.misses;
      s.entries[p] = {n, c, host};
      s.add(static_cast<int>(c), static_cast<int64_t>(n), host);
      s.evict_over_budget(evicted);
    }
    free_blocks(evicted);
    return {p, p, &tracked_free, at::Device(at::DeviceType::CPU)};
  }
  at::DeleterFnPtr raw_deleter() const override { return &tracked_free; }
};

std::atomic<bool> g_installed{false};

int64_t read_status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t klen = std::char_traits<char>::length(key);
  while (std::getline(in, line))
    if (line.compare(0, klen, key) == 0) return std::stoll(line.substr(klen));
  return 0;
}

}  // namespace

Scope::Scope(Category c, Where where) : prev_(t_depth > 0 ? t_current : t_default), prev_where_(t_where) {
  ++t_depth;
  t_current = c;
  t_where = where;
}
Scope::~Scope() {
  --t_depth;
  t_current = prev_;
  t_where = prev_where_;
}

const char* set_phase(const char* label) { return g_phase.exchange(label, std::memory_order_relaxed); }

Category current_category() { return t_depth > 0 ? t_current : t_default; }
Where current_where() { return t_where; }
void set_thread_default(Category c) { t_default = c; }

void install() {
  static std::once_flag once;
  std::call_once(once, [] {
    static TrackingAllocator allocator;
    c10::SetCPUAllocator(&allocator, /*priority=*/1);
    g_installed.store(c10::GetCPUAllocator() == &allocator);
  });
}
void configure_process_allocators() {
  if (!std::getenv("MALLOC_ARENA_MAX")) mallopt(M_ARENA_MAX, 1);
  const bool own_threshold = !std::getenv("MALLOC_MMAP_THRESHOLD_");
  if (own_threshold) mallopt(M_MMAP_THRESHOLD, static_cast<int>(kCachedMin));
  install();
  reuse_large_blocks(own_threshold);
}

void reuse_large_blocks(bool on) {
  State& s = state();
  std::vector<void*> evicted;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.caching = on;
    if (!on) s.evict_all(evicted);
  }
  free_blocks(evicted);
}

CacheStats cache_stats() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  CacheStats st = s.stats;
  st.cached_bytes = s.cached;
  return st;
}

bool installed() { return g_installed.load(); }

Snapshot live() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.live;
}
Snapshot peak() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.peak;
}
void reset_peak() {
  State& s = state();
  std::vector<void*> evicted;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.previous_peak_total = s.peak_total;
    s.peak = s.live;
    s.peak.phase = g_phase.load(std::memory_order_relaxed);
    s.peak_total = s.live_total;
    s.evict_over_budget(evicted);  // the budget is now the window that just ended
  }
  free_blocks(evicted);
}

void retag(const at::Tensor& t, Category c) {
  if (!t.defined() || !t.has_storage()) return;
  void* p = t.storage().data_ptr().get();
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.entries.find(p);
  if (it == s.entries.end() || it->second.cat == c) return;
  s.sub(static_cast<int>(it->second.cat), static_cast<int64_t>(it->second.bytes), it->second.host);
  it->second.cat = c;
  s.add(static_cast<int>(c), static_cast<int64_t>(it->second.bytes), it->second.host);
}

void retag_all(Category from, Category to) {
  if (from == to) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  for (auto& [p, e] : s.entries)
    if (e.cat == from) {
      e.cat = to;
      s.live.bytes[static_cast<int>(from)] -= static_cast<int64_t>(e.bytes);
      s.live.bytes[static_cast<int>(to)] += static_cast<int64_t>(e.bytes);
      if (e.host) {
        s.live.host_bytes[static_cast<int>(from)] -= static_cast<int64_t>(e.bytes);
        s.live.host_bytes[static_cast<int>(to)] += static_cast<int64_t>(e.bytes);
      }
    }
}

nlohmann::json Breakdown::to_json() const {
  nlohmann::json j = {{"process_base", process_base},
                      {"peak_rss", peak_rss},
                      {"tracked", tracked.total()},
                      {"untracked", untracked()},
                      {"peak_phase", tracked.phase}};
  for (int c = 0; c < kNumCategories; ++c) j[name(static_cast<Category>(c))] = tracked.bytes[c];
  j["placement"] = tracked.placement_json();
  return j;
}

int64_t rss_bytes() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE);
}
int64_t peak_rss_bytes() { return read_status_kib("VmHWM:") * 1024; }
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

}  // namespace tessera::memory
