// Tokenizers for the data pipeline.
//
// Implementations behind one interface:
//  - ByteTokenizer: the fallback when no tokenizer file is configured. Ids 0..255 are the bytes of
//    the UTF-8 text, BOS = 256, EOS = 257, vocab 258. Needs no file and never fails.
//  - SentencePieceTokenizer: a SentencePiece `tokenizer.model` (the Llama 2 tokenizer format),
//    loaded with libsentencepiece. BOS/EOS are the model's own ids (1 and 2 for Llama 2).
//    libsentencepiece is dlopen()ed in isolation, never linked: its bundled protobuf clashes with
//    LibTorch's (see tokenizer.cpp). Do not call sentencepiece directly anywhere else.
//  - BpeTokenizer (bpe_tokenizer.h): a Hugging Face tokenizer.json with a BPE model, byte-level
//    (Llama 3) or SentencePiece-converted (Llama 2, Mistral).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tessera::text {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Token ids of `text`, without BOS/EOS (the dataset adds them per document).
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  // BOS / EOS ids; -1 when the tokenizer defines none (then the dataset leaves it out).
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  virtual int64_t vocab_size() const = 0;
  // "byte", "sentencepiece:<path>" or "bpe:<path>", for messages and metrics.
  virtual std::string name() const = 0;
  // The id of a special token given by its text ("<|eot_id|>", "<s>"), for chat templates that
  // render special tokens; nullopt when the tokenizer has no such special token (the byte
  // tokenizer has none).
  virtual std::optional<int32_t> special_id(const std::string& text) const = 0;
  // The text of token ids (generated text): the tokenizer's own decoding, special tokens included
  // as their text (the byte tokenizer writes none for BOS/EOS). Error(Input) for an id outside the
  // vocabulary. (Every tokenizer here has one; the default, for test doubles, throws.)
  virtual std::string decode(const std::vector<int32_t>& ids) const;
};

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kBos = 256;
  static constexpr int32_t kEos = 257;
  static constexpr int64_t kVocab = 258;
  std::vector<int32_t> encode(const std::string& text) const override;
  int32_t bos_id() const override { return kBos; }
  int32_t eos_id() const override { return kEos; }
  int64_t vocab_size() const override { return kVocab; }
  std::string name() const override { return "byte"; }
  std::optional<int32_t> special_id(const std::string&) const override { return std::nullopt; }
  std::string decode(const std::vector<int32_t>& ids) const override;
};

// "" or "bytes" -> ByteTokenizer; a *.json file (tokenizer.json), or a directory holding a
// tokenizer.json (and no tokenizer.model) -> BpeTokenizer; otherwise loads a SentencePiece model.
// A missing file, or a file that is not a tokenizer of its kind, throws tessera::Error(Input)
// naming the file (and, for tokenizer.json, the field).
// (Which tokenizer a training run uses is decided in launcher/data_setup.cpp, choose_tokenizer.)
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& path_or_empty);
// A SentencePiece model from the bytes of a tokenizer.model file (`path` names it in messages):
// for ranks that cannot see the file itself (model.load=rank0 broadcasts it).
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& model_bytes, const std::string& path);

}  // namespace tessera::text
