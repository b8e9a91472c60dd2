// Jinja source -> jinja_ast.h, with the lexing of Jinja2's Environment(trim_blocks=True,
// lstrip_blocks=True): newlines normalised to "\n", one trailing newline dropped; a block or
// comment tag eats the newline after it and the spaces/tabs before it on its line; "-" beside a
// delimiter strips all whitespace on that side, "+" keeps it.
#include <algorithm>
#include <cctype>

#include "text/jinja/ast.h"
#include "text/jinja/builtins.h"
#include "util/budgets.h"
#include "util/error.h"

namespace tessera::text::jinja {

void template_error(const std::string& origin, int line, const std::string& what) {
  throw TESSERA_INPUT_ERROR("chat template " + origin + " line " + std::to_string(line) + ": " + what);
}

namespace {

// The nesting of the template's syntax, counted as it is parsed (a block inside a block, an
// expression inside an expression, each link of a chain such as a.b.c or 1+1+1, which nests in the
// tree it makes): a level deeper for each deeper() of a Nest, back where it was when the Nest ends.
// Recursive descent then stays within kJinjaDepth levels, and so does the tree it makes.
class Nest {
 public:
  Nest(int& depth, const std::string& origin, int line) : depth_(depth), saved_(depth), origin_(origin), line_(line) {}
  ~Nest() { depth_ = saved_; }
  void deeper() {
    if (++depth_ > util::budget::kJinjaDepth)
      template_error(origin_, line_, "nests deeper than " + std::to_string(util::budget::kJinjaDepth) + " levels");
  }

 private:
  int& depth_;
  const int saved_;
  const std::string& origin_;
  const int line_;
};

struct Chunk {
  enum Kind { Text, Var, Block } kind;
  std::string body;
  int line;
};

bool all_blank(const std::string& s, size_t from) {
  for (size_t k = from; k < s.size(); ++k)
    if (s[k] != ' ' && s[k] != '\t') return false;
  return true;
}

std::string normalise(const std::string& raw) {
  std::string s;
  for (size_t k = 0; k < raw.size(); ++k) {
    if (raw[k] == '\r') {
      s += '\n';
      if (k + 1 < raw.size() && raw[k + 1] == '\n') ++k;
    } else {
      s += raw[k];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();  // keep_trailing_newline=False
  return s;
}

// The end of a tag body that starts at `from`: the index of the closing delimiter, skipping string
// literals and (for "}}") nested braces; npos when unterminated.
size_t tag_end(const std::string& s, size_t from, char type) {
  if (type == '#') return s.find("#}", from);
  const char close = type == '{' ? '}' : '%';
  int depth = 0;
  for (size_t k = from; k + 1 < s.size(); ++k) {
    const char c = s[k];
    if (c == '\'' || c == '"') {
      for (++k; k < s.size() && s[k] != c; ++k)
        if (s[k] == '\\') ++k;
      continue;
    }
    if (depth == 0 && c == close && s[k + 1] == '}') return k;
    if (c == '(' || c == '[' || c == '{') ++depth;
    else if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
  }
  return std::string::npos;
}

// Applies the whitespace rules of the tag opening at `open` to the text before it.
void strip_before(std::string& text, char type, char mod, bool line_starting) {
  if (mod == '-') {
    const size_t e = text.find_last_not_of(" \t\n\r\f\v");
    text.erase(e == std::string::npos ? 0 : e + 1);
  } else if (type != '{' && mod != '+') {  // lstrip_blocks
    const size_t l = text.rfind('\n') + 1;   // npos + 1 == 0
    if ((l > 0 || line_starting) && all_blank(text, l)) text.erase(l);
  }
}

std::vector<Chunk> scan(const std::string& src, const std::string& origin) {
  std::vector<Chunk> out;
  size_t pos = 0;
  int line = 1;
  while (true) {
    size_t open = pos;
    while ((open = src.find('{', open)) != std::string::npos && open + 1 < src.size() &&
           src[open + 1] != '{' && src[open + 1] != '%' && src[open + 1] != '#')
      ++open;
    if (open + 1 >= src.size()) open = std::string::npos;
    std::string text = src.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    const bool line_starting = pos == 0 || src[pos - 1] == '\n';
    if (open == std::string::npos) {
      if (!text.empty()) out.push_back({Chunk::Text, text, line});
      return out;
    }
    const char type = src[open + 1], mod = open + 2 < src.size() ? src[open + 2] : ' ';
    strip_before(text, type, mod, line_starting);
    if (!text.empty()) out.push_back({Chunk::Text, text, line});
    for (size_t k = pos; k < open; ++k) line += src[k] == '\n';
    const size_t body = open + 2 + (mod == '-' || mod == '+' ? 1 : 0);
    const size_t end = tag_end(src, body, type);
    if (end == std::string::npos)
      template_error(origin, line, std::string("unterminated ") + (type == '{' ? "{{" : type == '%' ? "{%" : "{#"));
    const char before = end > body ? src[end - 1] : ' ';
    const size_t body_end = before == '-' || before == '+' ? end - 1 : end;
    if (type != '#') out.push_back({type == '{' ? Chunk::Var : Chunk::Block, src.substr(body, body_end - body), line});
    for (size_t k = open; k < end; ++k) line += src[k] == '\n';
    pos = end + 2;
    if (before == '-') {
      while (pos < src.size() && std::isspace(static_cast<unsigned char>(src[pos]))) line += src[pos++] == '\n';
    } else if (type != '{' && before != '+' && pos < src.size() && src[pos] == '\n') {  // trim_blocks
      ++pos, ++line;
    }
  }
}

// ---- expression tokens ----

struct Tok {
  enum T { Name, Int, Float, Str, Op, End } t;
  std::string s;
  int64_t i = 0;
  double f = 0;
};

std::string unescape(const std::string& body) {
  std::string out;
  for (size_t k = 0; k < body.size(); ++k) {
    if (body[k] != '\\' || k + 1 >= body.size()) {
      out += body[k];
      continue;
    }
    const char c = body[++k];
    if (const int e = escaped_char(c); e >= 0) {
      out += static_cast<char>(e);
      continue;
    }
    switch (c) {
      case '\\': case '\'': case '"': out += c; break;
      case '\n': break;
      case 'x': case 'u': case 'U': {
        const size_t n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        const uint32_t cp = static_cast<uint32_t>(std::stoul(body.substr(k + 1, n), nullptr, 16));
        k += n;
        if (cp < 0x80) out += static_cast<char>(cp);
        else if (cp < 0x800) out += {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
        else if (cp < 0x10000)
          out += {static_cast<char>(0xE0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
                  static_cast<char>(0x80 | (cp & 0x3F))};
        else
          out += {static_cast<char>(0xF0 | (cp >> 18)), static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
                  static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
        break;
      }
      default: out += '\\', out += c;
    }
  }
  return out;
}

Tok number_token(const std::string& s, size_t& k) {
  const size_t b = k;
  while (k < s.size() && (std::isdigit(static_cast<unsigned char>(s[k])) || s[k] == '_')) ++k;
  bool is_float = false;
  if (k + 1 < s.size() && s[k] == '.' && std::isdigit(static_cast<unsigned char>(s[k + 1]))) {
    is_float = true;
    for (++k; k < s.size() && std::isdigit(static_cast<unsigned char>(s[k])); ++k) {}
  }
  if (k < s.size() && (s[k] == 'e' || s[k] == 'E')) {
    is_float = true;
    if (++k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
    while (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) ++k;
  }
  std::string text = s.substr(b, k - b);
  text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
  Tok t{is_float ? Tok::Float : Tok::Int, text};
  if (is_float) t.f = std::stod(text);
  else t.i = std::stoll(text);
  return t;
}

std::vector<Tok> tokenize(const std::string& s, const std::string& origin, int line) {
  static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "(", ")", "[",
                              "]",  "{",  "}",  ",",  ".",  ":",  "|",  "=",  "<",  ">"};
  std::vector<Tok> out;
  for (size_t k = 0; k < s.size();) {
    const unsigned char c = s[k];
    if (std::isspace(c)) {
      ++k;
    } else if (std::isalpha(c) || c == '_') {
      const size_t b = k;
      while (k < s.size() && (std::isalnum(static_cast<unsigned char>(s[k])) || s[k] == '_')) ++k;
      out.push_back({Tok::Name, s.substr(b, k - b)});
    } else if (std::isdigit(c)) {
      try {
        out.push_back(number_token(s, k));
      } catch (const std::logic_error&) {  // std::stoll / std::stod: out of range
        template_error(origin, line, "number literal out of range");
      }
    } else if (c == '\'' || c == '"') {
      size_t e = k + 1;
      for (; e < s.size() && s[e] != static_cast<char>(c); ++e)
        if (s[e] == '\\') ++e;
      if (e >= s.size()) template_error(origin, line, "unterminated string literal");
      try {
        out.push_back({Tok::Str, unescape(s.substr(k + 1, e - k - 1))});
      } catch (const std::logic_error&) {  // std::stoul: \x, \u or \U without hex digits
        template_error(origin, line, "bad \\x, \\u or \\U escape in a string literal");
      }
      k = e + 1;
    } else {
      const char* hit = nullptr;
      for (const char* op : ops)
        if (s.compare(k, std::char_traits<char>::length(op), op) == 0) {
          hit = op;
          break;
        }
      if (!hit) template_error(origin, line, std::string("unexpected character '") + s[k] + "'");
      out.push_back({Tok::Op, hit});
      k += std::char_traits<char>::length(hit);
    }
  }
  out.push_back({Tok::End, ""});
  return out;
}


// ---- expressions (Jinja2's parser: condexpr > or > and > not > compare > + - > ~ > * / // % > ** >
// unary > primary with postfix . [] () and then | filters and `is` tests) ----

class ExprParser {
 public:
  // `depth`: the nesting of the block the tag is in.
  ExprParser(std::vector<Tok> toks, std::string origin, int line, int depth)
      : t_(std::move(toks)), origin_(std::move(origin)), line_(line), depth_(depth) {}

  bool done() const { return t_[p_].t == Tok::End; }
  bool at_op(const char* op) const { return t_[p_].t == Tok::Op && t_[p_].s == op; }
  bool at_name(const char* kw) const { return t_[p_].t == Tok::Name && t_[p_].s == kw; }
  bool skip_op(const char* op) { return at_op(op) ? (++p_, true) : false; }
  bool skip_name(const char* kw) { return at_name(kw) ? (++p_, true) : false; }
  // item() for each comma-separated item (a trailing comma allowed) up to `close`, then `close`.
  template <class Item>
  void items_until(const char* close, Item item) {
    while (!at_op(close)) {
      item();
      if (!skip_op(",")) break;
    }
    expect_op(close);
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected '") + op + "'");
  }
  std::string name() {
    if (t_[p_].t != Tok::Name) fail("expected a name");
    return t_[p_++].s;
  }
  void expect_end() {
    if (!done()) fail("unexpected '" + t_[p_].s + "'");
  }
  [[noreturn]] void fail(const std::string& what) const {
    template_error(origin_, line_, what + (done() ? " at the end of the tag" : " at '" + t_[p_].s + "'"));
  }

  ExprP expression() {
    Nest nest = nested();
    nest.deeper();
    ExprP e = or_expr();
    while (skip_name("if")) {
      nest.deeper();
      auto c = node(Expr::K::Cond);
      c->a.push_back(or_expr());
      c->a.push_back(e);
      c->a.push_back(skip_name("else") ? expression() : nullptr);
      e = c;
    }
    return e;
  }
  // `a, b` (a tuple, as a list) or one expression.
  ExprP tuple(bool with_cond = true) {
    ExprP first = with_cond ? expression() : or_expr();
    if (!at_op(",")) return first;
    auto l = node(Expr::K::ListLit);
    l->lit.tuple = true;
    l->a.push_back(first);
    while (skip_op(",") && !done() && !at_op(")") && !at_name("if")) l->a.push_back(with_cond ? expression() : or_expr());
    return l;
  }

 private:
  Nest nested() { return Nest(depth_, origin_, line_); }
  std::shared_ptr<Expr> node(Expr::K k) const {
    auto e = std::make_shared<Expr>();
    e->k = k;
    e->line = line_;
    return e;
  }
  ExprP binary(const std::string& op, ExprP l, ExprP r) const {
    auto e = node(Expr::K::Binary);
    e->name = op;
    e->a = {std::move(l), std::move(r)};
    return e;
  }
  // Left-associative binary operators, by level from the loosest: `or` over `and` over not_expr.
  ExprP or_expr(size_t level = 0) {
    static const char* const kLevels[] = {"or", "and"};
    if (level == std::size(kLevels)) return not_expr();
    Nest nest = nested();
    ExprP e = or_expr(level + 1);
    while (skip_name(kLevels[level])) nest.deeper(), e = binary(kLevels[level], e, or_expr(level + 1));
    return e;
  }
  ExprP not_expr() {
    if (!skip_name("not")) return compare();
    Nest nest = nested();
    nest.deeper();
    auto e = node(Expr::K::Unary);
    e->name = "not";
    e->a.push_back(not_expr());
    return e;
  }
  ExprP compare() {
    Nest nest = nested();
    ExprP first = arithmetic();
    std::shared_ptr<Expr> c;
    while (true) {
      std::string op;
      if (t_[p_].t == Tok::Op && (at_op("==") || at_op("!=") || at_op("<") || at_op("<=") || at_op(">") || at_op(">=")))
        op = t_[p_++].s;
      else if (skip_name("in")) op = "in";
      else if (at_name("not") && t_[p_ + 1].t == Tok::Name && t_[p_ + 1].s == "in") op = "not in", p_ += 2;
      else break;
      if (!c) nest.deeper(), c = node(Expr::K::Compare), c->a.push_back(first);
      c->ops.push_back(op);
      c->a.push_back(arithmetic());
    }
    return c ? ExprP(c) : first;
  }
  // Left-associative binary operators, by level from the loosest (Jinja2's parse_math1,
  // parse_concat, parse_math2, parse_pow); the operands of the last level are unary expressions.
  ExprP arithmetic(size_t level = 0) {
    static const std::vector<std::vector<const char*>> kLevels = {{"+", "-"}, {"~"}, {"*", "/", "//", "%"}, {"**"}};
    if (level == kLevels.size()) return unary(true);
    Nest nest = nested();
    ExprP e = arithmetic(level + 1);
    while (true) {
      const auto& ops = kLevels[level];
      const auto op = std::find_if(ops.begin(), ops.end(), [&](const char* o) { return at_op(o); });
      if (op == ops.end()) return e;
      ++p_;
      nest.deeper();
      e = binary(*op, e, arithmetic(level + 1));
    }
  }

  ExprP unary(bool with_filter) {
    Nest nest = nested();
    ExprP e;
    if (at_op("-") || at_op("+")) {
      nest.deeper();
      auto u = node(Expr::K::Unary);
      u->name = t_[p_++].s;
      u->a.push_back(unary(false));
      e = u;
    } else {
      e = primary();
    }
    e = postfix(e);
    return with_filter ? filters(e) : e;
  }
  ExprP literal(Value v) const {
    auto e = node(Expr::K::Lit);
    e->lit = std::move(v);
    return e;
  }
  ExprP primary();
  ExprP postfix(ExprP e);
  ExprP call(ExprP callee);
  ExprP subscript(ExprP obj);
  ExprP filters(ExprP e);
  ExprP test(ExprP e);
  void call_args(Expr& e);

  std::vector<Tok> t_;
  size_t p_ = 0;
  std::string origin_;
  int line_;
  int depth_;
};

ExprP ExprParser::primary() {
  const Tok tok = t_[p_];
  if (tok.t == Tok::Name) {
    ++p_;
    if (tok.s == "true" || tok.s == "True") return literal(Value::boolean(true));
    if (tok.s == "false" || tok.s == "False") return literal(Value::boolean(false));
    if (tok.s == "none" || tok.s == "None") return literal(Value::none());
    auto e = node(Expr::K::Name);
    e->name = tok.s;
    return e;
  }
  if (tok.t == Tok::Str) {
    std::string s;
    while (t_[p_].t == Tok::Str) s += t_[p_++].s;
    return literal(Value::str(s));
  }
  if (tok.t == Tok::Int) return ++p_, literal(Value::integer(tok.i));
  if (tok.t == Tok::Float) return ++p_, literal(Value::number(tok.f));
  if (skip_op("(")) {
    if (skip_op(")")) {
      auto t = node(Expr::K::ListLit);
      t->lit.tuple = true;
      return t;
    }
    ExprP e = tuple();
    expect_op(")");
    return e;
  }
  if (skip_op("[")) {
    auto l = node(Expr::K::ListLit);
    items_until("]", [&] { l->a.push_back(expression()); });
    return l;
  }
  if (skip_op("{")) {
    auto d = node(Expr::K::DictLit);
    items_until("}", [&] {
      d->a.push_back(expression());
      expect_op(":");
      d->a.push_back(expression());
    });
    return d;
  }
  fail("expected an expression");
}

ExprP ExprParser::call(ExprP callee) {
  auto c = node(Expr::K::Call);
  c->a.push_back(std::move(callee));
  call_args(*c);
  return c;
}

ExprP ExprParser::postfix(ExprP e) {
  Nest nest = nested();
  while (true) {
    if (at_op(".") || at_op("[") || at_op("(")) nest.deeper();
    if (at_op(".") || at_op("[")) e = subscript(e);
    else if (at_op("(")) e = call(e);
    else return e;
  }
}

ExprP ExprParser::subscript(ExprP obj) {
  if (skip_op(".")) {
    if (t_[p_].t == Tok::Int) {
      auto e = node(Expr::K::Item);
      e->a = {obj, literal(Value::integer(t_[p_++].i))};
      return e;
    }
    auto e = node(Expr::K::Attr);
    e->a.push_back(obj);
    e->name = name();
    return e;
  }
  expect_op("[");
  ExprP parts[3];
  int n = 0;
  bool slice = false;
  while (true) {
    if (!at_op(":") && !at_op("]")) parts[n] = expression();
    if (n < 2 && skip_op(":")) {
      slice = true, ++n;
      continue;
    }
    break;
  }
  expect_op("]");
  auto e = node(slice ? Expr::K::Slice : Expr::K::Item);
  e->a = {obj, parts[0]};
  if (slice) e->a.push_back(parts[1]), e->a.push_back(parts[2]);
  if (!slice && !parts[0]) fail("empty subscript");
  return e;
}

void ExprParser::call_args(Expr& e) {
  expect_op("(");
  items_until(")", [&] {
    if (at_op("*") || at_op("**")) fail("unsupported construct: *args / **kwargs in a call");
    if (t_[p_].t == Tok::Name && t_[p_ + 1].t == Tok::Op && t_[p_ + 1].s == "=") {
      const std::string key = t_[p_].s;
      p_ += 2;
      e.kw.emplace_back(key, expression());
    } else {
      if (!e.kw.empty()) fail("a positional argument after a keyword argument");
      e.a.push_back(expression());
    }
  });
}

ExprP ExprParser::filters(ExprP e) {
  Nest nest = nested();
  while (true) {
    if (at_op("|") || at_name("is") || at_op("(")) nest.deeper();
    if (skip_op("|")) {
      auto f = node(Expr::K::Filter);
      f->name = name();
      while (skip_op(".")) f->name += "." + name();
      if (!is_filter(f->name)) template_error(origin_, line_, "unsupported filter '" + f->name + "'");
      f->a.push_back(e);
      if (at_op("(")) call_args(*f);
      e = f;
    } else if (at_name("is")) {
      e = test(e);
    } else if (at_op("(")) {
      e = call(e);
    } else {
      return e;
    }
  }
}

ExprP ExprParser::test(ExprP e) {
  skip_name("is");
  auto t = node(Expr::K::Test);
  t->negate = skip_name("not");
  t->name = name();
  if (!is_test(t->name)) template_error(origin_, line_, "unsupported test 'is " + t->name + "'");
  t->a.push_back(e);
  const Tok& c = t_[p_];
  if (at_op("(")) {
    call_args(*t);
  } else if ((c.t == Tok::Name || c.t == Tok::Str || c.t == Tok::Int || c.t == Tok::Float || at_op("[") || at_op("{")) &&
             !(c.t == Tok::Name && (c.s == "else" || c.s == "or" || c.s == "and" || c.s == "if"))) {
    t->a.push_back(postfix(primary()));
  }
  return t;
}

// ---- statements ----

class StmtParser {
 public:
  StmtParser(std::vector<Chunk> chunks, std::string origin) : c_(std::move(chunks)), origin_(std::move(origin)) {}

  Parsed parse() {
    Parsed p;
    std::unique_ptr<ExprParser> tail;
    parse_body(p.body, {}, tail);
    p.has_generation = has_generation_;
    return p;
  }

 private:
  using Ends = std::vector<std::string>;

  std::shared_ptr<Stmt> stmt(Stmt::K k, int line) const {
    auto s = std::make_shared<Stmt>();
    s->k = k;
    s->line = line;
    return s;
  }

  // Statements up to a block tag whose first word is in `ends` (returned; `tail` then parses the rest
  // of that tag), or to the end of the template when `ends` is empty.
  std::string parse_body(Body& out, const Ends& ends, std::unique_ptr<ExprParser>& tail) {
    while (i_ < c_.size()) {
      const Chunk& ch = c_[i_++];
      if (ch.kind == Chunk::Text) {
        auto s = stmt(Stmt::K::Text, ch.line);
        s->text = ch.body;
        out.push_back(s);
        continue;
      }
      auto ep = std::make_unique<ExprParser>(tokenize(ch.body, origin_, ch.line), origin_, ch.line, depth_);
      if (ch.kind == Chunk::Var) {
        auto s = stmt(Stmt::K::Out, ch.line);
        s->expr = ep->tuple();
        ep->expect_end();
        out.push_back(s);
        continue;
      }
      const std::string kw = ep->name();
      if (std::find(ends.begin(), ends.end(), kw) != ends.end()) {
        tail = std::move(ep);
        return kw;
      }
      out.push_back(block(kw, *ep, ch.line));
    }
    if (!ends.empty()) template_error(origin_, c_.empty() ? 1 : c_.back().line, "missing {% " + ends.back() + " %}");
    return "";
  }

  // Statements up to the block tag `end`, which must hold nothing more ({% endset %}, ...).
  void body_until(Body& out, const std::string& end) {
    std::unique_ptr<ExprParser> tail;
    parse_body(out, {end}, tail);
    tail->expect_end();
  }

  StmtP block(const std::string& kw, ExprParser& ep, int line) {
    Nest nest(depth_, origin_, line);
    nest.deeper();
    if (kw == "if") return if_block(ep, line);
    if (kw == "for") return for_block(ep, line);
    if (kw == "set") return set_block(ep, line);
    if (kw == "macro") return macro_block(ep, line);
    if (kw == "generation") {
      ep.expect_end();
      has_generation_ = true;
      auto s = stmt(Stmt::K::Generation, line);
      body_until(s->body, "endgeneration");
      return s;
    }
    if (kw == "break" || kw == "continue") {
      ep.expect_end();
      return stmt(kw == "break" ? Stmt::K::Break : Stmt::K::Continue, line);
    }
    if (kw.rfind("end", 0) == 0 || kw == "elif" || kw == "else")
      template_error(origin_, line, "unexpected {% " + kw + " %}");
    template_error(origin_, line, "unsupported construct {% " + kw + " %}");
  }

  StmtP if_block(ExprParser& ep, int line) {
    auto s = stmt(Stmt::K::If, line);
    ExprP cond = ep.expression();
    ep.expect_end();
    while (true) {
      Body body;
      std::unique_ptr<ExprParser> tail;
      const std::string end = parse_body(body, {"elif", "else", "endif"}, tail);
      s->branches.emplace_back(cond, std::move(body));
      if (end == "elif") {
        cond = tail->expression();
        tail->expect_end();
        continue;
      }
      tail->expect_end();
      if (end == "else") body_until(s->else_body, "endif");
      return s;
    }
  }

  StmtP for_block(ExprParser& ep, int line) {
    auto s = stmt(Stmt::K::For, line);
    do s->targets.push_back(ep.name());
    while (ep.skip_op(","));
    if (!ep.skip_name("in")) ep.fail("expected 'in'");
    s->expr = ep.tuple(false);
    if (ep.skip_name("if")) s->filter = ep.expression();
    if (ep.at_name("recursive")) ep.fail("unsupported construct: recursive for loop");
    ep.expect_end();
    std::unique_ptr<ExprParser> tail;
    const bool has_else = parse_body(s->body, {"else", "endfor"}, tail) == "else";
    tail->expect_end();
    if (has_else) body_until(s->else_body, "endfor");
    return s;
  }

  StmtP set_block(ExprParser& ep, int line) {
    auto s = stmt(Stmt::K::Set, line);
    s->targets.push_back(ep.name());
    if (ep.skip_op(".")) s->targets.push_back(ep.name()), s->attr_target = true;
    if (ep.at_op(",")) ep.fail("unsupported construct: {% set %} of several names");
    if (ep.skip_op("=")) {
      s->expr = ep.tuple();
      ep.expect_end();
      return s;
    }
    if (s->attr_target) ep.fail("expected '='");
    ep.expect_end();  // {% set x | filter %} is not supported: it stops here
    s->k = Stmt::K::SetBlock;
    body_until(s->body, "endset");
    return s;
  }

  StmtP macro_block(ExprParser& ep, int line) {
    auto s = stmt(Stmt::K::Macro, line);
    s->targets.push_back(ep.name());
    ep.expect_op("(");
    ep.items_until(")", [&] {
      const std::string param = ep.name();
      s->params.emplace_back(param, ep.skip_op("=") ? ep.expression() : nullptr);
    });
    ep.expect_end();
    body_until(s->body, "endmacro");
    return s;
  }

  std::vector<Chunk> c_;
  size_t i_ = 0;
  std::string origin_;
  bool has_generation_ = false;
  int depth_ = 0;  // of the blocks being parsed
};

}  // namespace

Parsed parse_template(const std::string& source, const std::string& origin) {
  return StmtParser(scan(normalise(source), origin), origin).parse();
}

}  // namespace tessera::text::jinja
