// Enumerations that have names in configuration and on the command line: each enum has one list of
// names, in enum order (names[i] names E(i)), that the configuration schema (its choices and its
// reference), the parsers and the messages all read. Header-only and dependency-free, so the config
// fuzz harness, model/ and runtime/ share the lists.
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace tessera::util {

using Names = std::vector<std::string>;

// E(i) for the name at index i; nullopt for any other string.
template <class E>
std::optional<E> enum_named(const Names& names, const std::string& s) {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == s) return static_cast<E>(i);
  return std::nullopt;
}

template <class E>
const std::string& name_of(const Names& names, E e) {
  return names.at(static_cast<size_t>(e));
}

// "a, b, c": the list messages print.
inline std::string join_names(const Names& names) {
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  return list;
}

}  // namespace tessera::util

// Defines `const util::Names& fn()`, the names of an enum in enum order, as one static list.
#define TESSERA_ENUM_NAMES(fn, ...)                                      \
  inline const ::tessera::util::Names& fn() {                            \
    static const ::tessera::util::Names names = {__VA_ARGS__};           \
    return names;                                                        \
  }
