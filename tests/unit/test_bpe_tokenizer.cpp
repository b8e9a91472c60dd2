// BpeTokenizer (Hugging Face tokenizer.json, byte-level BPE) on small hand-written tokenizers whose
// ids are derived by hand: the GPT-2 byte alphabet, merge order, ignore_merges, the Llama 3
// pre-tokenizer's splits (contractions, digit groups, Unicode letters), special tokens in the text,
// decode, BOS/EOS, and one-line errors naming file and field. tests/unit/bpe_tiktoken.sh checks a
// full-size tokenizer against js-tiktoken.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "runtime/data/bpe_tokenizer.h"
#include "runtime/error.h"

using tessera::data::BpeTokenizer;
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
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tessera_bpe_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const json& j, const std::string& name = "tokenizer.json") {
    const auto p = (dir_ / name).string();
    std::ofstream(p) << j.dump();
    return p;
  }
  std::string error_of(const json& j) {
    const std::string p = write(j);
    try {
      BpeTokenizer t(p);
    } catch (const tessera::Error& e) {
      EXPECT_EQ(e.kind(), tessera::ErrorKind::Input);
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
      return e.what();
    }
    return "<no error>";
  }
  fs::path dir_;
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
  EXPECT_EQ(t.encode("a[plain]"), ids({'a', 303}));  // non-special added tokens are matched too
  EXPECT_EQ(t.special_id("<|eot|>"), 301);
  EXPECT_EQ(t.special_id("<|begin_of_text|>"), 300);
  EXPECT_FALSE(t.special_id("[plain]").has_value());
  EXPECT_FALSE(t.special_id("hi").has_value());
  // No tokenizer_config.json: BOS from the TemplateProcessing post-processor, no EOS.
  EXPECT_EQ(t.bos_id(), 300);
  EXPECT_EQ(t.eos_id(), -1);
  EXPECT_EQ(t.name(), "bpe:" + (dir_ / "tokenizer.json").string());
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
  j["normalizer"] = {{"type", "NFC"}};
  EXPECT_NE(error_of(j).find("normalizer.type \"NFC\" is not supported"), std::string::npos);
  j = tokenizer({});
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xe2\x96\x81"}};
  EXPECT_NE(error_of(j).find("pre_tokenizer.type \"Metaspace\" is not supported"), std::string::npos);
  j = tokenizer({});
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "MergedWithNext";
  EXPECT_NE(error_of(j).find("pre_tokenizer.pretokenizers[0].behavior"), std::string::npos);
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
  EXPECT_EQ(error_of(json::parse("[1, 2]")).find("<no error>"), std::string::npos);
  std::ofstream((dir_ / "broken.json").string()) << "{\"model\": ";
  EXPECT_THROW(BpeTokenizer((dir_ / "broken.json").string()), tessera::Error);
  EXPECT_THROW(BpeTokenizer((dir_ / "missing.json").string()), tessera::Error);
}

TEST_F(BpeTest, MakeTokenizerPicksTokenizerJson) {
  const std::string p = write(tokenizer({{"h", "i"}}));
  auto by_file = tessera::data::make_tokenizer(p);
  auto by_dir = tessera::data::make_tokenizer(dir_.string());
  EXPECT_EQ(by_file->name(), "bpe:" + p);
  EXPECT_EQ(by_dir->name(), "bpe:" + p);
  EXPECT_EQ(by_dir->encode("hi"), ids({256}));
  EXPECT_FALSE(tessera::data::make_tokenizer("")->special_id("<s>").has_value());
}

// The SentencePiece tokenizer's special tokens are its control pieces and <unk> (a model trained
// here with Debian's spm_train).
TEST(TokenizerSpecialId, SentencePieceControlPieces) {
  const fs::path dir = fs::temp_directory_path() / ("tessera_spm_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string text = (dir / "train.txt").string(), prefix = (dir / "sp").string();
  {
    std::ofstream out(text);
    for (int i = 0; i < 200; ++i) out << "the quick brown fox " << i << " jumps over the lazy dog\n";
  }
  const std::string cmd = "spm_train --input=" + text + " --model_prefix=" + prefix +
                          " --vocab_size=60 --model_type=bpe --minloglevel=2 >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto t = tessera::data::make_tokenizer(prefix + ".model");
  EXPECT_EQ(t->special_id("<unk>"), 0);
  EXPECT_EQ(t->special_id("<s>"), 1);
  EXPECT_EQ(t->special_id("</s>"), 2);
  EXPECT_FALSE(t->special_id("the").has_value());
  EXPECT_FALSE(t->special_id("<|eot_id|>").has_value());
  fs::remove_all(dir);
}
