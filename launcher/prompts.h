// Prompts and generated text, shared by `tessera generate` (launcher/cmd_generate.cpp) and the
// samples a training run writes (train.sample_prompts, launcher/train_samples.h): one reading of a
// prompt file, one rendering of its chat records, one decoding of generated ids, so a prompt gives
// the same tokens wherever it is read.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/config.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace tessera::launcher {

struct Prompt {
  std::vector<int64_t> ids;
  std::string where;  // "--prompt", "FILE:LINE"
};

// BOS (when the tokenizer has one) + the text's tokens.
std::vector<int64_t> with_bos(const text::Tokenizer& tok, const std::string& text);

// A prompt file: one JSON object a line, blank lines skipped: {"messages": [...]} rendered by the
// chat template with its generation prompt (text::render_prompt_record), or {"prompt": "..."} as
// text. `chat(where)` gives the template at the first messages record (it may refuse, naming
// `where`). `key` names the option in messages ("--prompts", "train.sample_prompts"). Error(Input)
// naming FILE:LINE for a bad line, and for a file without prompts.
using ChatFor = std::function<const text::ChatTemplate&(const std::string& where)>;
std::vector<Prompt> read_prompt_file(const std::string& path, const std::string& key, const text::Tokenizer& tok,
                                     const ChatFor& chat);

// Every prompt plus max_new tokens fits the model's positions (max_position_embeddings), else
// Error(Input) naming the prompt, the counts and `model_name`; `max_new_key` names the option.
void check_prompt_lengths(const std::vector<Prompt>& prompts, int64_t max_new, const std::string& max_new_key,
                          const model::ModelConfig& mc, const std::string& model_name);

// The model's end-of-sequence ids: config.json's, and generation_config.json's in `model_dir` when
// it has one (Llama 3 Instruct lists <|eot_id|> there). model_dir "" (a preset): config's only.
std::vector<int64_t> eos_ids(const model::ModelConfig& mc, const std::string& model_dir);

// The text of generated ids: ids the tokenizer does not know (rows of a model's vocabulary beyond
// it) and, when ends_with_eos, the final end-of-sequence id have none.
std::string text_of(const text::Tokenizer& tok, std::vector<int64_t> ids, bool ends_with_eos);

}  // namespace tessera::launcher
