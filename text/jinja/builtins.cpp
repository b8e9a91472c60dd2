// Lookup, iteration, tests, methods and globals of the Jinja renderer (filters: jinja_filters.cpp).
#include "text/jinja/builtins.h"

#include <algorithm>
#include <cctype>
#include <ctime>
#include <map>
#include <optional>

#include "text/jinja/ast.h"
#include "text/jinja/strings.h"
#include "text/jinja/template.h"

namespace tessera::text::jinja {

using K = Value::Kind;

void Where::type_error(const std::string& what) const {
  throw TemplateError(what + " (chat template " + origin + " line " + std::to_string(line) + ")");
}
void Where::unsupported(const std::string& what) const { template_error(origin, line, "unsupported " + what); }

Value arg(const Args& a, size_t pos, const char* key, const Value& def) {
  if (pos < a.pos.size()) return a.pos[pos];
  for (const auto& [k, v] : a.kw)
    if (k == key) return v;
  return def;
}

List iterate(const Value& v, const Where& w) {
  switch (v.kind) {
    case K::Undefined: return {};
    case K::List: return *v.list;
    case K::Str: {
      List out;
      for (size_t i = 0, n; i < v.s.size(); i += n) {  // by code point, as code_points() cuts them
        const unsigned char c = v.s[i];
        n = std::min<size_t>(c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4, v.s.size() - i);
        out.push_back(Value::str(v.s.substr(i, n)));
      }
      return out;
    }
    case K::Dict: {
      List out;
      for (const auto& kv : v.dict->items) out.push_back(Value::str(kv.first));
      return out;
    }
    default: w.type_error("'" + type_name(v) + "' object is not iterable");
  }
}

int64_t length(const Value& v, const Where& w) {
  switch (v.kind) {
    case K::Undefined: return 0;
    case K::List: return static_cast<int64_t>(v.list->size());
    case K::Str: return static_cast<int64_t>(code_point_count(v.s));
    case K::Dict: return static_cast<int64_t>(v.dict->items.size());
    default: w.type_error("object of type '" + type_name(v) + "' has no len()");
  }
}

namespace {

// Python's index normalisation for obj[i] (nullopt: out of range).
std::optional<size_t> py_index(int64_t i, size_t n) {
  if (i < 0) i += static_cast<int64_t>(n);
  if (i < 0 || i >= static_cast<int64_t>(n)) return std::nullopt;
  return static_cast<size_t>(i);
}

Value bound(const std::string& name, Function f) { return Value::func(name, std::move(f)); }

Value dict_method(const Value& obj, const std::string& name) {
  auto d = obj.dict;
  if (name == "items")
    return bound(name, [d](const Args&) {
      List out;
      for (const auto& [k, v] : d->items) out.push_back(Value::make_tuple({Value::str(k), v}));
      return Value::make_list(std::move(out));
    });
  if (name == "keys")
    return bound(name, [d](const Args&) {
      List out;
      for (const auto& kv : d->items) out.push_back(Value::str(kv.first));
      return Value::make_list(std::move(out));
    });
  if (name == "values")
    return bound(name, [d](const Args&) {
      List out;
      for (const auto& kv : d->items) out.push_back(kv.second);
      return Value::make_list(std::move(out));
    });
  if (name == "get")
    return bound(name, [d](const Args& a) {
      const Value key = arg(a, 0, "key");
      const Value* v = key.is(K::Str) ? d->find(key.s) : nullptr;
      return v ? *v : arg(a, 1, "default", Value::none());
    });
  return Value::undefined(name);
}

bool is_dict_method(const std::string& n) {
  static const char* names[] = {"items", "keys", "values", "get", "copy", "update", "pop", "popitem", "setdefault", "clear", "fromkeys"};
  return std::find_if(std::begin(names), std::end(names), [&](const char* m) { return n == m; }) != std::end(names);
}

bool is_list_method(const std::string& n) {
  static const char* names[] = {"append", "extend", "insert", "remove", "pop", "clear", "index", "count", "sort", "reverse", "copy"};
  return std::find_if(std::begin(names), std::end(names), [&](const char* m) { return n == m; }) != std::end(names);
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name, const Where& w) {
  if (obj.is(K::Undefined)) w.type_error("'" + obj.s + "' is undefined");
  if (name.rfind("_", 0) == 0) w.unsupported("attribute '" + name + "' (the sandbox refuses it)");
  if (obj.is(K::Str)) return str_method(obj, name, w);
  if (obj.is(K::Dict) && !obj.ns && is_dict_method(name)) {
    const Value m = dict_method(obj, name);
    if (m.is(K::Undefined)) w.unsupported("dict method ." + name + "() (the immutable sandbox refuses it)");
    return m;
  }
  if (obj.is(K::Dict)) {
    const Value* v = obj.dict->find(name);
    return v ? *v : Value::undefined(name);
  }
  if (obj.is(K::List) && is_list_method(name)) w.unsupported("list method ." + name + "()");
  return Value::undefined(name);
}

Value get_item(const Value& obj, const Value& key, const Where& w) {
  if (obj.is(K::Undefined)) w.type_error("'" + obj.s + "' is undefined");
  if (obj.is(K::Dict) && key.is(K::Str)) {
    if (const Value* v = obj.dict->find(key.s)) return *v;
    return get_attr(obj, key.s, w);
  }
  if ((obj.is(K::List) || obj.is(K::Str)) && (key.is(K::Int) || key.is(K::Bool))) {
    const int64_t i = key.is(K::Bool) ? key.b : key.i;
    if (obj.is(K::List)) {
      const auto k = py_index(i, obj.list->size());
      return k ? (*obj.list)[*k] : Value::undefined("[" + std::to_string(i) + "]");
    }
    const auto cps = code_points(obj.s);
    const auto k = py_index(i, cps.size());
    return k ? Value::str(cps[*k]) : Value::undefined("[" + std::to_string(i) + "]");
  }
  if (key.is(K::Str)) return get_attr(obj, key.s, w);
  return Value::undefined(to_str(key));
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step, const Where& w) {
  if (!obj.is(K::List) && !obj.is(K::Str)) w.type_error("'" + type_name(obj) + "' object is not subscriptable");
  auto as_int = [&](const Value& v, int64_t def) {
    if (v.is(K::Undefined) || v.is(K::None)) return def;
    if (!v.is(K::Int)) w.type_error("slice indices must be integers or None");
    return v.i;
  };
  const std::vector<std::string> cps = obj.is(K::Str) ? code_points(obj.s) : std::vector<std::string>();
  const int64_t n = obj.is(K::Str) ? static_cast<int64_t>(cps.size()) : static_cast<int64_t>(obj.list->size());
  const int64_t st = as_int(step, 1);
  if (st == 0) w.type_error("slice step cannot be zero");
  auto clamp = [&](int64_t i) {
    if (i < 0) i += n;
    return st > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = start.is(K::Undefined) || start.is(K::None) ? (st > 0 ? 0 : n - 1) : clamp(as_int(start, 0));
  const int64_t e = stop.is(K::Undefined) || stop.is(K::None) ? (st > 0 ? n : -1) : clamp(as_int(stop, 0));
  std::string s;
  List l;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) {
    if (obj.is(K::Str)) s += cps[static_cast<size_t>(i)];
    else l.push_back((*obj.list)[static_cast<size_t>(i)]);
  }
  return obj.is(K::Str) ? Value::str(s) : Value::make_list(std::move(l));
}

// ---- tests ----

namespace {

using TestFn = bool (*)(const Value&, const Args&, const Where&);

bool compare_test(const std::string& op, const Value& v, const Args& a, const Where& w) {
  const Value other = arg(a, 0, "other");
  try {
    if (op == "eq") return equals(v, other);
    if (op == "ne") return !equals(v, other);
    if (op == "lt") return less(v, other);
    if (op == "gt") return less(other, v);
    if (op == "le") return !less(other, v);
    return !less(v, other);
  } catch (const std::invalid_argument& e) {
    w.type_error(e.what());
  }
}

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> t = {
      {"defined", [](const Value& v, const Args&, const Where&) { return !v.is(K::Undefined); }},
      {"undefined", [](const Value& v, const Args&, const Where&) { return v.is(K::Undefined); }},
      {"none", [](const Value& v, const Args&, const Where&) { return v.is(K::None); }},
      {"boolean", [](const Value& v, const Args&, const Where&) { return v.is(K::Bool); }},
      {"true", [](const Value& v, const Args&, const Where&) { return v.is(K::Bool) && v.b; }},
      {"false", [](const Value& v, const Args&, const Where&) { return v.is(K::Bool) && !v.b; }},
      {"integer", [](const Value& v, const Args&, const Where&) { return v.is(K::Int); }},
      {"float", [](const Value& v, const Args&, const Where&) { return v.is(K::Float); }},
      {"number", [](const Value& v, const Args&, const Where&) { return v.is_number(); }},
      {"string", [](const Value& v, const Args&, const Where&) { return v.is(K::Str); }},
      {"mapping", [](const Value& v, const Args&, const Where&) { return v.is(K::Dict) && !v.ns; }},
      {"callable", [](const Value& v, const Args&, const Where&) { return v.is(K::Func); }},
      {"iterable", [](const Value& v, const Args&, const Where&) {
         return v.is(K::Undefined) || v.is(K::Str) || v.is(K::List) || (v.is(K::Dict) && !v.ns);
       }},
      {"sequence", [](const Value& v, const Args&, const Where&) {
         return v.is(K::Undefined) || v.is(K::Str) || v.is(K::List) || (v.is(K::Dict) && !v.ns);
       }},
      {"odd", [](const Value& v, const Args&, const Where& w) { return v.is(K::Int) ? (v.i % 2 != 0) : (w.type_error("odd of a non-integer"), false); }},
      {"even", [](const Value& v, const Args&, const Where& w) { return v.is(K::Int) ? (v.i % 2 == 0) : (w.type_error("even of a non-integer"), false); }},
      {"divisibleby", [](const Value& v, const Args& a, const Where& w) {
         const Value n = arg(a, 0, "num");
         if (!v.is(K::Int) || !n.is(K::Int) || n.i == 0) w.type_error("divisibleby needs non-zero integers");
         return v.i % n.i == 0;
       }},
      {"lower", [](const Value& v, const Args&, const Where&) { return v.is(K::Str) && ascii_lower(v.s) == v.s && ascii_upper(v.s) != v.s; }},
      {"upper", [](const Value& v, const Args&, const Where&) { return v.is(K::Str) && ascii_upper(v.s) == v.s && ascii_lower(v.s) != v.s; }},
      {"in", [](const Value& v, const Args& a, const Where& w) { return contains(arg(a, 0, "seq"), v, w); }},
      {"sameas", [](const Value& v, const Args& a, const Where&) {
         const Value o = arg(a, 0, "other");
         return v.kind == o.kind && (v.is(K::None) || v.is(K::Bool) ? equals(v, o) : v.list == o.list && v.dict == o.dict && equals(v, o));
       }},
      {"eq", [](const Value& v, const Args& a, const Where& w) { return compare_test("eq", v, a, w); }},
      {"ne", [](const Value& v, const Args& a, const Where& w) { return compare_test("ne", v, a, w); }},
      {"lt", [](const Value& v, const Args& a, const Where& w) { return compare_test("lt", v, a, w); }},
      {"le", [](const Value& v, const Args& a, const Where& w) { return compare_test("le", v, a, w); }},
      {"gt", [](const Value& v, const Args& a, const Where& w) { return compare_test("gt", v, a, w); }},
      {"ge", [](const Value& v, const Args& a, const Where& w) { return compare_test("ge", v, a, w); }},
  };
  return t;
}

std::string test_alias(const std::string& name) {
  static const std::map<std::string, std::string> alias = {{"equalto", "eq"}, {"==", "eq"}, {"!=", "ne"}, {"<", "lt"},
                                                            {"<=", "le"}, {">", "gt"}, {">=", "ge"}, {"greaterthan", "gt"},
                                                            {"lessthan", "lt"}};
  auto it = alias.find(name);
  return it == alias.end() ? name : it->second;
}

}  // namespace

bool is_test(const std::string& name) { return tests().count(test_alias(name)) > 0; }

bool apply_test(const std::string& name, const Value& v, const Args& args, const Where& w) {
  auto it = tests().find(test_alias(name));
  if (it == tests().end()) w.unsupported("test '" + name + "'");
  return it->second(v, args, w);
}

bool contains(const Value& container, const Value& item, const Where& w) {
  switch (container.kind) {
    case K::Str:
      if (!item.is(K::Str)) w.type_error("'in <string>' requires string as left operand, not " + type_name(item));
      return container.s.find(item.s) != std::string::npos;
    case K::List:
      return std::any_of(container.list->begin(), container.list->end(), [&](const Value& e) { return equals(e, item); });
    case K::Dict: return item.is(K::Str) && container.dict->find(item.s) != nullptr;
    case K::Undefined: return false;
    default: w.type_error("argument of type '" + type_name(container) + "' is not iterable");
  }
}

// ---- globals ----

namespace {

Value range_fn(const Args& a, const Where& w) {
  std::vector<int64_t> n;
  for (const Value& v : a.pos) {
    if (!v.is(K::Int)) w.type_error("range() takes integers, not '" + type_name(v) + "'");
    n.push_back(v.i);
  }
  if (n.empty() || n.size() > 3) w.type_error("range expected 1 to 3 arguments");
  const int64_t start = n.size() == 1 ? 0 : n[0], stop = n.size() == 1 ? n[0] : n[1], step = n.size() == 3 ? n[2] : 1;
  if (step == 0) w.type_error("range() arg 3 must not be zero");
  List out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (out.size() >= 100000) w.type_error("range too big (the sandbox's limit is 100000)");
    out.push_back(Value::integer(i));
  }
  return Value::make_list(std::move(out));
}

Value dict_of(const Args& a, const Where& w, bool ns) {
  Value d = Value::make_dict();
  d.ns = ns;
  if (RenderBudget* b = RenderBudget::current(); b && ns) b->spaces.push_back(d.dict);
  for (const Value& p : a.pos) {
    if (!p.is(K::Dict)) w.type_error("namespace()/dict() take a mapping and keyword arguments");
    for (const auto& [k, v] : p.dict->items) d.dict->set(k, v);
  }
  for (const auto& [k, v] : a.kw) d.dict->set(k, v);
  return d;
}

Value strftime_now(const Args& a, const Where& w) {
  const Value fmt = arg(a, 0, "format");
  if (!fmt.is(K::Str)) w.type_error("strftime_now() takes a format string");
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[512];
  const size_t n = std::strftime(buf, sizeof buf, fmt.s.c_str(), &tm);
  return Value::str(std::string(buf, n));
}

}  // namespace

Value global(const std::string& name, const Where& w) {
  const std::string origin = w.origin;
  const int line = w.line;
  auto make = [&](Value (*f)(const Args&, const Where&)) {
    return Value::func(name, [f, origin, line](const Args& a) { return f(a, Where{origin, line}); });
  };
  if (name == "range") return make(range_fn);
  if (name == "namespace") return make([](const Args& a, const Where& w2) { return dict_of(a, w2, true); });
  if (name == "dict") return make([](const Args& a, const Where& w2) { return dict_of(a, w2, false); });
  if (name == "strftime_now") return make(strftime_now);
  if (name == "raise_exception")
    return make([](const Args& a, const Where&) -> Value { throw TemplateError(to_str(arg(a, 0, "message"))); });
  if (name == "lipsum" || name == "cycler" || name == "joiner") w.unsupported("function " + name + "()");
  return Value::undefined(name);
}

}  // namespace tessera::text::jinja
