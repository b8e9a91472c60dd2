// libFuzzer harness: token files (`tessera tokenize` format TSRTOK1) and JSONL data files
// (runtime/data/dataset.cpp).
//
// Input: the file's bytes. An input starting with '{' is written as data.jsonl and read with the
// byte-level tokenizer; anything else is written as data.bin and read as a token file (no
// tokenizer). Both are then packed into a TokenDataset (seq_len 1..8 from the input size) whose
// first and last sequences are fetched, and read_token_file() is called on .bin files directly.
#include "runtime/data/dataset.h"
#include "runtime/data/tokenizer.h"
#include "tests/fuzz/fuzz_common.h"

using namespace tessera;
using namespace tessera::data;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::Scratch s;
  static const ByteTokenizer bytes;
  s.clear();
  const bool jsonl = size > 0 && data[0] == '{';
  const std::string path = s.write(jsonl ? "data.jsonl" : "data.bin", std::string(reinterpret_cast<const char*>(data), size));
  if (!jsonl)
    fuzz::expect_input_error(
        [&] {
          uint32_t vocab = 0;
          const std::vector<int32_t> tokens = read_token_file(path, &vocab);
          if (size != kTokenFileHeaderBytes + 4 * tokens.size()) fuzz::finding("token count does not match the file size");
          for (int32_t t : tokens)
            if (t < 0 || static_cast<uint32_t>(t) >= vocab) fuzz::finding("token id outside the vocab accepted");
        },
        {path});
  const int64_t seq_len = 1 + static_cast<int64_t>(size % 8);
  fuzz::expect_input_error(
      [&] {
        TokenDataset ds(path, seq_len, jsonl ? &bytes : nullptr);
        const at::Tensor b = ds.batch({0, ds.num_sequences() - 1});
        if (b.size(0) != 2 || b.size(1) != seq_len + 1) fuzz::finding("batch has the wrong shape");
        ds.check_vocab(jsonl ? ByteTokenizer::kVocab : ds.corpus().vocab_size);
      },
      {path});
  return 0;
}
