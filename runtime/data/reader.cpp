#include "runtime/data/reader.h"

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>

#include "runtime/error.h"
#include "util/json.h"

namespace tessera::data {

namespace fs = std::filesystem;

namespace {

constexpr size_t kSegmentBytes = size_t(64) << 10;  // text is encoded in ~64 KiB line-aligned segments
constexpr size_t kBlockBytes = size_t(4) << 20;     // text is read in 4 MiB blocks
constexpr size_t kBatchLines = 4096;                // JSONL records rendered together
constexpr size_t kBatchBytes = size_t(8) << 20;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
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

void read_text(const std::string& file, const Tokenizer& tok, DocSink& sink, ReadStats& stats,
               const std::function<void(int64_t)>& advanced) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw TESSERA_INPUT_ERROR("cannot open data file " + file);
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
    in.read(&buf[have], static_cast<std::streamsize>(kBlockBytes));
    const size_t got = static_cast<size_t>(in.gcount());
    if (in.bad()) throw TESSERA_INPUT_ERROR("cannot read data file " + file);
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
      advanced(static_cast<int64_t>(buf.size()));
    }
    if (eof) break;
  }
  if (started) {
    if (tok.eos_id() >= 0) emit({tok.eos_id()});
    sink.end_document();
  }
}

struct Rendered {
  int64_t line = 0;
  std::optional<Example> example;
  std::string kind, reason;  // when dropped
};

void read_jsonl(const std::string& file, const Tokenizer& tok, const ChatTemplate& chat, DocSink& sink,
                ReadStats& stats, const std::function<void(int64_t)>& advanced) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw TESSERA_INPUT_ERROR("cannot open data file " + file);
  int64_t line_no = 0;
  std::string line;
  bool more = true;
  while (more) {
    std::vector<std::pair<int64_t, std::string>> batch;
    size_t bytes = 0, consumed = 0;
    while (batch.size() < kBatchLines && bytes < kBatchBytes) {
      if (!std::getline(in, line)) {
        more = false;
        break;
      }
      ++line_no;
      consumed += line.size() + 1;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      bytes += line.size();
      batch.emplace_back(line_no, std::move(line));
    }
    if (in.bad()) throw TESSERA_INPUT_ERROR("cannot read data file " + file);
    std::vector<Rendered> out(batch.size());
    at::parallel_for(0, static_cast<int64_t>(batch.size()), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        Rendered& r = out[i];
        r.line = batch[i].first;
        nlohmann::json record;
        try {
          record = util::parse_json(batch[i].second);
        } catch (const nlohmann::json::exception& ex) {
          std::string what = ex.what();
          const size_t p = what.find("parse error");
          r.kind = "invalid JSON";
          r.reason = "invalid JSON: " + (p == std::string::npos ? what : what.substr(p));
          continue;
        }
        try {
          r.example = render_record(record, tok, chat);
        } catch (const BadExample& ex) {
          r.kind = ex.kind();
          r.reason = ex.what();
        }
      }
    });
    for (const Rendered& r : out) {
      if (!r.example) {
        stats.drop(file + ":" + std::to_string(r.line), r.kind, r.reason);
        continue;
      }
      const Example& ex = *r.example;
      if (ex.tokens.empty()) continue;  // an empty "text"
      sink.begin_document(ex.text, r.line);
      sink.append(ex.tokens.data(), ex.target.data(), ex.tokens.size());
      sink.end_document();
      ++stats.documents;
      stats.tokens += static_cast<int64_t>(ex.tokens.size());
    }
    advanced(static_cast<int64_t>(consumed));
  }
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
}

std::string ReadStats::drop_summary() const {
  if (dropped == 0) return "";
  std::string kinds;
  for (const auto& [k, n] : dropped_by_kind) kinds += (kinds.empty() ? "" : ", ") + std::to_string(n) + " " + k;
  return std::to_string(dropped) + " of " + std::to_string(dropped + documents) + " examples dropped (" + kinds + ")";
}

std::vector<std::string> list_data_files(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw TESSERA_INPUT_ERROR("data path " + path + " does not exist");
  if (!fs::is_directory(path, ec)) return {path};
  std::vector<std::string> files;
  for (auto it = fs::recursive_directory_iterator(path, fs::directory_options::follow_directory_symlink, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) files.push_back(it->path().string());
  }
  if (ec) throw TESSERA_INPUT_ERROR("cannot list data directory " + path + ": " + ec.message());
  if (files.empty()) throw TESSERA_INPUT_ERROR("data directory " + path + " contains no data files");
  std::sort(files.begin(), files.end());
  return files;
}

bool is_token_file_name(const std::string& path) { return ends_with(path, ".bin"); }

void read_file(const std::string& file, const Tokenizer& tok, const ChatTemplate& chat, DocSink& sink,
               ReadStats& stats, const ReadProgress& progress, int64_t progress_base, int64_t progress_total) {
  TESSERA_CHECK(!is_token_file_name(file), "read_file on a token file");
  ++stats.files;
  int64_t done = 0;
  auto advanced = [&](int64_t n) {
    done += n;
    stats.bytes += n;
    if (progress) progress(progress_base + done, progress_total);
  };
  if (ends_with(file, ".jsonl")) read_jsonl(file, tok, chat, sink, stats, advanced);
  else read_text(file, tok, sink, stats, advanced);
}

}  // namespace tessera::data
