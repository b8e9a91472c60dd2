// libFuzzer harness: safetensors files and Hugging Face model directories (model/safetensors.cpp,
// model/config.cpp through ModelDir).
//
// Input: up to three parts separated by fuzz_common.h's kSplit line.
//   part 0  a safetensors file. Always opened alone (SafetensorsFile) and, when it parses, every
//           tensor is read (the first <= 4096 elements converted to F32, read() of small ones,
//           mapped()/release()).
//   part 1  config.json; present -> a model directory is built and opened with ModelDir:
//   part 2  model.safetensors.index.json; present -> part 0 is the shard "shard.safetensors",
//           absent -> part 0 is "model.safetensors".
// ModelDir's tensors are read the same way, then validate() checks them against the config.
#include <algorithm>
#include <vector>

#include "model/safetensors.h"
#include "tests/fuzz/fuzz_common.h"

using namespace tessera;
using namespace tessera::model;

namespace {

const fuzz::Scratch& scratch() {
  static const fuzz::Scratch s;
  return s;
}

std::vector<float> g_buf(4096);

template <typename Reader>
void read_some(const Reader& r, const std::string& name, DType dtype, int64_t numel) {
  const int64_t n = std::min<int64_t>(numel, static_cast<int64_t>(g_buf.size()));
  r.read_into(name, 0, n, g_buf.data(), DType::F32);
  if (numel > 0) r.read_into(name, numel - 1, 1, g_buf.data(), DType::BF16);
  if (numel <= 4096) {
    at::Tensor t = r.read(name);
    if (t.numel() != numel) fuzz::finding("read('" + name + "') returned " + std::to_string(t.numel()) + " elements");
  }
  r.release(name, 0, n);
  (void)dtype;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& s = scratch();
  s.clear();
  const std::vector<std::string> parts = fuzz::split_parts(data, size, 3);
  const bool is_dir = parts.size() >= 2, sharded = parts.size() >= 3;
  const std::string file = s.write(sharded ? "shard.safetensors" : "model.safetensors", parts[0]);

  fuzz::expect_input_error(
      [&] {
        SafetensorsFile f(file);
        for (const auto& [name, e] : f.entries()) {
          if (e.end < e.begin || e.end > (uint64_t)size) fuzz::finding("entry '" + name + "' outside the file");
          const int64_t numel = e.numel();
          if ((uint64_t)numel * element_size(e.dtype) != e.end - e.begin)
            fuzz::finding("entry '" + name + "': numel * element size != byte span");
          read_some(f, name, e.dtype, numel);
          (void)f.mapped(name, 0, std::min<int64_t>(numel, 16));
        }
      },
      {file});

  if (!is_dir) return 0;
  const std::string config = s.write("config.json", parts[1]);
  std::string index;
  if (sharded) index = s.write("model.safetensors.index.json", parts[2]);
  fuzz::expect_input_error(
      [&] {
        ModelDir dir(s.dir());
        for (const auto& name : dir.tensor_names()) {
          const ModelDir::TensorInfo ti = dir.info(name);
          read_some(dir, name, ti.dtype, TensorSpec{name, ti.shape}.numel());
        }
        dir.validate();
      },
      {s.dir()});
  return 0;
}
