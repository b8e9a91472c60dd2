// Chat templates and record formats: the Llama 2 template against a hand-checked id sequence from a
// real SentencePiece model (tests/unit/fixtures/llama2-chat-test.model, trained here with spm_train
// on examples/chat's own text, Llama-like settings: BPE, identity normalisation, byte fallback,
// split digits), the Llama 3 template against a fake tokenizer with its special tokens, `none`,
// prompt/completion targets, and every kind of bad conversation.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <map>

#include "runtime/data/chat_template.h"
#include "runtime/data/tokenizer.h"
#include "runtime/error.h"
#include "tests/unit/test_process_util.h"

using namespace tessera;
using namespace tessera::data;
using tessera::test::run_capture;
using nlohmann::json;

namespace {

std::string fixture(const std::string& name) {
  const char* src = std::getenv("TESSERA_TEST_SRC");
  return std::string(src ? src : ".") + "/tests/unit/fixtures/" + name;
}

std::vector<int32_t> slice(const std::vector<int32_t>& v, size_t b, size_t e) {
  return std::vector<int32_t>(v.begin() + b, v.begin() + e);
}

// Bytes as ids 10.., and the four Llama 3 specials as ids 1000-1003.
class FakeLlama3Tokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(10 + c);
    return ids;
  }
  int32_t bos_id() const override { return 1000; }
  int32_t eos_id() const override { return 1003; }
  int64_t vocab_size() const override { return 1010; }
  std::string name() const override { return "fake-llama3"; }
  std::optional<int32_t> special_id(const std::string& text) const override {
    static const std::map<std::string, int32_t> specials = {
        {"<|begin_of_text|>", 1000}, {"<|start_header_id|>", 1001}, {"<|end_header_id|>", 1002}, {"<|eot_id|>", 1003}};
    auto it = specials.find(text);
    if (it == specials.end()) return std::nullopt;
    return it->second;
  }
};

std::vector<int32_t> bytes(const std::string& s) { return FakeLlama3Tokenizer().encode(s); }

// {"messages": [{"role": r, "content": c}, ...]}
json conversation(const std::vector<std::pair<std::string, std::string>>& turns) {
  json a = json::array();
  for (const auto& [r, c] : turns) a.push_back({{"role", r}, {"content", c}});
  return json{{"messages", a}};
}

Example render(const json& record, const Tokenizer& tok, const std::string& tmpl) {
  return render_record(record, tok, *make_chat_template(tmpl));
}

void expect_bad(const json& record, const std::string& kind, const std::string& reason_part) {
  ByteTokenizer tok;
  try {
    render(record, tok, "llama2");
    ADD_FAILURE() << "accepted " << record.dump();
  } catch (const BadExample& e) {
    EXPECT_EQ(e.kind(), kind) << record.dump() << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(reason_part), std::string::npos) << e.what();
  }
}

const json kConversation = conversation({{"system", "Be brief."},
                                         {"user", "What is 2 plus 3?"},
                                         {"assistant", "2 + 3 = 5."},
                                         {"user", "And minus 1?"},
                                         {"assistant", " 5 - 1 = 4.\n"}});  // stripped like Meta's .strip()

}  // namespace

TEST(ChatTemplate, Llama2MatchesHandCheckedIdsOfARealSentencePieceModel) {
  auto tok = make_tokenizer(fixture("llama2-chat-test.model"));
  ASSERT_EQ(tok->bos_id(), 1);
  ASSERT_EQ(tok->eos_id(), 2);
  const Example ex = render(kConversation, *tok, "llama2");
  // Meta's chat_completion / HF's template:
  //   <s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nWhat is 2 plus 3? [/INST] 2 + 3 = 5. </s>
  //   <s>[INST] And minus 1? [/INST] 5 - 1 = 4. </s>
  // Pieces (spm_export_vocab), checked by hand against that text; "▁" is a space, <0x0A> a newline.
  const std::vector<int32_t> expected = {
      1,  // <s>
      264, 267, 390,  // ▁[ INST ]
      266, 265, 260,  // ▁<< SYS >>
      13,  // <0x0A>
      69, 377, 372, 101, 398, 379, 377, 105, 384,  // <0x42> e ▁ <0x62> r i e <0x66> .   (Be brief.)
      13,  // <0x0A>
      259, 385, 265, 260,  // << / SYS >>
      13, 13,  // <0x0A> <0x0A>
      319, 320, 282, 372, 393, 291, 372, 397, 402,  // Wh at ▁is ▁ 2 ▁plus ▁ 3 ?
      271, 267, 390,  // ▁[/ INST ]
      372, 393, 289, 372, 397, 268, 372, 401, 384, 372,  // ▁ 2 ▁+ ▁ 3 ▁= ▁ 5 . ▁   (the answer, targets)
      2,  // </s>   (target)
      1,  // <s>
      264, 267, 390,  // ▁[ INST ]
      311, 285, 372, 391, 402,  // ▁And ▁minus ▁ 1 ?
      271, 267, 390,  // ▁[/ INST ]
      372, 401, 276, 372, 391, 268, 372, 399, 384, 372,  // ▁ 5 ▁- ▁ 1 ▁= ▁ 4 . ▁   (the answer, targets)
      2,  // </s>   (target)
  };
  EXPECT_EQ(ex.tokens, expected);
  ASSERT_EQ(ex.target.size(), ex.tokens.size());
  // Targets: the answers (after "[/INST]") and their EOS, nothing else.
  std::vector<uint8_t> want(expected.size(), 0);
  for (size_t i = 36; i < 47; ++i) want[i] = 1;
  for (size_t i = 59; i < 70; ++i) want[i] = 1;
  EXPECT_EQ(ex.target, want);

  // Independent oracle: spm_decode of each turn's ids (BOS/EOS dropped) is Meta's string (the
  // decoder drops the leading space the encoder's dummy prefix added).
  const std::string ids_file = ::testing::TempDir() + "/turn_ids.txt";
  FILE* f = fopen(ids_file.c_str(), "w");
  size_t begin = 1;
  for (size_t i = 1; i < expected.size(); ++i) {
    if (expected[i] != 2) continue;
    for (size_t k = begin; k < i; ++k) fprintf(f, "%d ", expected[k]);
    fprintf(f, "\n");
    begin = i + 2;  // skip EOS and the next BOS
  }
  fclose(f);
  const std::string decoded =
      run_capture("spm_decode --model=" + fixture("llama2-chat-test.model") + " --input_format=id < " + ids_file);
  EXPECT_EQ(decoded,
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nWhat is 2 plus 3? [/INST] 2 + 3 = 5. \n"
            "[INST] And minus 1? [/INST] 5 - 1 = 4. \n");
}

TEST(ChatTemplate, Llama2WithoutSystemAndWithATrailingUserMessage) {
  ByteTokenizer tok;  // bytes make the expected sequence plain to read
  const Example ex = render(conversation({{"user", "hi"}, {"assistant", "yo"}, {"user", "bye"}}), tok, "llama2");
  std::vector<int32_t> want = {256};
  for (unsigned char c : std::string("[INST] hi [/INST] yo ")) want.push_back(c);
  want.push_back(257);
  want.push_back(256);
  for (unsigned char c : std::string("[INST] bye [/INST]")) want.push_back(c);  // no EOS, no target
  EXPECT_EQ(ex.tokens, want);
  const size_t answer = 1 + std::string("[INST] hi [/INST]").size();
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(ex.target[i], i >= answer && i <= answer + 4 ? 1 : 0) << i;  // " yo " + EOS
}

TEST(ChatTemplate, Llama3RendersSpecialTokensThroughTheTokenizer) {
  FakeLlama3Tokenizer tok;
  const Example ex = render(conversation({{"system", "S"}, {"user", " Hi "}, {"assistant", "Yo"}}), tok, "llama3");
  std::vector<int32_t> want = {1000};
  std::vector<uint8_t> target = {0};
  auto add = [&](const std::vector<int32_t>& ids, bool t) {
    want.insert(want.end(), ids.begin(), ids.end());
    target.insert(target.end(), ids.size(), t ? 1 : 0);
  };
  for (auto [role, content] : {std::pair<std::string, std::string>{"system", "S"}, {"user", "Hi"}, {"assistant", "Yo"}}) {
    const bool t = role == "assistant";
    add({1001}, false);
    add(bytes(role), false);
    add({1002}, false);
    add(bytes("\n\n"), false);
    add(bytes(content), t);
    add({1003}, t);
  }
  EXPECT_EQ(ex.tokens, want);
  EXPECT_EQ(ex.target, target);

  // A tokenizer without the specials is refused up front, naming the missing token.
  ByteTokenizer bytes_tok;
  try {
    make_chat_template("llama3")->check(bytes_tok);
    ADD_FAILURE() << "llama3 accepted a tokenizer without <|begin_of_text|>";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input);
    EXPECT_NE(std::string(e.what()).find("<|begin_of_text|>"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(make_chat_template("llama3")->check(tok));
  EXPECT_THROW(make_chat_template("chatml"), Error);
}

TEST(ChatTemplate, NoneConcatenatesContents) {
  ByteTokenizer tok;
  const Example ex = render(conversation({{"user", "ab"}, {"assistant", "cd"}}), tok, "none");
  EXPECT_EQ(ex.tokens, (std::vector<int32_t>{256, 'a', 'b', 'c', 'd', 257}));
  EXPECT_EQ(ex.target, (std::vector<uint8_t>{0, 0, 0, 1, 1, 1}));
}

TEST(RecordFormats, PromptCompletionAndText) {
  auto tok = make_tokenizer(fixture("llama2-chat-test.model"));
  const std::string prompt = "What is 7 times 6?", completion = " 7 x 6 = 42.";
  const Example pc = render({{"prompt", prompt}, {"completion", completion}}, *tok, "llama2");
  // BOS + encode(prompt + completion) + EOS; the prompt's tokens are encode(prompt)'s.
  const std::vector<int32_t> whole = tok->encode(prompt + completion), head = tok->encode(prompt);
  ASSERT_EQ(slice(whole, 0, head.size()), head);  // the SentencePiece split falls on the boundary
  ASSERT_EQ(pc.tokens.size(), whole.size() + 2);
  EXPECT_EQ(pc.tokens.front(), 1);
  EXPECT_EQ(pc.tokens.back(), 2);
  EXPECT_EQ(slice(pc.tokens, 1, pc.tokens.size() - 1), whole);
  for (size_t i = 0; i < pc.tokens.size(); ++i) EXPECT_EQ(pc.target[i], i > head.size() ? 1 : 0) << i;
  EXPECT_FALSE(pc.text);

  const Example text = render({{"text", "free text"}, {"id", 3}}, *tok, "llama2");
  EXPECT_TRUE(text.text);
  EXPECT_EQ(text.num_targets(), static_cast<int64_t>(text.tokens.size()));
  EXPECT_TRUE(render({{"text", ""}}, *tok, "llama2").tokens.empty());
  // "messages" wins over "text" when a record has both.
  EXPECT_FALSE(render({{"text", "x"}, {"messages", kConversation["messages"]}}, *tok, "llama2").text);
}

TEST(RecordFormats, BadRecordsAreBadExamplesWithAKind) {
  const auto& msgs = conversation;
  expect_bad(msgs({{"user", "a"}, {"bot", "b"}}), "unknown role", "message 2 has unknown role \"bot\"");
  expect_bad(msgs({{"user", "a"}, {"user", "b"}, {"assistant", "c"}}), "roles do not alternate", "message 2 is \"user\"");
  expect_bad(msgs({{"assistant", "a"}, {"user", "b"}}), "roles do not alternate", "message 1 is \"assistant\"");
  expect_bad(msgs({{"user", "a"}, {"system", "b"}, {"assistant", "c"}}), "roles do not alternate", "only the first");
  expect_bad(msgs({{"system", "s"}, {"user", "a"}}), "no target tokens", "no assistant message");
  expect_bad(msgs({}), "no target tokens", "empty conversation");
  expect_bad(json::array({1, 2}), "bad record", "expected a JSON object");
  expect_bad({{"body", "x"}}, "bad record", "no \"messages\"");
  expect_bad({{"prompt", "x"}}, "bad record", "\"completion\" is missing");
  expect_bad({{"prompt", "x"}, {"completion", 3}}, "bad record", "\"completion\" is not a string");
  expect_bad({{"messages", "hi"}}, "bad record", "not an array");
  expect_bad({{"messages", {{{"role", "user"}}}}}, "bad record", "message 1 is not an object with");
  expect_bad({{"messages", {{{"role", "user"}, {"content", 5}}}}}, "bad record", "\"content\" is not a string");
}
