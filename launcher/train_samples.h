// train.sample_every's samples (runtime/train/options.h SampleOptions): between steps the trainer
// calls a TrainSamples (its SampleHook), which generates an answer to every prompt of
// train.sample_prompts with the model as it is after that step, and rank 0 appends one JSON line per
// prompt to <log dir>/samples.jsonl:
//   {"step": 20, "prompt": 0, "where": "prompts.jsonl:1", "prompt_ids": [...], "prompt_text": "...",
//    "generated_ids": [...], "text": "...", "finish_reason": "eos" | "length", "seconds": 0.41}
// `tessera report` shows them per step (tools/report.h).
//
// The prompts are read, tokenised and rendered by every rank itself, exactly as `tessera generate
// --prompts` reads them (launcher/prompts.h), with the tokenizer and the chat template the run's data
// is rendered with (DataSetup): a messages prompt reads as the training examples do, plus the
// generation prompt. Generation runs over the trainer's own engine (runtime/generate/generator.h:
// every unit gathered for its use, as in the training forward; rank 0 picks each token and
// broadcasts it), one prompt at a time, with a KV cache made for the pause and freed after it.
//
// THREADS: built and called by the trainer's thread (between steps); collective, like the trainer.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "launcher/prompts.h"
#include "runtime/generate/generator.h"
#include "runtime/train/options.h"
#include "runtime/train/trainer.h"
#include "util/output_file.h"

namespace tessera::launcher {

struct SampleSources {
  const text::Tokenizer* tokenizer = nullptr;
  const text::ChatTemplate* chat = nullptr;  // the run's (DataSetup::chat)
  model::ModelConfig model;
  std::vector<int64_t> eos;  // the model's end-of-sequence ids, rank 0's (every rank stops at the same token)
  std::string model_name;    // in messages
};

// The hook for a trainer of the run `settings`, over its engine (Trainer::set_samples takes it):
// rank 0 reads the end-of-sequence ids (eos_ids: generation_config.json in `model_dir` when there
// is one) and broadcasts them, then every rank reads the prompts. Collective; errors end every rank.
train::SampleHook make_train_samples(const train::Settings& settings, SampleSources sources, const std::string& model_dir,
                                     train::CausalLm lm, fsdp::Engine& engine, comm::CommPtr host_world);

class TrainSamples {
 public:
  // Reads and checks the prompts (Error(Input) naming train.sample_prompts' FILE:LINE): call it
  // under `collectively`. `lm` is a copy of the CausalLm the trainer runs on `engine`.
  TrainSamples(const train::Settings& settings, SampleSources sources, train::CausalLm lm, fsdp::Engine& engine,
               comm::CommPtr host_world);
  // The SampleHook: generates every prompt's answer after `step` and returns what it did, in words.
  std::string operator()(int64_t step);

 private:
  void write(int64_t step, size_t i, const generate::Generation& g);

  train::SampleOptions opts_;
  int64_t seed_;
  std::string path_;  // samples.jsonl
  SampleSources src_;
  std::vector<Prompt> prompts_;
  int64_t capacity_ = 0;
  std::shared_ptr<generate::Generator> gen_;
  bool rank0_;
  util::OutputFile out_;  // rank 0
};

}  // namespace tessera::launcher
