#include "text/records.h"

#include "text/chat_template.h"

namespace tessera::text {

namespace {

using json = nlohmann::ordered_json;

json message(const std::string& role, const std::string& content) { return {{"role", role}, {"content", content}}; }

// The string field `key` of `j` ("" when absent and optional); BadExample naming `what` otherwise.
std::string string_of(const json& j, const char* key, const std::string& what, bool optional) {
  if (!j.contains(key) || j[key].is_null()) {
    if (optional) return "";
    throw BadExample("bad record", what + ": field \"" + key + "\" is missing");
  }
  if (!j[key].is_string()) throw BadExample("bad record", what + ": field \"" + key + "\" is not a string");
  return j[key].get<std::string>();
}

json alpaca(const json& r) {
  if (r.contains("history") && !(r["history"].is_null() || (r["history"].is_array() && r["history"].empty())))
    throw BadExample("bad record", "Alpaca record: \"history\" (earlier turns) is not supported: write the "
                                   "conversation as \"messages\"");
  const std::string system = string_of(r, "system", "Alpaca record", true);
  const std::string instruction = string_of(r, "instruction", "Alpaca record", false);
  const std::string input = string_of(r, "input", "Alpaca record", true);
  const std::string output = string_of(r, "output", "Alpaca record", false);
  json messages = json::array();
  if (!system.empty()) messages.push_back(message("system", system));
  messages.push_back(message("user", input.empty() ? instruction : instruction + "\n\n" + input));
  messages.push_back(message("assistant", output));
  return messages;
}

std::string sharegpt_role(const std::string& from, const std::string& which) {
  if (from == "human" || from == "user") return "user";
  if (from == "gpt" || from == "assistant") return "assistant";
  if (from == "system") return "system";
  throw BadExample("unknown role", which + ": from '" + from + "' is not human/gpt/system (or user/assistant)");
}

json sharegpt(const json& r) {
  const json& turns = r["conversations"];
  if (!turns.is_array()) throw BadExample("bad record", "ShareGPT record: \"conversations\" is not an array");
  json messages = json::array();
  const std::string system = string_of(r, "system", "ShareGPT record", true);
  if (!system.empty()) messages.push_back(message("system", system));
  for (size_t i = 0; i < turns.size(); ++i) {
    const std::string which = "ShareGPT turn " + std::to_string(i + 1);
    const json& t = turns[i];
    if (!t.is_object()) throw BadExample("bad record", which + " is not an object");
    const bool role_form = !t.contains("from") && t.contains("role");  // {"role", "content"} turns
    const std::string from = string_of(t, role_form ? "role" : "from", which, false);
    messages.push_back(message(sharegpt_role(from, which), string_of(t, role_form ? "content" : "value", which, false)));
  }
  return messages;
}

}  // namespace

std::optional<json> to_messages_record(const json& record) {
  if (!record.is_object() || record.contains("messages")) return std::nullopt;
  if (record.contains("conversation") && record["conversation"].is_array()) {  // lmsys-chat-1m
    json out = record;
    out["messages"] = record["conversation"];
    return out;
  }
  if (record.contains("conversations")) return json{{"messages", sharegpt(record)}};
  if (record.contains("instruction")) return json{{"messages", alpaca(record)}};
  return std::nullopt;
}

bool has_record_field(const nlohmann::json& value) {
  if (!value.is_object()) return false;
  for (const char* key : {"messages", "conversations", "conversation", "instruction", "prompt", "completion", "text", "chosen",
                          "rejected"})
    if (value.contains(key)) return true;
  return false;
}

}  // namespace tessera::text
