// The host optimizer thread (runtime/train/host_update.h) on its own, with plain jobs: what the
// trainer relies on when optim.in_backward runs under fsdp.offload (tests/mpi/test_offload.cpp
// checks the trainer's numbers). Each test would fail, not hang, if the jobs ran inline in submit().
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/train/host_update.h"

namespace test_host_update {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using tessera::train::HostUpdateThread;

namespace {

struct UnitFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace

// submit() hands the job over and returns before it runs: the job waits for a flag the caller sets
// only after submit() returned (up to 10 s, so an inline run fails instead of hanging).
TEST(HostUpdateThread, SubmitReturnsBeforeTheJobIsDone) {
  HostUpdateThread t;
  t.begin();
  std::promise<void> caller_went_on;
  std::shared_future<void> went_on = caller_went_on.get_future().share();
  bool saw_caller_go_on = false;
  std::thread::id ran_on;
  t.submit([&] {
    ran_on = std::this_thread::get_id();
    saw_caller_go_on = went_on.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  });
  caller_went_on.set_value();
  t.drain();
  EXPECT_TRUE(saw_caller_go_on) << "the job finished before submit() returned";
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

// In order, one at a time; with hold every job waits for the next one to arrive, so every job but
// the last is done before drain() and counted as overlapped; without hold, once every job has run
// before drain() is called, all five count.
TEST(HostUpdateThread, RunsInOrderAndCountsTheOverlap) {
  HostUpdateThread t;
  for (const bool hold : {true, false}) {
    std::mutex mu;
    std::vector<std::string> events;
    auto log = [&](std::string e) {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(std::move(e));
    };
    t.begin(hold);
    for (int k = 0; k < 5; ++k) {
      log("arrive " + std::to_string(k));
      t.submit([&, k] { log("run " + std::to_string(k)); });
    }
    for (int i = 0; !hold && i < 1000 && t.overlapped() < 5; ++i)  // every job done before drain() (10 s at most)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    t.drain();
    std::vector<std::string> runs;
    for (const std::string& e : events)
      if (e.rfind("run ", 0) == 0) runs.push_back(e);
    EXPECT_EQ(runs, (std::vector<std::string>{"run 0", "run 1", "run 2", "run 3", "run 4"}));
    if (hold) {
      EXPECT_EQ(t.overlapped(), 4);
      for (int k = 0; k < 4; ++k) {  // job k ran after job k + 1 arrived
        const auto at = [&](const std::string& e) { return std::find(events.begin(), events.end(), e) - events.begin(); };
        EXPECT_LT(at("arrive " + std::to_string(k + 1)), at("run " + std::to_string(k))) << "job " << k;
      }
    } else {
      EXPECT_EQ(t.overlapped(), 5);
    }
  }
}

// A job's exception comes back from drain() on the calling thread as the same object; the jobs
// handed over after it do not run; the next window starts clean.
TEST(HostUpdateThread, AJobsErrorSurfacesInDrainAndLaterJobsDoNotRun) {
  HostUpdateThread t;
  std::atomic<int> ran{0};
  t.begin();
  t.submit([&] { ++ran; });
  t.submit([&] { throw UnitFailed("unit 3: AdamW state does not match shard 3"); });
  t.submit([&] { ++ran; });
  t.submit([&] { ++ran; });
  try {
    t.drain();
    ADD_FAILURE() << "drain() did not rethrow";
  } catch (const UnitFailed& e) {
    EXPECT_STREQ(e.what(), "unit 3: AdamW state does not match shard 3");
  }
  EXPECT_EQ(ran.load(), 1);
  t.begin();
  t.submit([&] { ++ran; });
  EXPECT_NO_THROW(t.drain());
  EXPECT_EQ(ran.load(), 2);
}

// A step that throws abandons the window: abandon() waits for the job in hand and keeps no error;
// a held job not yet started when the thread is destroyed is dropped, and the destructor joins.
TEST(HostUpdateThread, AbandonAndDestructionNeverLeaveAJobRunning) {
  std::atomic<int> ran{0};
  {
    HostUpdateThread t;
    t.begin();
    t.submit([&] { throw UnitFailed("first"); });
    t.abandon();
    t.begin(/*hold=*/true);
    t.submit([&] { ++ran; });  // held: no next job and no drain
  }
  EXPECT_EQ(ran.load(), 0);
}

}  // namespace test_host_update
