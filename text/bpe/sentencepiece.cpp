#include "text/bpe/sentencepiece.h"

#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "util/error.h"

namespace tessera::text::bpe {

using json = nlohmann::json;

void fail(const std::string& path, const std::string& field, const std::string& what) {
  throw TESSERA_INPUT_ERROR("tokenizer " + path + ": " + field + " " + what);
}

size_t utf8_char_len(const std::string& s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  size_t len = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
  if (len == 0 || i + len > s.size()) return 1;
  for (size_t k = 1; k < len; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  return len;
}

namespace {

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  std::string out;
  size_t last = 0;
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, last)) {
    out.append(s, last, p - last).append(to);
    last = p + from.size();
  }
  if (last == 0) return;
  out.append(s, last, std::string::npos);
  s.swap(out);
}

std::string type_of(const json& j) { return j.is_object() ? j.value("type", std::string()) : std::string(); }

// A field that must hold exactly one character (a Rust `char` in `tokenizers`).
std::string one_char(const json& j, const char* key, const std::string& field, const std::string& path) {
  const json& v = j.at(key);
  if (!v.is_string() || v.get<std::string>().empty() || utf8_char_len(v.get<std::string>(), 0) != v.get<std::string>().size())
    fail(path, field + "." + key, v.dump() + " is not a single character");
  return v.get<std::string>();
}

// The {"String": s} of a Replace step; a Regex pattern is refused.
std::string string_pattern(const json& j, const std::string& field, const std::string& path) {
  const json pat = j.value("pattern", json());
  if (pat.is_object() && pat.contains("Regex"))
    fail(path, field + ".pattern.Regex", "is not supported (String patterns only)");
  if (!pat.is_object() || !pat.contains("String") || !pat["String"].is_string() || pat["String"].get<std::string>().empty())
    fail(path, field + ".pattern", "is not {\"String\": non-empty text}");
  if (!j.contains("content") || !j["content"].is_string()) fail(path, field + ".content", "is not a string");
  return pat["String"].get<std::string>();
}

// utf8proc's options for a normalizer type NFC, NFD, NFKC or NFKD (as its utf8proc_NFC & co.); 0 for
// another type.
int unicode_form(const std::string& type) {
  if (type == "NFC") return UTF8PROC_STABLE | UTF8PROC_COMPOSE;
  if (type == "NFD") return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
  if (type == "NFKC") return UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
  if (type == "NFKD") return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
  return 0;
}

// `text` in a Unicode normalization form. utf8proc refuses malformed UTF-8 (and surrogates) as a
// whole, so each run of well-formed characters is normalized on its own and the bytes between
// runs are kept as they are (a Hugging Face text is always UTF-8; a file read here may not be).
std::string unicode_normalize(const std::string& text, int form) {
  std::string out;
  out.reserve(text.size());
  const auto* bytes = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  const auto normalize_run = [&](size_t begin, size_t end) {
    if (begin == end) return;
    utf8proc_uint8_t* mapped = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(bytes + begin, (utf8proc_ssize_t)(end - begin), &mapped, (utf8proc_option_t)form);
    TESSERA_CHECK(n >= 0, std::string("utf8proc_map: ") + utf8proc_errmsg(n));  // the run is well-formed
    out.append(reinterpret_cast<const char*>(mapped), (size_t)n);
    std::free(mapped);
  };
  size_t run = 0;
  for (size_t i = 0; i < text.size();) {
    utf8proc_int32_t cp;
    const utf8proc_ssize_t len = utf8proc_iterate(bytes + i, (utf8proc_ssize_t)(text.size() - i), &cp);
    if (len > 0) {
      i += (size_t)len;
      continue;
    }
    normalize_run(run, i);
    out.push_back(text[i]);
    run = ++i;
  }
  normalize_run(run, text.size());
  return out;
}

}  // namespace

void Normalizer::load(const json& j, const std::string& path) {
  steps_.clear();
  if (!j.is_null()) add(j, "normalizer", path);
}

void Normalizer::add(const json& j, const std::string& field, const std::string& path) {
  const std::string type = type_of(j);
  if (type == "Sequence") {
    const json list = j.value("normalizers", json::array());
    if (!list.is_array()) fail(path, field + ".normalizers", "is not a list");
    for (size_t i = 0; i < list.size(); ++i) add(list[i], field + ".normalizers[" + std::to_string(i) + "]", path);
  } else if (type == "Prepend") {
    if (!j.contains("prepend") || !j["prepend"].is_string()) fail(path, field + ".prepend", "is not a string");
    steps_.push_back({Step::Prepend, "", j["prepend"].get<std::string>()});
  } else if (type == "Replace") {
    std::string from = string_pattern(j, field, path);
    steps_.push_back({Step::Replace, std::move(from), j["content"].get<std::string>()});
  } else if (const int form = unicode_form(type)) {
    steps_.push_back({Step::Unicode, "", "", form});
  } else {
    fail(path, field + ".type", (j.is_object() ? j.value("type", json("?")) : j).dump() +
                                    " is not supported (Sequence, Prepend, Replace with a String pattern, NFC, NFD,"
                                    " NFKC, NFKD)");
  }
}

std::string Normalizer::apply(std::string text) const {
  for (const Step& s : steps_) {
    if (s.kind == Step::Prepend) {
      if (!text.empty()) text.insert(0, s.text);
    } else if (s.kind == Step::Replace) {
      replace_all(text, s.from, s.text);
    } else {
      text = unicode_normalize(text, s.form);
    }
  }
  return text;
}

Metaspace Metaspace::load(const json& j, const std::string& field, const std::string& path) {
  Metaspace m;
  if (j.contains("replacement")) m.replacement = one_char(j, "replacement", field, path);
  if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
    const json& s = j["prepend_scheme"];
    if (s == "always") m.prepend = Prepend::Always;
    else if (s == "first") m.prepend = Prepend::First;
    else if (s == "never") m.prepend = Prepend::Never;
    else fail(path, field + ".prepend_scheme", s.dump() + " is not supported (first, always or never)");
  }
  if (j.contains("add_prefix_space") && !j["add_prefix_space"].get<bool>()) {  // older files: false = never
    if (m.prepend != Prepend::Never && j.contains("prepend_scheme") && !j["prepend_scheme"].is_null())
      fail(path, field + ".add_prefix_space", "false contradicts prepend_scheme " + j["prepend_scheme"].dump());
    m.prepend = Prepend::Never;
  }
  m.split = j.value("split", true);
  return m;
}

void Metaspace::pre_tokenize(const std::string& text, bool starts_input, std::vector<std::string>& pieces) const {
  std::string s = text;
  replace_all(s, " ", replacement);
  const bool add = prepend == Prepend::Always || (prepend == Prepend::First && starts_input);
  if (add && s.compare(0, replacement.size(), replacement) != 0) s.insert(0, replacement);
  if (!split) {
    pieces.push_back(std::move(s));
    return;
  }
  size_t begin = 0;
  for (size_t p = s.find(replacement, 1); p != std::string::npos; p = s.find(replacement, p + 1)) {
    if (p > begin) pieces.push_back(s.substr(begin, p - begin));
    begin = p;
  }
  if (begin < s.size()) pieces.push_back(s.substr(begin));
}

void Decoder::load(const json& j, const std::string& path) {
  steps_.clear();
  none_ = j.is_null();
  if (!none_) add(j, "decoder", path);
}

void Decoder::add(const json& j, const std::string& field, const std::string& path) {
  const std::string type = type_of(j);
  Step s{Kind::Fuse, "", ""};
  if (type == "Sequence") {
    const json list = j.value("decoders", json::array());
    if (!list.is_array()) fail(path, field + ".decoders", "is not a list");
    for (size_t i = 0; i < list.size(); ++i) add(list[i], field + ".decoders[" + std::to_string(i) + "]", path);
    return;
  } else if (type == "Replace") {
    s = {Kind::Replace, string_pattern(j, field, path), j["content"].get<std::string>()};
  } else if (type == "ByteFallback") {
    s.kind = Kind::ByteFallback;
  } else if (type == "Fuse") {
    s.kind = Kind::Fuse;
  } else if (type == "Strip") {
    s = {Kind::Strip, one_char(j, "content", field, path), ""};
    for (const char* k : {"start", "stop"})
      if (!j.contains(k) || !j[k].is_number_unsigned()) fail(path, field + "." + k, "is not a count");
    s.start = j["start"].get<size_t>(), s.stop = j["stop"].get<size_t>();
  } else if (type == "Metaspace") {
    const Metaspace m = Metaspace::load(j, field, path);
    s = {Kind::Metaspace, m.replacement, " "};
    s.keep_first = m.prepend == Metaspace::Prepend::Never;
  } else {
    fail(path, field + ".type", (j.is_object() ? j.value("type", json("?")) : j).dump() +
                                    " is not supported here (Sequence, Replace, ByteFallback, Fuse, Strip, Metaspace;"
                                    " ByteLevel needs a ByteLevel pre-tokenizer)");
  }
  steps_.push_back(std::move(s));
}

namespace {

// ByteFallback: runs of "<0xNN>" tokens become one token of their bytes.
std::vector<std::string> byte_fallback(const std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  std::string bytes;
  auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
  for (const std::string& t : tokens) {
    if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && hex(t[3]) && hex(t[4])) {
      bytes.push_back(static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
      continue;
    }
    if (!bytes.empty()) out.push_back(std::move(bytes)), bytes.clear();
    out.push_back(t);
  }
  if (!bytes.empty()) out.push_back(std::move(bytes));
  return out;
}

// Strip: up to `start` leading and `stop` trailing characters equal to `content`.
std::string strip(const std::string& t, const std::string& content, size_t start, size_t stop) {
  std::vector<size_t> at;  // byte offset of each character
  for (size_t i = 0; i < t.size(); i += utf8_char_len(t, i)) at.push_back(i);
  at.push_back(t.size());
  const size_t n = at.size() - 1;
  auto is_content = [&](size_t c) { return t.compare(at[c], at[c + 1] - at[c], content) == 0; };
  size_t first = 0, last = n;
  while (first < std::min(start, n) && is_content(first)) ++first;
  while (n - last < stop && last > 0 && is_content(last - 1)) --last;
  return last <= first ? std::string() : t.substr(at[first], at[last] - at[first]);
}

}  // namespace

std::string Decoder::decode(std::vector<std::string> tokens) const {
  std::string out;
  if (none_) {
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const Step& s : steps_) {
    switch (s.kind) {
      case Kind::Replace:
        for (auto& t : tokens) replace_all(t, s.from, s.to);
        break;
      case Kind::ByteFallback:
        tokens = byte_fallback(tokens);
        break;
      case Kind::Fuse: {
        std::string all;
        for (const auto& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        break;
      }
      case Kind::Strip:
        for (auto& t : tokens) t = strip(t, s.from, s.start, s.stop);
        break;
      case Kind::Metaspace:
        for (size_t i = 0; i < tokens.size(); ++i) replace_all(tokens[i], s.from, i == 0 && !s.keep_first ? "" : " ");
        break;
    }
  }
  for (const auto& t : tokens) out += t;
  return out;
}

}  // namespace tessera::text::bpe
