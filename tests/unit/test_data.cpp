// Tokenizers and token datasets: real files in a temp dir, a real SentencePiece model trained here
// with spm_train, and spm_encode as the oracle for SentencePiece ids.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/data/dataset.h"
#include "runtime/data/tokenizer.h"
#include "runtime/error.h"

namespace fs = std::filesystem;
using namespace tessera;
using namespace tessera::data;

namespace {

std::string make_temp_dir() {
  std::string tmpl = (fs::temp_directory_path() / "tessera_data_XXXXXX").string();
  char* p = mkdtemp(tmpl.data());
  EXPECT_NE(p, nullptr);
  return tmpl;
}

void write_file(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  out << content;
}

std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(pipe), 0) << cmd;
  return out;
}

// Expects `fn` to throw tessera::Error(Input) whose message contains every string of `needles`.
template <typename F>
void expect_input_error(F&& fn, std::initializer_list<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "expected an input error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input) << e.what();
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << " lacks " << n;
  }
}

// The byte tokenizer's stream for the given documents: BOS + bytes + EOS each.
std::vector<int32_t> byte_stream(const std::vector<std::string>& docs) {
  std::vector<int32_t> s;
  for (const auto& d : docs) {
    s.push_back(ByteTokenizer::kBos);
    for (unsigned char c : d) s.push_back(c);
    s.push_back(ByteTokenizer::kEos);
  }
  return s;
}

class DataTest : public ::testing::Test {
 protected:
  void SetUp() override { dir = make_temp_dir(); }
  void TearDown() override { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return dir + "/" + name; }
  std::string dir;
};

}  // namespace

TEST(ByteTokenizer, BytesAndSpecialIds) {
  auto tok = make_tokenizer("");
  EXPECT_EQ(tok->name(), "byte");
  EXPECT_EQ(tok->vocab_size(), 258);
  EXPECT_EQ(tok->bos_id(), 256);
  EXPECT_EQ(tok->eos_id(), 257);
  const std::string text = "h\xc3\xa9\n\xff";  // UTF-8 é and a raw 0xff byte
  EXPECT_EQ(tok->encode(text), (std::vector<int32_t>{'h', 0xc3, 0xa9, '\n', 0xff}));
  EXPECT_TRUE(tok->encode("").empty());
}

TEST_F(DataTest, SentencePieceModelMatchesSpmEncode) {
  const std::string corpus = path("corpus.txt");
  run_capture("cat /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 > " + corpus);
  run_capture("spm_train --input=" + corpus + " --model_prefix=" + path("sp") +
              " --vocab_size=300 --model_type=bpe --minloglevel=2 2>&1");
  auto tok = make_tokenizer(path("sp.model"));
  EXPECT_EQ(tok->vocab_size(), 300);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->name(), "sentencepiece:" + path("sp.model"));

  const std::vector<std::string> lines = {"This program is free software: you can redistribute it.",
                                          "Licensed under the Apache License, Version 2.0 (the \"License\");",
                                          "zebra quokka 12345"};
  write_file(path("lines.txt"), lines[0] + "\n" + lines[1] + "\n" + lines[2] + "\n");
  std::istringstream oracle(run_capture("spm_encode --model=" + path("sp.model") + " --output_format=id < " + path("lines.txt")));
  for (const auto& line : lines) {
    std::string ids_line;
    std::getline(oracle, ids_line);
    std::istringstream ids(ids_line);
    std::vector<int32_t> expected;
    for (int32_t id; ids >> id;) expected.push_back(id);
    EXPECT_FALSE(expected.empty());
    EXPECT_EQ(tok->encode(line), expected) << line;
  }

  // A JSONL dataset read with this tokenizer: BOS + spm ids + EOS per record.
  write_file(path("d.jsonl"), "{\"text\": \"" + lines[0] + "\"}\n{\"text\": \"" + lines[2] + "\"}\n");
  TokenDataset ds(path("d.jsonl"), 4, tok.get());
  std::vector<int32_t> expected = {1};
  for (int32_t t : tok->encode(lines[0])) expected.push_back(t);
  expected.push_back(2);
  expected.push_back(1);
  for (int32_t t : tok->encode(lines[2])) expected.push_back(t);
  expected.push_back(2);
  EXPECT_EQ(ds.corpus().tokens, expected);
  EXPECT_EQ(ds.corpus().vocab_size, 300);
  EXPECT_NO_THROW(ds.check_vocab(300));
  EXPECT_LE(ds.corpus().max_token_id, 299);
}

TEST_F(DataTest, NotASentencePieceModelIsAnInputError) {
  write_file(path("tokenizer.model"), "this is not a protobuf\n");
  expect_input_error([&] { make_tokenizer(path("tokenizer.model")); }, {path("tokenizer.model"), "not a SentencePiece model"});
  expect_input_error([&] { make_tokenizer(path("missing.model")); }, {path("missing.model")});
  expect_input_error([&] { make_tokenizer(dir); }, {dir});
}

TEST_F(DataTest, TextDirectoryIsSortedWrappedAndPacked) {
  fs::create_directories(path("corpus/sub"));
  // Created out of order; read in sorted path order: a.txt, b.md, sub/c.txt. Hidden files skipped.
  write_file(path("corpus/sub/c.txt"), "third document\n");
  write_file(path("corpus/b.md"), "second\nwith two lines\n");
  write_file(path("corpus/a.txt"), "first");
  write_file(path("corpus/.hidden"), "never read");
  EXPECT_EQ(list_data_files(path("corpus")),
            (std::vector<std::string>{path("corpus/a.txt"), path("corpus/b.md"), path("corpus/sub/c.txt")}));

  ByteTokenizer tok;
  const int64_t L = 7;
  TokenDataset ds(path("corpus"), L, &tok);
  const auto stream = byte_stream({"first", "second\nwith two lines\n", "third document\n"});
  EXPECT_EQ(ds.corpus().tokens, stream);
  EXPECT_EQ(ds.corpus().num_files, 3);
  EXPECT_EQ(ds.corpus().num_documents, 3);
  EXPECT_EQ(ds.num_tokens(), int64_t(stream.size()));
  EXPECT_EQ(ds.num_sequences(), (int64_t(stream.size()) - 1) / L);

  // Sequence i = stream[i*L, i*L + L + 1): every token after the first is a target exactly once.
  std::vector<int32_t> seq(L + 1);
  for (int64_t i = 0; i < ds.num_sequences(); ++i) {
    ds.get(i, seq.data());
    EXPECT_EQ(seq, std::vector<int32_t>(stream.begin() + i * L, stream.begin() + i * L + L + 1)) << i;
  }
  const at::Tensor b = ds.batch({2, 0});
  ASSERT_EQ(b.sizes(), (at::IntArrayRef{2, L + 1}));
  EXPECT_EQ(b.scalar_type(), at::kLong);
  for (int64_t j = 0; j <= L; ++j) {
    EXPECT_EQ(b[0][j].item<int64_t>(), stream[2 * L + j]);
    EXPECT_EQ(b[1][j].item<int64_t>(), stream[j]);
  }
  EXPECT_THROW(ds.get(ds.num_sequences(), seq.data()), Error);

  // Deterministic: a second load yields the same stream.
  EXPECT_EQ(TokenDataset(path("corpus"), L, &tok).corpus().tokens, stream);
}

TEST_F(DataTest, LargeTextIsChunkedAtNewlinesDeterministically) {
  // ~2.6 MB forces many chunks; with the byte tokenizer chunking must not change the stream.
  std::string text;
  for (int i = 0; text.size() < (size_t(5) << 19); ++i) text += "line " + std::to_string(i) + " of a long file\n";
  write_file(path("big.txt"), text);
  ByteTokenizer tok;
  TokenDataset ds(path("big.txt"), 512, &tok);
  EXPECT_EQ(ds.corpus().tokens, byte_stream({text}));
  EXPECT_EQ(ds.corpus().num_documents, 1);
}

TEST_F(DataTest, JsonlRecordsAndErrors) {
  write_file(path("ok.jsonl"), "{\"text\": \"alpha\", \"id\": 1}\n\n  \n{\"text\": \"beta\\ngamma\"}\n{\"text\": \"\"}\n");
  ByteTokenizer tok;
  TokenDataset ds(path("ok.jsonl"), 3, &tok);
  EXPECT_EQ(ds.corpus().tokens, byte_stream({"alpha", "beta\ngamma"}));
  EXPECT_EQ(ds.corpus().num_documents, 2);

  write_file(path("bad.jsonl"), "{\"text\": \"a\"}\n{\"text\": \"b\"\n");
  expect_input_error([&] { TokenDataset(path("bad.jsonl"), 3, &tok); }, {path("bad.jsonl") + ":2", "invalid JSON"});
  write_file(path("notext.jsonl"), "{\"text\": \"a\"}\n{\"body\": \"b\"}\n");
  expect_input_error([&] { TokenDataset(path("notext.jsonl"), 3, &tok); }, {path("notext.jsonl") + ":2", "\"text\""});
  write_file(path("num.jsonl"), "{\"text\": 5}\n");
  expect_input_error([&] { TokenDataset(path("num.jsonl"), 3, &tok); }, {path("num.jsonl") + ":1", "not a string"});
}

TEST_F(DataTest, TokenFileRoundTripAndValidation) {
  const std::vector<int32_t> tokens = {256, 1, 2, 3, 255, 257, 256, 9, 257};
  write_token_file(path("t.bin"), tokens, 258);
  // Layout: magic, u32 vocab, u64 count, int32 LE tokens.
  std::ifstream in(path("t.bin"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), 20 + 4 * tokens.size());
  EXPECT_EQ(bytes.substr(0, 8), std::string("TSRTOK1\0", 8));
  EXPECT_EQ((unsigned char)bytes[8], 258 & 0xff);
  EXPECT_EQ((unsigned char)bytes[9], 258 >> 8);
  EXPECT_EQ((unsigned char)bytes[12], tokens.size());
  EXPECT_EQ((unsigned char)bytes[20], 0);  // 256 little-endian: 00 01 00 00
  EXPECT_EQ((unsigned char)bytes[21], 1);
  uint32_t vocab = 0;
  EXPECT_EQ(read_token_file(path("t.bin"), &vocab), tokens);
  EXPECT_EQ(vocab, 258u);

  // A dataset from the token file equals one from the same text.
  write_file(path("x.txt"), "tokens of a small text file");
  ByteTokenizer tok;
  TokenDataset from_text(path("x.txt"), 5, &tok);
  write_token_file(path("x.bin"), from_text.corpus().tokens, 258);
  TokenDataset from_bin(path("x.bin"), 5, nullptr);
  EXPECT_EQ(from_bin.corpus().tokens, from_text.corpus().tokens);
  EXPECT_EQ(from_bin.corpus().vocab_size, 258);
  EXPECT_EQ(from_bin.num_sequences(), from_text.num_sequences());

  write_file(path("bad.bin"), "NOTMAGIC____________");
  expect_input_error([&] { read_token_file(path("bad.bin")); }, {path("bad.bin"), "magic"});
  write_file(path("trunc.bin"), bytes.substr(0, bytes.size() - 3));
  expect_input_error([&] { read_token_file(path("trunc.bin")); }, {path("trunc.bin"), "bytes"});
  expect_input_error([&] { write_token_file(path("oob.bin"), {1, 300}, 258); }, {path("oob.bin"), "300"});
  EXPECT_FALSE(fs::exists(path("oob.bin")));
  // Vocab of the token file must match the configured tokenizer.
  write_token_file(path("v.bin"), {1, 2, 3}, 32000);
  expect_input_error([&] { TokenDataset(path("v.bin"), 1, &tok); }, {path("v.bin"), "32000", "258"});
  // Text without a tokenizer is refused.
  expect_input_error([&] { TokenDataset(path("x.txt"), 1, nullptr); }, {path("x.txt"), "tokenizer"});
}

TEST_F(DataTest, EmptyShortMissingAndVocabErrors) {
  ByteTokenizer tok;
  write_file(path("empty.txt"), "");
  expect_input_error([&] { TokenDataset(path("empty.txt"), 8, &tok); }, {path("empty.txt"), "empty", "0 tokens"});
  fs::create_directories(path("emptydir"));
  expect_input_error([&] { TokenDataset(path("emptydir"), 8, &tok); }, {path("emptydir"), "no data files"});
  expect_input_error([&] { TokenDataset(path("nope"), 8, &tok); }, {path("nope"), "does not exist"});

  write_file(path("short.txt"), "abcd");  // 6 tokens with BOS/EOS
  expect_input_error([&] { TokenDataset(path("short.txt"), 8, &tok); }, {path("short.txt"), "6 tokens", "seq_len 8", "needs 9"});
  TokenDataset exact(path("short.txt"), 5, &tok);  // 6 tokens = exactly one sequence of 5 (+1)
  EXPECT_EQ(exact.num_sequences(), 1);
  expect_input_error([&] { TokenDataset(path("short.txt"), 0, &tok); }, {"seq_len"});

  // Ids 256/257 (BOS/EOS) exceed a model vocab of 257.
  EXPECT_NO_THROW(exact.check_vocab(258));
  expect_input_error([&] { exact.check_vocab(257); }, {path("short.txt"), "257", "vocab_size"});
}
