// The typed run configuration (launcher/config.h): every key of the schema is bound to its own
// field (setting one key changes that key's field and no other), defaults, bounds and choices come
// from the one table, what json() writes reads back to the same configuration, and the choices of
// enumerated keys are the names the runtime's parsers accept.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "launcher/config.h"
#include "launcher/run_options.h"
#include "runtime/data/dataset.h"
#include "runtime/fsdp/loader.h"
#include "util/error.h"
#include "tests/support/test_support.h"

namespace test_run_config {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace tessera;
using namespace tessera::launcher;
using nlohmann::json;
using tessera::test::error_of;

namespace {

// A valid value of `k` other than its default.
json other_value(const ConfigKey& k) {
  if (!k.choices.empty())
    for (const auto& c : k.choices)
      if (c != k.default_value.get<std::string>()) return c;
  if (k.type == "bool") return !k.default_value.get<bool>();
  if (k.type == "string") return k.default_value.get<std::string>() + "/other";
  if (k.type == "int list") return json::array({1, 2});
  if (k.type == "string list") return json::array({"q_proj", "v_proj"});
  if (k.key == "comm.emulate_ranks") return 8;  // 0 (off) or >= 2: 1 is refused
  if (k.type == "int") return k.default_value.get<int64_t>() + 1;  // every int bound is a minimum
  const double d = k.default_value.get<double>();
  return k.max && d + 0.25 >= *k.max ? d / 2 : d + 0.25;
}

json at_key(const json& j, const std::string& key) {
  std::string p = "/" + key;
  std::replace(p.begin(), p.end(), '.', '/');
  return j.at(json::json_pointer(p));
}

}  // namespace

TEST(RunConfig, DefaultsComeFromTheSchema) {
  const Config c;
  for (const auto& k : config_schema()) EXPECT_EQ(k.value(c), k.default_value) << k.key;
  EXPECT_EQ(c.train.steps, 20);
  EXPECT_EQ(c.fsdp.strategy, fsdp::Strategy::FullShard);
  EXPECT_EQ(c.model.load, fsdp::LoadMode::Rank0);
  EXPECT_EQ(c.comm.timeout_s, 600.0);
}

// Catches a key bound to another key's field (a copy-pasted member pointer) and keys missing from json().
TEST(RunConfig, EveryKeyHasAFieldOfItsOwn) {
  const json defaults = Config().json();
  std::set<std::string> keys;
  for (const auto& k : config_schema()) {
    EXPECT_TRUE(keys.insert(k.key).second) << "declared twice: " << k.key;
    Config c;
    const json v = other_value(k);
    c.set(k.key, v);
    const json written = c.json();
    EXPECT_EQ(at_key(written, k.key), v) << k.key;
    for (const auto& other : config_schema()) {
      if (other.key != k.key) {
        EXPECT_EQ(at_key(written, other.key), at_key(defaults, other.key)) << k.key << " changed " << other.key;
      }
    }
    // A value that needs another key (optim.in_backward needs train.clip = 0) is refused alone at
    // config check; the round trip then runs with that key set too.
    // lora.* other than lora.rank need LoRA on (lora.rank > 0); lora.double_quant needs nf4.
    json valid = written;
    std::vector<std::string> sets = {k.key + "=" + (v.is_string() ? v.get<std::string>() : v.dump())};
    if (k.key == "optim.in_backward") valid["train"]["clip"] = 0.0, sets.push_back("train.clip=0");
    if (k.key.rfind("lora.", 0) == 0 && k.key != "lora.rank") valid["lora"]["rank"] = 4, sets.push_back("lora.rank=4");
    if (k.key == "lora.double_quant") valid["lora"]["base_dtype"] = "nf4", sets.push_back("lora.base_dtype=nf4");
    EXPECT_EQ(Config::from_json(valid, "written").json(), valid) << k.key;
    EXPECT_EQ(Config::load("", sets).json(), valid) << k.key;
  }
}

TEST(RunConfig, TypedFieldsHoldWhatWasSet) {
  const Config c = Config::load("", {"train.schedule=linear", "fsdp.mixed_precision=bf16", "fsdp.strategy=hybrid_shard",
                                     "data.truncation=left", "optim.state_dtype=bf16", "train.preempt_signal=USR1",
                                     "train.profile_steps=[2,3]", "fsdp.activation_checkpointing=false",
                                     "data.train_on=all", "data.chat_template=llama3", "model.load=parallel"});
  EXPECT_EQ(c.schedule.kind, optim::Schedule::Linear);
  EXPECT_EQ(c.fsdp.mixed_precision, util::FloatType::BF16);
  EXPECT_EQ(c.fsdp.strategy, fsdp::Strategy::HybridShard);
  EXPECT_EQ(c.data.truncation, data::Truncation::Left);
  EXPECT_EQ(c.optim.state_dtype, optim::StateDtype::BF16);
  EXPECT_EQ(c.train.preempt_signal, train::PreemptSignal::USR1);
  EXPECT_EQ(c.train.profile_steps, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(c.fsdp.activation_checkpointing, Recompute::False);
  EXPECT_EQ(c.data.train_on, TrainOn::All);
  EXPECT_EQ(c.data.chat_template, text::ChatTemplateKind::Llama3);
  EXPECT_EQ(c.model.load, fsdp::LoadMode::Parallel);
}

// The schema's choices are the runtime's own lists, so a name the config accepts is one the
// runtime's parser accepts and the other way round.
TEST(RunConfig, ChoicesAreTheRuntimeNames) {
  std::map<std::string, std::vector<std::string>> choices;
  for (const auto& k : config_schema()) choices[k.key] = k.choices;
  EXPECT_EQ(choices["fsdp.strategy"], fsdp::strategy_names());
  EXPECT_EQ(choices["fsdp.accumulate"], fsdp::accumulate_names());
  EXPECT_EQ(choices["model.load"], fsdp::load_mode_names());
  EXPECT_EQ(choices["data.truncation"], data::truncation_names());
  EXPECT_EQ(choices["data.chat_template"], text::chat_template_names());
  EXPECT_EQ(choices["train.schedule"], optim::schedule_names());
  EXPECT_EQ(choices["fsdp.mixed_precision"], util::float_type_names());
  for (const auto& n : fsdp::load_mode_names()) EXPECT_EQ(fsdp::to_string(fsdp::parse_load_mode(n)), n);
  for (const auto& n : fsdp::strategy_names()) EXPECT_EQ(fsdp::to_string(fsdp::parse_strategy(n)), n);
  for (const auto& n : data::truncation_names()) (void)data::parse_truncation(n);
  for (const auto& n : text::chat_template_names()) EXPECT_EQ(text::make_chat_template(n)->name(), n);
}

TEST(RunConfig, BoundsAreCheckedWhenReadNamingTheKey) {
  EXPECT_NE(error_of([] { Config::load("", {"train.steps=0"}); }).find("--set: config key 'train.steps' must be >= 1, got 0"),
            std::string::npos);
  EXPECT_NE(error_of([] { Config::load("", {"data.val_fraction=1"}); }).find("'data.val_fraction' must be < 1, got 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { Config::load("", {"comm.timeout_s=0"}); }).find("'comm.timeout_s' must be >= 0.001, got 0"),
            std::string::npos);
  EXPECT_NE(error_of([] { Config::load("", {"comm.timeout_s=1e8"}); }).find("'comm.timeout_s' must be <= 10000000"),
            std::string::npos);
  EXPECT_NE(error_of([] { Config::from_json(json::parse(R"({"train": {"beta2": 1.0}})"), "run.json"); })
                .find("run.json: config key 'train.beta2' must be < 1, got 1.0"),
            std::string::npos);
  EXPECT_NE(error_of([] { Config().set("log.every", 0); }).find("'log.every' must be >= 1"), std::string::npos);
  EXPECT_NE(error_of([] { Config::load("", {"train.schedule=step"}); }).find("expected one of cosine, linear, constant"),
            std::string::npos);
  EXPECT_NO_THROW(Config::load("", {"data.val_fraction=0.5", "comm.timeout_s=0.001", "train.clip=0"}));
}

TEST(RunConfig, ReferenceShowsBoundsAndChoices) {
  const std::string ref = Config::reference_markdown();
  EXPECT_NE(ref.find("| `train.steps` | int | `20` | Optimizer steps. Bounds: >= 1. |"), std::string::npos) << ref;
  EXPECT_NE(ref.find("Bounds: >= 0, < 1."), std::string::npos);
  EXPECT_NE(ref.find("One of `cosine`, `linear`, `constant`."), std::string::npos);
  size_t rows = 0;
  for (size_t p = ref.find("\n| `"); p != std::string::npos; p = ref.find("\n| `", p + 1)) ++rows;
  EXPECT_EQ(rows, config_schema().size());
}

// train::Settings{} and fsdp::Options{} are what the runtime does when a library caller sets
// nothing; `tessera train` with no configuration must do the same. The schema's defaults are the
// owners' initialisers (config.cpp reads them), so the keys' defaults are a default Settings'.
TEST(RunConfig, RuntimeDefaultsAreTheSchemaDefaults) {
  const Config c;
  const train::Settings& t = c;
  const train::Settings lib;
  EXPECT_EQ(t.train.steps, lib.train.steps);
  EXPECT_EQ(t.schedule.lr, lib.schedule.lr);
  EXPECT_EQ(t.schedule.kind, lib.schedule.kind);
  EXPECT_EQ(t.optim.clip, lib.optim.clip);
  EXPECT_EQ(t.optim.state_dtype, lib.optim.state_dtype);
  EXPECT_EQ(t.checkpoint.keep, lib.checkpoint.keep);
  EXPECT_EQ(t.log.every, lib.log.every);
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"train.lr", 3e-4}, {"train.min_lr", 3e-5}, {"train.warmup_steps", 5}, {"train.clip", 1.0},
           {"train.beta2", 0.95}, {"checkpoint.keep", 2}, {"checkpoint.resume", "auto"}, {"log.every", 1}})
    EXPECT_EQ(Config().json().at(nlohmann::json::json_pointer("/" + key.substr(0, key.find('.')) + "/" +
                                                             key.substr(key.find('.') + 1))),
              value)
        << key;
  const fsdp::Options f = fsdp_options_from(c, model::ModelConfig::preset("tiny")), flib;
  EXPECT_EQ(f.strategy, flib.strategy);
  EXPECT_EQ(f.param_dtype, flib.param_dtype);
  EXPECT_EQ(f.reduce_dtype, flib.reduce_dtype);
  EXPECT_EQ(f.activation_checkpointing, flib.activation_checkpointing);  // auto: off below hidden 4096
  EXPECT_EQ(f.prefetch, flib.prefetch);
  EXPECT_EQ(f.limit_all_gathers, flib.limit_all_gathers);
  EXPECT_EQ(f.accumulate, flib.accumulate);
}

}  // namespace test_run_config
