// Where every byte of a rank goes, measured: a wrapper around LibTorch's CPU allocator that charges
// each allocation to a category and keeps the live bytes per category, their total, and the
// composition at the moment the total peaked. Code that allocates on behalf of a category opens a
// Scope on its thread (the engine around gathers and reductions, the optimizer around its state,
// the trainer around forward and backward, the loader, checkpoints); everything else is `other`.
// The process's resident set is read from /proc beside it, so what the tracker does not see
// (glibc's retained free memory, MPI's and OpenBLAS's own buffers, code) shows up as the
// difference: peak RSS = process base + tracked peak + untracked.
//
// The categories are the terms of the memory model (runtime/planner/memory_formula.h): a byte the breakdown
// shows in one category is a byte the planner's formula must predict in the same one.
//
// Threads: install() once from the main thread before the first engine is built (the launcher's
// main() does it). Allocations and frees may come from any thread (the communication threads, the
// checkpoint writer, autograd); the counters are guarded by one mutex. A Scope is per thread: the
// MPI backend's communication threads run under `comm_buffers`; autograd's CPU backward runs on
// the thread that called backward(), so the trainer's scope reaches it. CUDA memory is not tracked
// here (the caching allocator reports its own peak; see runtime/device).
#pragma once
#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace tessera::memory {

enum class Category : int {
  Other = 0,       // untagged allocations (batches, small bookkeeping, LibTorch internals)
  Master,          // fp32 (or state-dtype) master parameter shards
  GradShard,       // fp32 gradient shards
  Optimizer,       // optimizer state (AdamW moments) and its update temporaries
  GatheredParams,  // full parameters of gathered units, compute dtype
  UnsharedGrads,   // full-size gradients of a unit: autograd's parameter grads, reduction inputs,
                   // unsharded accumulation buffers
  CommBuffers,     // collective inputs/outputs of shard size (gather casts, reduce-scatter outputs),
                   // the communication threads' own scratch
  Activations,     // forward/backward working memory (hidden states, autograd temporaries, logits)
  SavedTensors,    // what forward left alive for backward (autograd's saved tensors, layer inputs)
  Loader,          // weight loading staging buffers
  Checkpoint,      // checkpoint snapshots and staging
  ParamShard,      // fsdp.offload: the compute-dtype parameter shard kept beside the host master
                   // (optimizer: on the device, the all-gather's input; params: on the host)
  Count
};
constexpr int kNumCategories = static_cast<int>(Category::Count);
const char* name(Category c);

// Where the bytes of an allocation live on a GPU run: the device, or host memory (fsdp.offload's
// shard state, loading and checkpoint staging). On a CPU run both are this process's memory and the
// tracker sees all of it; the placement says where each byte would be on a GPU, so the breakdown
// and the plan split every category the same way (Snapshot::host_bytes).
enum class Where { Device, Host };

// Allocations made on this thread while a Scope is alive are charged to its category, placed on the
// device unless `where` says host. Loader and Checkpoint bytes are host bytes whatever the scope says.
class Scope {
 public:
  explicit Scope(Category c, Where where = Where::Device);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Category prev_;
  Where prev_where_;
};
Category current_category();
Where current_where();
// The category of this thread when no Scope is open (e.g. CommBuffers for a communication thread).
void set_thread_default(Category c);

// Wraps LibTorch's CPU allocator (idempotent). Allocations made before are not tracked.
void install();

// Sets glibc's allocator up, once, before any thread allocates (glibc fixes the arena limit then),
// unless the user chose otherwise through glibc's own variables, then install()s the tracker:
// - One malloc arena for every thread (MALLOC_ARENA_MAX). With glibc's default, the communication
//   threads get arenas of their own, whose 64 MiB heaps are unmapped when a collective frees its
//   MPI temporaries and mapped (and page-faulted) afresh by the next: a 16 MiB reduce-scatter
//   issued from a communication thread took twice as long as the same call from the main thread.
// - A fixed mmap threshold of 1 MiB (MALLOC_MMAP_THRESHOLD_). By default glibc raises the
//   threshold to the size of each large block freed (up to 32 MiB), after which gathered layers,
//   reduction buffers and activations below 32 MiB come from the heap and their memory stays with
//   the process once freed: measured on a 220M-parameter Llama at 2 ranks, 389 MiB of resident
//   memory per rank that no live tensor held, 42 MiB with the fixed threshold (the memory model,
//   runtime/planner/memory_formula.h, counts on it).
// - Reuse of large blocks (reuse_large_blocks(true)), unless the user set MALLOC_MMAP_THRESHOLD_.
void configure_process_allocators();

// With the fixed threshold every block of 1 MiB or more is a fresh mmap, whose pages the kernel
// zeroes on first touch, and a munmap when freed: on the 58M-parameter Llama of bench step at 2
// ranks, a third of every step was system time. A transformer step allocates the same sizes over and
// over (every layer has the same shapes), so the tracking allocator keeps freed blocks of 1 MiB or
// more and hands them out again for an allocation of the same size (or, outside the shard state,
// of up to 1/8 less, the block charged whole), under one rule that keeps the memory model true:
// live + cached bytes never exceed the budget, the higher of the tracked peak since the last
// reset_peak() and the peak of the window before it (an allocation that is not a reuse and would
// break it first frees cached blocks, as few bytes as cover the excess; reset_peak()
// frees what the window that just ended does not cover). The trainer resets the peak at every
// step, so a step may keep what the previous step freed, up to that step's peak: without this the
// cache starts every step empty and a third of the large allocations were fresh mappings again
// (bench step, 58M Llama, 2 ranks: 380,000 page faults per step). So resident memory never goes
// above what the same run without the cache reaches. Calls from any thread (under the tracker's mutex).
void reuse_large_blocks(bool on);
struct CacheStats {
  int64_t hits = 0, misses = 0, evicted = 0;  // allocations of >= 1 MiB served from the cache / not
  int64_t cached_bytes = 0;                   // held now
};
CacheStats cache_stats();
bool installed();

struct Snapshot {
  std::array<int64_t, kNumCategories> bytes{};       // every byte, by category
  std::array<int64_t, kNumCategories> host_bytes{};  // the part of bytes[c] placed in host memory (Where::Host)
  const char* phase = "";  // peak(): the phase label current when the peak was reached
  int64_t total() const;
  int64_t host_total() const;
  int64_t device_total() const { return total() - host_total(); }
  // {"device": {"<category>": bytes, ...}, "host": {...}}: the non-zero categories on each side.
  nlohmann::json placement_json() const;
};

// Labels what the process is doing now ("forward", "backward", "layer reduction", "optimizer",
// ...), so a peak can say where it happened; returns the label it replaced. `label` must be a string
// literal (kept by pointer). Set only through profile::Phase (runtime/profile/phase.h), which
// restores the previous label when its scope closes.
const char* set_phase(const char* label);
Snapshot live();
// The composition at the highest total since the last reset_peak().
Snapshot peak();
void reset_peak();

// Charges the storage behind `t` (if tracked) to category c from now on.
void retag(const at::Tensor& t, Category c);
// Moves every live allocation of category `from` to `to` (e.g. Activations -> SavedTensors at the
// end of forward: what is still alive then is what backward needs).
void retag_all(Category from, Category to);

// One phase's measured memory on the host: the tracked composition at the phase's peak, the
// resident set before the run allocated anything (libraries, MPI, LibTorch's own state), and the
// phase's peak resident set. untracked() is what the tracker cannot attribute: freed memory the
// allocator kept, MPI/BLAS internals, pages touched since the base was read.
struct Breakdown {
  Snapshot tracked;
  int64_t process_base = 0, peak_rss = 0;
  int64_t untracked() const { return peak_rss - process_base - tracked.total(); }
  // {"process_base": .., "peak_rss": .., "tracked": .., "untracked": .., "<category>": .., ...,
  //  "placement": {"device": {...}, "host": {...}}} (Snapshot::placement_json)
  nlohmann::json to_json() const;
};

// The resident set of this process (from /proc/self/statm), its high-water mark since start or the
// last reset_peak_rss() (VmHWM), and the reset (writes 5 to /proc/self/clear_refs; false if the
// kernel refused, then the high-water mark stays the process's).
int64_t rss_bytes();
int64_t peak_rss_bytes();
bool reset_peak_rss();

}  // namespace tessera::memory
