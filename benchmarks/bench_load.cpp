#include "benchmarks/bench_load.h"

#include <malloc.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <sys/stat.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <nlohmann/json.hpp>

#include "launcher/bootstrap.h"
#include "launcher/cli.h"
#include "launcher/model_lm.h"
#include "model/safetensors.h"
#include "runtime/checkpoint/io.h"
#include "runtime/fsdp/loader.h"
#include "runtime/memory/tracker.h"
#include "util/error.h"

namespace tessera::bench {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kMiB = 1 << 20, kSlack = 64 * kMiB;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One rank's figures for one mode, as int64 so they can be all-gathered.
enum Field { kBase, kPeak, kShard, kStaging, kUnit, kLoadUs, kRoot, kFields };

struct ModeResult {
  std::string mode;
  std::vector<std::array<int64_t, kFields>> ranks;
  double seconds = 0;  // wall time, barrier to barrier
};

ModeResult run_mode(fsdp::LoadMode mode, const model::ModelConfig& cfg, const std::shared_ptr<model::ModelDir>& dir) {
  const auto& groups = launcher::current().groups;
  comm::Communicator& world = *groups.world;
  ModeResult res;
  res.mode = fsdp::to_string(mode);
  std::array<int64_t, kFields> mine{};
  {
    auto lm = launcher::make_causal_lm(cfg);
    fsdp::Engine engine(lm.units, lm.layer, groups, fsdp::Options{}, lm.decay);
    launcher::HfWeightSource source(dir);
    const bool reader = world.rank() == 0;
    ::malloc_trim(0);  // freed memory of the previous mode goes back to the kernel
    TESSERA_CHECK(memory::reset_peak_rss(), "cannot reset the peak RSS through /proc/self/clear_refs");
    world.barrier()->wait();
    mine[kBase] = memory::rss_bytes();
    const auto t0 = Clock::now();
    auto st = fsdp::load_weights(engine, mode == fsdp::LoadMode::Rank0 && !reader ? nullptr : &source, mode);
    world.barrier()->wait();
    res.seconds = seconds_since(t0);
    mine[kPeak] = memory::peak_rss_bytes();
    mine[kShard] = st.shard_bytes;
    mine[kStaging] = st.staging_bytes;
    mine[kUnit] = st.largest_unit_bytes;
    mine[kLoadUs] = static_cast<int64_t>(st.seconds * 1e6);
    mine[kRoot] = st.root;
  }
  at::Tensor in = at::from_blob(mine.data(), {kFields}, at::kLong).clone();
  at::Tensor all = at::empty({kFields * world.size()}, at::kLong);
  world.all_gather_into(all, in)->wait();
  res.ranks.resize(world.size());
  for (int r = 0; r < world.size(); ++r)
    for (int f = 0; f < kFields; ++f) res.ranks[r][f] = all[r * kFields + f].item<int64_t>();
  return res;
}

// The memory bound of issue 5 for one rank (-1: no goal for this mode).
int64_t peak_bound(const std::string& mode, const std::array<int64_t, kFields>& r) {
  if (mode == "naive") return -1;
  const int64_t units = (mode == "rank0" && r[kRoot]) ? 2 * r[kUnit] : 0;
  return r[kBase] + r[kShard] + units + kSlack;
}

// The benchmark's JSON document: per mode the median round's time and every rank's memory
// figures, with the goals of bench_load.h checked (a memory goal counts as met only if it held in
// every round: memory_every_round).
nlohmann::json report(const model::ModelDir& dir, int W, int64_t file_bytes, double cat_s, bool cold, int repeat,
                      const std::vector<ModeResult>& results, const std::vector<bool>& memory_every_round) {
  const ModeResult* naive = nullptr;
  for (const auto& r : results)
    if (r.mode == "naive") naive = &r;
  const double gb = file_bytes / 1e9;
  nlohmann::json out = {{"ranks", W},
                        {"model", dir.dir()},
                        {"parameters", dir.config().num_parameters()},
                        {"checkpoint_bytes", file_bytes},
                        {"cat_seconds", cat_s},
                        {"cat_GBps", gb / cat_s},
                        {"page_cache", cold ? "cold" : "warm"},
                        {"modes", nlohmann::json::array()}};
  bool all_ok = true;
  for (size_t mi = 0; mi < results.size(); ++mi) {
    const ModeResult& res = results[mi];
    nlohmann::json jm = {{"mode", res.mode}, {"seconds", res.seconds}, {"GBps", gb / res.seconds},
                         {"throughput_vs_cat", cat_s / res.seconds}, {"ranks", nlohmann::json::array()}};
    bool ok = true;
    for (int r = 0; r < W; ++r) {
      const auto& f = res.ranks[r];
      const int64_t bound = peak_bound(res.mode, f);
      nlohmann::json jr = {{"rank", r},           {"reader", f[kRoot] != 0},   {"base_bytes", f[kBase]},
                           {"peak_bytes", f[kPeak]}, {"growth_bytes", f[kPeak] - f[kBase]},
                           {"shard_bytes", f[kShard]}, {"staging_bytes", f[kStaging]},
                           {"largest_unit_bytes", f[kUnit]}, {"load_seconds", f[kLoadUs] / 1e6}};
      if (naive) jr["peak_vs_naive"] = double(f[kPeak]) / double(naive->ranks[r][kPeak]);
      if (naive) jr["growth_vs_naive"] = double(f[kPeak] - f[kBase]) / double(naive->ranks[r][kPeak] - naive->ranks[r][kBase]);
      if (bound >= 0) {
        jr["peak_bound_bytes"] = bound;
        jr["memory_goal_met"] = f[kPeak] <= bound;
        ok = ok && f[kPeak] <= bound;
      }
      jm["ranks"].push_back(jr);
    }
    ok = ok && memory_every_round[mi];
    jm["rounds"] = repeat;
    if (res.mode != "naive") {
      jm["memory_goal_met"] = ok;
      jm["throughput_goal_met"] = cat_s / res.seconds >= 0.7;
      all_ok = all_ok && ok;
    }
    out["modes"].push_back(jm);
  }
  out["memory_goals_met"] = all_ok;
  return out;
}

// The human-readable form of report().
void print_table(const nlohmann::json& out) {
  const double gb = out["checkpoint_bytes"].get<int64_t>() / 1e9;
  std::printf("load benchmark: %d ranks, %s (%.1f M parameters, %.3f GB on disk), full_shard, page cache %s\n", out["ranks"].get<int>(),
              out["model"].get<std::string>().c_str(), out["parameters"].get<int64_t>() / 1e6, gb,
              out["page_cache"] == "cold" ? "cold (dropped before each run)" : "warm");
  std::printf("  cat > /dev/null: %.3f s, %.2f GB/s (baseline; medians of %d rounds)\n", out["cat_seconds"].get<double>(), out["cat_GBps"].get<double>(),
              out["modes"].empty() ? 0 : out["modes"][0]["rounds"].get<int>());
  for (const auto& jm : out["modes"]) {
    const std::string mode = jm["mode"];
    std::printf("  mode %-8s %.3f s  %.2f GB/s  %.2fx cat%s\n", mode.c_str(), jm["seconds"].get<double>(),
                jm["GBps"].get<double>(), jm["throughput_vs_cat"].get<double>(),
                mode == "naive" ? "" : (jm["throughput_goal_met"].get<bool>() ? "  (goal >= 0.7: met)" : "  (goal >= 0.7: NOT met)"));
    std::printf("    %4s %6s %9s %9s %9s %9s %9s %9s %8s %7s  %s\n", "rank", "reader", "base MiB", "peak MiB", "growth",
                "shard", "staging", "unit", "peak/nv", "load s", "memory goal");
    for (const auto& jr : jm["ranks"]) {
      auto mib = [&](const char* k) { return jr[k].get<int64_t>() / double(kMiB); };
      std::string goal = jr.contains("memory_goal_met")
                             ? (jr["memory_goal_met"].get<bool>() ? "met" : "NOT met") +
                                   std::string(" (peak <= ") + std::to_string(jr["peak_bound_bytes"].get<int64_t>() / kMiB) + " MiB)"
                             : "-";
      std::printf("    %4d %6s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %8s %7.3f  %s\n", jr["rank"].get<int>(),
                  jr["reader"].get<bool>() ? "yes" : "", mib("base_bytes"), mib("peak_bytes"), mib("growth_bytes"),
                  mib("shard_bytes"), mib("staging_bytes"), mib("largest_unit_bytes"),
                  jr.contains("peak_vs_naive") ? (std::to_string(jr["peak_vs_naive"].get<double>()).substr(0, 5)).c_str() : "-",
                  jr["load_seconds"].get<double>(), goal.c_str());
    }
  }
  std::printf("  memory goals: %s\n", out["memory_goals_met"].get<bool>() ? "met" : "NOT met");
}

}  // namespace

int run_bench_load(const std::vector<std::string>& args) {
  launcher::po::options_description desc("Options");
  desc.add_options()("model", launcher::po::value<std::string>()->required(), "Hugging Face model directory (e.g. from tessera init-model --dtype bf16)")(
      "modes", launcher::po::value<std::string>()->default_value("rank0,parallel,naive"), "load modes, in this order (naive last keeps its heap out of the others)")(
      "repeat", launcher::po::value<int>()->default_value(3), "rounds of (baseline, every mode); medians are reported")(
      "cold", launcher::po::bool_switch(), "drop the checkpoint's pages from the page cache before the baseline and before each mode (files on this host; needs a local disk)")(
      "json", launcher::po::bool_switch(), "print one JSON document instead of the table");
  const auto vm = launcher::parse_command("tessera bench load --model DIR [--modes rank0,parallel,naive] [--repeat 3] [--cold] [--json]", desc, args);
  if (!vm) return 0;
  comm::Communicator& world = *launcher::current().groups.world;
  const int W = world.size();
  std::vector<fsdp::LoadMode> modes;
  std::shared_ptr<model::ModelDir> dir;
  std::set<std::string> files;
  launcher::collectively([&] {
    std::stringstream ss((*vm)["modes"].as<std::string>());
    for (std::string m; std::getline(ss, m, ',');) modes.push_back(fsdp::parse_load_mode(m));
    TESSERA_CHECK_INPUT(!modes.empty(), "--modes is empty");
    dir = std::make_shared<model::ModelDir>((*vm)["model"].as<std::string>());
    dir->validate();
    for (const auto& n : dir->tensor_names()) files.insert(dir->info(n).file);
  });
  int64_t file_bytes = 0;
  std::string cat = "cat";
  for (const auto& f : files) {
    struct stat sb {};
    if (::stat(f.c_str(), &sb) == 0) file_bytes += sb.st_size;
    cat += " '" + f + "'";
  }
  cat += " > /dev/null";
  const bool cold = (*vm)["cold"].as<bool>();
  // Cold: rank 0 evicts the checkpoint's (clean) pages, so the baseline and every mode read the disk.
  auto drop_cache = [&] {  // on rank 0 only
    if (cold)
      for (const auto& f : files) checkpoint::io::drop_page_cache(f);
  };
  // Rounds of (baseline, every mode), `repeat` times: noise that drifts over the run hits the
  // baseline and the modes alike. Reported: the median baseline time and, per mode, the round with
  // its median time; a memory goal is met only if it holds in every round.
  const int repeat = (*vm)["repeat"].as<int>();
  TESSERA_CHECK_INPUT(repeat > 0, "--repeat must be positive");
  std::vector<double> cat_times;
  std::vector<std::vector<ModeResult>> rounds(modes.size());
  if (world.rank() == 0 && !cold) TESSERA_CHECK(std::system(cat.c_str()) == 0, "baseline failed: " + cat);  // warm up
  for (int i = 0; i < repeat; ++i) {
    // The baseline, on rank 0 while the others wait.
    if (world.rank() == 0) {
      drop_cache();
      const auto t0 = Clock::now();
      TESSERA_CHECK(std::system(cat.c_str()) == 0, "baseline failed: " + cat);
      cat_times.push_back(seconds_since(t0));
    }
    world.barrier()->wait();
    for (size_t m = 0; m < modes.size(); ++m) {
      if (world.rank() == 0) drop_cache();
      world.barrier()->wait();
      rounds[m].push_back(run_mode(modes[m], dir->config(), dir));
    }
  }
  std::sort(cat_times.begin(), cat_times.end());
  const double cat_s = cat_times.empty() ? 0 : cat_times[cat_times.size() / 2];
  std::vector<ModeResult> results;
  std::vector<bool> memory_every_round;
  for (auto& r : rounds) {
    std::vector<ModeResult> by_time = r;
    std::sort(by_time.begin(), by_time.end(), [](const ModeResult& a, const ModeResult& b) { return a.seconds < b.seconds; });
    results.push_back(by_time[by_time.size() / 2]);
    bool ok = true;
    for (const auto& x : r)
      for (const auto& rk : x.ranks) {
        const int64_t bound = peak_bound(x.mode, rk);
        ok = ok && (bound < 0 || rk[kPeak] <= bound);
      }
    memory_every_round.push_back(ok);
  }
  if (world.rank() != 0) return 0;

  const nlohmann::json out = report(*dir, W, file_bytes, cat_s, cold, repeat, results, memory_every_round);

  if ((*vm)["json"].as<bool>()) std::cout << out.dump(2) << std::endl;
  else print_table(out);
  return 0;
}

}  // namespace tessera::bench
