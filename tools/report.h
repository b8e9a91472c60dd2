// The run report: one self-contained HTML file (inline SVG charts and CSS, no script, no network)
// from a run directory's metrics.jsonl and run_info.json. Written by `tessera report RUN_DIR` and by
// `tessera train` at the end of a run.
//
// Charts (x = step): loss with the validation loss, learning rate, gradient norm, tokens/s, MFU,
// memory (every *_bytes field, in MiB), step time, target tokens, then every other numeric field
// of the records, found generically: a top-level number gets its own chart, a nested object one
// chart with a line per numeric leaf (so fields added to the records later appear without changes
// here). A step logged twice (a resumed run) shows its last record. Series that are 0 throughout
// are left out and named below the charts. Tables: a summary, the run's topology, model and data,
// and the full configuration (run_info.json, written by train at start).
//
// The HTML is also well-formed XML (tests parse it); every chart is an <svg class="chart"> with a
// <polyline class="series" data-name="..."> per series whose points are inside its viewBox.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace tessera::tools {

// The report of run directory `run_dir` as HTML. Throws Error(Input) naming the file when
// metrics.jsonl is missing or holds no record.
std::string render_report(const std::string& run_dir);

// Writes render_report(run_dir) to `out` (default: run_dir/report.html) through a fresh temporary
// beside it, renamed over the name (a link there is replaced, never written through); returns the
// path. An `out` that exists and is not a report (a regular file beginning as every report does) is
// refused (Error(Input)) unless `force`.
std::string write_report(const std::string& run_dir, const std::string& out = "", bool force = false);

// run_dir/run_info.json (written by train at start: config, model, topology, run_id), or {} when it
// is missing, not a regular file, over util::budget::kRecordBytes, unreadable or not an object.
nlohmann::json read_run_info(const std::string& run_dir);

}  // namespace tessera::tools
