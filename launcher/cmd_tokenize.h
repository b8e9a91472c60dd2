// `tessera tokenize`: pre-tokenises a corpus (text / JSONL files or a directory of them) into one
// token file (format in runtime/data/token_file.h) that `tessera train` memory-maps like any data
// path. Streams: memory stays bounded on a multi-GB input; a progress bar (bytes, MB/s, tokens/s)
// goes to stderr. `tessera report`: the HTML report of a run directory (tools/report.h).
#pragma once
#include <string>
#include <vector>

namespace tessera::launcher {

// args: everything after "tokenize". Returns the exit code; bad input throws tessera::Error(Input).
int run_tokenize(const std::vector<std::string>& args);
// args: everything after "report".
int run_report(const std::vector<std::string>& args);

}  // namespace tessera::launcher
