// The values of the Jinja renderer (text/jinja/template.h) and the Python semantics they follow, as Jinja2 on
// CPython gives them: truthiness, str() and repr() (what {{ }} prints), ==, <, json.dumps (the
// `tojson` of transformers), and strings indexed and sliced by code point.
//
// A Value is undefined (a missing variable, key or attribute: prints "", is false, iterates as
// empty), none, a bool, an int (int64), a float, a UTF-8 string, a list, a dict (string keys in
// insertion order) or a function (a macro, a bound method, a global). Lists and dicts are shared,
// never mutated by the template, except a namespace() dict (`ns` true), whose attributes {% set %}
// assigns.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tessera::text::jinja {

struct Value;
using List = std::vector<Value>;
struct Dict;

// Positional and keyword arguments of a call.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};
using Function = std::function<Value(const Args&)>;

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, Str, List, Dict, Func };
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // Str; Undefined: the name that was missing (for messages); Func: its name
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Function> fn;
  bool ns = false;     // a namespace() (a Dict whose attributes can be set)
  bool tuple = false;  // a List that is a Python tuple: repr "(a, b)"

  static Value undefined(std::string name = "");
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value str(std::string v);
  static Value make_list(List v = {});
  static Value make_tuple(List v);
  static Value make_dict();
  static Value func(std::string name, Function f);

  bool is(Kind k) const { return kind == k; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  double as_double() const;
};

struct Dict {
  Dict() = default;
  Dict(const Dict&) = delete;
  Dict& operator=(const Dict&) = delete;
  ~Dict();  // iterative: a value nested 100k deep (built by a loop) is freed without deep recursion
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
};

// The budgets of one render (util/budgets.h) that the values it makes are charged to: every string
// made (Value::str) is at most kJinjaStringBytes, and the strings and list items made in one render
// at most kJinjaMadeBytes; printing and comparing nest at most kJinjaDepth levels. The render that
// runs on this thread installs one (RenderBudget::Scope); with none, nothing is charged. Exceeding
// one throws BudgetExceeded (what(): what was exceeded), which the renderer names with the
// template's origin and line.
class BudgetExceeded : public std::runtime_error {
 public:
  explicit BudgetExceeded(const std::string& what) : std::runtime_error(what) {}
};
struct RenderBudget {
  size_t made = 0;                         // bytes of strings and list items made
  std::vector<std::weak_ptr<Dict>> spaces;  // namespace()s, emptied at the end (they may form cycles)
  static RenderBudget* current();
  class Scope {
   public:
    explicit Scope(RenderBudget& b);
    ~Scope();
   private:
    RenderBudget* mine_;
    RenderBudget* saved_;
  };
};
// Throws BudgetExceeded when a string of `bytes` would pass kJinjaStringBytes.
void check_string_bytes(size_t bytes);
// out += piece, for a string being made piece by piece (join, replace, repr): checked first.
void append_bounded(std::string& out, const std::string& piece);
[[noreturn]] void too_deep();

// Python's type name of a value ("str", "list", "NoneType", ...), for messages.
std::string type_name(const Value& v);
bool truthy(const Value& v);
std::string to_str(const Value& v);   // str(v); undefined: ""
std::string to_repr(const Value& v);  // repr(v)
bool equals(const Value& a, const Value& b);
// a < b for numbers, strings and lists; throws std::invalid_argument for other types.
bool less(const Value& a, const Value& b);
// json.dumps(v, ensure_ascii=False, indent=indent) (indent < 0: None).
std::string to_json(const Value& v, int indent);
Value from_json(const nlohmann::ordered_json& j);
Value from_json(const nlohmann::json& j);
std::string py_float(double d);  // repr(float)

// The one-letter escapes of Python string literals (\n \t \r \b \f, the five JSON has too, and
// \0 \a \v), one table both ways: the character `letter` stands for, or -1 (the parser); the letter
// json.dumps writes `c` with after a backslash (JSON's five, and " and \ themselves), or 0.
int escaped_char(char letter);
char json_escape_letter(char c);

// Strings by code point (UTF-8).
std::vector<std::string> code_points(const std::string& s);
size_t code_point_count(const std::string& s);  // code_points(s).size(), without making them
bool is_py_space(const std::string& cp);  // str.isspace() of one code point
// str.strip / lstrip / rstrip: `chars` empty strips whitespace.
std::string py_strip(const std::string& s, const std::string& chars, bool left, bool right);

}  // namespace tessera::text::jinja
