// DistributedSampler: determinism, disjointness, coverage, per-epoch reshuffle, W-rank vs W=1
// equivalence and checkpoint state.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

#include "runtime/data/sampler.h"
#include "util/error.h"

namespace test_data_sampler {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace tessera;
using namespace tessera::data;

TEST(SplitMix64, MatchesReferenceSequence) {
  // Reference values of Vigna's splitmix64.c for seed 1234567.
  SplitMix64 rng(1234567);
  EXPECT_EQ(rng.next(), 6457827717110365317ULL);
  EXPECT_EQ(rng.next(), 3203168211198807973ULL);
  EXPECT_EQ(rng.next(), 9817491932198370423ULL);
  EXPECT_EQ(rng.next(), 4593380528125082431ULL);
  EXPECT_EQ(rng.next(), 16408922859458223821ULL);
}

TEST(Permutation, IsAPermutationAndDeterministic) {
  const auto p = permutation(1000, 42);
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_EQ(permutation(1000, 42), p);
  EXPECT_NE(permutation(1000, 43), p);
  int64_t fixed = 0;
  for (int64_t i = 0; i < 1000; ++i) fixed += p[i] == i;
  EXPECT_LT(fixed, 10);  // a shuffle, not the identity (expected ~1 fixed point)
}

TEST(DistributedSampler, RanksAndMicroBatchesPartitionEachGlobalBatch) {
  const int W = 4, micro = 2, accum = 3;
  const int64_t n = 100;  // global batch 24 -> 4 steps per epoch, 4 sequences dropped per epoch
  std::vector<DistributedSampler> ranks;
  for (int r = 0; r < W; ++r) ranks.emplace_back(n, W, r, micro, accum, 7);
  EXPECT_EQ(ranks[0].global_batch(), 24);
  EXPECT_EQ(ranks[0].steps_per_epoch(), 4);

  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::set<int64_t> seen_in_epoch;
    for (int64_t k = 0; k < 4; ++k) {
      const int64_t step = epoch * 4 + k;
      std::vector<int64_t> all;
      for (int a = 0; a < accum; ++a)
        for (int r = 0; r < W; ++r) {
          const auto mb = ranks[r].micro_batch(step, a);
          ASSERT_EQ(mb.size(), size_t(micro));
          all.insert(all.end(), mb.begin(), mb.end());
        }
      // Slot order a*W + r reproduces the global batch exactly.
      EXPECT_EQ(all, ranks[0].global_batch_indices(step));
      EXPECT_EQ(ranks[1].global_batch_indices(step), ranks[0].global_batch_indices(step));
      for (int64_t i : all) {
        EXPECT_TRUE(i >= 0 && i < n);
        EXPECT_TRUE(seen_in_epoch.insert(i).second) << "sequence " << i << " twice in epoch " << epoch;
      }
    }
    EXPECT_EQ(seen_in_epoch.size(), size_t(96));  // every sequence but the dropped tail
  }
}

TEST(DistributedSampler, ReshufflesPerEpochAndIsDeterministic) {
  DistributedSampler a(64, 2, 1, 4, 2, 123), b(64, 2, 1, 4, 2, 123), other_seed(64, 2, 1, 4, 2, 124);
  EXPECT_EQ(a.steps_per_epoch(), 4);
  EXPECT_EQ(a.micro_batch(5, 1), b.micro_batch(5, 1));
  EXPECT_NE(a.global_batch_indices(0), other_seed.global_batch_indices(0));
  // Same position in consecutive epochs draws different sequences; epochs are full permutations.
  EXPECT_NE(a.global_batch_indices(0), a.global_batch_indices(4));
  std::set<int64_t> e0, e1;
  for (int k = 0; k < 4; ++k) {
    for (int64_t i : a.global_batch_indices(k)) e0.insert(i);
    for (int64_t i : a.global_batch_indices(4 + k)) e1.insert(i);
  }
  EXPECT_EQ(e0.size(), 64u);
  EXPECT_EQ(e0, e1);
  // The epoch-e permutation is permutation(n, seed + e).
  const auto p1 = permutation(64, 124);
  EXPECT_EQ(a.global_batch_indices(4), std::vector<int64_t>(p1.begin(), p1.begin() + 16));
  // Going back to an earlier epoch (e.g. after resume) gives the same indices again.
  const auto first = a.micro_batch(0, 0);
  a.micro_batch(9, 0);
  EXPECT_EQ(a.micro_batch(0, 0), first);
}

TEST(DistributedSampler, NoShuffleIsSequential) {
  DistributedSampler s(10, 2, 1, 2, 1, 5, /*shuffle=*/false);
  EXPECT_EQ(s.global_batch_indices(0), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(s.micro_batch(1, 0), (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(s.micro_batch(2, 0), (std::vector<int64_t>{2, 3}));  // epoch 1 starts over
}

TEST(DistributedSampler, WRanksSeeTheSameMicroBatchesAsOneRankWithMoreAccumulation) {
  const int micro = 3, accum = 2;
  const int64_t n = 500;
  for (int W : {2, 4}) {
    DistributedSampler single(n, 1, 0, micro, accum * W, 99);
    ASSERT_EQ(single.global_batch(), int64_t(W) * micro * accum);
    for (int r = 0; r < W; ++r) {
      DistributedSampler rank(n, W, r, micro, accum, 99);
      for (int64_t step : {0, 1, 7, 40}) {
        for (int a = 0; a < accum; ++a) EXPECT_EQ(rank.micro_batch(step, a), single.micro_batch(step, a * W + r));
      }
    }
  }
}

TEST(DistributedSampler, StateRoundTripAndMismatch) {
  DistributedSampler s(50, 2, 0, 2, 2, 11);  // global 8, 6 steps per epoch
  for (int i = 0; i < 13; ++i) s.advance();
  const nlohmann::json st = s.state();
  EXPECT_EQ(st["step"], 13);
  EXPECT_EQ(st["epoch"], 2);
  EXPECT_EQ(st["step_in_epoch"], 1);

  DistributedSampler resumed(50, 2, 0, 2, 2, 11);
  resumed.load_state(nlohmann::json::parse(st.dump()));
  EXPECT_EQ(resumed.step(), 13);
  EXPECT_EQ(resumed.epoch(), 2);
  EXPECT_EQ(resumed.micro_batch(resumed.step(), 1), s.micro_batch(s.step(), 1));

  // Different world size with the same global batch may resume (rank 1 of 4, micro 1, accum 2).
  DistributedSampler resharded(50, 4, 1, 1, 2, 11);
  EXPECT_NO_THROW(resharded.load_state(st));
  EXPECT_EQ(resharded.step(), 13);

  DistributedSampler other_data(60, 2, 0, 2, 2, 11);
  try {
    other_data.load_state(st);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input);
    EXPECT_NE(std::string(e.what()).find("num_sequences"), std::string::npos) << e.what();
  }
  EXPECT_THROW(DistributedSampler(50, 2, 0, 2, 2, 12).load_state(st), Error);
}

TEST(DistributedSampler, BadSettingsAreInputErrors) {
  try {
    DistributedSampler(10, 2, 0, 3, 2, 1);  // global batch 12 > 10 sequences
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input);
    const std::string msg = e.what();
    for (const char* s : {"10 sequences", "12", "micro batch 3", "accumulation 2"})
      EXPECT_NE(msg.find(s), std::string::npos) << msg;
  }
  EXPECT_THROW(DistributedSampler(10, 2, 2, 1, 1, 1), Error);
  EXPECT_THROW(DistributedSampler(10, 2, 0, 0, 1, 1), Error);
  EXPECT_THROW(DistributedSampler(10, 2, 0, 1, 0, 1), Error);
}

}  // namespace test_data_sampler
