// The built-ins of the Jinja renderer (internal to jinja_*.cpp): filters, tests, str and dict
// methods, attribute and item lookup as Jinja2's sandbox does it, iteration, slicing and the
// globals (range, namespace, dict, raise_exception, strftime_now).
#pragma once
#include <string>

#include "text/jinja/value.h"

namespace tessera::text::jinja {

// Where in the template an operation runs, for its errors.
struct Where {
  const std::string& origin;
  int line;
  // A Python exception at render time (TypeError, UndefinedError): jinja::TemplateError.
  [[noreturn]] void type_error(const std::string& what) const;
  // Something the renderer does not implement: Error(Input) naming it.
  [[noreturn]] void unsupported(const std::string& what) const;
};

bool is_filter(const std::string& name);
bool is_test(const std::string& name);
Value apply_filter(const std::string& name, const Value& v, const Args& args, const Where& w);
bool apply_test(const std::string& name, const Value& v, const Args& args, const Where& w);

Value get_attr(const Value& obj, const std::string& name, const Where& w);  // obj.name
Value get_item(const Value& obj, const Value& key, const Where& w);         // obj[key]
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step, const Where& w);
bool contains(const Value& container, const Value& item, const Where& w);  // item in container
List iterate(const Value& v, const Where& w);
int64_t length(const Value& v, const Where& w);
// The global function `name` (undefined when there is none).
Value global(const std::string& name, const Where& w);

// Argument `pos` (positional) or `key` (keyword) of a call, else `def`.
Value arg(const Args& a, size_t pos, const char* key, const Value& def = Value::undefined());

}  // namespace tessera::text::jinja
