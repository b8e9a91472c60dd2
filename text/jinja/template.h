// A Jinja renderer for chat templates, rendering as `transformers` does: Jinja2's
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
// extension, the globals raise_exception(msg), strftime_now(fmt), range, namespace, dict, and the
// `tojson` filter of transformers (json.dumps(x, ensure_ascii=False, indent=indent)). The caller
// gives the variables (messages, bos_token, eos_token, add_generation_prompt, tools, ...).
//
// SUPPORTED: {{ }}, {% if/elif/else %}, {% for a[, b] in x [if c] %} with loop.index/index0/first/
// last/length/revindex/revindex0/previtem/nextitem and {% else %}, {% break %}, {% continue %},
// {% set x = ... %}, {% set ns.attr = ... %}, {% set x %}...{% endset %}, {% macro %} and calls
// (with defaults and keyword arguments), {% generation %}...{% endgeneration %}, comments, the
// whitespace controls {%- -%} {{- -}} {%+, literals (string, int, float, bool, none, list, tuple,
// dict), + - * / // % ** ~, comparisons and chains, and/or/not, in/not in, inline if-else,
// subscripts, slices, attributes (dict keys), the tests of jinja_builtins.cpp (defined, undefined,
// none, string, mapping, number, integer, float, boolean, iterable, sequence, true, false,
// equalto/eq/==, ne, gt, ge, lt, le, odd, even, divisibleby, in, callable), its filters and the
// str/dict methods. Anything else is refused when parsed (statements, filters, tests) or when
// reached (methods, functions): Error(Input) "chat template <origin> line N: unsupported ...".
//
// Python semantics follow CPython: str() of values ("None", "True", "[1, 'a']"), integer and float
// arithmetic, strings sliced and measured by code point, Unicode whitespace for strip/trim/split,
// upper/lower/title/capitalize on ASCII letters only (other letters are kept as they are).
#pragma once
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/value.h"

namespace tessera::text::jinja {

struct Parsed;

// An exception the template raised while rendering: raise_exception(msg) (what() is msg), or an
// operation Python refuses (a TypeError: what() says which, with the template's line).
class TemplateError : public std::runtime_error {
 public:
  explicit TemplateError(const std::string& what) : std::runtime_error(what) {}
};

struct Rendered {
  std::string text;
  // Byte ranges [begin, end) of `text` written inside {% generation %} blocks, in order, merged
  // where adjacent.
  std::vector<std::pair<size_t, size_t>> generation;
};

using Context = std::vector<std::pair<std::string, Value>>;

class Template {
 public:
  // Parses; throws Error(Input) naming `origin` (a file, "file:field") and the line for a syntax
  // error or an unsupported construct.
  Template(const std::string& source, std::string origin);
  bool has_generation() const;
  const std::string& origin() const { return origin_; }
  Rendered render(const Context& context) const;

 private:
  std::shared_ptr<const Parsed> parsed_;
  std::string origin_;
};

}  // namespace tessera::text::jinja
