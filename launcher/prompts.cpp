#include "launcher/prompts.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "launcher/config.h"
#include "util/error.h"
#include "util/json.h"

namespace tessera::launcher {

namespace fs = std::filesystem;

std::vector<int64_t> with_bos(const text::Tokenizer& tok, const std::string& text) {
  std::vector<int64_t> ids;
  if (tok.bos_id() >= 0) ids.push_back(tok.bos_id());
  for (int32_t id : tok.encode(text)) ids.push_back(id);
  return ids;
}

std::vector<Prompt> read_prompt_file(const std::string& path, const std::string& key, const text::Tokenizer& tok,
                                     const ChatFor& chat) {
  std::ifstream in(path);
  TESSERA_CHECK_INPUT(in.good(), key + " " + path + ": cannot open");
  const std::unique_ptr<text::ChatTemplate> plain = text::make_chat_template(text::ChatTemplateKind::None);
  const text::ChatTemplate* template_ = nullptr;  // chat's, from the first messages record on
  std::vector<Prompt> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    nlohmann::ordered_json record;
    try {
      record = util::parse_json<nlohmann::ordered_json>(line);
    } catch (const nlohmann::json::exception& e) {
      throw TESSERA_INPUT_ERROR(where + ": invalid JSON (" + e.what() + ")");
    }
    if (record.is_object() && record.contains("messages") && !template_) template_ = &chat(where);
    try {
      const std::vector<int32_t> ids = text::render_prompt_record(record, tok, template_ ? *template_ : *plain);
      out.push_back({std::vector<int64_t>(ids.begin(), ids.end()), where});
    } catch (const text::BadExample& e) {
      throw TESSERA_INPUT_ERROR(where + ": " + e.what());
    }
  }
  TESSERA_CHECK_INPUT(!out.empty(), key + " " + path + " holds no prompt");
  return out;
}

void check_prompt_lengths(const std::vector<Prompt>& prompts, int64_t max_new, const std::string& max_new_key,
                          const model::ModelConfig& mc, const std::string& model_name) {
  const int64_t limit = mc.max_position_embeddings;
  for (const Prompt& p : prompts) {
    TESSERA_CHECK_INPUT(!p.ids.empty(), p.where + ": the prompt has no tokens");
    const int64_t total = static_cast<int64_t>(p.ids.size()) + max_new;
    TESSERA_CHECK_INPUT(total <= limit, p.where + ": the prompt's " + std::to_string(p.ids.size()) + " tokens + " +
                                            max_new_key + " " + std::to_string(max_new) + " = " + std::to_string(total) +
                                            " exceed the model's max_position_embeddings " + std::to_string(limit) +
                                            " (" + model_name + ")");
  }
}

std::vector<int64_t> eos_ids(const model::ModelConfig& mc, const std::string& model_dir) {
  std::vector<int64_t> ids = mc.eos_token_ids;
  std::error_code ec;
  const fs::path gen = fs::path(model_dir) / "generation_config.json";
  if (model_dir.empty() || !fs::is_regular_file(gen, ec)) return ids;
  const nlohmann::json j = read_json_file(gen.string());
  const nlohmann::json e = j.is_object() ? j.value("eos_token_id", nlohmann::json()) : nlohmann::json();
  for (const auto& id : e.is_array() ? e : nlohmann::json::array({e}))
    if (id.is_number_integer() && std::find(ids.begin(), ids.end(), id.get<int64_t>()) == ids.end())
      ids.push_back(id.get<int64_t>());
  return ids;
}

std::string text_of(const text::Tokenizer& tok, std::vector<int64_t> ids, bool ends_with_eos) {
  if (ends_with_eos && !ids.empty()) ids.pop_back();
  std::vector<int32_t> known;
  for (int64_t id : ids)
    if (id < tok.vocab_size()) known.push_back(static_cast<int32_t>(id));
  return tok.decode(known);
}

}  // namespace tessera::launcher
