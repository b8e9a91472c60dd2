// Checkpoints under faults, in one process (world of size 1): a damaged checkpoint is a
// DamagedCheckpoint naming the file and the tensor (a checkpoint of another model is not damage),
// resume_candidates() lists the fallbacks below latest, and a full file system during a save (a
// real tmpfs mounted for the test; skipped where mounting is not allowed) fails in one line naming
// the path and the bytes needed, leaving the previous checkpoint and nothing else.
// End to end through `tessera train` (fallback, elastic resume): tests/mpi/resume_faults.sh.
#include "tests/unit/test_checkpoint_util.h"

#include "runtime/checkpoint/io.h"
#include "util/file_tree.h"

#include <sys/mount.h>
#include <unistd.h>

namespace test_checkpoint_faults {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace ckpt_test;  // with fs and Checkpointer
using tessera::checkpoint::DamagedCheckpoint;

namespace {

class CheckpointFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tessera-ckpt-faults-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir = tmpl;
  }
  void TearDown() override {
    if (mounted) ::umount2(mounted_at.c_str(), MNT_DETACH);
    tessera::util::remove_tree(dir);
  }
  std::string save_steps(const std::string& root, const std::vector<int64_t>& steps, int keep = 5) {
    auto e = make_engine(self_groups());
    Checkpointer ck(test_policy(root, keep, false), self_groups());
    std::string last;
    for (int64_t s : steps) {
      fill(*e, s);
      last = ck.save(s, *e, e->kinds, test_state(s)).dir;
    }
    return last;
  }
  // "damaged: <message>" for a DamagedCheckpoint, "other: <message>" for another error, "" if none.
  static std::string load_outcome(const std::string& ck, TestEngine& e) {
    try {
      tessera::checkpoint::load(ck, e, e.kinds);
    } catch (const DamagedCheckpoint& d) {
      EXPECT_EQ(d.dir(), ck);
      return std::string("damaged: ") + d.what();
    } catch (const std::exception& x) {
      return std::string("other: ") + x.what();
    }
    return "";
  }
  // A 64 MiB tmpfs mounted at dir/small with all but `room` bytes (whole pages) taken by a filler:
  // its "ck" directory, or "" where mounting is not allowed (errno says why; the caller skips).
  std::string small_disk_with_room(uint64_t room) {
    mounted_at = dir + "/small";
    fs::create_directories(mounted_at);
    if (::mount("tmpfs", mounted_at.c_str(), "tmpfs", 0, "size=64m") != 0) return "";
    mounted = true;
    const std::string root = mounted_at + "/ck";
    fs::create_directories(root);
    const uint64_t free_now = static_cast<uint64_t>(tessera::checkpoint::io::free_bytes(root));
    EXPECT_GT(free_now, room + kPage);
    tessera::checkpoint::io::File filler = tessera::checkpoint::io::File::create(mounted_at + "/filler");
    EXPECT_TRUE(filler.reserve(free_now - room));
    EXPECT_EQ(tessera::checkpoint::io::free_bytes(root), static_cast<int64_t>(room));
    return root;
  }
  static constexpr uint64_t kPage = 4096;
  static uint64_t pages(uint64_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }
  std::string dir, mounted_at;
  bool mounted = false;
};

}  // namespace

TEST_F(CheckpointFaults, DamageNamesFileAndTensorAndIsTellableFromAMismatch) {
  const std::string ck = save_steps(dir, {3});
  const std::string file = ck + "/rank-00000.bin";
  auto e = make_engine(self_groups());
  // The byte flipped lies in the slice of one tensor; the manifest says which.
  const tessera::checkpoint::Reader r(ck);
  const auto& t = r.tensors().at(7);
  const auto& slice = t.slices.at(0);
  ASSERT_TRUE(slice.has_crc);
  flip_byte(file, slice.offset + 4 * (slice.numel / 2));
  std::string got = load_outcome(ck, *e);
  EXPECT_EQ(got.rfind("damaged: checksum mismatch in checkpoint file " + file, 0), 0u) << got;
  const std::string label = t.kind == "param" ? t.name : t.name + " (" + t.kind + ")";
  EXPECT_NE(got.find("tensor " + label + " elements [0, " + std::to_string(slice.numel) + ")"), std::string::npos) << got;
  EXPECT_EQ(got.find('\n'), std::string::npos);
  flip_byte(file, slice.offset + 4 * (slice.numel / 2));

  // A truncated manifest, and an invalid one.
  const std::string mpath = ck + "/manifest.json", manifest = read_file(mpath);
  write_file(mpath, manifest.substr(0, manifest.size() / 2));
  got = load_outcome(ck, *e);
  EXPECT_EQ(got.rfind("damaged: malformed manifest " + mpath, 0), 0u) << got;
  write_file(mpath, "{\"format\": \"tessera-checkpoint\"}");
  EXPECT_EQ(load_outcome(ck, *e).rfind("damaged: malformed manifest " + mpath, 0), 0u);
  write_file(mpath, manifest);

  // Intact, but of another model: not damage (an older checkpoint would not fit either).
  auto other = make_engine(self_groups(), tessera::fsdp::Strategy::FullShard, tiny_config(64));
  got = load_outcome(ck, *other);
  EXPECT_EQ(got.rfind("other: checkpoint " + ck + " does not match the model", 0), 0u) << got;
  EXPECT_EQ(load_outcome(ck, *e), "");
  EXPECT_EQ(mismatches(*e, 3), 0);
}

TEST_F(CheckpointFaults, ResumeCandidatesAreLatestThenOlderNewestFirst) {
  EXPECT_TRUE(tessera::checkpoint::resume_candidates(dir).empty());
  save_steps(dir, {2, 4, 6, 8});
  using V = std::vector<std::string>;
  EXPECT_EQ(tessera::checkpoint::resume_candidates(dir), (V{dir + "/step-8", dir + "/step-6", dir + "/step-4", dir + "/step-2"}));
  // latest names step-4 (a run resumed from it): step-6 and step-8 belong to the run it replaces.
  write_file(dir + "/latest", "step-4\n");
  EXPECT_EQ(tessera::checkpoint::resume_candidates(dir), (V{dir + "/step-4", dir + "/step-2"}));
  // A damaged newest one stays a candidate here (only load() reads it all); incomplete ones never are.
  fs::remove(dir + "/latest");
  fs::remove(dir + "/step-8/manifest.json");
  EXPECT_EQ(tessera::checkpoint::resume_candidates(dir), (V{dir + "/step-6", dir + "/step-4", dir + "/step-2"}));
}

// A tmpfs with room for one checkpoint and a half: the second save fails for want of space.
TEST_F(CheckpointFaults, FullDiskDuringSaveNamesPathAndBytesAndKeepsThePrevious) {
  auto probe = make_engine(self_groups());
  int64_t bytes = 0;
  for (const auto& k : probe->kinds)
    for (const auto& t : k.per_unit) bytes += t.numel() * 4;  // an upper bound of one checkpoint's data
  mounted_at = dir + "/small";
  fs::create_directories(mounted_at);
  const std::string opts = "size=" + std::to_string(bytes * 3 / 2 + 65536);
  if (::mount("tmpfs", mounted_at.c_str(), "tmpfs", 0, opts.c_str()) != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << "): needs root (CAP_SYS_ADMIN)";
  mounted = true;
  const std::string root = mounted_at + "/ck";
  const std::string first = save_steps(root, {1});
  const std::string before = read_file(first + "/rank-00000.bin");
  auto e = make_engine(self_groups());
  fill(*e, 2);
  const std::string msg = error_of([&] { Checkpointer(test_policy(root, 2, false), self_groups()).save(2, *e, e->kinds, test_state(2)); });
  EXPECT_EQ(msg.rfind("checkpoint step-2 does not fit in checkpoint.dir " + root + ": cannot allocate ", 0), 0u) << msg;
  EXPECT_NE(msg.find(" bytes for " + root + "/step-2.tmp/rank-00000.bin: No space left on device ("), std::string::npos) << msg;
  EXPECT_NE(msg.find("the previous checkpoint " + first + " is kept"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  // The previous checkpoint is whole and still the latest; the failed save left nothing behind.
  EXPECT_EQ(read_file(first + "/rank-00000.bin"), before);
  EXPECT_EQ(tessera::checkpoint::verify(first).files, 1);
  EXPECT_EQ(tessera::checkpoint::latest(root), first);
  EXPECT_FALSE(fs::exists(root + "/step-2.tmp"));
  EXPECT_FALSE(fs::exists(root + "/step-2"));
  // Room again (the previous one pruned by hand): the same save succeeds.
  tessera::util::remove_tree(first);
  EXPECT_EQ(Checkpointer(test_policy(root, 2, false), self_groups()).save(2, *e, e->kinds, test_state(2)).dir, root + "/step-2");
}

// Room for the rank file but not for the manifest, on an async save: save() itself fails (the
// leader allocates manifest.json's longest text with the rank files), so the run stops at the step
// that saves, not when the background write reaches the manifest some steps later.
TEST_F(CheckpointFaults, AsyncSaveWithoutRoomForTheManifestFailsInSave) {
  const std::string probe = save_steps(dir + "/probe", {1});
  const std::string root = small_disk_with_room(pages(fs::file_size(probe + "/rank-00000.bin")));  // room: the rank file only
  if (root.empty()) GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << "): needs root (CAP_SYS_ADMIN)";
  auto e = make_engine(self_groups());
  fill(*e, 2);
  Checkpointer ck(test_policy(root, 2, true), self_groups());
  const std::string msg = error_of([&] { ck.save(2, *e, e->kinds, test_state(2)); });
  EXPECT_EQ(msg.rfind("checkpoint step-2 does not fit in checkpoint.dir " + root + ": cannot allocate ", 0), 0u) << msg;
  EXPECT_NE(msg.find(" bytes for " + root + "/step-2.tmp/manifest.json: No space left on device ("), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(root + "/step-2.tmp"));
  EXPECT_EQ(tessera::checkpoint::latest(root), "");
}

// Room for the rank file and the manifest but not for `latest`: save() fails (it allocates
// latest.tmp with the rank files), so no complete but unpublished step-<N> is left for the next run
// to resume past or retire, and nothing of the save stays behind.
TEST_F(CheckpointFaults, NoRoomForLatestFailsInSaveBeforeTheCheckpointAppears) {
  const std::string probe = save_steps(dir + "/probe", {1});
  const std::string root = small_disk_with_room(pages(fs::file_size(probe + "/rank-00000.bin")) +
                                                pages(fs::file_size(probe + "/manifest.json")));
  if (root.empty()) GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << "): needs root (CAP_SYS_ADMIN)";
  auto e = make_engine(self_groups());
  fill(*e, 2);
  const std::string msg = error_of([&] { Checkpointer(test_policy(root, 2, false), self_groups()).save(2, *e, e->kinds, test_state(2)); });
  EXPECT_EQ(msg.rfind("checkpoint step-2 does not fit in checkpoint.dir " + root + ": cannot allocate ", 0), 0u) << msg;
  EXPECT_NE(msg.find(root + "/latest.tmp: No space left on device"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(root + "/step-2")) << "a complete step-2 that latest does not name";
  EXPECT_FALSE(fs::exists(root + "/step-2.tmp"));
  EXPECT_FALSE(fs::exists(root + "/latest.tmp"));
  EXPECT_EQ(tessera::checkpoint::latest(root), "");
}

// Exactly the room an async save needs: once save() returns, the disk is full (as if another job
// had filled it meanwhile), and the background write still publishes: every block it writes,
// latest.tmp's included, was allocated in save() (found by the chaos soak: its disk_full fault left
// an async save unable to write `latest`, and the run lost two checkpoint intervals).
TEST_F(CheckpointFaults, AsyncSaveThatGotItsBlocksPublishesOnAFullDisk) {
  const std::string probe = save_steps(dir + "/probe", {1});
  const std::string root = small_disk_with_room(pages(fs::file_size(probe + "/rank-00000.bin")) +
                                                pages(fs::file_size(probe + "/manifest.json")) + kPage);
  if (root.empty()) GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << "): needs root (CAP_SYS_ADMIN)";
  auto e = make_engine(self_groups());
  fill(*e, 2);
  Checkpointer ck(test_policy(root, 2, true), self_groups());
  ck.save(2, *e, e->kinds, test_state(2));
  EXPECT_EQ(tessera::checkpoint::io::free_bytes(root), 0);
  EXPECT_EQ(error_of([&] { ck.wait(); }), "");
  EXPECT_EQ(tessera::checkpoint::latest(root), root + "/step-2");
  EXPECT_EQ(tessera::checkpoint::verify(root + "/step-2").files, 1);
  EXPECT_FALSE(fs::exists(root + "/latest.tmp"));
}

}  // namespace test_checkpoint_faults
