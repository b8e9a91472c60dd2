// Sharded checkpoints in one process (world of size 1, self communicators): CRC32C, round trips
// (sync and async), atomic publish and keep-last-K, corruption and mismatch errors, the Python
// reader documented in FORMAT.md, and `tessera ckpt consolidate / inspect / verify`.
// Multi-rank saving, resharding and crash safety are in tests/mpi/test_checkpoint_mpi.cpp and tests/mpi/ckpt_crash.sh.
#include "tests/unit/test_checkpoint_util.h"

#include <unistd.h>

#include <random>

#include "launcher/cmd_ckpt.h"
#include "runtime/checkpoint/crc32c.h"
#include "util/file_tree.h"

namespace test_checkpoint {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace ckpt_test;  // with fs and Checkpointer

namespace {

using CheckpointTest = CheckpointDirTest;

// Snapshot of every file under a directory (name -> bytes).
std::map<std::string, std::string> snapshot(const std::string& d) {
  std::map<std::string, std::string> m;
  std::error_code ec;
  for (const auto& path : tessera::util::files_below(d, ec, /*skip_hidden=*/false)) m[path] = read_file(path);
  EXPECT_FALSE(ec) << d << ": " << ec.message();
  return m;
}

}  // namespace

TEST(Crc32c, KnownVectorsAndImplementationsAgree) {
  using tessera::checkpoint::crc32c;
  using tessera::checkpoint::crc32c_portable;
  const std::string digits = "123456789";
  EXPECT_EQ(crc32c(digits.data(), digits.size()), 0xE3069283u);
  EXPECT_EQ(crc32c_portable(digits.data(), digits.size()), 0xE3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  std::mt19937 rng(7);
  std::string buf(5000, '\0');
  for (auto& c : buf) c = static_cast<char>(rng());
  for (size_t off : {0, 1, 3, 7})
    for (size_t n : {0, 1, 7, 8, 9, 63, 64, 1000, 4993}) {
      const uint32_t whole = crc32c_portable(buf.data() + off, n);
      EXPECT_EQ(crc32c(buf.data() + off, n), whole) << off << " " << n;
      const size_t cut = n / 3;  // chaining
      EXPECT_EQ(crc32c(buf.data() + off + cut, n - cut, crc32c(buf.data() + off, cut)), whole);
    }
}

TEST_F(CheckpointTest, RoundTripIsBitExactAndReturnsState) {
  auto a = make_engine(self_groups());
  fill(*a, 11);
  Checkpointer ck(test_policy(dir), self_groups());
  const auto t = ck.save(7, *a, a->kinds, test_state(7));
  EXPECT_EQ(t.dir, dir + "/step-7");
  EXPECT_GT(t.bytes, 0);
  EXPECT_TRUE(fs::exists(dir + "/step-7/manifest.json"));
  EXPECT_TRUE(fs::exists(dir + "/step-7/rank-00000.bin"));
  EXPECT_FALSE(fs::exists(dir + "/step-7.tmp"));
  EXPECT_EQ(tessera::checkpoint::latest(dir), dir + "/step-7");

  auto b = make_engine(self_groups());
  const auto state = tessera::checkpoint::load(dir + "/step-7", *b, b->kinds);
  EXPECT_EQ(state, test_state(7));
  for (size_t u = 0; u < a->shards().size(); ++u)
    for (int k = 0; k < 3; ++k) EXPECT_TRUE(at::equal(kind_tensor(*a, u, k), kind_tensor(*b, u, k)));
  EXPECT_EQ(mismatches(*b, 11), 0);
  const auto rep = tessera::checkpoint::verify(dir + "/step-7");
  EXPECT_EQ(rep.files, 1);
  EXPECT_EQ(rep.bytes, t.bytes);
  EXPECT_EQ(rep.tensors, 3 * 21);  // tiny: 3 root + 2 x 9 layer params, three kinds each
}

TEST_F(CheckpointTest, AlignmentAndPaddingDoNotMatter) {
  // Saved with align 16, loaded into an engine with align 1 (other padding, other flat offsets).
  auto a = make_engine(self_groups(), tessera::fsdp::Strategy::FullShard, tiny_config(), 16);
  fill(*a, 3);
  Checkpointer(test_policy(dir), self_groups()).save(1, *a, a->kinds, test_state(1));
  auto b = make_engine(self_groups(), tessera::fsdp::Strategy::FullShard, tiny_config(), 1);
  tessera::checkpoint::load(dir + "/step-1", *b, b->kinds);
  EXPECT_EQ(mismatches(*b, 3), 0);
}

TEST_F(CheckpointTest, AsyncSaveSnapshotsAndReportsTiming) {
  auto a = make_engine(self_groups());
  fill(*a, 5);
  Checkpointer ck(test_policy(dir, 2, true), self_groups());
  const auto blocked = ck.save(3, *a, a->kinds, test_state(3));
  EXPECT_GT(blocked.blocked_s, 0);
  fill(*a, 6);  // training continues: must not leak into the snapshot being written
  const auto done = ck.wait();
  EXPECT_EQ(done.dir, dir + "/step-3");
  EXPECT_GT(done.write_s, 0);
  EXPECT_GT(done.bytes, 0);
  EXPECT_EQ(ck.wait().dir, "");  // nothing in flight any more
  auto b = make_engine(self_groups());
  tessera::checkpoint::load(dir + "/step-3", *b, b->kinds);
  EXPECT_EQ(mismatches(*b, 5), 0);
  // The next save waits for the previous one by itself.
  ck.save(4, *a, a->kinds, test_state(4));
  ck.save(5, *a, a->kinds, test_state(5));
  ck.wait();
  EXPECT_EQ(tessera::checkpoint::latest(dir), dir + "/step-5");
}

TEST_F(CheckpointTest, KeepLastKAndLatestIgnoresIncomplete) {
  save_steps({1, 2, 3}, 2);
  EXPECT_FALSE(fs::exists(dir + "/step-1"));
  EXPECT_TRUE(fs::exists(dir + "/step-2"));
  EXPECT_TRUE(fs::exists(dir + "/step-3"));
  // A crashed save leaves step-9.tmp; a directory without manifest is not complete either.
  fs::create_directories(dir + "/step-9.tmp");
  write_file(dir + "/step-9.tmp/rank-00000.bin", "partial");
  fs::create_directories(dir + "/step-8");
  EXPECT_EQ(tessera::checkpoint::latest(dir), dir + "/step-3");
  EXPECT_EQ(tessera::checkpoint::latest(dir + "/nonexistent"), "");
  save_steps({4}, 0);  // keep <= 0: keep everything; stale *.tmp removed
  EXPECT_FALSE(fs::exists(dir + "/step-9.tmp"));
  EXPECT_TRUE(fs::exists(dir + "/step-2"));
  EXPECT_EQ(tessera::checkpoint::latest(dir), dir + "/step-4");
}

TEST_F(CheckpointTest, SavingAnExistingStepReplacesIt) {
  save_steps({5});
  save_steps({5}, 1);  // same step, other values (seed is the step: use another engine)
  auto e = make_engine(self_groups());
  fill(*e, 99);
  Checkpointer(test_policy(dir, 1, false), self_groups()).save(5, *e, e->kinds, test_state(5));
  auto b = make_engine(self_groups());
  tessera::checkpoint::load(dir + "/step-5", *b, b->kinds);
  EXPECT_EQ(mismatches(*b, 99), 0);
  EXPECT_FALSE(fs::exists(dir + "/step-5.old"));
  EXPECT_FALSE(fs::exists(dir + "/step-5.tmp"));
}

TEST_F(CheckpointTest, CorruptionAndMismatchGiveOneLineErrorsAndChangeNothing) {
  const std::string ck = save_steps({2});
  const std::string file = ck + "/rank-00000.bin";
  auto e = make_engine(self_groups());
  auto load = [&] { tessera::checkpoint::load(ck, *e, e->kinds); };

  // Flipped byte: checksum mismatch naming the file (load and verify).
  flip_byte(file, 12345);
  auto before = snapshot(dir);
  std::string msg = error_of(load);
  EXPECT_NE(msg.find("checksum mismatch"), std::string::npos) << msg;
  EXPECT_NE(msg.find(file), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  EXPECT_NE(error_of([&] { tessera::checkpoint::verify(ck); }).find(file), std::string::npos);
  EXPECT_EQ(snapshot(dir), before);  // nothing written or removed
  flip_byte(file, 12345);
  EXPECT_EQ(tessera::checkpoint::verify(ck).files, 1);

  // Missing rank file.
  fs::rename(file, file + ".away");
  msg = error_of(load);
  EXPECT_NE(msg.find(file + " is missing"), std::string::npos) << msg;
  fs::rename(file + ".away", file);

  // Truncated rank file.
  const std::string good = read_file(file);
  write_file(file, good.substr(0, good.size() - 4));
  msg = error_of(load);
  EXPECT_NE(msg.find(file), std::string::npos) << msg;
  EXPECT_NE(msg.find("bytes"), std::string::npos) << msg;
  write_file(file, good);

  // A manifest of another model (hidden size 64): the error names the first differing tensor.
  auto other = make_engine(self_groups(), tessera::fsdp::Strategy::FullShard, tiny_config(64));
  msg = error_of([&] { tessera::checkpoint::load(ck, *other, other->kinds); });
  EXPECT_NE(msg.find("model.embed_tokens.weight has shape [320,128] in the checkpoint, [320,64] in the model"),
            std::string::npos) << msg;
  // ... and one with more layers names the missing tensor.
  auto deeper_cfg = tiny_config();
  deeper_cfg.num_hidden_layers = 3;
  auto deeper = make_engine(self_groups(), tessera::fsdp::Strategy::FullShard, deeper_cfg);
  msg = error_of([&] { tessera::checkpoint::load(ck, *deeper, deeper->kinds); });
  EXPECT_NE(msg.find("model.layers.2."), std::string::npos) << msg;
  EXPECT_NE(msg.find("is missing"), std::string::npos) << msg;

  // Unknown format version; missing manifest.
  const std::string mpath = ck + "/manifest.json";
  const std::string manifest = read_file(mpath);
  auto j = nlohmann::json::parse(manifest);
  j["format_version"] = 99;
  write_file(mpath, j.dump());
  msg = error_of(load);
  EXPECT_NE(msg.find("unknown format_version 99"), std::string::npos) << msg;
  EXPECT_NE(msg.find(mpath), std::string::npos) << msg;
  // A slice list that stores an element twice.
  j = nlohmann::json::parse(manifest);
  j["tensors"][4]["slices"][0]["numel"] = j["tensors"][4]["slices"][0]["numel"].get<int64_t>() + 1;
  write_file(mpath, j.dump());
  msg = error_of([&] { tessera::checkpoint::verify(ck); });
  EXPECT_NE(msg.find(j["tensors"][4]["name"].get<std::string>()), std::string::npos) << msg;
  fs::remove(mpath);
  msg = error_of(load);
  EXPECT_NE(msg.find("not complete"), std::string::npos) << msg;
  write_file(mpath, manifest);
  tessera::checkpoint::load(ck, *e, e->kinds);
  EXPECT_EQ(mismatches(*e, 2), 0);
}

TEST_F(CheckpointTest, FailedSaveKeepsPreviousCheckpoints) {
  save_steps({1});
  const auto before = snapshot(dir);
  // The checkpoint root is a file: every save fails with an Input error naming it.
  const std::string blocked = dir + "/blocked";
  write_file(blocked, "x");
  auto e = make_engine(self_groups());
  std::string msg = error_of([&] { Checkpointer(test_policy(blocked), self_groups()).save(2, *e, e->kinds, test_state(2)); });
  EXPECT_NE(msg.find(blocked), std::string::npos) << msg;
  fs::remove(blocked);
  EXPECT_EQ(snapshot(dir), before);
}

// The Python reader in FORMAT.md reads our checkpoint bit for bit and detects corruption.
TEST_F(CheckpointTest, PythonReaderFromFormatDoc) {
  const char* src = std::getenv("TESSERA_TEST_SRC");
  ASSERT_NE(src, nullptr) << "TESSERA_TEST_SRC must point at the repository";
  const std::string doc = read_file(std::string(src) + "/runtime/checkpoint/FORMAT.md");
  const size_t b = doc.find("```python\n", doc.find("<!-- reader-script:begin -->"));
  const size_t e = doc.find("```", b + 10);
  ASSERT_NE(b, std::string::npos);
  ASSERT_NE(e, std::string::npos);
  const std::string script = doc.substr(b + 10, e - b - 10);
  EXPECT_LE(std::count(script.begin(), script.end(), '\n'), 45);  // "a short script"
  write_file(dir + "/reader.py", script);

  const std::string ck = save_steps({4});
  const std::string out = dir + "/py-out";
  ASSERT_EQ(std::system(("python3 " + dir + "/reader.py " + ck + " " + out + " --all > " + dir + "/py.log").c_str()), 0);
  for (const auto& s : tessera::model::hf_tensor_specs(tiny_config())) {
    const at::Tensor expect = expected_param(4, s.name, s.shape);
    const std::string bytes = read_file(out + "/" + s.name + ".f32");
    ASSERT_EQ(bytes.size(), expect.numel() * 4u) << s.name;
    EXPECT_EQ(std::memcmp(bytes.data(), expect.data_ptr<float>(), bytes.size()), 0) << s.name;
    EXPECT_EQ(read_file(out + "/" + s.name + ".exp_avg_sq.f32").size(), expect.numel() * 4u);
  }
  flip_byte(ck + "/rank-00000.bin", 100);
  EXPECT_NE(std::system(("python3 " + dir + "/reader.py " + ck + " " + out + " 2>/dev/null >/dev/null").c_str()), 0);
}

TEST_F(CheckpointTest, ConsolidateWritesHuggingFaceDirectory) {
  const std::string ck = save_steps({6});
  const auto cfg = tiny_config();
  // fp32, sharded (small max shard size): every tensor bit for bit.
  const std::string hf = dir + "/hf32";
  ASSERT_EQ(tessera::launcher::run_ckpt({"consolidate", "--checkpoint", ck, "--out", hf, "--dtype", "fp32",
                                         "--max-shard-size", "200KB"}), 0);
  EXPECT_TRUE(fs::exists(hf + "/model.safetensors.index.json"));
  tessera::model::ModelDir m(hf);
  EXPECT_EQ(m.config(), [&] { auto c = cfg; c.torch_dtype = "float32"; return c; }());
  for (const auto& s : tessera::model::hf_tensor_specs(cfg))
    EXPECT_TRUE(at::equal(m.read(s.name), expected_param(6, s.name, s.shape))) << s.name;
  // bf16: the same values rounded once.
  const std::string hf16 = dir + "/hf16";
  ASSERT_EQ(tessera::launcher::run_ckpt({"consolidate", "--checkpoint", ck, "--out", hf16}), 0);
  tessera::model::ModelDir m16(hf16);
  for (const auto& s : tessera::model::hf_tensor_specs(cfg))
    EXPECT_TRUE(at::equal(m16.read(s.name), expected_param(6, s.name, s.shape).to(at::kBFloat16))) << s.name;
  // An existing output is refused; a corrupted checkpoint is refused before anything is written.
  EXPECT_THROW(tessera::launcher::run_ckpt({"consolidate", "--checkpoint", ck, "--out", hf16}), std::exception);
  flip_byte(ck + "/rank-00000.bin", 7);
  const std::string msg = error_of([&] {
    tessera::launcher::run_ckpt({"consolidate", "--checkpoint", ck, "--out", dir + "/hf-bad"});
  });
  EXPECT_NE(msg.find("checksum mismatch"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir + "/hf-bad"));
}

TEST_F(CheckpointTest, InspectVerifyAndCliErrors) {
  const std::string ck = save_steps({8});
  testing::internal::CaptureStdout();
  EXPECT_EQ(tessera::launcher::run_ckpt({"inspect", ck}), 0);
  EXPECT_EQ(tessera::launcher::run_ckpt({"verify", ck}), 0);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("step        8"), std::string::npos) << out;
  EXPECT_NE(out.find("world size  1 (strategy full_shard"), std::string::npos) << out;
  EXPECT_NE(out.find("model.layers.1.mlp.down_proj.weight"), std::string::npos) << out;
  EXPECT_NE(out.find("OK " + ck), std::string::npos) << out;
  EXPECT_NE(error_of([] { tessera::launcher::run_ckpt({"inspekt", "x"}); }).find("did you mean 'inspect'"), std::string::npos);
  EXPECT_NE(error_of([&] { tessera::launcher::run_ckpt({"verify", dir + "/nope"}); }).find(dir + "/nope"), std::string::npos);
}

}  // namespace test_checkpoint
