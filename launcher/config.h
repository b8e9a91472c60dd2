// The run configuration: one JSON document with documented sections. Every key, its type, default
// and meaning live in one table (config.cpp: kSchema); `tessera config --reference` prints it as
// the README's configuration reference. Unknown keys and wrong types are errors naming the key.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera::launcher {

struct ConfigKey {
  std::string key;          // dotted path, e.g. "train.lr"
  std::string type;         // "int", "float", "bool", "string", "int list" (a JSON array of integers)
  nlohmann::json default_value;
  std::string help;
  std::vector<std::string> choices;  // allowed values for strings (empty: any)
};

const std::vector<ConfigKey>& config_schema();

class Config {
 public:
  // Defaults only.
  Config();
  // Reads a run config file (JSON; YAML when the name ends in .yaml/.yml; errors name file, line and
  // column), merges over the defaults, applies `--set key=value` overrides, validates every key and type.
  static Config load(const std::string& path, const std::vector<std::string>& overrides = {});
  static Config from_json(const nlohmann::json& j, const std::string& source,
                          const std::vector<std::string>& overrides = {});

  const nlohmann::json& json() const { return j_; }  // fully populated (every schema key)
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  std::vector<int64_t> get_int_list(const std::string& key) const;
  void set(const std::string& key, const nlohmann::json& v);  // validated like --set

  // Markdown table of every key (for README).
  static std::string reference_markdown();

 private:
  const nlohmann::json& at(const std::string& key) const;
  nlohmann::json j_;
};

// Parses JSON text; on error throws Error(Input) "FILE:LINE:COL: <reason>".
nlohmann::json parse_json_text(const std::string& text, const std::string& source);
nlohmann::json read_json_file(const std::string& path);
// A run config file as JSON: YAML when the name ends in .yaml/.yml (plain scalars typed by the
// schema; yaml_config.cpp), else JSON.
nlohmann::json read_config_file(const std::string& path);

}  // namespace tessera::launcher
