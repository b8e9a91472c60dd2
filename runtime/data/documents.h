// Tokenized documents, the unit every data source is turned into.
//
// A DOCUMENT is a run of token ids, each with a target flag (see chat_template.h), and a `text` flag:
// plain text (text files, {"text"} records) is cut into pieces when longer than a training
// sequence; other documents (chat, prompt/completion) are examples that data.truncation applies to.
//
// DocSink is the writing side (the streaming reader writes into one: an in-memory store for
// training, a token file for `tessera tokenize`). DocStore is the reading side: a read-only view of
// token words and a document table laid out exactly like a token file (token_file.h), so a
// memory-mapped file and an in-memory store are read by the same code without copying:
//   token word   u32 little-endian: id in bits 0-30, bit 31 = target
//   table entry  u64 little-endian: entry d = first token of document d in bits 0-62, bit 63 =
//                document d is plain text; entry num_documents = num_tokens
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace tessera::data {

inline constexpr uint32_t kTargetBit = 0x80000000u;
inline constexpr uint64_t kTextBit = uint64_t(1) << 63;

// Little-endian load/store of fixed-width words, whatever the host's byte order.
template <typename T>
inline T load_le(const void* p) {
  unsigned char b[sizeof(T)];
  std::memcpy(b, p, sizeof(T));
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= T(b[i]) << (8 * i);
  return v;
}
template <typename T>
inline void store_le(void* p, T v) {
  unsigned char b[sizeof(T)];
  for (size_t i = 0; i < sizeof(T); ++i) b[i] = static_cast<unsigned char>((v >> (8 * i)) & 0xff);
  std::memcpy(p, b, sizeof(T));
}

class DocSink {
 public:
  virtual ~DocSink() = default;
  // One document: begin, any number of appends, end. `line` is its line in the source file (JSONL),
  // 0 when it has none (text files). Documents without tokens are not stored.
  virtual void begin_document(bool text, int64_t line) = 0;
  virtual void append(const int32_t* ids, const uint8_t* target, size_t n) = 0;
  virtual void end_document() = 0;
};

class DocStore {
 public:
  struct Doc {
    int64_t begin = 0, length = 0;
    bool text = false;
  };

  // Views `tokens` (num_tokens words) and `table` (num_documents + 1 entries), kept alive by
  // `owner`. `lines` (may be empty): each document's source line. `all_targets`: ignore the target
  // bits (legacy token files, which have none).
  DocStore(std::string source, int64_t vocab, const unsigned char* tokens, int64_t num_tokens,
           const unsigned char* table, int64_t num_documents, std::vector<int64_t> lines,
           std::shared_ptr<void> owner, bool all_targets = false);

  const std::string& source() const { return source_; }  // the file, for messages
  int64_t vocab() const { return vocab_; }                // of the tokenizer that produced it
  int64_t num_documents() const { return num_documents_; }
  int64_t num_tokens() const { return num_tokens_; }
  Doc doc(int64_t d) const;
  int32_t id(int64_t i) const { return static_cast<int32_t>(load_le<uint32_t>(tokens_ + 4 * i) & ~kTargetBit); }
  bool target(int64_t i) const { return all_targets_ || (load_le<uint32_t>(tokens_ + 4 * i) & kTargetBit); }
  // "FILE:LINE" when the document's line is known, else "FILE: document D" (1-based).
  std::string where(int64_t d) const;

 private:
  std::string source_;
  int64_t vocab_;
  const unsigned char* tokens_;
  int64_t num_tokens_;
  const unsigned char* table_;
  int64_t num_documents_;
  std::vector<int64_t> lines_;
  std::shared_ptr<void> owner_;
  bool all_targets_;
};

// A DocSink that builds a DocStore in memory (training on text/JSONL files directly). Tracks the
// largest id appended. Past `max_bytes` (4 a token, 16 a document) it throws Error(Input) naming the
// source and the way out (a token file).
class MemoryStoreBuilder final : public DocSink {
 public:
  MemoryStoreBuilder(std::string source, int64_t vocab, size_t max_bytes = SIZE_MAX);
  void begin_document(bool text, int64_t line) override;
  void append(const int32_t* ids, const uint8_t* target, size_t n) override;
  void end_document() override;
  int32_t max_id() const { return max_id_; }
  std::shared_ptr<DocStore> finish();
  size_t bytes() const { return 4 * words_.size() + 16 * table_.size(); }

 private:
  void check_budget() const;
  std::string source_;
  int64_t vocab_;
  size_t max_bytes_;
  std::vector<uint32_t> words_;   // little-endian token words
  std::vector<uint64_t> table_;   // little-endian table entries (without the final one until finish)
  std::vector<int64_t> lines_;
  bool open_ = false, text_ = false;
  int64_t line_ = 0, doc_begin_ = 0;
  int32_t max_id_ = -1;
};

}  // namespace tessera::data
