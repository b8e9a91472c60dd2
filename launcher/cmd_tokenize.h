// `tessera tokenize`: pre-tokenises a corpus (text / JSONL files or a directory of them) into one
// binary token file (format in runtime/data/dataset.h) that `tessera train` reads like any data path.
#pragma once
#include <string>
#include <vector>

namespace tessera::launcher {

// args: everything after "tokenize". Returns the exit code; bad input throws tessera::Error(Input).
int run_tokenize(const std::vector<std::string>& args);

}  // namespace tessera::launcher
