#include "runtime/data/dataset.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "runtime/error.h"
#include "util/json.h"

namespace tessera::data {

namespace fs = std::filesystem;

namespace {

constexpr size_t kChunkBytes = size_t(64) << 10;  // text is encoded in ~64 KiB line-aligned chunks

bool host_is_little_endian() {
  const uint16_t probe = 1;
  unsigned char first;
  std::memcpy(&first, &probe, 1);
  return first == 1;
}

// Little-endian (de)serialisation of fixed-width integers, independent of the host byte order.
template <typename T>
void put_le(std::string& out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((uint64_t(value) >> (8 * i)) & 0xff));
}
template <typename T>
T get_le(const unsigned char* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= uint64_t(p[i]) << (8 * i);
  return static_cast<T>(v);
}

void byteswap_if_big_endian(std::vector<int32_t>& tokens) {
  if (host_is_little_endian()) return;
  for (auto& t : tokens) {
    const uint32_t u = static_cast<uint32_t>(t);
    t = static_cast<int32_t>((u >> 24) | ((u >> 8) & 0xff00) | ((u << 8) & 0xff0000) | (u << 24));
  }
}

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TESSERA_INPUT_ERROR("cannot open data file " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw TESSERA_INPUT_ERROR("cannot read data file " + path);
  return ss.str();
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A piece of text to encode; documents may span several segments (large text files).
struct Segment {
  std::string text;
  bool doc_begin = false;
  bool doc_end = false;
};

// One plain-text file as one document, cut after newlines into ~kChunkBytes segments.
std::vector<Segment> text_segments(std::string text) {
  std::vector<Segment> segs;
  if (text.empty()) return segs;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.size();
    if (text.size() - begin > kChunkBytes) {
      const size_t nl = text.find('\n', begin + kChunkBytes);
      if (nl != std::string::npos) end = nl + 1;
    }
    segs.push_back({text.substr(begin, end - begin), begin == 0, end == text.size()});
    begin = end;
  }
  return segs;
}

// One JSONL file: each non-blank line's "text" field is a document.
std::vector<Segment> jsonl_segments(const std::string& path, const std::string& content) {
  std::vector<Segment> segs;
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < content.size()) {
    size_t nl = content.find('\n', pos);
    if (nl == std::string::npos) nl = content.size();
    const std::string line = content.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    nlohmann::json record;
    try {
      record = util::parse_json(line);
    } catch (const nlohmann::json::exception& e) {
      throw TESSERA_INPUT_ERROR(where + ": invalid JSON: " + e.what());
    }
    if (!record.is_object()) throw TESSERA_INPUT_ERROR(where + ": expected a JSON object with a \"text\" field");
    const auto it = record.find("text");
    if (it == record.end()) throw TESSERA_INPUT_ERROR(where + ": missing field \"text\"");
    if (!it->is_string()) throw TESSERA_INPUT_ERROR(where + ": field \"text\" is not a string");
    std::string text = it->get<std::string>();
    if (text.empty()) continue;
    segs.push_back({std::move(text), true, true});
  }
  return segs;
}

// Encodes the segments in parallel and appends them, in order, wrapped in BOS/EOS, to `out`.
void append_encoded(const std::vector<Segment>& segs, const Tokenizer& tok, std::vector<int32_t>& out) {
  std::vector<std::vector<int32_t>> encoded(segs.size());
  at::parallel_for(0, static_cast<int64_t>(segs.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) encoded[i] = tok.encode(segs[i].text);
  });
  for (size_t i = 0; i < segs.size(); ++i) {
    if (segs[i].doc_begin && tok.bos_id() >= 0) out.push_back(tok.bos_id());
    out.insert(out.end(), encoded[i].begin(), encoded[i].end());
    if (segs[i].doc_end && tok.eos_id() >= 0) out.push_back(tok.eos_id());
  }
}

std::string join_paths(const std::vector<std::string>& paths) {
  std::string s;
  for (const auto& p : paths) s += (s.empty() ? "" : ",") + p;
  return s;
}

}  // namespace

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, uint32_t vocab) {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || static_cast<uint32_t>(tokens[i]) >= vocab)
      throw TESSERA_INPUT_ERROR("token file " + path + ": token " + std::to_string(i) + " has id " +
                                std::to_string(tokens[i]) + ", outside the vocab of " + std::to_string(vocab));
  std::string header(kTokenFileMagic, sizeof(kTokenFileMagic));
  put_le<uint32_t>(header, vocab);
  put_le<uint64_t>(header, tokens.size());

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw TESSERA_INPUT_ERROR("cannot create token file " + tmp);
    out.write(header.data(), header.size());
    if (host_is_little_endian()) {
      out.write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(int32_t));
    } else {
      std::vector<int32_t> le = tokens;
      byteswap_if_big_endian(le);
      out.write(reinterpret_cast<const char*>(le.data()), le.size() * sizeof(int32_t));
    }
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw TESSERA_INPUT_ERROR("cannot write token file " + tmp + " (disk full?)");
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw TESSERA_INPUT_ERROR("cannot move " + tmp + " to token file " + path + ": " + ec.message());
  }
}

std::vector<int32_t> read_token_file(const std::string& path, uint32_t* vocab_out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TESSERA_INPUT_ERROR("cannot open token file " + path);
  unsigned char header[kTokenFileHeaderBytes];
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  if (in.gcount() != static_cast<std::streamsize>(sizeof(header)) ||
      std::memcmp(header, kTokenFileMagic, sizeof(kTokenFileMagic)) != 0)
    throw TESSERA_INPUT_ERROR("token file " + path + " is not a Tessera token file (magic \"TSRTOK1\" missing)");
  const uint32_t vocab = get_le<uint32_t>(header + 8);
  const uint64_t count = get_le<uint64_t>(header + 12);
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  const uint64_t expected = kTokenFileHeaderBytes + 4 * count;
  if (ec || count > (uint64_t(1) << 60) || size != expected)
    throw TESSERA_INPUT_ERROR("token file " + path + " has " + std::to_string(size) + " bytes, but its header (" +
                              std::to_string(count) + " tokens) says " + std::to_string(expected));
  std::vector<int32_t> tokens(count);
  in.read(reinterpret_cast<char*>(tokens.data()), static_cast<std::streamsize>(count * sizeof(int32_t)));
  if (in.gcount() != static_cast<std::streamsize>(count * sizeof(int32_t)))
    throw TESSERA_INPUT_ERROR("cannot read the tokens of token file " + path);
  byteswap_if_big_endian(tokens);
  for (uint64_t i = 0; i < count; ++i)
    if (tokens[i] < 0 || static_cast<uint32_t>(tokens[i]) >= vocab)
      throw TESSERA_INPUT_ERROR("token file " + path + ": token " + std::to_string(i) + " has id " +
                                std::to_string(tokens[i]) + ", outside its vocab of " + std::to_string(vocab));
  if (vocab_out) *vocab_out = vocab;
  return tokens;
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

TokenCorpus load_corpus(const std::vector<std::string>& paths, const Tokenizer* tokenizer) {
  TokenCorpus corpus;
  if (tokenizer) {
    corpus.vocab_size = tokenizer->vocab_size();
    corpus.tokenizer_name = tokenizer->name();
  }
  for (const auto& path : paths) {
    for (const auto& file : list_data_files(path)) {
      ++corpus.num_files;
      if (ends_with(file, ".bin")) {
        uint32_t vocab = 0;
        const std::vector<int32_t> tokens = read_token_file(file, &vocab);
        if (corpus.vocab_size == 0) corpus.vocab_size = vocab;
        if (vocab != corpus.vocab_size)
          throw TESSERA_INPUT_ERROR("token file " + file + " was written with a vocab of " + std::to_string(vocab) +
                                    ", but " + (tokenizer ? "the tokenizer " + tokenizer->name() : "earlier token files") +
                                    " has a vocab of " + std::to_string(corpus.vocab_size));
        corpus.tokens.insert(corpus.tokens.end(), tokens.begin(), tokens.end());
        continue;
      }
      if (!tokenizer)
        throw TESSERA_INPUT_ERROR("data file " + file + " is text, but no tokenizer was given to read it");
      const bool jsonl = ends_with(file, ".jsonl");
      std::string content = read_whole_file(file);
      const std::vector<Segment> segs = jsonl ? jsonl_segments(file, content) : text_segments(std::move(content));
      for (const auto& s : segs) corpus.num_documents += s.doc_begin ? 1 : 0;
      append_encoded(segs, *tokenizer, corpus.tokens);
    }
  }
  for (int32_t t : corpus.tokens) corpus.max_token_id = std::max(corpus.max_token_id, t);
  return corpus;
}

TokenDataset::TokenDataset(const std::vector<std::string>& paths, int64_t seq_len, const Tokenizer* tokenizer)
    : description_(join_paths(paths)), seq_len_(seq_len) {
  if (seq_len <= 0) throw TESSERA_INPUT_ERROR("seq_len must be positive, got " + std::to_string(seq_len));
  if (paths.empty()) throw TESSERA_INPUT_ERROR("no data path given");
  corpus_ = load_corpus(paths, tokenizer);
  const int64_t n = num_tokens();
  if (n == 0)
    throw TESSERA_INPUT_ERROR("data " + description_ + " is empty: 0 tokens in " + std::to_string(corpus_.num_files) +
                              " file(s)");
  if (n < seq_len + 1)
    throw TESSERA_INPUT_ERROR("data " + description_ + " is too short: " + std::to_string(n) + " tokens in " +
                              std::to_string(corpus_.num_documents) + " document(s), but one sequence of seq_len " +
                              std::to_string(seq_len) + " needs " + std::to_string(seq_len + 1));
  num_sequences_ = (n - 1) / seq_len;
}

void TokenDataset::get(int64_t idx, int32_t* out) const {
  TESSERA_CHECK(idx >= 0 && idx < num_sequences_,
                "sequence " + std::to_string(idx) + " of " + std::to_string(num_sequences_));
  std::memcpy(out, corpus_.tokens.data() + idx * seq_len_, (seq_len_ + 1) * sizeof(int32_t));
}

at::Tensor TokenDataset::batch(const std::vector<int64_t>& indices) const {
  at::Tensor out = at::empty({static_cast<int64_t>(indices.size()), seq_len_ + 1}, at::kLong);
  int64_t* dst = out.data_ptr<int64_t>();
  std::vector<int32_t> row(seq_len_ + 1);
  for (size_t i = 0; i < indices.size(); ++i) {
    get(indices[i], row.data());
    std::copy(row.begin(), row.end(), dst + i * (seq_len_ + 1));
  }
  return out;
}

void TokenDataset::check_vocab(int64_t vocab) const {
  if (corpus_.max_token_id >= vocab)
    throw TESSERA_INPUT_ERROR("data " + description_ + " contains token id " + std::to_string(corpus_.max_token_id) +
                              ", but the model's vocab_size is " + std::to_string(vocab) + " (tokenizer " +
                              (corpus_.tokenizer_name.empty() ? std::string("from token files") : corpus_.tokenizer_name) +
                              ", vocab " + std::to_string(corpus_.vocab_size) + ")");
}

}  // namespace tessera::data
