// Regression tests for what fuzzing the parsers found (tests/fuzz/README.md lists every finding;
// the inputs themselves are replayed by ctest sanitize.fuzz_replay). Each case is now a one-line
// bad-input error naming the file, where it was a crash, undefined behaviour or a huge allocation.
#include <gtest/gtest.h>

#include <cstring>
#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "launcher/config.h"
#include "model/config.h"
#include "model/errors.h"
#include "model/safetensors.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/data/dataset.h"
#include "runtime/data/reader.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "tests/support/test_support.h"

namespace test_fuzz_findings {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using namespace tessera;
using tessera::test::TempDir;

namespace {

std::string nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

std::string safetensors_bytes(const std::string& header_json, const std::string& data) {
  std::string h = header_json;
  h.append((8 - h.size() % 8) % 8, ' ');
  const uint64_t n = h.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + h + data;
}

}  // namespace

// nlohmann's parser is iterative, but copying, dumping and comparing the parsed value recurse once
// per level: 100000 levels (200 KB) crashed every reader below with a stack overflow (SIGSEGV)
// after the parse succeeded. Every JSON reader now refuses more than 256 levels.
TEST(FuzzFindings, DeeplyNestedJsonIsAnInputErrorInEveryReader) {
  const std::string deep = nested(100000);
  TempDir d;

  const std::string cfg = d.write("run.json", "{\"train\": {\"lr\": " + deep + "}}");
  EXPECT_INPUT_ERROR(launcher::Config::load(cfg), cfg + ":1:", "nested deeper than 256");
  EXPECT_INPUT_ERROR(launcher::Config::load("", {"train.lr=" + deep}), "--set", "train.lr");

  const std::string mcfg = d.write("config.json", "{\"vocab_size\": " + deep + "}");
  EXPECT_INPUT_ERROR(model::ModelConfig::load(mcfg), mcfg, "nested deeper than 256");

  const std::string st = d.write("model.safetensors", safetensors_bytes("{\"__metadata__\": " + deep + "}", ""));
  EXPECT_INPUT_ERROR(model::SafetensorsFile{st}, st, "nested deeper than 256");

  TempDir m;
  m.write("config.json", model::ModelConfig::preset("tiny").to_json().dump());
  const std::string index = m.write("model.safetensors.index.json", "{\"weight_map\": " + deep + "}");
  EXPECT_INPUT_ERROR(model::ModelDir{m.str()}, index, "nested deeper than 256");

  TempDir c;
  const std::string manifest = c.write("manifest.json", "{\"format\": " + deep + "}");
  EXPECT_INPUT_ERROR(checkpoint::Reader{c.str()}, manifest, "nested deeper than 256");

  const std::string jsonl = d.write("data.jsonl", "{\"text\": \"ok\"}\n{\"text\": " + deep + "}\n");
  // A JSONL record is dropped with a warning naming its line (runtime/data/reader.h), not fatal.
  const text::ByteTokenizer bytes;
  data::ReadStats stats;
  data::load_documents({jsonl}, bytes, *text::make_chat_template("llama2"), stats);
  ASSERT_EQ(stats.dropped, 1);
  ASSERT_EQ(stats.warnings.size(), 1u);
  EXPECT_NE(stats.warnings[0].find(jsonl + ":2"), std::string::npos) << stats.warnings[0];
  EXPECT_NE(stats.warnings[0].find("nested deeper than 256"), std::string::npos) << stats.warnings[0];
}

// The limit leaves real documents alone: 256 levels still parse.
TEST(FuzzFindings, JsonNestedUpTo256LevelsStillParses) {
  TempDir d;
  const std::string jsonl = d.write("data.jsonl", "{\"text\": \"abcdefgh\", \"meta\": " + nested(255) + "}\n");
  const text::ByteTokenizer bytes;
  data::ReadStats stats;
  const auto stores = data::load_documents({jsonl}, bytes, *text::make_chat_template("llama2"), stats);
  EXPECT_EQ(stats.dropped, 0);
  ASSERT_EQ(stores.size(), 1u);
  EXPECT_EQ(stores[0]->num_tokens(), 10);  // <s> abcdefgh </s>
}

namespace {
// A one-tensor checkpoint directory: `manifest` with its placeholders replaced, and rank-00000.bin
// holding `data`.
std::string manifest_json(const std::string& file_fields, const std::string& tensors, const std::string& version = "1",
                          const std::string& step = "1") {
  return "{\"format\": \"tessera-checkpoint\", \"format_version\": " + version + ", \"step\": " + step +
         ", \"state\": {}, \"files\": [{\"name\": \"rank-00000.bin\", " + file_fields + "}], \"tensors\": [" + tensors + "]}";
}
std::string tensor_json(const std::string& name, const std::string& shape, const std::string& slices) {
  return "{\"name\": \"" + name + "\", \"kind\": \"param\", \"dtype\": \"F32\", \"shape\": " + shape +
         ", \"slices\": [" + slices + "]}";
}
}  // namespace

// nlohmann's get<uint64_t>() of 1e300 is a float-to-integer conversion out of range (undefined
// behaviour, UBSan), of 2^64-4 an offset that wrapped past the bounds check; format_version
// 2^32+1 read as int was 1.
TEST(FuzzFindings, ManifestIntegersAreCheckedIntegersInRange) {
  TempDir c;
  c.write("rank-00000.bin", std::string(8, '\0'));
  const std::string mpath = c.str() + "/manifest.json";
  const std::string good_file = "\"bytes\": 8, \"crc32c\": 0";
  const std::string one = tensor_json("a", "[1]", "{\"file\": \"rank-00000.bin\", \"offset\": 0, \"begin\": 0, \"numel\": 1}");
  for (const auto& [fields, tensors, version, step, expect] : std::vector<std::array<std::string, 5>>{
           {"\"bytes\": 1e300, \"crc32c\": 0", one, "1", "1", "\"bytes\" must be an integer"},
           {"\"bytes\": 8, \"crc32c\": 4294967296", one, "1", "1", "\"crc32c\" must be an integer"},
           {good_file, one, "1", "1e300", "\"step\" must be an integer"},
           {good_file, one, "4294967297", "1", "unknown format_version 4294967297"},
           {good_file, tensor_json("a", "[1.5]", ""), "1", "1", "\"shape\" must be an integer"},
           {good_file, tensor_json("a", "[1]", "{\"file\": \"rank-00000.bin\", \"offset\": 18446744073709551612, \"begin\": 0, \"numel\": 1}"),
            "1", "1", "\"offset\" must be an integer"},
           {good_file, tensor_json("a", "[1]", "{\"file\": \"rank-00000.bin\", \"offset\": 4, \"begin\": 0, \"numel\": 4611686018427387904}"),
            "1", "1", "slice outside file rank-00000.bin"},
           {good_file, tensor_json("a", "[4294967296, 4294967296, 3]", ""), "1", "1", "with more than 2^63 elements"}}) {
    c.write("manifest.json", manifest_json(fields, tensors, version, step));
    EXPECT_INPUT_ERROR(checkpoint::Reader{c.str()}, mpath, expect);
  }
}

// Two tensors whose slices share bytes of a file passed the Reader; load() then stopped with an
// internal error (exit code 1) in stream_file. It is a bad manifest: an input error naming the file.
TEST(FuzzFindings, OverlappingSlicesAreAnInputErrorWhenStreamed) {
  TempDir c;
  const std::string file = c.write("rank-00000.bin", std::string(8, '\0'));
  c.write("manifest.json", manifest_json("\"bytes\": 8, \"crc32c\": 2351477386",
                                         tensor_json("a", "[2]", "{\"file\": \"rank-00000.bin\", \"offset\": 0, \"begin\": 0, \"numel\": 2}") +
                                             ", " +
                                             tensor_json("b", "[1]", "{\"file\": \"rank-00000.bin\", \"offset\": 4, \"begin\": 0, \"numel\": 1}")));
  const checkpoint::Reader r(c.str());
  float a[2], b[1];
  std::vector<checkpoint::ReadRequest> reqs = r.requests(*r.find("a", "param"), 0, 2, a);
  for (const auto& q : r.requests(*r.find("b", "param"), 0, 1, b)) reqs.push_back(q);
  EXPECT_INPUT_ERROR(r.stream_file(0, reqs), file, "belong to two tensor slices");
}

// The header's byte check multiplies with saturation, so [2^32, 2^32, 0] (0 bytes) passed it, and
// every later numel() overflowed int64 (UBSan: signed integer overflow).
TEST(FuzzFindings, SafetensorsShapeWhoseElementCountOverflowsIsRefused) {
  TempDir d;
  const std::string st = d.write("model.safetensors",
                                 safetensors_bytes("{\"z\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 0], "
                                                   "\"data_offsets\": [0, 0]}}", ""));
  EXPECT_INPUT_ERROR(model::SafetensorsFile{st}, st, "tensor 'z'", "more than 2^63 elements");
  // A zero dimension first is an ordinary empty tensor.
  const std::string ok = d.write("ok.safetensors",
                                 safetensors_bytes("{\"z\": {\"dtype\": \"F32\", \"shape\": [0, 4294967296, 4294967296], "
                                                   "\"data_offsets\": [0, 0]}}", ""));
  EXPECT_EQ(model::SafetensorsFile(ok).entry("z").numel(), 0);
}

// config.json sizes: hidden_size 2^31 (and vocab 2^62, intermediate 2^63-1) made LibTorch throw
// c10::Error "Storage size calculation overflowed" while ModelDir::validate built the meta model,
// and num_hidden_layers 10^9 hung there. Now ModelErrors naming the keys.
TEST(FuzzFindings, ConfigSizesBeyondAnyLlamaAreRefused) {
  auto cfg = [](const std::string& key, const nlohmann::json& value) {
    nlohmann::json j = model::ModelConfig::preset("tiny").to_json();
    j.erase("head_dim");  // derived from hidden_size, as in Llama 2 configs
    j[key] = value;
    return j;
  };
  EXPECT_INPUT_ERROR(model::ModelConfig::from_json(cfg("num_hidden_layers", 1000000000), "c.json"), "c.json",
                     "'num_hidden_layers' 1000000000 is more than 1024");
  for (const auto& [key, value] : std::vector<std::pair<std::string, int64_t>>{
           {"hidden_size", int64_t(1) << 31}, {"vocab_size", int64_t(1) << 62}, {"intermediate_size", INT64_MAX}})
    EXPECT_INPUT_ERROR(model::ModelConfig::from_json(cfg(key, value), "c.json"), "c.json", "more than 2^50");
  // The largest presets are far inside the limits.
  EXPECT_NO_THROW(model::ModelConfig::preset("llama2-70b").validate());
}

// A --set value is a shell argument, which (unlike a JSON file) can hold invalid UTF-8: the error
// message's dump() of it threw nlohmann type_error 316 instead of a config error, and an accepted
// string would have made the checkpoint manifest's dump() throw at the first save.
TEST(FuzzFindings, SetValueThatIsNotUtf8IsAnInputError) {
  EXPECT_INPUT_ERROR(launcher::Config::load("", {"model.path=/data/\xe9t\xe9"}), "--set model.path", "not valid UTF-8");
  EXPECT_INPUT_ERROR(launcher::Config::load("", {"train.lr=[\xff"}), "--set train.lr", "not valid UTF-8");
  EXPECT_EQ(launcher::Config::load("", {"model.path=/data/\xc3\xa9t\xc3\xa9"}).model.path, "/data/\xc3\xa9t\xc3\xa9");
}

// 1e400 parses as JSON syntax but overflows a double: nlohmann throws out_of_range 406, which the
// config reader did not catch (it caught parse_error only), so `tessera train` printed nlohmann's
// message without the file and exited 1.
TEST(FuzzFindings, NumberOutOfRangeInConfigIsAnInputErrorNamingTheFile) {
  TempDir d;
  const std::string cfg = d.write("run.json", "{\"train\": {\"lr\": 1e400}}");
  EXPECT_INPUT_ERROR(launcher::Config::load(cfg), cfg + ": invalid JSON", "number overflow");
  EXPECT_INPUT_ERROR(launcher::Config::load("", {"train.lr=1e400"}), "--set", "'train.lr' must be float");
}

}  // namespace test_fuzz_findings
