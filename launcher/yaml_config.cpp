#include "launcher/yaml_config.h"

// GCC 12 flags yaml-cpp 0.7's node/impl.h with -Wdangling-pointer (a false positive about its
// temporary shared_memory_holder); the warning is silenced for that header only.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdangling-pointer"
#endif
#include <yaml-cpp/yaml.h>
#if __has_include(<yaml-cpp/depthguard.h>)  // yaml-cpp >= 0.7: the parser's own depth guard
#include <yaml-cpp/depthguard.h>
#define TESSERA_YAML_DEPTH_GUARD 1
#endif
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic pop
#endif

#include <fstream>
#include <regex>
#include <sstream>

#include "launcher/config.h"
#include "util/budgets.h"
#include "util/error.h"

namespace tessera::launcher {

using nlohmann::json;

bool is_yaml_path(const std::string& path) {
  auto ends_with = [&](const std::string& s) {
    return path.size() >= s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0;
  };
  return ends_with(".yaml") || ends_with(".yml");
}

namespace {

std::string where(const std::string& source, const YAML::Mark& m) {
  return source + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

// A plain scalar as YAML 1.2's core schema types it, with PyYAML's YAML 1.1 booleans.
json resolve_plain(const std::string& s) {
  static const std::regex int_re("[-+]?[0-9]+"), hex_re("0x[0-9a-fA-F]+"), oct_re("0o[0-7]+"),
      float_re("[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?");
  static const char* const trues[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
  static const char* const falses[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
  for (const char* t : trues)
    if (s == t) return true;
  for (const char* f : falses)
    if (s == f) return false;
  try {
    if (std::regex_match(s, int_re)) return std::stoll(s);
    if (std::regex_match(s, hex_re)) return std::stoll(s.substr(2), nullptr, 16);
    if (std::regex_match(s, oct_re)) return std::stoll(s.substr(2), nullptr, 8);
    if (std::regex_match(s, float_re)) return std::stod(s);
  } catch (const std::out_of_range&) {
    // Too large for int64 / double: left as text, and the schema says what it should be.
  }
  return s;
}

struct Converter {
  std::string source;
  const YamlScalarType& scalar_type;
  YamlPositions* positions;
  int64_t nodes = 0;  // converted so far, each alias counted again where it is followed
  int depth = 0;

  // Counts one more node at one more level, within the budgets: a file of nested aliases ("billion
  // laughs") expands to 10^9 nodes from 1 KB, and nesting recurses here once per level.
  struct Enter {
    Converter& c;
    Enter(Converter& conv, const YAML::Node& n) : c(conv) {
      if (++c.nodes > util::budget::kYamlExpandedNodes)
        throw TESSERA_INPUT_ERROR(where(c.source, n.Mark()) + ": the YAML expands to more than " +
                                  std::to_string(util::budget::kYamlExpandedNodes) +
                                  " nodes once its aliases (*name) are followed (budget kYamlExpandedNodes)");
      if (++c.depth > util::budget::kYamlDepth)
        throw TESSERA_INPUT_ERROR(where(c.source, n.Mark()) + ": YAML nested deeper than " +
                                  std::to_string(util::budget::kYamlDepth) + " levels (budget kYamlDepth)");
    }
    ~Enter() { --c.depth; }
  };

  // A scalar's text, which must be UTF-8: every later dump() of the config (its check, run_info,
  // the checkpoint manifest) would throw json type_error 316 (found by fuzz_yaml).
  std::string scalar(const YAML::Node& n) const {
    try {
      (void)json(n.Scalar()).dump();
    } catch (const json::type_error&) {
      throw TESSERA_INPUT_ERROR(where(source, n.Mark()) + ": not UTF-8 text (a YAML file is UTF-8)");
    }
    return n.Scalar();
  }

  json value(const YAML::Node& n, const std::string& path) {
    const Enter in(*this, n);
    switch (n.Type()) {
      case YAML::NodeType::Null:
        return nullptr;
      case YAML::NodeType::Scalar: {
        const std::string& tag = n.Tag();
        if (tag == "!" || tag == "tag:yaml.org,2002:str") return scalar(n);
        if (scalar_type && scalar_type(path) == "string") return scalar(n);
        return resolve_plain(scalar(n));
      }
      case YAML::NodeType::Sequence: {
        json a = json::array();
        for (const auto& e : n) a.push_back(value(e, path));
        return a;
      }
      case YAML::NodeType::Map:
        return mapping(n, path);
      default:
        return nullptr;
    }
  }

  json mapping(const YAML::Node& n, const std::string& prefix) {
    json o = json::object();
    std::map<std::string, int> first_line;
    for (auto it = n.begin(); it != n.end(); ++it) {
      // A copy (a handle): it-> is a proxy that dies at the end of the statement, and a reference
      // into it dangled (AddressSanitizer's stack-use-after-scope, found by fuzz_yaml).
      const YAML::Node k = it->first;
      if (!k.IsScalar())
        throw TESSERA_INPUT_ERROR(where(source, k.Mark()) + ": a key must be a plain name, not a " +
                                  (k.IsMap() ? "mapping" : k.IsSequence() ? "sequence" : "null"));
      const std::string key = scalar(k);
      const std::string path = prefix.empty() ? key : prefix + "." + key;
      auto [seen, fresh] = first_line.emplace(key, k.Mark().line + 1);
      if (!fresh)
        throw TESSERA_INPUT_ERROR(where(source, k.Mark()) + ": key '" + path + "' appears twice (first at line " +
                                  std::to_string(seen->second) + ")");
      if (positions) (*positions)[path] = std::to_string(k.Mark().line + 1) + ":" + std::to_string(k.Mark().column + 1);
      o[key] = value(it->second, path);
    }
    return o;
  }
};

}  // namespace

json parse_yaml_text(const std::string& text, const std::string& source, const YamlScalarType& scalar_type,
                     YamlPositions* positions) {
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(text);
#ifdef TESSERA_YAML_DEPTH_GUARD
  } catch (const YAML::DeepRecursion& e) {  // its message is "bad file" (yaml-cpp 0.7)
    throw TESSERA_INPUT_ERROR(where(source, e.mark) + ": invalid YAML: nested deeper than yaml-cpp's parser allows (" +
                              std::to_string(e.depth()) + " levels of recursion; the budget is " +
                              std::to_string(util::budget::kYamlDepth) + " levels, kYamlDepth)");
#endif
  } catch (const YAML::Exception& e) {
    throw TESSERA_INPUT_ERROR((e.mark.is_null() ? source : where(source, e.mark)) + ": invalid YAML: " + e.msg);
  }
  if (docs.empty() || docs[0].IsNull()) {
    if (docs.size() > 1) throw TESSERA_INPUT_ERROR(source + ": holds " + std::to_string(docs.size()) + " YAML documents; expected one");
    return json::object();
  }
  if (docs.size() > 1)
    throw TESSERA_INPUT_ERROR(where(source, docs[1].Mark()) + ": a second YAML document; a config file holds one");
  if (!docs[0].IsMap())
    throw TESSERA_INPUT_ERROR(where(source, docs[0].Mark()) + ": the top level must be a mapping of keys, got a " +
                              (docs[0].IsSequence() ? "sequence" : "scalar"));
  Converter c{source, scalar_type, positions};
  return c.mapping(docs[0], "");
}

json read_yaml_file(const std::string& path, const YamlScalarType& scalar_type, YamlPositions* positions) {
  std::ifstream in(path);
  if (!in) throw TESSERA_INPUT_ERROR(path + ": cannot open config file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_yaml_text(ss.str(), path, scalar_type, positions);
}

json read_config_file(const std::string& path) {
  if (!is_yaml_path(path)) return read_json_file(path);
  return read_yaml_file(path, [](const std::string& key) {
    for (const auto& k : config_schema())
      if (k.key == key) return k.type;
    return std::string();
  });
}

}  // namespace tessera::launcher
