#include "benchmarks/bench_optim.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "benchmarks/bench_util.h"
#include "launcher/cli.h"
#include "runtime/device/device.h"
#include "runtime/gpu/gpu.h"
#include "runtime/optim/adamw.h"
#include "util/error.h"

namespace tessera::bench {

namespace {

// A path of the update: on the CPU the fused loop or the tensor-op path; on a GPU the fused kernel
// (LibTorch's for fp32 moments, Tessera's for the others), Tessera's kernel for fp32 too
// (`tessera_fp32`), or the tensor-op path.
struct Mode {
  std::string name;
  optim::StateDtype state_dtype;
  bool fused;
  bool torch_fused = true;
  std::string path(bool gpu) const { return !fused ? "tensor_ops" : !gpu ? "fused_cpu" : torch_fused ? "fused" : "tessera_kernel"; }
};

// One optimizer with its own shard (same values in every mode) and the time of each timed step.
struct OptimCase {
  Mode mode;
  std::unique_ptr<optim::AdamW> adamw;
  std::vector<optim::ParamShard> shards;
  std::vector<double> ns_per_elem;
};

OptimCase make_case(const Mode& m, int64_t numel, const c10::Device& device) {
  OptimCase c{m, nullptr, std::vector<optim::ParamShard>(1), {}};
  optim::AdamWOptions o;
  o.state_dtype = m.state_dtype;
  o.fused_cpu = o.fused_device = m.fused;
  o.torch_fused = m.torch_fused;
  c.adamw = std::make_unique<optim::AdamW>(o);
  at::manual_seed(1);
  const auto on = at::TensorOptions().device(device);
  c.shards[0].param = at::randn({numel}, on);
  c.shards[0].grad = at::randn({numel}, on) * 1e-3;
  c.shards[0].decay = {{0, numel / 2}};
  c.adamw->step(c.shards, 1e-4);  // allocates the state; not timed
  device::synchronize(device);
  return c;
}

// One step, until the device has finished it.
double time_step(OptimCase& c, const c10::Device& device) {
  const auto t0 = std::chrono::steady_clock::now();
  c.adamw->step(c.shards, 1e-4);
  device::synchronize(device);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s * 1e9 / static_cast<double>(c.shards[0].param.numel());
}

std::vector<Mode> modes_on(const c10::Device& device) {
  using D = optim::StateDtype;
  std::vector<Mode> modes = {{"fp32", D::F32, true}, {"bf16", D::BF16, true}, {"int8", D::Int8, true}};
  if (device.is_cuda()) modes.push_back({"fp32", D::F32, true, /*torch_fused=*/false});
  for (D d : {D::F32, D::BF16, D::Int8}) modes.push_back({modes[static_cast<size_t>(d)].name, d, false});
  return modes;
}

}  // namespace

int run_bench_optim(const std::vector<std::string>& args) {
  namespace po = launcher::po;
  po::options_description desc("Options");
  desc.add_options()("numel", po::value<int64_t>()->default_value(int64_t(1) << 24), "elements of the shard")(
      "rounds", po::value<int>()->default_value(5), "timed steps per mode (interleaved rounds; medians reported)")(
      "threads", po::value<int>()->default_value(0), "intra-op threads (0: LibTorch's default)")(
      "device", po::value<std::string>()->default_value("cpu"), "cpu, or cuda[:N]: the shard on a GPU (the fused kernels)")(
      "json", po::bool_switch(), "print one JSON document instead of the table");
  const auto vm = launcher::parse_command("tessera bench optim [--numel N] [--rounds 5] [--threads T] [--device cpu|cuda] [--json]", desc, args);
  if (!vm) return 0;
  const int64_t numel = (*vm)["numel"].as<int64_t>();
  const int rounds = (*vm)["rounds"].as<int>();
  TESSERA_CHECK_INPUT(numel >= 1 && rounds >= 1, "bench optim: --numel and --rounds must be >= 1");
  if ((*vm)["threads"].as<int>() > 0) at::set_num_threads((*vm)["threads"].as<int>());

  const std::string spec = (*vm)["device"].as<std::string>();
  const bool indexed = spec.rfind("cuda:", 0) == 0 && spec.size() > 5 && spec.size() <= 9 &&
                       spec.find_first_not_of("0123456789", 5) == std::string::npos;
  TESSERA_CHECK_INPUT(spec == "cpu" || spec == "cuda" || indexed, "bench optim: --device '" + spec + "' is not cpu or cuda[:N]");
  const c10::Device device(spec);
  TESSERA_CHECK_INPUT(device.is_cpu() || gpu::built(), "bench optim: --device " + spec + ": this tessera was built without CUDA");
  TESSERA_CHECK_INPUT(device.is_cpu() || device::cuda_device_count() > std::max<int>(0, device.index()),
                      "bench optim: --device " + spec + ": no such GPU visible to this process");
  if (device.is_cuda()) gpu::install_kernels();
  std::vector<OptimCase> cases;
  for (const Mode& m : modes_on(device)) cases.push_back(make_case(m, numel, device));
  std::mt19937 rng(7);
  std::vector<size_t> order(cases.size());
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    shuffle_order(order, rng);
    for (size_t i : order) cases[i].ns_per_elem.push_back(time_step(cases[i], device));
  }
  const double base = median_of(cases[0].ns_per_elem);
  nlohmann::json out = {{"numel", numel}, {"rounds", rounds}, {"threads", at::get_num_threads()}, {"device", spec},
                        {"modes", nlohmann::json::array()}};
  for (const OptimCase& c : cases)
    out["modes"].push_back({{"state_dtype", c.mode.name},
                            {"path", c.mode.path(device.is_cuda())},
                            {"ns_per_element", median_of(c.ns_per_elem)},
                            {"ms_per_1b_params", median_of(c.ns_per_elem)},  // ns per element x 1e9 / 1e6
                            {"ratio_to_fp32_fused", median_of(c.ns_per_elem) / base},
                            {"state_bytes_per_param", optim::state_bytes_per_param(optim::state_scalar_type(c.mode.state_dtype))}});
  if ((*vm)["json"].as<bool>()) {
    std::cout << out.dump(1) << std::endl;
    return 0;
  }
  std::printf("AdamW step on %s, %lld elements, %d threads, medians of %d rounds\n", spec.c_str(), static_cast<long long>(numel),
              at::get_num_threads(), rounds);
  std::printf("%-6s %-15s %10s %12s %8s %12s\n", "state", "path", "ns/elem", "ms/1B param", "ratio", "state B/par");
  for (const auto& m : out["modes"])
    std::printf("%-6s %-15s %10.3f %12.2f %8.2f %12.4f\n", m["state_dtype"].get<std::string>().c_str(),
                m["path"].get<std::string>().c_str(), m["ns_per_element"].get<double>(), m["ms_per_1b_params"].get<double>(),
                m["ratio_to_fp32_fused"].get<double>(), m["state_bytes_per_param"].get<double>());
  return 0;
}

}  // namespace tessera::bench
