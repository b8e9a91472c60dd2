// Which checkpoint `auto` resumes after a rollback (checkpoint.h, Checkpointer::begin_lineage):
// a run resumed from step-1 of a directory that also holds step-2 and step-3 of the run it replaces
// must resume from step-1 (before its first save) or from its own saves (after), never from the
// stale step-3; the stale checkpoints are retired (moved, intact), not deleted.
#include "tests/unit/test_checkpoint_util.h"
#include "util/file_tree.h"

namespace test_checkpoint_lineage {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace ckpt_test;  // with fs, Checkpointer and latest

namespace {

class LineageTest : public CheckpointDirTest {
 protected:
  // The values a checkpoint directory holds (its fill seed), or -1 if they match no seed in 1..999.
  int64_t seed_of(const std::string& ck) {
    auto e = make_engine(self_groups());
    tessera::checkpoint::load(ck, *e, e->kinds);
    for (int64_t s : seeds)
      if (mismatches(*e, static_cast<uint64_t>(s)) == 0) return s;
    return -1;
  }
  void save(Checkpointer& ck, int64_t step, int64_t seed) {
    auto e = make_engine(self_groups());
    fill(*e, static_cast<uint64_t>(seed));
    ck.save(step, *e, e->kinds, test_state(step));
    seeds.push_back(seed);
  }
  std::vector<int64_t> seeds;
};

}  // namespace

TEST_F(LineageTest, RollbackResumesFromItsOwnLineageAndRetiresTheAbandonedRun) {
  {  // The first run: steps 1, 2, 3 (values seeded 101, 102, 103).
    Checkpointer first(test_policy(dir, 5, false), self_groups());
    first.begin_lineage(0, "");
    for (int64_t s = 1; s <= 3; ++s) save(first, s, 100 + s);
  }
  EXPECT_EQ(latest(dir), dir + "/step-3");

  // Rolled back to step-1: before its first save, latest() is where it resumed from.
  Checkpointer second(test_policy(dir, 2, false), self_groups());
  second.begin_lineage(1, dir + "/step-1");
  EXPECT_EQ(latest(dir), dir + "/step-1");
  EXPECT_TRUE(fs::exists(dir + "/step-3/manifest.json"));  // nothing moved before a new checkpoint exists
  EXPECT_TRUE(fs::exists(dir + "/step-2/manifest.json"));

  // Its first save (step 2, new values) retires the old step-2 and step-3, intact.
  save(second, 2, 202);
  EXPECT_EQ(latest(dir), dir + "/step-2");
  EXPECT_EQ(seed_of(dir + "/step-2"), 202);
  EXPECT_FALSE(fs::exists(dir + "/step-3"));
  EXPECT_EQ(seed_of(dir + "/retired/step-2"), 102);
  EXPECT_EQ(seed_of(dir + "/retired/step-3"), 103);
  EXPECT_EQ(tessera::checkpoint::verify(dir + "/retired/step-3").files, 1);

  // Later saves: keep=2 counts this lineage only (step-1 of the first run is its start: kept until
  // two newer ones exist); retired/ is never pruned.
  save(second, 3, 203);
  EXPECT_EQ(latest(dir), dir + "/step-3");
  EXPECT_EQ(seed_of(dir + "/step-3"), 203);
  EXPECT_FALSE(fs::exists(dir + "/step-1"));
  EXPECT_TRUE(fs::exists(dir + "/step-2"));
  EXPECT_TRUE(fs::exists(dir + "/retired/step-3"));

  // A second rollback (to step-2) retiring another step-3 keeps both retired copies.
  Checkpointer third(test_policy(dir, 2, false), self_groups());
  third.begin_lineage(2, dir + "/step-2");
  EXPECT_EQ(latest(dir), dir + "/step-2");
  save(third, 4, 304);
  EXPECT_EQ(latest(dir), dir + "/step-4");
  EXPECT_EQ(seed_of(dir + "/retired/step-3"), 103);
  EXPECT_EQ(seed_of(dir + "/retired/step-3.2"), 203);
}

TEST_F(LineageTest, ResumedFromAnotherDirectoryAndFallbacks) {
  const std::string other = dir + "/other";
  {
    Checkpointer ck(test_policy(other, 5, false), self_groups());
    save(ck, 4, 104);
  }
  {  // A stale run in the root with a higher step.
    Checkpointer ck(test_policy(dir + "/root", 5, false), self_groups());
    save(ck, 9, 109);
  }
  Checkpointer run(test_policy(dir + "/root", 5, false), self_groups());
  run.begin_lineage(4, other + "/step-4");
  // An absolute pointer out of the root: `auto` refuses it, naming it, rather than resume the
  // stale step-9 (or follow a pointer that may have been planted); --resume DIR resumes it.
  EXPECT_INPUT_ERROR(latest(dir + "/root"), dir + "/root/latest names '" + other + "/step-4'", "--resume DIR");
  save(run, 5, 205);
  EXPECT_EQ(latest(dir + "/root"), dir + "/root/step-5");
  EXPECT_EQ(seed_of(dir + "/root/retired/step-9"), 109);

  // A pointer naming something that is gone falls back to the highest complete step.
  tessera::util::remove_tree(dir + "/root/step-5");
  Checkpointer plain(test_policy(dir + "/root", 5, false), self_groups());
  save(plain, 3, 203);  // no lineage: writes the pointer, retires nothing
  tessera::util::remove_tree(dir + "/root/step-3");
  fs::create_directories(dir + "/root/step-7");  // incomplete: never chosen
  EXPECT_EQ(latest(dir + "/root"), "");
  save(plain, 6, 206);
  tessera::util::remove_tree(dir + "/root/step-6");
  save(plain, 2, 202);
  save(plain, 8, 208);
  fs::remove(dir + "/root/latest");
  EXPECT_EQ(latest(dir + "/root"), dir + "/root/step-8");
}

}  // namespace test_checkpoint_lineage
