// data.chat_template auto: the model's own Jinja chat template (chat_template.h), its special
// tokens and its targets.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "runtime/data/chat_template.h"
#include "runtime/data/jinja.h"
#include "runtime/error.h"
#include "util/json.h"

namespace tessera::data {

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
  if (j.contains("added_tokens_decoder") && j["added_tokens_decoder"].is_object())
    for (const auto& [id, v] : j["added_tokens_decoder"].items())
      if (auto t = token_text(v)) m.special_tokens.push_back(*t);
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

class JinjaTemplate final : public ChatTemplate {
 public:
  explicit JinjaTemplate(const ModelChatTemplate& m) : model_(m), tpl_(m.source, m.origin) {}
  std::string name() const override { return "auto"; }
  void check(const Tokenizer& tok) const override {
    for (const auto& t : {model_.bos_token, model_.eos_token})
      TESSERA_CHECK_INPUT(!t || t->empty() || tok.special_id(*t).has_value(),
                          "the chat template of " + model_.origin + " writes the special token " + *t + ", which tokenizer " +
                              tok.name() + " does not have: use the model's own tokenizer, or set data.chat_template");
  }
  Example render(const std::vector<Message>& messages, const Tokenizer& tok) const override;

 private:
  jinja::Rendered run(const std::vector<Message>& messages, size_t n, bool generation_prompt) const;
  Spans assistant_spans(const std::vector<Message>& messages, const std::string& full) const;
  Example tokenize(const std::string& text, const Spans& spans, const Tokenizer& tok) const;

  ModelChatTemplate model_;
  jinja::Template tpl_;
};

jinja::Rendered JinjaTemplate::run(const std::vector<Message>& messages, size_t n, bool generation_prompt) const {
  jinja::List list;
  for (size_t i = 0; i < n; ++i) {
    jinja::Value m = jinja::Value::make_dict();
    m.dict->set("role", jinja::Value::str(messages[i].role));
    m.dict->set("content", jinja::Value::str(messages[i].content));
    list.push_back(m);
  }
  jinja::Context ctx = {{"messages", jinja::Value::make_list(std::move(list))},
                        {"add_generation_prompt", jinja::Value::boolean(generation_prompt)},
                        {"tools", jinja::Value::none()},
                        {"documents", jinja::Value::none()}};
  if (model_.bos_token) ctx.emplace_back("bos_token", jinja::Value::str(*model_.bos_token));
  if (model_.eos_token) ctx.emplace_back("eos_token", jinja::Value::str(*model_.eos_token));
  try {
    return tpl_.render(ctx);
  } catch (const jinja::TemplateError& e) {
    throw BadExample("template error", std::string("the chat template of ") + model_.origin + " raised: " + e.what());
  }
}

Spans JinjaTemplate::assistant_spans(const std::vector<Message>& messages, const std::string& full) const {
  Spans spans;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "assistant") continue;
    const std::string prompt = run(messages, i, true).text, turn = run(messages, i + 1, false).text;
    const std::string which = "message " + std::to_string(i + 1);
    if (turn.compare(0, prompt.size(), prompt) != 0 || full.compare(0, turn.size(), turn) != 0)
      throw BadExample("template mask", "cannot locate the assistant turn of " + which + " in the render of " + model_.origin +
                                            ": the render up to it (with add_generation_prompt) is not a prefix of the "
                                            "render that includes it, or that of the whole conversation; add {% generation %} "
                                            "markers to the template, or set data.chat_template to a built-in");
    if (turn.size() > prompt.size()) spans.emplace_back(prompt.size(), turn.size());
  }
  return spans;
}

Example JinjaTemplate::render(const std::vector<Message>& messages, const Tokenizer& tok) const {
  const jinja::Rendered full = run(messages, messages.size(), false);
  return tokenize(full.text, tpl_.has_generation() ? full.generation : assistant_spans(messages, full.text), tok);
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

}  // namespace tessera::data
