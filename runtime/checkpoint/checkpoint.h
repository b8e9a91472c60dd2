// Sharded checkpoints (format documented in runtime/checkpoint/FORMAT.md).
//
// A checkpoint is a directory <root>/step-<N>/ holding one tensor file per shard-group rank (that
// rank's slices of every unit's state kinds: the engine's fp32 master parameters ("param") and the
// optimizer's moments ("exp_avg", "exp_avg_sq"), each stored as fp32; 8-bit moments as their code
// bytes and per-block fp32 scales, format version 2) and manifest.json, written
// last by rank 0, which records for every tensor its global shape, dtype and which byte range of
// which file holds which slice, per-file checksums (CRC32C), the step and the caller's training
// state. Writes go to step-<N>.tmp/ (files and directory fsync'ed) and are renamed into place, so a
// crash leaves either the previous checkpoint or the new one complete. Every file a save writes is
// created new (io::File::create: a link planted at its name is removed, never written through).
//
// Who writes: replicas hold identical shards (no_shard: every rank; hybrid_shard: the same
// intra-node rank on every node), so only the ranks with replicate-group rank 0 write a file, named
// after their shard-group rank (rank-00000.bin ...). World rank 0 (always such a writer) prepares
// the directory, writes the manifest and renames.
//
// Tensor coordinates in the manifest are element ranges of the row-major parameter, independent of
// world size, padding and alignment, so load() can read a checkpoint saved at any world size and
// strategy into any other.
#pragma once
#include <nlohmann/json.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/named_shards.h"
#include "util/error.h"

namespace tessera::checkpoint {

// The newest format this build writes and reads. A checkpoint is written as version 1 unless a kind
// is stored as bytes ("U8") or per block (the 8-bit optimizer's "exp_avg.q8", "exp_avg.absmax",
// ...): then 2, which readers of version 1 refuse by its number. This build reads both.
constexpr int kFormatVersion = 2;
constexpr const char* kFormatName = "tessera-checkpoint";
// The kind holding the model's weights (what consolidation exports). Other kinds are whatever the
// components handed to save() call their state (AdamW: "exp_avg", "exp_avg_sq").
constexpr const char* kParamKind = "param";

// The checkpoint settings, owned here: the schema binds checkpoint.dir, every, keep, keep_best, async
// and resume to these fields (their defaults are these initialisers). The Checkpointer reads dir,
// keep and async; the trainer asks when to save (every, keep_best) and the launcher resolves resume.
struct Policy {
  std::string dir;     // step-<N>/ directories; empty: no checkpoints
  int64_t every = 0;   // save every N steps (0: at the end and on preemption)
  int64_t keep = 2;    // complete checkpoints retained (older ones deleted after a successful save); <=0: all
  bool keep_best = false;  // also keep the one with the lowest validation loss
  std::string resume = "auto";  // auto, never, or a checkpoint directory
  // true: snapshot master and moments to host memory, write on a background thread (training goes
  // on). false: write from the shards themselves, a GPU's streamed down through one host buffer of
  // kStagingBytes (layout.h): the save's host cost is that buffer, and training waits for it.
  bool async = false;
};

struct SaveTiming {
  double blocked_s = 0;  // time the caller was blocked
  double write_s = 0;    // total write time (background for async), known once complete
  int64_t bytes = 0;     // bytes this rank wrote (0 on replicas that do not write)
  std::string dir;       // the complete checkpoint directory, once complete
};

// Collective over every group in `groups` used by the engine. `groups` are host communicators (MPI,
// or self at size 1) even when the engine runs on a GPU over NCCL: shards on a device are snapshot
// to host memory in save() (async) or streamed through a host staging buffer (sync), and staged
// through host memory by load(). `state` is the caller's JSON
// (step, sampler, scheduler, RNG, config, model config, strategy, layout) stored in the manifest
// under "state". Every rank must construct it at the same point (it takes the world's
// host_duplicate(): the checkpoint's own collectives, possibly on a background thread, never
// interleave with training collectives).
class Checkpointer {
 public:
  Checkpointer(const Policy& policy, const comm::ProcessGroups& groups);  // writes into policy.dir
  ~Checkpointer();  // waits for an async save in flight (errors are reported on stderr, not thrown)

  // Saves step `step`: every kind in `kinds` (one tensor per engine unit, shaped like its shard on
  // this rank, fp32 or bf16, on any device; written as fp32). With async, returns after the
  // snapshot; the next save() or wait() waits for the previous one to finish (and rethrows its
  // error). An existing step-<N> is replaced atomically. Bad input (unwritable directory, disk
  // full) throws Error(Input) on every rank.
  SaveTiming save(int64_t step, fsdp::Engine& engine, const std::vector<NamedShards>& kinds,
                  const nlohmann::json& state);
  SaveTiming wait();  // completes an async save in flight; returns its timing (zeros if none)

  // Lineage: the run this Checkpointer saves for starts at `start_step`, resumed from the checkpoint
  // directory `resumed_from` ("" for a fresh start from step 0). With a resumed_from, world rank 0
  // points <root>/latest at it at once, so that latest() resumes a run that crashes before its first
  // save from there and not from a newer checkpoint of an abandoned future (a rollback); a
  // resumed_from outside root is written as its absolute path, which latest() refuses (naming it)
  // until the first save: such a run is resumed again with its directory named. The first
  // complete save then RETIRES every step-<K> of the root with K > start_step, once its own files and
  // manifest are written: they move to <root>/retired/step-<K> (".2", ".3" ... when that exists);
  // nothing is deleted, and keep counts only this lineage's checkpoints.
  // Checkpointers on which it is never called neither retire nor redirect. Call on every rank.
  void begin_lineage(int64_t start_step, const std::string& resumed_from);

  const std::string& root() const { return root_; }

  struct Impl;

 private:
  std::string root_;
  Policy opts_;
  comm::ProcessGroups groups_;
  std::unique_ptr<Impl> impl_;
};

// The checkpoint to resume from in root ("" if none): the one <root>/latest names (written by every
// complete save and by begin_lineage: the head of the most recent run's lineage) if it is complete,
// else the highest complete step-<N>. Incomplete *.tmp dirs and retired checkpoints are never
// chosen. latest must be a regular file of one line naming a step-<N> directory of root: anything
// else (an absolute path, "../", a link or FIFO there, a step-<N> that is a link or not a
// directory) is Error(Input) naming the file and what it holds, so that nothing planted in or
// downloaded with checkpoint.dir sends a resume elsewhere.
std::string latest(const std::string& root_dir);

// Where a resuming run may continue from, best first: latest(root_dir), then the complete step-<N>
// of root_dir below its step, newest first (the fallbacks when a newer one turns out damaged).
// Complete step-<N> above latest's step belong to a run that was rolled back and are never among
// them. Empty when root_dir holds no complete checkpoint.
std::vector<std::string> resume_candidates(const std::string& root_dir);

// The complete checkpoints directly in root_dir (step-<N> holding a manifest.json), by step; retired
// ones and incomplete *.tmp dirs are not among them. A step-<N> that is a symbolic link (or anything
// but a directory) is Error(Input) naming it.
std::vector<std::string> complete_checkpoints(const std::string& root_dir);

// A checkpoint that cannot be read back as it was saved: its manifest is missing, truncated or
// invalid, or one of its files is missing, of another size, unreadable or fails its CRC32C. load()
// throws it on every rank together (after agreement), so a resuming run can fall back to an older
// checkpoint (resume_candidates). A checkpoint that is intact but does not match the model throws
// a plain CollectiveError: an older one would not match either.
class DamagedCheckpoint : public CollectiveError {
 public:
  DamagedCheckpoint(std::string dir, const std::string& what) : CollectiveError(ErrorKind::Input, what), dir_(std::move(dir)) {}
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

// Loads a checkpoint saved at any world size and strategy into `kinds` (one tensor per engine unit,
// shaped like its shard on this rank: the engine's masters, the optimizer's state; each rank reads
// only the byte ranges it needs) and returns the stored training state. Validates the manifest,
// checksums of the files it reads, and that the checkpoint's tensors match the engine's units
// (names and shapes); errors name the file / tensor. Collective-free except for error agreement
// (over the engine's shard and replicate groups): an error on any rank throws the same one-line
// error on every rank: DamagedCheckpoint when the checkpoint is damaged, else CollectiveError(Input).
// Every byte of every file is checksummed (CRC32C) before load() returns: each file by one rank of
// the shard group, in the same pass that reads its ranges. On error the engine's shards are
// unspecified: stop the run, or load() another checkpoint (which overwrites every element).
nlohmann::json load(const std::string& ckpt_dir, fsdp::Engine& engine, const std::vector<NamedShards>& kinds);

// ---- offline access (single process, no MPI): inspect, verify, consolidate, other tools ---------
struct TensorEntry {
  std::string name;   // parameter name (Hugging Face name for Llama)
  std::string kind;   // "param", "exp_avg", "exp_avg_sq", ...
  std::string unit;   // FSDP unit it belonged to
  std::vector<int64_t> shape;
  int64_t numel = 0;
  std::string dtype = "F32";  // "F32" (4 bytes per element) or "U8" (1; version 2)
  int elem_bytes = 4;
  int64_t block = 1;  // version 2: element j stands for the parameter's elements [j*block, (j+1)*block)
  struct Slice {
    int file = 0;         // index into Reader::files()
    uint64_t offset = 0;  // byte offset in that file
    int64_t begin = 0;    // first element (row-major) of the tensor held there
    int64_t numel = 0;
    bool has_crc = false;  // the manifest gives the slice's own CRC32C (written since 2026-12)
    uint32_t crc32c = 0;
  };
  std::vector<Slice> slices;  // sorted by begin
};

struct FileEntry {
  std::string name;  // relative to the checkpoint directory
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

// One contiguous byte range of a checkpoint file and where its elements (as stored) go.
struct ReadRequest {
  int file = 0;
  uint64_t offset = 0, bytes = 0;
  void* dst = nullptr;
};

class Reader {
 public:
  // Parses and validates manifest.json: format name and version, structure, every tensor covered
  // exactly once by in-bounds slices, every file present, a regular file (a FIFO or device is
  // refused without being opened for reading) with its recorded size. Error(Input) naming the file
  // / tensor otherwise. Does not read tensor data.
  explicit Reader(const std::string& ckpt_dir);

  const std::string& dir() const { return dir_; }
  const nlohmann::json& manifest() const { return manifest_; }
  const nlohmann::json& state() const { return manifest_.at("state"); }
  int64_t step() const { return manifest_.at("step").get<int64_t>(); }
  const std::vector<FileEntry>& files() const { return files_; }
  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  // nullptr if absent.
  const TensorEntry* find(const std::string& name, const std::string& kind) const;
  std::string file_path(int file) const;

  // Elements [begin, begin + count) of an F32 tensor into dst (pread of the needed ranges only).
  void read(const TensorEntry& t, int64_t begin, int64_t count, float* dst) const;
  // The same for a tensor of any dtype: count x t.elem_bytes bytes as stored.
  void read_raw(const TensorEntry& t, int64_t begin, int64_t count, void* dst) const;
  // The byte ranges holding elements [begin, begin + count) of a tensor, dst filled from `dst` on
  // (t.elem_bytes per element).
  std::vector<ReadRequest> requests(const TensorEntry& t, int64_t begin, int64_t count, void* dst) const;
  // Streams file `file` once: fills the given requests (all in that file) and compares the file's
  // CRC32C with the manifest; Error(Input) naming the file on a mismatch, and the first tensor whose
  // slice there fails its own CRC32C (damaged_slice).
  void stream_file(int file, std::vector<ReadRequest> reqs) const;
  void verify_file(int file) const { stream_file(file, {}); }
  // "tensor NAME (KIND) elements [a, b) at bytes [x, y)": the first slice in `file` whose bytes fail
  // the slice's CRC32C, or "" (slices without a CRC in the manifest are not checked).
  std::string damaged_slice(int file) const;

 private:
  std::string dir_;
  nlohmann::json manifest_;
  std::vector<FileEntry> files_;
  std::vector<TensorEntry> tensors_;
};

struct VerifyReport {
  int64_t files = 0, tensors = 0, bytes = 0;
};
// Reader validation plus every file's checksum. Throws Error(Input) naming the first problem.
VerifyReport verify(const std::string& ckpt_dir);

}  // namespace tessera::checkpoint
