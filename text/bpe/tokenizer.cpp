#include "text/bpe/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <queue>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "text/bpe/sentencepiece.h"
#include "text/bpe/split.h"
#include "util/error.h"
#include "util/json.h"

namespace tessera::text::bpe {

namespace {

using json = nlohmann::json;

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 to U+0100.. in
// byte order, so every byte has a visible, non-space character.
std::array<uint32_t, 256> byte_to_codepoint() {
  std::array<uint32_t, 256> map{};
  std::array<bool, 256> printable{};
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) map[b] = printable[b] ? b : next++;
  return map;
}

// A vocabulary entry's spelling (UTF-8 of byte-mapped characters) -> its bytes; false if a character
// is not in the byte-level alphabet or the UTF-8 is malformed.
bool unmap_bytes(const std::string& s, const std::unordered_map<uint32_t, unsigned char>& inverse, std::string& out) {
  out.clear();
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    uint32_t cp;
    int len;
    if (c < 0x80) cp = c, len = 1;
    else if ((c & 0xE0) == 0xC0) cp = c & 0x1F, len = 2;
    else if ((c & 0xF0) == 0xE0) cp = c & 0x0F, len = 3;
    else if ((c & 0xF8) == 0xF0) cp = c & 0x07, len = 4;
    else return false;
    if (i + len > s.size()) return false;
    for (int k = 1; k < len; ++k) {
      const unsigned char cc = s[i + k];
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    auto it = inverse.find(cp);
    if (it == inverse.end()) return false;
    out.push_back(static_cast<char>(it->second));
    i += len;
  }
  return true;
}

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex).
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

struct BpeTokenizer::Impl {
  // Added tokens matched leftmost-longest: those written in the text as they are, or (normalized)
  // in the normalizer's output. A byte trie of their contents, so that a position costs one step per
  // byte matched, not one comparison per token sharing its first byte (Gemma 3 has thousands of
  // added tokens starting with '<').
  struct Matcher {
    std::vector<std::pair<std::string, int32_t>> tokens;
    std::unordered_map<uint64_t, int32_t> edges;  // (node, byte) -> child node; node 0 is the root
    std::vector<int32_t> node_id;                 // the token a node spells (the first listed), or -1
    std::array<bool, 256> starts{};               // some token starts with this byte
    static uint64_t edge(int32_t node, unsigned char c) { return (uint64_t(uint32_t(node)) << 8) | c; }
    void index() {
      node_id.assign(1, -1);
      for (const auto& [content, id] : tokens) {
        int32_t node = 0;
        for (unsigned char c : content) {
          auto [it, fresh] = edges.emplace(edge(node, c), (int32_t)node_id.size());
          if (fresh) node_id.push_back(-1);
          node = it->second;
        }
        if (node_id[node] < 0) node_id[node] = id;
        starts[static_cast<unsigned char>(content[0])] = true;
      }
    }
    // The longest token at s[p..]: its length and id; length 0 when none.
    std::pair<size_t, int32_t> longest(const std::string& s, size_t p) const {
      std::pair<size_t, int32_t> best{0, -1};
      int32_t node = 0;
      for (size_t i = p; i < s.size(); ++i) {
        auto it = edges.find(edge(node, static_cast<unsigned char>(s[i])));
        if (it == edges.end()) break;
        node = it->second;
        if (node_id[node] >= 0) best = {i + 1 - p, node_id[node]};
      }
      return best;
    }
    // Cuts `s` at the tokens: their ids go to `ids`, the text between them to gap(begin, end).
    template <class Gap>
    void split(const std::string& s, std::vector<int32_t>& ids, Gap&& gap) const {
      size_t start = 0;
      for (size_t p = 0; p < s.size(); ++p) {
        if (!starts[static_cast<unsigned char>(s[p])]) continue;
        const auto [len, id] = longest(s, p);
        if (len == 0) continue;
        if (p > start) gap(start, p);
        ids.push_back(id);
        start = p + len;
        p = start - 1;
      }
      if (s.size() > start) gap(start, s.size());
    }
  };

  std::string path;
  bool byte_level = true;  // a ByteLevel pre-tokenizer; else the SentencePiece-converted kind
  std::unordered_map<std::string, int32_t> vocab;  // model.vocab: byte-level: raw bytes; else the token -> id
  std::vector<std::string> id_bytes;               // id -> bytes / token (added tokens: content)
  std::vector<bool> known;                         // id is in model.vocab or added_tokens
  std::array<int32_t, 256> byte_id{};              // byte-level: the token of each byte
  std::array<int32_t, 256> fallback_id{};          // byte_fallback: the <0xNN> token of each byte, or -1
  bool byte_fallback = false, fuse_unk = false;
  int32_t unk = -1;
  // (left id, right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;
  bool ignore_merges = false;
  bpe::Normalizer normalizer;
  std::vector<std::unique_ptr<bpe::Split>> splits;  // Split steps, then ByteLevel's own regex if use_regex
  bool add_prefix_space = false;
  std::optional<bpe::Metaspace> metaspace;
  bpe::Decoder decoder;  // SentencePiece kind
  struct Added {
    std::string content;
    int32_t id;
    bool special;
  };
  std::vector<Added> added;
  Matcher raw_added, normalized_added;
  int32_t bos = -1, eos = -1;
  int64_t vocab_size = 0;

  [[noreturn]] void fail(const std::string& field, const std::string& what) const { bpe::fail(path, field, what); }

  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  void set_token(int32_t id, const std::string& bytes) {
    if (id >= (int64_t)id_bytes.size()) id_bytes.resize(id + 1), known.resize(id + 1, false);
    id_bytes[id] = bytes;
    known[id] = true;
  }

  void load(const json& j);
  void load_vocab(const json& model, const std::unordered_map<uint32_t, unsigned char>& inverse);
  void load_merges(const json& model, const std::unordered_map<uint32_t, unsigned char>& inverse);
  void load_added(const json& j);
  void load_pre_tokenizer(const json& pt);
  void load_special_ids(const json& j);
  void sp_symbols(const std::string& piece, std::vector<int32_t>& syms) const;
  void merge_all(const std::vector<int32_t>& syms, std::vector<int32_t>& out) const;
  void bpe(const std::string& piece, std::vector<int32_t>& out) const;
  void encode_section(const std::string& text, size_t begin, size_t end, std::vector<int32_t>& out) const;
  void encode_text(const std::string& text, size_t begin, size_t end, bool starts_input, std::vector<int32_t>& out) const;
};

namespace {

bool has_byte_level(const json& pt) {
  if (!pt.is_object()) return false;
  if (pt.value("type", std::string()) == "ByteLevel") return true;
  if (pt.value("type", std::string()) != "Sequence" || !pt.contains("pretokenizers") || !pt["pretokenizers"].is_array())
    return false;
  for (const auto& s : pt["pretokenizers"])
    if (s.is_object() && s.value("type", std::string()) == "ByteLevel") return true;
  return false;
}

}  // namespace

void BpeTokenizer::Impl::load(const json& j) {
  if (!j.is_object()) fail("top level", "is not a JSON object");
  const json model = j.value("model", json());
  if (!model.is_object()) fail("model", "is missing");
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") fail("model.type", "\"" + type + "\" is not supported (BPE only)");
  if (model.contains("dropout") && !model["dropout"].is_null()) fail("model.dropout", "is not supported");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(k) && !model[k].is_null() && model[k] != "") fail(std::string("model.") + k, "is not supported");
  const json pt = j.value("pre_tokenizer", json());
  byte_level = has_byte_level(pt);
  if (model.value("byte_fallback", false)) {
    if (byte_level) fail("model.byte_fallback", "true is not supported with a ByteLevel pre-tokenizer");
    byte_fallback = true;
  }
  fuse_unk = model.value("fuse_unk", false);
  ignore_merges = model.value("ignore_merges", false);
  normalizer.load(j.value("normalizer", json()), path);
  load_pre_tokenizer(pt);
  const json dec = j.value("decoder", json());
  if (!byte_level) decoder.load(dec, path);
  else if (!dec.is_null() && dec.value("type", std::string()) != "ByteLevel")
    fail("decoder.type", dec.value("type", json("?")).dump() + " is not supported with a ByteLevel pre-tokenizer (expected ByteLevel)");

  std::unordered_map<uint32_t, unsigned char> inverse;  // byte-level spelling -> byte
  const auto cp = byte_to_codepoint();
  for (int b = 0; b < 256; ++b) inverse[cp[b]] = static_cast<unsigned char>(b);
  load_vocab(model, inverse);
  load_merges(model, inverse);
  load_added(j);
  vocab_size = (int64_t)id_bytes.size();
  load_special_ids(j);
}

void BpeTokenizer::Impl::load_vocab(const json& model, const std::unordered_map<uint32_t, unsigned char>& inverse) {
  if (!model.contains("vocab") || !model["vocab"].is_object()) fail("model.vocab", "is missing");
  vocab.reserve(model["vocab"].size());
  std::string bytes;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > INT32_MAX)
      fail("model.vocab[\"" + it.key() + "\"]", "is not a valid id");
    if (!byte_level) bytes = it.key();
    else if (!unmap_bytes(it.key(), inverse, bytes))
      fail("model.vocab[\"" + it.key() + "\"]", "is not spelled in the byte-level alphabet (not a byte-level BPE)");
    const int32_t id = it->get<int32_t>();
    vocab[bytes] = id;
    set_token(id, bytes);
  }
  for (int b = 0; b < 256; ++b) {
    if (byte_level) {
      auto it = vocab.find(std::string(1, static_cast<char>(b)));
      if (it == vocab.end()) fail("model.vocab", "lacks the token of byte " + std::to_string(b));
      byte_id[b] = it->second;
    } else {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      auto it = vocab.find(name);
      fallback_id[b] = it == vocab.end() ? -1 : it->second;
    }
  }
  const json u = model.value("unk_token", json());
  if (!byte_level && !u.is_null()) {
    if (!u.is_string() || !vocab.count(u.get<std::string>())) fail("model.unk_token", u.dump() + " is not in model.vocab");
    unk = vocab[u.get<std::string>()];
  }
}

void BpeTokenizer::Impl::load_merges(const json& model, const std::unordered_map<uint32_t, unsigned char>& inverse) {
  if (!model.contains("merges") || !model["merges"].is_array()) fail("model.merges", "is missing");
  const json& ms = model["merges"];
  merges.reserve(ms.size());
  // Half a million merges in Gemma 3's file: no string is built per merge beyond the lookups' keys.
  std::string a, b, left, right, both;
  for (size_t r = 0; r < ms.size(); ++r) {
    auto field = [r] { return "model.merges[" + std::to_string(r) + "]"; };
    if (ms[r].is_string()) {  // "a b"
      const std::string& m = ms[r].get_ref<const std::string&>();
      const size_t sp = m.find(' ');
      if (sp == std::string::npos) fail(field(), "\"" + m + "\" is not two tokens separated by a space");
      a.assign(m, 0, sp), b.assign(m, sp + 1);
    } else if (ms[r].is_array() && ms[r].size() == 2 && ms[r][0].is_string() && ms[r][1].is_string()) {
      a = ms[r][0].get_ref<const std::string&>(), b = ms[r][1].get_ref<const std::string&>();
    } else {
      fail(field(), "is neither \"a b\" nor [\"a\", \"b\"]");
    }
    const std::string *l_key = &a, *r_key = &b;
    if (byte_level) {
      if (!unmap_bytes(a, inverse, left) || !unmap_bytes(b, inverse, right)) fail(field(), "is not byte-level");
      l_key = &left, r_key = &right;
    }
    both.assign(*l_key).append(*r_key);
    auto l = vocab.find(*l_key), rr = vocab.find(*r_key), m = vocab.find(both);
    if (l == vocab.end() || rr == vocab.end() || m == vocab.end())
      fail(field(), "\"" + a + " " + b + "\" merges tokens that are not in model.vocab");
    merges.emplace(key(l->second, rr->second), std::make_pair((int32_t)r, m->second));  // first listing wins
  }
}

// Added tokens: those with normalized false (default: special ones) are cut out of the text as
// written; the others out of each piece's normalizer output (their content normalized too).
void BpeTokenizer::Impl::load_added(const json& j) {
  if (!j.contains("added_tokens") || j["added_tokens"].is_null()) return;
  if (!j["added_tokens"].is_array()) fail("added_tokens", "is not a list");
  const json& at = j["added_tokens"];
  for (size_t i = 0; i < at.size(); ++i) {
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    if (!at[i].is_object() || !at[i].contains("id") || !at[i]["id"].is_number_integer() || !at[i].contains("content") ||
        !at[i]["content"].is_string() || at[i]["content"].get<std::string>().empty())
      fail(field, "needs an integer id and a non-empty content");
    for (const char* flag : {"lstrip", "rstrip", "single_word"})
      if (at[i].value(flag, false)) fail(field + "." + flag, "true is not supported");
    const int64_t id = at[i]["id"].get<int64_t>();
    if (id < 0 || id > INT32_MAX) fail(field + ".id", "is out of range");
    const std::string content = at[i]["content"].get<std::string>();
    const bool special = at[i].value("special", false);
    added.push_back({content, (int32_t)id, special});
    set_token((int32_t)id, content);
    if (!at[i].value("normalized", !special)) raw_added.tokens.emplace_back(content, (int32_t)id);
    else if (std::string n = normalizer.apply(content); !n.empty()) normalized_added.tokens.emplace_back(n, (int32_t)id);
  }
  raw_added.index();
  normalized_added.index();
}

void BpeTokenizer::Impl::load_pre_tokenizer(const json& pt) {
  if (pt.is_null()) return;  // the SentencePiece kind without one (Llama 2): each piece is one word
  std::vector<json> steps;
  std::vector<std::string> fields;
  if (pt.value("type", std::string()) == "Sequence") {
    const json list = pt.value("pretokenizers", json::array());
    for (size_t i = 0; i < list.size(); ++i)
      steps.push_back(list[i]), fields.push_back("pre_tokenizer.pretokenizers[" + std::to_string(i) + "]");
  } else {
    steps.push_back(pt), fields.push_back("pre_tokenizer");
  }
  bool seen_byte_level = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    const json& s = steps[i];
    const std::string type = s.is_object() ? s.value("type", std::string()) : std::string();
    if (seen_byte_level) fail(fields[i], "follows ByteLevel (ByteLevel must be the last step)");
    if (type == "Split") {
      splits.push_back(bpe::Split::load(s, fields[i], path));
    } else if (type == "ByteLevel") {
      seen_byte_level = true;
      add_prefix_space = s.value("add_prefix_space", false);
      if (s.value("use_regex", true))
        splits.push_back(std::make_unique<bpe::Split>(kGpt2Pattern, bpe::Split::Behavior::Isolated, false, "GPT-2 pattern"));
    } else if (type == "Metaspace" && !byte_level && steps.size() == 1) {
      metaspace = bpe::Metaspace::load(s, fields[i], path);
    } else {
      fail(fields[i] + ".type", "\"" + type + "\" is not supported (Split, ByteLevel last, or Metaspace alone)");
    }
  }
}
void BpeTokenizer::Impl::load_special_ids(const json& j) {
  auto id_of = [&](const std::string& content) -> int32_t {
    for (const auto& a : added)
      if (a.content == content) return a.id;
    auto it = vocab.find(content);
    return it == vocab.end() ? -1 : it->second;
  };
  const auto config_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::is_regular_file(config_path, ec)) {
    json cfg;
    try {
      std::ifstream in(config_path);
      cfg = util::parse_json(in);
    } catch (const json::exception& e) {
      throw TESSERA_INPUT_ERROR("tokenizer config " + config_path.string() + ": invalid JSON: " + e.what());
    }
    auto token = [&](const char* field) -> int32_t {
      if (!cfg.is_object() || !cfg.contains(field) || cfg[field].is_null()) return -1;
      const json& v = cfg[field];
      const json content = v.is_object() ? v.value("content", json()) : v;
      if (!content.is_string())
        throw TESSERA_INPUT_ERROR("tokenizer config " + config_path.string() + ": " + field + " " + v.dump() +
                                  " is neither a token nor {\"content\": token}");
      const int32_t id = id_of(content.get<std::string>());
      if (id < 0)
        throw TESSERA_INPUT_ERROR("tokenizer config " + config_path.string() + ": " + field + " " + content.dump() +
                                  " is not a token of " + path);
      return id;
    };
    bos = token("bos_token");
    eos = token("eos_token");
    return;
  }
  // No tokenizer_config.json: the specials a TemplateProcessing post-processor wraps a text in.
  json pp = j.value("post_processor", json());
  std::vector<json> procs;
  if (pp.is_object() && pp.value("type", std::string()) == "Sequence") {
    for (const auto& p : pp.value("processors", json::array())) procs.push_back(p);
  } else if (pp.is_object()) {
    procs.push_back(pp);
  }
  for (const auto& p : procs) {
    if (p.value("type", std::string()) != "TemplateProcessing") continue;
    bool after_text = false;
    for (const auto& piece : p.value("single", json::array())) {
      if (piece.contains("Sequence")) {
        after_text = true;
      } else if (piece.contains("SpecialToken") && piece["SpecialToken"].contains("id")) {
        const int32_t id = id_of(piece["SpecialToken"]["id"].get<std::string>());
        (after_text ? eos : bos) = id;
      }
    }
  }
}

// The SentencePiece kind's first symbols: each character's token; a character not in the
// vocabulary becomes its <0xNN> byte tokens (byte_fallback, when all exist), else model.unk_token
// (consecutive ones fused into one with fuse_unk), else nothing, as `tokenizers`' BPE::merge_word.
void BpeTokenizer::Impl::sp_symbols(const std::string& piece, std::vector<int32_t>& syms) const {
  bool pending_unk = false;
  for (size_t i = 0, len; i < piece.size(); i += len) {
    len = bpe::utf8_char_len(piece, i);
    auto it = vocab.find(piece.substr(i, len));
    if (it != vocab.end()) {
      if (pending_unk) syms.push_back(unk), pending_unk = false;
      syms.push_back(it->second);
      continue;
    }
    if (byte_fallback &&
        std::all_of(piece.begin() + i, piece.begin() + i + len, [&](char c) { return fallback_id[static_cast<unsigned char>(c)] >= 0; })) {
      for (size_t k = i; k < i + len; ++k) syms.push_back(fallback_id[static_cast<unsigned char>(piece[k])]);
      continue;
    }
    if (unk < 0) continue;
    if (pending_unk && !fuse_unk) syms.push_back(unk);
    pending_unk = true;
  }
  if (pending_unk) syms.push_back(unk);
}

// BPE of one piece, as tokenizers' Word::merge_all: lowest merge rank first, leftmost among equal
// ranks; a queued pair is skipped once either side has changed.
void BpeTokenizer::Impl::merge_all(const std::vector<int32_t>& ids, std::vector<int32_t>& out) const {
  const int n = (int)ids.size();
  if (n <= 1) {
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  struct Sym {
    int32_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Sym> sym(n);
  for (int i = 0; i < n; ++i) sym[i] = {ids[i], i - 1, i + 1 < n ? i + 1 : -1, true};
  struct Cand {
    int32_t rank;
    int pos;
    int32_t new_id;
    bool operator<(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }  // min-heap
  };
  std::priority_queue<Cand> queue;
  auto push = [&](int pos) {
    const int nx = sym[pos].next;
    if (nx < 0) return;
    auto it = merges.find(key(sym[pos].id, sym[nx].id));
    if (it != merges.end()) queue.push({it->second.first, pos, it->second.second});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const Cand top = queue.top();
    queue.pop();
    Sym& s = sym[top.pos];
    if (!s.alive || s.next < 0) continue;
    auto it = merges.find(key(s.id, sym[s.next].id));
    if (it == merges.end() || it->second.second != top.new_id) continue;
    Sym& right = sym[s.next];
    s.id = top.new_id;
    right.alive = false;
    s.next = right.next;
    if (s.next >= 0) sym[s.next].prev = top.pos;
    if (s.prev >= 0) push(s.prev);
    push(top.pos);
  }
  for (int i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

void BpeTokenizer::Impl::bpe(const std::string& piece, std::vector<int32_t>& out) const {
  if (ignore_merges) {
    auto it = vocab.find(piece);
    if (it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> syms;
  syms.reserve(piece.size());
  if (byte_level) {
    for (unsigned char c : piece) syms.push_back(byte_id[c]);
  } else {
    sp_symbols(piece, syms);
  }
  merge_all(syms, out);
}

// One stretch of the text between raw added tokens: normalized, cut at the normalized added tokens.
void BpeTokenizer::Impl::encode_section(const std::string& text, size_t begin, size_t end, std::vector<int32_t>& out) const {
  if (normalizer.empty() && normalized_added.tokens.empty()) return encode_text(text, begin, end, begin == 0, out);
  const std::string norm = normalizer.apply(text.substr(begin, end - begin));
  normalized_added.split(norm, out, [&](size_t b, size_t e) { encode_text(norm, b, e, begin == 0 && b == 0, out); });
}

void BpeTokenizer::Impl::encode_text(const std::string& text, size_t begin, size_t end, bool starts_input,
                                     std::vector<int32_t>& out) const {
  if (begin >= end) return;
  if (metaspace) {
    std::vector<std::string> pieces;
    metaspace->pre_tokenize(text.substr(begin, end - begin), starts_input, pieces);
    for (const auto& p : pieces) bpe(p, out);
    return;
  }
  std::string buf;
  const std::string* s = &text;
  if (add_prefix_space && text[begin] != ' ') {
    buf = " " + text.substr(begin, end - begin);
    s = &buf, begin = 0, end = buf.size();
  }
  std::vector<std::pair<size_t, size_t>> pieces = {{begin, end}}, next;
  for (const auto& re : splits) {
    next.clear();
    for (const auto& [b, e] : pieces) re->split(*s, b, e, next);
    pieces.swap(next);
  }
  std::string piece;
  for (const auto& [b, e] : pieces) {
    piece.assign(*s, b, e - b);
    bpe(piece, out);
  }
}

BpeTokenizer::BpeTokenizer(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw TESSERA_INPUT_ERROR("tokenizer file " + path + " does not exist or is not a regular file");
  json j;
  try {
    std::ifstream in(path);
    j = util::parse_json(in);
  } catch (const json::exception& e) {
    throw TESSERA_INPUT_ERROR("tokenizer " + path + ": invalid JSON: " + e.what());
  }
  try {
    impl_->load(j);
  } catch (const json::exception& e) {  // a field of an unexpected JSON type
    throw TESSERA_INPUT_ERROR("tokenizer " + path + ": unexpected structure: " + e.what());
  }
}

BpeTokenizer::~BpeTokenizer() = default;

std::vector<int32_t> BpeTokenizer::encode(const std::string& text) const {
  const Impl& m = *impl_;
  std::vector<int32_t> ids;
  m.raw_added.split(text, ids, [&](size_t b, size_t e) { m.encode_section(text, b, e, ids); });
  return ids;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= (int64_t)impl_->id_bytes.size() || !impl_->known[id])
      throw TESSERA_INPUT_ERROR("tokenizer " + impl_->path + ": id " + std::to_string(id) + " is not in the vocabulary");
    tokens.push_back(impl_->id_bytes[id]);
  }
  if (!impl_->byte_level) return impl_->decoder.decode(std::move(tokens));
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

int32_t BpeTokenizer::bos_id() const { return impl_->bos; }
int32_t BpeTokenizer::eos_id() const { return impl_->eos; }
int64_t BpeTokenizer::vocab_size() const { return impl_->vocab_size; }
std::string BpeTokenizer::name() const { return "bpe:" + impl_->path; }

std::optional<int32_t> BpeTokenizer::special_id(const std::string& text) const {
  for (const auto& a : impl_->added)
    if (a.special && a.content == text) return a.id;
  return std::nullopt;
}

}  // namespace tessera::text::bpe
