// Hugging Face tokenizer.json with a BPE model, as a text::Tokenizer, following the `tokenizers`
// library. Two kinds:
//  - byte-level BPE (the GPT-2 / tiktoken family: Llama 3.x, Qwen, GPT-2-style models): a
//    pre-tokenizer with a ByteLevel step; vocabulary spelled in GPT-2's byte-to-unicode alphabet;
//  - the SentencePiece-converted kind (Llama 2, Mistral, Gemma and most Llama-2-derived models): no
//    pre-tokenizer, Split steps or Metaspace, normalizers such as Prepend("▁") + Replace(" " -> "▁"),
//    the vocabulary as plain text, model.byte_fallback, unk_token / fuse_unk (bpe_sentencepiece.h).
// The normalizer (Sequence, Prepend, Replace, NFC, NFD, NFKC, NFKD) may come with either kind.
// Encoding:
//  1. added tokens (added_tokens[]) with normalized false (by default: special ones, e.g. <s>,
//     <|begin_of_text|>) are cut out of the text first, leftmost-longest, and become their own ids:
//     special tokens written in the text ARE specials;
//  2. the normalizer runs on each stretch between them separately (so Prepend prefixes "▁" to the
//     text after an added token too), then added tokens with normalized true are cut out of its
//     output (their content normalized the same way);
//  3. the pre-tokenizer splits each stretch: Split steps (a Regex or a literal String, each
//     behavior, invert: bpe_split.h; Llama 3's and Qwen's patterns with \p{L} / \p{N} classes, run
//     by PCRE2 in UTF + UCP mode), then in the byte-level kind a final ByteLevel step (its own GPT-2
//     regex when use_regex, a leading space when add_prefix_space); in the SentencePiece kind
//     Metaspace instead (prepend_scheme first means the stretch at the start of the text), or
//     none (the stretch is one word);
//  4. each piece's first symbols are its bytes (byte-level) or its characters (SentencePiece kind:
//     an unknown character becomes its <0xNN> tokens with byte_fallback, else unk_token, else
//     nothing); with model.ignore_merges a piece that is a vocabulary entry is that id; otherwise the
//     adjacent pair with the lowest merge rank (model.merges order) is merged, leftmost first,
//     until no pair has a merge.
// Bytes that are not valid UTF-8 never match the regexes and form pieces of their own; in the
// SentencePiece kind each such byte is a character of its own (so byte_fallback gives <0xNN>).
// decode(): byte-level: the ids' bytes concatenated (added tokens: their content); SentencePiece
// kind: the tokens through the file's decoder (Replace "▁" -> " ", ByteFallback, Fuse, Strip or
// Metaspace), which gives the text back (Llama 2's decoder strips the one leading space).
//
// BOS / EOS: tokenizer_config.json beside tokenizer.json (bos_token / eos_token, a string or an
// {"content": ...} object, null for none) when it exists; else BOS is the special token a
// TemplateProcessing post_processor puts before the text, and EOS the one after it (none: -1). The
// dataset puts BOS and EOS around every document (add_bos_token / add_eos_token are not read).
// vocab_size() is the largest id + 1 (model.vocab and added_tokens).
//
// Anything else is refused with a one-line error naming the file and the field: a model.type other
// than BPE (WordPiece, Unigram, WordLevel), a normalizer, pre-tokenizer or decoder not listed here
// (e.g. Lowercase, Precompiled, Whitespace, Digits, a Regex pattern in Replace), Metaspace combined with
// other pre-tokenizer steps, byte_fallback or a non-ByteLevel decoder with a ByteLevel
// pre-tokenizer, dropout, subword prefixes/suffixes, added tokens with lstrip/rstrip/single_word,
// merges of unknown tokens, an unk_token not in the vocabulary, byte-level vocabulary entries
// outside the byte-level alphabet.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace tessera::text::bpe {

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
  std::string decode(const std::vector<int32_t>& ids) const override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::text::bpe
