// `tessera chat-template render`: renders a chat template (a model's tokenizer_config.json, its
// directory, or a Jinja file) on a conversation with the renderer `data.chat_template = auto` trains
// with (text/jinja/template.h), so that it can be compared with Hugging Face's apply_chat_template
// (tests/unit/chat_template_hf.sh does, byte for byte).
#pragma once
#include <string>
#include <vector>

namespace tessera::launcher {

// args: everything after "chat-template". Returns the exit code; bad input throws Error(Input).
int run_chat_template(const std::vector<std::string>& args);

}  // namespace tessera::launcher
