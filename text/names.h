// The text enums that configuration names (data.chat_template) and their names, in enum order
// (util/enum_names.h): the list the parser (chat_template.cpp), the configuration schema
// (launcher/config.cpp) and `tessera tokenize` read. Header-only and dependency-free.
#pragma once
#include "util/enum_names.h"

namespace tessera::text {

// How `messages` records are rendered (chat_template.h); Auto (the model's own) is the default.
enum class ChatTemplateKind { Auto, Llama2, Llama3, None };
TESSERA_ENUM_NAMES(chat_template_names, "auto", "llama2", "llama3", "none")

}  // namespace tessera::text
