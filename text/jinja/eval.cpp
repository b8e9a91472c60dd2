// Running a parsed template (jinja_ast.h): scopes, statements and expressions.
#include <cmath>
#include <unordered_map>

#include "text/jinja/ast.h"
#include "text/jinja/builtins.h"
#include "text/jinja/template.h"
#include "util/budgets.h"

namespace tessera::text::jinja {

namespace {

using K = Value::Kind;

// Variables: the render's context at the root; the template's {% set %}s; a scope per for loop
// and per macro call (Jinja2: assignments inside them do not leak out; namespaces do).
struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using ScopeP = std::shared_ptr<Scope>;

struct Out {
  std::string text;
  std::vector<std::pair<size_t, size_t>> spans;
  int generation = 0;
  void emit(const std::string& s) {
    if (s.empty()) return;
    const size_t b = text.size();
    if (b + s.size() > util::budget::kJinjaStringBytes)
      throw BudgetExceeded("rendered more than " + std::to_string(util::budget::kJinjaStringBytes >> 20) + " MiB");
    text += s;
    if (generation == 0) return;
    if (!spans.empty() && spans.back().second == b) spans.back().second = text.size();
    else spans.emplace_back(b, text.size());
  }
};

struct BreakSignal {};
struct ContinueSignal {};

class Interp {
 public:
  explicit Interp(const std::string& origin) : origin_(origin) {}

  void exec(const Body& body, const ScopeP& sc, Out& out);
  Value eval(const Expr& e, const ScopeP& sc);

 private:
  // One level deeper (a statement, an expression, a macro call) for the scope of this object.
  class Nested {
   public:
    Nested(Interp& in, int line) : in_(in) {
      if (++in_.depth_ > util::budget::kJinjaDepth)
        template_error(in_.origin_, line, "nests deeper than " + std::to_string(util::budget::kJinjaDepth) + " levels");
    }
    ~Nested() { --in_.depth_; }
   private:
    Interp& in_;
  };
  // A loop iteration or a macro call.
  void step(int line) {
    if (++steps_ > util::budget::kJinjaSteps)
      template_error(origin_, line, "exceeded " + std::to_string(util::budget::kJinjaSteps) +
                                        " loop iterations and macro calls in one render");
  }
  Where at(int line) const { return Where{origin_, line}; }
  void exec_one(const Stmt& s, const ScopeP& sc, Out& out);
  void exec_stmt(const Stmt& s, const ScopeP& sc, Out& out);
  void exec_for(const Stmt& s, const ScopeP& sc, Out& out);
  void exec_set(const Stmt& s, const ScopeP& sc, Out& out);
  Value make_macro(const Stmt& s, const ScopeP& sc);
  Value eval_binary(const Expr& e, const ScopeP& sc);
  Value arith(const std::string& op, const Value& l, const Value& r, const Where& w);
  bool compare(const std::string& op, const Value& l, const Value& r, const Where& w);
  Args eval_args(const Expr& e, size_t first, const ScopeP& sc);
  Value eval_call(const Expr& e, const ScopeP& sc);
  Value eval_name(const Expr& e, const ScopeP& sc);

  const std::string& origin_;
  int depth_ = 0;
  int64_t steps_ = 0;
};

void Interp::exec(const Body& body, const ScopeP& sc, Out& out) {
  for (const StmtP& s : body) exec_one(*s, sc, out);
}

// A budget the values exceeded (jinja_value.h) is named here, with the statement's line.
void Interp::exec_one(const Stmt& s, const ScopeP& sc, Out& out) {
  const Nested nested(*this, s.line);
  try {
    exec_stmt(s, sc, out);
  } catch (const BudgetExceeded& e) {
    template_error(origin_, s.line, e.what());
  }
}

void Interp::exec_stmt(const Stmt& s, const ScopeP& sc, Out& out) {
  switch (s.k) {
    case Stmt::K::Text: out.emit(s.text); return;
    case Stmt::K::Out: out.emit(to_str(eval(*s.expr, sc))); return;
    case Stmt::K::If:
      for (const auto& [cond, body] : s.branches)
        if (truthy(eval(*cond, sc))) return exec(body, sc, out);
      return exec(s.else_body, sc, out);
    case Stmt::K::For: return exec_for(s, sc, out);
    case Stmt::K::Set:
    case Stmt::K::SetBlock: return exec_set(s, sc, out);
    case Stmt::K::Macro: sc->vars[s.targets[0]] = make_macro(s, sc); return;
    case Stmt::K::Generation:
      ++out.generation;
      exec(s.body, sc, out);
      --out.generation;
      return;
    case Stmt::K::Break: throw BreakSignal();
    case Stmt::K::Continue: throw ContinueSignal();
  }
}

Value loop_object(const List& items, size_t k, const Where& w) {
  Value loop = Value::make_dict();
  const auto n = static_cast<int64_t>(items.size()), i = static_cast<int64_t>(k);
  Dict& d = *loop.dict;
  d.set("index0", Value::integer(i));
  d.set("index", Value::integer(i + 1));
  d.set("revindex", Value::integer(n - i));
  d.set("revindex0", Value::integer(n - i - 1));
  d.set("first", Value::boolean(i == 0));
  d.set("last", Value::boolean(i == n - 1));
  d.set("length", Value::integer(n));
  if (k > 0) d.set("previtem", items[k - 1]);
  if (k + 1 < items.size()) d.set("nextitem", items[k + 1]);
  d.set("depth", Value::integer(1));
  d.set("depth0", Value::integer(0));
  const std::string origin = w.origin;
  d.set("cycle", Value::func("cycle", [i, origin, line = w.line](const Args& a) {
          if (a.pos.empty()) Where{origin, line}.type_error("no items for cycling given");
          return a.pos[static_cast<size_t>(i) % a.pos.size()];
        }));
  return loop;
}

void Interp::exec_for(const Stmt& s, const ScopeP& sc, Out& out) {
  const Where w = at(s.line);
  List items = iterate(eval(*s.expr, sc), w);
  auto inner = std::make_shared<Scope>();
  inner->parent = sc;
  auto bind = [&](const Value& item) {
    if (s.targets.size() == 1) return void(inner->vars[s.targets[0]] = item);
    const List parts = iterate(item, w);
    if (parts.size() != s.targets.size())
      w.type_error("cannot unpack " + std::to_string(parts.size()) + " values into " + std::to_string(s.targets.size()));
    for (size_t k = 0; k < parts.size(); ++k) inner->vars[s.targets[k]] = parts[k];
  };
  if (s.filter) {  // {% for x in xs if cond %}: loop counts only the items that pass
    List kept;
    for (const Value& item : items)
      if (step(s.line), bind(item), truthy(eval(*s.filter, inner))) kept.push_back(item);
    items = std::move(kept);
  }
  for (size_t k = 0; k < items.size(); ++k) {
    step(s.line);
    bind(items[k]);
    inner->vars["loop"] = loop_object(items, k, w);
    try {
      exec(s.body, inner, out);
    } catch (const BreakSignal&) {
      break;
    } catch (const ContinueSignal&) {
    }
  }
  if (items.empty()) exec(s.else_body, inner, out);
}

void Interp::exec_set(const Stmt& s, const ScopeP& sc, Out& out) {
  Value v;
  if (s.k == Stmt::K::SetBlock) {
    Out captured;
    exec(s.body, sc, captured);
    v = Value::str(captured.text);
  } else {
    v = eval(*s.expr, sc);
  }
  if (!s.attr_target) {
    sc->vars[s.targets[0]] = std::move(v);
    return;
  }
  const Value* ns = sc->find(s.targets[0]);
  if (!ns || !ns->is(K::Dict) || !ns->ns)
    at(s.line).type_error("cannot assign attribute on non-namespace object '" + s.targets[0] + "'");
  ns->dict->set(s.targets[1], std::move(v));
  (void)out;
}

Value Interp::make_macro(const Stmt& s, const ScopeP& sc) {
  const Stmt* def = &s;
  std::weak_ptr<Scope> weak = sc;  // the macro lives in sc: a shared_ptr would be a cycle
  return Value::func(s.targets[0], [this, def, weak](const Args& a) {
    step(def->line);
    const Nested nested(*this, def->line);
    ScopeP closure = weak.lock();
    if (!closure) at(def->line).unsupported("call of macro " + def->targets[0] + " outside the scope it was defined in");
    auto local = std::make_shared<Scope>();
    local->parent = closure;
    for (size_t k = 0; k < def->params.size(); ++k) {
      const auto& [name, dflt] = def->params[k];
      Value v = arg(a, k, name.c_str());
      if (v.is(K::Undefined) && dflt) v = eval(*dflt, closure);
      local->vars[name] = v;
    }
    if (a.pos.size() > def->params.size()) at(def->line).unsupported("macro call with extra positional arguments (varargs)");
    Out out;
    exec(def->body, local, out);
    return Value::str(out.text);
  });
}

}  // namespace
}  // namespace tessera::text::jinja

namespace tessera::text::jinja {
namespace {

Value Interp::eval_name(const Expr& e, const ScopeP& sc) {
  if (const Value* v = sc->find(e.name)) return *v;
  return global(e.name, at(e.line));
}

Args Interp::eval_args(const Expr& e, size_t first, const ScopeP& sc) {
  Args a;
  for (size_t k = first; k < e.a.size(); ++k) a.pos.push_back(eval(*e.a[k], sc));
  for (const auto& [key, x] : e.kw) a.kw.emplace_back(key, eval(*x, sc));
  return a;
}

Value Interp::eval_call(const Expr& e, const ScopeP& sc) {
  const Value f = eval(*e.a[0], sc);
  const Where w = at(e.line);
  if (f.is(K::Undefined)) {
    if (e.a[0]->k == Expr::K::Name) w.unsupported("function " + e.a[0]->name + "()");
    w.type_error("'" + f.s + "' is undefined and cannot be called");
  }
  if (!f.is(K::Func)) w.type_error("'" + type_name(f) + "' object is not callable");
  return (*f.fn)(eval_args(e, 1, sc));
}

Value Interp::eval(const Expr& e, const ScopeP& sc) {
  const Nested nested(*this, e.line);
  const Where w = at(e.line);
  switch (e.k) {
    case Expr::K::Lit: return e.lit;
    case Expr::K::Name: return eval_name(e, sc);
    case Expr::K::Attr: return get_attr(eval(*e.a[0], sc), e.name, w);
    case Expr::K::Item: return get_item(eval(*e.a[0], sc), eval(*e.a[1], sc), w);
    case Expr::K::Slice: {
      auto part = [&](size_t k) { return e.a[k] ? eval(*e.a[k], sc) : Value::none(); };
      return get_slice(eval(*e.a[0], sc), part(1), part(2), part(3), w);
    }
    case Expr::K::Call: return eval_call(e, sc);
    case Expr::K::Filter: return apply_filter(e.name, eval(*e.a[0], sc), eval_args(e, 1, sc), w);
    case Expr::K::Test: return Value::boolean(apply_test(e.name, eval(*e.a[0], sc), eval_args(e, 1, sc), w) != e.negate);
    case Expr::K::Unary: {
      const Value v = eval(*e.a[0], sc);
      if (e.name == "not") return Value::boolean(!truthy(v));
      if (v.is(K::Int) || v.is(K::Bool)) return Value::integer(e.name == "-" ? -(v.is(K::Bool) ? v.b : v.i) : (v.is(K::Bool) ? v.b : v.i));
      if (v.is(K::Float)) return Value::number(e.name == "-" ? -v.f : v.f);
      w.type_error("bad operand type for unary " + e.name + ": '" + type_name(v) + "'");
    }
    case Expr::K::Binary: return eval_binary(e, sc);
    case Expr::K::Compare: {
      Value l = eval(*e.a[0], sc);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value r = eval(*e.a[k + 1], sc);
        if (!compare(e.ops[k], l, r, w)) return Value::boolean(false);
        l = std::move(r);
      }
      return Value::boolean(true);
    }
    case Expr::K::Cond:
      if (truthy(eval(*e.a[0], sc))) return eval(*e.a[1], sc);
      return e.a[2] ? eval(*e.a[2], sc) : Value::undefined("inline if");
    case Expr::K::ListLit: {
      List l;
      for (const ExprP& x : e.a) l.push_back(eval(*x, sc));
      return e.lit.tuple ? Value::make_tuple(std::move(l)) : Value::make_list(std::move(l));
    }
    case Expr::K::DictLit: {
      Value d = Value::make_dict();
      for (size_t k = 0; k + 1 < e.a.size(); k += 2) {
        const Value key = eval(*e.a[k], sc);
        if (!key.is(K::Str)) w.unsupported("dict literal with a " + type_name(key) + " key (string keys only)");
        d.dict->set(key.s, eval(*e.a[k + 1], sc));
      }
      return d;
    }
  }
  return Value::undefined();
}

bool Interp::compare(const std::string& op, const Value& l, const Value& r, const Where& w) {
  if (op == "==") return equals(l, r);
  if (op == "!=") return !equals(l, r);
  if (op == "in") return contains(r, l, w);
  if (op == "not in") return !contains(r, l, w);
  try {
    if (op == "<") return less(l, r);
    if (op == ">") return less(r, l);
    if (op == "<=") return !less(r, l);
    return !less(l, r);  // >=
  } catch (const std::invalid_argument& ex) {
    w.type_error(ex.what());
  }
}

Value Interp::eval_binary(const Expr& e, const ScopeP& sc) {
  const Where w = at(e.line);
  const Value l = eval(*e.a[0], sc);
  if (e.name == "and") return truthy(l) ? eval(*e.a[1], sc) : l;
  if (e.name == "or") return truthy(l) ? l : eval(*e.a[1], sc);
  const Value r = eval(*e.a[1], sc);
  if (e.name == "~") return Value::str(to_str(l) + to_str(r));
  return arith(e.name, l, r, w);
}

Value Interp::arith(const std::string& op, const Value& l, const Value& r, const Where& w) {
  auto bad = [&]() {
    w.type_error("unsupported operand type(s) for " + op + ": '" + type_name(l) + "' and '" + type_name(r) + "'");
  };
  if (l.is(K::Undefined) || r.is(K::Undefined)) w.type_error("'" + (l.is(K::Undefined) ? l.s : r.s) + "' is undefined");
  if (op == "+" && l.is(K::Str) && r.is(K::Str)) return Value::str(l.s + r.s);
  if (op == "+" && l.is(K::List) && r.is(K::List)) {
    List out = *l.list;
    out.insert(out.end(), r.list->begin(), r.list->end());
    return Value::make_list(std::move(out));
  }
  if (op == "*" && ((l.is(K::Str) && r.is(K::Int)) || (l.is(K::Int) && r.is(K::Str)))) {
    const Value& s = l.is(K::Str) ? l : r;
    const int64_t n = l.is(K::Int) ? l.i : r.i;
    if (n <= 0 || s.s.empty()) return Value::str("");
    check_string_bytes(static_cast<uint64_t>(n) > util::budget::kJinjaStringBytes / s.s.size() ? util::budget::kJinjaStringBytes + 1
                                                                                               : s.s.size() * static_cast<size_t>(n));
    std::string out;
    for (int64_t k = 0; k < n; ++k) out += s.s;
    return Value::str(out);
  }
  if (!l.is_number() || !r.is_number()) bad();
  const bool ints = !l.is(K::Float) && !r.is(K::Float);
  const int64_t li = l.is(K::Bool) ? l.b : l.i, ri = r.is(K::Bool) ? r.b : r.i;
  const double lf = l.as_double(), rf = r.as_double();
  if (op == "+") return ints ? Value::integer(li + ri) : Value::number(lf + rf);
  if (op == "-") return ints ? Value::integer(li - ri) : Value::number(lf - rf);
  if (op == "*") return ints ? Value::integer(li * ri) : Value::number(lf * rf);
  if (op == "**") return ints && ri >= 0 ? Value::integer(static_cast<int64_t>(std::llround(std::pow(lf, rf)))) : Value::number(std::pow(lf, rf));
  if (rf == 0) w.type_error(op == "/" ? "division by zero" : "integer division or modulo by zero");
  if (op == "/") return Value::number(lf / rf);
  if (op == "//" && ints) return Value::integer(li / ri - ((li % ri != 0 && (li < 0) != (ri < 0)) ? 1 : 0));
  if (op == "//") return Value::number(std::floor(lf / rf));
  if (ints) {  // Python's modulo takes the divisor's sign
    const int64_t m = li % ri;
    return Value::integer(m != 0 && ((m < 0) != (ri < 0)) ? m + ri : m);
  }
  const double m = std::fmod(lf, rf);
  return Value::number(m != 0 && ((m < 0) != (rf < 0)) ? m + rf : m);
}

}  // namespace

Template::Template(const std::string& source, std::string origin)
    : parsed_(std::make_shared<Parsed>(parse_template(source, origin))), origin_(std::move(origin)) {}

bool Template::has_generation() const { return parsed_->has_generation; }

Rendered Template::render(const Context& context) const {
  auto root = std::make_shared<Scope>();
  for (const auto& [k, v] : context) root->vars[k] = v;
  auto top = std::make_shared<Scope>();
  top->parent = root;
  Out out;
  Interp interp(origin_);
  RenderBudget budget;
  const RenderBudget::Scope charged(budget);
  try {
    interp.exec(parsed_->body, top, out);
  } catch (const BreakSignal&) {
  } catch (const ContinueSignal&) {
  }
  return {std::move(out.text), std::move(out.spans)};
}

}  // namespace tessera::text::jinja
