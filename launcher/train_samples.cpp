#include "launcher/train_samples.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "launcher/bootstrap.h"
#include "util/error.h"
#include "util/json.h"

namespace tessera::launcher {

TrainSamples::TrainSamples(const train::Settings& settings, SampleSources sources, train::CausalLm lm,
                           fsdp::Engine& engine, comm::CommPtr host_world)
    : opts_(settings.sample),
      seed_(settings.train.seed),
      path_(settings.log_dir() + "/samples.jsonl"),
      src_(std::move(sources)),
      rank0_(host_world->rank() == 0) {
  TESSERA_CHECK(src_.tokenizer && src_.chat, "TrainSamples needs the run's tokenizer and chat template");
  auto chat = [this](const std::string&) -> const text::ChatTemplate& { return *src_.chat; };
  prompts_ = read_prompt_file(opts_.prompts, "train.sample_prompts", *src_.tokenizer, chat);
  check_prompt_lengths(prompts_, opts_.max_new_tokens, "train.sample_max_new_tokens", src_.model, src_.model_name);
  for (const Prompt& p : prompts_)
    for (int64_t id : p.ids)
      TESSERA_CHECK_INPUT(id >= 0 && id < src_.model.vocab_size,
                          p.where + ": token id " + std::to_string(id) + " is outside the model's vocabulary of " +
                              std::to_string(src_.model.vocab_size));
  for (const Prompt& p : prompts_) capacity_ = std::max<int64_t>(capacity_, static_cast<int64_t>(p.ids.size()));
  capacity_ += opts_.max_new_tokens;
  gen_ = std::make_shared<generate::Generator>(std::move(lm), engine, std::move(host_world));
  std::string why;  // appended to by a resumed run; never through a link (util/output_file.h)
  if (rank0_ && !out_.open(path_, util::OutputFile::Mode::Append, why))
    throw TESSERA_INPUT_ERROR("cannot open the samples file " + path_ + " for appending: " + why);
}

void TrainSamples::write(int64_t step, size_t i, const generate::Generation& g) {
  const nlohmann::json rec = {{"step", step},
                              {"prompt", i},
                              {"where", prompts_[i].where},
                              {"prompt_ids", prompts_[i].ids},
                              {"prompt_text", text_of(*src_.tokenizer, prompts_[i].ids, false)},
                              {"generated_ids", g.tokens},
                              {"text", text_of(*src_.tokenizer, g.tokens, g.finish == "eos")},
                              {"finish_reason", g.finish},
                              {"seconds", g.prefill_s + g.decode_s}};
  const std::string line = rec.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (!out_.write(line)) throw TESSERA_INPUT_ERROR("cannot append to the samples file " + path_ + ": " + util::output_error(path_, errno));
}

std::string TrainSamples::operator()(int64_t step) {
  const train::SampleOptions& o = opts_;
  generate::Sampling s;
  s.temperature = o.temperature;
  s.seed = static_cast<uint64_t>(seed_ + step);  // `generate --seed <train.seed + step>` draws the same
  generate::StopRule rule;
  rule.eos = src_.eos;
  gen_->reserve(capacity_);
  int64_t tokens = 0;
  for (size_t i = 0; i < prompts_.size(); ++i) {
    // The prompt's index is its stream, as in generate: a resumed run draws what the uninterrupted one drew.
    const generate::Generation g = gen_->generate(prompts_[i].ids, o.max_new_tokens, s, i, rule);
    tokens += static_cast<int64_t>(g.tokens.size());
    if (rank0_) write(step, i, g);
  }
  gen_->release();
  return std::to_string(prompts_.size()) + " answer(s), " + std::to_string(tokens) + " tokens, " +
         (o.temperature > 0 ? "sampled" : "greedy") + ", in " + path_;
}

train::SampleHook make_train_samples(const train::Settings& settings, SampleSources sources, const std::string& model_dir,
                                     train::CausalLm lm, fsdp::Engine& engine, comm::CommPtr host_world) {
  std::string eos;  // as JSON: model.load=rank0 runs may see the model directory on rank 0 only
  collectively([&] {
    if (host_world->rank() == 0) eos = nlohmann::json(eos_ids(sources.model, model_dir)).dump();
  });
  sources.eos = util::parse_json(host_world->broadcast_string(eos, 0)).get<std::vector<int64_t>>();
  std::shared_ptr<TrainSamples> samples;
  collectively([&] { samples = std::make_shared<TrainSamples>(settings, std::move(sources), std::move(lm), engine, host_world); });
  return [samples](int64_t step) { return (*samples)(step); };
}

}  // namespace tessera::launcher
