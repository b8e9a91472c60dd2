#include "model/safetensors.h"

#include "util/dtype_names.h"
#include "util/json.h"
#include "util/widen.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "model/errors.h"
#include "model/registry.h"
#include "util/file_tree.h"

namespace fs = std::filesystem;

namespace tessera::model {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

namespace {
constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the safetensors library's limit
constexpr int64_t kChunkElems = 1 << 22;             // conversion / page-release granularity
}  // namespace

// ------------------------------------------------------------------------------------------------
// dtypes
// ------------------------------------------------------------------------------------------------

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t element_size(DType d) { return d == DType::F32 ? 4 : 2; }

const char* dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
  }
  return "?";
}

DType dtype_from_name(const std::string& s, const std::string& context) {
  if (s == "F32") return DType::F32;
  if (s == "BF16") return DType::BF16;
  if (s == "F16") return DType::F16;
  static const std::set<std::string> other_known = {"F64", "F8_E4M3", "F8_E5M2", "I64", "I32", "I16",
                                                    "I8",  "U64",     "U32",     "U16", "U8",  "BOOL"};
  if (other_known.count(s))
    throw ModelError(context + ": dtype " + s + " is not supported for model weights (F32, BF16, F16)");
  throw ModelError(context + ": unknown dtype '" + s + "'");
}

DType dtype_from_cli(const std::string& s, const std::string& context) {
  if (const auto t = util::float_type_named(s))
    return *t == util::FloatType::F32 ? DType::F32 : *t == util::FloatType::BF16 ? DType::BF16 : DType::F16;
  throw ModelError(context + ": unknown dtype '" + s + "' (valid: fp32, bf16, fp16)");
}

c10::ScalarType to_torch(DType d) {
  switch (d) {
    case DType::F32: return c10::ScalarType::Float;
    case DType::BF16: return c10::ScalarType::BFloat16;
    case DType::F16: return c10::ScalarType::Half;
  }
  return c10::ScalarType::Float;
}

DType from_torch(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return DType::F32;
    case c10::ScalarType::BFloat16: return DType::BF16;
    case c10::ScalarType::Half: return DType::F16;
    default: throw ModelError(std::string("tensor dtype ") + c10::toString(t) + " is not F32, BF16 or F16");
  }
}

std::string torch_dtype_name(DType d) {
  return d == DType::F32 ? "float32" : d == DType::BF16 ? "bfloat16" : "float16";
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {
float load_f32(const unsigned char* p, DType d) {
  if (d == DType::F32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return d == DType::BF16 ? static_cast<float>(c10::BFloat16(bits, c10::BFloat16::from_bits()))
                          : static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}
void store_f32(unsigned char* p, DType d, float f) {
  if (d == DType::F32) {
    std::memcpy(p, &f, 4);
    return;
  }
  uint16_t bits = d == DType::BF16 ? c10::BFloat16(f).x : c10::Half(f).x;  // round to nearest even
  std::memcpy(p, &bits, 2);
}
}  // namespace

void convert_elements(const void* src, DType sd, void* dst, DType dd, int64_t count) {
  if (sd == dd) {
    std::memcpy(dst, src, count * element_size(sd));
    return;
  }
  if ((sd == DType::BF16 || sd == DType::F16) && dd == DType::F32) {  // the loading hot path
    util::widen_to_f32(static_cast<const uint16_t*>(src), sd == DType::BF16 ? util::Float16Kind::BF16 : util::Float16Kind::F16,
                       static_cast<float*>(dst), count);
    return;
  }
  auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  const size_t ss = element_size(sd), ds = element_size(dd);
  for (int64_t i = 0; i < count; ++i) store_f32(d + i * ds, dd, load_f32(s + i * ss, sd));
}

// ------------------------------------------------------------------------------------------------
// SafetensorsFile
// ------------------------------------------------------------------------------------------------

int64_t SafetensorsFile::Entry::numel() const { return TensorSpec{"", shape}.numel(); }

namespace {

// The 8-byte header length and the header JSON object of a mapped file of `size` bytes.
nlohmann::json parse_header(const std::string& path, const unsigned char* map, size_t size, uint64_t& n) {
  std::memcpy(&n, map, 8);
  if (n > kMaxHeaderBytes)
    throw ModelError(path + ": header length " + std::to_string(n) + " exceeds the safetensors limit of " +
                     std::to_string(kMaxHeaderBytes) + " bytes (corrupt or not a safetensors file)");
  if (n > size - 8)
    throw ModelError(path + ": truncated: header length " + std::to_string(n) + " exceeds the " +
                     std::to_string(size - 8) + " bytes after the length field");
  nlohmann::json header;
  try {
    header = util::parse_json(std::string_view(reinterpret_cast<const char*>(map) + 8, n));
  } catch (const nlohmann::json::exception& e) {
    throw ModelError(path + ": header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) throw ModelError(path + ": header is not a JSON object");
  return header;
}

// One tensor's header entry `v`, checked against the data section (data_size bytes starting at
// data_begin in a file of file_size bytes); begin/end are file offsets. ctx names file and tensor.
SafetensorsFile::Entry parse_entry(const std::string& ctx, const nlohmann::json& v, uint64_t data_begin,
                                   uint64_t data_size, size_t file_size) {
  if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets") ||
      !v["dtype"].is_string() || !v["shape"].is_array() || !v["data_offsets"].is_array() ||
      v["data_offsets"].size() != 2)
    throw ModelError(ctx + ": header entry needs dtype (string), shape (array), data_offsets ([begin,end])");
  SafetensorsFile::Entry e;
  e.dtype = dtype_from_name(v["dtype"].get<std::string>(), ctx);
  unsigned __int128 bytes = element_size(e.dtype);
  int64_t elems = 1;  // numel() multiplies in this order: a zero dimension after [2^32, 2^32] came too late
  for (const auto& d : v["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      throw ModelError(ctx + ": shape " + v["shape"].dump() + " has an invalid dimension");
    if (d.get<int64_t>() != 0 && elems > INT64_MAX / d.get<int64_t>())
      throw ModelError(ctx + ": shape " + v["shape"].dump() + " has more than 2^63 elements");
    elems *= d.get<int64_t>();
    e.shape.push_back(d.get<int64_t>());
    bytes *= (uint64_t)e.shape.back();
    if (bytes > file_size) bytes = (unsigned __int128)file_size + 1;  // saturate: cannot fit anyway
  }
  for (const auto& o : v["data_offsets"])
    if (!o.is_number_unsigned())
      throw ModelError(ctx + ": data_offsets " + v["data_offsets"].dump() + " are not non-negative integers");
  const uint64_t b = v["data_offsets"][0].get<uint64_t>(), en = v["data_offsets"][1].get<uint64_t>();
  if (b > en || en > data_size)
    throw ModelError(ctx + ": data_offsets [" + std::to_string(b) + "," + std::to_string(en) +
                     "] out of bounds of the " + std::to_string(data_size) + "-byte data section");
  if ((unsigned __int128)(en - b) != bytes)
    throw ModelError(ctx + ": shape " + shape_str(e.shape) + " " + dtype_name(e.dtype) + " needs " +
                     std::to_string((uint64_t)bytes) + " bytes but data_offsets span " + std::to_string(en - b));
  e.begin = data_begin + b;
  e.end = data_begin + en;
  return e;
}

// The tensors must tile the data section exactly: sorted by offset, each starts where the previous
// ends (overlaps and gaps are both corruption), and the last ends at the file end.
void check_tiling(const std::string& path, const std::map<std::string, SafetensorsFile::Entry>& entries,
                  uint64_t data_begin, uint64_t data_size) {
  std::vector<std::pair<uint64_t, std::string>> order;  // (begin in the data section, name)
  for (const auto& [name, e] : entries) order.emplace_back(e.begin - data_begin, name);
  std::sort(order.begin(), order.end());
  uint64_t cursor = 0;
  std::string prev;
  for (const auto& [b, name] : order) {
    const auto& e = entries.at(name);
    if (b < cursor) throw ModelError(path + ": tensor '" + name + "' data_offsets overlap tensor '" + prev + "'");
    if (b > cursor)
      throw ModelError(path + ": gap of " + std::to_string(b - cursor) + " bytes before tensor '" + name +
                       "' in the data section");
    // Zero-byte tensors sit at the cursor without advancing it; they cannot overlap anything.
    if (e.end > e.begin) prev = name;
    cursor = e.end - data_begin;
  }
  if (cursor != data_size)
    throw ModelError(path + ": data section is " + std::to_string(data_size) + " bytes but tensors cover " +
                     std::to_string(cursor) + " (truncated or trailing bytes)");
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw ModelError(path + ": cannot open: " + std::strerror(errno));
  try {
    struct stat st;
    if (::fstat(fd_, &st) != 0) throw ModelError(path + ": cannot stat: " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw ModelError(path + ": not a regular file");
    size_ = (size_t)st.st_size;
    if (size_ < 8)
      throw ModelError(path + ": truncated: " + std::to_string(size_) +
                       " bytes is shorter than the 8-byte header length");
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
    if (m == MAP_FAILED) throw ModelError(path + ": mmap failed: " + std::strerror(errno));
    map_ = static_cast<const unsigned char*>(m);

    uint64_t n = 0;
    const nlohmann::json header = parse_header(path, map_, size_, n);
    const uint64_t data_begin = 8 + n, data_size = size_ - data_begin;
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") {
        metadata_ = it.value();
        continue;
      }
      entries_.emplace(it.key(), parse_entry(path + ": tensor '" + it.key() + "'", it.value(), data_begin, data_size, size_));
    }
    check_tiling(path, entries_, data_begin, data_size);
  } catch (...) {
    if (map_) ::munmap(const_cast<unsigned char*>(map_), size_);
    ::close(fd_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), size_);
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw ModelError(path_ + ": no tensor '" + name + "'");
  return it->second;
}

at::Tensor SafetensorsFile::read(const std::string& name) const {
  const Entry& e = entry(name);
  auto t = torch::empty(e.shape, torch::TensorOptions().dtype(to_torch(e.dtype)));
  read_into(name, 0, e.numel(), t.data_ptr(), e.dtype);
  return t;
}

const SafetensorsFile::Entry& SafetensorsFile::checked(const std::string& name, int64_t elem_offset,
                                                       int64_t count) const {
  const Entry& e = entry(name);
  if (elem_offset < 0 || count < 0 || elem_offset + count > e.numel())
    throw ModelError(path_ + ": tensor '" + name + "': read of elements [" + std::to_string(elem_offset) + ", " +
                     std::to_string(elem_offset + count) + ") outside its " + std::to_string(e.numel()) +
                     " elements");
  return e;
}

namespace {
// Drops the process's mapping of the whole pages inside [p, p + n) (the page cache keeps them).
void release_pages(const unsigned char* p, size_t n) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t hi = reinterpret_cast<uintptr_t>(p) + n;
  if (n > 0) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}
}  // namespace

void SafetensorsFile::read_into(const std::string& name, int64_t elem_offset, int64_t count, void* dst,
                                DType dst_dtype) const {
  const Entry& e = checked(name, elem_offset, count);
  const size_t es = element_size(e.dtype), ds = element_size(dst_dtype);
  auto* out = static_cast<unsigned char*>(dst);
  // Chunked so that the pages of a huge tensor are released as we go: resident memory stays
  // bounded by one chunk of the mapping (the page cache keeps them for the next reader).
  for (int64_t done = 0; done < count; done += kChunkElems) {
    const int64_t n = std::min<int64_t>(kChunkElems, count - done);
    const unsigned char* src = map_ + e.begin + (elem_offset + done) * es;
    convert_elements(src, e.dtype, out + done * ds, dst_dtype, n);
    release_pages(src, n * es);
  }
}

const void* SafetensorsFile::mapped(const std::string& name, int64_t elem_offset, int64_t count) const {
  const Entry& e = checked(name, elem_offset, count);
  return map_ + e.begin + elem_offset * element_size(e.dtype);
}

void SafetensorsFile::release(const std::string& name, int64_t elem_offset, int64_t count) const {
  const Entry& e = checked(name, elem_offset, count);
  release_pages(map_ + e.begin + elem_offset * element_size(e.dtype), count * element_size(e.dtype));
}

// ------------------------------------------------------------------------------------------------
// ModelDir
// ------------------------------------------------------------------------------------------------

ModelDir::ModelDir(const std::string& dir) : dir_(dir) {
  if (!fs::is_directory(dir)) throw ModelError(dir + ": model directory does not exist");
  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(config_path)) throw ModelError(config_path + ": missing config.json in model directory");
  config_ = ModelConfig::load(config_path);

  const std::string index = (fs::path(dir) / "model.safetensors.index.json").string();
  const std::string single = (fs::path(dir) / "model.safetensors").string();
  if (fs::exists(index)) {
    index_path_ = index;
    nlohmann::json j;
    try {
      std::ifstream in(index);
      j = util::parse_json(in);
    } catch (const nlohmann::json::exception& e) {
      throw ModelError(index + ": invalid JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw ModelError(index + ": missing object 'weight_map'");
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        throw ModelError(index + ": weight_map entry '" + it.key() + "' is not a file name");
      const std::string shard = it.value().get<std::string>();
      if (shard.empty() || shard.find('/') != std::string::npos)
        throw ModelError(index + ": weight_map entry '" + it.key() + "' names invalid file '" + shard + "'");
      if (!fs::exists(fs::path(dir) / shard))
        throw ModelError(index + ": shard file '" + shard + "' (listed for tensor '" + it.key() +
                         "') does not exist");
      weight_map_[it.key()] = shard;
    }
  } else if (fs::exists(single)) {
    auto file = std::make_unique<SafetensorsFile>(single);
    for (const auto& [name, e] : file->entries()) weight_map_[name] = "model.safetensors";
    files_["model.safetensors"] = std::move(file);
  } else {
    throw ModelError(dir + ": no model.safetensors or model.safetensors.index.json in model directory");
  }
}

ModelDir::~ModelDir() = default;

std::vector<std::string> ModelDir::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& kv : weight_map_) names.push_back(kv.first);
  return names;
}

const SafetensorsFile& ModelDir::file_for(const std::string& name) const {
  auto it = weight_map_.find(name);
  if (it == weight_map_.end())
    throw ModelError((index_path_.empty() ? (fs::path(dir_) / "model.safetensors").string() : index_path_) +
                     ": tensor '" + name + "' is missing");
  auto& slot = files_[it->second];
  if (!slot) slot = std::make_unique<SafetensorsFile>((fs::path(dir_) / it->second).string());
  if (!slot->has(name))
    throw ModelError(slot->path() + ": tensor '" + name + "' listed in " + index_path_ + " is missing from the file");
  return *slot;
}

ModelDir::TensorInfo ModelDir::info(const std::string& name) const {
  const SafetensorsFile& f = file_for(name);
  const auto& e = f.entry(name);
  return {f.path(), e.dtype, e.shape};
}

at::Tensor ModelDir::read(const std::string& name) const { return file_for(name).read(name); }

void ModelDir::read_into(const std::string& name, int64_t elem_offset, int64_t count, void* dst,
                         DType dst_dtype) const {
  file_for(name).read_into(name, elem_offset, count, dst, dst_dtype);
}

const void* ModelDir::mapped(const std::string& name, int64_t elem_offset, int64_t count) const {
  return file_for(name).mapped(name, elem_offset, count);
}

void ModelDir::release(const std::string& name, int64_t elem_offset, int64_t count) const {
  file_for(name).release(name, elem_offset, count);
}

void ModelDir::load_into(const std::vector<std::pair<std::string, at::Tensor>>& targets) const {
  for (const auto& [name, t] : targets) {
    const TensorInfo ti = info(name);
    if (ti.shape != t.sizes().vec())
      throw ModelError(ti.file + ": tensor '" + name + "' has shape " + shape_str(ti.shape) +
                       " but the model expects " + shape_str(t.sizes().vec()));
    TORCH_CHECK(t.is_contiguous() && t.device().is_cpu(), "load_into needs contiguous CPU tensors: ", name);
    read_into(name, 0, t.numel(), t.data_ptr(), from_torch(t.scalar_type()));
  }
}

void ModelDir::validate() const {
  for (const auto& [name, shard] : weight_map_) file_for(name);  // listed tensors exist in their shards
  for (const auto& spec : hf_tensor_specs(config_)) {
    const TensorInfo ti = info(spec.name);
    if (ti.shape != spec.shape)
      throw ModelError(spec.name + ": shape " + shape_str(ti.shape) + " in " + ti.file + " does not match config " +
                       shape_str(spec.shape));
  }
}

// ------------------------------------------------------------------------------------------------
// Writer
// ------------------------------------------------------------------------------------------------

namespace {

// Header bytes of one file: u64 length + JSON padded with spaces to a multiple of 8.
std::string make_header(const std::vector<TensorSpec>& specs, DType dtype) {
  nlohmann::json h = nlohmann::json::object();
  h["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const auto& s : specs) {
    const uint64_t bytes = (uint64_t)s.numel() * element_size(dtype);
    h[s.name] = {{"dtype", dtype_name(dtype)}, {"shape", s.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = h.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  const uint64_t n = json.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + json;
}

void write_json(const fs::path& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) throw ModelError(path.string() + ": write failed");
}

}  // namespace

void write_safetensors_file(const std::string& path, const std::vector<TensorSpec>& specs, DType dtype,
                            const std::function<at::Tensor(const TensorSpec&)>& produce) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw ModelError(path + ": cannot create file");
  const std::string header = make_header(specs, dtype);
  out.write(header.data(), header.size());
  std::vector<unsigned char> buf;
  for (const auto& spec : specs) {
    at::Tensor t = produce(spec);
    if (t.sizes().vec() != spec.shape)
      throw ModelError(path + ": tensor '" + spec.name + "' produced with shape " + shape_str(t.sizes().vec()) +
                       ", expected " + shape_str(spec.shape));
    t = t.to(torch::kCPU).contiguous();
    const DType src = from_torch(t.scalar_type());
    if (src == dtype) {
      out.write(static_cast<const char*>(t.data_ptr()), t.numel() * element_size(dtype));
    } else {
      buf.resize(t.numel() * element_size(dtype));
      convert_elements(t.data_ptr(), src, buf.data(), dtype, t.numel());
      out.write(reinterpret_cast<const char*>(buf.data()), buf.size());
    }
    if (!out) throw ModelError(path + ": write failed for tensor '" + spec.name + "'");
  }
  out.close();
  if (!out) throw ModelError(path + ": write failed");
}

namespace {
void write_directory_impl(const std::string& dir, const std::function<void(const std::string& tmp)>& fill) {
  const fs::path target(dir);
  if (fs::exists(target) && !(fs::is_directory(target) && fs::is_empty(target)))
    throw ModelError(dir + ": output directory exists and is not empty; refusing to overwrite");
  fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  fs::create_directories(parent);
  const fs::path tmp = parent / (target.filename().string() + ".tmp-" + std::to_string(::getpid()));
  tessera::util::remove_tree(tmp);  // a leftover, or a planted link: the link goes, never its target
  if (!fs::create_directory(tmp)) throw ModelError(tmp.string() + ": appeared while being created; refusing to write into it");
  try {
    fill(tmp.string());
    if (fs::exists(target)) fs::remove(target);  // empty directory (checked above)
    fs::rename(tmp, target);
  } catch (...) {
    std::error_code ec;
    tessera::util::remove_tree(tmp, ec);
    throw;
  }
}

void write_dir_impl(const std::string& dir, const ModelConfig& cfg, const std::vector<TensorSpec>& specs, DType dtype,
                    uint64_t max_shard_bytes, const std::function<at::Tensor(const TensorSpec&)>& produce) {
  if (max_shard_bytes == 0) throw ModelError(dir + ": max shard size must be positive");

  // Shard plan: greedy in spec order; a tensor larger than the limit gets a shard of its own.
  std::vector<std::vector<TensorSpec>> shards;
  uint64_t current = 0, total = 0;
  for (const auto& s : specs) {
    const uint64_t bytes = (uint64_t)s.numel() * element_size(dtype);
    if (shards.empty() || (current > 0 && current + bytes > max_shard_bytes)) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(s);
    current += bytes;
    total += bytes;
  }

  write_directory_impl(dir, [&](const std::string& tmp_dir) {
    const fs::path tmp(tmp_dir);
    ModelConfig out_cfg = cfg;
    out_cfg.torch_dtype = torch_dtype_name(dtype);
    write_json(tmp / "config.json", out_cfg.to_json());
    if (shards.size() <= 1) {
      write_safetensors_file((tmp / "model.safetensors").string(), shards.empty() ? specs : shards[0], dtype, produce);
      return;
    }
    nlohmann::json weight_map = nlohmann::json::object();
    char name[64];
    for (size_t k = 0; k < shards.size(); ++k) {
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
      for (const auto& s : shards[k]) weight_map[s.name] = name;
      write_safetensors_file((tmp / name).string(), shards[k], dtype, produce);
    }
    write_json(tmp / "model.safetensors.index.json", {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});
  });
}
}  // namespace

void write_directory_atomically(const std::string& dir, const std::function<void(const std::string& tmp)>& fill) {
  try {
    write_directory_impl(dir, fill);
  } catch (const fs::filesystem_error& e) {
    throw ModelError(dir + ": " + e.what());
  }
}

void write_safetensors_dir(const std::string& dir, const ModelConfig& cfg, const std::vector<TensorSpec>& specs,
                           DType dtype, uint64_t max_shard_bytes,
                           const std::function<at::Tensor(const TensorSpec&)>& produce) {
  try {
    write_dir_impl(dir, cfg, specs, dtype, max_shard_bytes, produce);
  } catch (const fs::filesystem_error& e) {
    throw ModelError(dir + ": " + e.what());
  }
}

}  // namespace tessera::model
