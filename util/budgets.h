// Budgets on everything an input file controls. A model directory, data set, checkpoint or config
// downloaded from the internet may be hostile or just broken; whatever it holds, a job must end in
// one line naming the file and what was exceeded (exit 2 on every rank), never in a signal, a hang
// or unbounded memory. Every such limit is here, and docs/LIMITS.md lists them with their errors.
// No real file comes near any of them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera::util::budget {

// Nesting of a JSON document (run configs, config.json, tokenizer.json, tokenizer_config.json,
// safetensors headers, manifests, data records, metrics.jsonl): util::parse_json refuses deeper.
inline constexpr int kJsonDepth = 256;

// Nesting of a YAML document (run configs, Accelerate and TrainingArguments files).
inline constexpr int kYamlDepth = 256;
// Nodes a YAML document expands to once its aliases are followed ("billion laughs": a 1 KB file of
// nested aliases expands to 10^9 nodes). Real configs have a few hundred. 10,000 (not 100,000: each
// node costs ~2.5 us in the release build and ~20x that under ASan at -O0, where fuzz_yaml timed out).
inline constexpr int64_t kYamlExpandedNodes = 10'000;

// A Jinja chat template (tokenizer_config.json's chat_template, data.chat_template):
// - nesting of its syntax (blocks inside blocks, expressions inside expressions) and of calls at
//   render time (macros calling macros, recursion);
inline constexpr int kJinjaDepth = 256;
// - loop iterations plus macro calls in one render (nested range(99999) loops spin for ever
//   otherwise: no collective is pending, so comm.timeout_s never fires). Real templates take a few
//   per message; a million take about a second (10 million took 15 s, for every conversation).
inline constexpr int64_t kJinjaSteps = 1'000'000;
// - bytes of any one string it makes, and of one render's output ('x' * 4000000000, doubling).
//   16 MiB of text is about four million tokens, far past any sequence length.
inline constexpr size_t kJinjaStringBytes = size_t(16) << 20;
// - bytes of all the strings and list items one render makes (a list of 1000 copies of a 16 MiB
//   string, or of a doubled list, is made one copy at a time: each is charged).
inline constexpr size_t kJinjaMadeBytes = size_t(256) << 20;

// A checkpoint.dir's `latest`: one line naming a step-<N> of that directory (a few bytes).
inline constexpr size_t kLatestBytes = 4096;

// One record of a data file (a JSON Lines line, an element of a JSON array), counted after
// decompression: memory stays bounded whatever the compression ratio. Plain text has no such
// limit: its long lines are cut into blocks. A record costs about 14x its size at its peak (the line,
// its JSON, the rendered text, token ids and targets): measured, a 63 MiB record peaked at 850 MiB in
// `tokenize` (1 GiB for a chat record), so 16 MiB keeps a record's peak near 300 MiB.
inline constexpr size_t kRecordBytes = size_t(16) << 20;

// Tokens that `train` holds in memory from the text / JSON files of one data path (data.path,
// data.val_path), on every rank: 4 bytes a token and 16 a document. Past it the run stops and asks
// for `tessera tokenize`, whose token file is memory-mapped (any size, each rank pages in its rows):
// a 5 MB .gz of 2 GB of lines would otherwise hold 8 GB of tokens on each rank.
inline constexpr size_t kInMemoryDataBytes = size_t(256) << 20;

}  // namespace tessera::util::budget
