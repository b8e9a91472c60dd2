// Token files (*.bin): what `tessera tokenize` writes and `tessera train` memory-maps.
//
// FORMAT (version 2), all little-endian:
//   offset 0   8 bytes  magic "TSRTOK2\0"
//   offset 8   u32      vocab size of the tokenizer that wrote it (every id is < vocab)
//   offset 12  u32      reserved, 0
//   offset 16  u64      N, number of tokens
//   offset 24  u64      D, number of documents
//   offset 32  N x u32  token words: id in bits 0-30, bit 31 set when the token is a target
//   then       4 zero bytes when N is odd (the table starts at a multiple of 8)
//   then       (D + 1) x u64 document table: entry d = index of document d's first token in bits
//              0-62, bit 63 set when document d is plain text (see documents.h); entry D = N.
// The file size must be exactly 32 + 4N + pad + 8(D + 1); table entries are increasing.
// Version 1 files ("TSRTOK1\0", u32 vocab, u64 N, N x int32 ids; no targets, no documents), written
// by earlier versions, are still read: as one plain-text document whose every token is a target.
//
// Opening a file maps it (read-only, MAP_SHARED, MADV_RANDOM) and checks the header, the size and
// the document table, which is all it reads: the token words are touched only where a caller reads
// them, so a rank reading its own sequences of a multi-GB file pages in only those.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "runtime/data/documents.h"

namespace tessera::data {

inline constexpr char kTokenFileMagic[8] = {'T', 'S', 'R', 'T', 'O', 'K', '2', '\0'};
inline constexpr char kTokenFileMagicV1[8] = {'T', 'S', 'R', 'T', 'O', 'K', '1', '\0'};
inline constexpr size_t kTokenFileHeaderBytes = 32;

// True when `path` starts with a token file magic (either version).
bool is_token_file(const std::string& path);

// Maps a token file. Throws Error(Input) naming the file when it is not a token file, its size does
// not match its header, or its document table is not increasing.
std::shared_ptr<DocStore> open_token_file(const std::string& path);

// Streams documents into a token file: written to `path`.tmp.<pid> and renamed into place by
// finish(), so a failure never leaves a partial file or destroys an existing one. Memory is bounded
// (buffered words, and a document table spilled to a temporary file every 2^20 documents).
class TokenFileWriter final : public DocSink {
 public:
  TokenFileWriter(const std::string& path, uint32_t vocab);
  ~TokenFileWriter() override;  // removes the temporary files unless finish() succeeded
  void begin_document(bool text, int64_t line) override;
  // Throws Error(Input) naming the file for an id outside [0, vocab).
  void append(const int32_t* ids, const uint8_t* target, size_t n) override;
  void end_document() override;
  void finish();
  // Removes the temporaries of `path` that a writer killed before finish() left behind (PATH.tmp.PID,
  // PATH.table.tmp.PID, regular files whose process PID is gone) and returns their names.
  static std::vector<std::string> remove_stale_temporaries(const std::string& path);

  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_documents() const { return num_documents_; }

 private:
  void put(const void* p, size_t n);
  void spill_table();
  std::string path_, tmp_, table_tmp_;
  uint32_t vocab_;
  std::FILE* out_ = nullptr;
  std::FILE* table_out_ = nullptr;
  std::vector<uint64_t> table_;  // entries not yet spilled (host order)
  bool open_ = false, text_ = false, finished_ = false;
  int64_t num_tokens_ = 0, num_documents_ = 0, doc_begin_ = 0;
};

}  // namespace tessera::data
