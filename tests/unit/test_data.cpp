// Tokenizers, the streaming reader, token files and datasets: real files in a temp dir, a real
// SentencePiece model trained here with spm_train (spm_encode is the oracle for its ids), and
// independent recomputations of units, rows, labels, positions and splits.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "runtime/data/dataset.h"
#include "runtime/data/format.h"
#include "runtime/data/reader.h"
#include "runtime/data/token_file.h"
#include "text/chat_template.h"
#include "text/records.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "tests/support/test_support.h"

namespace test_data {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using namespace tessera;
using namespace tessera::data;
using namespace tessera::text;
using tessera::test::expect_input_error;
using tessera::test::run_capture;
using tessera::test::write_file;

namespace {

// BOS + bytes + EOS.
std::vector<int32_t> byte_doc(const std::string& d) {
  std::vector<int32_t> s = {ByteTokenizer::kBos};
  for (unsigned char c : d) s.push_back(c);
  s.push_back(ByteTokenizer::kEos);
  return s;
}

// The documents of a store as (ids, targets, text).
struct Docs {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<uint8_t>> targets;
  std::vector<bool> text;
};
Docs docs_of(const DocStore& s) {
  Docs d;
  for (int64_t i = 0; i < s.num_documents(); ++i) {
    const auto doc = s.doc(i);
    std::vector<int32_t> ids;
    std::vector<uint8_t> t;
    for (int64_t k = doc.begin; k < doc.begin + doc.length; ++k) ids.push_back(s.id(k)), t.push_back(s.target(k));
    d.ids.push_back(ids);
    d.targets.push_back(t);
    d.text.push_back(doc.text);
  }
  return d;
}

std::vector<std::shared_ptr<const DocStore>> load(const std::vector<std::string>& paths, const Tokenizer& tok,
                                                  ReadStats* stats_out = nullptr, const std::string& tmpl = "llama2") {
  ReadStats stats;
  auto stores = load_documents(paths, tok, *make_chat_template(tmpl), stats);
  if (stats_out) *stats_out = stats;
  return stores;
}

class DataTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return tmp / name; }
  const tessera::test::TempDir tmp{"tessera_data"};
  const std::string dir = tmp.str();
};

}  // namespace

TEST(ByteTokenizer, BytesAndSpecialIds) {
  for (const char* spec : {"", "bytes"}) {
    auto tok = make_tokenizer(spec);
    EXPECT_EQ(tok->name(), "byte");
    EXPECT_EQ(tok->vocab_size(), 258);
    EXPECT_EQ(tok->bos_id(), 256);
    EXPECT_EQ(tok->eos_id(), 257);
    EXPECT_FALSE(tok->special_id("<|eot_id|>").has_value());
  }
  ByteTokenizer tok;
  const std::string text = "h\xc3\xa9\n\xff";  // UTF-8 é and a raw 0xff byte
  EXPECT_EQ(tok.encode(text), (std::vector<int32_t>{'h', 0xc3, 0xa9, '\n', 0xff}));
  EXPECT_TRUE(tok.encode("").empty());
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
  // The same model loaded from its bytes (model.load=rank0 broadcasts them) encodes the same.
  std::ifstream in(path("sp.model"), std::ios::binary);
  const std::string model_bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto from_bytes = make_sentencepiece_tokenizer(model_bytes, "rank0:" + path("sp.model"));
  EXPECT_EQ(from_bytes->encode(lines[1]), tok->encode(lines[1]));
  EXPECT_EQ(from_bytes->vocab_size(), 300);
  expect_input_error([&] { make_sentencepiece_tokenizer("garbage", "x.model"); }, {"x.model", "not a SentencePiece model"});

  // A JSONL dataset read with this tokenizer: BOS + spm ids + EOS per text record.
  write_file(path("d.jsonl"), "{\"text\": \"" + lines[0] + "\"}\n{\"text\": \"" + lines[2] + "\"}\n");
  auto stores = load({path("d.jsonl")}, *tok);
  ASSERT_EQ(stores.size(), 1u);
  const Docs d = docs_of(*stores[0]);
  ASSERT_EQ(d.ids.size(), 2u);
  std::vector<int32_t> want = {1};
  for (int32_t t : tok->encode(lines[0])) want.push_back(t);
  want.push_back(2);
  EXPECT_EQ(d.ids[0], want);
  EXPECT_EQ(stores[0]->vocab(), 300);
  EXPECT_EQ(stores[0]->where(1), path("d.jsonl") + ":2");
}

TEST_F(DataTest, NotASentencePieceModelIsAnInputError) {
  write_file(path("tokenizer.model"), "this is not a protobuf\n");
  expect_input_error([&] { make_tokenizer(path("tokenizer.model")); }, {path("tokenizer.model"), "not a SentencePiece model"});
  expect_input_error([&] { make_tokenizer(path("missing.model")); }, {path("missing.model")});
  expect_input_error([&] { make_tokenizer(dir); }, {dir});
}

TEST_F(DataTest, TextFilesAreSortedDocumentsCutIntoPieces) {
  fs::create_directories(path("corpus/sub"));
  // Created out of order; read in sorted path order: a.txt, b.md, sub/c.txt. Hidden files skipped.
  write_file(path("corpus/sub/c.txt"), "third document\n");
  write_file(path("corpus/b.md"), "second\nwith two lines\n");
  write_file(path("corpus/a.txt"), "first");
  write_file(path("corpus/.hidden"), "never read");
  std::vector<std::string> listed;
  for (const DataFile& f : list_data(path("corpus")).files) listed.push_back(f.path);
  EXPECT_EQ(listed, (std::vector<std::string>{path("corpus/a.txt"), path("corpus/b.md"), path("corpus/sub/c.txt")}));
  ByteTokenizer tok;
  auto stores = load({path("corpus")}, tok);
  ASSERT_EQ(stores.size(), 3u);
  const std::vector<std::string> texts = {"first", "second\nwith two lines\n", "third document\n"};
  for (size_t i = 0; i < 3; ++i) {
    const Docs d = docs_of(*stores[i]);
    ASSERT_EQ(d.ids.size(), 1u);
    EXPECT_EQ(d.ids[0], byte_doc(texts[i]));
    EXPECT_TRUE(d.text[0]);
    EXPECT_EQ(d.targets[0], std::vector<uint8_t>(d.ids[0].size(), 1));
  }

  // Unpacked, every text document is cut into pieces [kL, kL + L + 1): every token after a
  // piece's first is predicted once, at positions 0..; a last one-token piece is left out.
  const int64_t L = 7;
  PackOptions po;
  po.seq_len = L;
  po.packing = false;
  TokenDataset ds(stores, po);
  std::vector<std::vector<int32_t>> pieces;
  for (const auto& t : texts) {
    const auto doc = byte_doc(t);
    for (size_t k = 0; k * L + 1 < doc.size(); ++k)
      pieces.emplace_back(doc.begin() + k * L, doc.begin() + std::min(doc.size(), k * L + L + 1));
  }
  ASSERT_EQ(ds.num_sequences(), static_cast<int64_t>(pieces.size()));
  int64_t predicted = 0;
  for (int64_t r = 0; r < ds.num_sequences(); ++r) {
    const Batch b = ds.batch({r});
    const auto& p = pieces[r];
    for (int64_t j = 0; j < L; ++j) {
      EXPECT_EQ(b.inputs[0][j].item<int64_t>(), j < (int64_t)p.size() ? p[j] : 0) << r << "," << j;
      EXPECT_EQ(b.labels[0][j].item<int64_t>(), j + 1 < (int64_t)p.size() ? p[j + 1] : Batch::kIgnore) << r << "," << j;
      EXPECT_EQ(b.position_ids[0][j].item<int64_t>(), j);
    }
    EXPECT_FALSE(b.packed);
    predicted += b.targets;
  }
  int64_t total = 0;
  for (const auto& t : texts) total += static_cast<int64_t>(t.size()) + 1;  // every token but BOS
  EXPECT_EQ(predicted, total);
  // Deterministic: a second load yields the same batch.
  EXPECT_TRUE(TokenDataset(load({path("corpus")}, tok), po).batch({2}).inputs.equal(ds.batch({2}).inputs));
}

TEST_F(DataTest, LargeTextIsStreamedInBlocksWithoutChangingTheTokens) {
  // ~9 MB: several 4 MiB blocks and many 64 KiB segments, one of them a line longer than a block
  // with multi-byte characters (cut at a character boundary).
  std::string text;
  for (int i = 0; text.size() < (size_t(5) << 20); ++i) text += "line " + std::to_string(i) + " of a long file\n";
  for (int i = 0; i < 600000; ++i) text += "\xc3\xa9t\xc3\xa9 ";  // "été " x 600k: 4.2 MB without a newline
  text += "\nend\n";
  write_file(path("big.txt"), text);
  ByteTokenizer tok;
  ReadStats stats;
  auto stores = load({path("big.txt")}, tok, &stats);
  const Docs d = docs_of(*stores[0]);
  ASSERT_EQ(d.ids.size(), 1u);
  EXPECT_EQ(d.ids[0], byte_doc(text));
  EXPECT_EQ(stats.documents, 1);
  EXPECT_EQ(stats.bytes, static_cast<int64_t>(text.size()));
}

TEST_F(DataTest, JsonlFormatsAndDroppedRecords) {
  write_file(path("mixed.jsonl"),
             "{\"text\": \"alpha\", \"id\": 1}\n"
             "\n  \n"
             "{\"prompt\": \"Q\", \"completion\": \"A\"}\n"
             "{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}\n"
             "{\"text\": \"b\"\n"                                                                    // line 6: invalid JSON
             "{\"messages\": [{\"role\": \"bot\", \"content\": \"x\"}]}\n"                           // 7: unknown role
             "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"b\"}]}\n"  // 8
             "{\"messages\": [{\"role\": \"user\", \"content\": \"only a question\"}]}\n"            // 9: no targets
             "{\"text\": \"\"}\n");                                                                  // skipped quietly
  ByteTokenizer tok;
  ReadStats stats;
  auto stores = load({path("mixed.jsonl")}, tok, &stats);
  const Docs d = docs_of(*stores[0]);
  ASSERT_EQ(d.ids.size(), 3u);
  EXPECT_EQ(d.ids[0], byte_doc("alpha"));
  EXPECT_TRUE(d.text[0]);
  EXPECT_EQ(d.ids[1], byte_doc("QA"));
  EXPECT_EQ(d.targets[1], (std::vector<uint8_t>{0, 0, 1, 1}));
  EXPECT_FALSE(d.text[1]);
  EXPECT_EQ(stores[0]->where(0), path("mixed.jsonl") + ":1");
  EXPECT_EQ(stores[0]->where(2), path("mixed.jsonl") + ":5");
  EXPECT_EQ(stats.documents, 3);
  EXPECT_EQ(stats.dropped, 4);
  EXPECT_EQ(stats.dropped_by_kind, (std::map<std::string, int64_t>{
                                       {"invalid JSON", 1}, {"unknown role", 1}, {"roles do not alternate", 1}, {"no target tokens", 1}}));
  ASSERT_EQ(stats.warnings.size(), 4u);
  EXPECT_EQ(stats.warnings[0].rfind(path("mixed.jsonl") + ":6: dropped (invalid JSON", 0), 0u) << stats.warnings[0];
  EXPECT_EQ(stats.warnings[1].rfind(path("mixed.jsonl") + ":7: dropped (message 1 has unknown role \"bot\"", 0), 0u) << stats.warnings[1];
  EXPECT_EQ(stats.warnings[2].rfind(path("mixed.jsonl") + ":8: dropped (message 2 is \"user\"", 0), 0u) << stats.warnings[2];
  EXPECT_EQ(stats.warnings[3].rfind(path("mixed.jsonl") + ":9: dropped (no target tokens", 0), 0u) << stats.warnings[3];
  EXPECT_EQ(stats.drop_summary(),
            "4 of 7 examples dropped (1 invalid JSON, 1 no target tokens, 1 roles do not alternate, 1 unknown role)");

  // Only bad records: nothing trainable.
  write_file(path("bad.jsonl"), "{\"text\": \"b\"\n{\"messages\": []}\n");
  ReadStats bad;
  auto none = load({path("bad.jsonl")}, tok, &bad);
  EXPECT_EQ(bad.documents, 0);
  expect_input_error([&] { TokenDataset(none, PackOptions{}); }, {path("bad.jsonl"), "no trainable sequence"});
  // Warnings stop at kMaxWarnings; the counts do not.
  std::string many;
  for (int i = 0; i < 25; ++i) many += "not json\n";
  write_file(path("many.jsonl"), many + "{\"text\": \"ok\"}\n");
  ReadStats m;
  load({path("many.jsonl")}, tok, &m);
  EXPECT_EQ(m.dropped, 25);
  EXPECT_EQ(m.warnings.size(), ReadStats::kMaxWarnings);
}

TEST_F(DataTest, TokenFileRoundTripLayoutAndValidation) {
  // Three documents: a chat example (targets), plain text, an example again; an odd token count.
  const std::vector<std::vector<int32_t>> ids = {{256, 1, 2, 3, 257}, {256, 9, 8, 257}, {256, 7, 6, 5, 4, 3, 2, 257}};
  const std::vector<std::vector<uint8_t>> tg = {{0, 0, 1, 1, 1}, {1, 1, 1, 1}, {0, 0, 0, 0, 1, 1, 1, 1}};
  const std::vector<bool> text = {false, true, false};
  {
    TokenFileWriter w(path("t.bin"), 258);
    for (size_t i = 0; i < ids.size(); ++i) {
      w.begin_document(text[i], 0);
      w.append(ids[i].data(), tg[i].data(), 2);  // in two appends
      w.append(ids[i].data() + 2, tg[i].data() + 2, ids[i].size() - 2);
      w.end_document();
    }
    w.begin_document(false, 0);  // an empty document is not stored
    w.end_document();
    w.finish();
  }
  std::ifstream in(path("t.bin"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t n = 17, docs = 3;
  ASSERT_EQ(bytes.size(), 32 + 4 * n + 4 /*pad*/ + 8 * (docs + 1));
  EXPECT_EQ(bytes.substr(0, 8), std::string("TSRTOK2\0", 8));
  auto u32 = [&](size_t at) { return load_le<uint32_t>(bytes.data() + at); };
  auto u64 = [&](size_t at) { return load_le<uint64_t>(bytes.data() + at); };
  EXPECT_EQ(u32(8), 258u);
  EXPECT_EQ(u64(16), n);
  EXPECT_EQ(u64(24), docs);
  EXPECT_EQ(u32(32), 256u);                      // first token: BOS, not a target
  EXPECT_EQ(u32(32 + 4 * 2), 2u | kTargetBit);   // third token: 2, a target
  const size_t table = 32 + 4 * n + 4;
  EXPECT_EQ(u64(table), 0u);
  EXPECT_EQ(u64(table + 8), 5u | kTextBit);
  EXPECT_EQ(u64(table + 16), 9u);
  EXPECT_EQ(u64(table + 24), n);

  auto store = open_token_file(path("t.bin"));
  const Docs d = docs_of(*store);
  EXPECT_EQ(d.ids, ids);
  EXPECT_EQ(d.targets, tg);
  EXPECT_EQ(d.text, text);
  EXPECT_EQ(store->where(1), path("t.bin") + ": document 2");
  EXPECT_TRUE(is_token_file(path("t.bin")));

  // A token file trains like the JSONL it came from.
  write_file(path("x.jsonl"), "{\"prompt\": \"pp\", \"completion\": \"cc\"}\n{\"text\": \"tt tt\"}\n");
  ByteTokenizer tok;
  auto from_jsonl = load({path("x.jsonl")}, tok);
  {
    TokenFileWriter w(path("x.bin"), 258);
    const Docs src = docs_of(*from_jsonl[0]);
    for (size_t i = 0; i < src.ids.size(); ++i) {
      w.begin_document(src.text[i], 0);
      w.append(src.ids[i].data(), src.targets[i].data(), src.ids[i].size());
      w.end_document();
    }
    w.finish();
  }
  PackOptions po;
  po.seq_len = 16;
  const Batch a = TokenDataset(from_jsonl, po).batch({0}), b = TokenDataset(load({path("x.bin")}, tok), po).batch({0});
  EXPECT_TRUE(a.inputs.equal(b.inputs) && a.labels.equal(b.labels) && a.document_ids.equal(b.document_ids));
  EXPECT_EQ(a.targets, 3 + 6);  // "cc" + EOS, then "tt tt" + EOS

  // Version 1 files (earlier Tessera): one plain-text document, every token a target.
  std::string v1("TSRTOK1\0", 8);
  v1 += std::string("\x02\x01\x00\x00", 4) + std::string("\x03\0\0\0\0\0\0\0", 8);
  for (int32_t t : {256, 65, 257}) v1 += std::string(reinterpret_cast<const char*>(&t), 4);
  write_file(path("v1.bin"), v1);
  const Docs old = docs_of(*open_token_file(path("v1.bin")));
  EXPECT_EQ(old.ids, (std::vector<std::vector<int32_t>>{{256, 65, 257}}));
  EXPECT_EQ(old.targets[0], (std::vector<uint8_t>{1, 1, 1}));
  EXPECT_TRUE(old.text[0]);

  // Bad files name the file; a failed write leaves nothing behind.
  write_file(path("bad.bin"), "NOTMAGIC________________________________");
  expect_input_error([&] { open_token_file(path("bad.bin")); }, {path("bad.bin"), "magic"});
  write_file(path("trunc.bin"), bytes.substr(0, bytes.size() - 3));
  expect_input_error([&] { open_token_file(path("trunc.bin")); }, {path("trunc.bin"), "bytes", "17 tokens"});
  std::string disorder = bytes;
  store_le<uint64_t>(&disorder[table + 16], 3);  // document 2 starts before document 1
  write_file(path("disorder.bin"), disorder);
  expect_input_error([&] { open_token_file(path("disorder.bin")); }, {path("disorder.bin"), "document table entry 2"});
  {
    TokenFileWriter w(path("oob.bin"), 258);
    w.begin_document(false, 0);
    const int32_t bad_ids[2] = {1, 300};
    const uint8_t t[2] = {1, 1};
    expect_input_error([&] { w.append(bad_ids, t, 2); }, {path("oob.bin"), "300"});
  }
  EXPECT_FALSE(fs::exists(path("oob.bin")));
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
  // The token file's vocab must be the tokenizer's.
  auto sp_vocab = [&] {
    TokenFileWriter w(path("v.bin"), 32000);
    const int32_t x[2] = {1, 2};
    const uint8_t t[2] = {1, 1};
    w.begin_document(true, 0);
    w.append(x, t, 2);
    w.end_document();
    w.finish();
  };
  sp_vocab();
  expect_input_error([&] { load({path("v.bin")}, tok); }, {path("v.bin"), "32000", "258"});
}

// Packing: rows hold several examples at restarted positions with their own document ids; labels
// are targets only within an example (and only on target tokens for train_on=completion).
TEST(DocumentOffsets, RowsEndDocumentsAndIdsChangeThem) {
  // Two rows of 5: documents [0, 2), [2, 5) | [5, 8), [8, 10); the same id across a row's end is
  // another document.
  const auto [cu, longest] = tessera::data::document_offsets(
      at::tensor(std::vector<int64_t>{0, 0, 1, 1, 1, 1, 1, 1, 2, 2}).view({2, 5}));
  EXPECT_TRUE(cu.equal(at::tensor(std::vector<int32_t>{0, 2, 5, 8, 10})));
  EXPECT_EQ(longest, 3);
  const auto [one, l1] = tessera::data::document_offsets(at::zeros({3, 4}, at::kLong));
  EXPECT_TRUE(one.equal(at::tensor(std::vector<int32_t>{0, 4, 8, 12})));
  EXPECT_EQ(l1, 4);
}

TEST_F(DataTest, PackingPositionsDocumentsAndLabels) {
  std::string jsonl;
  std::vector<std::pair<std::string, std::string>> pcs;
  for (int i = 0; i < 40; ++i) {
    pcs.emplace_back("p" + std::string(i % 5, 'x'), "c" + std::string(i % 3, 'y'));
    jsonl += "{\"prompt\": \"" + pcs.back().first + "\", \"completion\": \"" + pcs.back().second + "\"}\n";
  }
  write_file(path("pc.jsonl"), jsonl);
  ByteTokenizer tok;
  const int64_t L = 24;
  PackOptions po;
  po.seq_len = L;
  TokenDataset packed(load({path("pc.jsonl")}, tok), po);
  // Greedy packing recomputed independently: example i has n_i = 2 + |p| + |c| tokens.
  std::vector<std::vector<size_t>> rows;
  int64_t fill = 0;
  for (size_t i = 0; i < pcs.size(); ++i) {
    const int64_t n = 2 + pcs[i].first.size() + pcs[i].second.size();
    if (rows.empty() || fill + n > L + 1) rows.push_back({}), fill = 0;
    rows.back().push_back(i), fill += n;
  }
  ASSERT_EQ(packed.num_sequences(), static_cast<int64_t>(rows.size()));
  EXPECT_EQ(packed.num_units(), 40);
  for (size_t r = 0; r < rows.size(); ++r) {
    const Batch b = packed.batch({static_cast<int64_t>(r)});
    EXPECT_EQ(b.packed, rows[r].size() > 1);
    std::vector<int64_t> in, lab, pos, doc;
    int64_t targets = 0;
    for (size_t k = 0; k < rows[r].size(); ++k) {
      const auto& [p, c] = pcs[rows[r][k]];
      const auto ids = byte_doc(p + c);
      for (size_t i = 0; i < ids.size(); ++i) {
        in.push_back(ids[i]);
        pos.push_back(i);
        doc.push_back(k);
        const bool target = i + 1 < ids.size() && i + 1 >= 1 + p.size();  // completion + EOS
        lab.push_back(target ? ids[i + 1] : Batch::kIgnore);
        targets += target;
      }
    }
    const int64_t used = static_cast<int64_t>(in.size());
    for (int64_t j = used; j < L + 1; ++j)
      in.push_back(0), lab.push_back(Batch::kIgnore), pos.push_back(pos.back() + 1), doc.push_back(doc.back());
    in.resize(L), lab.resize(L), pos.resize(L), doc.resize(L);
    for (int64_t j = 0; j < L; ++j) {
      EXPECT_EQ(b.inputs[0][j].item<int64_t>(), in[j]) << r << "," << j;
      EXPECT_EQ(b.labels[0][j].item<int64_t>(), lab[j]) << r << "," << j;
      EXPECT_EQ(b.position_ids[0][j].item<int64_t>(), pos[j]) << r << "," << j;
      EXPECT_EQ(b.document_ids[0][j].item<int64_t>(), doc[j]) << r << "," << j;
    }
    EXPECT_EQ(b.targets, targets);
    if (!b.packed) continue;
    // The variable-length kernel's offsets: each document's first token, then L.
    std::vector<int32_t> starts;
    int64_t longest = 0;
    for (int64_t j = 0; j < L; ++j)
      if (j == 0 || doc[j] != doc[j - 1]) starts.push_back(static_cast<int32_t>(j));
    starts.push_back(static_cast<int32_t>(L));
    for (size_t k = 0; k + 1 < starts.size(); ++k) longest = std::max<int64_t>(longest, starts[k + 1] - starts[k]);
    ASSERT_EQ(b.cu_seqlens.numel(), static_cast<int64_t>(starts.size())) << r;
    for (size_t k = 0; k < starts.size(); ++k) EXPECT_EQ(b.cu_seqlens[k].item<int32_t>(), starts[k]) << r;
    EXPECT_EQ(b.max_seqlen, longest) << r;
  }
  // train_on = all: every token after an example's first is a target; never across examples.
  po.train_on_all = true;
  const Batch all = TokenDataset(load({path("pc.jsonl")}, tok), po).batch({0});
  int64_t want = 0;
  for (size_t i : rows[0]) want += 1 + pcs[i].first.size() + pcs[i].second.size();
  EXPECT_EQ(all.targets, want);
  // packing = false: one example per row, padded.
  po.train_on_all = false;
  po.packing = false;
  TokenDataset padded(load({path("pc.jsonl")}, tok), po);
  EXPECT_EQ(padded.num_sequences(), 40);
  const Batch one = padded.batch({3});
  EXPECT_FALSE(one.packed);
  EXPECT_EQ(one.inputs[0][0].item<int64_t>(), 256);
  EXPECT_EQ(one.inputs[0][L - 1].item<int64_t>(), 0);
  // Many rows: the row index (a cursor every 64 rows) rebuilds any row as a full scan would.
  std::string longer;
  for (int i = 0; i < 700; ++i) longer += "{\"prompt\": \"" + std::string(1 + i % 9, 'q') + "\", \"completion\": \"a\"}\n";
  write_file(path("long.jsonl"), longer);
  po.packing = true;
  TokenDataset many(load({path("long.jsonl")}, tok), po);
  ASSERT_GT(many.num_sequences(), 150);
  std::vector<int64_t> starts;  // the first unit's length in each row, from a scan
  fill = L + 1;
  for (int i = 0; i < 700; ++i) {
    const int64_t n = 2 + (1 + i % 9) + 1;
    if (fill + n > L + 1) starts.push_back(n), fill = 0;
    fill += n;
  }
  ASSERT_EQ(many.num_sequences(), static_cast<int64_t>(starts.size()));
  for (int64_t r : {0L, 63L, 64L, 65L, 130L, static_cast<long>(starts.size()) - 2}) {
    const Batch b = many.batch({r});  // rows hold >= 2 units: the second starts at starts[r]
    const int64_t n = starts[r];
    EXPECT_EQ(b.document_ids[0][n - 1].item<int64_t>(), 0) << "row " << r;
    EXPECT_EQ(b.position_ids[0][n - 1].item<int64_t>(), n - 1) << "row " << r;
    EXPECT_EQ(b.document_ids[0][n].item<int64_t>(), 1) << "row " << r;
    EXPECT_EQ(b.position_ids[0][n].item<int64_t>(), 0) << "row " << r;
  }
  // Ids beyond the model's vocab are refused when batched, naming the file and line.
  po.vocab_limit = 200;
  expect_input_error([&] { TokenDataset(load({path("pc.jsonl")}, tok), po).batch({0}); }, {path("pc.jsonl") + ":1", "256", "200"});
}

TEST_F(DataTest, TruncationDropLeftError) {
  write_file(path("t.jsonl"),
             "{\"prompt\": \"short\", \"completion\": \"ok\"}\n"
             "{\"prompt\": \"a prompt that is far too long for eight\", \"completion\": \"END\"}\n"
             "{\"messages\": [{\"role\": \"user\", \"content\": \"" + std::string(30, 'u') +
                 "\"}, {\"role\": \"assistant\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"" +
                 std::string(30, 'v') + "\"}]}\n");  // the target lies before the last 9 tokens
  ByteTokenizer tok;
  PackOptions po;
  po.seq_len = 8;
  TokenDataset dropped(load({path("t.jsonl")}, tok), po);
  EXPECT_EQ(dropped.num_units(), 1);
  EXPECT_EQ(dropped.stats().dropped, 2);
  ASSERT_EQ(dropped.stats().warnings.size(), 2u);
  EXPECT_EQ(dropped.stats().warnings[0].rfind(path("t.jsonl") + ":2: dropped (example of 44 tokens is longer than data.seq_len + 1 = 9", 0), 0u)
      << dropped.stats().warnings[0];
  po.truncation = Truncation::Left;
  TokenDataset left(load({path("t.jsonl")}, tok), po);
  EXPECT_EQ(left.num_units(), 2);  // the chat keeps no target in its last 9 tokens: dropped
  EXPECT_EQ(left.stats().dropped_by_kind.at("no target tokens"), 1);
  const Batch b = left.batch({1});
  std::vector<int32_t> tail = byte_doc("a prompt that is far too long for eightEND");
  tail.erase(tail.begin(), tail.end() - 9);
  for (int64_t j = 0; j < 8; ++j) EXPECT_EQ(b.inputs[0][j].item<int64_t>(), tail[j]);
  EXPECT_EQ(b.targets, 4);  // "END" + EOS
  po.truncation = Truncation::Error;
  expect_input_error([&] { TokenDataset(load({path("t.jsonl")}, tok), po); },
                     {path("t.jsonl") + ":2", "44 tokens", "data.truncation = error"});
  EXPECT_EQ(parse_truncation("left"), Truncation::Left);
  expect_input_error([] { parse_truncation("right"); }, {"data.truncation 'right'"});
}

TEST_F(DataTest, ValidationSplitIsDisjointCompleteAndFixed) {
  std::string jsonl;
  for (int i = 0; i < 500; ++i) jsonl += "{\"prompt\": \"q" + std::to_string(i) + "\", \"completion\": \"a\"}\n";
  write_file(path("s.jsonl"), jsonl);
  ByteTokenizer tok;
  auto stores = load({path("s.jsonl")}, tok);
  PackOptions po;
  po.seq_len = 16;
  po.packing = false;
  po.val_fraction = 0.1;
  TokenDataset train(stores, po);
  po.validation = true;
  TokenDataset val(stores, po);
  EXPECT_EQ(train.num_units() + val.num_units(), 500);
  EXPECT_GT(val.num_units(), 25);
  EXPECT_LT(val.num_units(), 80);
  auto prompts = [](const TokenDataset& d) {
    std::set<std::string> out;
    for (int64_t r = 0; r < d.num_sequences(); ++r) {
      const Batch b = d.batch({r});
      std::string s;
      for (int64_t j = 1; j < d.seq_len() && b.inputs[0][j].item<int64_t>() != 'a'; ++j) s += char(b.inputs[0][j].item<int64_t>());
      out.insert(s);
    }
    return out;
  };
  const auto a = prompts(train), b = prompts(val);
  for (const auto& p : b) EXPECT_EQ(a.count(p), 0u) << p;
  EXPECT_EQ(a.size() + b.size(), 500u);
  TokenDataset again(load({path("s.jsonl")}, tok), po);
  EXPECT_EQ(prompts(again), b);  // the same split on every load (and rank)
  po.val_fraction = 1.5;
  expect_input_error([&] { TokenDataset(stores, po); }, {"data.val_fraction"});
}

TEST_F(DataTest, EmptyMissingAndShortData) {
  ByteTokenizer tok;
  write_file(path("empty.txt"), "");
  expect_input_error([&] { TokenDataset(load({path("empty.txt")}, tok), PackOptions{}); },
                     {path("empty.txt"), "no trainable sequence", "0 tokens"});
  fs::create_directories(path("emptydir"));
  expect_input_error([&] { load({path("emptydir")}, tok); }, {path("emptydir"), "no data files"});
  expect_input_error([&] { load({path("nope")}, tok); }, {path("nope"), "does not exist"});
  write_file(path("short.txt"), "abcd");  // 6 tokens: one unit of seq_len 5, or a short one of 8
  PackOptions po;
  po.seq_len = 8;
  EXPECT_EQ(TokenDataset(load({path("short.txt")}, tok), po).num_sequences(), 1);
  po.seq_len = 0;
  expect_input_error([&] { TokenDataset(load({path("short.txt")}, tok), po); }, {"seq_len"});
}

// ---- Data formats (format.h): detection, directories, JSON arrays and gzip, Alpaca and ShareGPT.

namespace {

// The formats list_data gives for `p`, by file name: "a.jsonl=jsonl b.json=json".
std::string formats_of(const std::string& p, DataFormat format = DataFormat::Auto) {
  std::string out;
  for (const DataFile& f : list_data(p, format).files)
    out += (out.empty() ? "" : " ") + fs::path(f.path).filename().string() + "=" + f.name();
  return out;
}

// The records every format test writes, as JSONL lines.
const std::vector<std::string> kRecords = {
    R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})",
    R"({"prompt": "2+2=", "completion": "4"})",
    R"({"text": "plain words"})",
    R"({"instruction": "Add", "input": "1 and 2", "output": "3"})",
    R"({"conversations": [{"from": "human", "value": "hello"}, {"from": "gpt", "value": "hey"}]})"};

}  // namespace

TEST_F(DataTest, FormatsAreDecidedByContentAndExtension) {
  const std::string jsonl = kRecords[0] + "\n" + kRecords[1] + "\n";
  write_file(path("a.jsonl"), jsonl);
  write_file(path("lines.json"), jsonl);                                    // JSON Lines named .json
  write_file(path("array.json"), "[\n  " + kRecords[0] + ",\n  " + kRecords[1] + "\n]\n");
  write_file(path("array.jsonl"), "[" + kRecords[0] + "]");                  // an array named .jsonl
  write_file(path("b.jsonl.gz.src"), jsonl);
  run_capture("gzip -c " + path("b.jsonl.gz.src") + " > " + path("b.jsonl.gz"));
  run_capture("gzip -c " + path("array.json") + " > " + path("c.json.gz"));
  write_file(path("notes.txt"), "text\n");
  write_file(path("README.md"), "# title\n");
  write_file(path("GPL-2"), "licence\n");
  write_file(path("Apache-2.0"), "licence\n");  // a version number, not an extension
  write_file(path("t.bin"), "not checked here: train maps it");
  write_file(path("one.json"), kRecords[2]);  // one record, no newline: JSON Lines of one line
  write_file(path("train"), jsonl);            // no extension: records by content, not plain text
  write_file(path("chats"), "[" + kRecords[0] + "]");
  for (const auto& [name, want] : std::vector<std::pair<std::string, std::string>>{
           {"a.jsonl", "jsonl"}, {"lines.json", "jsonl"}, {"array.json", "json"}, {"array.jsonl", "json"},
           {"b.jsonl.gz", "jsonl.gz"}, {"c.json.gz", "json.gz"}, {"notes.txt", "text"}, {"README.md", "text"},
           {"GPL-2", "text"}, {"Apache-2.0", "text"}, {"t.bin", "tokens"}, {"one.json", "jsonl"},
           {"train", "jsonl"}, {"chats", "json"}})
    EXPECT_EQ(detect_file(path(name)).name(), want) << name;
  // data.format forces the format, whatever the name.
  EXPECT_EQ(detect_file(path("a.jsonl"), DataFormat::Text).name(), "text");
  EXPECT_EQ(detect_file(path("notes.txt"), DataFormat::Jsonl).name(), "jsonl");
  EXPECT_EQ(detect_file(path("b.jsonl.gz"), DataFormat::Text).name(), "text.gz");
  expect_input_error([&] { detect_file(path("GPL-2"), DataFormat::Json); },
                     {path("GPL-2"), "does not parse as JSON", "at line 1, column "});
}

TEST_F(DataTest, UnreadableFilesAreRefusedNamingTheFileAndWhatToDo) {
  const std::string bad_json = "{\n  \"messages\": [\n    {\"role\": \"user\" \"content\": \"x\"}\n  ]\n}\n";
  write_file(path("x.parquet"), std::string("PAR1\x15\x04", 6) + "....PAR1");
  write_file(path("data.json"), std::string("PAR1", 4) + "rest");  // the magic decides, not the name
  write_file(path("x.zip"), std::string("PK\x03\x04", 4) + "zipped");
  write_file(path("nul.jsonl"), std::string("{\"text\": \"a\"}\n\0\0\0", 17));
  write_file(path("latin1.txt"), "caf\xe9\n");
  write_file(path("bad.json"), bad_json);
  write_file(path("object.json"), "{\n  \"features\": {}\n}\n");  // dataset_info.json-like
  write_file(path("splits.json"), "{\"splits\": [\"train\"]}\n");   // dataset_dict.json-like: no record field
  write_file(path("corrupt.jsonl.gz"), std::string("\x1f\x8b\x08\x00garbage that is not deflate", 30));
  write_file(path("plain.jsonl.gz"), "{\"text\": \"a\"}\n");
  write_file(path("t.csv"), "a,b\n1,2\n");
  write_file(path("script.py"), "print(1)\n");
  write_file(path("data.arrow"), std::string("\xff\xff\xff\xff\x10\x00\x00\x00", 8));
  // TRL's preference formats, standard and conversational (implicit prompt), are named once per file.
  write_file(path("pref.jsonl"), "\n{\"prompt\": \"2+2?\", \"chosen\": \"4\", \"rejected\": \"5\"}\n{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"c\"}\n");
  write_file(path("pref.json"), "[\n {\"chosen\": [{\"role\": \"user\", \"content\": \"[hi]\"}, {\"role\": \"assistant\", \"content\": \"yo\"}],\n"
                                "  \"rejected\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"no\"}]}\n]\n");
  for (const auto& [name, needles] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"x.parquet", {"Parquet", "read_parquet"}},
           {"data.json", {"Parquet"}},
           {"x.zip", {"zip archive", "unzip"}},
           {"nul.jsonl", {"binary content", "NUL byte at offset 14"}},
           {"latin1.txt", {"binary content", "byte 0xe9 at offset 3, not UTF-8"}},
           {"bad.json", {"does not parse as JSON", "at line 3, column "}},
           {"object.json", {"holds one JSON object, not records"}},
           {"splits.json", {"holds one JSON object, not records"}},
           {"corrupt.jsonl.gz", {"corrupt gzip", "gzip -t"}},
           {"plain.jsonl.gz", {"not gzip"}},
           {"t.csv", {"table", "read_csv"}},
           {"script.py", {"unknown extension .py", "data.format"}},
           {"data.arrow", {"Arrow file", "to_json"}},
           {"pref.jsonl", {"looks like preference data (prompt/chosen/rejected, line 2); Tessera does not do preference training",
                           "convert \"chosen\" to messages or a completion", "map(json.loads, open('" + path("pref.jsonl") + "'))",
                           "> " + path("pref.jsonl") + ".sft.jsonl"}},
           {"pref.json", {"looks like preference data (chosen/rejected, line 2)", "json.load(open("}}}) {
    SCOPED_TRACE(name);
    try {
      list_data(path(name));
      ADD_FAILURE() << "expected an input error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Input) << e.what();
      const std::string what = e.what();
      EXPECT_NE(what.find("data file " + path(name)), std::string::npos) << what;
      for (const auto& n : needles) EXPECT_NE(what.find(n), std::string::npos) << what << " lacks " << n;
      EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
    }
  }
  // A truncated gzip passes detection (its first 64 KiB are fine) and is refused where it is read.
  std::string big;
  for (int i = 0; i < 40000; ++i) big += "{\"text\": \"record " + std::to_string(i * 7919) + "\"}\n";
  write_file(path("big.jsonl"), big);
  run_capture("gzip -c " + path("big.jsonl") + " | head -c 100000 > " + path("cut.jsonl.gz"));
  EXPECT_EQ(detect_file(path("cut.jsonl.gz")).name(), "jsonl.gz");
  ByteTokenizer tok;
  expect_input_error([&] { load({path("cut.jsonl.gz")}, tok); }, {path("cut.jsonl.gz"), "corrupt gzip"});
}

TEST_F(DataTest, DirectoriesTakeTheirDataFilesAndSayWhichWereSkipped) {
  fs::create_directories(path("mixed/sub"));
  write_file(path("mixed/a.jsonl"), kRecords[0] + "\n");
  write_file(path("mixed/sub/b.jsonl"), kRecords[1] + "\n");
  write_file(path("mixed/c.src"), kRecords[2] + "\n");
  run_capture("gzip -c " + path("mixed/c.src") + " > " + path("mixed/c.jsonl.gz") + " && rm " + path("mixed/c.src"));
  write_file(path("mixed/README.md"), "# A data set\n");
  write_file(path("mixed/dataset_info.json"), "{\n  \"citation\": \"\"\n}\n");
  write_file(path("mixed/.hidden.jsonl"), "never read");
  const DataListing l = list_data(path("mixed"));
  EXPECT_EQ(l.summary(), "3 files (2 jsonl, 1 jsonl.gz); skipped: README.md, dataset_info.json");
  EXPECT_EQ(formats_of(path("mixed")), "a.jsonl=jsonl c.jsonl.gz=jsonl.gz b.jsonl=jsonl");
  // Text alone is the data; a file that is refused alone is refused in a directory too.
  fs::create_directories(path("texts"));
  write_file(path("texts/GPL-3"), "licence\n");
  write_file(path("texts/notes.md"), "notes\n");
  write_file(path("texts/run.sh"), "#!/bin/sh\n");
  EXPECT_EQ(list_data(path("texts")).summary(), "2 files (text); skipped: run.sh");
  write_file(path("texts/blob.txt"), std::string("\0\1\2", 3));
  expect_input_error([&] { list_data(path("texts")); }, {path("texts/blob.txt"), "binary content"});
  // A Hugging Face save_to_disk folder holds no file Tessera reads: refused with the export to run.
  fs::create_directories(path("hf/train"));
  write_file(path("hf/dataset_dict.json"), "{\"splits\": [\"train\"]}");
  write_file(path("hf/train/data-00000-of-00001.arrow"), std::string("\xff\xff\xff\xff\x78\x00\x00\x00", 8));
  write_file(path("hf/train/dataset_info.json"), "{\n  \"features\": {}\n}\n");
  write_file(path("hf/train/state.json"), "{\n  \"_split\": \"train\"\n}\n");
  expect_input_error([&] { list_data(path("hf")); },
                     {path("hf/train/data-00000-of-00001.arrow"), "save_to_disk", "load_from_disk('" + path("hf/train")});
  fs::create_directories(path("nothing"));
  write_file(path("nothing/config.yaml"), "a: 1\n");
  expect_input_error([&] { list_data(path("nothing")); }, {path("nothing"), "no data files", "skipped: config.yaml"});
}

TEST_F(DataTest, JsonArraysAndGzipGiveTheDocumentsOfTheirJsonl) {
  std::string jsonl, pretty = "\xef\xbb\xbf[\n", compact = "[";  // the pretty one opens with a UTF-8 BOM
  for (size_t i = 0; i < kRecords.size(); ++i) {
    jsonl += kRecords[i] + "\n";
    pretty += "  " + kRecords[i] + (i + 1 < kRecords.size() ? ",\n" : "\n");
    compact += kRecords[i] + (i + 1 < kRecords.size() ? "," : "]");
  }
  write_file(path("r.jsonl"), jsonl);
  write_file(path("r.json"), pretty + "]\n");
  write_file(path("compact.json"), compact);
  run_capture("gzip -k " + path("r.jsonl") + " " + path("r.json"));
  ByteTokenizer tok;
  const Docs want = docs_of(*load({path("r.jsonl")}, tok)[0]);
  ASSERT_EQ(want.ids.size(), kRecords.size());
  for (const char* name : {"r.json", "compact.json", "r.jsonl.gz", "r.json.gz"}) {
    ReadStats stats;
    const Docs d = docs_of(*load({path(name)}, tok, &stats)[0]);
    EXPECT_EQ(d.ids, want.ids) << name;
    EXPECT_EQ(d.targets, want.targets) << name;
    EXPECT_EQ(stats.dropped, 0) << name;
  }
  // A record the renderer refuses is dropped, named by line, column and index.
  write_file(path("drops.json"), "[\n  {\"text\": \"ok\"},\n  {\"messages\": []}, 7\n]");
  ReadStats stats;
  load({path("drops.json")}, tok, &stats);
  EXPECT_EQ(stats.documents, 1);
  ASSERT_EQ(stats.warnings.size(), 2u);
  EXPECT_EQ(stats.warnings[0].rfind(path("drops.json") + ":3:3 (record 2): dropped (", 0), 0u) << stats.warnings[0];
  EXPECT_EQ(stats.warnings[1].rfind(path("drops.json") + ":3:21 (record 3): dropped (expected a JSON object", 0), 0u)
      << stats.warnings[1];
  // A broken array is the file's error, with line and column: never a guess at what was meant.
  for (const auto& [text, needles] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"[{\"text\": \"a\"},]", {"line 1, column 16", "trailing commas"}},
           {"[{\"text\": \"a\"} {\"text\": \"b\"}]", {"line 1, column 16", "expected ',' or ']' after record 1"}},
           {"[\n{\"text\": \"a\"}", {"not closed"}},
           {"[\n  {\"text\": \"a\"},\n  {\"text\": tru}\n]", {"at line 3, column ", "in record 2", "invalid literal"}},
           {"[1]\n[2]", {"line 2, column 1", "content after the array's closing ']'"}}}) {
    write_file(path("broken.json"), text);
    expect_input_error([&] { load({path("broken.json")}, tok); }, {path("broken.json"), "does not parse as"});
    for (const auto& n : needles) expect_input_error([&] { load({path("broken.json")}, tok); }, {n});
  }
}

namespace {

// render_record of `record` has the tokens and targets of the `messages` record `equivalent`.
void expect_renders_as(const std::string& record, const std::string& equivalent) {
  ByteTokenizer tok;
  for (const char* name : {"llama2", "none"}) {
    const auto chat = make_chat_template(name);
    const Example a = render_record(nlohmann::json::parse(record), tok, *chat);
    const Example b = render_record(nlohmann::json::parse(equivalent), tok, *chat);
    EXPECT_EQ(a.tokens, b.tokens) << name << ": " << record;
    EXPECT_EQ(a.target, b.target) << name << ": " << record;
    EXPECT_GT(a.num_targets(), 0) << record;
  }
}

// The BadExample render_record throws for `record`.
std::string refusal_of(const std::string& record) {
  ByteTokenizer tok;
  try {
    render_record(nlohmann::json::parse(record), tok, *make_chat_template("llama2"));
  } catch (const BadExample& e) {
    return e.what();
  }
  return "(rendered)";
}

}  // namespace

TEST(Records, AlpacaAndShareGptRenderAsTheirMessages) {
  const std::string user_hi_assistant_yo =
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})";
  expect_renders_as(R"({"instruction": "hi", "output": "yo"})", user_hi_assistant_yo);
  expect_renders_as(R"({"instruction": "hi", "input": "", "output": "yo"})", user_hi_assistant_yo);
  // tatsu-lab/alpaca's records also carry the whole prompt as "text": the Alpaca fields win (masked).
  expect_renders_as(R"({"instruction": "hi", "input": "", "output": "yo", "text": "### Instruction: hi"})",
                    user_hi_assistant_yo);
  expect_renders_as(R"({"instruction": "Add", "input": "1 and 2", "output": "3", "system": "Be brief."})",
                    R"({"messages": [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": "Add\n\n1 and 2"},
                                     {"role": "assistant", "content": "3"}]})");
  expect_renders_as(R"({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]})",
                    user_hi_assistant_yo);
  expect_renders_as(R"({"conversations": [{"from": "user", "value": "hi"}, {"from": "assistant", "value": "yo"}]})",
                    user_hi_assistant_yo);
  expect_renders_as(R"({"conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})",
                    user_hi_assistant_yo);
  const std::string with_system = R"({"messages": [{"role": "system", "content": "S"},
      {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
      {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]})";
  expect_renders_as(R"({"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "a"},
      {"from": "gpt", "value": "b"}, {"from": "human", "value": "c"}, {"from": "gpt", "value": "d"}]})",
                    with_system);
  expect_renders_as(R"({"system": "S", "conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"},
      {"from": "human", "value": "c"}, {"from": "gpt", "value": "d"}]})",
                    with_system);
  // The documented mapping itself; other records are left alone.
  EXPECT_EQ(*to_messages_record(nlohmann::json::parse(R"({"instruction": "I", "input": "X", "output": "O"})")),
            nlohmann::ordered_json::parse(R"({"messages": [{"role": "user", "content": "I\n\nX"},
                                                           {"role": "assistant", "content": "O"}]})"));
  // lmsys-chat-1m's "conversation" is the messages form under another name.
  expect_renders_as(R"({"conversation_id": "x", "model": "vicuna-13b", "conversation": [{"content": "hi", "role": "user"},
      {"content": "yo", "role": "assistant"}], "turn": 1, "language": "English"})",
                    user_hi_assistant_yo);
  for (const char* other : {R"({"text": "t"})", R"({"prompt": "p", "completion": "c"})", "[1]",
                            R"({"messages": [], "instruction": "messages win"})"})
    EXPECT_FALSE(to_messages_record(nlohmann::json::parse(other)).has_value()) << other;
}

TEST(Records, BadAlpacaAndShareGptRecordsSayWhatIsWrong) {
  EXPECT_EQ(refusal_of(R"({"conversations": [{"from": "human", "value": "a"}, {"from": "bot", "value": "b"}]})"),
            "ShareGPT turn 2: from 'bot' is not human/gpt/system (or user/assistant)");
  EXPECT_EQ(refusal_of(R"({"conversations": [{"from": "human", "value": 3}]})"),
            "ShareGPT turn 1: field \"value\" is not a string");
  EXPECT_EQ(refusal_of(R"({"conversations": [{"value": "a"}]})"), "ShareGPT turn 1: field \"from\" is missing");
  EXPECT_EQ(refusal_of(R"({"conversations": "a"})"), "ShareGPT record: \"conversations\" is not an array");
  EXPECT_EQ(refusal_of(R"({"instruction": "a"})"), "Alpaca record: field \"output\" is missing");
  EXPECT_EQ(refusal_of(R"({"instruction": ["a"], "output": "b"})"), "Alpaca record: field \"instruction\" is not a string");
  EXPECT_NE(refusal_of(R"({"instruction": "a", "output": "b", "history": [["q", "r"]]})").find("\"history\""),
            std::string::npos);
  // The conversation's shape is checked as for `messages`: a ShareGPT record that opens with gpt.
  EXPECT_NE(refusal_of(R"({"conversations": [{"from": "gpt", "value": "a"}]})").find("roles must alternate"),
            std::string::npos);
}

TEST_F(DataTest, LargeArraysAndGzipCrossReadChunksIntact) {
  // Records with brackets, braces, commas, escaped quotes and backslashes inside their strings, and
  // nested values, in over 2 MiB: records and lines straddle the reader's 1 MiB chunks.
  std::string jsonl, compact = "[";
  for (int i = 0; i < 36000; ++i) {
    const std::string n = std::to_string(i * 7919 % 100003);
    const std::string rec = i % 3 == 0 ? R"({"text": "a [b] {c}, \"q\" \\ )" + n + R"(", "meta": {"k": [1, {"x": "]"}]}})"
                            : i % 3 == 1 ? R"({"prompt": "what is )" + n + R"( ]}?", "completion": " \u00e9 )" + n + "\"}"
                                         : R"({"instruction": "say \")" + n + R"(\"", "input": "[", "output": "}"})";
    jsonl += rec + "\n";
    compact += (i ? ",\n\t" : "") + rec;
  }
  write_file(path("big.jsonl"), jsonl);
  write_file(path("big.json"), compact + "]");
  run_capture("gzip -k " + path("big.jsonl") + " " + path("big.json"));
  ByteTokenizer tok;
  ReadStats want_stats;
  const Docs want = docs_of(*load({path("big.jsonl")}, tok, &want_stats)[0]);
  ASSERT_EQ(want.ids.size(), 36000u);
  ASSERT_GT(jsonl.size(), size_t(2) << 20);
  ASSERT_EQ(want_stats.dropped, 0);
  for (const char* name : {"big.json", "big.jsonl.gz", "big.json.gz"}) {
    const Docs d = docs_of(*load({path(name)}, tok)[0]);
    EXPECT_TRUE(d.ids == want.ids && d.targets == want.targets) << name;
  }
}

}  // namespace test_data
