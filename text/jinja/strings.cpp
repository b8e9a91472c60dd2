#include "text/jinja/strings.h"

#include <algorithm>
#include <cctype>

namespace tessera::text::jinja {

using K = Value::Kind;

std::string ascii_lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

std::string ascii_upper(std::string s) {
  for (char& c : s)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  return s;
}

std::string py_capitalize(const std::string& s) {
  if (s.empty()) return s;
  return ascii_upper(s.substr(0, 1)) + ascii_lower(s.substr(1));
}

std::string py_title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    const bool alpha = std::isalpha(static_cast<unsigned char>(c)) != 0;
    if (alpha) c = prev_cased ? static_cast<char>(std::tolower(c)) : static_cast<char>(std::toupper(c));
    prev_cased = alpha;
  }
  return out;
}

std::string jinja_title(const std::string& s) {
  // "".join(w[0].upper() + w[1:].lower() for w in re.split(r"([-\s\(\{\[\<]+)", s) if w)
  std::string out;
  bool word_start = true;
  for (const std::string& cp : code_points(s)) {
    const bool sep = cp == "-" || cp == "(" || cp == "{" || cp == "[" || cp == "<" || is_py_space(cp);
    if (sep) out += cp;
    else out += word_start ? ascii_upper(cp) : ascii_lower(cp);
    word_start = sep;
  }
  return out;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // inserts `to` between code points
    const auto cps = code_points(s);
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || static_cast<int64_t>(k) < count) append_bounded(out, to);
      if (k < cps.size()) append_bounded(out, cps[k]);
    }
    return out;
  }
  size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    append_bounded(out, s.substr(pos, hit - pos) + to);
    pos = hit + from.size();
  }
  return out + s.substr(pos);
}

List py_split(const std::string& s, const Value& sep, int64_t maxsplit) {
  List out;
  if (sep.is(K::Str)) {
    size_t pos = 0;
    for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
      const size_t hit = s.find(sep.s, pos);
      if (hit == std::string::npos) break;
      out.push_back(Value::str(s.substr(pos, hit - pos)));
      pos = hit + sep.s.size();
    }
    out.push_back(Value::str(s.substr(pos)));
    return out;
  }
  const auto cps = code_points(s);
  size_t k = 0;
  while (true) {
    while (k < cps.size() && is_py_space(cps[k])) ++k;
    if (k == cps.size()) break;
    std::string word;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      for (; k < cps.size(); ++k) word += cps[k];
      out.push_back(Value::str(py_strip(word, "", false, true)));
      break;
    }
    for (; k < cps.size() && !is_py_space(cps[k]); ++k) word += cps[k];
    out.push_back(Value::str(word));
  }
  return out;
}

namespace {

bool affix_match(const std::string& s, const Value& affix, bool prefix, const Where& w) {
  List options = affix.is(K::List) ? *affix.list : List{affix};
  for (const Value& a : options) {
    if (!a.is(K::Str)) w.type_error("startswith/endswith take a string or a tuple of strings");
    if (a.s.size() <= s.size() && s.compare(prefix ? 0 : s.size() - a.s.size(), a.s.size(), a.s) == 0) return true;
  }
  return false;
}

std::string str_arg(const Args& a, size_t pos, const char* key, const Where& w, const std::string& def = "") {
  const Value v = arg(a, pos, key);
  if (v.is(K::Undefined) || v.is(K::None)) return def;
  if (!v.is(K::Str)) w.type_error(std::string("argument '") + key + "' must be str, not " + type_name(v));
  return v.s;
}

int64_t int_arg(const Args& a, size_t pos, const char* key, const Where& w, int64_t def) {
  const Value v = arg(a, pos, key);
  if (v.is(K::Undefined) || v.is(K::None)) return def;
  if (!v.is(K::Int)) w.type_error(std::string("argument '") + key + "' must be int, not " + type_name(v));
  return v.i;
}

}  // namespace

Value str_method(const Value& obj, const std::string& name, const Where& w0) {
  const std::string s = obj.s, origin = w0.origin;
  const int line = w0.line;
  auto m = [&](auto f) {
    return Value::func(name, [f, s, origin, line](const Args& a) { return f(s, a, Where{origin, line}); });
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool l = name != "rstrip", r = name != "lstrip";
    return m([l, r](const std::string& x, const Args& a, const Where& w) {
      const Value chars = arg(a, 0, "chars");
      return Value::str(chars.is(K::Str) ? (chars.s.empty() ? x : py_strip(x, chars.s, l, r)) : py_strip(x, str_arg(a, 0, "chars", w), l, r));
    });
  }
  if (name == "split")
    return m([](const std::string& x, const Args& a, const Where& w) {
      const Value sep = arg(a, 0, "sep");
      if (sep.is(K::Str) && sep.s.empty()) w.type_error("empty separator");
      return Value::make_list(py_split(x, sep, int_arg(a, 1, "maxsplit", w, -1)));
    });
  if (name == "startswith" || name == "endswith") {
    const bool prefix = name == "startswith";
    return m([prefix](const std::string& x, const Args& a, const Where& w) {
      return Value::boolean(affix_match(x, arg(a, 0, prefix ? "prefix" : "suffix"), prefix, w));
    });
  }
  if (name == "upper") return m([](const std::string& x, const Args&, const Where&) { return Value::str(ascii_upper(x)); });
  if (name == "lower") return m([](const std::string& x, const Args&, const Where&) { return Value::str(ascii_lower(x)); });
  if (name == "title") return m([](const std::string& x, const Args&, const Where&) { return Value::str(py_title(x)); });
  if (name == "capitalize")
    return m([](const std::string& x, const Args&, const Where&) { return Value::str(py_capitalize(x)); });
  if (name == "replace")
    return m([](const std::string& x, const Args& a, const Where& w) {
      return Value::str(py_replace(x, str_arg(a, 0, "old", w), str_arg(a, 1, "new", w), int_arg(a, 2, "count", w, -1)));
    });
  if (name == "join")
    return m([](const std::string& x, const Args& a, const Where& w) {
      std::string out;
      const List items = iterate(arg(a, 0, "iterable"), w);
      for (size_t k = 0; k < items.size(); ++k) {
        if (!items[k].is(K::Str)) w.type_error("sequence item " + std::to_string(k) + ": expected str instance, " + type_name(items[k]) + " found");
        append_bounded(out, (k ? x : "") + items[k].s);
      }
      return Value::str(out);
    });
  if (name == "find")
    return m([](const std::string& x, const Args& a, const Where& w) {
      const size_t hit = x.find(str_arg(a, 0, "sub", w));
      return Value::integer(hit == std::string::npos ? -1 : static_cast<int64_t>(code_points(x.substr(0, hit)).size()));
    });
  static const char* other[] = {"format", "format_map", "zfill", "center", "ljust", "rjust", "count", "index", "rfind", "rindex",
                                "rsplit", "splitlines", "partition", "rpartition", "encode", "expandtabs", "swapcase", "casefold",
                                "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper", "istitle", "isnumeric",
                                "isdecimal", "isidentifier", "isprintable", "isascii", "removeprefix", "removesuffix", "translate",
                                "maketrans"};
  if (std::find_if(std::begin(other), std::end(other), [&](const char* o) { return name == o; }) != std::end(other))
    w0.unsupported("str method ." + name + "()");
  return Value::undefined(name);
}

}  // namespace tessera::text::jinja
