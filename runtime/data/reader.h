// The streaming reader: text and JSONL files -> rendered documents in a DocSink, in file order,
// with bounded memory (used by `tessera tokenize` on multi-GB inputs and by training on text/JSONL
// directly).
//
// INPUTS. A data path is a file or a directory. A directory is walked recursively; regular files
// whose name does not start with '.' are used in sorted path order (deterministic on every rank).
// The kind of each file follows its extension:
//   *.jsonl  one JSON record per line (formats: chat_template.h); blank lines are skipped.
//   *.bin    a token file (token_file.h): not read here (train maps it; tokenize refuses it).
//   other    plain UTF-8 text; the whole file is one plain-text document, BOS + tokens + EOS.
//
// STREAMING. JSONL is read in batches of up to 4096 lines / 8 MiB, whose records are parsed and
// rendered in parallel (at::parallel_for) and written in order. Text is read in 4 MiB blocks cut
// after a newline, encoded in ~64 KiB segments cut after newlines, in parallel (SentencePiece is
// also faster on short inputs); a line longer than a block is cut at a UTF-8 character boundary.
//
// BAD RECORDS. A JSONL line that is not valid JSON or that render_record refuses (BadExample) is
// DROPPED: ReadStats counts it by kind and keeps a one-line warning "FILE:LINE: reason" for the first
// kMaxWarnings; reading goes on.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "runtime/data/chat_template.h"
#include "runtime/data/docs.h"
#include "runtime/data/tokenizer.h"

namespace tessera::data {

// The data files a path stands for (see INPUTS), in the order they are read. Throws Error(Input)
// if the path does not exist or a directory holds no data files.
std::vector<std::string> list_data_files(const std::string& path);

// True for files train maps as token files (*.bin).
bool is_token_file_name(const std::string& path);

struct ReadStats {
  static constexpr size_t kMaxWarnings = 10;
  int64_t files = 0, documents = 0, tokens = 0, bytes = 0;
  int64_t dropped = 0;
  std::map<std::string, int64_t> dropped_by_kind;
  std::vector<std::string> warnings;  // "WHERE: dropped (reason)" of the first kMaxWarnings drops

  void drop(const std::string& where, const std::string& kind, const std::string& reason);
  void merge(const ReadStats& other);
  // "3 of 120 examples dropped (2 invalid JSON, 1 unknown role)"; "" when nothing was dropped.
  std::string drop_summary() const;
};

// Progress: bytes of input consumed so far, of `total`.
using ReadProgress = std::function<void(int64_t done, int64_t total)>;

// Reads one text or JSONL file into `sink`.
void read_file(const std::string& file, const Tokenizer& tok, const ChatTemplate& chat, DocSink& sink,
               ReadStats& stats, const ReadProgress& progress = {}, int64_t progress_base = 0,
               int64_t progress_total = 0);

}  // namespace tessera::data
