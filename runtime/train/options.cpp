#include "runtime/train/options.h"

#include <csignal>
#include <nlohmann/json.hpp>

#include "util/error.h"

namespace tessera::train {

int signal_number(PreemptSignal s) { return s == PreemptSignal::USR1 ? SIGUSR1 : SIGUSR2; }

namespace {

void validate_profile_steps(const Settings& s, const std::string& at) {
  const std::vector<int64_t>& p = s.train.profile_steps;
  if (p.empty()) return;
  const std::string got = nlohmann::json(p).dump();
  TESSERA_CHECK_INPUT(p.size() == 2 && p[0] >= 1 && p[0] <= p[1] && p[1] <= s.train.steps,
                      at + "train.profile_steps must be [first, last] with 1 <= first <= last <= train.steps (" +
                          std::to_string(s.train.steps) + "), got " + got);
  TESSERA_CHECK_INPUT(!s.log_dir().empty(), at + "train.profile_steps " + got +
                                                " needs log.dir (or checkpoint.dir): the traces are written there");
}

void validate_samples(const Settings& s, const std::string& at) {
  const SampleOptions& o = s.sample;
  TESSERA_CHECK_INPUT((o.every > 0) == !o.prompts.empty(),
                      at + (o.every > 0 ? "train.sample_every " + std::to_string(o.every) + " needs train.sample_prompts (a JSONL file of prompts)"
                                        : "train.sample_prompts " + o.prompts + " needs train.sample_every (steps between samples)"));
  TESSERA_CHECK_INPUT(o.every == 0 || !s.log_dir().empty(),
                      at + "train.sample_every needs log.dir (or checkpoint.dir): samples.jsonl is written there");
}

}  // namespace

void validate(const Settings& s, bool loss_scaling, const std::string& source) {
  const std::string at = source.empty() ? "" : source + ": ";
  optim::validate(s.schedule);
  optim::validate(s.optim, loss_scaling, source);
  validate_profile_steps(s, at);
  validate_samples(s, at);
  TESSERA_CHECK_INPUT(!s.log.tensorboard || !s.log_dir().empty(),
                      at + "log.tensorboard needs log.dir (or checkpoint.dir): the event file is written there");
}

}  // namespace tessera::train
