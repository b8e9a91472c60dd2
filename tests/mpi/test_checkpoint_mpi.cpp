// Sharded checkpoints under real mpirun (np 1, 2, 4): save at the world size and load bit-exactly
// for every strategy; resharding between world sizes (4 -> 2 -> 1, 1 -> 4, hybrid <-> full_shard)
// through engines on sub-communicators; async saves while the engine's communicator is busy;
// corruption errors agreed on every rank. CheckpointCrash.* are driven by tests/mpi/ckpt_crash.sh.
#include "tests/unit/test_checkpoint_util.h"

#include <unistd.h>

#include <chrono>
#include <thread>

#include "launcher/bootstrap.h"

namespace test_checkpoint_mpi {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace ckpt_test;  // with fs and Checkpointer
using tessera::fsdp::Strategy;

namespace {

const comm::ProcessGroups& world_groups() { return tessera::launcher::current().groups; }
comm::Communicator& world() { return *world_groups().world; }

// A fresh directory shared by every rank (created by rank 0), removed at the end of the test.
class MpiCheckpointTest : public ::testing::Test {
 protected:
  const tessera::test::SharedTempDir tmp{"tessera-ckpt-mpi"};
  const std::string dir = tmp.str();
};

// Groups for hybrid_shard with nodes of `per_node` consecutive ranks (emulated on one host).
comm::ProcessGroups hybrid_groups(int per_node) {
  const int r = world().rank();
  return {world_groups().world, world().split(r / per_node, r, "intra"),
          world().split(r % per_node, r, "inter")};
}

// Groups whose "world" is a sub-communicator of `size` consecutive ranks (size divides np).
comm::ProcessGroups sub_groups(int size) {
  const int r = world().rank();
  comm::CommPtr sub = size == 1 ? comm::make_self_communicator("sub") : world().split(r / size, r, "sub");
  return {sub, sub, comm::make_self_communicator("inter")};
}

std::unique_ptr<TestEngine> engine_for(Strategy s) {
  const int np = world().size();
  return make_engine(s == Strategy::HybridShard && np % 2 == 0 ? hybrid_groups(2) : world_groups(), s);
}

}  // namespace

TEST_F(MpiCheckpointTest, SameWorldRoundTripIsBitExactForEveryStrategy) {
  for (Strategy s : {Strategy::FullShard, Strategy::ShardGradOp, Strategy::NoShard, Strategy::HybridShard}) {
    SCOPED_TRACE(tessera::fsdp::to_string(s));
    auto a = engine_for(s);
    fill(*a, 21);
    Checkpointer ck(test_policy(dir + "/" + tessera::fsdp::to_string(s)), world_groups());
    const auto t = ck.save(3, *a, a->kinds, test_state(3));
    EXPECT_EQ(t.bytes > 0, a->replicate_group().rank() == 0);  // replicas do not write
    auto b = engine_for(s);
    EXPECT_EQ(tessera::checkpoint::load(t.dir, *b, b->kinds), test_state(3));
    for (size_t u = 0; u < a->shards().size(); ++u)
      for (int k = 0; k < 3; ++k)
        EXPECT_TRUE(at::equal(kind_tensor(*a, u, k), kind_tensor(*b, u, k)));
    if (world().rank() == 0) {
      const auto rep = tessera::checkpoint::verify(t.dir);
      EXPECT_EQ(rep.files, a->shard_group().size());
    }
  }
}

TEST_F(MpiCheckpointTest, ReshardsBetweenWorldSizesAndStrategies) {
  const int np = world().size();
  // Saved at W = np (full_shard), loaded at every W' dividing np.
  auto a = make_engine(world_groups(), Strategy::FullShard);
  fill(*a, 31);
  const std::string full = Checkpointer(test_policy(dir + "/full"), world_groups()).save(10, *a, a->kinds, test_state(10)).dir;
  for (int w : {4, 2, 1}) {
    if (w > np || np % w) continue;
    SCOPED_TRACE("load at W=" + std::to_string(w));
    auto b = make_engine(sub_groups(w), Strategy::FullShard);
    tessera::checkpoint::load(full, *b, b->kinds);
    EXPECT_EQ(mismatches(*b, 31), 0);
  }
  // Saved by one rank alone (W = 1) and loaded at W = np (1 -> 4).
  if (world().rank() == 0) {
    auto solo = make_engine(self_groups(), Strategy::FullShard);
    fill(*solo, 41);
    Checkpointer(test_policy(dir + "/solo"), self_groups()).save(1, *solo, solo->kinds, test_state(1));
  }
  world().barrier()->wait();
  auto c = make_engine(world_groups(), Strategy::FullShard);
  tessera::checkpoint::load(dir + "/solo/step-1", *c, c->kinds);
  EXPECT_EQ(mismatches(*c, 41), 0);
  // hybrid_shard (2 files at np=4) -> full_shard, and no_shard (1 file) -> hybrid_shard.
  auto h = engine_for(Strategy::HybridShard);
  fill(*h, 51);
  const std::string hyb = Checkpointer(test_policy(dir + "/hybrid"), world_groups()).save(2, *h, h->kinds, test_state(2)).dir;
  auto f = make_engine(world_groups(), Strategy::FullShard);
  tessera::checkpoint::load(hyb, *f, f->kinds);
  EXPECT_EQ(mismatches(*f, 51), 0);
  auto n = engine_for(Strategy::NoShard);
  fill(*n, 61);
  const std::string ns = Checkpointer(test_policy(dir + "/noshard"), world_groups()).save(2, *n, n->kinds, test_state(2)).dir;
  auto h2 = engine_for(Strategy::HybridShard);
  tessera::checkpoint::load(ns, *h2, h2->kinds);
  EXPECT_EQ(mismatches(*h2, 61), 0);
}

TEST_F(MpiCheckpointTest, AsyncSaveOverlapsTrainingCollectives) {
  auto a = make_engine(world_groups(), Strategy::FullShard);
  fill(*a, 71);
  Checkpointer ck(test_policy(dir, 3, true), world_groups());
  const auto t = ck.save(5, *a, a->kinds, test_state(5));
  EXPECT_GE(t.blocked_s, 0);
  // Training goes on: the engine's own collectives and new values while the save is in flight.
  for (int i = 0; i < 20; ++i) {
    at::Tensor x = at::ones({1024});
    a->shard_group().all_reduce(x)->wait();
    EXPECT_EQ(x[0].item<float>(), static_cast<float>(world().size()));
  }
  fill(*a, 72);
  const auto done = ck.wait();
  EXPECT_EQ(done.dir, dir + "/step-5");
  auto b = make_engine(world_groups(), Strategy::FullShard);
  tessera::checkpoint::load(done.dir, *b, b->kinds);
  EXPECT_EQ(mismatches(*b, 71), 0);
  ck.save(6, *a, a->kinds, test_state(6));  // waits on destruction
}

TEST_F(MpiCheckpointTest, CorruptionIsTheSameErrorOnEveryRank) {
  auto a = make_engine(world_groups(), Strategy::FullShard);
  fill(*a, 81);
  const std::string ck = Checkpointer(test_policy(dir), world_groups()).save(1, *a, a->kinds, test_state(1)).dir;
  const int last = world().size() - 1;
  const std::string file = ck + "/" + (last ? "rank-0000" + std::to_string(last) + ".bin" : "rank-00000.bin");
  if (world().rank() == 0) flip_byte(file, 64);
  world().barrier()->wait();
  auto b = make_engine(world_groups(), Strategy::FullShard);
  std::string msg = error_of([&] { tessera::checkpoint::load(ck, *b, b->kinds); });
  EXPECT_NE(msg.find("checksum mismatch in checkpoint file " + file), std::string::npos) << msg;
  // Missing rank file: every rank sees it before reading anything.
  world().barrier()->wait();
  if (world().rank() == 0) fs::remove(file);
  world().barrier()->wait();
  msg = error_of([&] { tessera::checkpoint::load(ck, *b, b->kinds); });
  EXPECT_NE(msg.find(file + " is missing"), std::string::npos) << msg;
  // A failed save (root is a file) is an error on every rank, nothing else touched.
  world().barrier()->wait();
  if (world().rank() == 0) write_file(dir + "/blocked", "x");
  world().barrier()->wait();
  msg = error_of([&] { Checkpointer(test_policy(dir + "/blocked"), world_groups()).save(2, *a, a->kinds, test_state(2)); });
  EXPECT_NE(msg.find(dir + "/blocked"), std::string::npos) << msg;
  EXPECT_TRUE(fs::exists(ck + "/manifest.json"));
}

// ---- crash safety, driven by tests/mpi/ckpt_crash.sh ---------------------------------------------
// SaveLoop: saves steps 1, 2, ... forever (values seeded by the step), touching DIR/ready after the
// first complete save; the script SIGKILLs one rank or all of them at a random moment.
TEST(CheckpointCrash, SaveLoop) {
  const char* d = std::getenv("TESSERA_CKPT_CRASH_DIR");
  if (!d) GTEST_SKIP() << "driven by tests/mpi/ckpt_crash.sh";
  const std::string root = std::string(d) + "/ckpt";
  const char* first = std::getenv("TESSERA_CKPT_CRASH_FIRST_STEP");
  auto e = make_engine(world_groups(), Strategy::FullShard, tiny_config(256));
  Checkpointer ck(test_policy(root, 2, std::getenv("TESSERA_CKPT_CRASH_ASYNC") != nullptr), world_groups());
  for (int64_t step = first ? std::atoll(first) : 1;; ++step) {
    fill(*e, step);
    ck.save(step, *e, e->kinds, test_state(step, tiny_config(256)));
    if (world().rank() == 0 && !fs::exists(std::string(d) + "/ready")) write_file(std::string(d) + "/ready", "1");
  }
}

// VerifyLatest: latest() is complete, passes verify, and holds exactly its step's values.
TEST(CheckpointCrash, VerifyLatest) {
  const char* d = std::getenv("TESSERA_CKPT_CRASH_DIR");
  if (!d) GTEST_SKIP() << "driven by tests/mpi/ckpt_crash.sh";
  const std::string latest = tessera::checkpoint::latest(std::string(d) + "/ckpt");
  ASSERT_FALSE(latest.empty());
  EXPECT_NO_THROW(tessera::checkpoint::verify(latest));
  auto e = make_engine(world_groups(), Strategy::FullShard, tiny_config(256));
  const auto state = tessera::checkpoint::load(latest, *e, e->kinds);
  const int64_t step = state.at("step").get<int64_t>();
  EXPECT_EQ(latest.substr(latest.rfind('-') + 1), std::to_string(step));
  EXPECT_EQ(mismatches(*e, static_cast<uint64_t>(step)), 0);
  if (world().rank() == 0) std::printf("latest complete checkpoint: %s\n", latest.c_str());
}

}  // namespace test_checkpoint_mpi
