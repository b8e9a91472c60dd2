// `tessera generate`: text from a Hugging Face model directory or a sharded checkpoint, the model
// FSDP-sharded over every rank (runtime/generate/generator.h: a KV cache, rank 0 picks each token).
// The text side is training's: the tokenizer choose_tokenizer takes and the chat template
// chat_template_for renders (data_setup.h), from the run configuration: --config, else the
// checkpoint's own (its manifest's state.config), with --set overrides.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "launcher/adapter_source.h"
#include "launcher/bootstrap.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "launcher/config.h"
#include "launcher/data_setup.h"
#include "launcher/model_lm.h"
#include "launcher/prompts.h"
#include "launcher/run_options.h"
#include "model/eval.h"
#include "model/safetensors.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/comm/flight_recorder.h"
#include "runtime/fsdp/loader.h"
#include "runtime/generate/generator.h"
#include "text/chat_template.h"
#include "util/error.h"
#include "util/json.h"

namespace tessera::launcher {
namespace {

namespace fs = std::filesystem;

// What the weights are and where the model's other files are.
struct ModelSource {
  model::ModelConfig mc;
  std::shared_ptr<model::ModelDir> dir;  // --model
  std::string checkpoint;                // --checkpoint
  std::shared_ptr<const model::PeftAdapter> adapter;  // --adapter (with --model)
  nlohmann::json stored_config;          // the checkpoint's run configuration (null for --model)
  std::string name;
};

struct GenerateSetup {
  Config cfg;
  ModelSource src;
  std::unique_ptr<text::Tokenizer> tok;
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
    if (vm.count("adapter")) s.adapter = open_adapter(vm["adapter"].as<std::string>(), s.mc, s.name);
    return s;
  }
  TESSERA_CHECK_INPUT(!vm.count("adapter"), "--adapter applies to a Hugging Face base (--model DIR); a checkpoint "
                                            "holds its own weights");
  s.name = s.checkpoint = vm["checkpoint"].as<std::string>();
  std::error_code ec;
  TESSERA_CHECK_INPUT(fs::exists(fs::path(s.checkpoint) / "manifest.json", ec),
                      "--checkpoint " + s.checkpoint + " has no manifest.json: name one step-<N> directory of a checkpoint.dir");
  const checkpoint::Reader r(s.checkpoint);  // a manifest that does not parse or verify: Error(Input)
  TESSERA_CHECK_INPUT(r.state().contains("model_config"),
                      "--checkpoint " + s.checkpoint + ": its manifest has no state.model_config");
  TESSERA_CHECK_INPUT(!r.state().contains("lora"),
                      "--checkpoint " + s.checkpoint + " is a LoRA checkpoint (adapters only, no base): generate from "
                      "its base with its adapter: tessera lora export --checkpoint " + s.checkpoint +
                          " --out ADAPTER_DIR, then tessera generate --model BASE --adapter ADAPTER_DIR (a finished "
                          "LoRA run wrote <checkpoint.dir>/adapter-step-<N> already)");
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

// --prompts FILE.jsonl (launcher/prompts.h): messages records need the model's chat template, or
// data.chat_template.
std::vector<Prompt> generate_prompt_file(const std::string& path, const GenerateSetup& s, const TokenizerChoice& tc) {
  std::unique_ptr<text::ChatTemplate> chat;
  auto chat_for = [&](const std::string& where) -> const text::ChatTemplate& {
    TESSERA_CHECK_INPUT(s.cfg.data.chat_template != text::ChatTemplateKind::Auto ||
                            (!tc.config.empty() && text::read_model_chat_template(tc.config)),
                        where + ": a \"messages\" prompt, and the model's tokenizer has no chat template (" +
                            (tc.config.empty() ? "no tokenizer_config.json" : tc.config + " has none") +
                            "): set data.chat_template (--set data.chat_template=llama3) or give \"prompt\" text");
    chat = chat_template_for(tc, s.cfg.data.chat_template).chat;
    chat->check(*s.tok);
    return *chat;
  };
  return read_prompt_file(path, "--prompts", *s.tok, chat_for);
}

std::vector<Prompt> read_prompts(const po::variables_map& vm, const GenerateSetup& s, const TokenizerChoice& tc) {
  TESSERA_CHECK_INPUT(vm.count("prompt") + vm.count("prompts") + vm.count("prompt-ids") == 1,
                      "tessera generate needs one of --prompt TEXT, --prompts FILE.jsonl or --prompt-ids FILE");
  if (vm.count("prompt")) {
    const std::string text = vm["prompt"].as<std::string>();
    TESSERA_CHECK_INPUT(!text.empty(), "--prompt is empty");
    return {{with_bos(*s.tok, text), "--prompt"}};
  }
  if (vm.count("prompts")) return generate_prompt_file(vm["prompts"].as<std::string>(), s, tc);
  const std::string path = vm["prompt-ids"].as<std::string>();
  std::vector<Prompt> out;
  int64_t n = 0;
  for (auto& ids : model::read_token_text(path, s.src.mc.vocab_size, 1))
    out.push_back({std::move(ids), path + " sequence " + std::to_string(++n)});
  return out;
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
  s.tok = text::make_tokenizer(tc.bytes ? std::string("bytes") : tc.path);
  s.prompts = read_prompts(vm, s, tc);
  check_prompt_lengths(s.prompts, s.max_new, "--max-new-tokens", s.src.mc, s.src.name);
  s.eos = eos_ids(s.src.mc, model_dir(s));
}

generate::StopRule stop_rule(const GenerateSetup& s) {
  generate::StopRule rule;
  rule.eos = s.eos;
  if (!s.stops.empty())
    rule.stop = [&s](const std::vector<int64_t>& generated) {
      const std::string text = text_of(*s.tok, generated, false);
      return std::any_of(s.stops.begin(), s.stops.end(),
                         [&](const std::string& stop) { return text.find(stop) != std::string::npos; });
    };
  return rule;
}

void load_weights(generate::Generator& gen, const GenerateSetup& s, const Bootstrap& b) {
  collectively([&] {
    if (s.src.dir) {
      std::unique_ptr<fsdp::WeightSource> src = std::make_unique<HfWeightSource>(s.src.dir);
      if (s.src.adapter) src = std::make_unique<AdapterWeightSource>(std::move(src), s.src.adapter);
      fsdp::load_weights(gen.engine(), src.get(), fsdp::LoadMode::Parallel, &b.groups);
    } else {
      checkpoint::load(s.src.checkpoint, gen.engine(), {gen.engine().named_state()});
    }
  });
}

void print_result(const GenerateSetup& s, size_t i, const generate::Generation& g, bool json) {
  const double total = g.prefill_s + g.decode_s;
  const double rate = total > 0 ? static_cast<double>(g.tokens.size()) / total : 0;
  std::string text = text_of(*s.tok, g.tokens, g.finish == "eos");
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
  // One write (std::cerr is unbuffered: piece by piece, mpirun could interleave rank 0's stdout
  // into the middle of the line).
  std::ostringstream line;
  line << "tessera generate: " << s.prompts[i].where << ": " << g.tokens.size() << " tokens (" << g.finish << "), " << rate
       << " tokens/s\n";
  std::cerr << line.str() << std::flush;
}

}  // namespace

int run_generate(const std::vector<std::string>& args) {
  po::options_description desc("generate options");
  desc.add_options()("model", po::value<std::string>(), "Hugging Face model directory (config.json + safetensors)")(
      "checkpoint", po::value<std::string>(), "a sharded checkpoint, DIR/step-N, read directly (no consolidation)")(
      "adapter", po::value<std::string>(), "with --model: a PEFT LoRA adapter directory applied to the base (W + alpha/r B A)")(
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
  auto vm = parse_command("tessera generate (--model DIR [--adapter DIR] | --checkpoint DIR/step-N) (--prompt TEXT | --prompts FILE.jsonl "
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
              << ", " << util::short_name(s.cfg.fsdp.mixed_precision) << ", model " << s.src.name
              << (s.src.adapter ? " + " + describe_adapter(*s.src.adapter, (*vm)["adapter"].as<std::string>()) : "") << ", "
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
