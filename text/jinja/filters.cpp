// The filters of the Jinja renderer, as Jinja2 3.1 defines them, with transformers' `tojson`.
#include <cmath>
#include <map>
#include <stdexcept>
#include <algorithm>

#include "text/jinja/builtins.h"
#include "text/jinja/strings.h"

namespace tessera::text::jinja {

namespace {

using K = Value::Kind;
using FilterFn = Value (*)(const Value&, const Args&, const Where&);

bool flag(const Args& a, size_t pos, const char* key) { return truthy(arg(a, pos, key, Value::boolean(false))); }

// Jinja's make_attrgetter: "a.b" looks up a, then b, as items first.
Value attr_path(const Value& v, const Value& path, const Where& w) {
  if (path.is(K::Int)) return get_item(v, path, w);
  Value cur = v;
  const List parts = py_split(to_str(path), Value::str("."), -1);
  for (const Value& p : parts) {
    if (cur.is(K::Undefined)) return cur;
    const bool index = !p.s.empty() && p.s.size() < 19 && p.s.find_first_not_of("0123456789") == std::string::npos;
    cur = get_item(cur, index ? Value::integer(std::stoll(p.s)) : p, w);
  }
  return cur;
}

Value tojson(const Value& v, const Args& a, const Where& w) {
  const Value indent = arg(a, 0, "indent", Value::none());
  if (!indent.is(K::None) && !indent.is(K::Int)) w.unsupported("tojson indent that is not an integer");
  try {
    return Value::str(to_json(v, indent.is(K::Int) ? static_cast<int>(indent.i) : -1));
  } catch (const std::invalid_argument& e) {
    w.type_error(e.what());
  }
}

Value indent_filter(const Value& v, const Args& a, const Where&) {
  const Value width = arg(a, 0, "width", Value::integer(4));
  const size_t spaces = static_cast<size_t>(std::max<int64_t>(0, width.i));
  check_string_bytes(width.is(K::Str) ? 0 : spaces);
  const std::string ind = width.is(K::Str) ? width.s : std::string(spaces, ' ');
  const bool first = flag(a, 1, "first"), blank = flag(a, 2, "blank");
  std::vector<std::string> lines;
  const std::string s = to_str(v) + "\n";
  for (size_t b = 0, e; (e = s.find('\n', b)) != std::string::npos; b = e + 1) lines.push_back(s.substr(b, e - b));
  std::string rv = lines[0];
  for (size_t k = 1; k < lines.size(); ++k) append_bounded(rv, "\n" + (blank || !lines[k].empty() ? ind + lines[k] : lines[k]));
  return Value::str(first ? ind + rv : rv);
}

Value int_filter(const Value& v, const Args& a, const Where&) {
  const Value def = arg(a, 0, "default", Value::integer(0));
  if (v.is(K::Int)) return v;
  if (v.is(K::Bool)) return Value::integer(v.b);
  if (v.is(K::Float)) return std::isfinite(v.f) ? Value::integer(static_cast<int64_t>(std::trunc(v.f))) : def;
  if (!v.is(K::Str)) return def;
  const std::string s = py_strip(v.s, "", true, true);
  try {
    size_t used = 0;
    const long long i = std::stoll(s, &used, 10);
    if (used == s.size()) return Value::integer(i);
    const double d = std::stod(s, &used);
    if (used == s.size() && std::isfinite(d)) return Value::integer(static_cast<int64_t>(std::trunc(d)));
  } catch (const std::exception&) {
  }
  return def;
}

Value float_filter(const Value& v, const Args& a, const Where&) {
  const Value def = arg(a, 0, "default", Value::number(0.0));
  if (v.is_number()) return Value::number(v.as_double());
  if (!v.is(K::Str)) return def;
  const std::string s = py_strip(v.s, "", true, true);
  try {
    size_t used = 0;
    const double d = std::stod(s, &used);
    if (used == s.size()) return Value::number(d);
  } catch (const std::exception&) {
  }
  return def;
}

// select / reject / selectattr / rejectattr.
Value select(const Value& v, const Args& a, const Where& w, bool attr, bool keep) {
  Args test_args;
  const size_t first = attr ? 1 : 0;
  for (size_t k = first + 1; k < a.pos.size(); ++k) test_args.pos.push_back(a.pos[k]);
  const Value test = arg(a, first, "test");
  List out;
  for (const Value& item : iterate(v, w)) {
    const Value x = attr ? attr_path(item, arg(a, 0, "attribute"), w) : item;
    const bool pass = test.is(K::Undefined) ? truthy(x) : apply_test(to_str(test), x, test_args, w);
    if (pass == keep) out.push_back(item);
  }
  return Value::make_list(std::move(out));
}

Value map_filter(const Value& v, const Args& a, const Where& w) {
  List out;
  const Value attribute = arg(Args{{}, a.kw}, 99, "attribute");
  if (!attribute.is(K::Undefined)) {
    const Value def = arg(Args{{}, a.kw}, 99, "default");
    for (const Value& item : iterate(v, w)) {
      const Value x = attr_path(item, attribute, w);
      out.push_back(x.is(K::Undefined) && !def.is(K::Undefined) ? def : x);
    }
    return Value::make_list(std::move(out));
  }
  if (a.pos.empty()) w.type_error("map requires a filter argument");
  Args rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (const Value& item : iterate(v, w)) out.push_back(apply_filter(to_str(a.pos[0]), item, rest, w));
  return Value::make_list(std::move(out));
}

Value join_filter(const Value& v, const Args& a, const Where& w) {
  const std::string sep = to_str(arg(a, 0, "d", Value::str("")));
  const Value attribute = arg(a, 1, "attribute", Value::none());
  std::string out;
  const List items = iterate(v, w);
  for (size_t k = 0; k < items.size(); ++k)
    append_bounded(out, (k ? sep : "") + to_str(attribute.is(K::None) ? items[k] : attr_path(items[k], attribute, w)));
  return Value::str(out);
}

Value items_filter(const Value& v, const Args&, const Where& w) {
  if (v.is(K::Undefined)) return Value::make_list();
  if (!v.is(K::Dict)) w.type_error("can only get item pairs from a mapping.");
  List out;
  for (const auto& [k, x] : v.dict->items) out.push_back(Value::make_tuple({Value::str(k), x}));
  return Value::make_list(std::move(out));
}

Value first_last(const Value& v, const Where& w, bool first) {
  const List items = iterate(v, w);
  if (items.empty()) return Value::undefined(first ? "first item" : "last item");
  return first ? items.front() : items.back();
}

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> f = {
      {"trim", [](const Value& v, const Args& a, const Where&) {
         const Value chars = arg(a, 0, "chars", Value::none());
         return Value::str(py_strip(to_str(v), chars.is(K::Str) ? chars.s : "", true, true));
       }},
      {"tojson", tojson},
      {"length", [](const Value& v, const Args&, const Where& w) { return Value::integer(length(v, w)); }},
      {"count", [](const Value& v, const Args&, const Where& w) { return Value::integer(length(v, w)); }},
      {"upper", [](const Value& v, const Args&, const Where&) { return Value::str(ascii_upper(to_str(v))); }},
      {"lower", [](const Value& v, const Args&, const Where&) { return Value::str(ascii_lower(to_str(v))); }},
      {"title", [](const Value& v, const Args&, const Where&) { return Value::str(jinja_title(to_str(v))); }},
      {"capitalize", [](const Value& v, const Args&, const Where&) { return Value::str(py_capitalize(to_str(v))); }},
      {"first", [](const Value& v, const Args&, const Where& w) { return first_last(v, w, true); }},
      {"last", [](const Value& v, const Args&, const Where& w) { return first_last(v, w, false); }},
      {"join", join_filter},
      {"default", [](const Value& v, const Args& a, const Where&) {
         const bool use = v.is(K::Undefined) || (flag(a, 1, "boolean") && !truthy(v));
         return use ? arg(a, 0, "default_value", Value::str("")) : v;
       }},
      {"list", [](const Value& v, const Args&, const Where& w) { return Value::make_list(iterate(v, w)); }},
      {"string", [](const Value& v, const Args&, const Where&) { return Value::str(to_str(v)); }},
      {"int", int_filter},
      {"float", float_filter},
      {"replace", [](const Value& v, const Args& a, const Where&) {
         const Value count = arg(a, 2, "count", Value::none());
         return Value::str(py_replace(to_str(v), to_str(arg(a, 0, "old")), to_str(arg(a, 1, "new")), count.is(K::Int) ? count.i : -1));
       }},
      {"indent", indent_filter},
      {"items", items_filter},
      {"selectattr", [](const Value& v, const Args& a, const Where& w) { return select(v, a, w, true, true); }},
      {"rejectattr", [](const Value& v, const Args& a, const Where& w) { return select(v, a, w, true, false); }},
      {"select", [](const Value& v, const Args& a, const Where& w) { return select(v, a, w, false, true); }},
      {"reject", [](const Value& v, const Args& a, const Where& w) { return select(v, a, w, false, false); }},
      {"map", map_filter},
      {"safe", [](const Value& v, const Args&, const Where&) { return Value::str(to_str(v)); }},
      {"abs", [](const Value& v, const Args&, const Where& w) {
         if (v.is(K::Int)) return Value::integer(v.i < 0 ? -v.i : v.i);
         if (v.is(K::Float)) return Value::number(std::fabs(v.f));
         w.type_error("bad operand type for abs(): '" + type_name(v) + "'");
       }},
      {"reverse", [](const Value& v, const Args&, const Where& w) {
         if (v.is(K::Str)) return Value::str(to_str(get_slice(v, Value::none(), Value::none(), Value::integer(-1), w)));
         List l = iterate(v, w);
         std::reverse(l.begin(), l.end());
         return Value::make_list(std::move(l));
       }},
  };
  return f;
}

}  // namespace

bool is_filter(const std::string& name) { return name == "d" || filters().count(name) > 0; }

Value apply_filter(const std::string& name, const Value& v, const Args& args, const Where& w) {
  auto it = filters().find(name == "d" ? "default" : name);
  if (it == filters().end()) w.unsupported("filter '" + name + "'");
  return it->second(v, args, w);
}

}  // namespace tessera::text::jinja
