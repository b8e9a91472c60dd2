// PEFT LoRA adapter files (model/peft_adapter.h): the writer's output read back by a reader written
// separately in Python here (the safetensors header parsed by hand, adapter_config.json's fields, the
// key names and shapes derived from the base config, the tensor bytes), and by PeftAdapter; the
// target rule (suffixes, all-linear); every refusal names its file and key.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstring>
#include <map>
#include <string>

#include "model/errors.h"
#include "model/peft_adapter.h"
#include "model/registry.h"
#include "model/safetensors.h"
#include "tests/support/test_support.h"

namespace test_peft_adapter {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace tessera;
using namespace tessera::model;
using tessera::test::TempDir;

namespace {

PeftConfig adapter_config(int64_t r, std::vector<std::string> targets) {
  PeftConfig c;
  c.r = r;
  c.lora_alpha = 16;
  c.lora_dropout = 0.1;
  c.target_modules = std::move(targets);
  c.base_model_name_or_path = "meta-llama/base";
  return c;
}

// A base model directory named "base" (config.json only: the reader checks shapes against it).
std::string base_dir(const TempDir& dir, const ModelConfig& cfg) {
  const std::string d = dir / "base";
  std::filesystem::create_directories(d);
  tessera::test::write_file(d + "/config.json", cfg.to_json().dump());
  return d;
}

// Writes an adapter whose tensors are seeded by their index; returns them by module tree name.
std::map<std::string, at::Tensor> write_adapter(const std::string& out, const PeftConfig& c, const ModelConfig& base,
                                                DType dtype = DType::F32) {
  std::map<std::string, at::Tensor> made;
  write_peft_adapter(out, c, base, dtype, [&](const TensorSpec& s) {
    torch::manual_seed(static_cast<uint64_t>(made.size()) + 1);
    return made[s.name] = torch::randn(s.shape);
  });
  return made;
}

const char* kPythonReader = R"PY(
import json, os, struct, sys
d, layers, hidden, kv, inter, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
cfg = json.load(open(os.path.join(d, "adapter_config.json")))
want = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 16, "lora_dropout": 0.1,
        "target_modules": ["down_proj", "q_proj", "v_proj"], "bias": "none", "fan_in_fan_out": False,
        "inference_mode": True, "use_rslora": False, "use_dora": False, "base_model_name_or_path": "meta-llama/base"}
for k, v in want.items():
    assert cfg[k] == v, (k, cfg.get(k), v)
assert isinstance(cfg["r"], int) and isinstance(cfg["lora_alpha"], int)
data = open(os.path.join(d, "adapter_model.safetensors"), "rb").read()
(n,) = struct.unpack("<Q", data[:8])
assert n % 8 == 0
header = json.loads(data[8:8 + n])
header.pop("__metadata__", None)
r = 4
shapes = {}
for i in range(layers):
    for mod, o, inp in (("self_attn.q_proj", hidden, hidden), ("self_attn.v_proj", kv, hidden), ("mlp.down_proj", hidden, inter)):
        m = "base_model.model.model.layers.%d.%s" % (i, mod)
        shapes[m + ".lora_A.weight"] = [r, inp]
        shapes[m + ".lora_B.weight"] = [o, r]
assert set(header) == set(shapes), set(header) ^ set(shapes)
cursor = 0
for k, v in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    assert v["dtype"] == "F32" and v["shape"] == shapes[k], (k, v)
    b, e = v["data_offsets"]
    assert b == cursor and e - b == 4 * v["shape"][0] * v["shape"][1], (k, v)
    cursor = e
    open(os.path.join(out, k), "wb").write(data[8 + n + b:8 + n + e])
assert 8 + n + cursor == len(data)
print(len(header))
)PY";

}  // namespace

TEST(PeftAdapterFiles, WriterOutputReadBySeparateReader) {
  TempDir dir("peft");
  const ModelConfig base = tessera::test::tiny_model(2);
  const auto made2 = write_adapter(dir / "ad", adapter_config(4, {"v_proj", "q_proj", "down_proj"}), base);
  const std::string reader = dir.write("reader.py", kPythonReader);
  std::filesystem::create_directories(dir / "raw");
  const int64_t kv = base.num_key_value_heads * base.head_dim();
  const std::string cmd = "/usr/bin/python3 " + reader + " " + (dir / "ad") + " 2 " + std::to_string(base.hidden_size) +
                          " " + std::to_string(kv) + " " + std::to_string(base.intermediate_size) + " " + (dir / "raw");
  EXPECT_EQ(tessera::test::run_capture(cmd), "12\n");
  for (const auto& [name, t] : made2) {
    const std::string bytes = tessera::test::read_file(dir / ("raw/base_model.model." + name));
    ASSERT_EQ(bytes.size(), static_cast<size_t>(t.numel() * 4)) << name;
    EXPECT_EQ(std::memcmp(bytes.data(), t.data_ptr<float>(), bytes.size()), 0) << name;
  }
  // and read back by PeftAdapter against the base
  const PeftAdapter a(dir / "ad", base, base_dir(dir, base));
  ASSERT_EQ(a.targets().size(), 6u);
  EXPECT_EQ(a.config().scale(), 4.0);
  for (const auto& t : a.targets()) {
    EXPECT_TRUE(torch::equal(a.read_a(t), made2.at(t.a.name))) << t.a.name;
    EXPECT_TRUE(torch::equal(a.read_b(t), made2.at(t.b.name))) << t.b.name;
  }
  EXPECT_EQ(a.targets()[0].module, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(a.targets()[0].base_weight, "model.layers.0.self_attn.q_proj.weight");
}

TEST(PeftAdapterFiles, TargetRule) {
  const ModelConfig base = tessera::test::tiny_model(3);
  EXPECT_EQ(lora_targets(base, adapter_config(2, {"all-linear"}), "x").size(), 3u * 7u);
  EXPECT_EQ(lora_targets(base, adapter_config(2, {"self_attn.o_proj", "up_proj"}), "x").size(), 3u * 2u);
  const auto t = lora_targets(base, adapter_config(2, {"gate_proj"}), "x");
  EXPECT_EQ(t[0].a.shape, (std::vector<int64_t>{2, base.hidden_size}));
  EXPECT_EQ(t[0].b.shape, (std::vector<int64_t>{base.intermediate_size, 2}));
  EXPECT_INPUT_ERROR(lora_targets(base, adapter_config(2, {"q_proj", "embed_tokens"}), "cfg.json"), "cfg.json",
                     "\"embed_tokens\"", "matches no linear module");
  EXPECT_INPUT_ERROR(lora_targets(base, adapter_config(2, {"proj"}), "cfg.json"), "\"proj\"");  // a suffix, not a substring
}

TEST(PeftAdapterRefusals, ConfigKeys) {
  TempDir dir("peft");
  const ModelConfig base = tessera::test::tiny_model(2);
  const std::string bd = base_dir(dir, base);
  write_adapter(dir / "ad", adapter_config(4, {"q_proj"}), base);
  const std::string cfg_path = dir / "ad/adapter_config.json";
  const std::string good = tessera::test::read_file(cfg_path);
  auto with = [&](const char* key, const nlohmann::json& v) {
    nlohmann::json j = nlohmann::json::parse(good);
    j[key] = v;
    tessera::test::write_file(cfg_path, j.dump());
    return [&] { PeftAdapter a(dir / "ad", base, bd); };
  };
  EXPECT_INPUT_ERROR(with("use_rslora", true)(), "adapter_config.json", "use_rslora true");
  EXPECT_INPUT_ERROR(with("bias", "all")(), "bias \"all\"");
  EXPECT_INPUT_ERROR(with("fan_in_fan_out", true)(), "fan_in_fan_out true");
  EXPECT_INPUT_ERROR(with("use_dora", true)(), "use_dora true", "DoRA");
  EXPECT_INPUT_ERROR(with("rank_pattern", {{"q_proj", 8}})(), "rank_pattern");
  EXPECT_INPUT_ERROR(with("alpha_pattern", {{"q_proj", 8}})(), "alpha_pattern");
  EXPECT_INPUT_ERROR(with("modules_to_save", {"lm_head"})(), "modules_to_save");
  EXPECT_INPUT_ERROR(with("layers_to_transform", {0})(), "layers_to_transform");
  EXPECT_INPUT_ERROR(with("target_modules", ".*proj")(), "target_modules", "regular expression");
  EXPECT_INPUT_ERROR(with("peft_type", "PREFIX_TUNING")(), "peft_type \"PREFIX_TUNING\"");
  EXPECT_INPUT_ERROR(with("task_type", "SEQ_CLS")(), "task_type \"SEQ_CLS\"");
  EXPECT_INPUT_ERROR(with("r", 0)(), "r 0", "positive integer");
  EXPECT_INPUT_ERROR(with("lora_alpha", -1)(), "lora_alpha -1");
  EXPECT_INPUT_ERROR(with("lora_dropout", 1.5)(), "lora_dropout 1.5");
  EXPECT_INPUT_ERROR(with("base_model_name_or_path", "/models/other")(), "base_model_name_or_path \"/models/other\"",
                     "does not name the base model");
  // The name matches by last component, and an empty name is accepted (shapes are then the check).
  with("base_model_name_or_path", "/somewhere/else/base/")();
  with("base_model_name_or_path", "")();
  tessera::test::write_file(cfg_path, "{not json");
  EXPECT_INPUT_ERROR(PeftAdapter(dir / "ad", base, bd), "adapter_config.json", "not valid JSON");
}

TEST(PeftAdapterRefusals, TensorKeysAndShapes) {
  TempDir dir("peft");
  const ModelConfig base = tessera::test::tiny_model(2);
  const std::string bd = base_dir(dir, base);
  const PeftConfig c = adapter_config(4, {"q_proj"});
  write_adapter(dir / "ad", c, base);
  const std::string st = dir / "ad/adapter_model.safetensors";
  auto rewrite = [&](std::vector<TensorSpec> specs) {
    std::filesystem::remove(st);
    write_safetensors_file(st, specs, DType::F32, [](const TensorSpec& s) { return torch::zeros(s.shape); });
  };
  std::vector<TensorSpec> specs;
  for (const auto& t : lora_targets(base, c, "x"))
    for (const TensorSpec* s : {&t.a, &t.b}) specs.push_back({kPeftKeyPrefix + s->name, s->shape});
  const std::string a0 = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";

  auto extra = specs;
  extra.push_back({"base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight", {4, base.hidden_size}});
  rewrite(extra);
  EXPECT_INPUT_ERROR(PeftAdapter(dir / "ad", base, bd), "adapter_model.safetensors",
                     "tensor base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight is not a LoRA tensor");
  auto named_default = specs;
  named_default[0].name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight";
  rewrite(named_default);
  EXPECT_INPUT_ERROR(PeftAdapter(dir / "ad", base, bd), "lora_A.default.weight", "without the adapter name");
  auto missing = specs;
  missing.erase(missing.begin());
  rewrite(missing);
  EXPECT_INPUT_ERROR(PeftAdapter(dir / "ad", base, bd), "tensor " + a0 + " is missing");
  auto shaped = specs;
  shaped[0].shape = {4, base.hidden_size + 1};
  rewrite(shaped);
  EXPECT_INPUT_ERROR(PeftAdapter(dir / "ad", base, bd), a0, "shape [4," + std::to_string(base.hidden_size + 1) + "]",
                     "needs [4," + std::to_string(base.hidden_size) + "]");
  // r of the config differs from the tensors'
  rewrite(specs);
  nlohmann::json j = nlohmann::json::parse(tessera::test::read_file(dir / "ad/adapter_config.json"));
  j["r"] = 8;
  tessera::test::write_file(dir / "ad/adapter_config.json", j.dump());
  EXPECT_INPUT_ERROR(PeftAdapter(dir / "ad", base, bd), a0, "needs [8,");
  // PEFT's pickle format only
  std::filesystem::rename(st, dir / "ad/adapter_model.bin");
  EXPECT_INPUT_ERROR(PeftAdapter(dir / "ad", base, bd), "adapter_model.safetensors: missing", "safe_serialization=True");
  // the writer refuses a non-empty directory and leaves it as it was
  EXPECT_INPUT_ERROR(write_adapter(dir / "ad", c, base), "exists and is not empty");
  EXPECT_TRUE(std::filesystem::exists(dir / "ad/adapter_model.bin"));
}

}  // namespace test_peft_adapter
