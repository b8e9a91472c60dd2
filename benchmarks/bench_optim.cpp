#include "benchmarks/bench_optim.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "benchmarks/bench_util.h"
#include "launcher/cli.h"
#include "runtime/optim/adamw.h"
#include "util/error.h"

namespace tessera::bench {

namespace {

struct Mode {
  std::string name;
  optim::StateDtype state_dtype;
  bool fused;
};

// One optimizer with its own shard (same values in every mode) and the time of each timed step.
struct OptimCase {
  Mode mode;
  std::unique_ptr<optim::AdamW> adamw;
  std::vector<optim::ParamShard> shards;
  std::vector<double> ns_per_elem;
};

OptimCase make_case(const Mode& m, int64_t numel) {
  OptimCase c{m, nullptr, std::vector<optim::ParamShard>(1), {}};
  optim::AdamWOptions o;
  o.state_dtype = m.state_dtype;
  o.fused_cpu = m.fused;
  c.adamw = std::make_unique<optim::AdamW>(o);
  at::manual_seed(1);
  c.shards[0].param = at::randn({numel});
  c.shards[0].grad = at::randn({numel}) * 1e-3;
  c.shards[0].decay = {{0, numel / 2}};
  c.adamw->step(c.shards, 1e-4);  // allocates the state; not timed
  return c;
}

double time_step(OptimCase& c) {
  const auto t0 = std::chrono::steady_clock::now();
  c.adamw->step(c.shards, 1e-4);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s * 1e9 / static_cast<double>(c.shards[0].param.numel());
}

}  // namespace

int run_bench_optim(const std::vector<std::string>& args) {
  namespace po = launcher::po;
  po::options_description desc("Options");
  desc.add_options()("numel", po::value<int64_t>()->default_value(int64_t(1) << 24), "elements of the shard")(
      "rounds", po::value<int>()->default_value(5), "timed steps per mode (interleaved rounds; medians reported)")(
      "threads", po::value<int>()->default_value(0), "intra-op threads (0: LibTorch's default)")(
      "json", po::bool_switch(), "print one JSON document instead of the table");
  const auto vm = launcher::parse_command("tessera bench optim [--numel N] [--rounds 5] [--threads T] [--json]", desc, args);
  if (!vm) return 0;
  const int64_t numel = (*vm)["numel"].as<int64_t>();
  const int rounds = (*vm)["rounds"].as<int>();
  TESSERA_CHECK_INPUT(numel >= 1 && rounds >= 1, "bench optim: --numel and --rounds must be >= 1");
  if ((*vm)["threads"].as<int>() > 0) at::set_num_threads((*vm)["threads"].as<int>());

  using D = optim::StateDtype;
  const std::vector<Mode> modes = {{"fp32", D::F32, true},  {"bf16", D::BF16, true},  {"int8", D::Int8, true},
                                   {"fp32", D::F32, false}, {"bf16", D::BF16, false}, {"int8", D::Int8, false}};
  std::vector<OptimCase> cases;
  for (const Mode& m : modes) cases.push_back(make_case(m, numel));
  std::mt19937 rng(7);
  std::vector<size_t> order(cases.size());
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    shuffle_order(order, rng);
    for (size_t i : order) cases[i].ns_per_elem.push_back(time_step(cases[i]));
  }
  const double base = median_of(cases[0].ns_per_elem);
  nlohmann::json out = {{"numel", numel}, {"rounds", rounds}, {"threads", at::get_num_threads()}, {"modes", nlohmann::json::array()}};
  for (const OptimCase& c : cases)
    out["modes"].push_back({{"state_dtype", c.mode.name},
                            {"path", c.mode.fused ? "fused_cpu" : "tensor_ops"},
                            {"ns_per_element", median_of(c.ns_per_elem)},
                            {"ratio_to_fp32_fused", median_of(c.ns_per_elem) / base},
                            {"state_bytes_per_param", optim::state_bytes_per_param(optim::state_scalar_type(c.mode.state_dtype))}});
  if ((*vm)["json"].as<bool>()) {
    std::cout << out.dump(1) << std::endl;
    return 0;
  }
  std::printf("AdamW step, %lld elements, %d threads, medians of %d rounds\n", static_cast<long long>(numel),
              at::get_num_threads(), rounds);
  std::printf("%-6s %-11s %10s %8s %12s\n", "state", "path", "ns/elem", "ratio", "state B/par");
  for (const auto& m : out["modes"])
    std::printf("%-6s %-11s %10.2f %8.2f %12.4f\n", m["state_dtype"].get<std::string>().c_str(),
                m["path"].get<std::string>().c_str(), m["ns_per_element"].get<double>(),
                m["ratio_to_fp32_fused"].get<double>(), m["state_bytes_per_param"].get<double>());
  return 0;
}

}  // namespace tessera::bench
