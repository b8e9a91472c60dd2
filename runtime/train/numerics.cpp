// See numerics.h.
#include "runtime/train/numerics.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard: ATen.h no longer brings it in LibTorch 2.11

#include <cmath>
#include <sstream>

#include "util/error.h"

namespace tessera::train {

// ---- loss scaling ------------------------------------------------------------------------------

LossScaler::LossScaler(bool enabled, LossScaleOptions options)
    : enabled_(enabled), options_(options), scale_(options.init_scale) {
  TESSERA_CHECK(std::isfinite(options_.init_scale) && options_.init_scale > 0, "loss scale must be positive");
  TESSERA_CHECK(options_.growth_factor > 1 && options_.backoff_factor > 0 && options_.backoff_factor < 1,
                "loss scale growth factor must be > 1 and backoff in (0, 1)");
  TESSERA_CHECK(options_.growth_interval >= 1, "loss scale growth interval must be >= 1");
}

void LossScaler::unscale(const std::vector<at::Tensor>& grads) const {
  if (!enabled_) return;
  // GradScaler: inv_scale = scale.double().reciprocal().float(), every gradient multiplied by it.
  const float inv = static_cast<float>(1.0 / static_cast<double>(scale_));
  at::NoGradGuard no_grad;
  for (const at::Tensor& g : grads)
    if (g.defined() && g.numel() > 0) const_cast<at::Tensor&>(g).mul_(inv);
}

void LossScaler::update(bool found_inf) {
  if (!enabled_) return;
  // torch's _amp_update_scale_ (the scale is a float32; growth only when the result is finite).
  if (found_inf) {
    scale_ = static_cast<float>(scale_ * options_.backoff_factor);
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ == options_.growth_interval) {
    const float grown = static_cast<float>(scale_ * options_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
}

nlohmann::json LossScaler::state() const { return {{"scale", scale_}, {"growth_tracker", growth_tracker_}}; }

void LossScaler::load_state(const nlohmann::json& j, const std::string& where) {
  const bool ok = j.is_object() && j.contains("scale") && j["scale"].is_number() && j.contains("growth_tracker") &&
                  j["growth_tracker"].is_number_integer();
  TESSERA_CHECK_INPUT(ok, where + ": loss_scale must be {\"scale\": number, \"growth_tracker\": integer}, got " + j.dump());
  const double s = j["scale"].get<double>();
  const int64_t t = j["growth_tracker"].get<int64_t>();
  TESSERA_CHECK_INPUT(std::isfinite(s) && s > 0 && s <= 3.4e38,
                      where + ": loss_scale.scale must be a positive finite float, got " + j["scale"].dump());
  TESSERA_CHECK_INPUT(t >= 0 && t < options_.growth_interval,
                      where + ": loss_scale.growth_tracker must be in [0, " + std::to_string(options_.growth_interval) +
                          "), got " + std::to_string(t));
  scale_ = static_cast<float>(s);
  growth_tracker_ = t;
}

// ---- the guard ---------------------------------------------------------------------------------

namespace {
std::string number(double v) {
  std::ostringstream os;
  os << v;  // "inf", "-inf", "nan", "4.125"
  return os.str();
}
}  // namespace

std::string non_finite_reason(double loss, double grad_norm) {
  std::string r;
  if (!std::isfinite(loss)) r = "non-finite loss (" + number(loss) + ")";
  if (!std::isfinite(grad_norm)) r += (r.empty() ? "" : " and ") + std::string("non-finite gradient norm (") + number(grad_norm) + ")";
  return r;
}

void NumericsGuard::record(int64_t step, bool skipped, double loss, double grad_norm) {
  if (!skipped) {
    consecutive_ = 0;
    first_ = -1;
    return;
  }
  ++total_;
  if (consecutive_++ == 0) first_ = step;
  last_reason_ = non_finite_reason(loss, grad_norm);
  if (last_reason_.empty()) last_reason_ = "a non-finite value on another rank";
}

std::string NumericsGuard::stop_message(const std::string& checkpoint) const {
  std::ostringstream os;
  const int64_t last = first_ + consecutive_ - 1;
  os << "train.max_skipped_steps " << max_ << " reached: " << consecutive_ << " optimizer steps in a row skipped (step";
  if (consecutive_ > 1) os << "s " << first_ << "-" << last; else os << " " << last;
  os << "; last: " << last_reason_ << "); the weights and optimizer state are those after step " << first_ - 1
     << "; " << (checkpoint.empty() ? std::string("no checkpoint was saved") : "last checkpoint " + checkpoint)
     << "; lower train.lr, check the data, or use fsdp.mixed_precision bf16";
  return os.str();
}

nlohmann::json NumericsGuard::state() const {
  return {{"skipped_steps", total_}, {"consecutive_skipped", consecutive_}, {"first_skipped_step", first_}};
}

void NumericsGuard::load_state(const nlohmann::json& j, const std::string& where) {
  auto get = [&](const char* key) {
    TESSERA_CHECK_INPUT(j.is_object() && j.contains(key) && j[key].is_number_integer(),
                        where + ": numerics." + key + " must be an integer");
    return j[key].get<int64_t>();
  };
  const int64_t total = get("skipped_steps"), consecutive = get("consecutive_skipped"), first = get("first_skipped_step");
  TESSERA_CHECK_INPUT(total >= 0 && consecutive >= 0 && consecutive <= total && (consecutive == 0 || first >= 1),
                      where + ": inconsistent numerics state " + j.dump());
  total_ = total;
  consecutive_ = consecutive;
  first_ = consecutive > 0 ? first : -1;
  if (consecutive_ > 0) last_reason_ = "non-finite values before the restart";
}

// ---- dtype support -----------------------------------------------------------------------------

}  // namespace tessera::train
