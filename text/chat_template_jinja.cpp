// data.chat_template auto: the model's own Jinja chat template (chat_template.h), its special
// tokens and its targets.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "text/chat_template.h"
#include "text/jinja/template.h"
#include "util/error.h"
#include "util/json.h"

namespace tessera::text {

namespace fs = std::filesystem;
using Spans = std::vector<std::pair<size_t, size_t>>;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  TESSERA_CHECK_INPUT(in.good(), "cannot read " + p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A special-token field: "<s>" or an AddedToken object {"content": "<s>", ...}; nullopt for null.
std::optional<std::string> token_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

// The "chat_template" field: a string, or a list of {name, template} ("default" is taken).
std::optional<std::string> template_field(const nlohmann::json& j, const std::string& path) {
  if (!j.contains("chat_template") || j["chat_template"].is_null()) return std::nullopt;
  const auto& t = j["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  TESSERA_CHECK_INPUT(t.is_array(), path + ": chat_template is neither a string nor a list of {name, template}");
  for (const auto& e : t)
    if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
      return e["template"].get<std::string>();
  throw TESSERA_INPUT_ERROR(path + ": chat_template is a list without a \"default\" template; set data.chat_template");
}

void collect_specials(const nlohmann::json& j, ModelChatTemplate& m) {
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"})
    if (j.contains(key))
      if (auto t = token_text(j[key])) m.special_tokens.push_back(*t);
  if (j.contains("additional_special_tokens") && j["additional_special_tokens"].is_array())
    for (const auto& v : j["additional_special_tokens"])
      if (auto t = token_text(v)) m.special_tokens.push_back(*t);
  m.control_tokens = m.special_tokens;
  if (j.contains("added_tokens_decoder") && j["added_tokens_decoder"].is_object())
    for (const auto& [id, v] : j["added_tokens_decoder"].items())
      if (auto t = token_text(v)) {
        m.special_tokens.push_back(*t);
        if (v.is_object() && v.value("special", false)) m.control_tokens.push_back(*t);
      }
  if (j.contains("bos_token")) m.bos_token = token_text(j["bos_token"]);
  if (j.contains("eos_token")) m.eos_token = token_text(j["eos_token"]);
}

}  // namespace

std::optional<ModelChatTemplate> read_model_chat_template(const std::string& tokenizer_config_json) {
  std::error_code ec;
  const fs::path path(tokenizer_config_json);
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  nlohmann::json j;
  try {
    j = util::parse_json(read_text(path));
  } catch (const nlohmann::json::exception& e) {
    throw TESSERA_INPUT_ERROR(path.string() + " is not valid JSON (" + e.what() + ")");
  }
  TESSERA_CHECK_INPUT(j.is_object(), path.string() + " is not a JSON object");
  ModelChatTemplate m;
  collect_specials(j, m);
  if (auto t = template_field(j, path.string())) {
    m.source = *t;
    m.origin = path.string();
    return m;
  }
  const fs::path beside = path.parent_path() / "chat_template.jinja";  // transformers >= 4.43 saves it apart
  if (!fs::is_regular_file(beside, ec)) return std::nullopt;
  m.source = read_text(beside);
  m.origin = beside.string();
  return m;
}

namespace {

using nlohmann::ordered_json;

size_t common_prefix(const std::string& a, const std::string& b) {
  const size_t n = std::min(a.size(), b.size());
  return static_cast<size_t>(std::mismatch(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(n), b.begin()).first - a.begin());
}

bool is_prefix(const std::string& prefix, const std::string& s) { return s.compare(0, prefix.size(), prefix) == 0; }

// The message rendered after message i to find where turn i ends: the next message with its content
// replaced (so the two renders part at that content), or after the last message a user message.
ordered_json probe_after(const Conversation& c, size_t i) {
  ordered_json probe = i + 1 < c.messages.size() ? c.messages[i + 1].raw : ordered_json{{"role", "user"}};
  probe["content"] = "\x01";
  return probe;
}

class JinjaTemplate final : public ChatTemplate {
 public:
  explicit JinjaTemplate(const ModelChatTemplate& m) : model_(m), tpl_(m.source, m.origin) {
    for (const std::string& t : m.control_tokens)
      if (!t.empty()) control_[t[0]].push_back(t);
  }
  std::string name() const override { return "auto"; }
  void check(const Tokenizer& tok) const override {
    for (const auto& t : {model_.bos_token, model_.eos_token})
      TESSERA_CHECK_INPUT(!t || t->empty() || tok.special_id(*t).has_value(),
                          "the chat template of " + model_.origin + " writes the special token " + *t + ", which tokenizer " +
                              tok.name() + " does not have: use the model's own tokenizer, or set data.chat_template");
  }
  Example render(const Conversation& conversation, const Tokenizer& tok) const override;
  bool renders_tools() const override { return true; }
  std::vector<int32_t> render_prompt(const Conversation& conversation, const Tokenizer& tok) const override {
    return tokenize(run(conversation, conversation.messages.size(), true).text, {}, tok).tokens;
  }

 private:
  jinja::Rendered run(const Conversation& c, size_t n, bool generation_prompt, const ordered_json* next = nullptr) const;
  Spans assistant_spans(const Conversation& c, const std::string& full) const;
  std::optional<size_t> turn_end(const Conversation& c, size_t i, const std::string& full, size_t start) const;
  std::optional<size_t> closing_end(const std::string& text, size_t from, size_t agree) const;
  size_t control_at(const std::string& text, size_t k) const;
  Example tokenize(const std::string& text, const Spans& spans, const Tokenizer& tok) const;

  ModelChatTemplate model_;
  jinja::Template tpl_;
  std::map<char, std::vector<std::string>> control_;  // the control tokens by first byte
};

// Renders messages[:n] (then `next`, when given), as transformers does: the messages as written,
// the record's tools.
jinja::Rendered JinjaTemplate::run(const Conversation& c, size_t n, bool generation_prompt, const ordered_json* next) const {
  jinja::List list;
  for (size_t i = 0; i < n; ++i) list.push_back(jinja::from_json(c.messages[i].raw));
  if (next) list.push_back(jinja::from_json(*next));
  jinja::Context ctx = {{"messages", jinja::Value::make_list(std::move(list))},
                        {"add_generation_prompt", jinja::Value::boolean(generation_prompt)},
                        {"tools", c.tools.is_null() ? jinja::Value::none() : jinja::from_json(c.tools)},
                        {"documents", jinja::Value::none()}};
  if (model_.bos_token) ctx.emplace_back("bos_token", jinja::Value::str(*model_.bos_token));
  if (model_.eos_token) ctx.emplace_back("eos_token", jinja::Value::str(*model_.eos_token));
  try {
    return tpl_.render(ctx);
  } catch (const jinja::TemplateError& e) {
    throw BadExample("template error", std::string("the chat template of ") + model_.origin + " raised: " + e.what());
  }
}

Spans JinjaTemplate::assistant_spans(const Conversation& c, const std::string& full) const {
  Spans spans;
  for (size_t i = 0; i < c.messages.size(); ++i) {
    if (c.messages[i].role != "assistant") continue;
    const std::string prompt = run(c, i, true).text;
    const size_t start = common_prefix(prompt, full);
    // A generation prompt that W does not continue may only part from it after what comes before
    // the turn (the render of messages[:i]): the turn never takes an earlier message's text.
    bool before_ok = start == prompt.size();
    if (!before_ok) {
      const std::string before = run(c, i, false).text;
      before_ok = is_prefix(before, full) && start >= before.size();
    }
    const std::optional<size_t> end = before_ok ? turn_end(c, i, full, start) : std::nullopt;
    if (!end || *end <= start)
      throw BadExample("template mask", "cannot locate the assistant turn of message " + std::to_string(i + 1) +
                                            " in the render of " + model_.origin +
                                            ": its start is not after the messages before it, or no turn-closing "
                                            "special token follows it where the renders with and without the next "
                                            "message agree; add {% generation %} markers to the "
                                            "template, or set data.chat_template to a built-in");
    spans.emplace_back(start, *end);
  }
  return spans;
}

// Where assistant turn i, starting at `start` of the whole render, ends (chat_template.h, ITS TARGETS).
std::optional<size_t> JinjaTemplate::turn_end(const Conversation& c, size_t i, const std::string& full, size_t start) const {
  const bool last = i + 1 == c.messages.size();
  const std::string turn = last ? full : run(c, i + 1, false).text;
  if (!last && is_prefix(turn, full)) return turn.size();
  // The last turn: the whole render, unless the template appends to every render (it ignores
  // add_generation_prompt, and a next message does not follow the render as it is).
  if (last && run(c, i + 1, true).text != full) return turn.size();
  const ordered_json probe = probe_after(c, i);
  std::string next;
  try {
    next = run(c, i + 1, false, &probe).text;
  } catch (const BadExample&) {
    if (last) return turn.size();
    throw;
  }
  if (last && is_prefix(turn, next)) return turn.size();
  return closing_end(full, start, common_prefix(next, full));
}

// The length of the control token (chat_template.h) at text[k], 0 when none starts there.
size_t JinjaTemplate::control_at(const std::string& text, size_t k) const {
  const auto it = control_.find(text[k]);
  size_t best = 0;
  if (it != control_.end())
    for (const std::string& t : it->second)
      if (t.size() > best && text.compare(k, t.size(), t) == 0) best = t.size();
  return best;
}

// After the first control token in text[from, agree) followed, after whitespace, by another control
// token or by `agree`; and after that whitespace.
std::optional<size_t> JinjaTemplate::closing_end(const std::string& text, size_t from, size_t agree) const {
  for (size_t k = from; k < agree; ++k) {
    const size_t len = control_at(text, k);
    if (len == 0 || k + len > agree) continue;
    size_t e = k + len;
    while (e < agree && std::isspace(static_cast<unsigned char>(text[e]))) ++e;
    if (e == agree || control_at(text, e) > 0) return e;
  }
  return std::nullopt;
}

Example JinjaTemplate::render(const Conversation& conversation, const Tokenizer& tok) const {
  const jinja::Rendered full = run(conversation, conversation.messages.size(), false);
  return tokenize(full.text, tpl_.has_generation() ? full.generation : assistant_spans(conversation, full.text), tok);
}

// Whether byte `at` of the text lies in one of the (sorted) spans.
bool in_spans(const Spans& spans, size_t at) {
  return std::any_of(spans.begin(), spans.end(), [&](const auto& s) { return at >= s.first && at < s.second; });
}

// Appends the tokens of text[b, e) (no special tokens in it), each a target when it starts in a span.
void append_text(Example& ex, const Tokenizer& tok, const std::string& text, size_t b, size_t e, const Spans& spans) {
  if (b >= e) return;
  const std::string piece = text.substr(b, e - b);
  std::vector<size_t> cuts;  // offsets in `piece` where the target flag changes
  for (size_t k = 1; k < piece.size(); ++k)
    if (in_spans(spans, b + k) != in_spans(spans, b + k - 1)) cuts.push_back(k);
  std::vector<int32_t> ids = tok.encode(piece);
  size_t from = 0, offset = 0;
  for (size_t c = 0; c <= cuts.size(); ++c) {
    const size_t upto = c < cuts.size() ? encode_with_prefix(tok, piece.substr(0, cuts[c]), piece).second : ids.size();
    const bool target = in_spans(spans, b + offset);
    for (; from < upto; ++from) ex.append(ids[from], target);
    if (c < cuts.size()) offset = cuts[c];
  }
}

Example JinjaTemplate::tokenize(const std::string& text, const Spans& spans, const Tokenizer& tok) const {
  std::map<char, std::vector<std::pair<std::string, int32_t>>> specials;  // by first byte, longest first
  for (const std::string& s : model_.special_tokens)
    if (!s.empty())
      if (auto id = tok.special_id(s)) specials[s[0]].emplace_back(s, *id);
  for (auto& [c, list] : specials)
    std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  Example ex;
  size_t start = 0;  // of the text not yet appended
  for (size_t k = 0; k < text.size();) {
    auto it = specials.find(text[k]);
    const std::pair<std::string, int32_t>* hit = nullptr;
    if (it != specials.end())
      for (const auto& cand : it->second)
        if (text.compare(k, cand.first.size(), cand.first) == 0) {
          hit = &cand;
          break;
        }
    if (!hit) {
      ++k;
      continue;
    }
    append_text(ex, tok, text, start, k, spans);
    ex.append(hit->second, in_spans(spans, k));
    k += hit->first.size();
    start = k;
  }
  append_text(ex, tok, text, start, text.size(), spans);
  return ex;
}

}  // namespace

std::unique_ptr<ChatTemplate> make_model_chat_template(const ModelChatTemplate& model) {
  return std::make_unique<JinjaTemplate>(model);
}

std::string tokenizer_config_beside(const std::string& tokenizer_path) {
  if (tokenizer_path.empty() || tokenizer_path == "bytes") return "";
  std::error_code ec;
  const fs::path p(tokenizer_path);
  return ((fs::is_directory(p, ec) ? p : p.parent_path()) / "tokenizer_config.json").string();
}

ChatTemplateChoice choose_chat_template(ChatTemplateKind kind, const std::string& tokenizer_config_json) {
  if (kind != ChatTemplateKind::Auto) {
    auto chat = make_chat_template(kind);
    return {std::move(chat), util::name_of(chat_template_names(), kind) + " (data.chat_template)"};
  }
  if (tokenizer_config_json.empty())
    return {make_chat_template(ChatTemplateKind::Auto), "llama2 (auto: the tokenizer has no tokenizer_config.json beside it)"};
  if (auto model = read_model_chat_template(tokenizer_config_json))
    return {make_model_chat_template(*model), "the model's own (" + model->origin + ")"};
  std::error_code ec;
  const bool exists = fs::exists(tokenizer_config_json, ec);
  return {make_chat_template(ChatTemplateKind::Auto),
          "llama2 (auto: " + tokenizer_config_json + (exists ? " has no chat_template)" : " does not exist)")};
}

}  // namespace tessera::text
