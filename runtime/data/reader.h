// The streaming reader: data files (format.h) -> rendered documents in a DocSink, in file order,
// with bounded memory (used by `tessera tokenize` on multi-GB inputs and by training on text/JSON
// directly).
//
// INPUTS. Which files a data path stands for, and the format of each, is decided by list_data
// (format.h): JSON Lines, JSON arrays of records and plain text, any of them gzip-compressed, are
// read here; token files are not (train maps them; tokenize refuses them).
//   jsonl  one JSON record per line (formats: chat_template.h, records.h); blank lines are skipped.
//   json   an array of records, split into records as it streams (each parsed on its own); an array
//          that is malformed, or a record in it that does not parse, is an Error(Input) naming file,
//          line and column (the file is broken, not one record).
//   text   the whole file is one plain-text document, BOS + tokens + EOS.
//
// STREAMING. Records are read in batches of up to 4096 records / 8 MiB, parsed and rendered in
// parallel (at::parallel_for) and written in order. Text is read in 4 MiB blocks cut after a
// newline, encoded in ~64 KiB segments cut after newlines, in parallel (SentencePiece is also
// faster on short inputs); a line longer than a block is cut at a UTF-8 character boundary. A record
// (JSONL line, array element) longer than util::budget::kRecordBytes after decompression is an
// Error(Input) naming file and line, raised before more of it is read: memory stays bounded whatever
// the compression ratio.
//
// BAD RECORDS. A JSONL line that is not valid JSON, or a record that render_record refuses
// (BadExample), is DROPPED: ReadStats counts it by kind and keeps a one-line warning
// "FILE:LINE: reason" (a JSON array's records: "FILE:LINE:COLUMN (record N)") for the first
// kMaxWarnings; reading goes on. A record that makes the whole file unusable (FatalRecord: a "tools"
// list that is not a list of objects) stops reading: an Error(Input) "data file FILE line N: ...".
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "runtime/data/documents.h"
#include "runtime/data/format.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace tessera::data {

struct ReadStats {
  static constexpr size_t kMaxWarnings = 10;
  int64_t files = 0, documents = 0, tokens = 0, bytes = 0;
  int64_t dropped = 0;
  std::map<std::string, int64_t> dropped_by_kind;
  std::vector<std::string> warnings;  // "WHERE: dropped (reason)" of the first kMaxWarnings drops
  std::vector<std::string> inputs;    // per data path read: "PATH: " + DataListing::summary()

  void drop(const std::string& where, const std::string& kind, const std::string& reason);
  void merge(const ReadStats& other);
  // "3 of 120 examples dropped (2 invalid JSON, 1 unknown role)"; "" when nothing was dropped.
  std::string drop_summary() const;
};

// Progress: bytes of input consumed so far, of `total`.
using ReadProgress = std::function<void(int64_t done, int64_t total)>;

// Reads one jsonl, json or text file into `sink`.
void read_file(const DataFile& file, const text::Tokenizer& tok, const text::ChatTemplate& chat, DocSink& sink,
               ReadStats& stats, const ReadProgress& progress = {}, int64_t progress_base = 0,
               int64_t progress_total = 0);

}  // namespace tessera::data
