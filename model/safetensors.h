// safetensors I/O: a validating, memory-mapped reader for one file, a Hugging Face model directory
// reader (config.json + single or sharded safetensors), and a streaming writer.
//
// File layout (https://github.com/huggingface/safetensors): u64 little-endian header length N, N
// bytes of JSON {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}
// padded with spaces to 8-byte alignment, then the data section; offsets are relative to it.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"

namespace tessera::model {

// A tensor name and shape, without data (used to stream, validate and plan shards).
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel() const;
  bool operator==(const TensorSpec& o) const { return name == o.name && shape == o.shape; }
};

enum class DType { F32, BF16, F16 };

size_t element_size(DType d);
const char* dtype_name(DType d);                        // "F32", "BF16", "F16" (safetensors names)
DType dtype_from_name(const std::string& safetensors_name, const std::string& context);  // ModelError if unknown
DType dtype_from_cli(const std::string& s, const std::string& context);  // fp32|bf16|fp16 (also float32/bfloat16/float16)
c10::ScalarType to_torch(DType d);
DType from_torch(c10::ScalarType t);                    // ModelError for other dtypes
std::string torch_dtype_name(DType d);                  // config.json spelling: float32|bfloat16|float16
std::string shape_str(const std::vector<int64_t>& shape);  // "[64,32]"

// Copies `count` elements from `src` (dtype `sd`) to `dst` (dtype `dd`), converting
// (round-to-nearest-even on narrowing). Pointers need not be aligned.
void convert_elements(const void* src, DType sd, void* dst, DType dd, int64_t count);

// One safetensors file, memory-mapped read-only. The constructor validates the whole header
// (every check names the file and tensor): file shorter than 8 bytes, header length larger than
// the file or than the format's 100 MB limit, malformed JSON, unknown dtype, negative dims,
// shape vs. byte count, offsets out of bounds, overlapping, leaving gaps or not covering the data.
// Data bytes are only touched by read()/read_into().
class SafetensorsFile {
 public:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // absolute byte offsets in the file
    int64_t numel() const;
  };

  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const nlohmann::json& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  const Entry& entry(const std::string& name) const;  // ModelError naming file and tensor if absent

  // Whole tensor, copied out, in its stored dtype and shape.
  at::Tensor read(const std::string& name) const;
  // Elements [elem_offset, elem_offset + count) of the flattened tensor, converted to dst_dtype,
  // written to dst. Reads only those bytes and releases the touched pages afterwards.
  void read_into(const std::string& name, int64_t elem_offset, int64_t count, void* dst,
                 DType dst_dtype) const;
  // Elements [elem_offset, elem_offset + count) in place in the read-only mapping, in the stored
  // dtype (no copy: the pages are read by whoever dereferences it, e.g. MPI sending them). Hand the
  // range back with release() once done so that its pages leave the process's resident memory.
  const void* mapped(const std::string& name, int64_t elem_offset, int64_t count) const;
  void release(const std::string& name, int64_t elem_offset, int64_t count) const;

 private:
  const Entry& checked(const std::string& name, int64_t elem_offset, int64_t count) const;
  std::string path_;
  int fd_ = -1;
  const unsigned char* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, Entry> entries_;
  nlohmann::json metadata_;
};

// A Hugging Face model directory: config.json plus model.safetensors, or
// model.safetensors.index.json {"weight_map": {name: shard}} plus the shards. Shards are opened
// (header only) on first use; reading one tensor never touches the others' bytes.
class ModelDir {
 public:
  struct TensorInfo {
    std::string file;  // full path of the shard
    DType dtype;
    std::vector<int64_t> shape;
  };

  // Reads config.json and the index (or checks model.safetensors exists). ModelError naming the
  // file for a missing/invalid config, missing weights, malformed index or a missing shard file.
  explicit ModelDir(const std::string& dir);
  ~ModelDir();

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  std::vector<std::string> tensor_names() const;
  bool has(const std::string& name) const { return weight_map_.count(name) != 0; }
  TensorInfo info(const std::string& name) const;
  at::Tensor read(const std::string& name) const;
  void read_into(const std::string& name, int64_t elem_offset, int64_t count, void* dst,
                 DType dst_dtype) const;
  // See SafetensorsFile::mapped / release.
  const void* mapped(const std::string& name, int64_t elem_offset, int64_t count) const;
  void release(const std::string& name, int64_t elem_offset, int64_t count) const;
  // Copies each named tensor from the checkpoint into the given (contiguous, CPU, F32/BF16/F16)
  // tensor, e.g. load_into(model->layer_parameters(3)) loads one decoder layer. Shapes must match.
  void load_into(const std::vector<std::pair<std::string, at::Tensor>>& targets) const;
  // Checks every tensor of hf_tensor_specs(config()) exists in its file with the config's shape,
  // and every tensor the index lists is present in its shard. Opens every shard header.
  void validate() const;

 private:
  const SafetensorsFile& file_for(const std::string& name) const;  // checks presence in the shard

  std::string dir_;
  std::string index_path_;  // empty for a single-file checkpoint
  ModelConfig config_;
  std::map<std::string, std::string> weight_map_;  // tensor name -> shard file name
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
};

// Writes a Hugging Face model directory `dir`: config.json and model.safetensors, or (when the
// tensors exceed max_shard_bytes) model-0000k-of-0000n.safetensors + model.safetensors.index.json.
// Streaming: shard plan and headers are computed first, then produce(spec) is called once per
// tensor in spec order and its result (any float dtype, must have spec.shape) converted to `dtype`
// and written, so peak memory is about one tensor. Output is assembled in a temporary sibling
// directory and renamed at the end: a failure leaves nothing. A non-empty existing `dir` is refused.
// config.torch_dtype is written as `dtype`.
void write_safetensors_dir(const std::string& dir, const ModelConfig& cfg,
                           const std::vector<TensorSpec>& specs, DType dtype, uint64_t max_shard_bytes,
                           const std::function<at::Tensor(const TensorSpec&)>& produce);

// A new directory `dir` written whole or not at all: fill(tmp) writes the files into a fresh
// temporary sibling directory (a leftover or a link at its name removed first, never followed),
// which is renamed to `dir` once fill returns; on any failure the temporary is removed and `dir`
// is untouched. A non-empty existing `dir` is refused (ModelError naming it).
void write_directory_atomically(const std::string& dir, const std::function<void(const std::string& tmp)>& fill);

// Writes one safetensors file with the given tensors (any float dtype converted to `dtype`).
// Lower-level building block of write_safetensors_dir, also handy for tests and conversion tools.
void write_safetensors_file(const std::string& path, const std::vector<TensorSpec>& specs, DType dtype,
                            const std::function<at::Tensor(const TensorSpec&)>& produce);

}  // namespace tessera::model
