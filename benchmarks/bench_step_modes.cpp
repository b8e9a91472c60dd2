// `tessera bench step --modes`: each memory mode's step time against the default (bench_step_modes.h).
#include "benchmarks/bench_step_modes.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <numeric>
#include <random>

#include "benchmarks/bench_util.h"
#include "launcher/bootstrap.h"
#include "launcher/cli.h"
#include "launcher/model_lm.h"
#include "runtime/optim/adamw.h"
#include "runtime/profile/step_profile.h"
#include "util/error.h"

namespace tessera::bench {
namespace {
using Clock = std::chrono::steady_clock;
using nlohmann::json;

// Tokens of one step, all ranks together.
double global_tokens(const StepModesRun& r) {
  return static_cast<double>(launcher::current().world_size * r.micro_batch * r.seq_len);
}

// One mode from its name ("in_backward+int8"): its parts checked and put in canonical order.
StepMode parse_mode(const std::string& given) {
  const auto& names = mode_parts();
  std::vector<bool> has(names.size(), false);
  const std::string where = "bench step: --modes: mode '" + given + "'";
  for (const std::string& part : split_on(given, '+')) {
    const auto it = std::find(names.begin(), names.end(), part);
    if (it == names.end()) {
      const std::string hint = launcher::closest_match(part, names);
      throw TESSERA_INPUT_ERROR("bench step: --modes: unknown mode '" + part + "'" +
                                (hint.empty() ? "" : " (did you mean '" + hint + "'?)") + "; modes are " +
                                "default, in_backward, int8, bf16, offload_optimizer, offload_params, or several joined by '+'");
    }
    const size_t i = static_cast<size_t>(it - names.begin());
    TESSERA_CHECK_INPUT(!has[i], where + " names '" + part + "' twice");
    has[i] = true;
  }
  StepMode m;
  for (size_t i = 0; i < names.size(); ++i)
    if (has[i]) m.name += (m.name.empty() ? "" : "+") + names[i];
  TESSERA_CHECK_INPUT(!has[0] || m.name == "default", where + ": 'default' cannot be combined with other modes");
  TESSERA_CHECK_INPUT(!(has[2] && has[3]), where + " sets optim.state_dtype twice (int8 and bf16)");
  TESSERA_CHECK_INPUT(!(has[4] && has[5]), where + " sets fsdp.offload twice (offload_optimizer and offload_params)");
  m.in_backward = has[1];
  m.state_dtype = has[2] ? optim::StateDtype::Int8 : has[3] ? optim::StateDtype::BF16 : optim::StateDtype::F32;
  m.offload = has[4] ? fsdp::Offload::Optimizer : has[5] ? fsdp::Offload::Params : fsdp::Offload::None;
  return m;
}

// A mode's trainer: the default's options changed as the mode says, steps enough for every round.
std::unique_ptr<train::Trainer> build_trainer(const StepModesRun& r, const StepMode& m) {
  fsdp::Options f = r.fopts;
  train::Settings t = r.topts;
  m.apply(f, t);
  t.train.steps = r.warmup + static_cast<int64_t>(r.rounds) * r.steps;  // the schedule's length: the same for every mode
  auto trainer = std::make_unique<train::Trainer>(launcher::make_causal_lm(r.cfg), launcher::current().groups, f, t,
                                                  r.dataset, json::object());
  launcher::InitWeightSource src(r.cfg, 1);
  trainer->load_weights(src);
  return trainer;
}

// What one mode measured: tokens/s per round, and rank 0's breakdown of every timed step.
struct ModeTiming {
  std::vector<double> tps;
  std::vector<profile::Breakdown> times;
  double median_tps() const { return median_of(tps); }
  // Step time / the default's in each round (the two measured seconds apart, under the same load).
  std::vector<double> round_ratios(const ModeTiming& base) const {
    std::vector<double> r;
    for (size_t i = 0; i < tps.size(); ++i) r.push_back(base.tps[i] / tps[i]);
    return r;
  }
  // The ratio reported: the median over rounds of the ratio within each round, which a load that
  // changes between rounds (a shared machine) disturbs less than a ratio of medians would.
  double ratio(const ModeTiming& base) const { return median_of(round_ratios(base)); }
};

// Every mode once per round for r.steps steps, in a shuffled order (the same on every rank: the
// same seed and generator), between barriers, so that every rank times the same steps.
std::vector<ModeTiming> time_rounds(const StepModesRun& r, const std::vector<StepMode>& modes) {
  std::vector<std::unique_ptr<train::Trainer>> trainers;
  for (const StepMode& m : modes) {
    trainers.push_back(build_trainer(r, m));
    for (int i = 0; i < r.warmup; ++i) trainers.back()->train_step();
  }
  std::vector<ModeTiming> out(modes.size());
  std::vector<size_t> order(modes.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::mt19937 rng(20261202);
  for (int round = 0; round < r.rounds; ++round) {
    shuffle_order(order, rng);
    for (size_t k : order) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = Clock::now();
      for (int i = 0; i < r.steps; ++i) out[k].times.push_back(trainers[k]->train_step().time);
      MPI_Barrier(MPI_COMM_WORLD);
      out[k].tps.push_back(global_tokens(r) * r.steps / std::chrono::duration<double>(Clock::now() - t0).count());
    }
    if (launcher::current().world_rank == 0 && !r.json)
      std::cerr << "# bench step --modes: round " << round + 1 << "/" << r.rounds << " done" << std::endl;
  }
  return out;
}

json modes_json(const StepModesRun& r, const std::vector<StepMode>& modes, const std::vector<ModeTiming>& t) {
  json rows = json::array();
  for (size_t i = 0; i < modes.size(); ++i)
    rows.push_back({{"mode", modes[i].name}, {"keys", modes[i].keys()}, {"tokens_per_s", t[i].median_tps()},
                    {"step_time_s", global_tokens(r) / t[i].median_tps()}, {"step_time_ratio", t[i].ratio(t[0])},
                    {"round_ratios", t[i].round_ratios(t[0])}, {"samples", t[i].tps},
                    {"time", profile::median(t[i].times).to_json()}});
  return {{"bench", "step"}, {"what", "modes"}, {"model", r.model}, {"parameters", r.cfg.num_parameters()},
          {"world_size", launcher::current().world_size}, {"seq_len", r.seq_len}, {"micro_batch", r.micro_batch},
          {"strategy", r.strategy}, {"dtype", r.dtype}, {"threads_per_rank", launcher::current().threads},
          {"warmup", r.warmup}, {"steps", r.steps}, {"rounds", r.rounds}, {"modes", rows}};
}

void print_modes(const StepModesRun& r, const std::vector<StepMode>& modes, const std::vector<ModeTiming>& t) {
  const auto& b = launcher::current();
  printf("# bench step --modes: %s (%.1fM parameters), %s %s, W=%d, seq_len %ld, micro-batch %ld, %d thread(s) per rank\n",
         r.model.c_str(), r.cfg.num_parameters() / 1e6, r.strategy.c_str(), r.dtype.c_str(), b.world_size,
         static_cast<long>(r.seq_len), static_cast<long>(r.micro_batch), b.threads);
  printf("# %d round(s), each running every mode for %d step(s) in a shuffled order after %d warm-up step(s) per mode;\n"
         "#   tokens/s and step: medians over rounds; step / default: the median over rounds of the ratio within each\n"
         "#   round. The default keeps train.clip = %g; in_backward runs with train.clip = 0 (it needs it).\n"
         "#   On a CPU-only machine offload's device<->host copies are memcpy, not PCIe.\n",
         r.rounds, r.steps, r.warmup, r.topts.optim.clip);
  printf("%-36s %10s %10s %16s  %s\n", "mode", "tokens/s", "step (s)", "step / default", "keys");
  for (size_t i = 0; i < modes.size(); ++i) {
    const double tps = t[i].median_tps();
    printf("%-36s %10.1f %10.3f %16.3f  %s\n", modes[i].name.c_str(), tps, global_tokens(r) / tps, t[i].ratio(t[0]),
           modes[i].keys().empty() ? "(none)" : modes[i].keys().c_str());
  }
  printf("# Where each mode's step time goes (rank 0, median of its timed steps):\n");
  for (size_t i = 0; i < modes.size(); ++i) {
    const profile::Breakdown m = profile::median(t[i].times);
    printf("%-36s %.3f s: %s\n", modes[i].name.c_str(), m.step_s, m.summary().c_str());
  }
}

}  // namespace

const std::vector<std::string>& mode_parts() {
  static const std::vector<std::string> names = {"default", "in_backward", "int8", "bf16", "offload_optimizer",
                                                 "offload_params"};
  return names;
}

std::string StepMode::keys() const {
  std::string k;
  auto add = [&k](const std::string& s) { k += (k.empty() ? "" : " ") + s; };
  if (in_backward) add("optim.in_backward=true train.clip=0");
  if (state_dtype == optim::StateDtype::Int8) add("optim.state_dtype=int8");
  if (state_dtype == optim::StateDtype::BF16) add("optim.state_dtype=bf16");
  if (offload != fsdp::Offload::None) add("fsdp.offload=" + fsdp::to_string(offload));
  return k;
}

void StepMode::apply(fsdp::Options& f, train::Settings& t) const {
  t.optim.in_backward = in_backward;
  if (in_backward) t.optim.clip = 0;  // optim.in_backward refuses clipping (optim/options.h)
  t.optim.state_dtype = state_dtype;
  f.align = std::lcm(f.align, optim::state_alignment(optim::state_scalar_type(state_dtype)));  // 8-bit blocks never straddle a shard
  f.offload = offload;
}

std::vector<StepMode> parse_step_modes(const std::string& list) {
  const std::vector<std::string> names = split_on(list, ',');
  TESSERA_CHECK_INPUT(!names.empty(), "bench step: --modes is empty");
  std::vector<StepMode> given;
  for (const std::string& name : names) {
    TESSERA_CHECK_INPUT(!name.empty(), "bench step: --modes '" + list + "' has an empty name");
    StepMode m = parse_mode(name);
    for (const StepMode& seen : given)
      TESSERA_CHECK_INPUT(seen.name != m.name, "bench step: --modes lists mode '" + m.name + "' twice");
    given.push_back(m);
  }
  // The default first: every ratio is against it.
  std::stable_partition(given.begin(), given.end(), [](const StepMode& m) { return m.name == "default"; });
  if (given[0].name != "default") given.insert(given.begin(), parse_mode("default"));
  return given;
}

int run_step_modes(const StepModesRun& run, const std::vector<StepMode>& modes) {
  const std::vector<ModeTiming> t = time_rounds(run, modes);
  if (launcher::current().world_rank != 0) return 0;
  if (run.json)
    std::cout << modes_json(run, modes, t).dump() << std::endl;
  else
    print_modes(run, modes, t);
  return 0;
}

}  // namespace tessera::bench
