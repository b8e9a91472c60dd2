// The data enums that configuration names (data.truncation, data.format) and their names, in enum
// order (util/enum_names.h): one list each that the parsers (dataset.cpp, format.cpp), the
// configuration schema (launcher/config.cpp) and `tessera tokenize` read (data.chat_template's:
// text/names.h). Header-only and dependency-free.
#pragma once
#include "util/enum_names.h"

namespace tessera::data {

// An example longer than a sequence: skip it, keep its end, or stop (dataset.h).
enum class Truncation { Drop, Left, Error };
TESSERA_ENUM_NAMES(truncation_names, "drop", "left", "error")

// data.format: how data files are read (format.h): decided per file, or forced for every file.
enum class DataFormat { Auto, Jsonl, Json, Text };
TESSERA_ENUM_NAMES(data_format_names, "auto", "jsonl", "json", "text")

}  // namespace tessera::data
