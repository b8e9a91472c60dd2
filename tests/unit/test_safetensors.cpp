// safetensors reader/writer and Hugging Face model directories: round trips for every dtype
// (single file and sharded), the on-disk format, and every malformed-file case with its error.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <cmath>
#include <cstring>
#include <fstream>

#include "model/errors.h"
#include "model/llama.h"
#include "model/safetensors.h"
#include "tests/support/test_support.h"
#include "util/widen.h"

namespace test_safetensors {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace tessera::model;
namespace fs = std::filesystem;
using tessera::test::error_of;
using tessera::test::TempDir;

namespace {

ModelConfig test_config() {
  ModelConfig c = ModelConfig::preset("tiny");
  c.vocab_size = 50;
  c.hidden_size = 32;
  c.intermediate_size = 86;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  return c;
}

// Deterministic distinct content per tensor (seeded by name) so mix-ups show.
torch::Tensor content(const TensorSpec& s) { return init_tensor(s, 7) * 10 + (double)(s.name.size() % 5); }

// test_config()'s tensors written as a checkpoint of shards of at most 20000 bytes into tmp / "m";
// returns its model.safetensors.index.json.
nlohmann::json write_sharded(const TempDir& tmp) {
  const auto cfg = test_config();
  write_safetensors_dir(tmp / "m", cfg, hf_tensor_specs(cfg), DType::F32, 20000, content);
  return nlohmann::json::parse(std::ifstream(tmp / "m/model.safetensors.index.json"));
}

// A raw safetensors file `name` (header length field, JSON text, `data_bytes` bytes of 0x01) that
// SafetensorsFile refuses with one line holding `want`.
void expect_refused(const std::string& name, uint64_t header_len, const std::string& json, size_t data_bytes,
                    const std::string& want) {
  SCOPED_TRACE(name);
  const TempDir tmp;
  {
    std::ofstream out(tmp / name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(&header_len), 8);
    out << json << std::string(data_bytes, '\x01');
  }
  EXPECT_INPUT_ERROR(SafetensorsFile(tmp / name), want);
}
// The same with the header's true length.
void expect_refused(const std::string& name, const std::string& json, size_t data_bytes, const std::string& want) {
  expect_refused(name, json.size(), json, data_bytes, want);
}

}  // namespace

// ---------------------------------------------------------------- round trips

class SafetensorsRoundTrip : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(SafetensorsRoundTrip, WriteThenReadEveryTensor) {
  auto [dtype, sharded] = GetParam();
  TempDir tmp;
  const auto cfg = test_config();
  const auto specs = hf_tensor_specs(cfg);
  const std::string out = tmp / "model";
  int produced = 0;
  write_safetensors_dir(out, cfg, specs, dtype, sharded ? 20000 : (1ULL << 40), [&](const TensorSpec& s) {
    EXPECT_EQ(s, specs[produced]) << "produce() is called once per tensor, in spec order";
    ++produced;
    return content(s);
  });
  EXPECT_EQ(produced, (int)specs.size());
  EXPECT_EQ(fs::exists(fs::path(out) / "model.safetensors.index.json"), sharded);
  EXPECT_EQ(fs::exists(fs::path(out) / "model.safetensors"), !sharded);

  ModelDir dir(out);
  EXPECT_EQ(dir.config().hidden_size, cfg.hidden_size);
  EXPECT_EQ(dir.config().torch_dtype, torch_dtype_name(dtype));
  dir.validate();
  EXPECT_EQ(dir.tensor_names().size(), specs.size());
  for (const auto& s : specs) {
    auto t = dir.read(s.name);
    EXPECT_EQ(t.scalar_type(), to_torch(dtype)) << s.name;
    EXPECT_TRUE(torch::equal(t, content(s).to(to_torch(dtype)))) << s.name;
    EXPECT_EQ(dir.info(s.name).shape, s.shape);
    EXPECT_EQ(dir.info(s.name).dtype, dtype);
  }
  // Partial read with conversion to fp32: a slice of the flattened tensor.
  const auto& up = specs[6];
  ASSERT_EQ(up.name, "model.layers.0.mlp.up_proj.weight");
  std::vector<float> slice(100);
  dir.read_into(up.name, 37, 100, slice.data(), DType::F32);
  auto expected = content(up).to(to_torch(dtype)).to(torch::kFloat32).flatten().narrow(0, 37, 100);
  EXPECT_TRUE(torch::equal(torch::from_blob(slice.data(), {100}), expected));

  // load_into a model's layer.
  Llama m(cfg);
  dir.load_into(m->layer_parameters(2));
  EXPECT_TRUE(torch::equal(m->layer(2)->mlp->down_proj->weight,
                           content(hf_layer_specs(cfg, 2)[6]).to(to_torch(dtype)).to(torch::kFloat32)));

  if (sharded) {
    auto index = nlohmann::json::parse(std::ifstream(fs::path(out) / "model.safetensors.index.json"));
    std::set<std::string> files;
    uint64_t total = 0;
    for (const auto& s : specs) {
      files.insert(index["weight_map"][s.name].get<std::string>());
      total += s.numel() * element_size(dtype);
    }
    EXPECT_GT(files.size(), 2u);
    EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
    char last[64];
    std::snprintf(last, sizeof last, "model-%05zu-of-%05zu.safetensors", files.size(), files.size());
    EXPECT_TRUE(files.count(last)) << last;
    for (const auto& f : files) {  // every shard under the limit unless it holds one oversized tensor
      SafetensorsFile sf((fs::path(out) / f).string());
      uint64_t bytes = 0;
      for (const auto& [n, e] : sf.entries()) bytes += e.end - e.begin;
      EXPECT_TRUE(bytes <= 20000 || sf.entries().size() == 1) << f;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, SafetensorsRoundTrip,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16, DType::F16),
                                            ::testing::Bool()));

TEST(Safetensors, OnDiskFormatIsHuggingFaceCompatible) {
  TempDir tmp;
  const std::string path = tmp / "a.safetensors";
  std::vector<TensorSpec> specs = {{"b", {3}}, {"a", {2, 2}}};
  write_safetensors_file(path, specs, DType::BF16, [](const TensorSpec& s) {
    return torch::arange(TensorSpec{s.name, s.shape}.numel(), torch::kFloat32).view(s.shape) + 0.5;
  });
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"], (nlohmann::json{{"format", "pt"}}));
  EXPECT_EQ(header["b"]["dtype"], "BF16");
  EXPECT_EQ(header["b"]["data_offsets"], nlohmann::json::array({0, 6}));
  EXPECT_EQ(header["a"]["shape"], nlohmann::json::array({2, 2}));
  EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json::array({6, 14}));
  EXPECT_EQ(bytes.size(), 8 + n + 14);
  // bf16(0.5) = 0x3F00, little endian.
  EXPECT_EQ((unsigned char)bytes[8 + n], 0x00);
  EXPECT_EQ((unsigned char)bytes[8 + n + 1], 0x3F);
  SafetensorsFile f(path);
  EXPECT_EQ(f.entry("a").begin, 8 + n + 6);
  EXPECT_TRUE(torch::equal(f.read("a").to(torch::kFloat32), torch::tensor({{0.5f, 1.5f}, {2.5f, 3.5f}})));
}

TEST(Safetensors, ConversionRoundsToNearestEven) {
  // 1 + 2^-8 lies exactly between two bf16 values (1 and 1 + 2^-7): ties to even -> 1.
  float in[3] = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -2.0f};
  uint16_t out[3];
  convert_elements(in, DType::F32, out, DType::BF16, 3);
  EXPECT_EQ(out[0], 0x3F80);
  EXPECT_EQ(out[1], 0x3F82);
  EXPECT_EQ(out[2], 0xC000);
  float back[3];
  convert_elements(out, DType::BF16, back, DType::F32, 3);
  EXPECT_EQ(back[2], -2.0f);
  uint16_t half[1];
  convert_elements(&in[2], DType::F32, half, DType::F16, 1);
  EXPECT_EQ(half[0], 0xC000);  // f16(-2) = 0xC000 too
}

// ---------------------------------------------------------------- writer safety

TEST(Safetensors, WriterRefusesNonEmptyDirAndLeavesNothingOnFailure) {
  TempDir tmp;
  const auto cfg = test_config();
  const auto specs = hf_tensor_specs(cfg);
  const std::string out = tmp / "existing";
  fs::create_directories(out);
  std::ofstream(fs::path(out) / "keep.txt") << "precious";
  EXPECT_INPUT_ERROR(write_safetensors_dir(out, cfg, specs, DType::F32, 1 << 30, content),
                     "output directory exists and is not empty");
  EXPECT_TRUE(fs::exists(fs::path(out) / "keep.txt"));

  const std::string failed = tmp / "failed";
  int calls = 0;
  EXPECT_THROW(write_safetensors_dir(failed, cfg, specs, DType::F32, 10000,
                                     [&](const TensorSpec& s) {
                                       if (++calls == 5) throw std::runtime_error("disk on fire");
                                       return content(s);
                                     }),
               std::runtime_error);
  EXPECT_FALSE(fs::exists(failed));
  for (const auto& e : fs::directory_iterator(tmp.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();

  EXPECT_INPUT_ERROR(write_safetensors_dir(tmp / "bad_shape", cfg, specs, DType::F32, 1 << 30,
                                           [](const TensorSpec& s) { return torch::zeros({2, 2}); }),
                        "produced with shape [2,2], expected [50,32]");
  EXPECT_FALSE(fs::exists(tmp / "bad_shape"));

  // An existing empty directory is fine.
  const std::string empty = tmp / "empty";
  fs::create_directories(empty);
  write_safetensors_dir(empty, cfg, specs, DType::F16, 1 << 30, content);
  ModelDir(empty).validate();
}

// ---------------------------------------------------------------- malformed files

TEST(SafetensorsMalformed, TruncatedFileShorterThanLength) {
  TempDir tmp;
  std::ofstream(tmp / "t.safetensors") << "abc";
  EXPECT_INPUT_ERROR(SafetensorsFile(tmp / "t.safetensors"),
                     tmp / "t.safetensors" + ": truncated: 3 bytes is shorter than the 8-byte header length");
}

TEST(SafetensorsMalformed, HeaderLengthLargerThanFile) {
  expect_refused("h.safetensors", 1000, "{}", 0, ": truncated: header length 1000 exceeds the 2 bytes after the length field");
}

TEST(SafetensorsMalformed, HeaderLengthTwoToThe63) {
  expect_refused("h.safetensors", 1ULL << 63, "{}", 0, "header length 9223372036854775808 exceeds the safetensors limit");
}

TEST(SafetensorsMalformed, HeaderNotJson) {
  expect_refused("j.safetensors", "{\"a\": {\"dtype\": ", 0, "j.safetensors: header is not valid JSON");
}

TEST(SafetensorsMalformed, OverlappingOffsets) {
  expect_refused("o.safetensors",
                 R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 12, "o.safetensors: tensor 'y' data_offsets overlap tensor 'x'");
}

TEST(SafetensorsMalformed, GapAndUncoveredBytes) {
  expect_refused("g.safetensors",
                 R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"y":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                 12, "gap of 4 bytes before tensor 'y'");
  expect_refused("c.safetensors", R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 10,
                 "data section is 10 bytes but tensors cover 4");
}

TEST(SafetensorsMalformed, OffsetsOutOfBounds) {
  expect_refused("b.safetensors", R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8,
                 "tensor 'x': data_offsets [0,16] out of bounds of the 8-byte data section");
}

TEST(SafetensorsMalformed, UnknownAndUnsupportedDtype) {
  expect_refused("d.safetensors", R"({"x":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8,
                 "d.safetensors: tensor 'x': unknown dtype 'Q4'");
  expect_refused("i.safetensors", R"({"x":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8,
                 "tensor 'x': dtype I64 is not supported");
}

TEST(SafetensorsMalformed, ShapeDoesNotMatchByteCount) {
  expect_refused("s.safetensors", R"({"x":{"dtype":"BF16","shape":[3,2],"data_offsets":[0,8]}})", 8,
                 "tensor 'x': shape [3,2] BF16 needs 12 bytes but data_offsets span 8");
  // Huge dimensions must not overflow into a "match".
  expect_refused("big.safetensors", R"({"x":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", 0,
                 "tensor 'x': shape [4611686018427387904,4]");
}

TEST(SafetensorsMalformed, TruncatedDataOfRealCheckpoint) {
  TempDir tmp;
  const auto cfg = test_config();
  write_safetensors_dir(tmp / "m", cfg, hf_tensor_specs(cfg), DType::F32, 1ULL << 40, content);
  fs::resize_file(tmp / "m/model.safetensors", fs::file_size(tmp / "m/model.safetensors") - 100);
  EXPECT_INPUT_ERROR(ModelDir(tmp / "m"), "model.safetensors: tensor 'lm_head.weight': data_offsets");
}

TEST(SafetensorsMalformed, ShapeDoesNotMatchConfig) {
  TempDir tmp;
  auto cfg = test_config();
  auto specs = hf_tensor_specs(cfg);
  for (auto& s : specs)
    if (s.name == "model.layers.1.mlp.up_proj.weight") s.shape = {64, 32};
  write_safetensors_dir(tmp / "m", cfg, specs, DType::F32, 1ULL << 40,
                        [](const TensorSpec& s) { return torch::zeros(s.shape); });
  ModelDir dir(tmp / "m");
  std::string msg = error_of<ModelError>([&] { dir.validate(); });
  EXPECT_EQ(msg, "model.layers.1.mlp.up_proj.weight: shape [64,32] in " + (tmp / "m/model.safetensors") +
                     " does not match config [86,32]");
  Llama m(cfg);
  EXPECT_INPUT_ERROR(dir.load_into(m->layer_parameters(1)),
                     "tensor 'model.layers.1.mlp.up_proj.weight' has shape [64,32] but the model expects [86,32]");
}

TEST(SafetensorsMalformed, MissingTensor) {
  TempDir tmp;
  auto cfg = test_config();
  auto specs = hf_tensor_specs(cfg);
  specs.erase(specs.begin() + 3);  // model.layers.0.self_attn.v_proj.weight
  write_safetensors_dir(tmp / "m", cfg, specs, DType::F32, 1ULL << 40, content);
  EXPECT_INPUT_ERROR(ModelDir(tmp / "m").validate(),
                     "model.safetensors: tensor 'model.layers.0.self_attn.v_proj.weight' is missing");
}

TEST(SafetensorsMalformed, TensorListedInIndexMissingFromShard) {
  TempDir tmp;
  auto index = write_sharded(tmp);
  const auto index_path = tmp / "m/model.safetensors.index.json";
  const std::string name = "model.layers.2.mlp.gate_proj.weight";
  const std::string real = index["weight_map"][name];
  const std::string wrong = index["weight_map"]["model.embed_tokens.weight"];
  ASSERT_NE(real, wrong);
  index["weight_map"][name] = wrong;
  std::ofstream(index_path) << index.dump();
  ModelDir dir(tmp / "m");
  const std::string expected = (tmp / "m/") + wrong + ": tensor '" + name + "' listed in " + index_path +
                               " is missing from the file";
  EXPECT_EQ(error_of<ModelError>([&] { dir.validate(); }), expected);
  EXPECT_EQ(error_of<ModelError>([&] { dir.read(name); }), expected);
}

TEST(SafetensorsMalformed, MissingShardFile) {
  TempDir tmp;
  const std::string shard = write_sharded(tmp)["weight_map"]["lm_head.weight"];
  fs::remove(tmp / ("m/" + shard));
  EXPECT_INPUT_ERROR(ModelDir(tmp / "m"), "model.safetensors.index.json: shard file '" + shard + "' (listed for tensor '");
}

TEST(SafetensorsMalformed, MissingConfigOrWeights) {
  TempDir tmp;
  fs::create_directories(tmp / "empty");
  EXPECT_INPUT_ERROR(ModelDir(tmp / "empty"), "config.json: missing config.json");
  std::ofstream(tmp / "empty/config.json") << test_config().to_json().dump();
  EXPECT_INPUT_ERROR(ModelDir(tmp / "empty"), "no model.safetensors or model.safetensors.index.json");
  EXPECT_INPUT_ERROR(ModelDir(tmp / "nowhere"), "nowhere: model directory does not exist");
}

TEST(SafetensorsLazy, ReadingOneShardDoesNotTouchOthers) {
  // A corrupted shard does not prevent reading tensors from the other shards: shards are opened
  // only when one of their tensors is needed.
  TempDir tmp;
  const auto index = write_sharded(tmp);
  const std::string last = index["weight_map"]["lm_head.weight"];
  const std::string first = index["weight_map"]["model.embed_tokens.weight"];
  ASSERT_NE(first, last);
  std::ofstream(tmp / ("m/" + last), std::ios::trunc) << "garbage";
  ModelDir dir(tmp / "m");
  auto spec = hf_tensor_specs(test_config()).front();
  EXPECT_TRUE(torch::equal(dir.read(spec.name), content(spec)));
  EXPECT_INPUT_ERROR(dir.read("lm_head.weight"), last + ": truncated");
}

// The widening behind every 16-bit read: exact for all 65536 bit patterns of bf16 and fp16 (NaN
// stays NaN), on the streaming path (large output, unaligned destination) and the scalar one.
TEST(Widen, ExactForEveryBitPatternOnBothPaths) {
  for (auto kind : {tessera::util::Float16Kind::BF16, tessera::util::Float16Kind::F16}) {
    const int64_t n = 5 * 65536 + 3;  // > kStreamBytes of output; not a multiple of any vector width
    ASSERT_GE(n * 4, tessera::util::kStreamBytes);
    std::vector<uint16_t> src(n);
    for (int64_t i = 0; i < n; ++i) src[i] = static_cast<uint16_t>(i * 40503u);  // odd step: every pattern
    std::vector<float> big(n + 1), small(n);
    tessera::util::widen_to_f32(src.data(), kind, big.data() + 1, n);  // +1: not 16/32-byte aligned
    for (int64_t i = 0; i < n; i += 1000)  // pieces far below kStreamBytes: the scalar path
      tessera::util::widen_to_f32(src.data() + i, kind, small.data() + i, std::min<int64_t>(1000, n - i));
    auto reference = [&](uint16_t v) {
      return kind == tessera::util::Float16Kind::BF16 ? static_cast<float>(c10::BFloat16(v, c10::BFloat16::from_bits()))
                                                      : static_cast<float>(c10::Half(v, c10::Half::from_bits()));
    };
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float want = reference(src[i]);
      for (float got : {big[i + 1], small[i]})
        if (std::isnan(want) ? !std::isnan(got) : std::memcmp(&want, &got, 4) != 0) ++wrong;
    }
    EXPECT_EQ(wrong, 0) << (kind == tessera::util::Float16Kind::BF16 ? "bf16" : "fp16");
  }
}

// In place, as the rank0 loader's receivers widen: the 16-bit input sits in the upper half of the
// output's own bytes (the tightest overlap widen_to_f32 allows), or further up with a gap, on the
// streaming path and the scalar one; the result equals the out-of-place widening.
TEST(Widen, InPlaceFromTheUpperHalfEqualsOutOfPlace) {
  for (auto kind : {tessera::util::Float16Kind::BF16, tessera::util::Float16Kind::F16}) {
    for (int64_t n : {int64_t(7), int64_t(1000), int64_t(3 * 65536 + 5)}) {  // the last one streams
      for (int64_t lead : {int64_t(0), int64_t(1), int64_t(13)}) {  // floats before the output; input gap
        std::vector<uint16_t> src(n);
        for (int64_t i = 0; i < n; ++i) src[i] = static_cast<uint16_t>(i * 40503u + 7);
        std::vector<float> want(n);
        tessera::util::widen_to_f32(src.data(), kind, want.data(), n);
        // Region of lead + n floats; output at float `lead`, input at 16-bit place 2*lead + n + lead
        // (2n bytes past the output's start when lead is 0, lead*2 bytes further otherwise).
        std::vector<float> region(lead + n + lead);
        auto* halves = reinterpret_cast<uint16_t*>(region.data());
        uint16_t* in = halves + 2 * lead + n + lead;
        std::memcpy(in, src.data(), n * 2);
        tessera::util::widen_to_f32(in, kind, region.data() + lead, n);
        EXPECT_EQ(std::memcmp(region.data() + lead, want.data(), n * 4), 0)
            << (kind == tessera::util::Float16Kind::BF16 ? "bf16" : "fp16") << " n=" << n << " lead=" << lead;
      }
    }
  }
}

}  // namespace test_safetensors
