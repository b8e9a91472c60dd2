// The parsed form of a Jinja template (internal to jinja_*.cpp): expressions and statements, each
// with its line in the template for messages. jinja_parse.cpp builds it, jinja_eval.cpp runs it.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/value.h"

namespace tessera::text::jinja {

struct Expr;
using ExprP = std::shared_ptr<const Expr>;

struct Expr {
  enum class K {
    Lit,      // lit
    Name,     // name
    Attr,     // a[0].name
    Item,     // a[0][a[1]]
    Slice,    // a[0][a[1]:a[2]:a[3]] (null parts are omitted)
    Call,     // a[0](a[1..], kw)
    Filter,   // a[0] | name(a[1..], kw)
    Test,     // a[0] is [not] name(a[1..])
    Unary,    // op a[0]: "-", "+", "not"
    Binary,   // a[0] op a[1]: + - * / // % ** ~ and or
    Compare,  // a[0] ops[0] a[1] ops[1] a[2] ...: == != < <= > >= in "not in"
    Cond,     // a[1] if a[0] else a[2] (a[2] null: undefined)
    ListLit,  // [a...], and tuples (lit.tuple set)
    DictLit,  // {a[0]: a[1], a[2]: a[3], ...}
  };
  K k = K::Lit;
  int line = 0;
  Value lit;
  std::string name;  // Name, Attr, Filter, Test; Unary / Binary: the operator
  std::vector<ExprP> a;
  std::vector<std::string> ops;  // Compare
  std::vector<std::pair<std::string, ExprP>> kw;
  bool negate = false;  // Test: "is not"
};

struct Stmt;
using StmtP = std::shared_ptr<const Stmt>;
using Body = std::vector<StmtP>;

struct Stmt {
  enum class K {
    Text,        // text
    Out,         // {{ expr }}
    If,          // branches (cond, body); else_body
    For,         // for targets in expr [if filter]: body [else: else_body]
    Set,         // set targets[0] = expr, or targets = [ns, attr] when attr_target
    SetBlock,    // set targets[0] %}body{% endset
    Macro,       // macro targets[0](params) body
    Generation,  // generation %}body{% endgeneration
    Break,
    Continue,
  };
  K k = K::Text;
  int line = 0;
  std::string text;
  ExprP expr, filter;
  std::vector<std::pair<ExprP, Body>> branches;
  Body body, else_body;
  std::vector<std::string> targets;
  std::vector<std::pair<std::string, ExprP>> params;  // Macro: name and default (null: none)
  bool attr_target = false;
};

struct Parsed {
  Body body;
  bool has_generation = false;
};

// Parses `source`; throws Error(Input) "chat template <origin> line N: ..." for a syntax error or a
// construct the renderer does not support (named).
Parsed parse_template(const std::string& source, const std::string& origin);

// Throws Error(Input) "chat template <origin> line <line>: <what>".
[[noreturn]] void template_error(const std::string& origin, int line, const std::string& what);

}  // namespace tessera::text::jinja
