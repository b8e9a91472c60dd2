// libFuzzer harness: token files (`tessera tokenize` format, TSRTOK2 and the legacy TSRTOK1) and
// JSONL data files (runtime/data: token_file.cpp, reader.cpp, dataset.cpp).
//
// Input: the file's bytes. An input starting with '{' is written as data.jsonl and read with the
// byte-level tokenizer (chat records through the llama2 template); anything else is written as
// data.bin and mapped as a token file, whose every document and token word is then read. Both are packed into
// a TokenDataset (seq_len 1..8 from the input size, the vocab as limit) whose first and last rows
// are fetched.
#include "runtime/data/dataset.h"
#include "runtime/data/token_file.h"
#include "text/tokenizer.h"
#include "tests/fuzz/fuzz_common.h"

using namespace tessera;
using namespace tessera::data;
using namespace tessera::text;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::Scratch s;
  static const ByteTokenizer bytes;
  s.clear();
  const bool jsonl = size > 0 && data[0] == '{';
  const std::string path = s.write(jsonl ? "data.jsonl" : "data.bin", std::string(reinterpret_cast<const char*>(data), size));
  int64_t vocab = ByteTokenizer::kVocab;
  if (!jsonl)
    fuzz::expect_input_error(
        [&] {
          const std::shared_ptr<DocStore> store = open_token_file(path);
          vocab = store->vocab();
          int64_t end = 0;
          for (int64_t d = 0; d < store->num_documents(); ++d) {
            const DocStore::Doc doc = store->doc(d);
            if (doc.begin != end || doc.length < 0) fuzz::finding("document table not contiguous");
            end = doc.begin + doc.length;
          }
          if (end != store->num_tokens()) fuzz::finding("documents do not cover the tokens");
          // Ids are checked where rows are read (TokenDataset::batch against the model's vocab), not
          // when a file is mapped: every word must still be readable.
          int64_t sum = 0;
          for (int64_t i = 0; i < store->num_tokens(); ++i) sum += int64_t(store->id(i)) + (store->target(i) ? 1 : 0);
          if (sum < 0) fuzz::finding("negative id");
        },
        {path});
  PackOptions opts;
  opts.seq_len = 1 + static_cast<int64_t>(size % 8);
  opts.vocab_limit = vocab;
  fuzz::expect_input_error(
      [&] {
        std::shared_ptr<TokenDataset> ds = load_dataset({path}, bytes, opts);
        const Batch b = ds->batch({0, ds->num_sequences() - 1});
        if (b.inputs.size(0) != 2 || b.inputs.size(1) != opts.seq_len) fuzz::finding("batch has the wrong shape");
      },
      {path});
  return 0;
}
