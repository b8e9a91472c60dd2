// Hugging Face tokenizer.json, byte-level BPE (the GPT-2 / tiktoken family: Llama 3.x, GPT-2-style
// models), as a data::Tokenizer. Encoding follows the `tokenizers` library:
//  1. added tokens (added_tokens[], e.g. <|begin_of_text|>) are cut out of the text first,
//     leftmost-longest, and become their own ids: special tokens written in the text ARE specials;
//  2. the pre-tokenizer splits the rest: Split steps with a regex (behaviour Isolated; Llama 3's
//     pattern with \p{L} / \p{N} classes, run by PCRE2 in UTF + UCP mode) and a final ByteLevel step
//     (its own GPT-2 regex when use_regex, a leading space when add_prefix_space);
//  3. each piece's bytes go through the GPT-2 byte-to-unicode map (the vocabulary's spelling) and
//     BPE: with model.ignore_merges a piece that is a vocabulary entry is that id; otherwise the
//     adjacent pair with the lowest merge rank (model.merges order) is merged, leftmost first,
//     until no pair has a merge.
// Bytes that are not valid UTF-8 never match the regexes and form pieces of their own.
// decode() concatenates the ids' bytes (added tokens: their content).
//
// BOS / EOS: tokenizer_config.json beside tokenizer.json (bos_token / eos_token, a string or an
// {"content": ...} object, null for none) when it exists; else BOS is the special token a
// TemplateProcessing post_processor puts before the text, and EOS the one after it (none: -1).
// vocab_size() is the largest id + 1 (model.vocab and added_tokens).
//
// Anything else is refused with a one-line error naming the file and the field: a model.type other
// than BPE (WordPiece, Unigram, WordLevel), a normalizer, a pre-tokenizer or decoder that is not
// byte-level (e.g. Metaspace, as in SentencePiece-converted files: use their tokenizer.model),
// dropout, byte_fallback, subword prefixes/suffixes, added tokens with lstrip/rstrip/single_word,
// merges of unknown tokens, vocabulary entries outside the byte-level alphabet.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/data/tokenizer.h"

namespace tessera::data {

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(const std::string& tokenizer_json_path);
  ~BpeTokenizer() override;

  std::vector<int32_t> encode(const std::string& text) const override;  // thread-safe
  int32_t bos_id() const override;
  int32_t eos_id() const override;
  int64_t vocab_size() const override;
  std::string name() const override;  // "bpe:<path>"
  std::optional<int32_t> special_id(const std::string& text) const override;
  // The bytes the ids stand for; Error(Input) for an id that is not in the vocabulary.
  std::string decode(const std::vector<int32_t>& ids) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::data
