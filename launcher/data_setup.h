// The data side of `tessera train`: which tokenizer (data.tokenizer and the model), the chat
// template (printed on rank 0), the training and validation datasets, and the messages about dropped examples.
#pragma once
#include <memory>
#include <string>

#include "launcher/config.h"
#include "model/config.h"
#include "runtime/data/dataset.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace tessera::launcher {

// What data.tokenizer resolves to for a model:
//   "bytes"           byte-level tokens;
//   a path            that tokenizer (text::make_tokenizer: a SentencePiece model, or a
//                     tokenizer.json / a directory holding one);
//   "" (the default)  the model directory's own tokenizer.model when it has one, else its
//                     tokenizer.json, else byte-level tokens when the model's vocabulary is the byte
//                     vocabulary (its BOS/EOS ids are 256/257, as the tiny presets'), else
//                     Error(Input) naming the model's vocab size and how to fix it.
// `model_dir` is empty for a preset model; `model_name` names the model in messages.
//
// This choice is the ONE decision of what text a model reads, made from the model being trained or
// scored (train: model.path; eval: --model; generation likewise): the tokenizer, and through
// chat_template_for the chat template it renders records with. Nothing else picks either.
struct TokenizerChoice {
  bool bytes = false;
  std::string path;  // the tokenizer when !bytes
  // A Hugging Face tokenizer.json (the file or its directory), not a SentencePiece model.
  bool bpe() const;
  // The tokenizer_config.json beside the tokenizer (its file's directory, or the directory given)
  // when the rank that chose it sees one there; "" without one and for byte-level tokens.
  // model.load=rank0 broadcasts it with `path`.
  std::string config;
};
TokenizerChoice choose_tokenizer(const std::string& spec, const std::string& model_dir, const std::string& model_name,
                                 const model::ModelConfig& mc);

// data.chat_template resolved for the tokenizer `tc`: auto renders the chat_template of tc.config
// (llama2 when there is none; the byte tokenizer: llama2); another value is that template.
// Error(Input) when tc.config (seen by the rank that chose the tokenizer) is not visible on this rank.
text::ChatTemplateChoice chat_template_for(const TokenizerChoice& tc, text::ChatTemplateKind kind);

// The directory holding the tokenizer files of a run (data.tokenizer `spec`, else the model
// directory): "" for byte-level tokens or a preset. `tessera ckpt consolidate` copies them from there.
std::string tokenizer_dir(const std::string& spec, const std::string& model_dir);

struct DataSetup {
  std::unique_ptr<text::Tokenizer> tokenizer;
  std::unique_ptr<text::ChatTemplate> chat;
  std::shared_ptr<data::TokenDataset> train, val;  // val: null without validation data
  data::ReadStats read_stats;                      // records dropped while reading (all files)
};

// Loads data.path (and data.val_path or the data.val_fraction split) with `tokenizer` (made from
// `tc`, whose chat template renders the records), for a model of `mc` and sequences of data.seq_len.
// Bad keys or data throw Error(Input); dropped records are listed on stderr by `print_warnings`
// (rank 0 only). Throws when nothing trainable remains.
DataSetup setup_data(const Config& cfg, const model::ModelConfig& mc, const TokenizerChoice& tc,
                     std::unique_ptr<text::Tokenizer> tokenizer, bool print_warnings);

}  // namespace tessera::launcher
