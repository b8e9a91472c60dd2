// Reading and analysing flight-recorder dumps (flight_recorder.h): what `tessera diagnose <log.dir>`
// prints, and the last line a failing run prints on its lowest rank that has a record.
//
// A dump is <log.dir>/flight/rank-<N>.json:
//   {"format": "tessera-flight", "version": 1, "rank", "world_size", "host", "pid", "run_id",
//    "reason" ("timeout" | "error" | "signal SIGSEGV" | "signal SIGTERM" ...), "message",
//    "context": {"step", "phase"}, "timeout_ms" (comm.timeout_s), "stops" (times the process did
//    not run for over 2 s: SIGSTOP, frozen), "stop_end_ns" and "stop_ns" (the last one's end and
//    length), "clock": {"monotonic_ns", "realtime_ns"},
//    "groups": [{"name", "backend", "instance", "rank", "size", "ranks" (world ranks of the members),
//                "last_enqueued", "last_started", "last_completed",
//                "entries": [{"seq", "op", "reduce", "dtype", "count", "bytes", "root", "state",
//                             "step", "phase", "enqueue_ns", "start_ns", "end_ns"}]}]}
// count/bytes: the whole buffer the operation is about (all_gather: the gathered output;
// reduce_scatter: the input; all_reduce/broadcast: the tensor; scatter: this rank's chunk;
// scatter_pieces: this rank's pieces, which differ between ranks and are not compared).
//
// Analysis, per group (same backend, name, instance and members on every rank): the pending
// collective is the lowest sequence number some member with a record has not completed; members
// that issued it and timed out were waiting in it (one that issued it but did not time out was
// ended by its launcher while in it; one that was stopped (did not run) since it issued it, or
// that was in it longer than its timeout without timing out, was stopped or not running, and is
// named as behind), members whose last issued number
// is lower are behind, members with no dump at all are missing (stopped, killed, or stuck where they
// could not write). A desync
// is a sequence number that two members recorded with a different op, reduce op, dtype, element
// count or root. Only dumps of the newest run (run_id) are analysed.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera::tools {

struct Dumps {
  std::vector<nlohmann::json> records;  // parsed rank-*.json of the newest run
  std::vector<std::string> notes;       // unreadable files, records of older runs
};
// Reads every rank-*.json in `flight_dir` (Error(Input) if it is not a directory).
Dumps read_dumps(const std::string& flight_dir);

struct Diagnosis {
  std::string summary;             // one line
  std::vector<std::string> lines;  // the full report
  std::vector<int> missing;        // world ranks with no record
  std::vector<int> behind;         // world ranks behind in some group's pending collective
  bool desync = false;
  bool pending = false;            // some group has a collective not every member completed
  double pending_wait_s = 0;       // the earliest pending one: from its first issue to that rank's record
};
Diagnosis diagnose(const Dumps& dumps);

// After a collective timeout on this rank (its record written): waits until every rank's record of
// this run is in `flight_dir` or a grace period (a quarter of comm.timeout_s, 2-30 s) has passed,
// then, on the lowest rank with a record, prints the diagnosis as its last line (stderr). Called
// by the main thread of `tessera` (app/main.cpp) on its way out.
void diagnose_after_timeout(const std::string& flight_dir, int world_size, int world_rank);

}  // namespace tessera::tools
