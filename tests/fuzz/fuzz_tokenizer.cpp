// libFuzzer harness: a Hugging Face tokenizer.json (text/bpe/tokenizer.cpp): the BPE
// tokenizer built from the bytes, then a short text encoded and decoded.
//
// Input: the tokenizer.json text (no tokenizer_config.json beside it: fuzz_tokenizer_config reads
// that). A tokenizer that loads must encode the text (pre-tokenizer patterns run on it, PCRE2 may
// give up only with an error naming the file and pattern), with ids inside its vocabulary.
#include "text/bpe/tokenizer.h"
#include "tests/fuzz/fuzz_common.h"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::Scratch scratch;
  const std::string path = scratch.write("tokenizer.json", std::string(reinterpret_cast<const char*>(data), size));
  fuzz::expect_input_error(
      [&] {
        const text::bpe::BpeTokenizer t(path);
        const std::vector<int32_t> ids = t.encode("Hello world, it's 2024! \xc3\xa9t\xc3\xa9 <s>  \n\tend");
        for (int32_t id : ids)
          if (id < 0 || id >= t.vocab_size()) fuzz::finding("encode gave id " + std::to_string(id) + " outside the vocabulary");
        (void)t.decode(ids);
      },
      {path});
  return 0;
}
