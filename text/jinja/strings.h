// Python's str operations for the Jinja renderer (internal to jinja_*.cpp): case mapping on ASCII
// letters, split, replace, str.title and Jinja's `title`, and the str methods a template may call.
#pragma once
#include <string>

#include "text/jinja/builtins.h"

namespace tessera::text::jinja {

std::string ascii_lower(std::string s);
std::string ascii_upper(std::string s);
std::string py_capitalize(const std::string& s);
std::string py_title(const std::string& s);     // str.title()
std::string jinja_title(const std::string& s);  // the `title` filter
// str.replace(old, new, count) (count < 0: all).
std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count);
// str.split(sep, maxsplit): `sep` none or undefined splits on runs of whitespace.
List py_split(const std::string& s, const Value& sep, int64_t maxsplit);
// The bound method `name` of string `obj` (strip, split, startswith, ...); a str method it does not
// implement is refused, any other name is undefined (as Jinja2 does).
Value str_method(const Value& obj, const std::string& name, const Where& w);

}  // namespace tessera::text::jinja
