#include "runtime/generate/generator.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>

#include "runtime/device/device.h"
#include "runtime/memory/tracker.h"
#include "runtime/profile/phase.h"
#include "util/error.h"

namespace tessera::generate {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Generator::Generator(train::CausalLm lm, const comm::ProcessGroups& groups, fsdp::Options opts, comm::CommPtr host_world)
    : lm_(std::move(lm)), host_world_(std::move(host_world)), device_(opts.device) {
  TESSERA_CHECK(lm_.set_cache, "this model has no KV cache (CausalLm::set_cache)");
  device::set_current(device_);
  memory::install();
  owned_ = std::make_unique<fsdp::Engine>(lm_.units, lm_.layer, groups, opts, lm_.decay);
  engine_ = owned_.get();
}

Generator::Generator(train::CausalLm lm, fsdp::Engine& engine, comm::CommPtr host_world)
    : lm_(std::move(lm)), engine_(&engine), host_world_(std::move(host_world)), device_(engine.options().device) {
  TESSERA_CHECK(lm_.set_cache, "this model has no KV cache (CausalLm::set_cache)");
}

Generator::~Generator() = default;

void Generator::reserve(int64_t capacity) {
  TESSERA_CHECK(capacity > 0, "KV cache capacity must be positive");
  capacity_ = capacity;
  lm_.set_cache(capacity_, -1);
}

void Generator::release() {
  capacity_ = 0;
  lm_.set_cache(0, -1);
}

at::Tensor Generator::forward_last(const std::vector<int64_t>& tokens) {
  const at::Tensor t = at::tensor(tokens, at::TensorOptions().dtype(at::kLong)).unsqueeze(0).to(device_);
  engine_->begin_forward(true);
  at::Tensor h = lm_.embed(t);
  for (int64_t i = 0; i < engine_->num_layers(); ++i) h = engine_->run_layer(i, h);
  return lm_.head(h.narrow(1, h.size(1) - 1, 1)).reshape({-1}).to(at::kFloat).cpu();
}

at::Tensor Generator::recompute_last_logits(const std::vector<int64_t>& tokens) {
  at::NoGradGuard no_grad;
  train::EvalMode eval_mode(lm_);
  memory::Scope scope(memory::Category::Activations);
  lm_.set_cache(capacity_ > 0 ? capacity_ : 0, -1);  // no cache for this forward (a reserved one is kept)
  at::Tensor logits = forward_last(tokens);
  engine_->reshard_all();
  return logits;
}

Generation Generator::generate(const std::vector<int64_t>& prompt, int64_t max_new, const Sampling& s,
                               uint64_t stream, const StopRule& stop) {
  TESSERA_CHECK(!prompt.empty() && max_new >= 1 && static_cast<int64_t>(prompt.size()) + max_new <= capacity_,
                "generate: prompt of " + std::to_string(prompt.size()) + " + " + std::to_string(max_new) +
                    " new tokens do not fit the KV cache of " + std::to_string(capacity_));
  profile::Phase phase = profile::Phase::activity(-1, "generate");
  at::NoGradGuard no_grad;
  train::EvalMode eval_mode(lm_);
  memory::Scope scope(memory::Category::Activations);
  const bool chooser = host_world_->rank() == 0;
  Rng rng(s.seed, stream);
  Generation g;
  auto t0 = std::chrono::steady_clock::now();
  lm_.set_cache(capacity_, 0);
  at::Tensor logits = forward_last(prompt);
  for (int64_t pos = static_cast<int64_t>(prompt.size());; ++pos) {
    // Rank 0 chooses the token and whether a stop string ended the text; every rank takes both.
    at::Tensor choice = at::zeros({2}, at::TensorOptions().dtype(at::kLong));
    if (chooser) {
      const int64_t token = sample(logits, s, rng);
      g.tokens.push_back(token);
      choice[0] = token;
      choice[1] = stop.stop && stop.stop(g.tokens) ? 1 : 0;
    }
    host_world_->broadcast(choice, 0)->wait();
    if (!chooser) g.tokens.push_back(choice[0].item<int64_t>());
    if (g.tokens.size() == 1) g.prefill_s = seconds_since(t0), t0 = std::chrono::steady_clock::now();
    const int64_t token = g.tokens.back();
    if (std::find(stop.eos.begin(), stop.eos.end(), token) != stop.eos.end()) g.finish = "eos";
    else if (choice[1].item<int64_t>() != 0) g.finish = "stop";
    else if (static_cast<int64_t>(g.tokens.size()) == max_new) g.finish = "length";
    if (!g.finish.empty()) break;
    lm_.set_cache(capacity_, pos);
    logits = forward_last({token});
  }
  engine_->reshard_all();
  lm_.set_cache(capacity_, -1);
  g.decode_s = seconds_since(t0);
  return g;
}

}  // namespace tessera::generate
