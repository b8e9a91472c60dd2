// Training sequences from tokenized documents (documents.h): units, the train/validation split, packing
// into rows, and batches with labels, positions and document ids.
//
// UNITS. Each document becomes units of at most L + 1 tokens (L = seq_len):
//   plain text   pieces [kL, kL + L + 1), k = 0, 1, ... (consecutive pieces share one token, so
//                every token after the first is predicted exactly once; a last piece of a single
//                token has nothing to predict and is left out);
//   example      (chat, prompt/completion) of n tokens: one unit when n <= L + 1, else per
//                data.truncation: `drop` (counted, with a warning naming file and line), `left` (its
//                last L + 1 tokens; dropped when none of them is a target), `error` (Error(Input)
//                naming file and line).
// SPLIT. With val_fraction f > 0 a unit belongs to the validation split when a fixed hash of
// (file index, document, piece) is below f: deterministic, independent of seeds and world size;
// the train and validation datasets enumerate the same units and each keeps its own.
// ROWS. With packing (the default) units fill rows of L + 1 token slots greedily, in order; a unit
// that does not fit starts the next row. Without packing each unit is a row of its own. A row's
// inputs are slots [0, L) and its labels slots [1, L + 1): positions restart at 0 for each unit and
// tokens attend only within their unit (position_ids / document_ids); the label of a slot is a
// target only when both slots are in the same unit and (train_on completion) the token is flagged
// a target, so one slot per extra unit in a row is spent on a masked cross-unit prediction. Slots
// after the last unit are padding (input 0, never a target) that continue the last unit's
// positions and document: a row with one unit is exactly plain causal attention at 0..L-1.
// ROW INDEX. Rows are not stored: the cursor where every 64th row starts is (16 bytes per 64 rows),
// and a row is rebuilt from the nearest one. Building the index reads only document tables; tokens
// are read when a row is batched, so a rank pages in only its own rows of a memory-mapped file.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/data/documents.h"
#include "runtime/data/names.h"
#include "runtime/data/reader.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace tessera::data {

// Truncation and its names: names.h.
Truncation parse_truncation(const std::string& s);  // drop | left | error; Error(Input) otherwise

struct PackOptions {
  int64_t seq_len = 128;
  bool packing = true;
  Truncation truncation = Truncation::Drop;
  bool train_on_all = false;  // data.train_on = all: every token after a unit's first is a target
  double val_fraction = 0;    // > 0: split units between train and validation
  bool validation = false;    // with val_fraction: this dataset is the validation split
  int64_t vocab_limit = 0;    // > 0: batch() refuses ids >= this (the model's vocab_size)
};

// One micro-batch of B rows.
struct Batch {
  at::Tensor inputs;        // [B, L] int64
  at::Tensor labels;        // [B, L] int64, kIgnore where the slot is not a target
  at::Tensor position_ids;  // [B, L] int64
  at::Tensor document_ids;  // [B, L] int64 (unit index within its row)
  int64_t targets = 0;      // labels that are not kIgnore
  bool packed = false;      // some row holds more than one unit (else positions are 0..L-1)
  // Packed: document_offsets(document_ids), for the variable-length attention kernel.
  at::Tensor cu_seqlens;
  int64_t max_seqlen = 0;
  static constexpr int64_t kIgnore = -100;
};

// The documents of [B, L] document_ids (on the CPU) as FlashAttention's variable-length kernel takes
// them: with the rows taken one after another, the first token of each document and then B x L
// (int32 [documents + 1]), and the longest document's length. A document ends where the id changes
// or its row ends (the same id in the next row is another document).
std::pair<at::Tensor, int64_t> document_offsets(const at::Tensor& document_ids);

// Reads the documents of `paths` (their files and formats: format.h list_data, with data.format
// `format`): text and JSON files are tokenised in memory (one store per file), token files are
// memory-mapped. A token file whose vocab differs from the tokenizer's is an Error(Input) naming
// both. Dropped records are counted in `stats`, and each path's listing in stats.inputs.
std::vector<std::shared_ptr<const DocStore>> load_documents(const std::vector<std::string>& paths,
                                                            const text::Tokenizer& tok, const text::ChatTemplate& chat,
                                                            ReadStats& stats, DataFormat format = DataFormat::Auto);
// The same for listings already made (a split of a directory: splits.h).
std::vector<std::shared_ptr<const DocStore>> load_documents(const std::vector<DataListing>& listings,
                                                            const text::Tokenizer& tok, const text::ChatTemplate& chat,
                                                            ReadStats& stats);

class TokenDataset;
// load_documents + TokenDataset in one call, chat records rendered with the llama2 template (for
// benchmarks and tests; training picks its template in launcher/data_setup.cpp).
std::shared_ptr<TokenDataset> load_dataset(const std::vector<std::string>& paths, const text::Tokenizer& tok,
                                           PackOptions opts);

class TokenDataset {
 public:
  // Builds the row index. Over-long examples dropped here are counted in stats() (and an `error`
  // truncation throws). Throws Error(Input) naming the data when no row results.
  TokenDataset(std::vector<std::shared_ptr<const DocStore>> stores, PackOptions opts);

  int64_t seq_len() const { return opts_.seq_len; }
  const PackOptions& options() const { return opts_; }
  int64_t num_sequences() const { return num_rows_; }  // rows
  int64_t num_units() const { return num_units_; }
  int64_t num_tokens() const { return num_tokens_; }   // tokens in all units (slots in use)
  const ReadStats& stats() const { return stats_; }    // drops by truncation
  const std::string& description() const { return description_; }  // the files, for messages

  // Rows `rows` as a batch (CPU tensors). Throws Error(Input) naming file and document for an id
  // >= options().vocab_limit.
  Batch batch(const std::vector<int64_t>& rows) const;

  struct Cursor {
    int64_t store = 0, doc = 0, piece = 0;
  };
  struct Unit {
    int64_t store = 0, begin = 0, length = 0, doc = 0;
  };

 private:
  bool next_unit(Cursor& c, Unit& u, Cursor& at, ReadStats* stats) const;
  bool fill_row(Cursor& c, std::vector<Unit>& units, ReadStats* stats) const;
  std::vector<Unit> row_units(int64_t row) const;

  std::vector<std::shared_ptr<const DocStore>> stores_;
  PackOptions opts_;
  std::vector<Cursor> checkpoints_;  // where rows 0, 64, 128, ... start
  int64_t num_rows_ = 0, num_units_ = 0, num_tokens_ = 0;
  ReadStats stats_;
  std::string description_;
};

}  // namespace tessera::data
