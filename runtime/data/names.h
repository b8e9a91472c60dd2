// The data enums that configuration names (data.truncation, data.chat_template) and their names, in
// enum order (util/enum_names.h): one list each that the parsers (dataset.cpp, chat_template.cpp),
// the configuration schema (launcher/config.cpp) and `tessera tokenize` read. Header-only and
// dependency-free.
#pragma once
#include "util/enum_names.h"

namespace tessera::data {

// An example longer than a sequence: skip it, keep its end, or stop (dataset.h).
enum class Truncation { Drop, Left, Error };
TESSERA_ENUM_NAMES(truncation_names, "drop", "left", "error")

// data.format: how data files are read (format.h): decided per file, or forced for every file.
enum class DataFormat { Auto, Jsonl, Json, Text };
TESSERA_ENUM_NAMES(data_format_names, "auto", "jsonl", "json", "text")

// How `messages` records are rendered (chat_template.h); Auto (the model's own) is the default.
enum class ChatTemplateKind { Auto, Llama2, Llama3, None };
TESSERA_ENUM_NAMES(chat_template_names, "auto", "llama2", "llama3", "none")

}  // namespace tessera::data
