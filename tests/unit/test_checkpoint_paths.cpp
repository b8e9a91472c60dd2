// A checkpoint.dir on shared scratch, or downloaded: whatever another user planted in it, a save
// never writes through a link (latest.tmp, step-<N>.tmp, step-<N>.old, step-<N>, retired), and
// latest never sends a resume outside it (an absolute path, "../", a link, a FIFO); a manifest or
// rank file that is a FIFO or device is refused without blocking (runtime/checkpoint/FORMAT.md).
// Through the CLI: tests/unit/hostile_paths.sh.
#include "tests/unit/test_checkpoint_util.h"

#include <sys/stat.h>

#include "runtime/checkpoint/io.h"

namespace test_checkpoint_paths {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace ckpt_test;  // with fs, Checkpointer and latest

namespace {

class CheckpointPaths : public CheckpointDirTest {
 protected:
  void SetUp() override {
    fs::create_directories(outside + "/dir");
    write_file(precious, "nobody asked Tessera to touch this\n");
    fs::create_directories(root);
  }
  // Every file below `outside` with its content: a save must leave it as it was.
  std::string outside_state() const {
    std::string s;
    for (const auto& e : fs::directory_iterator(outside + "/dir")) s += e.path().string() + "\n";
    return s + read_file(precious);
  }
  void save(int64_t step, Checkpointer& ck) {
    auto e = make_engine(self_groups());
    fill(*e, static_cast<uint64_t>(step));
    ck.save(step, *e, e->kinds, test_state(step));
  }
  const std::string outside = dir + "/outside", precious = outside + "/precious.txt", root = dir + "/ck";
};

}  // namespace

TEST_F(CheckpointPaths, SaveNeverWritesThroughALinkPlantedAtItsNames) {
  const std::string before = outside_state();
  fs::create_symlink(precious, root + "/latest.tmp");
  fs::create_directory_symlink(outside + "/dir", root + "/step-2.tmp");
  fs::create_directory_symlink(outside + "/dir", root + "/step-2.old");
  fs::create_directory_symlink(outside + "/gone", root + "/step-3");  // dangling: replaced by the save
  Checkpointer ck(test_policy(root, 5, false), self_groups());
  save(2, ck);
  save(3, ck);
  EXPECT_EQ(outside_state(), before);
  EXPECT_EQ(latest(root), root + "/step-3");
  EXPECT_EQ(read_file(root + "/latest"), "step-3\n");
  EXPECT_FALSE(fs::is_symlink(root + "/step-3"));
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(root + "/step-3/rank-00000.bin")));
  EXPECT_FALSE(fs::exists(fs::symlink_status(root + "/step-2.tmp")));
  EXPECT_EQ(tessera::checkpoint::verify(root + "/step-3").files, 1);
}

TEST_F(CheckpointPaths, ARetiredThatIsALinkIsRefusedAndNothingMoves) {
  save_steps({4}, 5, root);
  fs::create_directory_symlink(outside + "/dir", root + "/retired");
  const std::string before = outside_state();
  Checkpointer ck(test_policy(root, 5, false), self_groups());
  ck.begin_lineage(0, "");  // a fresh run: its first save retires step-4
  EXPECT_INPUT_ERROR(save(1, ck), "cannot retire checkpoints to " + root + "/retired: it is a symbolic link");
  EXPECT_EQ(outside_state(), before);
  EXPECT_TRUE(fs::exists(root + "/step-4/manifest.json"));
}

TEST_F(CheckpointPaths, LatestNamesOnlyAStepDirectoryOfTheRoot) {
  save_steps({2, 4}, 5, root);
  save_steps({7}, 5, outside + "/dir");
  const std::string want = "; it must be one line naming a step-<N> directory of checkpoint.dir " + root;
  for (const std::string& text : {outside + "/dir/step-7", std::string("../outside/dir/step-7"), std::string("step-4/.."),
                                  std::string("step-2\nstep-4"), std::string("retired/step-9")}) {
    write_file(root + "/latest", text + "\n");
    EXPECT_INPUT_ERROR(latest(root), root + "/latest names '", want, "--resume DIR");
    EXPECT_INPUT_ERROR(tessera::checkpoint::resume_candidates(root), root + "/latest names");
  }
  write_file(root + "/latest", std::string(10000, 'x'));
  EXPECT_INPUT_ERROR(latest(root), root + "/latest holds 10000 bytes, more than the 4096");
  // latest itself a link (even to a valid pointer), or a FIFO (refused without blocking).
  write_file(outside + "/pointer", "step-4\n");
  fs::remove(root + "/latest");
  fs::create_symlink(outside + "/pointer", root + "/latest");
  EXPECT_INPUT_ERROR(latest(root), root + "/latest is a symbolic link, not a regular file", want);
  fs::remove(root + "/latest");
  ASSERT_EQ(::mkfifo((root + "/latest").c_str(), 0600), 0);
  EXPECT_INPUT_ERROR(latest(root), root + "/latest is a FIFO, not a regular file", want);
  fs::remove(root + "/latest");
  // A step-<N> that is a link leaving the root: refused where latest names it, and where the
  // fallbacks are listed.
  fs::create_directory_symlink(outside + "/dir/step-7", root + "/step-9");
  write_file(root + "/latest", "step-9\n");
  EXPECT_INPUT_ERROR(latest(root), "checkpoint " + root + "/step-9 is a symbolic link to '" + outside + "/dir/step-7'",
                     "not a directory of checkpoint.dir " + root);
  fs::remove(root + "/latest");
  EXPECT_INPUT_ERROR(tessera::checkpoint::complete_checkpoints(root), root + "/step-9 is a symbolic link");
  fs::remove(root + "/step-9");
  // What stays as before: a pointer to a step-<N> that is gone falls back to the newest complete
  // one; a step number too long for an int64 is no step-<N> name at all.
  write_file(root + "/latest", "step-5\n");
  fs::create_directories(root + "/step-99999999999999999999");
  EXPECT_EQ(latest(root), root + "/step-4");
  write_file(root + "/latest", "step-2");
  EXPECT_EQ(latest(root), root + "/step-2");
}

// The manifest is read whole (io::read_all) and every rank file opened (io::File::open_read) only
// as a regular file: a FIFO is refused at once, not waited on. (The Reader names a rank file that
// is not a regular file before it opens anything: util::not_regular_file, issue 58's data part.)
TEST_F(CheckpointPaths, AManifestOrRankFileThatIsAFifoOrDeviceIsRefusedWithoutBlocking) {
  const std::string ck = save_steps({3}, 5, root), mpath = ck + "/manifest.json";
  const std::string manifest = read_file(mpath);
  fs::remove(mpath);
  ASSERT_EQ(::mkfifo(mpath.c_str(), 0600), 0);
  EXPECT_INPUT_ERROR(tessera::checkpoint::Reader r(ck), mpath + " is a FIFO, not a regular file: refused");
  EXPECT_INPUT_ERROR(tessera::checkpoint::verify(ck), mpath + " is a FIFO, not a regular file: refused");
  fs::remove(mpath);
  write_file(mpath, manifest);
  EXPECT_EQ(tessera::checkpoint::verify(ck).files, 1);
  const std::string fifo = dir + "/rank-fifo.bin", device = dir + "/rank-device.bin";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_symlink("/dev/zero", device);
  using tessera::checkpoint::io::File;
  EXPECT_INPUT_ERROR(File::open_read(fifo), fifo + " is a FIFO, not a regular file: refused");
  EXPECT_INPUT_ERROR(File::open_read(device), device + " is a character device, not a regular file: refused");
}

}  // namespace test_checkpoint_paths
