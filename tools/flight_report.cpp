// Analysis of flight-recorder dumps (see flight_report.h).
#include "tools/flight_report.h"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <thread>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "runtime/comm/communicator.h"
#include "runtime/comm/flight_recorder.h"
#include "util/error.h"
#include "util/json.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace tessera::tools {
namespace {

// "0-3, 5, 7-8"
std::string ranks_text(std::vector<int> r) {
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  std::string s;
  for (size_t i = 0; i < r.size();) {
    size_t j = i;
    while (j + 1 < r.size() && r[j + 1] == r[j] + 1) ++j;
    if (!s.empty()) s += ", ";
    s += std::to_string(r[i]);
    if (j > i) s += "-" + std::to_string(r[j]);
    i = j + 1;
  }
  return s;
}
std::string rank_word(const std::vector<int>& r) { return (r.size() == 1 ? "rank " : "ranks ") + ranks_text(r); }

int64_t num(const json& j, const char* key, int64_t dflt = 0) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<int64_t>() : dflt;
}
std::string str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

// "all_reduce(sum) 8 bytes float64 (1 element)" / "... root 0"
std::string op_text(const json& e) {
  std::string s = str(e, "op");
  if (!str(e, "reduce").empty()) s += "(" + str(e, "reduce") + ")";
  s += " " + std::to_string(num(e, "bytes")) + " bytes " + str(e, "dtype");
  const int64_t count = num(e, "count");
  s += " (" + std::to_string(count) + (count == 1 ? " element" : " elements");
  if (num(e, "root", -1) >= 0) s += ", root " + std::to_string(num(e, "root"));
  return s + ")";
}
// "step 31, train step" or ""
std::string where_text(const json& e) {
  std::string s;
  if (num(e, "step", -1) >= 0) s = "step " + std::to_string(num(e, "step"));
  if (!str(e, "phase").empty()) s += (s.empty() ? "" : ", ") + str(e, "phase");
  return s;
}
// What every member must agree on at one sequence number.
std::string signature(const json& e) {
  if (str(e, "op") == "scatter_pieces") return "scatter_pieces|" + std::to_string(num(e, "root", -1));
  return str(e, "op") + "|" + str(e, "reduce") + "|" + str(e, "dtype") + "|" + std::to_string(num(e, "count")) + "|" +
         std::to_string(num(e, "root", -1));
}

struct Member {
  const json* record = nullptr;  // the rank's dump
  const json* group = nullptr;   // this group in it
  std::map<uint64_t, const json*> entries;
};

struct Group {
  std::string name, backend;
  int64_t instance = 0;
  std::vector<int> ranks;
  std::map<int, Member> present;  // world rank -> member with a record of this group
};

std::string group_text(const Group& g) {
  return "group '" + g.name + "' (" + g.backend + (g.instance ? " #" + std::to_string(g.instance) : "") + ", " +
         rank_word(g.ranks) + ")";
}

// Realtime (ns) of a monotonic timestamp of `record`.
int64_t realtime_of(const json& record, int64_t mono) {
  const json& c = record.value("clock", json::object());
  return mono - num(c, "monotonic_ns") + num(c, "realtime_ns");
}

}  // namespace

Dumps read_dumps(const std::string& flight_dir) {
  std::error_code ec;
  if (!fs::is_directory(flight_dir, ec))
    throw TESSERA_INPUT_ERROR(flight_dir + ": no flight records (not a directory; the run writes them to <log.dir>/flight "
                              "on a timeout, an abort or a fatal signal)");
  static const std::regex name_re("rank-([0-9]+)\\.json");
  std::vector<std::pair<std::string, json>> all;
  Dumps d;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(flight_dir, ec))
    if (std::regex_match(e.path().filename().string(), name_re)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& p : files) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    try {
      json j = util::parse_json(ss.str());
      if (!j.is_object() || j.value("format", "") != "tessera-flight" || !j.contains("rank") || !j["rank"].is_number() ||
          !j.contains("groups") || !j["groups"].is_array())
        throw std::runtime_error("not a tessera flight record");
      all.emplace_back(p.filename().string(), std::move(j));
    } catch (const std::exception& e) {
      d.notes.push_back(p.filename().string() + ": unreadable (" + std::string(e.what()).substr(0, 120) + "), ignored");
    }
  }
  // The newest run: the run id of the most recent dump.
  std::string newest;
  int64_t newest_t = INT64_MIN;
  for (const auto& [f, j] : all) {
    const int64_t t = num(j.value("clock", json::object()), "realtime_ns");
    if (t > newest_t) newest_t = t, newest = j.value("run_id", "");
  }
  for (auto& [f, j] : all) {
    if (j.value("run_id", "") == newest)
      d.records.push_back(std::move(j));
    else
      d.notes.push_back(f + " is from an older run (run " + j.value("run_id", "?") + "), ignored");
  }
  return d;
}

namespace {

// The header lines: which ranks left a record, and each record's reason. Fills dx.missing.
std::map<int, const json*> describe_records(const Dumps& dumps, Diagnosis& dx) {
  int64_t world = 0;
  std::map<int, const json*> by_rank;
  for (const auto& r : dumps.records) {
    world = std::max(world, num(r, "world_size", 1));
    by_rank[static_cast<int>(num(r, "rank"))] = &r;
  }
  std::vector<int> have;
  for (const auto& [rank, r] : by_rank) have.push_back(rank);
  for (int r = 0; r < world; ++r)
    if (!by_rank.count(r)) dx.missing.push_back(r);
  dx.lines.push_back("flight records of " + rank_word(have) + " of " + std::to_string(world) + " (run " +
                     str(dumps.records.front(), "run_id") +
                     ")" + (dx.missing.empty() ? "" : "; no record from " + rank_word(dx.missing)));
  for (const auto& [rank, r] : by_rank) {
    const json& ctx = r->value("context", json::object());
    std::string where = where_text(ctx);
    std::string msg = str(*r, "message");
    dx.lines.push_back("rank " + std::to_string(rank) + " (host " + str(*r, "host") + (where.empty() ? "" : ", " + where) +
                       "): " + str(*r, "reason") + (msg.empty() ? "" : ": " + msg));
  }
  return by_rank;
}

// Groups, matched across ranks by backend, name, instance and members.
std::map<std::string, Group> match_groups(const std::map<int, const json*>& by_rank) {
  std::map<std::string, Group> groups;
  for (const auto& [rank, r] : by_rank) {
    for (const auto& g : (*r)["groups"]) {
      if (!g.is_object()) continue;
      std::vector<int> ranks;
      if (g.contains("ranks") && g["ranks"].is_array())
        for (const auto& x : g["ranks"])
          if (x.is_number()) ranks.push_back(x.get<int>());
      std::string key = str(g, "backend") + "/" + str(g, "name") + "/" + std::to_string(num(g, "instance")) + "/" +
                        ranks_text(ranks);
      Group& G = groups[key];
      G.name = str(g, "name");
      G.backend = str(g, "backend");
      G.instance = num(g, "instance");
      G.ranks = ranks;
      Member& m = G.present[rank];
      m.record = r;
      m.group = &g;
      if (g.contains("entries") && g["entries"].is_array())
        for (const auto& e : g["entries"])
          if (e.is_object()) m.entries[static_cast<uint64_t>(num(e, "seq"))] = &e;
    }
  }
  return groups;
}

// The lowest sequence number two members of G recorded differently ("" if none).
std::string find_desync(const Group& G) {
  std::map<uint64_t, std::map<std::string, std::vector<int>>> sigs;
  for (const auto& [rank, m] : G.present)
    for (const auto& [seq, e] : m.entries) sigs[seq][signature(*e)].push_back(rank);
  for (const auto& [seq, by_sig] : sigs) {
    if (by_sig.size() < 2) continue;
    std::string s = "desync in " + group_text(G) + " at collective #" + std::to_string(seq) + ":";
    bool first = true;
    for (const auto& [sig, ranks] : by_sig) {
      const json& e = *G.present.at(ranks[0]).entries.at(seq);
      s += std::string(first ? " " : "; ") + rank_word(ranks) + " " + op_text(e);
      std::string w = where_text(e);
      if (!w.empty()) s += " at " + w;
      first = false;
    }
    return s;
  }
  return "";
}

// The pending collective of a group and what each member did about it.
struct Pending {
  uint64_t stuck = 0;
  const json* first_entry = nullptr;  // the earliest member's entry of it
  int64_t t_real = INT64_MAX;         // when that member issued it (wall clock)
  int64_t waited_ns = 0;              // from then to that member's record (wall clock)
  int first_rank = -1;
  std::vector<int> timed_out, waiting;
  std::vector<std::string> behind_text, done_text, not_running;
};

// True when m's record shows a stop that began after it completed `done` (its end_ns) and before
// `deadline_real` (wall clock: the first member's issue time plus the timeout). The stop's recorded
// start is the last heartbeat before it, up to a beat (100 ms, more on a busy host) early; but the
// process ran when it stamped end_ns, so a stop that ended after end_ns began after it.
bool stopped_after(const Member& m, const json* done, int64_t deadline_real) {
  if (!done || num(*m.record, "stops") <= 0) return false;
  const int64_t end = num(*done, "end_ns"), stop_end = num(*m.record, "stop_end_ns");
  const int64_t began = std::max(stop_end - num(*m.record, "stop_ns"), end);
  return stop_end > end && realtime_of(*m.record, began) <= deadline_real;
}

// True when m's record shows a stop that ended after it issued `it` (its enqueue_ns: it was issued,
// so the stop began after that) and before it completed it (end_ns), beginning before
// `deadline_real`: it completed the collective only once it ran again, after its peers' timeout
// (seen in a run of mpi.flight_stall: stopped between enqueueing an all_gather and starting it).
bool stopped_in_it(const Member& m, const json* it, int64_t deadline_real) {
  if (!it || num(*m.record, "stops") <= 0) return false;
  const int64_t enq = num(*it, "enqueue_ns"), end = num(*it, "end_ns"), stop_end = num(*m.record, "stop_end_ns");
  const int64_t began = std::max(stop_end - num(*m.record, "stop_ns"), enq);
  return stop_end > enq && end >= stop_end && realtime_of(*m.record, began) <= deadline_real;
}

// A member that completed the pending collective: done; behind when it issued it later than the
// timeout after the first member (e.g. stopped before it, and caught up only when it ran again, once
// the first member had already timed out: its peers' data was buffered for small messages); stopped
// in it, completing it only when it ran again; or stopped right after it, before the first member's
// timeout.
void classify_completed(const Member& m, int rank, uint64_t lc, Pending& p, std::set<int>& behind) {
  auto it = m.entries.find(p.stuck);
  const json* entry = it != m.entries.end() ? it->second : nullptr;
  const bool in_next = m.entries.count(lc + 1) > 0;
  const std::string next = "#" + std::to_string(lc + 1);
  const std::string then = in_next ? " (then in " + next + ")" : "", stopped_in = in_next ? " in " + next : "";
  const int64_t timeout_ns = num(*m.record, "timeout_ms") * 1000000;
  const int64_t late = entry ? realtime_of(*m.record, num(*entry, "enqueue_ns")) - p.t_real : 0;
  const int64_t deadline = timeout_ns > 0 ? p.t_real + timeout_ns : INT64_MAX;
  const double stop_s = num(*m.record, "stop_ns") / 1e9;
  char text[240] = {0};
  if (timeout_ns > 0 && late > timeout_ns)
    std::snprintf(text, sizeof(text),
                  "rank %d issued it %.1f s after rank %d, later than the timeout (%g s): behind, and completed it "
                  "when it ran again%s",
                  rank, late / 1e9, p.first_rank, timeout_ns / 1e9, then.c_str());
  else if (stopped_in_it(m, entry, deadline))
    std::snprintf(text, sizeof(text),
                  "rank %d was stopped for %.1f s while in it (did not run: SIGSTOP or frozen), and completed it "
                  "only when it ran again%s",
                  rank, stop_s, then.c_str());
  else if (stopped_after(m, entry, deadline))
    // A sender can complete on its side while its last fragment (e.g. the rendezvous' completion
    // message over TCP) is still queued in its own process: a stop then holds the others up.
    std::snprintf(text, sizeof(text),
                  "rank %d completed it on its side, then was stopped for %.1f s (did not run: SIGSTOP or "
                  "frozen)%s: the rest of its part may never have left it",
                  rank, stop_s, stopped_in.c_str());
  if (!text[0]) {
    p.done_text.push_back("rank " + std::to_string(rank) + " completed it" + then);
    return;
  }
  p.not_running.push_back(text);
  behind.insert(rank);
}

// A member in the pending collective: stopped (did not run for seconds) since it issued it; issued it
// so long after the first member that the first could time out first (behind); in it longer than its
// timeout without timing out (not running); or waiting (timed out, or ended by its launcher in it).
void classify_in_it(const Member& m, int rank, Pending& p, std::set<int>& behind) {
  auto it = m.entries.find(p.stuck);
  const int64_t enq = it != m.entries.end() ? num(*it->second, "enqueue_ns") : INT64_MAX;
  const int64_t dumped = num(m.record->value("clock", json::object()), "monotonic_ns");
  const int64_t timeout_ns = num(*m.record, "timeout_ms") * 1000000;
  const bool timed_out_here = str(*m.record, "reason") == "timeout";
  const int64_t late = enq == INT64_MAX ? 0 : realtime_of(*m.record, enq) - p.t_real;
  char text[240] = {0};
  if (num(*m.record, "stops") > 0 && enq != INT64_MAX && num(*m.record, "stop_end_ns") > enq)
    std::snprintf(text, sizeof(text), "rank %d was stopped for %.1f s while in it (did not run: SIGSTOP or frozen)", rank,
                  num(*m.record, "stop_ns") / 1e9);
  else if (timeout_ns > 0 && late > timeout_ns)
    std::snprintf(text, sizeof(text), "rank %d issued it %.1f s after rank %d, later than the timeout (%g s): behind",
                  rank, late / 1e9, p.first_rank, timeout_ns / 1e9);
  else if (!timed_out_here && timeout_ns > 0 && enq != INT64_MAX && dumped - enq > timeout_ns)
    std::snprintf(text, sizeof(text),
                  "rank %d was in it for %.1f s without timing out (timeout %g s): stopped or not running", rank,
                  (dumped - enq) / 1e9, timeout_ns / 1e9);
  if (!text[0]) {
    (timed_out_here ? p.timed_out : p.waiting).push_back(rank);
    return;
  }
  p.not_running.push_back(text);
  behind.insert(rank);
}

// A member that has not issued the pending collective: behind, with what it last issued.
void classify_behind(const Member& m, int rank, uint64_t le, Pending& p, std::set<int>& behind) {
  behind.insert(rank);
  std::string b = "rank " + std::to_string(rank) + " last issued #" + std::to_string(le);
  auto last = m.entries.find(le);
  if (last != m.entries.end()) {
    b += " " + op_text(*last->second);
    std::string w = where_text(*last->second);
    if (!w.empty()) b += " at " + w;
  }
  p.behind_text.push_back(b);
}

// Who issued the pending collective first, and when (wall clock, so ranks on several hosts compare);
// then each member's part in it.
Pending analyse_pending(const Group& G, uint64_t stuck, std::set<int>& behind) {
  Pending p;
  p.stuck = stuck;
  for (const auto& [rank, m] : G.present) {
    auto it = m.entries.find(stuck);
    if (it == m.entries.end()) continue;
    const int64_t t = realtime_of(*m.record, num(*it->second, "enqueue_ns"));
    if (t < p.t_real) p.t_real = t, p.first_rank = rank, p.first_entry = it->second;
  }
  if (p.first_rank >= 0)
    p.waited_ns = num(G.present.at(p.first_rank).record->value("clock", json::object()), "realtime_ns") - p.t_real;
  for (const auto& [rank, m] : G.present) {
    const uint64_t le = num(*m.group, "last_enqueued"), lc = num(*m.group, "last_completed");
    if (lc >= stuck)
      classify_completed(m, rank, lc, p, behind);
    else if (le >= stuck)
      classify_in_it(m, rank, p, behind);
    else
      classify_behind(m, rank, le, p, behind);
  }
  return p;
}

// "collective #5 all_gather ... on group 'world' (...) at step 3, forward did not complete: ..."
std::string pending_text(const Group& G, const Pending& p, const std::vector<int>& absent) {
  const json* e = p.first_entry;
  std::string s = "collective #" + std::to_string(p.stuck) + (e ? " " + op_text(*e) : std::string()) + " on " +
                  group_text(G);
  std::string w = e ? where_text(*e) : "";
  if (!w.empty()) s += " at " + w;
  s += " did not complete:";
  std::string parts;
  auto add = [&](const std::string& part) { parts += (parts.empty() ? " " : "; ") + part; };
  if (!absent.empty())
    add(rank_word(absent) + (absent.size() == 1 ? " has" : " have") +
        " no flight record (stopped, killed, or stuck where it could not write one)");
  for (const auto& n : p.not_running) add(n);
  for (const auto& b : p.behind_text) add(b + " (behind)");
  if (!p.timed_out.empty()) add(rank_word(p.timed_out) + " timed out waiting in it");
  std::map<std::string, std::vector<int>> by_reason;  // members in it that did not time out
  for (int r : p.waiting) by_reason[str(*G.present.at(r).record, "reason")].push_back(r);
  for (const auto& [reason, ranks] : by_reason)
    add(rank_word(ranks) + (ranks.size() == 1 ? " was" : " were") + " in it without timing out (record written on " +
        reason + ")");
  for (const auto& d : p.done_text) add(d);
  return s + parts;
}

}  // namespace

Diagnosis diagnose(const Dumps& dumps) {
  Diagnosis dx;
  for (const auto& n : dumps.notes) dx.lines.push_back("note: " + n);
  if (dumps.records.empty()) {
    dx.summary = "no flight records";
    dx.lines.push_back(dx.summary);
    return dx;
  }
  const auto groups = match_groups(describe_records(dumps, dx));
  std::string first_desync, first_pending;
  int64_t first_pending_t = INT64_MAX;
  std::set<int> behind;
  for (const auto& [key, G] : groups) {
    if (G.ranks.size() < 2) continue;
    std::vector<int> absent;
    for (int r : G.ranks)
      if (!G.present.count(r)) absent.push_back(r);
    if (const std::string d = find_desync(G); !d.empty()) {
      dx.desync = true;
      dx.lines.push_back(d);
      if (first_desync.empty()) first_desync = d;
    }
    // The pending collective: the lowest number some member with a record has not completed.
    uint64_t min_done = UINT64_MAX, frontier = 0;
    for (const auto& [rank, m] : G.present) {
      min_done = std::min<uint64_t>(min_done, num(*m.group, "last_completed"));
      frontier = std::max<uint64_t>(frontier, num(*m.group, "last_enqueued"));
    }
    if (min_done + 1 > frontier) {
      if (frontier == 0) continue;  // never used
      dx.lines.push_back(group_text(G) + ": every member with a record completed collective #" + std::to_string(min_done) +
                         (absent.empty() ? "" : "; no record from " + rank_word(absent)));
      continue;
    }
    dx.pending = true;
    const Pending p = analyse_pending(G, min_done + 1, behind);
    const std::string s = pending_text(G, p, absent);
    dx.lines.push_back(s);
    for (int r : absent) behind.insert(r);
    if (p.t_real < first_pending_t || first_pending.empty()) {
      first_pending_t = p.t_real, first_pending = s;
      dx.pending_wait_s = p.waited_ns / 1e9;
    }
  }
  dx.behind.assign(behind.begin(), behind.end());
  if (!first_desync.empty())
    dx.summary = first_desync;
  else if (!first_pending.empty())
    dx.summary = first_pending;
  else
    dx.summary = "no pending collective and no desync in the records" +
                 (dx.missing.empty() ? std::string() : "; no record from " + rank_word(dx.missing));
  return dx;
}

void diagnose_after_timeout(const std::string& flight_dir, int world_size, int world_rank) {
  using namespace std::chrono;
  const auto grace = std::clamp<milliseconds>(comm::default_timeout() / 4, seconds(2), seconds(30));
  const std::string run = comm::flight::run_id();
  const auto deadline = steady_clock::now() + grace;
  Dumps dumps;
  for (;;) {
    try {
      dumps = read_dumps(flight_dir);
    } catch (const std::exception&) {
      dumps = {};
    }
    std::set<int> ranks;
    for (const auto& r : dumps.records)
      if (r.value("run_id", "") == run) ranks.insert(r.value("rank", -1));
    if (static_cast<int>(ranks.size()) >= world_size || steady_clock::now() >= deadline) {
      const int printer = ranks.empty() ? world_rank : *ranks.begin();
      if (printer != world_rank) {
        std::this_thread::sleep_for(seconds(1));  // let the printing rank print before anyone aborts
        return;
      }
      break;
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
  const auto dx = diagnose(dumps);
  std::cerr << "tessera: flight recorder: " << dx.summary << " (full report: tessera diagnose "
            << std::filesystem::path(flight_dir).parent_path().string() << ")" << std::endl;
}

}  // namespace tessera::tools
