// Parsing a configuration or command-line name into its enum (util/enum_names.h), with the one
// input error every parser gives: "<key> '<s>' is not one of a, b, c".
#pragma once
#include <string>

#include "util/enum_names.h"
#include "util/error.h"

namespace tessera::util {

template <class E>
E parse_named(const Names& names, const std::string& s, const std::string& key) {
  if (const auto e = enum_named<E>(names, s)) return *e;
  throw TESSERA_INPUT_ERROR(key + " '" + s + "' is not one of " + join_names(names));
}

}  // namespace tessera::util
