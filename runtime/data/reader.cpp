#include "runtime/data/reader.h"

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <optional>

#include "util/budgets.h"
#include "util/error.h"
#include "util/json.h"

namespace tessera::data {


namespace {

constexpr size_t kSegmentBytes = size_t(64) << 10;  // text is encoded in ~64 KiB line-aligned segments
constexpr size_t kBlockBytes = size_t(4) << 20;     // text is read in 4 MiB blocks
constexpr size_t kBatchRecords = 4096;              // records rendered together
constexpr size_t kBatchBytes = size_t(8) << 20;
constexpr size_t kChunkBytes = size_t(1) << 20;     // records are read in 1 MiB chunks

// A record over util::budget::kRecordBytes (decompressed), found before more of it is read.
[[noreturn]] void record_too_long(const std::string& file, int64_t line) {
  throw TESSERA_INPUT_ERROR("data file " + file + " line " + std::to_string(line) + ": a record longer than " +
                            std::to_string(util::budget::kRecordBytes >> 20) +
                            " MiB (the record budget, counted after decompression): split it, or train on it as "
                            "plain text (.txt), which is read in blocks");
}

// Cuts `text` into segments of about kSegmentBytes, each ending after a newline where possible.
std::vector<std::string_view> segments(std::string_view text) {
  std::vector<std::string_view> out;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.size();
    if (text.size() - begin > kSegmentBytes) {
      const size_t nl = text.find('\n', begin + kSegmentBytes);
      if (nl != std::string::npos) end = nl + 1;
    }
    out.push_back(text.substr(begin, end - begin));
    begin = end;
  }
  return out;
}

// Where a block of `buf` may end: after its last newline, else before an incomplete UTF-8
// character (a line longer than a block).
size_t block_cut(const std::string& buf) {
  const size_t nl = buf.rfind('\n');
  if (nl != std::string::npos) return nl + 1;
  size_t cut = buf.size();
  for (int back = 0; back < 4 && cut > 0; ++back) {  // step back over continuation bytes
    const unsigned char c = static_cast<unsigned char>(buf[cut - 1]);
    if ((c & 0xC0) == 0x80) {
      --cut;
      continue;
    }
    if (c >= 0xC0) --cut;  // a lead byte whose continuation may be missing: leave it for the next block
    break;
  }
  return cut == 0 ? buf.size() : cut;
}

void read_text(DataStream& in, const text::Tokenizer& tok, DocSink& sink, ReadStats& stats,
               const std::function<void(int64_t)>& advanced) {
  std::string buf, carry;
  bool started = false;
  auto emit = [&](const std::vector<int32_t>& ids) {
    std::vector<uint8_t> t(ids.size(), 1);
    sink.append(ids.data(), t.data(), ids.size());
    stats.tokens += static_cast<int64_t>(ids.size());
  };
  for (;;) {
    buf = std::move(carry);
    carry.clear();
    const size_t have = buf.size();
    buf.resize(have + kBlockBytes);
    const size_t got = in.read(&buf[have], kBlockBytes);
    buf.resize(have + got);
    const bool eof = got < kBlockBytes;
    if (!eof) {
      const size_t cut = block_cut(buf);
      carry = buf.substr(cut);
      buf.resize(cut);
    }
    if (!buf.empty()) {
      if (!started) {
        sink.begin_document(/*text=*/true, 0);
        started = true;
        ++stats.documents;
        if (tok.bos_id() >= 0) emit({tok.bos_id()});
      }
      const std::vector<std::string_view> segs = segments(buf);
      std::vector<std::vector<int32_t>> encoded(segs.size());
      at::parallel_for(0, static_cast<int64_t>(segs.size()), 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) encoded[i] = tok.encode(std::string(segs[i]));
      });
      for (const auto& ids : encoded) emit(ids);
      advanced(in.consumed());
    }
    if (eof) break;
  }
  if (started) {
    if (tok.eos_id() >= 0) emit({tok.eos_id()});
    sink.end_document();
  }
}

// The lines of a stream, without their '\n', and their numbers. A line longer than the record
// budget is an Error(Input) before more of it is read.
class LineReader {
 public:
  LineReader(DataStream& in, const std::string& file) : in_(in), file_(file) {}
  bool next(std::string& line) {
    for (;;) {
      const size_t nl = buf_.find('\n', std::max(pos_, scanned_));
      if (nl != std::string::npos) {
        if (nl - pos_ > util::budget::kRecordBytes) record_too_long(file_, line_no_ + 1);
        line.assign(buf_, pos_, nl - pos_);
        pos_ = nl + 1;
        ++line_no_;
        return true;
      }
      if (eof_) {
        if (pos_ >= buf_.size()) return false;
        if (buf_.size() - pos_ > util::budget::kRecordBytes) record_too_long(file_, line_no_ + 1);
        line.assign(buf_, pos_, std::string::npos);
        pos_ = buf_.size();
        ++line_no_;
        return true;
      }
      buf_.erase(0, pos_);
      pos_ = 0;
      scanned_ = buf_.size();
      if (scanned_ > util::budget::kRecordBytes) record_too_long(file_, line_no_ + 1);
      buf_.resize(scanned_ + kChunkBytes);
      buf_.resize(scanned_ + in_.read(&buf_[scanned_], kChunkBytes));
      eof_ = buf_.size() == scanned_;
    }
  }
  int64_t line_no() const { return line_no_; }  // of the line next() gave last

 private:
  DataStream& in_;
  const std::string& file_;
  int64_t line_no_ = 0;
  std::string buf_;
  size_t pos_ = 0, scanned_ = 0;
  bool eof_ = false;
};

// The records of a JSON array as they stream by: each element's text and where it starts, split by
// brackets and strings alone (each record is parsed later, on its own). A malformed array is an
// Error(Input) naming file, line and column.
class ArrayReader {
 public:
  ArrayReader(DataStream& in, const std::string& file) : in_(in), file_(file) {}

  // The next record's text, line, column (1-based) and index; false after the closing ']'.
  bool next(std::string& text, int64_t& line, int64_t& col, int64_t& index) {
    if (done_) return false;
    int c = next_token();
    if (!started_) {
      if (c == 0xEF && get() == 0xBB && get() == 0xBF) c = next_token();  // a UTF-8 byte order mark
      if (c != '[') fail("expected '[' opening an array of records");
      started_ = true;
      c = next_token();
      if (c == ']') return finish();
    } else {
      if (c == ']') return finish();
      if (c != ',') fail(c < 0 ? "the array is not closed (unexpected end of file)"
                               : "expected ',' or ']' after record " + std::to_string(count_));
      c = next_token();
      if (c == ']') fail("a ',' before ']' (JSON has no trailing commas)");
    }
    if (c < 0) fail("the array is not closed (unexpected end of file)");
    line = record_line_ = line_;
    col = col_;
    index = ++count_;
    text.clear();
    scan_value(c, text);
    return true;
  }

 private:
  int get() {
    if (pos_ == buf_.size()) {
      buf_.resize(kChunkBytes);
      buf_.resize(in_.read(buf_.data(), kChunkBytes));
      pos_ = 0;
      if (buf_.empty()) return -1;
    }
    const int c = static_cast<unsigned char>(buf_[pos_++]);
    prev_line_ = line_, prev_col_ = col_;
    if (c == '\n') ++line_, col_ = 0;
    else ++col_;
    return c;
  }
  void unget() { --pos_, line_ = prev_line_, col_ = prev_col_; }
  int next_token() {
    int c;
    do c = get();
    while (c == ' ' || c == '\t' || c == '\n' || c == '\r');
    return c;
  }
  bool finish() {
    if (next_token() >= 0) fail("content after the array's closing ']'");
    done_ = true;
    return false;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw TESSERA_INPUT_ERROR("data file " + file_ + " does not parse as a JSON array (at line " + std::to_string(line_) +
                              (col_ ? ", column " + std::to_string(col_) : std::string()) + ": " + what +
                              "): fix it, or give JSON Lines (one record per line)");
  }
  // Appends `c` to the record, refused past the record budget.
  void put(std::string& out, int c) const {
    if (out.size() >= util::budget::kRecordBytes) record_too_long(file_, record_line_);
    out.push_back(static_cast<char>(c));
  }
  void scan_string(std::string& out) {
    for (int c = get();; c = get()) {
      if (c < 0) fail("a string of record " + std::to_string(count_) + " is not closed (unexpected end of file)");
      put(out, c);
      if (c == '"') return;
      if (c == '\\') {
        const int e = get();
        if (e >= 0) put(out, e);
      }
    }
  }
  void scan_value(int c, std::string& out) {
    out.push_back(static_cast<char>(c));
    if (c == '"') return scan_string(out);
    if (c == '{' || c == '[') {
      for (int depth = 1; depth > 0;) {
        const int d = get();
        if (d < 0) fail("record " + std::to_string(count_) + " is not closed (unexpected end of file)");
        put(out, d);
        if (d == '"') scan_string(out);
        else if (d == '{' || d == '[') ++depth;
        else if (d == '}' || d == ']') --depth;
      }
      return;
    }
    for (int d = get(); d >= 0; d = get()) {  // a scalar: up to the next ',', ']' or space
      if (d == ',' || d == ']' || d == ' ' || d == '\t' || d == '\n' || d == '\r') return unget();
      put(out, d);
    }
  }

  DataStream& in_;
  const std::string& file_;
  std::string buf_;
  size_t pos_ = 0;
  int64_t line_ = 1, col_ = 0, prev_line_ = 1, prev_col_ = 0, count_ = 0, record_line_ = 0;
  bool started_ = false, done_ = false;
};

// nlohmann's parse error without its "[json.exception...] parse error at ...: " prefix.
std::string parse_error_reason(const std::exception& e) {
  const std::string what = e.what();
  const size_t p = what.find("parse error");
  if (p == std::string::npos) return what;
  const size_t colon = what.find(": ", p);
  return colon == std::string::npos ? what.substr(p) : what.substr(colon + 2);
}

// Line and column of byte `k` of `text`, which starts at (line, col).
std::pair<int64_t, int64_t> position_in(const std::string& text, size_t k, int64_t line, int64_t col) {
  k = std::min(k, text.empty() ? 0 : text.size() - 1);
  const size_t nl = text.rfind('\n', k == 0 ? 0 : k - 1);
  if (nl == std::string::npos || nl >= k) return {line, col + static_cast<int64_t>(k)};
  return {line + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(k), '\n'),
          static_cast<int64_t>(k - nl)};
}

// One record's text and where it is: a JSONL line (col 0) or an element of a JSON array.
struct Pending {
  int64_t line = 0, col = 0, index = 0;
  std::string text;
};

struct Rendered {
  std::optional<text::Example> example;
  std::string kind, reason;  // when dropped
  std::string fatal;         // a record of a JSON array that does not parse
};

Rendered render_one(const Pending& p, const std::string& file, const text::Tokenizer& tok, const text::ChatTemplate& chat) {
  Rendered r;
  nlohmann::ordered_json record;  // in the record's key order: a template's `tools | tojson` keeps it
  try {
    record = util::parse_json<nlohmann::ordered_json>(p.text);
  } catch (const nlohmann::json::exception& ex) {
    if (p.col == 0) {  // a JSONL line: dropped
      r.kind = "invalid JSON";
      const std::string what = ex.what();
      const size_t at = what.find("parse error");
      r.reason = "invalid JSON: " + (at == std::string::npos ? what : what.substr(at));
      return r;
    }
    const auto* pe = dynamic_cast<const nlohmann::json::parse_error*>(&ex);
    const auto [line, col] = position_in(p.text, pe && pe->byte > 0 ? pe->byte - 1 : 0, p.line, p.col);
    r.fatal = "data file " + file + " does not parse as JSON (at line " + std::to_string(line) + ", column " +
              std::to_string(col) + ", in record " + std::to_string(p.index) + ": " + parse_error_reason(ex) +
              "): fix it, or give JSON Lines (one record per line)";
    return r;
  }
  try {
    r.example = text::render_record(record, tok, chat);
  } catch (const text::BadExample& ex) {
    r.kind = ex.kind();
    r.reason = ex.what();
  } catch (const text::FatalRecord& ex) {
    r.fatal = "data file " + file + " line " + std::to_string(p.line) +
              (p.col ? " (record " + std::to_string(p.index) + ")" : "") + ": " + ex.what();
  }
  return r;
}

// Renders a batch of records in parallel and writes them to `sink` in order.
void render_batch(const std::vector<Pending>& batch, const std::string& file, const text::Tokenizer& tok,
                  const text::ChatTemplate& chat, DocSink& sink, ReadStats& stats) {
  std::vector<Rendered> out(batch.size());
  at::parallel_for(0, static_cast<int64_t>(batch.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = render_one(batch[i], file, tok, chat);
  });
  for (size_t i = 0; i < out.size(); ++i) {
    const Rendered& r = out[i];
    const Pending& p = batch[i];
    if (!r.fatal.empty()) throw TESSERA_INPUT_ERROR(r.fatal);
    if (!r.example) {
      stats.drop(file + ":" + std::to_string(p.line) +
                     (p.col ? ":" + std::to_string(p.col) + " (record " + std::to_string(p.index) + ")" : ""),
                 r.kind, r.reason);
      continue;
    }
    const text::Example& ex = *r.example;
    if (ex.tokens.empty()) continue;  // an empty "text"
    sink.begin_document(ex.text, p.line);
    sink.append(ex.tokens.data(), ex.target.data(), ex.tokens.size());
    sink.end_document();
    ++stats.documents;
    stats.tokens += static_cast<int64_t>(ex.tokens.size());
  }
}

// Records in batches from `next` (false at the end), rendered and written in order.
void read_records(DataStream& in, const std::function<bool(Pending&)>& next, const std::string& file,
                  const text::Tokenizer& tok, const text::ChatTemplate& chat, DocSink& sink, ReadStats& stats,
                  const std::function<void(int64_t)>& advanced) {
  for (bool more = true; more;) {
    std::vector<Pending> batch;
    size_t bytes = 0;
    Pending p;
    while (batch.size() < kBatchRecords && bytes < kBatchBytes && (more = next(p))) {
      bytes += p.text.size();
      batch.push_back(std::move(p));
    }
    render_batch(batch, file, tok, chat, sink, stats);
    advanced(in.consumed());
  }
}

void read_jsonl(DataStream& in, const std::string& file, const text::Tokenizer& tok, const text::ChatTemplate& chat,
                DocSink& sink, ReadStats& stats, const std::function<void(int64_t)>& advanced) {
  LineReader lines(in, file);
  auto next = [&](Pending& p) {
    while (lines.next(p.text)) {
      p.line = lines.line_no();
      if (p.text.find_first_not_of(" \t\r") != std::string::npos) return true;
    }
    return false;
  };
  read_records(in, next, file, tok, chat, sink, stats, advanced);
}

void read_json_array(DataStream& in, const std::string& file, const text::Tokenizer& tok, const text::ChatTemplate& chat,
                     DocSink& sink, ReadStats& stats, const std::function<void(int64_t)>& advanced) {
  ArrayReader array(in, file);
  auto next = [&](Pending& p) { return array.next(p.text, p.line, p.col, p.index); };
  read_records(in, next, file, tok, chat, sink, stats, advanced);
}

}  // namespace

void ReadStats::drop(const std::string& where, const std::string& kind, const std::string& reason) {
  ++dropped;
  ++dropped_by_kind[kind];
  if (warnings.size() < kMaxWarnings) warnings.push_back(where + ": dropped (" + reason + ")");
}

void ReadStats::merge(const ReadStats& o) {
  files += o.files;
  documents += o.documents;
  tokens += o.tokens;
  bytes += o.bytes;
  dropped += o.dropped;
  for (const auto& [k, n] : o.dropped_by_kind) dropped_by_kind[k] += n;
  for (const auto& w : o.warnings)
    if (warnings.size() < kMaxWarnings) warnings.push_back(w);
  inputs.insert(inputs.end(), o.inputs.begin(), o.inputs.end());
}

std::string ReadStats::drop_summary() const {
  if (dropped == 0) return "";
  std::string kinds;
  for (const auto& [k, n] : dropped_by_kind) kinds += (kinds.empty() ? "" : ", ") + std::to_string(n) + " " + k;
  return std::to_string(dropped) + " of " + std::to_string(dropped + documents) + " examples dropped (" + kinds + ")";
}

void read_file(const DataFile& file, const text::Tokenizer& tok, const text::ChatTemplate& chat, DocSink& sink,
               ReadStats& stats, const ReadProgress& progress, int64_t progress_base, int64_t progress_total) {
  TESSERA_CHECK(file.format != FileFormat::Tokens, "read_file on a token file");
  ++stats.files;
  int64_t done = 0;
  auto advanced = [&](int64_t consumed) {  // bytes of the file consumed so far
    stats.bytes += consumed - done;
    done = consumed;
    if (progress) progress(progress_base + done, progress_total);
  };
  DataStream in(file);
  switch (file.format) {
    case FileFormat::Jsonl: read_jsonl(in, file.path, tok, chat, sink, stats, advanced); break;
    case FileFormat::Json: read_json_array(in, file.path, tok, chat, sink, stats, advanced); break;
    default: read_text(in, tok, sink, stats, advanced); break;
  }
}

}  // namespace tessera::data
