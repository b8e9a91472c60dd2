// YAML input for configuration files (yaml-cpp): one YAML document is converted to the JSON value
// the JSON machinery already validates, so a YAML run config meets the same schema, defaults and
// errors as its JSON twin (config.h). JSON stays the default: a path is read as YAML only when it
// ends in .yaml or .yml.
//
// Scalars: quoted scalars (and `!!str`) are strings. A plain scalar is typed by `scalar_type`, which
// maps the dotted key path of the value (e.g. "fsdp.strategy") to the schema's type: for "string"
// the text is taken as is (so `activation_checkpointing: true` or `preempt_signal: USR2` are the
// strings the schema asks for); otherwise it is resolved as YAML 1.2's core schema does (null: `~`,
// `null`, empty; ints; floats such as 3e-4) with PyYAML's YAML 1.1 booleans (true/false, yes/no,
// on/off in any of their three spellings), because that is how Accelerate's own files are read.
//
// Errors (Error(Input), exit 2), one line each: "FILE:LINE:COL: invalid YAML: <reason>" for text
// that is not YAML; "FILE:LINE:COL: key 'a.b' appears twice (first at line N)" for a repeated key
// in one mapping; a top level that is not a mapping; more than one document. An empty file is an
// empty mapping.
#pragma once
#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <string>

namespace tessera::launcher {

bool is_yaml_path(const std::string& path);

// Where each mapping key of the document was written: dotted key path -> "LINE:COL" (1-based).
using YamlPositions = std::map<std::string, std::string>;
using YamlScalarType = std::function<std::string(const std::string& dotted_key)>;

nlohmann::json parse_yaml_text(const std::string& text, const std::string& source,
                               const YamlScalarType& scalar_type = {}, YamlPositions* positions = nullptr);
nlohmann::json read_yaml_file(const std::string& path, const YamlScalarType& scalar_type = {},
                              YamlPositions* positions = nullptr);

}  // namespace tessera::launcher
