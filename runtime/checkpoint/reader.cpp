// Reading side of sharded checkpoints: manifest validation (Reader), verify(), and load() with
// resharding. The manifest stores tensor slices in element coordinates of the row-major parameter,
// so any world size reads any other: a rank intersects its shard's parameter ranges with the
// stored slices and preads exactly those bytes.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>

#include <ATen/ops/empty.h>
#include <unistd.h>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/crc32c.h"
#include "runtime/checkpoint/io.h"
#include "runtime/checkpoint/layout.h"
#include "runtime/comm/agree.h"
#include "runtime/device/device.h"
#include "runtime/memory/tracker.h"
#include "util/error.h"
#include "util/file_tree.h"
#include "util/json.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace tessera::checkpoint {

namespace {

constexpr size_t kStreamBlock = 8u << 20;

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

std::string tensor_label(const TensorEntry& t) {
  return t.kind == "param" ? t.name : t.name + " (" + t.kind + ")";
}

// Integer field `key` of a manifest object, checked to be an integer in [lo, hi]. nlohmann's get<>
// would convert 1e300 to an integer (undefined behaviour) and wrap 2^64-1 to -1 (found by fuzzing).
int64_t manifest_int(const json& v, const std::string& key, int64_t lo, int64_t hi, const std::string& mpath) {
  if (!v.is_number_integer() || (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(hi)
                                                        : v.get<int64_t>() < lo || v.get<int64_t>() > hi))
    throw TESSERA_INPUT_ERROR("manifest " + mpath + ": \"" + key + "\" must be an integer in [" + std::to_string(lo) +
                              ", " + std::to_string(hi) + "], got " + v.dump());
  return v.get<int64_t>();
}

// One entry of a tensor's "slices", checked against the files listed before it.
// A tensor's dtype (F32; version 2 also U8) and block (version 2; 1 when absent).
void parse_encoding(const json& tj, TensorEntry& t, int64_t version, const std::string& mpath) {
  t.dtype = tj.at("dtype").get<std::string>();
  if (t.dtype != "F32" && !(version >= 2 && t.dtype == "U8"))
    throw TESSERA_INPUT_ERROR("manifest " + mpath + ": tensor " + t.name + " has dtype " + tj.at("dtype").dump() +
                              (version >= 2 ? " (F32 and U8 are defined in version 2)" : " (only F32 is defined in version 1)"));
  t.elem_bytes = t.dtype == "U8" ? 1 : 4;
  if (tj.contains("block")) {
    if (version < 2) throw TESSERA_INPUT_ERROR("manifest " + mpath + ": tensor " + t.name + " has a \"block\" (version 2 only)");
    t.block = manifest_int(tj.at("block"), "block", 1, int64_t(1) << 30, mpath);
  }
}

TensorEntry::Slice parse_slice(const json& sj, const TensorEntry& t, const std::map<std::string, int>& file_index,
                               const std::vector<FileEntry>& files, const std::string& mpath) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  TensorEntry::Slice s;
  const std::string fname = sj.at("file").get<std::string>();
  auto it = file_index.find(fname);
  if (it == file_index.end())
    throw TESSERA_INPUT_ERROR("manifest " + mpath + ": tensor " + tensor_label(t) + " refers to unlisted file " + fname);
  s.file = it->second;
  s.offset = static_cast<uint64_t>(manifest_int(sj.at("offset"), "offset", 0, kMax, mpath));
  s.begin = manifest_int(sj.at("begin"), "begin", 0, kMax, mpath);
  s.numel = manifest_int(sj.at("numel"), "numel", 1, kMax, mpath);
  if (sj.contains("crc32c")) {
    s.has_crc = true;
    s.crc32c = static_cast<uint32_t>(manifest_int(sj.at("crc32c"), "crc32c", 0, std::numeric_limits<uint32_t>::max(), mpath));
  }
  const uint64_t file_bytes = files[s.file].bytes;  // offset + 4 numel could wrap around 2^64
  if (s.offset > file_bytes || static_cast<uint64_t>(s.numel) > (file_bytes - s.offset) / static_cast<uint64_t>(t.elem_bytes))
    throw TESSERA_INPUT_ERROR("manifest " + mpath + ": tensor " + tensor_label(t) + " has a slice outside file " + fname);
  return s;
}

}  // namespace

// ---- Reader ------------------------------------------------------------------------------------

Reader::Reader(const std::string& ckpt_dir) : dir_(ckpt_dir) {
  const std::string mpath = (fs::path(dir_) / "manifest.json").string();
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) throw TESSERA_INPUT_ERROR("checkpoint " + dir_ + " does not exist or is not a directory");
  if (!fs::exists(fs::symlink_status(mpath, ec)))
    throw TESSERA_INPUT_ERROR("checkpoint " + dir_ + " is not complete: " + mpath + " is missing");
  const std::string text = io::read_all(mpath, std::numeric_limits<uint64_t>::max());  // a FIFO or device: refused
  try {
    manifest_ = util::parse_json(text);
  } catch (const json::exception& e) {
    throw TESSERA_INPUT_ERROR("malformed manifest " + mpath + ": " + e.what());
  }
  try {
    if (!manifest_.is_object() || manifest_.value("format", "") != kFormatName)
      throw TESSERA_INPUT_ERROR("manifest " + mpath + " is not a " + kFormatName + " manifest (key \"format\")");
    const json& ver = manifest_.at("format_version");
    if (!ver.is_number_integer() || ver.get<int64_t>() < 1 || ver.get<int64_t>() > kFormatVersion)
      throw TESSERA_INPUT_ERROR("manifest " + mpath + " has unknown format_version " + ver.dump() +
                                " (this build reads versions 1 to " + std::to_string(kFormatVersion) + ")");
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    manifest_int(manifest_.at("step"), "step", 0, kMax, mpath);
    for (const char* key : {"world_size", "shard_group_size", "replicate_group_size"})  // read as int
      if (manifest_.contains(key)) manifest_int(manifest_[key], key, 1, std::numeric_limits<int>::max(), mpath);
    manifest_.at("state");

    std::map<std::string, int> file_index;
    for (const json& f : manifest_.at("files")) {
      FileEntry fe{f.at("name").get<std::string>(), static_cast<uint64_t>(manifest_int(f.at("bytes"), "bytes", 0, kMax, mpath)),
                   static_cast<uint32_t>(manifest_int(f.at("crc32c"), "crc32c", 0, std::numeric_limits<uint32_t>::max(), mpath))};
      const std::string path = (fs::path(dir_) / fe.name).string();
      if (fe.name.find('/') != std::string::npos || fe.name.empty() || fe.name[0] == '.')
        throw TESSERA_INPUT_ERROR("manifest " + mpath + " lists an invalid file name \"" + fe.name + "\"");
      if (!fs::exists(path, ec))
        throw TESSERA_INPUT_ERROR("checkpoint file " + path + " is missing (listed in " + mpath + ")");
      const std::string special = util::not_regular_file(path, "checkpoint file");
      if (!special.empty()) throw TESSERA_INPUT_ERROR(special + " (listed in " + mpath + ")");
      const uint64_t size = fs::file_size(path, ec);
      if (ec || size != fe.bytes)
        throw TESSERA_INPUT_ERROR("checkpoint file " + path + " has " + std::to_string(size) + " bytes, manifest says " +
                                  std::to_string(fe.bytes) + " (truncated or replaced)");
      file_index[fe.name] = static_cast<int>(files_.size());
      files_.push_back(std::move(fe));
    }

    for (const json& tj : manifest_.at("tensors")) {
      TensorEntry t;
      t.name = tj.at("name").get<std::string>();
      t.kind = tj.at("kind").get<std::string>();
      t.unit = tj.value("unit", "");
      for (const json& d : tj.at("shape").get<std::vector<json>>()) t.shape.push_back(manifest_int(d, "shape", 0, kMax, mpath));
      parse_encoding(tj, t, ver.get<int64_t>(), mpath);
      t.numel = 1;
      for (int64_t d : t.shape) {
        if (d != 0 && t.numel > kMax / d)  // the elements must fit in int64 (found by fuzzing: signed overflow)
          throw TESSERA_INPUT_ERROR("manifest " + mpath + ": tensor " + t.name + " has shape " + shape_str(t.shape) +
                                    " with more than 2^63 elements");
        t.numel *= d;
      }
      for (const json& sj : tj.at("slices")) t.slices.push_back(parse_slice(sj, t, file_index, files_, mpath));
      // Every element stored exactly once.
      std::sort(t.slices.begin(), t.slices.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
      int64_t cursor = 0;
      for (const auto& s : t.slices) {
        if (s.begin != cursor)
          throw TESSERA_INPUT_ERROR("manifest " + mpath + ": tensor " + tensor_label(t) + " elements [" +
                                    std::to_string(std::min(cursor, s.begin)) + ", " + std::to_string(std::max(cursor, s.begin)) +
                                    (s.begin > cursor ? ") are not stored" : ") are stored twice"));
        cursor = s.begin + s.numel;
      }
      if (cursor != t.numel)
        throw TESSERA_INPUT_ERROR("manifest " + mpath + ": tensor " + tensor_label(t) + " stores " + std::to_string(cursor) +
                                  " of " + std::to_string(t.numel) + " elements");
      if (find(t.name, t.kind))
        throw TESSERA_INPUT_ERROR("manifest " + mpath + ": tensor " + tensor_label(t) + " is listed twice");
      tensors_.push_back(std::move(t));
    }
  } catch (const json::exception& e) {
    throw TESSERA_INPUT_ERROR("malformed manifest " + mpath + ": " + e.what());
  }
}

const TensorEntry* Reader::find(const std::string& name, const std::string& kind) const {
  for (const auto& t : tensors_)
    if (t.name == name && t.kind == kind) return &t;
  return nullptr;
}

std::string Reader::file_path(int file) const { return (fs::path(dir_) / files_.at(file).name).string(); }

std::vector<ReadRequest> Reader::requests(const TensorEntry& t, int64_t begin, int64_t count, void* dst) const {
  TESSERA_CHECK(begin >= 0 && count >= 0 && begin + count <= t.numel, "read range out of bounds for " + t.name);
  std::vector<ReadRequest> out;
  const int64_t end = begin + count;
  // First slice whose end is past `begin` (slices are sorted and contiguous).
  auto it = std::upper_bound(t.slices.begin(), t.slices.end(), begin,
                             [](int64_t v, const TensorEntry::Slice& s) { return v < s.begin + s.numel; });
  for (; it != t.slices.end() && it->begin < end; ++it) {
    const int64_t lo = std::max(begin, it->begin), hi = std::min(end, it->begin + it->numel);
    const uint64_t e = static_cast<uint64_t>(t.elem_bytes);
    out.push_back({it->file, it->offset + static_cast<uint64_t>(lo - it->begin) * e, static_cast<uint64_t>(hi - lo) * e,
                   static_cast<char*>(dst) + static_cast<uint64_t>(lo - begin) * e});
  }
  return out;
}

void Reader::read(const TensorEntry& t, int64_t begin, int64_t count, float* dst) const {
  TESSERA_CHECK(t.dtype == "F32", "tensor " + tensor_label(t) + " is stored as " + t.dtype + ", not F32");
  read_raw(t, begin, count, dst);
}

void Reader::read_raw(const TensorEntry& t, int64_t begin, int64_t count, void* dst) const {
  std::map<int, io::File> open;
  for (const auto& r : requests(t, begin, count, dst)) {
    auto it = open.find(r.file);
    if (it == open.end()) it = open.emplace(r.file, io::File::open_read(file_path(r.file))).first;
    it->second.pread_all(r.dst, r.bytes, r.offset);
  }
}

void Reader::stream_file(int file, std::vector<ReadRequest> reqs) const {
  // One sequential pass over the whole file: requested ranges are read straight into their
  // destinations, the bytes between them into a scratch block, and the CRC is computed on each
  // piece right after it was read (while it is in cache).
  std::sort(reqs.begin(), reqs.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  io::File f = io::File::open_read(file_path(file));
  const uint64_t size = files_.at(file).bytes;
  std::vector<char> scratch;
  uint32_t crc = 0;
  uint64_t pos = 0;
  auto read_to = [&](char* dst, uint64_t n) {  // n bytes at pos into dst, in blocks
    for (uint64_t done = 0; done < n;) {
      const size_t k = static_cast<size_t>(std::min<uint64_t>(kStreamBlock, n - done));
      f.pread_all(dst + done, k, pos);
      crc = crc32c(dst + done, k, crc);
      done += k;
      pos += k;
    }
  };
  auto skip_to = [&](uint64_t end) {  // bytes nobody asked for: checksum only
    if (pos < end && scratch.empty()) scratch.resize(kStreamBlock);
    while (pos < end) read_to(scratch.data(), std::min<uint64_t>(kStreamBlock, end - pos));
  };
  for (const auto& r : reqs) {
    if (r.offset < pos)  // two tensors' slices share bytes: a bad manifest, not a Tessera bug (found by fuzzing)
      throw TESSERA_INPUT_ERROR("checkpoint file " + file_path(file) + ": bytes from " + std::to_string(r.offset) +
                                " belong to two tensor slices in the manifest");
    skip_to(r.offset);
    read_to(reinterpret_cast<char*>(r.dst), r.bytes);
  }
  skip_to(size);
  char extra;
  if (::pread(f.fd(), &extra, 1, static_cast<off_t>(pos)) > 0)
    throw TESSERA_INPUT_ERROR("checkpoint file " + file_path(file) + " is longer than the manifest says (" +
                              std::to_string(size) + " bytes)");
  const FileEntry& fe = files_.at(file);
  if (crc != fe.crc32c) {
    char got[16], want[16];
    std::snprintf(got, sizeof got, "%08x", crc);
    std::snprintf(want, sizeof want, "%08x", fe.crc32c);
    const std::string where = damaged_slice(file);
    throw TESSERA_INPUT_ERROR("checksum mismatch in checkpoint file " + file_path(file) + ": crc32c " + got +
                              ", manifest says " + want + " (file corrupted" +
                              (where.empty() ? std::string(")") : "; " + where + " differ from what was saved)"));
  }
}

std::string Reader::damaged_slice(int file) const {
  io::File f = io::File::open_read(file_path(file));
  std::vector<char> buf;
  for (const TensorEntry& t : tensors_)
    for (const TensorEntry::Slice& s : t.slices) {
      if (s.file != file || !s.has_crc) continue;
      uint32_t crc = 0;
      const uint64_t bytes = static_cast<uint64_t>(s.numel) * static_cast<uint64_t>(t.elem_bytes);
      for (uint64_t done = 0; done < bytes;) {
        const size_t k = static_cast<size_t>(std::min<uint64_t>(kStreamBlock, bytes - done));
        buf.resize(k);
        f.pread_all(buf.data(), k, s.offset + done);
        crc = crc32c(buf.data(), k, crc);
        done += k;
      }
      if (crc != s.crc32c)
        return "tensor " + tensor_label(t) + " elements [" + std::to_string(s.begin) + ", " +
               std::to_string(s.begin + s.numel) + ") at bytes [" + std::to_string(s.offset) + ", " +
               std::to_string(s.offset + bytes) + ")";
    }
  return "";
}

VerifyReport verify(const std::string& ckpt_dir) {
  Reader r(ckpt_dir);
  VerifyReport rep;
  // Every byte of every file belongs to exactly one tensor slice (nothing unaccounted for).
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges(r.files().size());
  for (const auto& t : r.tensors())
    for (const auto& s : t.slices)
      ranges[s.file].push_back({s.offset, s.offset + static_cast<uint64_t>(s.numel) * static_cast<uint64_t>(t.elem_bytes)});
  for (size_t f = 0; f < ranges.size(); ++f) {
    auto& rs = ranges[f];
    std::sort(rs.begin(), rs.end());
    uint64_t cursor = 0;
    for (const auto& [lo, hi] : rs) {
      if (lo != cursor)
        throw TESSERA_INPUT_ERROR("checkpoint file " + r.file_path(static_cast<int>(f)) + ": bytes [" +
                                  std::to_string(std::min(lo, cursor)) + ", " + std::to_string(std::max(lo, cursor)) +
                                  (lo > cursor ? ") belong to no tensor" : ") belong to two tensor slices"));
      cursor = hi;
    }
    if (cursor != r.files()[f].bytes)
      throw TESSERA_INPUT_ERROR("checkpoint file " + r.file_path(static_cast<int>(f)) + ": bytes from " +
                                std::to_string(cursor) + " on belong to no tensor");
    r.verify_file(static_cast<int>(f));
    rep.bytes += static_cast<int64_t>(r.files()[f].bytes);
  }
  rep.files = static_cast<int64_t>(r.files().size());
  rep.tensors = static_cast<int64_t>(r.tensors().size());
  return rep;
}

// ---- load ----------------------------------------------------------------------------------------

namespace {

// Same error on every rank of the engine's world (shard group, then replicate group: together they
// span every data-parallel rank). `damaged`: the error says the checkpoint in `dir` cannot be read
// as saved (DamagedCheckpoint), else it is a plain CollectiveError.
void agree(fsdp::Engine& engine, const std::string& wire, const std::string& dir = "", bool damaged = false) {
  const auto in_shard = agree_on_error(engine.shard_group(), wire);
  const auto agreed = agree_on_error(engine.replicate_group(), in_shard ? encode_error(in_shard->kind, in_shard->message) : "");
  if (!agreed) return;
  if (damaged && agreed->kind == ErrorKind::Input) throw DamagedCheckpoint(dir, agreed->message);
  throw CollectiveError(agreed->kind, agreed->message);
}

// Kind k of parameter `name` is not in the checkpoint. When the checkpoint holds other kinds of it,
// they are named: an optimizer state of another kind (optim.state_dtype) is the usual cause.
std::string missing_message(const Reader& r, const std::string& name, const std::string& kind) {
  std::string held;
  for (const auto& t : r.tensors())
    if (t.name == name) held += (held.empty() ? "" : ", ") + t.kind;
  std::string msg = "checkpoint " + r.dir() + " does not match the model: tensor " + name +
                    (kind == kParamKind ? "" : " (" + kind + ")") + " is missing";
  if (held.empty() || kind == kParamKind) return msg;
  return msg + "; the checkpoint holds " + held + " for it" +
         (kind.rfind("exp_avg", 0) == 0 ? " (AdamW moments of another optim.state_dtype: fp32 and bf16 keep exp_avg, "
                                          "exp_avg_sq; int8 keeps exp_avg.q8, exp_avg.absmax, exp_avg_sq.q8, "
                                          "exp_avg_sq.absmax); resume with the optim.state_dtype it was saved with"
                                        : "");
}

// What the checkpoint must hold for parameter p and kind k: the tensor, its shape (ceil(numel /
// block) values for a kind per block), its block and its dtype (U8 for a kind of bytes, else F32).
void check_tensor(const Reader& r, const fsdp::ParamSlot& p, const NamedShards& k) {
  const TensorEntry* t = r.find(p.name, k.kind);
  if (!t) throw TESSERA_INPUT_ERROR(missing_message(r, p.name, k.kind));
  const std::vector<int64_t> shape = k.block == 1 ? p.shape : std::vector<int64_t>{(p.numel + k.block - 1) / k.block};
  if (t->shape != shape)
    throw TESSERA_INPUT_ERROR("checkpoint " + r.dir() + " does not match the model: tensor " + p.name + " has shape " +
                              shape_str(t->shape) + " in the checkpoint, " + shape_str(shape) + " in the model");
  const std::string dtype = !k.per_unit.empty() && k.per_unit[0].scalar_type() == at::kByte ? "U8" : "F32";
  if (t->dtype != dtype || t->block != k.block)
    throw TESSERA_INPUT_ERROR("checkpoint " + r.dir() + " does not match this run: tensor " + tensor_label(*t) +
                              " is stored as " + t->dtype + " per " + std::to_string(t->block) + " element(s), this run keeps " +
                              dtype + " per " + std::to_string(k.block));
}

// The engine's parameters must be exactly the checkpoint's (names and shapes, every kind asked for).
void check_matches(const Reader& r, const std::vector<fsdp::UnitShard>& shards, const std::vector<NamedShards>& kinds) {
  size_t expected = 0;
  for (const auto& u : shards)
    for (const auto& p : u.plan.params)
      for (const NamedShards& k : kinds) {
        check_tensor(r, p, k);
        ++expected;
      }
  if (r.tensors().size() != expected)
    for (const auto& t : r.tensors()) {
      bool known = false;
      for (const auto& u : shards)
        for (const auto& p : u.plan.params) known = known || p.name == t.name;
      if (!known)
        throw TESSERA_INPUT_ERROR("checkpoint " + r.dir() + " does not match the model: it has tensor " + t.name +
                                  " which the model lacks");
    }
}

}  // namespace

json load(const std::string& ckpt_dir, fsdp::Engine& engine, const std::vector<NamedShards>& kinds) {
  memory::Scope memory_scope(memory::Category::Checkpoint);
  const auto& shards = engine.shards();
  std::unique_ptr<Reader> reader;
  for (const NamedShards& k : kinds)
    TESSERA_CHECK(k.per_unit.size() == shards.size(), "checkpoint kind " + k.kind + " has a tensor per unit");
  // The manifest and the files' sizes (damage), then whether the checkpoint fits the model (not damage).
  agree(engine, capture_error([&] { reader = std::make_unique<Reader>(ckpt_dir); }), ckpt_dir, /*damaged=*/true);
  agree(engine, capture_error([&] { check_matches(*reader, shards, kinds); }));

  // Requests for this rank's shard, grouped by file.
  const int W = engine.shard_group().size(), rank = engine.shard_group().rank();
  std::vector<std::vector<ReadRequest>> per_file(reader->files().size());
  // Shards on a device, or kept in another dtype than stored (bf16 moments), are read into host
  // copies of the stored dtype (this rank's shards only) and copied over after. A kind per block
  // reads its values by the block plan (layout.h): the same blocks at every world size.
  std::vector<std::pair<at::Tensor, at::Tensor>> staged;  // (host copy, destination)
  for (size_t ui = 0; ui < shards.size(); ++ui) {
    const auto& u = shards[ui];
    for (const NamedShards& k : kinds) {
      at::Tensor dst = k.per_unit[ui];
      const at::ScalarType stored = dst.scalar_type() == at::kByte ? at::kByte : at::kFloat;
      if (!dst.is_cpu() || dst.scalar_type() != stored) {
        at::Tensor host = device::host_buffer({dst.numel()}, stored, dst.device());  // pinned for a GPU
        staged.emplace_back(host, dst);
        dst = host;
      }
      dst.zero_();  // padding stays zero
      char* base = static_cast<char*>(dst.data_ptr());
      const int64_t e = static_cast<int64_t>(dst.element_size());
      const fsdp::ShardPlan plan = block_plan(u.plan, k.block, k.kind);
      for (const auto& s : plan.slices(u.shard_rank)) {
        const TensorEntry* t = reader->find(plan.params[s.param].name, k.kind);
        for (auto& req : reader->requests(*t, s.param_offset, s.length, base + s.shard_offset * e))
          per_file[req.file].push_back(req);
      }
    }
  }
  // File f's checksum is verified by shard rank f % W in the pass that reads its ranges; others pread.
  agree(engine, capture_error([&] {
    for (size_t f = 0; f < per_file.size(); ++f) {
      if (static_cast<int>(f % W) == rank) {
        reader->stream_file(static_cast<int>(f), per_file[f]);
      } else if (!per_file[f].empty()) {
        io::File file = io::File::open_read(reader->file_path(static_cast<int>(f)));
        for (const auto& r : per_file[f]) file.pread_all(r.dst, r.bytes, r.offset);
      }
    }
  }), ckpt_dir, /*damaged=*/true);
  for (auto& [host, dev] : staged) dev.copy_(host.view(dev.sizes()), /*non_blocking=*/dev.is_cuda());
  return reader->state();
}

}  // namespace tessera::checkpoint
