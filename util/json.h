// Parsing JSON that users hand us (run configs, config.json, safetensors headers and indexes,
// checkpoint manifests, JSONL lines). nlohmann's parser itself is iterative, but copying, comparing
// and dumping a parsed value recurse once per nesting level: a 200 KB config of '[' nested 100000
// deep parsed fine and then crashed `tessera config --check` with a stack overflow (found while
// fuzzing, tests/fuzz). parse_json() refuses documents nested deeper than kMaxJsonDepth -- no real
// config, header or manifest comes near it -- before nlohmann sees them.
#pragma once
#include <nlohmann/json.hpp>

#include <cstddef>
#include <istream>
#include <iterator>
#include <string>
#include <string_view>

#include "util/budgets.h"

namespace tessera::util {

constexpr int kMaxJsonDepth = budget::kJsonDepth;

// Byte offset of the first '[' or '{' (outside strings) that opens level max_depth + 1, or npos.
// Exact for valid JSON; for invalid JSON it may miss, and the parser then reports the syntax error.
inline size_t json_too_deep_at(std::string_view text, int max_depth = kMaxJsonDepth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::string_view::npos;
}

// nlohmann::json::parse(text), except that a document nested deeper than kMaxJsonDepth throws
// nlohmann::json::parse_error (id 101, at the offending byte) like any other malformed JSON, which
// every caller already turns into its own one-line error naming the file. This header is the one
// place that calls nlohmann's parser (tests/unit/architecture.sh checks it): every JSON document a
// user hands us is depth-limited. Json may be nlohmann::ordered_json (key order kept).
template <class Json = nlohmann::json>
Json parse_json(std::string_view text) {
  const size_t at = json_too_deep_at(text);
  if (at != std::string_view::npos)
    throw nlohmann::json::parse_error::create(
        101, at + 1, "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels", nullptr);
  return Json::parse(text.begin(), text.end());
}

// The rest of a stream (a file the caller opened), parsed as above.
template <class Json = nlohmann::json>
Json parse_json(std::istream& in) {
  const std::string text(std::istreambuf_iterator<char>(in), {});
  return parse_json<Json>(text);
}

// As parse_json, without exceptions: a value of type discarded when the text is not JSON or is
// nested too deep (for readers that skip what they cannot read, such as a line cut by a crash).
inline nlohmann::json parse_json_or_discarded(std::string_view text) {
  if (json_too_deep_at(text) != std::string_view::npos) return nlohmann::json(nlohmann::json::value_t::discarded);
  return nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

}  // namespace tessera::util
