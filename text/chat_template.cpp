#include "text/chat_template.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "text/records.h"
#include "util/error.h"
#include "util/parse_named.h"

namespace tessera::text {

void Example::append(int32_t id, bool is_target) {
  tokens.push_back(id);
  target.push_back(is_target ? 1 : 0);
}

void Example::append(const std::vector<int32_t>& ids, bool is_target) {
  tokens.insert(tokens.end(), ids.begin(), ids.end());
  target.insert(target.end(), ids.size(), is_target ? 1 : 0);
}

int64_t Example::num_targets() const { return std::count(target.begin(), target.end(), uint8_t(1)); }

namespace {

// Python's str.strip() on ASCII whitespace.
std::string strip(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// Appends encode(prefix + rest) with the prefix's tokens flagged `prefix_target` and the rest's
// flagged `rest_target`.
void append_split(Example& ex, const Tokenizer& tok, const std::string& prefix, const std::string& rest,
                  bool prefix_target, bool rest_target) {
  auto [ids, n] = encode_with_prefix(tok, prefix, prefix + rest);
  for (size_t i = 0; i < ids.size(); ++i) ex.append(ids[i], i < n ? prefix_target : rest_target);
}

class Llama2Template final : public ChatTemplate {
 public:
  // "auto" for data.chat_template auto without a model template (it renders as llama2).
  explicit Llama2Template(std::string name = "llama2") : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  void check(const Tokenizer& tok) const override {
    TESSERA_CHECK_INPUT(tok.bos_id() >= 0 && tok.eos_id() >= 0,
                        "data.chat_template llama2 needs BOS and EOS ids, and tokenizer " + tok.name() + " has none");
  }
  Example render(const Conversation& conversation, const Tokenizer& tok) const override {
    std::vector<Message> dialog = conversation.messages;
    if (dialog.front().role == "system") {  // folded into the first user message, as Meta does
      dialog[1].content = "<<SYS>>\n" + dialog[0].content + "\n<</SYS>>\n\n" + dialog[1].content;
      dialog.erase(dialog.begin());
    }
    Example ex;
    for (size_t i = 0; i < dialog.size(); i += 2) {
      const std::string prompt = "[INST] " + strip(dialog[i].content) + " [/INST]";
      ex.append(tok.bos_id(), false);
      if (i + 1 == dialog.size()) {  // a trailing user message: BOS, no EOS, no target
        ex.append(tok.encode(prompt), false);
        break;
      }
      append_split(ex, tok, prompt, " " + strip(dialog[i + 1].content) + " ", false, true);
      ex.append(tok.eos_id(), true);
    }
    return ex;
  }
  // The trailing user message renders as BOS + "[INST] ... [/INST]": the prompt.
  std::vector<int32_t> render_prompt(const Conversation& conversation, const Tokenizer& tok) const override {
    return render(conversation, tok).tokens;
  }

 private:
  std::string name_;
};

class Llama3Template final : public ChatTemplate {
 public:
  std::string name() const override { return "llama3"; }
  void check(const Tokenizer& tok) const override {
    for (const char* s : kSpecials)
      TESSERA_CHECK_INPUT(tok.special_id(s).has_value(), std::string("data.chat_template llama3 needs the special token ") +
                                                             s + ", and tokenizer " + tok.name() + " has none");
  }
  Example render(const Conversation& conversation, const Tokenizer& tok) const override {
    const std::vector<Message>& messages = conversation.messages;
    const int32_t begin = *tok.special_id(kSpecials[0]), start = *tok.special_id(kSpecials[1]),
                  end = *tok.special_id(kSpecials[2]), eot = *tok.special_id(kSpecials[3]);
    Example ex;
    ex.append(begin, false);
    for (const Message& m : messages) {
      const bool target = m.role == "assistant";
      ex.append(start, false);
      ex.append(tok.encode(m.role), false);
      ex.append(end, false);
      append_split(ex, tok, "\n\n", strip(m.content), false, target);
      ex.append(eot, target);
    }
    return ex;
  }
  std::vector<int32_t> render_prompt(const Conversation& conversation, const Tokenizer& tok) const override {
    Example ex = render(conversation, tok);
    ex.append(*tok.special_id(kSpecials[1]), false);
    ex.append(tok.encode("assistant"), false);
    ex.append(*tok.special_id(kSpecials[2]), false);
    ex.append(tok.encode("\n\n"), false);
    return ex.tokens;
  }

 private:
  static constexpr const char* kSpecials[4] = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                                               "<|eot_id|>"};
};

class NoTemplate final : public ChatTemplate {
 public:
  std::string name() const override { return "none"; }
  void check(const Tokenizer&) const override {}
  Example render(const Conversation& conversation, const Tokenizer& tok) const override {
    const std::vector<Message>& messages = conversation.messages;
    Example ex;
    if (tok.bos_id() >= 0) ex.append(tok.bos_id(), false);
    for (const Message& m : messages) ex.append(tok.encode(m.content), m.role == "assistant");
    if (tok.eos_id() >= 0) ex.append(tok.eos_id(), messages.back().role == "assistant");
    return ex;
  }
  std::vector<int32_t> render_prompt(const Conversation& conversation, const Tokenizer& tok) const override {
    std::vector<int32_t> ids = render(conversation, tok).tokens;
    if (tok.eos_id() >= 0) ids.pop_back();  // the answer comes where the end of sequence would
    return ids;
  }
};

using nlohmann::ordered_json;

const std::string& string_field(const ordered_json& record, const char* key) {
  const auto& v = record.at(key);
  if (!v.is_string()) throw BadExample("bad record", std::string("field \"") + key + "\" is not a string");
  return v.get_ref<const std::string&>();
}

bool is_tool_result(const std::string& role) { return role == "tool" || role == "ipython"; }

// One message: role, content (a string; null or absent beside tool_calls; an object or list in a
// tool result) and tool_calls (a list of objects), kept as written for the model's template.
Message parse_message(const ordered_json& m, const std::string& which) {
  if (!m.is_object() || !m.contains("role")) throw BadExample("bad record", which + " is not an object with \"role\" and \"content\"");
  if (!m["role"].is_string()) throw BadExample("bad record", which + ": \"role\" is not a string");
  Message out{m["role"].get<std::string>(), "", m, false};
  if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
    const auto& calls = m["tool_calls"];
    if (!calls.is_array() || std::any_of(calls.begin(), calls.end(), [](const auto& c) { return !c.is_object(); }))
      throw BadExample("bad record", which + ": \"tool_calls\" is not a list of objects");
    out.tool_calls = !calls.empty();
  }
  const ordered_json* content = m.contains("content") ? &m["content"] : nullptr;
  if (content && content->is_string()) out.content = content->get<std::string>();
  else if (out.tool_calls && (!content || content->is_null())) {
  } else if (is_tool_result(out.role) && content && (content->is_object() || content->is_array())) {
  } else if (!content) {
    throw BadExample("bad record", which + " is not an object with \"role\" and \"content\"");
  } else {
    throw BadExample("bad record", which + ": \"content\" is not a string" +
                                       std::string(out.tool_calls ? " or null" : is_tool_result(out.role) ? ", object or list" : ""));
  }
  return out;
}

// The record's "tools": a list of JSON objects, or null. Anything else loses the tools of every
// record: FatalRecord.
ordered_json parse_tools(const ordered_json& record) {
  if (!record.contains("tools") || record["tools"].is_null()) return nullptr;
  const auto& tools = record["tools"];
  if (!tools.is_array())
    throw FatalRecord(std::string("key \"tools\" is a ") + tools.type_name() +
                      ", not a list of JSON objects (a tool's {\"type\": \"function\", \"function\": {...}})" +
                      (tools.is_string() ? ": it holds JSON text? parse it (json.loads) when writing the data" : ""));
  for (size_t i = 0; i < tools.size(); ++i)
    if (!tools[i].is_object())
      throw FatalRecord("key \"tools\" entry " + std::to_string(i + 1) + " is a " + tools[i].type_name() +
                        ", not a JSON object (a tool's {\"type\": \"function\", \"function\": {...}})" +
                        (tools[i].is_string() ? ": it holds JSON text? parse it (json.loads) when writing the data" : ""));
  return tools;
}

Conversation parse_conversation(const ordered_json& record) {
  const auto& j = record["messages"];
  if (!j.is_array()) throw BadExample("bad record", "field \"messages\" is not an array");
  Conversation out;
  for (size_t i = 0; i < j.size(); ++i) out.messages.push_back(parse_message(j[i], "message " + std::to_string(i + 1)));
  out.tools = parse_tools(record);
  return out;
}

// The role expected after `prev` ("" at the start, after an optional system message).
bool may_follow(const std::string& prev, const std::string& role) {
  if (prev.empty()) return role == "user";
  if (prev == "user") return role == "assistant";
  if (prev == "assistant") return role == "user" || is_tool_result(role);
  return role == "assistant" || role == "user" || is_tool_result(role);  // after a tool result
}

}  // namespace

std::pair<std::vector<int32_t>, size_t> encode_with_prefix(const Tokenizer& tok, const std::string& prefix,
                                                          const std::string& full) {
  std::vector<int32_t> ids = tok.encode(full);
  const std::vector<int32_t> head = tok.encode(prefix);
  size_t n = 0;
  while (n < head.size() && n < ids.size() && head[n] == ids[n]) ++n;
  return {std::move(ids), n};
}

bool Conversation::uses_tools() const {
  return !tools.is_null() || std::any_of(messages.begin(), messages.end(), [](const Message& m) {
           const auto content = m.raw.find("content");
           return m.tool_calls || is_tool_result(m.role) || content == m.raw.end() || !content->is_string();
         });
}

namespace {
// The roles of check_conversation; whether an assistant message is among them.
bool check_roles(const Conversation& conversation) {
  const std::vector<Message>& messages = conversation.messages;
  if (messages.empty()) throw BadExample("no target tokens", "no target tokens: empty conversation (no messages)");
  const bool system = messages[0].role == "system";
  bool any_assistant = false;
  std::string prev;
  for (size_t i = system ? 1 : 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    const std::string which = "message " + std::to_string(i + 1);
    if (role != "system" && role != "user" && role != "assistant" && !is_tool_result(role))
      throw BadExample("unknown role", which + " has unknown role \"" + role +
                                           "\" (expected system, user, assistant, or tool / ipython for tool results)");
    if (role == "system") throw BadExample("roles do not alternate", which + " is a system message; only the first message may be");
    if (!may_follow(prev, role)) {
      if (is_tool_result(role))
        throw BadExample("roles do not alternate", which + " is a tool result (\"" + role +
                                                       "\") that follows no assistant message (tool results answer an assistant's tool calls)");
      const std::string expected = prev == "user" ? "assistant" : "user";
      throw BadExample("roles do not alternate", which + " is \"" + role + "\" where \"" + expected +
                                                     "\" was expected: roles must alternate user/assistant, starting with user (after an optional "
                                                     "system message; tool results may follow an assistant)");
    }
    any_assistant |= role == "assistant";
    prev = role;
  }
  return any_assistant;
}
}  // namespace

void check_conversation(const Conversation& conversation) {
  if (!check_roles(conversation))
    throw BadExample("no target tokens", "no target tokens: the conversation has no assistant message");
}

void check_prompt(const Conversation& conversation) {
  check_roles(conversation);
  const std::string& last = conversation.messages.back().role;
  if (last != "user" && !is_tool_result(last))
    throw BadExample("not a prompt", "the last message is \"" + last + "\": a prompt to answer ends with a user message "
                                     "or tool results");
}

std::vector<int32_t> render_prompt_record(const ordered_json& record, const Tokenizer& tok, const ChatTemplate& chat) {
  if (!record.is_object()) throw BadExample("bad record", "expected a JSON object, got " + std::string(record.type_name()));
  if (record.contains("messages")) {
    const Conversation conversation = parse_conversation(record);
    check_prompt(conversation);
    if (conversation.uses_tools() && !chat.renders_tools())
      throw BadExample("tool use", "tools, tool calls or tool results need the model's own chat template; the built-in " +
                                       chat.name() + " cannot render them");
    return chat.render_prompt(conversation, tok);
  }
  if (!record.contains("prompt")) throw BadExample("bad record", "no \"messages\" or \"prompt\" field");
  std::vector<int32_t> ids;
  if (tok.bos_id() >= 0) ids.push_back(tok.bos_id());
  const std::vector<int32_t> text = tok.encode(string_field(record, "prompt"));
  ids.insert(ids.end(), text.begin(), text.end());
  return ids;
}

std::unique_ptr<ChatTemplate> make_chat_template(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::Auto: return std::make_unique<Llama2Template>("auto");
    case ChatTemplateKind::Llama2: return std::make_unique<Llama2Template>();
    case ChatTemplateKind::Llama3: return std::make_unique<Llama3Template>();
    case ChatTemplateKind::None: return std::make_unique<NoTemplate>();
  }
  TESSERA_CHECK(false, "chat template kind " + std::to_string(static_cast<int>(kind)));
  return nullptr;
}

std::unique_ptr<ChatTemplate> make_chat_template(const std::string& name) {
  return make_chat_template(util::parse_named<ChatTemplateKind>(chat_template_names(), name, "data.chat_template"));
}

Example render_record(const ordered_json& record, const Tokenizer& tok, const ChatTemplate& chat) {
  if (auto m = to_messages_record(record)) return render_record(*m, tok, chat);  // Alpaca, ShareGPT, lmsys (records.h)
  if (!record.is_object()) throw BadExample("bad record", "expected a JSON object, got " + std::string(record.type_name()));
  Example ex;
  if (record.contains("messages")) {
    const Conversation conversation = parse_conversation(record);
    check_conversation(conversation);
    if (conversation.uses_tools() && !chat.renders_tools())
      throw BadExample("tool use", "tools, tool calls or tool results need the model's own chat template "
                                   "(data.chat_template auto, with a tokenizer_config.json that has one); the built-in " +
                                       chat.name() + " cannot render them");
    ex = chat.render(conversation, tok);
  } else if ((record.contains("chosen") || record.contains("rejected")) && !record.contains("completion")) {
    throw BadExample("preference record", "a preference record (chosen/rejected): Tessera does not do preference training; "
                                          "convert \"chosen\" to \"messages\" or \"completion\" to fine-tune on it");
  } else if (record.contains("prompt") || record.contains("completion")) {
    if (!record.contains("prompt") || !record.contains("completion"))
      throw BadExample("bad record", std::string("field \"") + (record.contains("prompt") ? "completion" : "prompt") +
                       "\" is missing (prompt/completion records need both)");
    const std::string& prompt = string_field(record, "prompt");
    const std::string& completion = string_field(record, "completion");
    if (tok.bos_id() >= 0) ex.append(tok.bos_id(), false);
    append_split(ex, tok, prompt, completion, false, true);
    if (tok.eos_id() >= 0) ex.append(tok.eos_id(), true);
  } else if (record.contains("text")) {
    const std::string& text = string_field(record, "text");
    ex.text = true;
    if (text.empty()) return ex;
    if (tok.bos_id() >= 0) ex.append(tok.bos_id(), true);
    ex.append(tok.encode(text), true);
    if (tok.eos_id() >= 0) ex.append(tok.eos_id(), true);
    return ex;
  } else {
    throw BadExample("bad record", "no \"messages\", \"prompt\"/\"completion\" or \"text\" field");
  }
  if (ex.num_targets() == 0) throw BadExample("no target tokens", "no target tokens");
  return ex;
}

}  // namespace tessera::text
