#include "runtime/data/format.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "runtime/data/token_file.h"
#include "text/records.h"
#include "util/budgets.h"
#include "util/error.h"
#include "util/file_tree.h"
#include "util/json.h"

namespace tessera::data {

namespace fs = std::filesystem;

namespace {

constexpr size_t kHeadBytes = size_t(64) << 10;            // content checks look at the first 64 KiB
constexpr size_t kMaxJsonDocumentBytes = util::budget::kRecordBytes;  // a '{' .json that is not JSON Lines

enum class Kind { Unknown, Tokens, Jsonl, Json, Text, Table };

bool starts_with(const std::string& s, const char* magic, size_t n) {
  return s.size() >= n && std::memcmp(s.data(), magic, n) == 0;
}

// The extension of a file name, lower case, without the dot; "" when there is none or when it holds
// no letter (GPL-2, Apache-2.0: a version number).
std::string extension_of(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos || dot == 0) return "";
  std::string ext = name.substr(dot + 1);
  if (std::none_of(ext.begin(), ext.end(), [](unsigned char c) { return std::isalpha(c); })) return "";
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext;
}

Kind kind_of(const std::string& ext, DataFormat forced) {
  switch (forced) {
    case DataFormat::Jsonl: return Kind::Jsonl;
    case DataFormat::Json: return Kind::Json;
    case DataFormat::Text: return Kind::Text;
    case DataFormat::Auto: break;
  }
  if (ext == "jsonl" || ext == "ndjson") return Kind::Jsonl;
  if (ext == "json") return Kind::Json;
  if (ext.empty() || ext == "txt" || ext == "text" || ext == "md") return Kind::Text;
  if (ext == "csv" || ext == "tsv") return Kind::Table;
  return Kind::Unknown;
}

std::string read_prefix(const std::string& path, size_t n) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw TESSERA_INPUT_ERROR("cannot open data file " + path + ": " + std::strerror(errno));
  std::string s(n, '\0');
  s.resize(std::fread(s.data(), 1, n, f));
  const bool bad = std::ferror(f);
  std::fclose(f);
  if (bad) throw TESSERA_INPUT_ERROR("cannot read data file " + path);
  return s;
}

// Up to `n` bytes of the file's content (decompressed when gzip).
std::string read_content(const std::string& path, bool gzip, size_t n) {
  DataStream in(DataFile{path, FileFormat::Text, gzip});
  std::string s(n, '\0');
  s.resize(in.read(s.data(), n));
  return s;
}

// Refuses the formats Tessera recognises by their magic bytes but does not read.
void refuse_magic(const std::string& path, const std::string& head, const std::string& ext) {
  const std::string file = "data file " + path;
  if (starts_with(head, "PAR1", 4) || ext == "parquet")
    throw TESSERA_INPUT_ERROR(file + " is a Parquet file, which Tessera does not read: convert it to JSON Lines, e.g. "
                              "python3 -c \"import pandas; pandas.read_parquet('" + path + "').to_json('" + path +
                              ".jsonl', orient='records', lines=True, force_ascii=False)\"");
  if (starts_with(head, "PK\3\4", 4) || starts_with(head, "PK\5\6", 4))
    throw TESSERA_INPUT_ERROR(file + " is a zip archive: unzip it and give the extracted .jsonl / .json / .txt files or "
                              "their directory");
  if (starts_with(head, "ARROW1", 6) || starts_with(head, "\xff\xff\xff\xff", 4) || ext == "arrow") {
    const fs::path dir = fs::path(path).parent_path();
    std::error_code ec;
    const bool hf = fs::exists(dir / "state.json", ec) || fs::exists(dir / "dataset_info.json", ec);
    throw TESSERA_INPUT_ERROR(
        file + " is an Arrow file" + (hf ? " of a Hugging Face datasets save_to_disk folder (" + dir.string() + ")" : "") +
        ", which Tessera does not read: export it to JSON Lines, e.g. python3 -c \"import datasets; " +
        (hf ? "datasets.load_from_disk('" + dir.string() + "').to_json('" + dir.string() + ".jsonl')\""
            : "datasets.Dataset.from_file('" + path + "').to_json('" + path + ".jsonl')\""));
  }
  const struct {
    const char* magic;
    size_t n;
    const char* name;
    const char* tool;
  } compressed[] = {{"\x28\xb5\x2f\xfd", 4, "zstd", "zstd -d"}, {"BZh", 3, "bzip2", "bunzip2"},
                    {"\xfd" "7zXZ\0", 6, "xz", "unxz"}, {"7z\xbc\xaf\x27\x1c", 6, "7z", "7z x"}};
  for (const auto& c : compressed)
    if (starts_with(head, c.magic, c.n))
      throw TESSERA_INPUT_ERROR(file + " is compressed with " + c.name + ": decompress it (" + c.tool +
                                "), or compress it with gzip, which Tessera reads as it is");
}

// Offset of the first byte that is not UTF-8, or npos; a character cut by the end of a truncated
// head is not an error.
size_t invalid_utf8_at(const std::string& s, bool truncated) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (len == 0) return i;
    if (i + len > s.size()) return truncated ? std::string::npos : i;
    for (size_t k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return i;
    i += len;
  }
  return std::string::npos;
}

void refuse_binary(const std::string& path, const std::string& head, bool truncated) {
  const size_t nul = head.find('\0');
  const size_t bad = nul != std::string::npos ? nul : invalid_utf8_at(head, truncated);
  if (bad == std::string::npos) return;
  char byte[8];
  std::snprintf(byte, sizeof(byte), "0x%02x", static_cast<unsigned char>(head[bad]));
  const bool is_nul = nul != std::string::npos;
  throw TESSERA_INPUT_ERROR("data file " + path + " holds binary content (" + (is_nul ? "a NUL byte" : std::string("byte ") + byte) +
                            " at offset " + std::to_string(bad) + (is_nul ? "" : ", not UTF-8") +
                            "): Tessera reads UTF-8 text, JSON Lines, JSON arrays of records and token files (.bin); "
                            "convert it to one of them" +
                            (is_nul ? "" : " (Latin-1 text: iconv -f latin1 -t utf-8)"));
}

// nlohmann's parse error without its "[json.exception...]" prefix ("parse error at line 3, column 5: ...").
std::string parse_error_text(const std::exception& e) {
  const std::string what = e.what();
  const size_t p = what.find("parse error");
  return p == std::string::npos ? what : what.substr(p);
}

struct Verdict {
  bool take = false;
  DataFile file;
  std::string why;  // when skipped: what the file is (the error when it is the data path itself)
};

// A .json (or data.format = json) file: an array, JSON Lines, or refused / skipped.
Verdict decide_json(const std::string& path, bool gzip, const std::string& head) {
  size_t b = starts_with(head, "\xef\xbb\xbf", 3) ? 3 : 0;
  b = head.find_first_not_of(" \t\r\n", b);
  if (b == std::string::npos) return {true, {path, FileFormat::Jsonl, gzip}, ""};  // empty: no records
  if (head[b] == '[') return {true, {path, FileFormat::Json, gzip}, ""};
  const size_t nl = head.find('\n', b);
  const bool whole = head.size() < kHeadBytes;  // the head is the whole file
  if (head[b] == '{' && (nl != std::string::npos || whole)) {
    nlohmann::json first;
    try {
      first = util::parse_json(std::string_view(head).substr(b, nl == std::string::npos ? nl : nl - b));
    } catch (const nlohmann::json::exception&) {
    }
    // JSON Lines: a complete first line; unless it is the only line, and no record (metadata).
    const bool one_line = whole && (nl == std::string::npos || head.find_first_not_of(" \t\r\n", nl) == std::string::npos);
    if (!first.is_null() && !(one_line && !text::has_record_field(first)))
      return {true, {path, FileFormat::Jsonl, gzip}, ""};
  }
  const std::string doc = read_content(path, gzip, kMaxJsonDocumentBytes + 1);
  if (doc.size() > kMaxJsonDocumentBytes)
    throw TESSERA_INPUT_ERROR("data file " + path + " is neither JSON Lines nor a JSON array of records, and at over " +
                              std::to_string(kMaxJsonDocumentBytes >> 20) +
                              " MiB too large to parse as one document: convert it to JSON Lines (one record per line)");
  nlohmann::json j;
  try {
    j = util::parse_json(doc);
  } catch (const nlohmann::json::exception& e) {
    throw TESSERA_INPUT_ERROR("data file " + path + " does not parse as JSON (" + parse_error_text(e) +
                              "): fix it, or give JSON Lines (one record per line) or an array of records");
  }
  return {false, {path, FileFormat::Json, gzip},
          std::string("holds one JSON ") + j.type_name() +
              ", not records: give JSON Lines (one record per line) or a JSON array of records"};
}

// A FIFO, socket or device is refused before it is opened (opening a FIFO blocks until a writer
// comes; a pipe such as <(zstd -dc ...) cannot be read twice, as detection and reading do).
void require_regular(const std::string& path) {
  const std::string why = util::not_regular_file(path, "data file");
  if (!why.empty())
    throw TESSERA_INPUT_ERROR(why + ": Tessera reads data from regular files only (detection, then reading, opens a "
                              "file twice); write it to a file first (for zstd: zstd -d FILE.zst), or compress it "
                              "with gzip, which Tessera reads as it is");
}

Verdict classify_format(const std::string& path, DataFormat forced) {
  require_regular(path);
  const std::string name = fs::path(path).filename().string();
  std::string ext = extension_of(name);
  if (ext == "bin") return {true, {path, FileFormat::Tokens, false}, ""};
  const std::string raw = read_prefix(path, kHeadBytes);
  refuse_magic(path, raw, ext);
  if (starts_with(raw, kTokenFileMagic, 8) || starts_with(raw, kTokenFileMagicV1, 8))
    return {true, {path, FileFormat::Tokens, false}, ""};
  const bool gzip = starts_with(raw, "\x1f\x8b", 2);
  if (ext == "gz") {
    if (!gzip)
      throw TESSERA_INPUT_ERROR("data file " + path + " is named .gz but is not gzip (no 1f 8b magic): rename or "
                                "recompress it");
    ext = extension_of(name.substr(0, name.size() - 3));
  }
  const Kind kind = kind_of(ext, forced);
  if (kind == Kind::Unknown)
    return {false, {}, "has an unknown extension ." + ext +
                           ": name plain text *.txt / *.md, records *.jsonl or *.json, or set data.format "
                           "(tessera tokenize --format) to text, jsonl or json"};
  if (kind == Kind::Table)
    throw TESSERA_INPUT_ERROR("data file " + path + " is a ." + ext +
                              " table, which Tessera does not read: convert it to JSON Lines, e.g. python3 -c \"import "
                              "pandas; pandas.read_csv('" + path + "'" + (ext == "tsv" ? ", sep='\\t'" : "") +
                              ").to_json('" + path + ".jsonl', orient='records', lines=True, force_ascii=False)\"");
  const std::string head = gzip ? read_content(path, true, kHeadBytes) : raw;
  refuse_binary(path, head, head.size() == kHeadBytes);
  if (kind == Kind::Text && ext.empty() && forced == DataFormat::Auto) {
    // No extension: the content decides. Records (a first line that is a JSON object, or an
    // array) are records, never trained as plain text.
    const size_t b = head.find_first_not_of(" \t\r\n\xef\xbb\xbf");
    if (b != std::string::npos && head[b] == '[') return decide_json(path, gzip, head);
    if (b != std::string::npos && head[b] == '{' &&
        nlohmann::json::accept(head.substr(b, head.find('\n', b) - b)))
      return {true, {path, FileFormat::Jsonl, gzip}, ""};
  }
  if (kind == Kind::Text) return {true, {path, FileFormat::Text, gzip}, ""};
  if (kind == Kind::Jsonl) {
    const size_t b = head.find_first_not_of(" \t\r\n\xef\xbb\xbf");
    const bool array = forced == DataFormat::Auto && b != std::string::npos && head[b] == '[';
    return {true, {path, array ? FileFormat::Json : FileFormat::Jsonl, gzip}, ""};
  }
  return decide_json(path, gzip, head);
}

// The text of the first record of a JSON Lines or JSON array head ("" when the head cuts it off),
// and its line.
std::pair<std::string, int64_t> first_record(const std::string& head, FileFormat format) {
  size_t b = head.find_first_not_of(" \t\r\n", starts_with(head, "\xef\xbb\xbf", 3) ? 3 : 0);
  if (format == FileFormat::Json && b != std::string::npos && head[b] == '[') b = head.find_first_not_of(" \t\r\n", b + 1);
  if (b == std::string::npos) return {"", 0};
  const int64_t line = 1 + std::count(head.begin(), head.begin() + static_cast<std::ptrdiff_t>(b), '\n');
  if (format == FileFormat::Jsonl) {
    const size_t nl = head.find('\n', b);
    return {nl == std::string::npos ? head.substr(b) : head.substr(b, nl - b), line};
  }
  int depth = 0;  // an array's first element: up to its matching brace, skipping strings
  for (size_t k = b; k < head.size(); ++k) {
    const char c = head[k];
    if (c == '"') {
      for (++k; k < head.size() && head[k] != '"'; ++k) k += head[k] == '\\';
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return {head.substr(b, k + 1 - b), line};
    }
  }
  return {"", 0};
}

// Preference data (TRL's prompt/chosen/rejected) is named once, for the file, by its first record:
// every record would be dropped otherwise, one warning a line.
void refuse_preference_data(const DataFile& file) {
  const auto [text, line] = first_record(read_content(file.path, file.gzip, kHeadBytes), file.format);
  const nlohmann::json r = util::parse_json_or_discarded(text);
  if (!r.is_object() || !r.contains("chosen") || !r.contains("rejected")) return;
  for (const char* key : {"messages", "conversations", "conversation", "instruction", "completion", "text"})
    if (r.contains(key)) return;
  const std::string& p = file.path;
  const std::string open = std::string(file.gzip ? "gzip.open('" : "open('") + p + "'" + (file.gzip ? ", 'rt')" : ")");
  const std::string records = file.format == FileFormat::Json ? "json.load(" + open + ")" : "map(json.loads, " + open + ")";
  throw TESSERA_INPUT_ERROR(
      "data file " + p + " looks like preference data (" + (r.contains("prompt") ? "prompt/" : "") +
      "chosen/rejected, line " + std::to_string(line) +
      "); Tessera does not do preference training (DPO, ORPO, KTO): to fine-tune on the chosen answers, convert "
      "\"chosen\" to messages or a completion, e.g. python3 -c \"import gzip, json; [print(json.dumps({'prompt': r['prompt'], "
      "'completion': r['chosen']} if isinstance(r['chosen'], str) else {'messages': r.get('prompt', []) + r['chosen']})) "
      "for r in " + records + "]\" > " + p + ".sft.jsonl");
}

Verdict classify(const std::string& path, DataFormat forced) {
  Verdict v = classify_format(path, forced);
  if (v.take && (v.file.format == FileFormat::Jsonl || v.file.format == FileFormat::Json)) refuse_preference_data(v.file);
  return v;
}

// The regular files under `dir` whose names do not start with '.', in sorted path order. A link
// whose target lies outside `dir` is refused (the data set would read files nobody named), as is
// a FIFO, socket or device in it.
std::vector<std::string> walk(const std::string& dir) {
  std::error_code ec;
  util::TreeListing tree = util::list_tree(dir, ec);
  if (ec) throw TESSERA_INPUT_ERROR("cannot list data directory " + dir + ": " + ec.message());
  if (!tree.outside_links.empty()) {
    const auto& [link, target] = tree.outside_links.front();
    throw TESSERA_INPUT_ERROR("data directory " + dir + " holds a link " + link + " to " + target +
                              ", outside it: Tessera reads only what is inside the data directory; copy the file in, "
                              "or give it itself as data.path (tessera tokenize --input)");
  }
  if (!tree.specials.empty()) require_regular(tree.specials.front());
  return std::move(tree.files);
}

std::string join(const std::vector<std::string>& names, size_t max) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < max; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > max) out += " and " + std::to_string(names.size() - max) + " more";
  return out;
}

}  // namespace

std::string DataFile::name() const {
  static const char* names[] = {"tokens", "jsonl", "json", "text"};
  return std::string(names[static_cast<int>(format)]) + (gzip ? ".gz" : "");
}

DataFile detect_file(const std::string& path, DataFormat format) {
  Verdict v = classify(path, format);
  if (!v.take) throw TESSERA_INPUT_ERROR("data file " + path + " " + v.why);
  return v.file;
}

std::string DataListing::summary() const {
  std::vector<std::pair<std::string, int>> counts;  // in order of first appearance
  for (const DataFile& f : files) {
    auto it = std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == f.name(); });
    if (it == counts.end()) counts.emplace_back(f.name(), 1);
    else ++it->second;
  }
  std::string kinds;  // "jsonl" when all files are of one format, else "2 jsonl, 1 jsonl.gz"
  for (const auto& [name, n] : counts)
    kinds += (kinds.empty() ? "" : ", ") + (counts.size() > 1 ? std::to_string(n) + " " : "") + name;
  std::string s = std::to_string(files.size()) + (files.size() == 1 ? " file (" : " files (") + kinds + ")";
  if (!skipped.empty()) s += "; skipped: " + join(skipped, 10);
  return s;
}

DataListing list_data(const std::string& path, DataFormat format) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw TESSERA_INPUT_ERROR("data path " + path + " does not exist");
  DataListing out;
  out.path = path;
  if (!fs::is_directory(path, ec)) {
    out.files.push_back(detect_file(path, format));
    return out;
  }
  std::vector<DataFile> texts;
  std::vector<std::string> skipped, text_names;
  for (const std::string& file : walk(path)) {
    const Verdict v = classify(file, format);
    const std::string rel = fs::path(file).lexically_relative(path).string();
    if (!v.take) skipped.push_back(rel);
    else if (v.file.format == FileFormat::Text && format == DataFormat::Auto) texts.push_back(v.file), text_names.push_back(rel);
    else out.files.push_back(v.file);
  }
  if (out.files.empty()) out.files = std::move(texts);
  else skipped.insert(skipped.end(), text_names.begin(), text_names.end());  // a README beside records
  std::sort(skipped.begin(), skipped.end());
  out.skipped = std::move(skipped);
  if (out.files.empty())
    throw TESSERA_INPUT_ERROR("data directory " + path + " contains no data files" +
                              (out.skipped.empty() ? "" : " (skipped: " + join(out.skipped, 10) + ")") +
                              ": Tessera reads *.jsonl, *.json (arrays of records), text (*.txt, *.md, no extension), "
                              "their .gz, and token files (*.bin)");
  return out;
}

DataStream::DataStream(const DataFile& file) : path_(file.path) {
  if (file.gzip) {
    gzFile gz = gzopen(path_.c_str(), "rb");
    if (!gz) throw TESSERA_INPUT_ERROR("cannot open data file " + path_ + ": " + std::strerror(errno));
    gzbuffer(gz, 1 << 20);
    gz_ = gz;
  } else {
    file_ = std::fopen(path_.c_str(), "rb");
    if (!file_) throw TESSERA_INPUT_ERROR("cannot open data file " + path_ + ": " + std::strerror(errno));
  }
}

DataStream::~DataStream() {
  if (gz_) gzclose(static_cast<gzFile>(gz_));
  if (file_) std::fclose(file_);
}

size_t DataStream::read(char* buf, size_t n) {
  if (!gz_) {
    const size_t got = std::fread(buf, 1, n, file_);
    if (std::ferror(file_)) throw TESSERA_INPUT_ERROR("cannot read data file " + path_ + ": " + std::strerror(errno));
    raw_ += static_cast<int64_t>(got);
    return got;
  }
  gzFile gz = static_cast<gzFile>(gz_);
  size_t total = 0;
  while (total < n) {
    const int got = gzread(gz, buf + total, static_cast<unsigned>(std::min<size_t>(n - total, 1u << 30)));
    int err = Z_OK;
    const char* msg = gzerror(gz, &err);
    if (got < 0 || (got == 0 && err != Z_OK))  // Z_BUF_ERROR at the end: the file is truncated
      throw TESSERA_INPUT_ERROR("data file " + path_ + " is corrupt gzip (zlib: " + msg +
                                "): check it with gzip -t, and download or compress it again");
    if (got == 0) break;
    total += static_cast<size_t>(got);
  }
  raw_ = gzoffset(gz);
  return total;
}

int64_t DataStream::consumed() const { return raw_; }

}  // namespace tessera::data
