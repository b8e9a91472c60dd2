#include "launcher/cmd_chat_template.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "launcher/cli.h"
#include "text/chat_template.h"
#include "text/jinja/template.h"
#include "util/error.h"
#include "util/json.h"

namespace tessera::launcher {

namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

std::string read_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  TESSERA_CHECK_INPUT(in.good(), what + " " + path + " cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// --template: a model directory or tokenizer_config.json (its template and bos/eos), or a Jinja file.
text::ModelChatTemplate load_template(const std::string& path) {
  std::error_code ec;
  const std::string config = fs::is_directory(path, ec) ? (fs::path(path) / "tokenizer_config.json").string() : path;
  if (fs::path(config).extension() == ".json") {
    auto m = text::read_model_chat_template(config);
    TESSERA_CHECK_INPUT(m.has_value(), "--template " + config + " does not exist or names no chat_template");
    return *m;
  }
  text::ModelChatTemplate m;
  m.source = read_file(path, "--template");
  m.origin = path;
  return m;
}

// The conversations of --messages: a JSON object {"messages": [...], other variables}, a JSON array
// of messages, or (*.jsonl) one object per line.
std::vector<ordered_json> load_conversations(const std::string& path) {
  const std::string text = read_file(path, "--messages");
  std::vector<ordered_json> out;
  auto add = [&](ordered_json j, const std::string& where) {
    if (j.is_array()) j = ordered_json{{"messages", j}};
    TESSERA_CHECK_INPUT(j.is_object() && j.contains("messages") && j["messages"].is_array(),
                        "--messages " + where + ": expected {\"messages\": [...], ...} or an array of messages");
    out.push_back(std::move(j));
  };
  try {
    if (fs::path(path).extension() != ".jsonl") {
      add(util::parse_json<ordered_json>(text), path);
      return out;
    }
    std::istringstream lines(text);
    std::string line;
    for (int n = 1; std::getline(lines, line); ++n)
      if (line.find_first_not_of(" \t\r") != std::string::npos) add(util::parse_json<ordered_json>(line), path + " line " + std::to_string(n));
  } catch (const nlohmann::json::parse_error& e) {
    throw TESSERA_INPUT_ERROR("--messages " + path + " is not valid JSON: " + e.what());
  }
  return out;
}

std::string render(const text::jinja::Template& tpl, const text::ModelChatTemplate& m, const ordered_json& conv,
                   bool generation_prompt) {
  // Later entries win: the conversation's own variables override the defaults.
  text::jinja::Context ctx = {{"tools", text::jinja::Value::none()},
                              {"documents", text::jinja::Value::none()},
                              {"add_generation_prompt", text::jinja::Value::boolean(generation_prompt)}};
  if (m.bos_token) ctx.emplace_back("bos_token", text::jinja::Value::str(*m.bos_token));
  if (m.eos_token) ctx.emplace_back("eos_token", text::jinja::Value::str(*m.eos_token));
  for (auto it = conv.begin(); it != conv.end(); ++it) ctx.emplace_back(it.key(), text::jinja::from_json(it.value()));
  try {
    return tpl.render(ctx).text;
  } catch (const text::jinja::TemplateError& e) {
    throw TESSERA_INPUT_ERROR("chat template " + m.origin + " raised: " + e.what());
  }
}

}  // namespace

int run_chat_template(const std::vector<std::string>& args) {
  po::options_description desc("Options");
  desc.add_options()
      ("action", po::value<std::string>()->required(), "render (the only action)")
      ("template", po::value<std::vector<std::string>>()->required()->composing(),
       "a model directory or its tokenizer_config.json (chat_template, bos_token, eos_token), or a Jinja file; "
       "repeatable: every conversation is rendered with each template in turn")
      ("messages", po::value<std::string>()->required(),
       "JSON {\"messages\": [...], other template variables} or an array of messages; *.jsonl: one per line, each "
       "render followed by a NUL byte")
      ("add-generation-prompt", po::bool_switch(),
       "end with the assistant's header (add_generation_prompt=True, unless the conversation sets it)")
      ("bos-token", po::value<std::string>(), "bos_token of a template that has none of its own (a Jinja file)")
      ("eos-token", po::value<std::string>(), "eos_token of a template that has none of its own (a Jinja file)");
  po::positional_options_description pos;
  pos.add("action", 1);
  const auto vm = parse_command(
      "tessera chat-template render --template DIR|tokenizer_config.json|FILE.jinja --messages FILE.json[l] "
      "[--add-generation-prompt] [--bos-token S] [--eos-token S]",
      desc, args, &pos);
  if (!vm) return 0;
  const std::string action = (*vm)["action"].as<std::string>();
  TESSERA_CHECK_INPUT(action == "render", "chat-template: unknown action '" + action + "' (the action is render)");
  const std::string messages = (*vm)["messages"].as<std::string>();
  const auto conversations = load_conversations(messages);
  const bool jsonl = fs::path(messages).extension() == ".jsonl";
  std::string out;
  for (const auto& path : (*vm)["template"].as<std::vector<std::string>>()) {
    text::ModelChatTemplate m = load_template(path);
    if (!m.bos_token && vm->count("bos-token")) m.bos_token = (*vm)["bos-token"].as<std::string>();
    if (!m.eos_token && vm->count("eos-token")) m.eos_token = (*vm)["eos-token"].as<std::string>();
    const text::jinja::Template tpl(m.source, m.origin);
    for (const auto& conv : conversations) {
      out += render(tpl, m, conv, (*vm)["add-generation-prompt"].as<bool>());
      if (jsonl) out += '\0';
    }
  }
  std::cout.write(out.data(), static_cast<std::streamsize>(out.size()));
  std::cout.flush();
  return 0;
}

}  // namespace tessera::launcher
