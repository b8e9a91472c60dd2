// The collective flight recorder (runtime/comm/flight_recorder.h) in one process: what the self
// communicator records, the ring, the dump (real files, parsed back), the signal-handler dumps
// (gtest death tests: a child process really dies of SIGSEGV / is terminated by SIGTERM), and the
// analysis (flight_report.h) on records of several ranks written as the format documents them.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/comm/communicator.h"
#include "runtime/comm/flight_recorder.h"
#include "tools/flight_report.h"
#include "util/error.h"
#include "util/file_tree.h"

namespace test_flight {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

namespace fs = std::filesystem;
namespace flight = tessera::comm::flight;
namespace tools = tessera::tools;
using nlohmann::json;

namespace {

std::string temp_dir() {
  char tmpl[] = "/tmp/tessera-flight-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl), nullptr);
  return tmpl;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

std::vector<flight::Record> records_of(const std::string& group) {
  std::vector<flight::Record> out;
  for (auto& r : flight::snapshot())
    if (r.group == group) out.push_back(r);
  return out;
}

// A dump of rank `rank` as flight_report.h documents it, with one group whose entries are
// (seq, op, count, state).
json rank_record(int rank, int world, const std::string& reason,
                 const std::vector<std::tuple<int, std::string, int, std::string>>& entries, const std::string& run = "r1") {
  json g = {{"name", "world"}, {"backend", "mpi"}, {"instance", 0}, {"rank", rank}, {"size", world}};
  g["ranks"] = json::array();
  for (int r = 0; r < world; ++r) g["ranks"].push_back(r);
  uint64_t last = 0, done = 0;
  g["entries"] = json::array();
  for (const auto& [seq, op, count, state] : entries) {
    last = seq;
    if (state == "completed") done = seq;
    g["entries"].push_back({{"seq", seq}, {"op", op}, {"reduce", op == "all_reduce" ? "sum" : ""}, {"dtype", "float32"},
                            {"count", count}, {"bytes", 4 * count}, {"root", -1}, {"state", state}, {"step", 7},
                            {"phase", "train step"}, {"enqueue_ns", 1000 + seq}, {"start_ns", 0}, {"end_ns", 0}});
  }
  g["last_enqueued"] = last;
  g["last_started"] = last;
  g["last_completed"] = done;
  return {{"format", "tessera-flight"}, {"version", 1}, {"rank", rank}, {"world_size", world}, {"host", "h"},
          {"pid", 100 + rank}, {"run_id", run}, {"reason", reason}, {"message", ""},
          {"context", {{"step", 7}, {"phase", "train step"}}},
          {"clock", {{"monotonic_ns", 5000}, {"realtime_ns", 9000}}}, {"groups", json::array({g})}};
}

}  // namespace

TEST(FlightRecorder, SelfCommunicatorRecordsEveryOperationWithContextAndTimes) {
  auto comm = tessera::comm::make_self_communicator("flight-self");
  flight::set_activity(7, "train step");
  at::Tensor t = at::ones({3});
  comm->all_reduce(t, tessera::comm::ReduceOp::Max)->wait();
  {
    flight::ThreadContext ctx(9, "checkpoint save");
    comm->barrier()->wait();
  }
  comm->broadcast(at::zeros({2}, at::kDouble), 0)->wait();
  auto r = records_of("flight-self");
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].seq, 1u);
  EXPECT_EQ(r[0].info.op, flight::Op::AllReduce);
  EXPECT_EQ(r[0].info.reduce, static_cast<int>(tessera::comm::ReduceOp::Max));
  EXPECT_EQ(r[0].info.bytes, 12);
  EXPECT_EQ(r[0].info.count, 3);
  EXPECT_EQ(r[0].step, 7);
  EXPECT_EQ(r[0].phase, "train step");
  EXPECT_EQ(r[1].info.op, flight::Op::Barrier);
  EXPECT_EQ(r[1].step, 9);  // the thread's context while it lived
  EXPECT_EQ(r[1].phase, "checkpoint save");
  EXPECT_EQ(r[2].step, 7);
  EXPECT_EQ(r[2].info.bytes, 16);
  EXPECT_EQ(r[2].info.root, 0);
  for (const auto& x : r) {
    EXPECT_EQ(x.state, flight::State::Completed);
    EXPECT_GT(x.enqueue_ns, 0);
    EXPECT_LE(x.enqueue_ns, x.start_ns);
    EXPECT_LE(x.start_ns, x.end_ns);
    EXPECT_LE(x.end_ns, flight::now_ns());
  }
  // A released group is no longer reported.
  comm.reset();
  EXPECT_TRUE(records_of("flight-self").empty());
}

TEST(FlightRecorder, RingKeepsTheLastEntriesAndStatesFollowTheOperation) {
  flight::Recorder rec("flight-ring", "test", 0, 2, {0, 1});
  flight::OpInfo info = flight::op_info(flight::Op::AllGather, at::zeros({4}));
  const int n = flight::kEntries + 300;
  for (int i = 0; i < n; ++i) {
    const uint64_t seq = rec.enqueue(info);
    ASSERT_EQ(seq, static_cast<uint64_t>(i + 1));
    if (i < n - 2) {
      rec.start(seq);
      rec.end(seq, true);
    } else if (i == n - 2) {
      rec.start(seq);  // in flight
    }
  }
  auto r = records_of("flight-ring");
  ASSERT_EQ(r.size(), static_cast<size_t>(flight::kEntries));
  EXPECT_EQ(r.front().seq, static_cast<uint64_t>(n - flight::kEntries + 1));
  EXPECT_EQ(r.back().seq, static_cast<uint64_t>(n));
  EXPECT_EQ(r[r.size() - 3].state, flight::State::Completed);
  EXPECT_EQ(r[r.size() - 2].state, flight::State::Started);
  EXPECT_EQ(r.back().state, flight::State::Scheduled);
  EXPECT_EQ(r.back().start_ns, 0);
  EXPECT_NE(rec.describe(n).find("collective #" + std::to_string(n) + " (16 bytes of float32"), std::string::npos)
      << rec.describe(n);
}

TEST(FlightRecorder, DumpWritesOneValidRecordThatTheReportReads) {
  const std::string dir = temp_dir();
  EXPECT_EQ(flight::dump("error", "nothing configured"), "");  // no directory: no dump
  tessera::set_process_identity(0, "host-a");
  flight::set_dump_dir(dir + "/flight", "run-1", 1);
  flight::Recorder rec("flight-dump", "test", 0, 2, {0, 1});
  flight::set_activity(31, "train step");
  rec.start(rec.enqueue(flight::op_info(flight::Op::AllReduce, at::zeros({1}, at::kDouble), 0)));
  const std::string path = flight::dump("timeout", "all_reduce \"x\" did not complete\twithin 10s");
  ASSERT_EQ(path, dir + "/flight/rank-0.json");
  json j = read_json(path);  // parses: the signal-safe writer escapes quotes and control characters
  EXPECT_EQ(j["format"], "tessera-flight");
  EXPECT_EQ(j["rank"], 0);
  EXPECT_EQ(j["host"], "host-a");
  EXPECT_EQ(j["run_id"], "run-1");
  EXPECT_EQ(j["reason"], "timeout");
  EXPECT_EQ(j["message"], "all_reduce \"x\" did not complete\twithin 10s");
  EXPECT_EQ(j["context"]["step"], 31);
  const json* g = nullptr;
  for (const auto& x : j["groups"])
    if (x["name"] == "flight-dump") g = &x;
  ASSERT_NE(g, nullptr);
  EXPECT_EQ((*g)["ranks"], json::array({0, 1}));
  EXPECT_EQ((*g)["last_enqueued"], 1);
  EXPECT_EQ((*g)["last_completed"], 0);
  ASSERT_EQ((*g)["entries"].size(), 1u);
  const json& e = (*g)["entries"][0];
  EXPECT_EQ(e["op"], "all_reduce");
  EXPECT_EQ(e["reduce"], "sum");
  EXPECT_EQ(e["dtype"], "float64");
  EXPECT_EQ(e["bytes"], 8);
  EXPECT_EQ(e["state"], "started");
  EXPECT_EQ(e["step"], 31);
  // The first strong dump wins: a second one does not overwrite it.
  EXPECT_EQ(flight::dump("error", "later"), "");
  EXPECT_EQ(read_json(path)["reason"], "timeout");
  const auto dumps = tools::read_dumps(dir + "/flight");
  ASSERT_EQ(dumps.records.size(), 1u);
  EXPECT_EQ(tools::diagnose(dumps).lines.size() >= 2, true);
  flight::set_dump_dir("", "", 1);
  tessera::util::remove_tree(dir);
}

// Death tests: a forked child process installs the handlers, records, and dies; the parent reads
// the file the handler wrote. (gtest runs *DeathTest suites first, before any test starts threads.)
TEST(FlightRecorderDeathTest, FatalSignalDumpsThenDiesOfTheSignalWithoutCore) {
  GTEST_FLAG_SET(death_test_style, "fast");  // forked child: shares `dir`; runs before other tests make threads
  const std::string dir = temp_dir();
  auto child = [&] {
    struct rlimit no_core {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    tessera::set_process_identity(3, "host-b");
    flight::set_dump_dir(dir, "run-2", 4);
    static flight::Recorder rec("world", "mpi", 3, 4, {0, 1, 2, 3});
    flight::set_activity(12, "train step");
    rec.enqueue(flight::op_info(flight::Op::ReduceScatter, at::zeros({8}), 0));
    flight::install_signal_handlers();
    raise(SIGSEGV);
  };
  EXPECT_EXIT(child(), ::testing::KilledBySignal(SIGSEGV),
      "tessera: rank 3 \\(host-b\\): SIGSEGV at step 12 \\(train step\\); flight record .*/rank-3.json");
  json j = read_json(dir + "/rank-3.json");
  EXPECT_EQ(j["reason"], "signal SIGSEGV");
  EXPECT_EQ(j["world_size"], 4);
  EXPECT_EQ(j["context"]["step"], 12);
  bool found = false;
  for (const auto& g : j["groups"])
    if (g["name"] == "world" && g["entries"].size() == 1 && g["entries"][0]["op"] == "reduce_scatter") found = true;
  EXPECT_TRUE(found) << j.dump();
  tessera::util::remove_tree(dir);
}

TEST(FlightRecorderDeathTest, SigtermDumpIsWeakAndChainsToThePreviousHandler) {
  GTEST_FLAG_SET(death_test_style, "fast");  // forked child: shares `dir`; runs before other tests make threads
  const std::string dir = temp_dir();
  // The previous SIGTERM handler (the trainer's preemption flag, here: exit 42) still runs.
  auto chained = [&] {
    tessera::set_process_identity(1, "host-c");
    flight::set_dump_dir(dir, "run-3", 2);
    signal(SIGTERM, [](int) { _exit(42); });
    flight::install_signal_handlers();
    flight::install_signal_handlers();  // idempotent: must not chain to itself
    raise(SIGTERM);
  };
  EXPECT_EXIT(chained(), ::testing::ExitedWithCode(42), "");
  EXPECT_EQ(read_json(dir + "/rank-1.json")["reason"], "signal SIGTERM");
  // After a strong dump (a timeout), SIGTERM does not overwrite it.
  auto strong_first = [&] {
    tessera::set_process_identity(1, "host-c");
    flight::set_dump_dir(dir, "run-4", 2);
    flight::install_signal_handlers();
    flight::dump("timeout", "x did not complete");
    raise(SIGTERM);  // default action after the (skipped) dump
  };
  EXPECT_EXIT(strong_first(), ::testing::KilledBySignal(SIGTERM), "");
  json j = read_json(dir + "/rank-1.json");
  EXPECT_EQ(j["reason"], "timeout");
  EXPECT_EQ(j["run_id"], "run-4");
  tessera::util::remove_tree(dir);
}

// How long the pending collective had been pending when its first member's record was written:
// what tells a rank that stalled before a SIGTERM on every rank (seconds) from one that was only a
// collective behind in the same step (milliseconds; `tessera diagnose` calls that an interruption).
TEST(FlightReport, SaysHowLongThePendingCollectiveWaited) {
  tools::Dumps d;
  auto e = [](int seq, const char* state) { return std::make_tuple(seq, std::string("reduce_scatter"), 2, std::string(state)); };
  d.records.push_back(rank_record(0, 2, "signal SIGTERM", {e(3, "completed")}));
  d.records.push_back(rank_record(1, 2, "signal SIGTERM", {e(3, "completed"), e(4, "started")}));
  for (int64_t ms : {40, 7000}) {  // rank 1 issued #4 at monotonic 1004 ns; its record ms later
    d.records[1]["clock"] = {{"monotonic_ns", 1004 + ms * 1000000}, {"realtime_ns", int64_t(1) << 40}};
    const auto dx = tools::diagnose(d);
    EXPECT_TRUE(dx.pending);
    EXPECT_EQ(dx.behind, std::vector<int>({0}));
    EXPECT_NEAR(dx.pending_wait_s, ms / 1000.0, 1e-6) << ms;
  }
}

TEST(FlightReport, NamesTheRankThatNeverJoinedAndTheOneBehind) {
  // World of 4: ranks 0 and 2 wait in #5 (an all_reduce), rank 3 last issued #4, rank 1 left no record.
  tools::Dumps d;
  auto e = [](int seq, const char* state) { return std::make_tuple(seq, std::string("all_reduce"), 2, std::string(state)); };
  d.records.push_back(rank_record(0, 4, "timeout", {e(3, "completed"), e(4, "completed"), e(5, "started")}));
  d.records.push_back(rank_record(2, 4, "timeout", {e(4, "completed"), e(5, "started")}));
  d.records.push_back(rank_record(3, 4, "signal SIGTERM", {e(3, "completed"), e(4, "completed")}));
  const auto dx = tools::diagnose(d);
  EXPECT_FALSE(dx.desync);
  EXPECT_TRUE(dx.pending);
  EXPECT_EQ(dx.missing, std::vector<int>({1}));
  EXPECT_EQ(dx.behind, std::vector<int>({1, 3}));
  const std::string& s = dx.summary;
  EXPECT_NE(s.find("collective #5 all_reduce(sum) 8 bytes float32 (2 elements) on group 'world' (mpi, ranks 0-3) at "
                   "step 7, train step did not complete"),
            std::string::npos) << s;
  EXPECT_NE(s.find("rank 1 has no flight record"), std::string::npos) << s;
  EXPECT_NE(s.find("rank 3 last issued #4 all_reduce(sum)"), std::string::npos) << s;
  EXPECT_NE(s.find("ranks 0, 2 timed out waiting in it"), std::string::npos) << s;
  EXPECT_EQ(s.find('\n'), std::string::npos);
}

TEST(FlightRecorderDeathTest, AStopIsCountedAndASigcontAloneIsNot) {
  GTEST_FLAG_SET(death_test_style, "fast");
  const std::string dir = temp_dir();
  auto child = [&] {
    tessera::set_process_identity(0, "host-d");
    flight::set_dump_dir(dir, "run-5", 1);
    flight::install_signal_handlers();
    // A SIGCONT to a running process (mpirun and srun send one before SIGTERM) is not a stop.
    kill(getpid(), SIGCONT);
    usleep(300000);
    if (flight::times_stopped() != 0) _exit(1);
    // Stopped for 3 s: a helper process continues us.
    const pid_t me = getpid();
    const pid_t helper = fork();
    if (helper == 0) {
      const struct timespec t {3, 0};
      nanosleep(&t, nullptr);
      kill(me, SIGCONT);
      _exit(0);
    }
    kill(me, SIGSTOP);
    waitpid(helper, nullptr, 0);
    flight::dump("timeout", "");
    _exit(flight::times_stopped() == 1 && flight::last_stop_s() >= 2.5 ? 7 : 2);
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(7), "");
  json j = read_json(dir + "/rank-0.json");
  EXPECT_EQ(j["stops"], 1);
  EXPECT_GE(j["stop_ns"].get<int64_t>(), 2500000000LL);
  EXPECT_GT(j["stop_end_ns"].get<int64_t>(), 0);
  tessera::util::remove_tree(dir);
}

TEST(FlightReport, ARankStoppedInACollectiveIsNamed) {
  // Rank 1 was stopped (SIGSTOP) inside #4 and continued later; rank 0 completed #4 and timed out in #5.
  auto e = [](int seq, const char* state) { return std::make_tuple(seq, std::string("all_reduce"), 2, std::string(state)); };
  tools::Dumps d;
  d.records.push_back(rank_record(0, 2, "timeout", {e(4, "completed"), e(5, "started")}));
  json r1 = rank_record(1, 2, "timeout", {e(3, "completed"), e(4, "started")});
  r1["stops"] = 1;
  r1["stop_end_ns"] = 2000;  // after #4's enqueue_ns (1004)
  r1["stop_ns"] = 12300000000LL;
  d.records.push_back(r1);
  auto dx = tools::diagnose(d);
  EXPECT_NE(dx.summary.find("collective #4 all_reduce(sum) 8 bytes float32 (2 elements) on group 'world' (mpi, ranks 0-1) "
                            "at step 7, train step did not complete: rank 1 was stopped for 12.3 s while in it (did not run: "
                            "SIGSTOP or frozen); rank 0 completed it (then in #5)"),
            std::string::npos) << dx.summary;
  EXPECT_EQ(dx.behind, std::vector<int>({1}));
  // Stopped before it issued #4: not stopped in it, it timed out waiting like the others.
  d.records[1]["stop_end_ns"] = 10;
  dx = tools::diagnose(d);
  EXPECT_NE(dx.summary.find("rank 1 timed out waiting in it; rank 0 completed it (then in #5)"), std::string::npos)
      << dx.summary;
  // Its record written on SIGTERM 14 s after it issued #4, with a 10 s timeout it never hit: it was
  // not waiting in it (stuck elsewhere, e.g. in computation, or a stop its record does not show).
  d.records[1]["reason"] = "signal SIGTERM";
  d.records[1]["timeout_ms"] = 10000;
  d.records[1]["clock"]["monotonic_ns"] = 1004 + 14000000000LL;
  dx = tools::diagnose(d);
  EXPECT_NE(dx.summary.find("rank 1 was in it for 14.0 s without timing out (timeout 10 s): stopped or not running; "
                            "rank 0 completed it (then in #5)"),
            std::string::npos) << dx.summary;
  EXPECT_EQ(dx.behind, std::vector<int>({1}));
  d.records[1]["clock"]["monotonic_ns"] = 1004 + 2000000000LL;  // 2 s: ended by the launcher while waiting
  EXPECT_NE(tools::diagnose(d).summary.find("rank 1 was in it without timing out (record written on signal SIGTERM)"),
            std::string::npos);
  // Both in #5; rank 1 issued it 12 s after rank 0 (it ran again only after a stop, and caught up).
  d.records[0] = rank_record(0, 2, "timeout", {e(4, "completed"), e(5, "started")});
  d.records[0]["timeout_ms"] = 10000;
  d.records[1] = rank_record(1, 2, "signal SIGTERM", {e(4, "completed"), e(5, "started")});
  d.records[1]["timeout_ms"] = 10000;
  d.records[1]["clock"]["realtime_ns"] = 9000 + 12000000000LL;  // same monotonic times, 12 s later on the wall clock
  dx = tools::diagnose(d);
  EXPECT_NE(dx.summary.find("collective #5 all_reduce(sum) 8 bytes float32 (2 elements) on group 'world' (mpi, ranks 0-1) at "
                            "step 7, train step did not complete: rank 1 issued it 12.0 s after rank 0, later than the "
                            "timeout (10 s): behind; rank 0 timed out waiting in it"),
            std::string::npos) << dx.summary;
  EXPECT_EQ(dx.behind, std::vector<int>({1}));
  // The same, but rank 1 completed #5 when it ran again (rank 0's small message was buffered) and
  // was in #6 when it was ended: still the one behind, not a rank that merely "completed it".
  d.records[1] = rank_record(1, 2, "signal SIGTERM", {e(4, "completed"), e(5, "completed"), e(6, "started")});
  d.records[1]["timeout_ms"] = 10000;
  d.records[1]["clock"]["realtime_ns"] = 9000 + 12000000000LL;
  dx = tools::diagnose(d);
  EXPECT_NE(dx.summary.find("collective #5 all_reduce(sum) 8 bytes float32 (2 elements) on group 'world' (mpi, ranks 0-1) at "
                            "step 7, train step did not complete: rank 1 issued it 12.0 s after rank 0, later than the "
                            "timeout (10 s): behind, and completed it when it ran again (then in #6); rank 0 timed out "
                            "waiting in it"),
            std::string::npos) << dx.summary;
  EXPECT_EQ(dx.behind, std::vector<int>({1}));
  d.records[1]["clock"]["realtime_ns"] = 9000 + 2000000000LL;  // 2 s late: within the timeout, not behind
  EXPECT_NE(tools::diagnose(d).summary.find("rank 0 timed out waiting in it; rank 1 completed it (then in #6)"),
            std::string::npos);
  // In time, completed #5 on its side, then stopped 1 s later in #6, before rank 0's timeout: a
  // sender's last fragment (a TCP rendezvous' completion message) can still wait in it, so it is the
  // one holding #5 up (seen in a CI run of mpi.flight_stall).
  d.records[1]["clock"]["realtime_ns"] = 9000;
  d.records[1]["stops"] = 1;
  d.records[1]["stop_ns"] = 11000000000LL;
  d.records[1]["stop_end_ns"] = 12000000000LL;  // began at 1 s, after #5 ended
  // Rank 1 alone is behind, and the summary says `says`.
  auto rank1_behind = [&d](const std::string& says) {
    const tools::Diagnosis dx = tools::diagnose(d);
    EXPECT_EQ(dx.behind, std::vector<int>({1}));
    EXPECT_NE(dx.summary.find(says), std::string::npos) << dx.summary;
  };
  rank1_behind("did not complete: rank 1 completed it on its side, then was stopped for 11.0 s (did not run: SIGSTOP or "
               "frozen) in #6: the rest of its part may never have left it; rank 0 timed out waiting in it");
  // Its last heartbeat before the stop came 50 ms before #5 ended on its side (the recorded stop
  // starts at that beat): it ran when it stamped #5's end, so the stop still came after #5 (seen in
  // a run of mpi.flight_stall on a busy host).
  d.records[1]["groups"][0]["entries"][1]["end_ns"] = 1050000000LL;
  rank1_behind("rank 1 completed it on its side, then was stopped for 11.0 s");
  // Stopped after it issued #5 (enqueue_ns 1005) and before it started it; it completed #5 only once
  // it ran again, 12 s later, and was in #6 when it was ended (seen in a run of mpi.flight_stall: the
  // stop caught rank 1 between enqueueing an all_gather and its communication thread starting it).
  d.records[1]["stop_end_ns"] = 12000000000LL;
  d.records[1]["stop_ns"] = 11999990000LL;  // began at 10 us (a heartbeat before the stop)
  d.records[1]["groups"][0]["entries"][1]["start_ns"] = 12000000100LL;
  d.records[1]["groups"][0]["entries"][1]["end_ns"] = 12000000400LL;
  rank1_behind("did not complete: rank 1 was stopped for 12.0 s while in it (did not run: SIGSTOP or frozen), and "
               "completed it only when it ran again (then in #6); rank 0 timed out waiting in it");
  d.records[1]["stop_ns"] = 11000000000LL;
  d.records[1]["groups"][0]["entries"][1]["start_ns"] = 0;
  d.records[1]["groups"][0]["entries"][1]["end_ns"] = 0;
  d.records[1]["stop_end_ns"] = 30000000000LL;  // began at 19 s, after rank 0 had timed out: not the cause
  EXPECT_NE(tools::diagnose(d).summary.find("rank 0 timed out waiting in it; rank 1 completed it (then in #6)"),
            std::string::npos);
}

TEST(FlightReport, DesyncAndInSyncAndOlderRuns) {
  const std::string dir = temp_dir();
  auto write = [&](const json& j) {
    std::ofstream(dir + "/rank-" + std::to_string(j["rank"].get<int>()) + ".json") << j.dump();
  };
  auto e = [](int seq, const char* op, int count, const char* state) {
    return std::make_tuple(seq, std::string(op), count, std::string(state));
  };
  // #2: rank 0 all_reduce of 1 element, rank 1 of 2 elements.
  write(rank_record(0, 2, "error", {e(1, "broadcast", 4, "completed"), e(2, "all_reduce", 1, "failed")}, "new"));
  write(rank_record(1, 2, "signal SIGTERM",
                    {e(1, "broadcast", 4, "completed"), e(2, "all_reduce", 2, "completed"), e(3, "all_reduce", 1, "started")},
                    "new"));
  json old = rank_record(2, 3, "timeout", {}, "old");
  old["clock"]["realtime_ns"] = 10;
  write(old);
  std::ofstream(dir + "/rank-7.json") << "{not json";
  auto dumps = tools::read_dumps(dir);
  ASSERT_EQ(dumps.records.size(), 2u);
  ASSERT_EQ(dumps.notes.size(), 2u);
  auto dx = tools::diagnose(dumps);
  EXPECT_TRUE(dx.desync);
  EXPECT_NE(dx.summary.find("desync in group 'world' (mpi, ranks 0-1) at collective #2: rank 0 all_reduce(sum) 4 bytes "
                            "float32 (1 element) at step 7, train step; rank 1 all_reduce(sum) 8 bytes float32 (2 elements)"),
            std::string::npos) << dx.summary;
  // In sync: nothing pending, nothing disagrees.
  tools::Dumps ok;
  ok.records.push_back(rank_record(0, 2, "signal SIGTERM", {e(1, "barrier", 0, "completed")}));
  ok.records.push_back(rank_record(1, 2, "signal SIGTERM", {e(1, "barrier", 0, "completed")}));
  dx = tools::diagnose(ok);
  EXPECT_FALSE(dx.desync);
  EXPECT_FALSE(dx.pending);
  EXPECT_EQ(dx.summary, "no pending collective and no desync in the records");
  EXPECT_THROW(tools::read_dumps(dir + "/missing"), tessera::Error);
  tessera::util::remove_tree(dir);
}

}  // namespace test_flight
