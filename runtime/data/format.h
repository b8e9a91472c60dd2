// What each data file is: its format decided once, here, by content and extension (DESIGN.md "Input
// detection in one place"), printed by the caller, and refused when unknown (never guessed as text);
// and the byte stream that reads a file, gzip or not.
//
// FORMATS of a file (FileFormat), data.format = auto (the default):
//   tokens  *.bin, or content starting with a token file's magic (token_file.h).
//   jsonl   *.jsonl / *.ndjson, and a *.json whose first line is a complete JSON value: one record
//           per line (record formats: chat_template.h, records.h).
//   json    a *.json / *.jsonl whose content starts with '[': an array of records, streamed record
//           by record (any size; each record is parsed on its own).
//   text    *.txt, *.text, *.md, and names WITHOUT an extension (a suffix of digits only, as in
//           GPL-2 or Apache-2.0, is a version, not an extension): one plain UTF-8 document.
// jsonl, json and text may be gzip-compressed: content starting with 1f 8b is decompressed (zlib)
// and the name is judged without its ".gz" (train.jsonl.gz is jsonl.gz).
// data.format = jsonl | json | text reads every file (token files aside) in that format whatever its
// name ("json": an array when the content starts with '[', else JSON Lines).
//
// REFUSED (Error(Input): one line naming the file and what to do), whatever data.format says:
//   Parquet (PAR1), zip (PK\3\4), Arrow (ARROW1 or a stream's 0xFFFFFFFF, *.arrow: a Hugging Face
//   save_to_disk folder), zstd / bzip2 / xz compression, corrupt gzip, *.csv / *.tsv, NUL bytes or
//   bytes that are not UTF-8 in the first 64 KiB (binary content), a *.json that does not parse
//   (with line and column), a *.json holding one object rather than records, and (given as the
//   data path itself) a file whose extension is none of the above.
//
// DIRECTORIES are walked recursively in sorted path order; names starting with '.' are skipped.
// Taken: token, jsonl and json files; text files only when the directory holds none of those
// (beside records, a README.md or LICENSE is documentation). Skipped, and named: those text files,
// files of unknown extensions, and *.json files holding one object (dataset_info.json, state.json).
// A file that is refused alone is refused in a directory too. Links inside the directory are
// followed; a link whose target lies outside it is refused, naming link and target.
// NOT REGULAR FILES -- FIFOs (pipes), sockets, devices -- are refused by name before they are
// opened, as the data path, in a directory and as token files (opening a FIFO blocks).
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/data/names.h"

namespace tessera::data {

enum class FileFormat { Tokens, Jsonl, Json, Text };

struct DataFile {
  std::string path;
  FileFormat format = FileFormat::Text;
  bool gzip = false;
  std::string name() const;  // "tokens", "jsonl", "json", "text", with ".gz" when compressed
};

// The format of one file; throws Error(Input) naming the file when it is refused or not a data file.
DataFile detect_file(const std::string& path, DataFormat format = DataFormat::Auto);

struct DataListing {
  std::string path;
  std::vector<DataFile> files;       // in reading order
  std::vector<std::string> skipped;  // relative to `path`
  // "3 files (2 jsonl, 1 jsonl.gz); skipped: README.md, dataset_info.json", "1 file (json)"
  std::string summary() const;
};

// The data files `path` (a file or a directory) stands for, each with its format. Throws
// Error(Input) when the path does not exist, a file is refused, or a directory holds no data file.
DataListing list_data(const std::string& path, DataFormat format = DataFormat::Auto);

// The bytes of a data file, decompressed when it is gzip. Errors are Error(Input) naming the file.
class DataStream {
 public:
  explicit DataStream(const DataFile& file);
  ~DataStream();
  DataStream(const DataStream&) = delete;
  DataStream& operator=(const DataStream&) = delete;

  size_t read(char* buf, size_t n);  // n bytes, fewer only at the end
  int64_t consumed() const;          // bytes of the file itself (compressed) consumed so far

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  void* gz_ = nullptr;  // gzFile
  int64_t raw_ = 0;
};

}  // namespace tessera::data
