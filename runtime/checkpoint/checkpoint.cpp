// Writing side of sharded checkpoints: Checkpointer (sync and async save, atomic publish,
// keep-last-K) and latest().
//
// One save, on every rank:
//   1. world rank 0 prepares <root>/step-<N>.tmp/ (stale *.tmp from a crash removed); agreement;
//      writers (replicate rank 0) create rank-<shard rank>.bin with all its blocks allocated
//      (fallocate: a full disk fails here, in save(), async or not), and world rank 0 manifest.json
//      with the bytes of its longest text; agreement.
//   2. writers write their file with a running CRC32C (and one per slice), fsync it.
//      sync: from the shards themselves (a GPU's through a host staging buffer of kStagingBytes);
//      async: the shards were copied into a host snapshot in save() and this runs on a background thread.
//   3. agreement on errors (any error removes step-<N>.tmp); file and slice CRCs and sizes summed to
//      every rank (each writer fills its own slots).
//   4. world rank 0 writes manifest.json, fsyncs it and the directory, renames step-<N>.tmp to
//      step-<N> (an existing step-<N> is moved aside first and deleted after), fsyncs the root,
//      points <root>/latest at step-<N>, on the lineage's first save retires newer checkpoints of
//      an abandoned future (begin_lineage), deletes checkpoints beyond `keep`; agreement, so every
//      rank knows the save is complete.
// Steps 1, 3 and 4 use the Checkpointer's own duplicate of the world communicator, so a
// background save never interleaves with the engine's collectives.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <regex>
#include <thread>

#include <sys/stat.h>

#include <ATen/ops/zeros.h>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/io.h"
#include "runtime/checkpoint/layout.h"
#include "runtime/comm/agree.h"
#include "runtime/device/device.h"
#include "runtime/memory/tracker.h"
#include "runtime/profile/phase.h"
#include "util/budgets.h"
#include "util/error.h"
#include "util/file_tree.h"
#include "util/output_file.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace tessera::checkpoint {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// step-<N> -> N, or -1 for any other name (N of at most 18 digits: an int64_t).
int64_t parse_step_dir(const std::string& name) {
  static const std::regex re("step-([0-9]{1,18})");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return -1;
  return std::stoll(m[1].str());
}

std::string step_dir(const std::string& root, int64_t step) {
  return (fs::path(root) / ("step-" + std::to_string(step))).string();
}

constexpr const char* kLatestFile = "latest";
constexpr const char* kRetiredDir = "retired";

std::string latest_tmp_path(const std::string& root) { return (fs::path(root) / kLatestFile).string() + ".tmp"; }
std::string latest_text(const std::string& target) { return target + "\n"; }

// Writes latest's text naming `target` (a step-<N> name under root, or an absolute path) into f,
// <root>/latest.tmp; fsynced and closed. commit_latest() renames it over <root>/latest.
void write_latest_tmp(io::File& f, const std::string& target) {
  const std::string text = latest_text(target);
  f.write_all(text.data(), text.size());
  f.fsync();
  f.close();
}

void commit_latest(const std::string& root) {
  const std::string path = (fs::path(root) / kLatestFile).string(), tmp = latest_tmp_path(root);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw TESSERA_INPUT_ERROR("cannot rename " + tmp + " to " + path + ": " + ec.message());
  io::fsync_dir(root);
}

// `text` as an error message shows it: at most 80 bytes, anything but printable ASCII as '?'.
std::string shown(const std::string& text) {
  std::string out;
  for (char c : text.substr(0, 80)) out += c >= 0x20 && c < 0x7f ? c : '?';
  return "'" + out + (text.size() > 80 ? "'..." : "'");
}

// A step-<N> entry `path` of checkpoint.dir `root` is a directory in it, never a link that leaves
// it (nor a file, FIFO or device): Error(Input) naming it otherwise.
void require_real_step_dir(const std::string& path, const std::string& root) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || S_ISDIR(st.st_mode)) return;  // gone meanwhile: as if never there
  std::string what = util::file_kind(st.st_mode);
  if (S_ISLNK(st.st_mode)) {
    std::error_code ec;
    what += " to " + shown(fs::read_symlink(path, ec).string());
  }
  throw TESSERA_INPUT_ERROR("checkpoint " + path + " is " + what + ", not a directory of checkpoint.dir " + root +
                            ": refused (a checkpoint elsewhere is resumed with --resume DIR)");
}

// The checkpoint <root>/latest names: "" when there is no latest (yet), else <root>/step-<N>.
// latest must be a regular file holding one line "step-<N>" (a step directory of root, checked
// by require_real_step_dir when it exists): an absolute path, a "../" or any other text, a link
// or a FIFO there is Error(Input) naming latest and what it holds, so that a planted or
// downloaded pointer never sends a resume outside checkpoint.dir.
std::string latest_pointer(const std::string& root) {
  const std::string path = (fs::path(root) / kLatestFile).string();
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return "";
  const std::string want = "; it must be one line naming a step-<N> directory of checkpoint.dir " + root;
  if (!S_ISREG(st.st_mode))
    throw TESSERA_INPUT_ERROR(path + " is " + util::file_kind(st.st_mode) + ", not a regular file" + want + ": refused");
  std::string text = io::read_all(path, util::budget::kLatestBytes);
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (parse_step_dir(text) < 0)
    throw TESSERA_INPUT_ERROR(path + " names " + shown(text) + want +
                              ": refused (a checkpoint elsewhere is resumed with --resume DIR)");
  const std::string dir = (fs::path(root) / text).string();
  require_real_step_dir(dir, root);
  return dir;
}

// Atomically points <root>/latest at `target`.
void write_latest(const std::string& root, const std::string& target) {
  io::File f = io::File::create(latest_tmp_path(root));
  write_latest_tmp(f, target);
  commit_latest(root);
}

// Step 1 of a save, on the leader: an empty <tmp> in <root>, leftovers of crashed saves removed.
void prepare_tmp_dir(const std::string& root, const std::string& tmp) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw TESSERA_INPUT_ERROR("cannot create checkpoint directory " + root + ": " + ec.message());
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) == 0 && name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0)
      tessera::util::remove_tree(e.path());
  }
  if (!fs::create_directory(tmp, ec) || ec)
    throw TESSERA_INPUT_ERROR("cannot create " + tmp + ": " + (ec ? ec.message() : "exists"));
}

// Everything one save needs after save() returns (async): no references into the engine.
struct Job {
  int64_t step = 0;
  std::string root, tmp, final_dir;
  int64_t keep = 2;
  int64_t retire_above = -1;  // >= 0: retire step-<K> with K above it (the lineage's first save)
  bool writer = false, leader = false;
  int shard_rank = 0, shard_size = 1;
  std::vector<fsdp::ShardPlan> plans;
  std::vector<std::string> unit_names;
  std::vector<std::string> kinds;
  std::vector<KindLayout> layouts;  // per kind: bytes per stored element, shard elements per value
  std::vector<std::vector<at::Tensor>> data;  // writer: [unit][kind]: the shards (sync) or their host snapshot (async)
  // Pieces (layout.h) of every rank file, numbered rank by rank: rank r's are [piece_base[r],
  // piece_base[r + 1]).
  std::vector<int64_t> piece_base;
  std::shared_ptr<io::File> file;  // writer: its rank file in tmp, blocks allocated (create_file)
  std::shared_ptr<io::File> manifest_file;  // leader: manifest.json in tmp, its largest size allocated
  std::shared_ptr<io::File> latest_file;    // leader: <root>/latest.tmp, its text's bytes allocated
  json manifest;  // leader: everything but the checksums
  std::vector<std::pair<size_t, size_t>> piece_slot;  // leader: piece -> (tensor, slice) in the manifest
};

// Version 2 when a kind is stored as bytes or per block (8-bit optimizer state), else 1: what
// readers before version 2 read stays readable by them.
int format_version_of(const std::vector<KindLayout>& layouts) {
  for (const KindLayout& l : layouts)
    if (l.elem_bytes != 4 || l.block != 1) return kFormatVersion;
  return 1;
}

// The manifest entry of parameter p of unit u, kind k (slices added after): a kind per block holds
// ceil(numel / block) values of the flattened parameter.
json tensor_entry(const Job& job, size_t u, size_t k, const fsdp::ParamSlot& p) {
  const KindLayout& l = job.layouts[k];
  json t = {{"name", p.name}, {"kind", job.kinds[k]}, {"unit", job.unit_names[u]}, {"dtype", l.elem_bytes == 1 ? "U8" : "F32"},
            {"shape", l.block == 1 ? p.shape : std::vector<int64_t>{(p.numel + l.block - 1) / l.block}}};
  if (l.block != 1) t["block"] = l.block;
  t["slices"] = json::array();
  return t;
}

// The manifest of a save (FORMAT.md) but the checksums of files and slices, which publish() adds:
// units, and every tensor with its slices in every rank file. piece_slot: where each piece's slice is.
json manifest_without_checksums(const Job& job, int world_size, fsdp::Strategy strategy, int replicate_size,
                                const json& state, std::vector<std::pair<size_t, size_t>>& piece_slot) {
  json m;
  m["format"] = kFormatName;
  m["format_version"] = format_version_of(job.layouts);
  m["step"] = job.step;
  m["world_size"] = world_size;
  m["strategy"] = fsdp::to_string(strategy);
  m["shard_group_size"] = job.shard_size;
  m["replicate_group_size"] = replicate_size;
  m["align"] = job.plans.empty() ? 1 : job.plans[0].align;
  m["files"] = json::array();
  // Units, then tensors with their slices in every rank file.
  json units = json::array(), tensors = json::array();
  for (size_t u = 0; u < job.plans.size(); ++u) {
    json names = json::array();
    for (const auto& p : job.plans[u].params) names.push_back(p.name);
    units.push_back({{"name", job.unit_names[u]}, {"params", names}});
  }
  // index of (unit, kind, param) in `tensors`
  std::vector<std::vector<std::vector<size_t>>> idx(job.plans.size());
  for (size_t u = 0; u < job.plans.size(); ++u) {
    idx[u].resize(job.kinds.size());
    for (size_t k = 0; k < job.kinds.size(); ++k)
      for (const auto& p : job.plans[u].params) {
        idx[u][k].push_back(tensors.size());
        tensors.push_back(tensor_entry(job, u, k, p));
      }
  }
  piece_slot.clear();
  for (int r = 0; r < job.shard_size; ++r)
    for (const Piece& p : file_layout(job.plans, r, job.layouts)) {
      const size_t t = idx[p.unit][p.kind][p.param];
      piece_slot.emplace_back(t, tensors[t]["slices"].size());
      tensors[t]["slices"].push_back(
          {{"file", rank_file_name(r)}, {"offset", p.byte_offset}, {"begin", p.param_offset}, {"numel", p.length}});
    }
  m["units"] = std::move(units);
  m["tensors"] = std::move(tensors);
  m["state"] = state;
  return m;
}

}  // namespace

struct Checkpointer::Impl {
  comm::CommPtr comm;  // private duplicate of the world communicator
  std::thread worker;
  bool in_flight = false;
  std::string error;  // of the job on the worker
  ErrorKind error_kind = ErrorKind::Input;  // a timeout of the worker's agreement stays a timeout
  SaveTiming timing;  // of the job on the worker
  // Lineage (begin_lineage): the first save after it retires checkpoints above retire_above.
  bool lineage_started = false, retired = false;
  int64_t retire_above = -1;
  // Async host snapshot of the writer's shards, reused across saves (only touched while no job
  // is in flight): copying into memory already mapped is several times faster than a fresh clone.
  std::vector<std::vector<at::Tensor>> snapshot;

  void collect(Job& job, const std::vector<fsdp::UnitShard>& shards, const std::vector<NamedShards>& kinds,
               bool async);
  // Returns the CRC32C of each piece, in layout order.
  void create_file(Job& job);
  std::vector<uint32_t> write_file(const Job& job, uint32_t& crc, uint64_t& bytes);
  void publish(const Job& job, const std::vector<uint32_t>& crcs, const std::vector<uint64_t>& sizes,
               const std::vector<uint32_t>& piece_crcs);
  void retire(const Job& job);
  void prune(const Job& job);
  SaveTiming run(const Job& job);  // steps 2-4, on the caller's thread or the worker
  void fail_if_any(const Job& job, const std::string& wire);
};

// The job's plans and unit names, and on a writer its data: each kind's shards as they are (a
// synchronous save of host shards) or copied into the reused host snapshot.
void Checkpointer::Impl::collect(Job& job, const std::vector<fsdp::UnitShard>& shards,
                                 const std::vector<NamedShards>& kinds, bool async) {
  auto& snap = snapshot;
  if (snap.size() != shards.size()) snap.assign(shards.size(), {});
  for (size_t u = 0; u < shards.size(); ++u) {
    const fsdp::UnitShard& sh = shards[u];
    job.plans.push_back(sh.plan);
    job.unit_names.push_back(sh.name);
    if (!job.writer) continue;
    job.data.emplace_back();
    snap[u].resize(kinds.size());
    for (size_t k = 0; k < kinds.size(); ++k) {
      const at::Tensor& live = kinds[k].per_unit[u];
      TESSERA_CHECK(live.numel() * kinds[k].block == sh.plan.chunk,
                    "checkpoint kind " + kinds[k].kind + " of unit " + sh.name + " is not shaped like its shard");
      // A synchronous save writes the shards as they are, on this thread: host shards from their
      // memory, a GPU's streamed down through write_piece's staging buffer (no snapshot). An async
      // save copies them into the reused host snapshot (pinned for a GPU; the copy waits for the
      // device work that produced them), which its writer thread reads while training goes on.
      if (!async) {
        job.data.back().push_back(live);
        continue;
      }
      at::Tensor& s = snap[u][k];
      if (!s.defined() || s.numel() != live.numel() || s.scalar_type() != live.scalar_type())
        s = device::host_buffer({live.numel()}, live.scalar_type(), live.device());
      s.copy_(live);
      job.data.back().push_back(s);
    }
  }
}

// The complete manifest.json text: the leader's manifest with the checksums and sizes of every file
// and slice.
static std::string manifest_text(const Job& job, const std::vector<uint32_t>& crcs, const std::vector<uint64_t>& sizes,
                                 const std::vector<uint32_t>& piece_crcs) {
  json manifest = job.manifest;
  for (int r = 0; r < job.shard_size; ++r)
    manifest["files"].push_back({{"name", rank_file_name(r)}, {"bytes", sizes[r]}, {"crc32c", crcs[r]}});
  json& tensors = manifest["tensors"];
  for (size_t i = 0; i < job.piece_slot.size(); ++i)
    tensors[job.piece_slot[i].first]["slices"][job.piece_slot[i].second]["crc32c"] = piece_crcs[i];
  return manifest.dump(1) + "\n";
}

// A save that failed for want of space: the error of `what` with the step, the size of the whole
// checkpoint and what stays (the checkpoint latest() names: nothing complete is touched).
static std::string no_space_message(const Job& job, const std::string& what) {
  uint64_t total = 0;
  for (int r = 0; r < job.shard_size; ++r) total += file_bytes(file_layout(job.plans, r, job.layouts));
  std::string kept;
  try {
    kept = latest(job.root);
  } catch (const Error&) {  // a latest that names nothing valid: said when a run resumes
  }
  return "checkpoint step-" + std::to_string(job.step) + " does not fit in checkpoint.dir " + job.root + ": " + what +
         "; the whole checkpoint needs " + std::to_string(total) + " bytes; " +
         (kept.empty() ? std::string("there is no earlier checkpoint") : "the previous checkpoint " + kept + " is kept");
}

// The writer's rank file with all its blocks allocated: a full disk fails here, naming the bytes,
// not halfway through the data (and, called by save(), before an async save returns).
// The leader's manifest.json too, with the bytes of its longest text (every checksum and size at
// its most digits), and <root>/latest.tmp with its text's: once save() returns, no write of the
// save needs a block it does not hold (a disk filled by someone else meanwhile cannot fail it).
void Checkpointer::Impl::create_file(Job& job) {
  const std::string path = (fs::path(job.tmp) / rank_file_name(job.shard_rank)).string();
  job.file = std::make_shared<io::File>(io::File::create(path));
  try {
    job.file->reserve(file_bytes(file_layout(job.plans, job.shard_rank, job.layouts)));
    if (!job.leader) return;
    job.manifest_file = std::make_shared<io::File>(io::File::create((fs::path(job.tmp) / "manifest.json").string()));
    const size_t pieces = static_cast<size_t>(job.piece_base.back());
    job.manifest_file->reserve(manifest_text(job, std::vector<uint32_t>(job.shard_size, UINT32_MAX),
                                             std::vector<uint64_t>(job.shard_size, UINT64_MAX),
                                             std::vector<uint32_t>(pieces, UINT32_MAX)).size());
    job.latest_file = std::make_shared<io::File>(io::File::create(latest_tmp_path(job.root)));
    job.latest_file->reserve(latest_text(fs::path(job.final_dir).filename().string()).size());
  } catch (const Error& e) {
    throw TESSERA_INPUT_ERROR(no_space_message(job, e.what()));
  }
}

// One piece's bytes as the file stores them (F32, or U8 for 8-bit state). A host tensor already
// in that dtype is written from its own memory; anything else goes through one host staging
// buffer of kStagingBytes, a block at a time: a kind kept in bf16 (widened to fp32 there), and a
// shard on a GPU (a synchronous save streams it down block by block instead of taking a snapshot).
static void write_piece(io::ChecksumWriter& w, const at::Tensor& t, const Piece& p, at::Tensor& staging) {
  const at::ScalarType stored = t.scalar_type() == at::kByte ? at::kByte : at::kFloat;
  const int64_t elem = static_cast<int64_t>(c10::elementSize(stored));
  if (t.is_cpu() && t.scalar_type() == stored) {
    w.write(static_cast<const char*>(t.data_ptr()) + p.shard_offset * elem, static_cast<size_t>(p.length * elem));
    return;
  }
  if (!staging.defined()) staging = device::host_buffer({kStagingBytes}, at::kByte, t.device());
  const at::Tensor block = staging.view(stored);
  for (int64_t b = 0; b < p.length; b += block.numel()) {
    const int64_t n = std::min(block.numel(), p.length - b);
    block.narrow(0, 0, n).copy_(t.narrow(0, p.shard_offset + b, n));  // waits for the device
    w.write(block.data_ptr(), static_cast<size_t>(n * elem));
  }
}

std::vector<uint32_t> Checkpointer::Impl::write_file(const Job& job, uint32_t& crc, uint64_t& bytes) {
  const std::vector<Piece> layout = file_layout(job.plans, job.shard_rank, job.layouts);
  io::File& f = *job.file;
  io::ChecksumWriter w(f);
  std::vector<uint32_t> piece_crcs;
  at::Tensor staging;  // host, pinned for a GPU; charged to the checkpoint category (save()'s scope)
  for (const Piece& p : layout) {
    w.start_piece();
    write_piece(w, job.data[p.unit][p.kind], p, staging);
    piece_crcs.push_back(w.piece_crc());
  }
  w.flush();
  f.fsync();
  f.close();
  crc = w.crc();
  bytes = w.bytes();
  return piece_crcs;
}

void Checkpointer::Impl::publish(const Job& job, const std::vector<uint32_t>& crcs, const std::vector<uint64_t>& sizes,
                                 const std::vector<uint32_t>& piece_crcs) {
  {
    io::File& f = *job.manifest_file;
    const std::string text = manifest_text(job, crcs, sizes, piece_crcs);
    f.write_all(text.data(), text.size());
    f.truncate(text.size());  // what reserve() allocated beyond the text
    f.fsync();
    f.close();
  }
  io::fsync_dir(job.tmp);
  // latest.tmp, into the blocks create_file() allocated: renamed over latest once step-<N> is in place.
  write_latest_tmp(*job.latest_file, fs::path(job.final_dir).filename().string());
  // The new checkpoint is complete (under its .tmp name): on the lineage's first save, newer
  // checkpoints of an abandoned run (a step-<N> of the same number included) move to retired/.
  retire(job);
  // Publish. If step-<N> exists (a run resumed from an earlier step), it is moved aside first: a
  // crash in between leaves the previous checkpoints, never a half one under a step-<N> name.
  std::error_code ec;
  const std::string old = job.final_dir + ".old";
  if (fs::exists(fs::symlink_status(job.final_dir, ec))) {  // a link there is moved aside and removed, never followed
    tessera::util::remove_tree(old, ec);
    fs::rename(job.final_dir, old, ec);
    if (ec) throw TESSERA_INPUT_ERROR("cannot move aside " + job.final_dir + ": " + ec.message());
  }
  fs::rename(job.tmp, job.final_dir, ec);
  if (ec) throw TESSERA_INPUT_ERROR("cannot rename " + job.tmp + " to " + job.final_dir + ": " + ec.message());
  io::fsync_dir(job.root);
  tessera::util::remove_tree(old, ec);
  commit_latest(job.root);
  prune(job);
}

void Checkpointer::Impl::retire(const Job& job) {
  if (job.retire_above < 0) return;
  std::error_code ec;
  std::vector<int64_t> newer;
  for (const auto& e : fs::directory_iterator(job.root, ec)) {
    const int64_t s = parse_step_dir(e.path().filename().string());
    if (s > job.retire_above) newer.push_back(s);
  }
  if (newer.empty()) return;
  const fs::path retired = fs::path(job.root) / kRetiredDir;
  struct stat st {};
  if (::lstat(retired.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))  // a link would move them wherever it points
    throw TESSERA_INPUT_ERROR("cannot retire checkpoints to " + retired.string() + ": it is " +
                              util::file_kind(st.st_mode) + ", not a directory of checkpoint.dir " + job.root);
  fs::create_directories(retired, ec);
  if (ec) throw TESSERA_INPUT_ERROR("cannot create " + retired.string() + ": " + ec.message());
  std::sort(newer.begin(), newer.end());
  std::string names;
  for (int64_t s : newer) {
    const std::string name = "step-" + std::to_string(s);
    fs::path dst = retired / name;
    for (int k = 2; fs::exists(fs::symlink_status(dst, ec)); ++k) dst = retired / (name + "." + std::to_string(k));
    fs::rename(step_dir(job.root, s), dst, ec);
    if (ec) throw TESSERA_INPUT_ERROR("cannot retire " + step_dir(job.root, s) + " to " + dst.string() + ": " + ec.message());
    names += (names.empty() ? "" : ", ") + name;
  }
  io::fsync_dir(retired.string());
  io::fsync_dir(job.root);
  std::cerr << "tessera: checkpoint step-" << job.step << " continues a run started at step " << job.retire_above
            << "; checkpoints of the run it replaces moved to " << retired.string() << ": " << names << std::endl;
}

void Checkpointer::Impl::prune(const Job& job) {
  if (job.keep <= 0) return;
  // The checkpoint the training state names as the best on validation (checkpoint.keep_best) stays
  // beside the last `keep`.
  const json* best = job.manifest.contains("state") ? &job.manifest["state"] : nullptr;
  const int64_t best_step = best && best->contains("best") ? best->at("best").at("step").get<int64_t>() : -1;
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(job.root, ec)) {
    const int64_t s = parse_step_dir(e.path().filename().string());
    if (s >= 0 && s != job.step && s != best_step) steps.push_back(s);
  }
  // The checkpoint just written always stays; the newest keep-1 others stay with it.
  std::sort(steps.rbegin(), steps.rend());
  for (size_t i = static_cast<size_t>(job.keep - 1); i < steps.size(); ++i)
    tessera::util::remove_tree(step_dir(job.root, steps[i]), ec);
}

// throw_if_any over the checkpoint's communicator; on an error the leader first removes the save's
// step-<N>.tmp and latest.tmp (their partial files would hold the space a full disk needs; complete
// checkpoints and latest are untouched: publish() renames only once everything is written).
void Checkpointer::Impl::fail_if_any(const Job& job, const std::string& wire) {
  const auto agreed = agree_on_error(*comm, wire);
  if (!agreed) return;
  if (job.leader) {
    std::error_code ec;
    tessera::util::remove_tree(job.tmp, ec);
    if (job.latest_file) fs::remove(latest_tmp_path(job.root), ec);
  }
  throw CollectiveError(agreed->kind, agreed->message);
}

SaveTiming Checkpointer::Impl::run(const Job& job) {
  const auto t0 = std::chrono::steady_clock::now();
  SaveTiming t;
  uint32_t crc = 0;
  uint64_t bytes = 0;
  std::vector<uint32_t> mine;  // this writer's piece checksums
  fail_if_any(job, capture_error([&] {
    if (job.writer) mine = write_file(job, crc, bytes);
  }));

  // Every writer's file CRC and size in its shard-rank slot, and its pieces' CRCs in theirs
  // (replicas contribute zeros).
  const int S = job.shard_size;
  const int64_t pieces = job.piece_base[S];
  at::Tensor info = at::zeros({2 * S + pieces}, at::TensorOptions().dtype(at::kLong));
  int64_t* p = info.data_ptr<int64_t>();
  if (job.writer) {
    p[job.shard_rank] = static_cast<int64_t>(crc);
    p[S + job.shard_rank] = static_cast<int64_t>(bytes);
    for (size_t i = 0; i < mine.size(); ++i) p[2 * S + job.piece_base[job.shard_rank] + i] = mine[i];
  }
  comm->all_reduce(info, comm::ReduceOp::Sum)->wait();
  std::string error;
  if (job.leader) {
    std::vector<uint32_t> crcs(S), piece_crcs(pieces);
    std::vector<uint64_t> sizes(S);
    p = info.data_ptr<int64_t>();
    for (int r = 0; r < S; ++r) {
      crcs[r] = static_cast<uint32_t>(p[r]);
      sizes[r] = static_cast<uint64_t>(p[S + r]);
    }
    for (int64_t i = 0; i < pieces; ++i) piece_crcs[i] = static_cast<uint32_t>(p[2 * S + i]);
    error = capture_error([&] { publish(job, crcs, sizes, piece_crcs); });
  }
  fail_if_any(job, error);
  t.write_s = seconds_since(t0);
  t.bytes = static_cast<int64_t>(bytes);
  t.dir = job.final_dir;
  return t;
}

Checkpointer::Checkpointer(const Policy& policy, const comm::ProcessGroups& groups)
    : root_(policy.dir), opts_(policy), groups_(groups), impl_(std::make_unique<Impl>()) {
  TESSERA_CHECK_INPUT(!root_.empty(), "checkpoint.dir is empty");
  impl_->comm = groups_.world->host_duplicate("checkpoint");
}

Checkpointer::~Checkpointer() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::cerr << "tessera: asynchronous checkpoint failed: " << e.what() << std::endl;
  }
}

SaveTiming Checkpointer::wait() {
  if (!impl_->in_flight) return {};
  impl_->worker.join();
  impl_->in_flight = false;
  SaveTiming t = impl_->timing;
  const std::string error = impl_->error;
  impl_->timing = {};
  impl_->error.clear();
  if (!error.empty()) throw Error(impl_->error_kind, error, __FILE__, __LINE__);
  return t;
}

SaveTiming Checkpointer::save(int64_t step, fsdp::Engine& engine, const std::vector<NamedShards>& kinds,
                              const json& state) {
  memory::Scope memory_scope(memory::Category::Checkpoint);
  const auto t0 = std::chrono::steady_clock::now();
  TESSERA_CHECK_INPUT(step >= 0, "checkpoint step must be >= 0, got " + std::to_string(step));
  wait();  // the previous async save (rethrows its error)

  Job job;
  job.step = step;
  job.root = root_;
  job.final_dir = step_dir(root_, step);
  job.tmp = job.final_dir + ".tmp";
  job.keep = opts_.keep;
  if (impl_->lineage_started && !impl_->retired) {
    job.retire_above = impl_->retire_above;
    impl_->retired = true;  // an error of this save ends the run; the next run starts a lineage again
  }
  job.leader = impl_->comm->rank() == 0;
  job.writer = engine.replicate_group().rank() == 0;
  job.shard_rank = engine.shard_group().rank();
  job.shard_size = engine.shard_group().size();
  TESSERA_CHECK(!job.leader || job.writer, "world rank 0 must hold replicate rank 0");

  // Step 1: the leader prepares an empty step-<N>.tmp (removing leftovers of crashed saves).
  throw_if_any(*impl_->comm, capture_error([&] {
    if (job.leader) prepare_tmp_dir(root_, job.tmp);
  }));

  const auto& shards = engine.shards();
  for (const NamedShards& k : kinds) {
    TESSERA_CHECK(k.per_unit.size() == shards.size(), "checkpoint kind " + k.kind + " has a tensor per unit");
    job.kinds.push_back(k.kind);
    const bool bytes = !k.per_unit.empty() && k.per_unit[0].scalar_type() == at::kByte;
    job.layouts.push_back({bytes ? 1 : 4, k.block});
    // Per-block kinds need every shard and parameter at a multiple of the block (named here, once).
    if (k.block != 1 && !shards.empty()) block_plan(shards[0].plan, k.block, k.kind);
  }
  impl_->collect(job, shards, kinds, opts_.async);
  job.piece_base.assign(1, 0);
  for (int r = 0; r < job.shard_size; ++r)
    job.piece_base.push_back(job.piece_base.back() +
                             static_cast<int64_t>(file_layout(job.plans, r, job.layouts).size()));
  if (job.leader)
    job.manifest = manifest_without_checksums(job, groups_.world->size(), engine.options().strategy,
                                              engine.replicate_group().size(), state, job.piece_slot);
  // Step 1b, on the caller's thread for async saves too: each writer's file with its blocks allocated,
  // so a full disk stops the run at the step that saves, not one checkpoint interval later.
  impl_->fail_if_any(job, capture_error([&] {
    if (job.writer) impl_->create_file(job);
  }));

  if (!opts_.async) {
    SaveTiming t = impl_->run(job);
    t.blocked_s = seconds_since(t0);
    return t;
  }
  impl_->in_flight = true;
  const double blocked = seconds_since(t0);
  impl_->worker = std::thread([this, job = std::move(job), blocked]() {
    profile::Phase context = profile::Phase::activity_of_thread(job.step, "checkpoint save (async)");
    try {
      impl_->timing = impl_->run(job);
      impl_->timing.blocked_s = blocked;
    } catch (const std::exception& e) {
      impl_->error = e.what();
      const auto* te = dynamic_cast<const Error*>(&e);
      impl_->error_kind = te ? te->kind() : ErrorKind::Input;
    }
  });
  SaveTiming t;
  t.blocked_s = blocked;
  return t;
}

void Checkpointer::begin_lineage(int64_t start_step, const std::string& resumed_from) {
  TESSERA_CHECK_INPUT(start_step >= 0, "lineage start step must be >= 0, got " + std::to_string(start_step));
  wait();
  impl_->lineage_started = true;
  impl_->retired = false;
  impl_->retire_above = start_step;
  if (resumed_from.empty()) return;
  throw_if_any(*impl_->comm, capture_error([&] {
    if (impl_->comm->rank() != 0) return;
    std::error_code ec;
    fs::create_directories(root_, ec);
    const fs::path from = fs::weakly_canonical(fs::absolute(resumed_from), ec);
    const fs::path root = fs::weakly_canonical(fs::absolute(root_), ec);
    write_latest(root_, from.parent_path() == root ? from.filename().string() : from.string());
  }));
}

std::string latest(const std::string& root_dir) {
  std::error_code ec;
  const std::string named = latest_pointer(root_dir);
  if (!named.empty() && fs::exists(fs::path(named) / "manifest.json", ec)) return named;
  const std::vector<std::string> complete = complete_checkpoints(root_dir);
  return complete.empty() ? "" : complete.back();
}

std::vector<std::string> resume_candidates(const std::string& root_dir) {
  const std::string first = latest(root_dir);
  if (first.empty()) return {};
  const int64_t step = parse_step_dir(fs::path(first).filename().string());  // always a step-<N> of root_dir
  std::vector<std::string> out{first};
  const std::vector<std::string> complete = complete_checkpoints(root_dir);
  for (auto it = complete.rbegin(); it != complete.rend(); ++it)
    if (parse_step_dir(fs::path(*it).filename().string()) < step) out.push_back(*it);
  return out;
}

std::vector<std::string> complete_checkpoints(const std::string& root_dir) {
  std::error_code ec;
  std::vector<int64_t> steps;
  for (const auto& e : fs::directory_iterator(root_dir, ec)) {
    const int64_t s = parse_step_dir(e.path().filename().string());
    if (s < 0) continue;
    require_real_step_dir(e.path().string(), root_dir);
    if (fs::exists(e.path() / "manifest.json", ec)) steps.push_back(s);
  }
  std::sort(steps.begin(), steps.end());
  std::vector<std::string> out;
  for (int64_t s : steps) out.push_back(step_dir(root_dir, s));
  return out;
}

}  // namespace tessera::checkpoint
