#include "tools/report.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <vector>

#include "util/budgets.h"
#include "util/error.h"
#include "util/json.h"
#include "util/output_file.h"

namespace tessera::tools {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string esc(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string num(double v, const char* fmt = "%.4g") {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (step, value)
};

struct Chart {
  std::string title, unit;
  std::vector<Series> series;
};

// Numeric leaves of a record: "a" for a top-level number, "a.b" inside objects.
void numeric_leaves(const json& j, const std::string& prefix, std::map<std::string, double>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it->is_object()) numeric_leaves(*it, key, out);
    else if (it->is_number()) out[key] = it->get<double>();
  }
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "peak 332.8 GFLOP/s per rank, CPU ..." from a metrics record's mfu_peak {flops, source} (with
// the whole source: "..., CPU ...: 2 core(s) x ..."); records before it existed divided by a timed
// matmul.
std::string mfu_peak_label(const json& r, bool whole_source = false) {
  if (!r.contains("mfu_peak") || !r["mfu_peak"].is_object()) return "a timed matmul (old record)";
  const json& p = r["mfu_peak"];
  const double f = p.value("flops", 0.0);
  const std::string source = p.value("source", std::string());
  if (f <= 0) return "unknown, MFU not reported: " + source;
  const std::string value = f >= 1e12 ? num(f / 1e12) + " TFLOP/s" : num(f / 1e9) + " GFLOP/s";
  return "peak " + value + " per rank, " + (whole_source ? source : source.substr(0, source.find(':')));
}

// 1-2-5 tick step for a range.
double nice_step(double range, int target) {
  const double raw = range / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

// Splits `text` at spaces into lines of at most `chars` characters (a longer word stays whole).
std::vector<std::string> wrap(const std::string& text, size_t chars) {
  std::vector<std::string> lines(1);
  std::istringstream words(text);
  for (std::string w; words >> w;) {
    if (!lines.back().empty() && lines.back().size() + 1 + w.size() > chars) lines.emplace_back();
    lines.back() += (lines.back().empty() ? "" : " ") + w;
  }
  return lines;
}

// Where the title lines and the legend entries go: the title wraps at the plot's width and the
// legend entries flow left to right onto as many rows as they need (widths estimated from the
// character count: 14px bold titles about 8.5px a character, 12px legend text about 7px), so
// neither is clipped by the chart's edge; the plot starts below them.
struct Layout {
  std::vector<std::string> title;
  std::vector<std::pair<double, double>> legend;  // per series: x of its swatch, baseline y
  double top = 40;
};
Layout layout(const Chart& c, double W, double left, double right) {
  Layout l;
  l.title = wrap(c.title + (c.unit.empty() ? "" : " (" + c.unit + ")"), static_cast<size_t>((W - left - right) / 8.5));
  double x = left + 10, y = 16 + 18.0 * (l.title.size() - 1) + 14;
  for (const Series& s : c.series) {
    const double w = 16 + 7.0 * s.name.size() + 14;
    if (x > left + 10 && x + w > W - right) x = left + 10, y += 16;
    l.legend.emplace_back(x, y);
    x += w;
  }
  l.top = y + 10;
  return l;
}

std::string svg_chart(const Chart& c) {
  const double W = 560, left = 64, right = 16, bottom = 36;
  const Layout l = layout(c, W, left, right);
  const double top = l.top, H = 230 + top;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const auto& s : c.series)
    for (const auto& [x, y] : s.points) {
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) {
    const double pad = std::abs(y0) > 0 ? std::abs(y0) * 0.05 : 1;
    y0 -= pad, y1 += pad;
  }
  const double ys = nice_step(y1 - y0, 5);
  y0 = std::floor(y0 / ys) * ys, y1 = std::ceil(y1 / ys) * ys;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * (W - left - right); };
  auto py = [&](double y) { return H - bottom - (y - y0) / (y1 - y0) * (H - top - bottom); };
  std::ostringstream o;
  o << "<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << " " << H << "\" data-title=\"" << esc(c.title) << "\">\n";
  o << "<rect x=\"0\" y=\"0\" width=\"" << W << "\" height=\"" << H << "\" fill=\"#ffffff\"/>\n";
  for (size_t i = 0; i < l.title.size(); ++i)
    o << "<text x=\"" << left << "\" y=\"" << 16 + 18 * i << "\" class=\"title\">" << esc(l.title[i]) << "</text>\n";
  // Grid and y ticks.
  for (double y = y0; y <= y1 + ys * 0.5; y += ys) {
    o << "<line x1=\"" << left << "\" x2=\"" << W - right << "\" y1=\"" << num(py(y), "%.1f") << "\" y2=\"" << num(py(y), "%.1f")
      << "\" stroke=\"#e5e5e5\"/>\n";
    o << "<text x=\"" << left - 6 << "\" y=\"" << num(py(y) + 4, "%.1f") << "\" class=\"tick\" text-anchor=\"end\">"
      << num(std::abs(y) < ys * 1e-6 ? 0 : y) << "</text>\n";
  }
  const double xs = std::max(1.0, nice_step(x1 - x0, 6));  // steps are integers
  for (double x = std::ceil(x0 / xs) * xs; x <= x1 + 1e-9; x += xs) {
    o << "<line x1=\"" << num(px(x), "%.1f") << "\" x2=\"" << num(px(x), "%.1f") << "\" y1=\"" << H - bottom << "\" y2=\""
      << H - bottom + 4 << "\" stroke=\"#888888\"/>\n";
    o << "<text x=\"" << num(px(x), "%.1f") << "\" y=\"" << H - bottom + 16 << "\" class=\"tick\" text-anchor=\"middle\">"
      << num(x, "%.0f") << "</text>\n";
  }
  o << "<text x=\"" << W - right << "\" y=\"" << H - 4 << "\" class=\"tick\" text-anchor=\"end\">step</text>\n";
  o << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << W - left - right << "\" height=\"" << H - top - bottom
    << "\" fill=\"none\" stroke=\"#888888\"/>\n";
  // Series, then the legend.
  for (size_t i = 0; i < c.series.size(); ++i) {
    const Series& s = c.series[i];
    const char* color = kColors[i % (sizeof(kColors) / sizeof(kColors[0]))];
    o << "<polyline class=\"series\" data-name=\"" << esc(s.name) << "\" fill=\"none\" stroke=\"" << color
      << "\" stroke-width=\"2\" points=\"";
    for (size_t k = 0; k < s.points.size(); ++k)
      o << (k ? " " : "") << num(px(s.points[k].first), "%.1f") << "," << num(py(s.points[k].second), "%.1f");
    o << "\"/>\n";
    if (s.points.size() <= 40)
      for (const auto& [x, y] : s.points)
        o << "<circle cx=\"" << num(px(x), "%.1f") << "\" cy=\"" << num(py(y), "%.1f") << "\" r=\"3\" fill=\"" << color << "\"/>\n";
    const auto [lx, ly] = l.legend[i];
    o << "<rect x=\"" << lx << "\" y=\"" << ly - 6 << "\" width=\"12\" height=\"4\" fill=\"" << color << "\"/>";
    o << "<text x=\"" << lx + 16 << "\" y=\"" << ly << "\" class=\"legend\">" << esc(s.name) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

void table_rows(const json& j, const std::string& prefix, std::ostringstream& o) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it->is_object()) {
      table_rows(*it, key, o);
      continue;
    }
    o << "<tr><td>" << esc(key) << "</td><td>" << esc(it->is_string() ? it->get<std::string>() : it->dump())
      << "</td></tr>\n";
  }
}

std::string table(const std::string& title, const json& j) {
  std::ostringstream o;
  o << "<h2>" << esc(title) << "</h2>\n<table>\n";
  table_rows(j, "", o);
  o << "</table>\n";
  return o.str();
}

}  // namespace

// The Chrome trace of train.profile_steps (trace-rank-<r>.json, runtime/profile/step_profile.h)
// as a timeline: one lane per track (steps, compute, each communicator), one box per event,
// coloured by its name. "" when the file is missing; a note when it cannot be read.
std::string svg_timeline(const fs::path& path) {
  std::ifstream f(path);
  if (!f) return "";
  json t;
  try {
    t = util::parse_json(f);
    (void)t.at("traceEvents").is_array();
  } catch (const json::exception&) {
    return "<p>" + esc(path.string()) + ": not a readable trace (not drawn).</p>\n";
  }
  struct Box {
    int lane;
    double ts, dur;
    std::string name;
  };
  std::map<int, std::string> track_names;  // tid -> name
  std::vector<std::tuple<int, double, double, std::string, bool>> raw;  // tid, ts, dur, name, is step
  for (const auto& e : t["traceEvents"]) {
    if (!e.is_object() || !e.contains("ph") || !e.contains("tid")) continue;
    try {
      if (e["ph"] == "M" && e.value("name", "") == "thread_name")
        track_names[e["tid"].get<int>()] = e.at("args").at("name").get<std::string>();
      else if (e["ph"] == "X")
        raw.emplace_back(e["tid"].get<int>(), e.at("ts").get<double>(), e.at("dur").get<double>(),
                         e.value("name", "?"), e.value("cat", "") == "step");
    } catch (const json::exception&) {
    }
  }
  if (raw.empty()) return "";
  // Lanes: steps first, then the tracks in id order (compute, other threads, communicators).
  std::vector<std::string> lanes = {"steps"};
  std::map<int, int> lane_of;
  for (const auto& [tid, name] : track_names) lane_of[tid] = static_cast<int>(lanes.size()), lanes.push_back(name);
  double t0 = 1e300, t1 = -1e300;
  std::vector<Box> boxes;
  for (const auto& [tid, ts, dur, name, step] : raw) {
    if (!step && !lane_of.count(tid)) lane_of[tid] = static_cast<int>(lanes.size()), lanes.push_back("thread " + std::to_string(tid));
    boxes.push_back({step ? 0 : lane_of[tid], ts, dur, name});
    t0 = std::min(t0, ts), t1 = std::max(t1, ts + dur);
  }
  const double span = std::max(t1 - t0, 1.0);
  const int W = 1100, left = 190, lane_h = 22, top = 34;
  const int H = top + lane_h * static_cast<int>(lanes.size()) + 60;
  static const std::map<std::string, std::string> colour = {
      {"forward", "#4c78a8"},     {"backward", "#f58518"},    {"recompute", "#b279a2"},  {"gather_wait", "#e45756"},
      {"reduce_wait", "#9d755d"}, {"optimizer", "#54a24b"},   {"sync_wait", "#bab0ac"},  {"data", "#eeca3b"},
      {"all_gather", "#72b7b2"},  {"reduce_scatter", "#ff9da6"}, {"all_reduce", "#8c564b"}, {"broadcast", "#17becf"}};
  std::ostringstream o;
  o << "<svg class=\"chart\" data-title=\"Trace\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << " " << H << "\">\n";
  o << "<text class=\"title\" x=\"10\" y=\"20\">" << esc(path.filename().string()) << ": " << num(span / 1000.0, "%.1f")
    << " ms (open it in ui.perfetto.dev or chrome://tracing for detail)</text>\n";
  for (size_t i = 0; i < lanes.size(); ++i) {
    const int y = top + lane_h * static_cast<int>(i);
    o << "<text class=\"tick\" x=\"6\" y=\"" << y + 15 << "\">" << esc(lanes[i]) << "</text>\n";
    o << "<line x1=\"" << left << "\" x2=\"" << W - 10 << "\" y1=\"" << y + lane_h << "\" y2=\"" << y + lane_h
      << "\" stroke=\"#eeeeee\"/>\n";
  }
  const double scale = (W - 10 - left) / span;
  // Longer boxes first: a part nested in another (a gather wait inside forward) is drawn on top.
  std::stable_sort(boxes.begin(), boxes.end(), [](const Box& a, const Box& b) { return a.dur > b.dur; });
  for (const auto& b : boxes) {
    const auto c = colour.find(b.name);
    const std::string fill = b.lane == 0 ? "#dddddd" : c != colour.end() ? c->second : "#999999";
    const int y = top + lane_h * b.lane + 3;
    o << "<rect class=\"event\" data-name=\"" << esc(b.name) << "\" x=\"" << num(left + (b.ts - t0) * scale, "%.2f")
      << "\" y=\"" << y << "\" width=\"" << num(std::max(0.5, b.dur * scale), "%.2f") << "\" height=\"" << lane_h - 6
      << "\" fill=\"" << fill << "\" stroke=\"#ffffff\" stroke-width=\"0.3\"><title>" << esc(b.name) << " "
      << num(b.dur / 1000.0, "%.3f") << " ms</title></rect>\n";
    if (b.lane == 0 && b.dur * scale > 40)
      o << "<text class=\"tick\" x=\"" << num(left + (b.ts - t0) * scale + 4, "%.1f") << "\" y=\"" << y + 12 << "\">"
        << esc(b.name) << "</text>\n";
  }
  int x = left, y = H - 30;
  for (const auto& [name, fill] : colour) {
    if (std::none_of(boxes.begin(), boxes.end(), [&, n = name](const Box& b) { return b.name == n; })) continue;
    o << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"12\" height=\"12\" fill=\"" << fill << "\"/>"
      << "<text class=\"legend\" x=\"" << x + 16 << "\" y=\"" << y + 11 << "\">" << esc(name) << "</text>\n";
    x += 30 + 7 * static_cast<int>(name.size());
  }
  o << "</svg>\n";
  return o.str();
}

namespace {

// metrics.jsonl by step (a step logged again by a resumed run: the last record wins); `bad` counts
// the lines that are not step records (e.g. a line cut short by a crash).
std::map<int64_t, json> read_metrics(const std::string& run_dir, int64_t* bad) {
  const std::string metrics_path = (fs::path(run_dir) / "metrics.jsonl").string();
  std::ifstream in(metrics_path);
  if (!in) throw TESSERA_INPUT_ERROR(metrics_path + ": no metrics file (is " + run_dir + " a run's log.dir?)");
  std::map<int64_t, json> by_step;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      json r = util::parse_json(line);
      if (r.is_object() && r.contains("step") && r["step"].is_number_integer()) by_step[r["step"].get<int64_t>()] = r;
      else ++*bad;
    } catch (const json::exception&) {
      ++*bad;
    }
  }
  if (by_step.empty()) throw TESSERA_INPUT_ERROR(metrics_path + " holds no step record");
  return by_step;
}


// Every numeric leaf of the records over the steps, and the order the leaves first appeared in.
struct Fields {
  std::map<std::string, Series> series;
  std::vector<std::string> order;
};

Fields collect_fields(const std::map<int64_t, json>& by_step) {
  Fields f;
  for (const auto& [step, r] : by_step) {
    std::map<std::string, double> leaves;
    numeric_leaves(r, "", leaves);
    for (const auto& [k, v] : leaves) {
      if (k == "step" || !std::isfinite(v)) continue;
      if (!f.series.count(k)) f.order.push_back(k), f.series[k].name = k;
      f.series[k].points.emplace_back(static_cast<double>(step), v);
    }
  }
  return f;
}

// Charts from the fields: each field is charted once; a field that is zero throughout is listed.
struct ChartBuilder {
  const Fields& f;
  std::set<std::string> used = {"val_ppl", "val_tokens"};  // shown in the summary, not charted
  std::vector<Chart> charts;
  std::vector<std::string> all_zero;

  std::optional<Series> take(const std::string& k, double scale = 1.0, const std::string& label = "") {
    if (!f.series.count(k) || used.count(k)) return std::nullopt;
    used.insert(k);
    Series s = f.series.at(k);
    if (!label.empty()) s.name = label;
    bool zero = true;
    for (auto& p : s.points) p.second *= scale, zero &= p.second == 0;
    if (zero) {
      all_zero.push_back(k);
      return std::nullopt;
    }
    return s;
  }
  void add(const std::string& title, const std::string& unit, std::vector<std::optional<Series>> ss) {
    Chart c{title, unit, {}};
    for (auto& s : ss)
      if (s) c.series.push_back(std::move(*s));
    if (!c.series.empty()) charts.push_back(std::move(c));
  }
  // Fields named by a predicate, in order of appearance, each through take(k, scale, label(k)).
  template <class Pred, class Label>
  std::vector<std::optional<Series>> take_all(Pred pred, double scale, Label label) {
    std::vector<std::optional<Series>> out;
    for (const auto& k : f.order)
      if (pred(k)) out.push_back(take(k, scale, label(k)));
    return out;
  }
};

constexpr double kMiB = 1.0 / 1048576.0;

// The charts every run has: loss, lr, norm, throughput, MFU (its axis names its peak: the last
// record's), memory, step time and its parts, communication, targets.
void add_known_charts(ChartBuilder& b, const json& last_record) {
  auto none = [](const std::string&) { return std::string(); };
  b.add("Loss", "", {b.take("loss", 1, "train loss"), b.take("val_loss", 1, "validation loss")});
  b.add("Learning rate", "", {b.take("lr")});
  b.add("Gradient norm", "", {b.take("grad_norm")});
  b.add("Throughput", "tokens/s", {b.take("tokens_per_s")});
  b.add("MFU", "% of " + mfu_peak_label(last_record), {b.take("mfu", 100.0)});
  b.add("Model FLOP/s over a square matmul timed at the start (not MFU)", "%",
        {b.take("mfu_of_measured_gemm", 100.0, "of measured GEMM")});
  b.used.insert("mfu_peak.flops");
  b.add("Memory", "MiB",
        b.take_all([](const std::string& k) { return k.find('.') == std::string::npos && ends_with(k, "_bytes"); }, kMiB,
                   none));
  b.add("Step time", "s", {b.take("step_time_s")});
  // metrics' "time": the parts of the step (runtime/profile/step_profile.h), then communication.
  b.add("Where the step's time goes", "s",
        b.take_all(
            [](const std::string& k) {
              return k.rfind("time.", 0) == 0 && ends_with(k, "_s") && k != "time.step_s" && k != "time.comm_s" &&
                     k != "time.exposed_comm_s";
            },
            1.0, [](const std::string& k) { return k.substr(5, k.size() - 7); }));
  b.add("Communication per step", "s", {b.take("time.comm_s", 1.0, "busy (any communicator)"),
                                        b.take("time.exposed_comm_s", 1.0, "exposed (compute waited)")});
  b.add("Communication overlapped with compute", "%", {b.take("time.overlap", 100.0, "overlap")});
  b.used.insert("time.step_s");  // = step_time_s up to the record's own bookkeeping
  b.add("Target tokens per step", "", {b.take("target_tokens")});
}

// Everything else, generically: top-level numbers alone, nested objects together.
void add_other_charts(ChartBuilder& b) {
  std::vector<std::string> groups;
  for (const auto& k : b.f.order) {
    if (b.used.count(k)) continue;
    const std::string group = k.substr(0, k.find('.'));
    if (std::find(groups.begin(), groups.end(), group) == groups.end()) groups.push_back(group);
  }
  for (const auto& g : groups) {
    auto in_group = [&](const std::string& k) { return k == g || k.rfind(g + ".", 0) == 0; };
    bool bytes = false;
    for (const auto& k : b.f.order)
      if (in_group(k)) bytes |= ends_with(k, "_bytes");
    std::vector<std::optional<Series>> ss;
    for (const auto& k : b.f.order)
      if (in_group(k)) ss.push_back(b.take(k, bytes && ends_with(k, "_bytes") ? kMiB : 1.0));
    b.add(g, bytes ? "MiB" : "", ss);
  }
}

json summarize(const std::map<int64_t, json>& by_step, const Fields& f, int64_t bad) {
  const json& first = by_step.begin()->second;
  const json& last = by_step.rbegin()->second;
  json summary = json::object();
  summary["steps"] = std::to_string(by_step.begin()->first) + " - " + std::to_string(by_step.rbegin()->first) + " (" +
                     std::to_string(by_step.size()) + " records)";
  if (first.contains("loss") && last.contains("loss") && first["loss"].is_number() && last["loss"].is_number())
    summary["train loss"] = num(first["loss"].get<double>()) + " -> " + num(last["loss"].get<double>());
  double best = 0;
  int64_t best_step = -1;
  for (const auto& [step, r] : by_step)
    if (r.contains("val_loss") && r["val_loss"].is_number() && (best_step < 0 || r["val_loss"].get<double>() < best))
      best = r["val_loss"].get<double>(), best_step = step;
  if (best_step >= 0)
    summary["best validation loss"] = num(best) + " (perplexity " + num(std::exp(best)) + ") at step " + std::to_string(best_step);
  if (f.series.count("tokens_per_s")) {
    double sum = 0;
    for (const auto& p : f.series.at("tokens_per_s").points) sum += p.second;
    summary["mean tokens/s"] = num(sum / f.series.at("tokens_per_s").points.size(), "%.0f");
  }
  double total_time = 0;
  if (f.series.count("step_time_s"))
    for (const auto& p : f.series.at("step_time_s").points) total_time += p.second;
  if (total_time > 0) summary["training time (sum of steps)"] = num(total_time, "%.1f") + " s";
  if (last.contains("device")) summary["device"] = last["device"];
  if (last.contains("mfu_peak") && last["mfu_peak"].is_object())
    summary["MFU peak (per rank)"] = mfu_peak_label(last, true);
  if (bad) summary["unreadable metrics lines"] = bad;
  return summary;
}

// How every report begins, up to the run directory in its title: `report --out` replaces an existing
// file only when it begins so (or with --force).
const char* kReportHead =
    "<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n"
    "<title>Tessera run report: ";

const char* kReportStyle =
    "body { font-family: sans-serif; margin: 24px; color: #222222; background: #fafafa; }\n"
    "h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }\n"
    ".charts { display: flex; flex-wrap: wrap; gap: 16px; }\n"
    "svg.chart { border: 1px solid #dddddd; background: #ffffff; }\n"
    "svg .title { font-size: 14px; font-weight: bold; } svg .tick { font-size: 11px; fill: #555555; }\n"
    "svg .legend { font-size: 12px; }\n"
    "table { border-collapse: collapse; font-size: 13px; } td { border: 1px solid #dddddd; padding: 3px 8px; }\n"
    "td:first-child { color: #555555; }\n"
    "td.sample, pre.prompt { white-space: pre-wrap; font-family: monospace; max-width: 60em; }\n";

// One sample record of samples.jsonl (launcher/train_samples.h), or nullopt for another line.
std::optional<json> sample_record(const std::string& line) {
  try {
    json r = util::parse_json(line);
    const bool ok = r.is_object() && r.contains("step") && r["step"].is_number_integer() && r.contains("prompt") &&
                    r["prompt"].is_number_integer() && r.contains("text") && r["text"].is_string();
    if (ok) return r;
  } catch (const json::exception&) {
  }
  return std::nullopt;
}

// <run dir>/samples.jsonl (train.sample_every) as one table per prompt, a row per step: how the
// answer changed as training went on. "" when the run wrote no samples.
std::string samples_section(const std::string& run_dir) {
  std::ifstream in(fs::path(run_dir) / "samples.jsonl");
  std::map<int64_t, std::map<int64_t, json>> by_prompt;  // prompt -> step -> record (a resumed step: the last)
  int64_t bad = 0;
  std::string line;
  while (in && std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (std::optional<json> r = sample_record(line)) by_prompt[(*r)["prompt"].get<int64_t>()][(*r)["step"].get<int64_t>()] = *r;
    else ++bad;
  }
  if (by_prompt.empty() && bad == 0) return "";
  std::ostringstream o;
  o << "<h2>Samples after steps (train.sample_every)</h2>\n";
  for (const auto& [prompt, steps] : by_prompt) {
    const json& first = steps.begin()->second;
    o << "<h3>Prompt " << prompt << " (" << esc(first.value("where", std::string())) << ")</h3>\n";
    if (first.contains("prompt_text") && first["prompt_text"].is_string())
      o << "<pre class=\"prompt\">" << esc(first["prompt_text"].get<std::string>()) << "</pre>\n";
    o << "<table class=\"samples\">\n<tr><td>step</td><td>answer</td><td>finish</td></tr>\n";
    for (const auto& [step, r] : steps)
      o << "<tr><td>" << step << "</td><td class=\"sample\">" << esc(r["text"].get<std::string>()) << "</td><td>"
        << esc(r.value("finish_reason", std::string())) << "</td></tr>\n";
    o << "</table>\n";
  }
  if (bad > 0) o << "<p>" << bad << " line(s) of samples.jsonl are not sample records (not shown).</p>\n";
  return o.str();
}

std::string html_page(const std::string& run_dir, const json& info, const json& summary, const ChartBuilder& b) {
  std::ostringstream o;
  o << kReportHead << esc(run_dir) << "</title>\n<style>\n" << kReportStyle << "</style>\n</head>\n<body>\n";
  o << "<h1>Tessera run report</h1>\n<p>Run directory <code>" << esc(run_dir) << "</code>"
    << (info.contains("started") ? ", started " + esc(info["started"].get<std::string>()) : std::string()) << ".</p>\n";
  o << table("Summary", summary);
  o << "<h2>Metrics over steps</h2>\n<div class=\"charts\">\n";
  for (const auto& c : b.charts) o << svg_chart(c);
  o << "</div>\n";
  if (!b.all_zero.empty()) {
    std::string names;
    for (const auto& k : b.all_zero) names += (names.empty() ? "" : ", ") + k;
    o << "<p>Zero throughout (not charted): " << esc(names) << ".</p>\n";
  }
  if (const std::string trace = svg_timeline(fs::path(run_dir) / "trace-rank-0.json"); !trace.empty())
    o << "<h2>Trace of the profiled steps (train.profile_steps), rank 0</h2>\n" << trace;
  o << samples_section(run_dir);
  for (const char* key : {"topology", "model", "data", "config"}) {
    static const std::map<std::string, std::string> titles = {
        {"topology", "Topology"}, {"model", "Model"}, {"data", "Data"}, {"config", "Configuration"}};
    if (info.contains(key)) o << table(titles.at(key), info[key]);
  }
  if (info.empty()) o << "<p>No run_info.json in the run directory: configuration and topology unknown.</p>\n";
  o << "</body>\n</html>\n";
  return o.str();
}

}  // namespace

json read_run_info(const std::string& run_dir) {
  const fs::path path = fs::path(run_dir) / "run_info.json";
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec || !fs::is_regular_file(path, ec) || size > util::budget::kRecordBytes) return json::object();
  if (std::ifstream f(path); f) {
    try {
      json info = util::parse_json(f);
      if (info.is_object()) return info;
    } catch (const json::exception&) {
    }
  }
  return json::object();
}

std::string render_report(const std::string& run_dir) {
  int64_t bad = 0;
  const std::map<int64_t, json> by_step = read_metrics(run_dir, &bad);
  const json info = read_run_info(run_dir);
  const Fields fields = collect_fields(by_step);
  ChartBuilder b{fields};
  add_known_charts(b, by_step.rbegin()->second);
  add_other_charts(b);
  return html_page(run_dir, info, summarize(by_step, fields, bad), b);
}

namespace {

// What is at `out` if it is not a report this program wrote (a regular file, not a link, whose
// first bytes are kReportHead); "" when it is one, or when nothing is there.
std::string not_a_report(const std::string& out) {
  struct stat st {};
  if (::lstat(out.c_str(), &st) != 0) return "";
  if (!S_ISREG(st.st_mode)) return util::file_kind(st.st_mode);
  const std::string head = kReportHead;
  std::string got(head.size(), '\0');
  const int fd = ::open(out.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  const ssize_t n = fd < 0 ? -1 : ::pread(fd, got.data(), got.size(), 0);
  if (fd >= 0) ::close(fd);
  return n == static_cast<ssize_t>(head.size()) && got == head ? "" : "a file that is not a Tessera report";
}

}  // namespace

std::string write_report(const std::string& run_dir, const std::string& out, bool force) {
  const std::string path = out.empty() ? (fs::path(run_dir) / "report.html").string() : out;
  if (const std::string what = out.empty() || force ? "" : not_a_report(out); !what.empty())
    throw TESSERA_INPUT_ERROR("report --out " + out + ": it exists and is " + what +
                              "; refusing to replace it (choose another name, or pass --force)");
  const std::string html = render_report(run_dir);
  std::string why;  // a fresh temporary renamed over the name: never through a link (util/output_file.h)
  if (!util::replace_file(path, html, why)) throw TESSERA_INPUT_ERROR(why);
  return path;
}

}  // namespace tessera::tools
