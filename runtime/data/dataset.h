// Token datasets: text / JSONL / pre-tokenised binary files -> a packed stream of token ids cut into
// fixed-length training sequences.
//
// INPUTS. A data path is a file or a directory. A directory is walked recursively; regular files
// whose name does not start with '.' are used in sorted path order (deterministic on every rank).
// The kind of each file follows its extension:
//   *.jsonl  one JSON object per line with a string field "text"; each line is one document
//            (blank lines are skipped; bad JSON or a missing "text" is an error naming file:line).
//   *.bin    a pre-tokenised token file (format below), written by `tessera tokenize`; its tokens
//            are used as they are (documents were already wrapped in BOS/EOS when it was written).
//   other    plain UTF-8 text; the whole file is one document. It is encoded in chunks of about
//            64 KiB cut after a newline (chunks are encoded in parallel; SentencePiece is also
//            faster on short inputs), so a multi-megabyte file takes seconds, not minutes.
// Each document becomes BOS + tokens + EOS (an id of -1 means the tokenizer has none and it is left
// out); documents are concatenated in file order into one stream.
//
// PACKING. With T tokens in the stream and L = seq_len, sequence i is the L+1 tokens
// stream[i*L, i*L + L + 1): inputs are its first L tokens, targets its last L (next-token
// prediction). Consecutive sequences overlap by one token, so every token after the first is a
// target exactly once. num_sequences = (T - 1) / L; the tail that cannot fill a sequence is dropped.
//
// TOKEN FILE FORMAT (*.bin), all little-endian:
//   offset 0   8 bytes  magic "TSRTOK1\0"
//   offset 8   u32      vocab size of the tokenizer that wrote it (every id is < vocab)
//   offset 12  u64      count, number of tokens
//   offset 20  count x int32 token ids
// The file size must be exactly 20 + 4*count.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/data/tokenizer.h"

namespace tessera::data {

inline constexpr char kTokenFileMagic[8] = {'T', 'S', 'R', 'T', 'O', 'K', '1', '\0'};
inline constexpr size_t kTokenFileHeaderBytes = 20;

// Writes `tokens` as a token file. Written to a temporary file next to `path` and renamed into
// place, so a failure never leaves a partial file or destroys an existing one. Throws Error(Input)
// if the file cannot be written or a token is outside [0, vocab).
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, uint32_t vocab);
// Reads a token file, validating magic, size and ids; throws Error(Input) naming the file.
std::vector<int32_t> read_token_file(const std::string& path, uint32_t* vocab_out = nullptr);

// The data files a path stands for (see INPUTS), in the order they are read. Throws Error(Input)
// if the path does not exist or a directory holds no data files.
std::vector<std::string> list_data_files(const std::string& path);

// The concatenated token stream of a set of data paths.
struct TokenCorpus {
  std::vector<int32_t> tokens;
  int64_t num_files = 0;
  int64_t num_documents = 0;  // text documents and JSONL records (token files are not counted)
  int32_t max_token_id = -1;  // largest id in `tokens`, -1 when empty
  int64_t vocab_size = 0;     // the tokenizer's vocab (or the token files' when no tokenizer)
  std::string tokenizer_name;
};

// Reads and tokenises every file of `paths`, in order. `tokenizer` may be null only when every file
// is a token file. A token file whose vocab differs from the tokenizer's is an error.
TokenCorpus load_corpus(const std::vector<std::string>& paths, const Tokenizer* tokenizer);

class TokenDataset {
 public:
  // Loads `paths` (see load_corpus) and packs them into sequences of seq_len (+1, see PACKING).
  // Throws Error(Input) naming the path(s) and the counts when there is no data or too little for
  // one sequence.
  TokenDataset(const std::vector<std::string>& paths, int64_t seq_len, const Tokenizer* tokenizer);
  TokenDataset(const std::string& path, int64_t seq_len, const Tokenizer* tokenizer)
      : TokenDataset(std::vector<std::string>{path}, seq_len, tokenizer) {}

  int64_t seq_len() const { return seq_len_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_tokens() const { return static_cast<int64_t>(corpus_.tokens.size()); }
  const TokenCorpus& corpus() const { return corpus_; }
  const std::string& description() const { return description_; }  // the path(s), for messages

  // Copies sequence `idx` (seq_len + 1 tokens) to `out`.
  void get(int64_t idx, int32_t* out) const;
  // Sequences `indices` as an int64 tensor [indices.size(), seq_len + 1] (CPU).
  at::Tensor batch(const std::vector<int64_t>& indices) const;

  // Throws Error(Input) if any token id is >= `vocab` (the model's vocab_size).
  void check_vocab(int64_t vocab) const;

 private:
  TokenCorpus corpus_;
  std::string description_;
  int64_t seq_len_;
  int64_t num_sequences_;
};

}  // namespace tessera::data
