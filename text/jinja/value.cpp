#include "text/jinja/value.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "util/budgets.h"

namespace tessera::text::jinja {

namespace budget = util::budget;

namespace {

thread_local RenderBudget* current_budget = nullptr;

std::string mib(size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

void charge(size_t bytes) {
  RenderBudget* b = current_budget;
  if (!b) return;
  b->made += bytes;
  if (b->made > budget::kJinjaMadeBytes)
    throw BudgetExceeded("made more than " + mib(budget::kJinjaMadeBytes) + " of strings and list items in one render");
}

// Frees the values in `stack` and everything only they hold, one level at a time (no recursion).
void dismantle(std::vector<Value>& stack) {
  while (!stack.empty()) {
    Value v = std::move(stack.back());
    stack.pop_back();
    if (v.list && v.list.use_count() == 1) {
      for (Value& e : *v.list) stack.push_back(std::move(e));
      v.list->clear();
    }
    if (v.dict && v.dict.use_count() == 1) {
      for (auto& kv : v.dict->items) stack.push_back(std::move(kv.second));
      v.dict->items.clear();
    }
  }
}

void delete_list(List* l) {
  std::vector<Value> stack(std::make_move_iterator(l->begin()), std::make_move_iterator(l->end()));
  l->clear();
  delete l;
  dismantle(stack);
}

}  // namespace

RenderBudget* RenderBudget::current() { return current_budget; }
RenderBudget::Scope::Scope(RenderBudget& b) : mine_(&b), saved_(current_budget) { current_budget = &b; }
RenderBudget::Scope::~Scope() {
  current_budget = saved_;
  std::vector<Value> stack;  // a namespace may hold itself: empty each, or the cycle would leak
  for (const auto& w : mine_->spaces)
    if (auto d = w.lock()) {
      for (auto& kv : d->items) stack.push_back(std::move(kv.second));
      d->items.clear();
    }
  dismantle(stack);
}

void check_string_bytes(size_t bytes) {
  if (current_budget && bytes > budget::kJinjaStringBytes)
    throw BudgetExceeded("made a string of more than " + mib(budget::kJinjaStringBytes));
}

void append_bounded(std::string& out, const std::string& piece) {
  check_string_bytes(out.size() + piece.size());
  out += piece;
}

void too_deep() { throw BudgetExceeded("nests deeper than " + std::to_string(budget::kJinjaDepth) + " levels"); }

Dict::~Dict() {
  std::vector<Value> stack;
  for (auto& kv : items) stack.push_back(std::move(kv.second));
  items.clear();
  dismantle(stack);
}

namespace {
Value of_kind(Value::Kind k) {
  Value v;
  v.kind = k;
  return v;
}
}  // namespace

Value Value::undefined(std::string name) {
  Value v;
  v.s = std::move(name);
  return v;
}
Value Value::none() { return of_kind(Kind::None); }
Value Value::boolean(bool x) {
  Value v = of_kind(Kind::Bool);
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v = of_kind(Kind::Int);
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v = of_kind(Kind::Float);
  v.f = x;
  return v;
}
Value Value::str(std::string x) {
  check_string_bytes(x.size());
  charge(sizeof(Value) + x.size());
  Value v = of_kind(Kind::Str);
  v.s = std::move(x);
  return v;
}
Value Value::make_list(List x) {
  size_t bytes = x.size() * sizeof(Value);
  for (const Value& e : x) bytes += e.s.size();
  charge(bytes);
  Value v = of_kind(Kind::List);
  v.list = std::shared_ptr<List>(new List(std::move(x)), delete_list);
  return v;
}
Value Value::make_tuple(List x) {
  Value v = make_list(std::move(x));
  v.tuple = true;
  return v;
}
Value Value::make_dict() {
  Value v = of_kind(Kind::Dict);
  v.dict = std::make_shared<Dict>();
  return v;
}
Value Value::func(std::string name, Function f) {
  Value v = of_kind(Kind::Func);
  v.s = std::move(name);
  v.fn = std::make_shared<Function>(std::move(f));
  return v;
}

double Value::as_double() const {
  switch (kind) {
    case Kind::Int: return static_cast<double>(i);
    case Kind::Float: return f;
    case Kind::Bool: return b ? 1 : 0;
    default: throw std::invalid_argument("a " + type_name(*this) + " is not a number");
  }
}

const Value* Dict::find(const std::string& key) const {
  for (const auto& kv : items)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& kv : items)
    if (kv.first == key) {
      kv.second = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

std::string type_name(const Value& v) {
  using K = Value::Kind;
  switch (v.kind) {
    case K::Undefined: return "Undefined";
    case K::None: return "NoneType";
    case K::Bool: return "bool";
    case K::Int: return "int";
    case K::Float: return "float";
    case K::Str: return "str";
    case K::List: return "list";
    case K::Dict: return v.ns ? "Namespace" : "dict";
    case K::Func: return "function";
  }
  return "?";
}

bool truthy(const Value& v) {
  using K = Value::Kind;
  switch (v.kind) {
    case K::Undefined:
    case K::None: return false;
    case K::Bool: return v.b;
    case K::Int: return v.i != 0;
    case K::Float: return v.f != 0;
    case K::Str: return !v.s.empty();
    case K::List: return !v.list->empty();
    case K::Dict: return v.ns || !v.dict->items.empty();
    case K::Func: return true;
  }
  return false;
}

std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // [-]d[.ddd]e[+-]XX
  const size_t e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string digits = sci.substr(0, e);
  const bool neg = digits[0] == '-';
  if (neg) digits.erase(0, 1);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string(-exp - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out = digits + std::string(exp + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
  } else {
    char e_buf[16];
    std::snprintf(e_buf, sizeof e_buf, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "") + e_buf;
  }
  return (neg ? "-" : "") + out;
}

size_t code_point_count(const std::string& s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) {
    const unsigned char c = s[i];
    i += std::min<size_t>(c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4, s.size() - i);
  }
  return n;
}

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

namespace {

uint32_t decode(const std::string& cp) {
  const auto* p = reinterpret_cast<const unsigned char*>(cp.data());
  switch (cp.size()) {
    case 1: return p[0];
    case 2: return ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    case 3: return ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    default: return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
  }
}

// Not printable for CPython's repr (the common cases: controls, format characters, separators).
bool non_printable(uint32_t c) {
  return c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD || c == 0x1680 || (c >= 0x2000 && c <= 0x200F) ||
         (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x206F) || c == 0x3000 || c == 0xFEFF;
}

std::string repr_str(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (size_t i = 0, n; i < s.size(); i += n) {  // by code point, as code_points() cuts them
    const unsigned char lead = s[i];
    n = std::min<size_t>(lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4, s.size() - i);
    if (lead >= 0x20 && lead < 0x7F && lead != static_cast<unsigned char>(q) && lead != '\\') {
      out += static_cast<char>(lead);
      continue;
    }
    const std::string cp = s.substr(i, n);
    const uint32_t c = decode(cp);
    char buf[16];
    if (cp[0] == q || cp[0] == '\\') out += "\\" + cp;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (non_printable(c)) {
      std::snprintf(buf, sizeof buf, c < 0x100 ? "\\x%02x" : "\\u%04x", c);
      out += buf;
    } else {
      out += cp;
    }
  }
  return out + q;
}

// (letter, character); JSON has the first five.
constexpr std::pair<char, char> kEscapes[] = {{'n', '\n'}, {'t', '\t'}, {'r', '\r'}, {'b', '\b'},
                                              {'f', '\f'}, {'0', '\0'}, {'a', '\a'}, {'v', '\v'}};
constexpr size_t kJsonEscapes = 5;

std::string json_str(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const unsigned char c = ch;
    if (const char letter = json_escape_letter(ch)) {
      out += {'\\', letter};
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string str_at(const Value& v, int depth);
std::string repr_at(const Value& v, int depth) { return v.is(Value::Kind::Str) ? repr_str(v.s) : str_at(v, depth); }

std::string join_repr(const Value& v, int depth) {
  if (depth > budget::kJinjaDepth) too_deep();
  std::string out;
  if (v.is(Value::Kind::List)) {
    for (size_t k = 0; k < v.list->size(); ++k) append_bounded(out, (k ? ", " : "") + repr_at((*v.list)[k], depth + 1));
    if (v.tuple) return "(" + out + (v.list->size() == 1 ? ",)" : ")");
    return "[" + out + "]";
  }
  for (size_t k = 0; k < v.dict->items.size(); ++k)
    append_bounded(out, (k ? ", " : "") + repr_str(v.dict->items[k].first) + ": " + repr_at(v.dict->items[k].second, depth + 1));
  return (v.ns ? "<Namespace {" : "{") + out + (v.ns ? "}>" : "}");
}

std::string json_at(const Value& v, int indent, int level) {
  using K = Value::Kind;
  if (level > budget::kJinjaDepth) too_deep();
  const std::string nl = indent < 0 ? "" : "\n" + std::string(static_cast<size_t>(indent) * (level + 1), ' ');
  const std::string close = indent < 0 ? "" : "\n" + std::string(static_cast<size_t>(indent) * level, ' ');
  const std::string sep = indent < 0 ? ", " : ",";
  switch (v.kind) {
    case K::None: return "null";
    case K::Bool: return v.b ? "true" : "false";
    case K::Int: return std::to_string(v.i);
    case K::Float: {
      const std::string f = py_float(v.f);
      return f == "nan" ? "NaN" : f == "inf" ? "Infinity" : f == "-inf" ? "-Infinity" : f;
    }
    case K::Str: return json_str(v.s);
    case K::List: {
      if (v.list->empty()) return "[]";
      std::string out = "[";
      for (size_t k = 0; k < v.list->size(); ++k) append_bounded(out, (k ? sep : "") + nl + json_at((*v.list)[k], indent, level + 1));
      return out + close + "]";
    }
    case K::Dict: {
      if (v.dict->items.empty()) return "{}";
      std::string out = "{";
      for (size_t k = 0; k < v.dict->items.size(); ++k)
        append_bounded(out, (k ? sep : "") + nl + json_str(v.dict->items[k].first) + ": " +
                        json_at(v.dict->items[k].second, indent, level + 1));
      return out + close + "}";
    }
    default: throw std::invalid_argument("Object of type " + type_name(v) + " is not JSON serializable");
  }
}

template <class J>
Value from_json_t(const J& j) {
  if (j.is_null()) return Value::none();
  if (j.is_boolean()) return Value::boolean(j.template get<bool>());
  if (j.is_number_integer()) return Value::integer(j.template get<int64_t>());
  if (j.is_number()) return Value::number(j.template get<double>());
  if (j.is_string()) return Value::str(j.template get<std::string>());
  if (j.is_array()) {
    List l;
    for (const auto& e : j) l.push_back(from_json_t(e));
    return Value::make_list(std::move(l));
  }
  Value d = Value::make_dict();
  for (auto it = j.begin(); it != j.end(); ++it) d.dict->set(it.key(), from_json_t(it.value()));
  return d;
}

std::string str_at(const Value& v, int depth) {
  using K = Value::Kind;
  switch (v.kind) {
    case K::Undefined: return "";
    case K::None: return "None";
    case K::Bool: return v.b ? "True" : "False";
    case K::Int: return std::to_string(v.i);
    case K::Float: return py_float(v.f);
    case K::Str: return v.s;
    case K::List:
    case K::Dict: return join_repr(v, depth);
    case K::Func: return "<function " + v.s + ">";
  }
  return "";
}

bool equals_at(const Value& a, const Value& b, int depth) {
  using K = Value::Kind;
  if (depth > budget::kJinjaDepth) too_deep();
  if (a.is_number() && b.is_number()) {
    if (a.kind == K::Float || b.kind == K::Float) return a.as_double() == b.as_double();
    return (a.kind == K::Bool ? int64_t(a.b) : a.i) == (b.kind == K::Bool ? int64_t(b.b) : b.i);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::Undefined:
    case K::None: return true;
    case K::Str: return a.s == b.s;
    case K::List:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equals_at((*a.list)[k], (*b.list)[k], depth + 1)) return false;
      return true;
    case K::Dict:
      if (a.dict == b.dict) return true;
      if (a.ns || b.ns || a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [key, val] : a.dict->items) {
        const Value* other = b.dict->find(key);
        if (!other || !equals_at(val, *other, depth + 1)) return false;
      }
      return true;
    default: return a.fn == b.fn;
  }
}

bool less_at(const Value& a, const Value& b, int depth) {
  using K = Value::Kind;
  if (depth > budget::kJinjaDepth) too_deep();
  if (a.is_number() && b.is_number()) return a.as_double() < b.as_double();
  if (a.is(K::Str) && b.is(K::Str)) return a.s < b.s;
  if (a.is(K::List) && b.is(K::List)) {
    for (size_t k = 0; k < a.list->size() && k < b.list->size(); ++k) {
      if (less_at((*a.list)[k], (*b.list)[k], depth + 1)) return true;
      if (less_at((*b.list)[k], (*a.list)[k], depth + 1)) return false;
    }
    return a.list->size() < b.list->size();
  }
  throw std::invalid_argument("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

}  // namespace

std::string to_str(const Value& v) { return str_at(v, 0); }
std::string to_repr(const Value& v) { return repr_at(v, 0); }
bool equals(const Value& a, const Value& b) { return equals_at(a, b, 0); }
bool less(const Value& a, const Value& b) { return less_at(a, b, 0); }
std::string to_json(const Value& v, int indent) { return json_at(v, indent, 0); }
Value from_json(const nlohmann::ordered_json& j) { return from_json_t(j); }
Value from_json(const nlohmann::json& j) { return from_json_t(j); }

bool is_py_space(const std::string& cp) {
  const uint32_t c = decode(cp);
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string py_strip(const std::string& s, const std::string& chars, bool left, bool right) {
  const std::vector<std::string> cps = code_points(s), set = code_points(chars);
  auto strip_it = [&](const std::string& cp) {
    return chars.empty() ? is_py_space(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t b = 0, e = cps.size();
  while (left && b < e && strip_it(cps[b])) ++b;
  while (right && e > b && strip_it(cps[e - 1])) --e;
  std::string out;
  for (size_t k = b; k < e; ++k) out += cps[k];
  return out;
}

int escaped_char(char letter) {
  for (const auto& [l, c] : kEscapes)
    if (l == letter) return c;
  return -1;
}

char json_escape_letter(char c) {
  if (c == '"' || c == '\\') return c;
  for (size_t k = 0; k < kJsonEscapes; ++k)
    if (kEscapes[k].second == c) return kEscapes[k].first;
  return 0;
}

}  // namespace tessera::text::jinja
