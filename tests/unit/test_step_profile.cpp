// The step-time breakdown and the Chrome trace (runtime/profile/step_profile.h): parts are exclusive
// (a nested part's time is not also its parent's), parts + idle add up to the step, a part opened
// by another thread while the step's thread waits is not counted twice, and the trace holds one
// track per thread with the steps and parts as complete events.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "runtime/profile/step_profile.h"

using namespace tessera;
using profile::Part;

namespace {
void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

double sum_of_parts(const profile::Breakdown& b) {
  double s = b.idle_s;
  for (double p : b.part_s) s += p;
  return s;
}
}  // namespace

TEST(StepProfile, NestedPartsAreExclusiveAndAddUpToTheStep) {
  profile::begin_step(7);
  {
    profile::Scope forward(Part::Forward);
    sleep_ms(20);
    {
      profile::Scope wait(Part::GatherWait);
      sleep_ms(30);
    }
    sleep_ms(10);
  }
  sleep_ms(5);  // in no part: idle
  const profile::Breakdown b = profile::end_step();
  EXPECT_EQ(b.step, 7);
  EXPECT_GE(b.part(Part::Forward), 0.030);
  EXPECT_GE(b.part(Part::GatherWait), 0.030);
  EXPECT_GE(b.idle_s, 0.005);
  EXPECT_EQ(b.part(Part::Backward), 0.0);
  // Had the inner wait also been counted in forward, the parts would exceed the step by 30 ms.
  EXPECT_NEAR(sum_of_parts(b), b.step_s, 1e-9);
  EXPECT_NEAR(b.exposed_s, b.part(Part::GatherWait) + b.part(Part::ReduceWait), 1e-12);
  EXPECT_NEAR(b.compute_s(), b.part(Part::Forward), 1e-12);
  const nlohmann::json j = b.to_json();
  for (const char* k : {"step_s", "data_s", "forward_s", "backward_s", "recompute_s", "gather_wait_s", "reduce_wait_s",
                        "optimizer_s", "sync_wait_s", "idle_s", "comm_s", "exposed_comm_s", "overlap"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_NE(b.summary().find("gather wait"), std::string::npos);
}

TEST(StepProfile, APartOpenedByAThreadTheStepWaitsForIsCountedOnce) {
  // On a GPU autograd's device thread runs the engine's backward while the step's thread is blocked
  // in backward(): its gather wait comes out of backward, not on top of it.
  profile::begin_step(1);
  {
    profile::Scope backward(Part::Backward);
    std::thread t([] {
      profile::Scope wait(Part::GatherWait);
      sleep_ms(30);
    });
    t.join();
    sleep_ms(10);
  }
  const profile::Breakdown b = profile::end_step();
  EXPECT_GE(b.part(Part::GatherWait), 0.030);
  EXPECT_GE(b.part(Part::Backward), 0.010);
  EXPECT_NEAR(sum_of_parts(b), b.step_s, 1e-9);
}

TEST(StepProfile, BeginStepResetsAndMedianIsPerField) {
  profile::begin_step(1);
  {
    profile::Scope s(Part::Optimizer);
    sleep_ms(10);
  }
  profile::end_step();
  profile::begin_step(2);
  const profile::Breakdown b = profile::end_step();
  EXPECT_EQ(b.part(Part::Optimizer), 0.0);
  std::vector<profile::Breakdown> v(3);
  v[0].part_s[static_cast<int>(Part::Data)] = 3;
  v[1].part_s[static_cast<int>(Part::Data)] = 1;
  v[2].part_s[static_cast<int>(Part::Data)] = 2;
  v[0].step_s = 10, v[1].step_s = 30, v[2].step_s = 20;
  const profile::Breakdown m = profile::median(v);
  EXPECT_EQ(m.part(Part::Data), 2.0);
  EXPECT_EQ(m.step_s, 20.0);
}

TEST(StepProfile, TraceHasStepsPartsAndOneTrackPerThread) {
  char dir[] = "/tmp/tessera-trace-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/trace-rank-3.json";
  profile::begin_step(4);  // before the trace: not in it
  profile::end_step();
  profile::start_trace();
  EXPECT_TRUE(profile::tracing());
  for (int step : {5, 6}) {
    profile::begin_step(step);
    {
      profile::Scope forward(Part::Forward);
      sleep_ms(2);
    }
    profile::Scope backward(Part::Backward);
    std::thread([] { profile::Scope wait(Part::ReduceWait); }).join();
    (void)profile::end_step();
  }
  EXPECT_GT(profile::write_trace(path, 3), 0);
  EXPECT_FALSE(profile::tracing());
  std::ifstream in(path);
  const nlohmann::json t = nlohmann::json::parse(in);
  std::map<int, std::string> tracks;
  std::multiset<std::string> names;
  std::set<int> pids;
  for (const auto& e : t.at("traceEvents")) {
    pids.insert(e.at("pid").get<int>());
    if (e.at("ph") == "M" && e.at("name") == "thread_name") tracks[e.at("tid")] = e.at("args").at("name");
    if (e.at("ph") == "X") {
      names.insert(e.at("name").get<std::string>());
      EXPECT_GE(e.at("dur").get<double>(), 0.0);
    }
  }
  EXPECT_EQ(pids, std::set<int>{3});
  EXPECT_EQ(names.count("step 4"), 0u);
  EXPECT_EQ(names.count("step 5"), 1u);
  EXPECT_EQ(names.count("step 6"), 1u);
  EXPECT_EQ(names.count("forward"), 2u);
  EXPECT_EQ(names.count("reduce_wait"), 2u);
  // The steps' thread and the two helper threads: three compute tracks, the first named "compute".
  int compute_tracks = 0;
  for (const auto& [tid, name] : tracks) compute_tracks += name.rfind("compute", 0) == 0;
  EXPECT_EQ(compute_tracks, 3);
  EXPECT_EQ(tracks.at(1), "compute");
  // A step event carries its breakdown.
  for (const auto& e : t.at("traceEvents"))
    if (e.at("name") == "step 5") EXPECT_TRUE(e.at("args").contains("forward_s"));
  std::remove(path.c_str());
  rmdir(dir);
}
