// `tessera generate`: text from a Hugging Face model directory or a sharded checkpoint, the model
// FSDP-sharded over every rank (runtime/generate/generator.h: a KV cache, rank 0 picks each token).
// The text side is training's: the tokenizer choose_tokenizer takes and the chat template
// chat_template_for renders (data_setup.h), from the run configuration: --config, else the
// checkpoint's own (its manifest's state.config), with --set overrides.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "launcher/bootstrap.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "launcher/config.h"
#include "launcher/data_setup.h"
#include "launcher/model_lm.h"
#include "launcher/run_options.h"
#include "model/eval.h"
#include "model/safetensors.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/comm/flight_recorder.h"
#include "runtime/data/chat_template.h"
#include "runtime/error.h"
#include "runtime/fsdp/loader.h"
#include "runtime/generate/generator.h"
#include "util/json.h"

namespace tessera::launcher {
namespace {

namespace fs = std::filesystem;

// What the weights are and where the model's other files are.
struct ModelSource {
  model::ModelConfig mc;
  std::shared_ptr<model::ModelDir> dir;  // --model
  std::string checkpoint;                // --checkpoint
  nlohmann::json stored_config;          // the checkpoint's run configuration (null for --model)
  std::string name;
};

struct Prompt {
  std::vector<int64_t> ids;
  std::string where;  // "--prompt", "FILE:LINE"
};

struct GenerateSetup {
  Config cfg;
  ModelSource src;
  std::unique_ptr<data::Tokenizer> tok;
  std::vector<Prompt> prompts;
  generate::Sampling sampling;
  int64_t max_new = 0;
  std::vector<std::string> stops;
  std::vector<int64_t> eos;
};

std::string string_key(const nlohmann::json& j, const char* pointer) {
  const nlohmann::json::json_pointer p(pointer);
  return j.contains(p) && j.at(p).is_string() ? j.at(p).get<std::string>() : std::string();
}

ModelSource model_source(const po::variables_map& vm) {
  ModelSource s;
  TESSERA_CHECK_INPUT(vm.count("model") + vm.count("checkpoint") == 1,
                      "tessera generate needs one of --model DIR or --checkpoint DIR/step-N");
  if (vm.count("model")) {
    s.name = vm["model"].as<std::string>();
    s.dir = std::make_shared<model::ModelDir>(s.name);
    s.dir->validate();
    s.mc = s.dir->config();
    return s;
  }
  s.name = s.checkpoint = vm["checkpoint"].as<std::string>();
  std::error_code ec;
  TESSERA_CHECK_INPUT(fs::exists(fs::path(s.checkpoint) / "manifest.json", ec),
                      "--checkpoint " + s.checkpoint + " has no manifest.json: name one step-<N> directory of a checkpoint.dir");
  const checkpoint::Reader r(s.checkpoint);  // a manifest that does not parse or verify: Error(Input)
  TESSERA_CHECK_INPUT(r.state().contains("model_config"),
                      "--checkpoint " + s.checkpoint + ": its manifest has no state.model_config");
  s.mc = model::ModelConfig::from_json(r.state()["model_config"], s.checkpoint + "/manifest.json state.model_config");
  s.stored_config = r.state().value("config", nlohmann::json());
  return s;
}

// The run configuration: --config, else the checkpoint's own; --set on top.
Config generate_config(const po::variables_map& vm, const ModelSource& src) {
  std::vector<std::string> sets;
  if (vm.count("set")) sets = vm["set"].as<std::vector<std::string>>();
  const std::string file = vm["config"].as<std::string>();
  if (!file.empty() || src.stored_config.is_null()) return Config::load(file, sets);
  return Config::from_json(src.stored_config, src.checkpoint + "/manifest.json state.config", sets);
}

// The model directory beside the weights: --model, or the checkpoint's model.path.
std::string model_dir(const GenerateSetup& s) {
  return s.src.dir ? s.src.name : string_key(s.src.stored_config, "/model/path");
}

// The model's end-of-sequence ids: config.json's, and generation_config.json's when the model
// directory has one (Llama 3 Instruct lists <|eot_id|> there).
std::vector<int64_t> eos_ids(const GenerateSetup& s) {
  std::vector<int64_t> ids = s.src.mc.eos_token_ids;
  const std::string dir = model_dir(s);
  std::error_code ec;
  const fs::path gen = fs::path(dir) / "generation_config.json";
  if (dir.empty() || !fs::is_regular_file(gen, ec)) return ids;
  const nlohmann::json j = read_json_file(gen.string());
  const nlohmann::json e = j.is_object() ? j.value("eos_token_id", nlohmann::json()) : nlohmann::json();
  for (const auto& id : e.is_array() ? e : nlohmann::json::array({e}))
    if (id.is_number_integer() && std::find(ids.begin(), ids.end(), id.get<int64_t>()) == ids.end())
      ids.push_back(id.get<int64_t>());
  return ids;
}

std::vector<int64_t> with_bos(const data::Tokenizer& tok, const std::string& text) {
  std::vector<int64_t> ids;
  if (tok.bos_id() >= 0) ids.push_back(tok.bos_id());
  for (int32_t id : tok.encode(text)) ids.push_back(id);
  return ids;
}

// --prompts FILE.jsonl: {"messages": [...]} or {"prompt": "..."} per line, blank lines skipped.
std::vector<Prompt> read_prompt_file(const std::string& path, const GenerateSetup& s, const TokenizerChoice& tc) {
  std::ifstream in(path);
  TESSERA_CHECK_INPUT(in.good(), "--prompts " + path + ": cannot open");
  std::unique_ptr<data::ChatTemplate> chat;  // made at the first messages record
  std::vector<Prompt> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    nlohmann::ordered_json record;
    try {
      record = util::parse_json<nlohmann::ordered_json>(line);
    } catch (const nlohmann::json::exception& e) {
      throw TESSERA_INPUT_ERROR(where + ": invalid JSON (" + e.what() + ")");
    }
    if (record.is_object() && record.contains("messages") && !chat) {
      TESSERA_CHECK_INPUT(s.cfg.data.chat_template != data::ChatTemplateKind::Auto ||
                              (!tc.config.empty() && data::read_model_chat_template(tc.config)),
                          where + ": a \"messages\" prompt, and the model's tokenizer has no chat template (" +
                              (tc.config.empty() ? "no tokenizer_config.json" : tc.config + " has none") +
                              "): set data.chat_template (--set data.chat_template=llama3) or give \"prompt\" text");
      chat = chat_template_for(tc, s.cfg.data.chat_template).chat;
      chat->check(*s.tok);
    }
    try {
      const std::vector<int32_t> ids =
          data::render_prompt_record(record, *s.tok, chat ? *chat : *data::make_chat_template(data::ChatTemplateKind::None));
      out.push_back({std::vector<int64_t>(ids.begin(), ids.end()), where});
    } catch (const data::BadExample& e) {
      throw TESSERA_INPUT_ERROR(where + ": " + e.what());
    }
  }
  TESSERA_CHECK_INPUT(!out.empty(), "--prompts " + path + " holds no prompt");
  return out;
}

std::vector<Prompt> read_prompts(const po::variables_map& vm, const GenerateSetup& s, const TokenizerChoice& tc) {
  TESSERA_CHECK_INPUT(vm.count("prompt") + vm.count("prompts") + vm.count("prompt-ids") == 1,
                      "tessera generate needs one of --prompt TEXT, --prompts FILE.jsonl or --prompt-ids FILE");
  if (vm.count("prompt")) {
    const std::string text = vm["prompt"].as<std::string>();
    TESSERA_CHECK_INPUT(!text.empty(), "--prompt is empty");
    return {{with_bos(*s.tok, text), "--prompt"}};
  }
  if (vm.count("prompts")) return read_prompt_file(vm["prompts"].as<std::string>(), s, tc);
  const std::string path = vm["prompt-ids"].as<std::string>();
  std::vector<Prompt> out;
  int64_t n = 0;
  for (auto& ids : model::read_token_text(path, s.src.mc.vocab_size, 1))
    out.push_back({std::move(ids), path + " sequence " + std::to_string(++n)});
  return out;
}

// Every prompt and its new tokens fit the model's positions.
void check_lengths(const GenerateSetup& s) {
  const int64_t limit = s.src.mc.max_position_embeddings;
  for (const Prompt& p : s.prompts) {
    TESSERA_CHECK_INPUT(!p.ids.empty(), p.where + ": the prompt has no tokens");
    const int64_t total = static_cast<int64_t>(p.ids.size()) + s.max_new;
    TESSERA_CHECK_INPUT(total <= limit, p.where + ": the prompt's " + std::to_string(p.ids.size()) +
                                            " tokens + --max-new-tokens " + std::to_string(s.max_new) + " = " +
                                            std::to_string(total) + " exceed the model's max_position_embeddings " +
                                            std::to_string(limit) + " (" + s.src.name + ")");
  }
}

void read_setup(GenerateSetup& s, const po::variables_map& vm) {
  s.src = model_source(vm);
  s.cfg = generate_config(vm, s.src);
  apply_comm_timeout(s.cfg);
  s.max_new = vm["max-new-tokens"].as<int64_t>();
  TESSERA_CHECK_INPUT(s.max_new >= 1, "--max-new-tokens " + std::to_string(s.max_new) + " must be >= 1");
  s.sampling = {vm["temperature"].as<double>(), vm["top-k"].as<int64_t>(), vm["top-p"].as<double>(),
                vm["seed"].as<uint64_t>()};
  generate::validate(s.sampling);
  if (vm.count("stop")) s.stops = vm["stop"].as<std::vector<std::string>>();
  for (const std::string& stop : s.stops) TESSERA_CHECK_INPUT(!stop.empty(), "--stop is an empty string");
  const std::string dir = model_dir(s);
  const TokenizerChoice tc = choose_tokenizer(s.cfg.data.tokenizer, dir, s.src.name, s.src.mc);
  s.tok = data::make_tokenizer(tc.bytes ? std::string("bytes") : tc.path);
  s.prompts = read_prompts(vm, s, tc);
  check_lengths(s);
  s.eos = eos_ids(s);
}

// The generated ids' text: ids the tokenizer does not know (rows of a model's vocabulary beyond it)
// and a final end-of-sequence id have none.
std::string text_of(const GenerateSetup& s, std::vector<int64_t> ids, bool ends_with_eos) {
  if (ends_with_eos && !ids.empty()) ids.pop_back();
  std::vector<int32_t> known;
  for (int64_t id : ids)
    if (id < s.tok->vocab_size()) known.push_back(static_cast<int32_t>(id));
  return s.tok->decode(known);
}

generate::StopRule stop_rule(const GenerateSetup& s) {
  generate::StopRule rule;
  rule.eos = s.eos;
  if (!s.stops.empty())
    rule.stop = [&s](const std::vector<int64_t>& generated) {
      const std::string text = text_of(s, generated, false);
      return std::any_of(s.stops.begin(), s.stops.end(),
                         [&](const std::string& stop) { return text.find(stop) != std::string::npos; });
    };
  return rule;
}

void load_weights(generate::Generator& gen, const GenerateSetup& s, const Bootstrap& b) {
  collectively([&] {
    if (s.src.dir) {
      HfWeightSource src(s.src.dir);
      fsdp::load_weights(gen.engine(), &src, fsdp::LoadMode::Parallel, &b.groups);
    } else {
      checkpoint::load(s.src.checkpoint, gen.engine(), {gen.engine().named_state()});
    }
  });
}

void print_result(const GenerateSetup& s, size_t i, const generate::Generation& g, bool json) {
  const double total = g.prefill_s + g.decode_s;
  const double rate = total > 0 ? static_cast<double>(g.tokens.size()) / total : 0;
  std::string text = text_of(s, g.tokens, g.finish == "eos");
  for (const std::string& stop : s.stops) text = text.substr(0, text.find(stop));  // cut before a --stop string
  if (json) {
    const nlohmann::json out = {{"prompt", i}, {"prompt_ids", s.prompts[i].ids}, {"generated_ids", g.tokens},
                                {"text", text}, {"finish_reason", g.finish}, {"tokens_per_s", rate},
                                {"prefill_s", g.prefill_s}, {"decode_s", g.decode_s}};
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
    return;
  }
  if (s.prompts.size() > 1) std::cout << (i ? "\n" : "") << "--- " << s.prompts[i].where << "\n";
  std::cout << text << std::endl;
  std::cerr << "tessera generate: " << s.prompts[i].where << ": " << g.tokens.size() << " tokens (" << g.finish
            << "), " << rate << " tokens/s" << std::endl;
}

}  // namespace

int run_generate(const std::vector<std::string>& args) {
  po::options_description desc("generate options");
  desc.add_options()("model", po::value<std::string>(), "Hugging Face model directory (config.json + safetensors)")(
      "checkpoint", po::value<std::string>(), "a sharded checkpoint, DIR/step-N, read directly (no consolidation)")(
      "prompt", po::value<std::string>(), "one prompt, as text (BOS + its tokens)")(
      "prompts", po::value<std::string>(), "JSONL: {\"messages\": [...]} (the chat template, with the generation prompt) "
      "or {\"prompt\": \"...\"} per line")(
      "prompt-ids", po::value<std::string>(), "token ids, one prompt a line, as tessera eval --tokens reads them")(
      "max-new-tokens", po::value<int64_t>()->default_value(64), "tokens to generate at most per prompt")(
      "temperature", po::value<double>()->default_value(0.0), "0: greedy; > 0: sampling")(
      "top-k", po::value<int64_t>()->default_value(0), "sample among the k most likely tokens (0: all)")(
      "top-p", po::value<double>()->default_value(1.0), "sample among the most likely tokens of probability p (1: all)")(
      "seed", po::value<uint64_t>()->default_value(0), "sampling seed (the same tokens at any world size)")(
      "stop", po::value<std::vector<std::string>>()->composing(), "stop when the text contains this string (repeatable)")(
      "json", "one JSON object per prompt (prompt_ids, generated_ids, text, finish_reason, tokens_per_s)")(
      "config,c", po::value<std::string>()->default_value(""), "run configuration (data.tokenizer, data.chat_template, "
      "fsdp.strategy, fsdp.mixed_precision, comm.timeout_s, log.dir); default with --checkpoint: the checkpoint's own")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a config key: --set data.chat_template=llama3");
  auto vm = parse_command("tessera generate (--model DIR | --checkpoint DIR/step-N) (--prompt TEXT | --prompts FILE.jsonl "
                          "| --prompt-ids FILE) [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S] "
                          "[--stop TEXT]... [--json] [--config run.json] [--set key=value]...", desc, args);
  if (!vm) return 0;
  const Bootstrap& b = current();
  GenerateSetup s;
  fsdp::Options fopts;
  collectively([&] {
    read_setup(s, *vm);
    fopts = fsdp_options_from(s.cfg, s.src.mc);
  });
  const std::string run_id = agree_run_id(b);
  collectively([&] {  // flight records of a hang or a timeout, as in training
    if (!s.cfg.log.dir.empty()) comm::flight::set_dump_dir(s.cfg.log.dir + "/flight", run_id, b.world_size);
  });
  comm::flight::install_signal_handlers();
  size_t longest = 0;
  for (const Prompt& p : s.prompts) longest = std::max(longest, p.ids.size());
  generate::Generator gen(make_causal_lm(s.src.mc), b.groups, fopts, b.groups.world);
  load_weights(gen, s, b);
  if (b.world_rank == 0)
    std::cerr << "tessera generate: " << b.world_size << " rank(s), " << fsdp::to_string(fopts.strategy)
              << (fopts.strategy == fsdp::Strategy::ShardGradOp ? " (decoder layers stay gathered between tokens)"
                                                                  : " (each decoder layer gathered for every forward; "
                                                                    "fsdp.strategy shard_grad_op keeps them)")
              << ", " << util::short_name(s.cfg.fsdp.mixed_precision) << ", model " << s.src.name << ", "
              << s.prompts.size() << " prompt(s), one at a time, KV cache of " << longest + s.max_new << " positions"
              << std::endl;
  gen.reserve(static_cast<int64_t>(longest) + s.max_new);
  const generate::StopRule rule = stop_rule(s);
  for (size_t i = 0; i < s.prompts.size(); ++i) {
    const generate::Generation g = gen.generate(s.prompts[i].ids, s.max_new, s.sampling, i, rule);
    if (b.world_rank == 0) print_result(s, i, g, vm->count("json") > 0);
  }
  return 0;
}

}  // namespace tessera::launcher
