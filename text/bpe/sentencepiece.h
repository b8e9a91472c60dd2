// The parts of a Hugging Face tokenizer.json that SentencePiece-converted BPE files use (Llama 2,
// Mistral, Gemma and most Llama-2-derived models), and the normalizer of every kind, for
// BpeTokenizer (bpe_tokenizer.h). Each follows the `tokenizers` library:
//  - Normalizer (byte-level files use it too): "normalizer" null, Sequence, Prepend (prepends to a
//    non-empty text), Replace with a String pattern (every occurrence, left to right), and the
//    Unicode normalization forms NFC, NFD, NFKC and NFKD (utf8proc; bytes that are not UTF-8 are
//    kept as they are, the text between them normalized). Anything else (Lowercase, Strip,
//    StripAccents, NFKC_Casefold, BertNormalizer, Precompiled, a Regex pattern, ...) is refused
//    naming the file and the field.
//  - Metaspace pre-tokenizer: spaces become `replacement` (U+2581 by default), which is prepended
//    unless the text already starts with it, per prepend_scheme: always, first (only to the text
//    that starts the input, not to one after an added token) or never (default always; older
//    files' add_prefix_space false = never); with split (the default) the text is cut before every
//    replacement (MergedWithNext).
//  - Decoder: "decoder" null (tokens joined with a space), Sequence, Replace (String pattern),
//    ByteFallback (runs of <0xNN> tokens become their bytes; where `tokenizers` writes U+FFFD for a
//    run that is not valid UTF-8, this gives the bytes), Fuse, Strip (content, start, stop) and
//    Metaspace (replacement -> space; in the first token the replacement is dropped unless
//    prepend_scheme is never). Others (ByteLevel, WordPiece, BPEDecoder, CTC) are refused.
// Errors are tessera::Error(Input): "tokenizer <path>: <field> <what>".
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::text::bpe {

[[noreturn]] void fail(const std::string& path, const std::string& field, const std::string& what);

// Bytes of the UTF-8 character at s[i] (1 for a byte that does not start a well-formed character).
size_t utf8_char_len(const std::string& s, size_t i);

class Normalizer {
 public:
  void load(const nlohmann::json& j, const std::string& path);  // tokenizer.json's "normalizer"
  bool empty() const { return steps_.empty(); }
  std::string apply(std::string text) const;

 private:
  struct Step {
    enum Kind { Prepend, Replace, Unicode } kind;
    std::string from, text;  // Prepend `text`; Replace `from` with `text`
    int form = 0;            // Unicode: utf8proc's options for NFC, NFD, NFKC or NFKD
  };
  void add(const nlohmann::json& j, const std::string& field, const std::string& path);
  std::vector<Step> steps_;
};

struct Metaspace {
  enum class Prepend { Always, First, Never };
  std::string replacement = "\xE2\x96\x81";  // U+2581
  Prepend prepend = Prepend::Always;
  bool split = true;

  static Metaspace load(const nlohmann::json& j, const std::string& field, const std::string& path);
  // Appends the pieces of `text`; `starts_input`: it begins at offset 0 of the encoded text.
  void pre_tokenize(const std::string& text, bool starts_input, std::vector<std::string>& pieces) const;
};

class Decoder {
 public:
  void load(const nlohmann::json& j, const std::string& path);  // tokenizer.json's "decoder"
  std::string decode(std::vector<std::string> tokens) const;

 private:
  enum class Kind { Replace, ByteFallback, Fuse, Strip, Metaspace };
  struct Step {
    Kind kind;
    std::string from, to;  // Replace; Strip: from = content; Metaspace: from = replacement
    size_t start = 0, stop = 0;  // Strip
    bool keep_first = false;     // Metaspace: prepend_scheme never
  };
  void add(const nlohmann::json& j, const std::string& field, const std::string& path);
  bool none_ = true;
  std::vector<Step> steps_;
};

}  // namespace tessera::text::bpe
