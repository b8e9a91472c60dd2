// libFuzzer harness: a model's tokenizer_config.json, read by the BPE tokenizer (bos_token,
// eos_token: text/bpe/tokenizer.cpp) and by the chat template reader (chat_template, the
// special tokens: text/chat_template_jinja.cpp), whose template is then parsed.
//
// Input: the tokenizer_config.json text; beside it, a fixed small tokenizer.json (the 256 bytes
// and two special tokens, <s> and </s>).
#include <memory>

#include "text/bpe/tokenizer.h"
#include "text/chat_template.h"
#include "tests/fuzz/fuzz_common.h"

using namespace tessera;

namespace {

// A byte-level BPE of the 256 bytes (GPT-2's alphabet, id = byte) and <s> = 256, </s> = 257.
std::string small_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const int cp = printable ? b : 256 + n++;
    std::string s;
    if (cp < 0x80) s += char(cp);
    else s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 0x3F));
    vocab[s] = b;
  }
  nlohmann::json added = nlohmann::json::array();
  for (int i = 0; i < 2; ++i) added.push_back({{"id", 256 + i}, {"content", i ? "</s>" : "<s>"}, {"special", true}});
  return nlohmann::json{{"added_tokens", added},
                        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                        {"decoder", {{"type", "ByteLevel"}}},
                        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}}
      .dump();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::Scratch scratch;
  static const std::string tokenizer = scratch.write("tokenizer.json", small_tokenizer_json());
  const std::string config = scratch.write("tokenizer_config.json", std::string(reinterpret_cast<const char*>(data), size));
  fuzz::expect_input_error([&] { (void)text::bpe::BpeTokenizer(tokenizer).bos_id(); }, {config});
  fuzz::expect_input_error(
      [&] {
        const auto model = text::read_model_chat_template(config);
        if (model) (void)text::make_model_chat_template(*model);
      },
      {config, scratch.path("chat_template.jinja")});
  return 0;
}
