// The numerics guard and the fp16 loss scaler (runtime/train/numerics.h) as state machines, on real
// LibTorch gradients. The scaler's expected sequences are written out from torch.cuda.amp.GradScaler's
// documented update rule (_amp_update_scale_), not computed by the class under test. The fp16 case
// casts real fp32 gradients to Half the way the engine does for fsdp.reduce_dtype fp16 (a cast and
// back, no Half matmul: LibTorch 1.13 has none on CPU), so overflow, skip and backoff are those of
// a real fp16 gradient path.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

#include "runtime/device/gemm_probe.h"
#include "runtime/optim/clip.h"
#include "runtime/train/numerics.h"
#include "util/error.h"

namespace test_numerics {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace tessera;
using namespace tessera::train;

namespace {

// Gradients of a small fp32 MLP for `loss_multiplier` x its loss (fixed weights and inputs).
std::vector<torch::Tensor> mlp_grads(double loss_multiplier, double input_gain = 1.0) {
  torch::manual_seed(7);
  torch::nn::Linear a(16, 32), b(32, 8);
  torch::Tensor x = torch::randn({4, 16}) * input_gain;
  torch::Tensor loss = b(torch::tanh(a(x))).pow(2).sum();
  (loss * loss_multiplier).backward();
  return {a->weight.grad().clone(), a->bias.grad().clone(), b->weight.grad().clone(), b->bias.grad().clone()};
}

}  // namespace

TEST(LossScaler, DefaultsAreGradScalers) {
  LossScaler s(true);
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.options().growth_factor, 2.0);
  EXPECT_EQ(s.options().backoff_factor, 0.5);
  EXPECT_EQ(s.options().growth_interval, 2000);
  // 1999 finite steps keep the scale; the 2000th doubles it and restarts the count.
  for (int i = 0; i < 1999; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.growth_tracker(), 1999);
  s.update(false);
  EXPECT_EQ(s.scale(), 131072.0f);
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(LossScaler, StateMachineFollowsGradScalerUpdateRule) {
  LossScaleOptions o;
  o.growth_interval = 3;
  LossScaler s(true, o);
  // found_inf per step, and the scale / growth tracker GradScaler has after each update.
  const std::vector<bool> inf = {false, false, false, true, false, false, true, false, false, false, false, false, false};
  const std::vector<float> scale = {65536, 65536, 131072, 65536, 65536, 65536, 32768, 32768, 32768, 65536, 65536, 65536, 131072};
  const std::vector<int64_t> tracker = {1, 2, 0, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0};
  for (size_t i = 0; i < inf.size(); ++i) {
    s.update(inf[i]);
    EXPECT_EQ(s.scale(), scale[i]) << "after update " << i;
    EXPECT_EQ(s.growth_tracker(), tracker[i]) << "after update " << i;
  }
}

TEST(LossScaler, GrowthThatWouldOverflowFloatIsNotApplied) {
  LossScaleOptions o;
  o.init_scale = std::ldexp(1.0f, 127);
  o.growth_interval = 1;
  LossScaler s(true, o);
  s.update(false);  // 2^128 is not a finite float: GradScaler keeps the scale, restarts the count
  EXPECT_EQ(s.scale(), std::ldexp(1.0f, 127));
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(LossScaler, DisabledIsTheIdentity) {
  LossScaler s;  // bf16 / fp32 runs
  EXPECT_FALSE(s.enabled());
  EXPECT_EQ(s.scale(), 1.0f);
  std::vector<torch::Tensor> g = mlp_grads(1.0), before;
  for (auto& t : g) before.push_back(t.clone());
  s.unscale(g);
  s.update(true);
  EXPECT_EQ(s.scale(), 1.0f);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(torch::equal(g[i], before[i]));
}

// A power-of-two scale commutes with every rounding in backward (no overflow or underflow here): the
// unscaled gradients of scale x loss are bit-identical to the gradients of the loss.
TEST(LossScaler, UnscaleRecoversTheGradientsExactly) {
  LossScaler s(true);
  const std::vector<torch::Tensor> want = mlp_grads(1.0);
  std::vector<torch::Tensor> got = mlp_grads(s.scale());
  EXPECT_FALSE(torch::equal(got[0], want[0]));  // really scaled
  s.unscale(got);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::equal(got[i], want[i])) << "tensor " << i;
  // A scale that is not a power of two (init_scale 3): unscaling multiplies by the rounded fp32
  // inverse, as GradScaler does.
  LossScaleOptions o;
  o.init_scale = 3.0f;
  LossScaler three(true, o);
  std::vector<torch::Tensor> g3 = mlp_grads(3.0);
  const torch::Tensor expect = g3[0] * static_cast<float>(1.0 / 3.0);
  three.unscale(g3);
  EXPECT_TRUE(torch::equal(g3[0], expect));
}

// The interaction the trainer relies on, on a real fp16 gradient path: gradients of scale x loss
// pass through Half (as the engine's fp16 reduction does), are unscaled, and the global norm decides.
// Too high a scale overflows Half -> inf norm -> the step is skipped and the scale halves, until the
// gradients fit; then the step runs with gradients equal to the fp32 ones to fp16 precision.
TEST(LossScaler, Fp16OverflowSkipsAndBacksOffUntilTheGradientsFit) {
  const std::vector<torch::Tensor> fp32 = mlp_grads(1.0, /*input_gain=*/8.0);
  double max_abs = 0;
  for (const auto& g : fp32) max_abs = std::max(max_abs, g.abs().max().item<double>());
  ASSERT_GT(max_abs * 65536.0, 65504.0) << "the test needs gradients that overflow fp16 at the initial scale";
  // The number of halvings GradScaler needs: the first k with max_abs * 65536 / 2^k <= fp16 max.
  int expected_skips = 0;
  // (Half overflows to inf from 65520 up: halfway between its largest value, 65504, and 2^16.)
  while (max_abs * 65536.0 / std::ldexp(1.0, expected_skips) >= 65520.0) ++expected_skips;

  LossScaler scaler(true);
  NumericsGuard guard(/*max_consecutive=*/expected_skips + 1);
  int64_t step = 0;
  std::vector<torch::Tensor> applied;
  for (; step < 40 && applied.empty(); ) {
    ++step;
    const float used = scaler.scale();
    std::vector<torch::Tensor> g = mlp_grads(used, 8.0);
    for (auto& t : g) t = t.to(torch::kHalf).to(torch::kFloat);  // the fp16 reduction's round trip
    scaler.unscale(g);
    const double norm = optim::global_grad_norm(g, nullptr);
    const bool skip = !std::isfinite(norm);
    guard.record(step, skip, /*loss=*/1.0, norm);
    scaler.update(skip);
    if (skip) {
      EXPECT_EQ(scaler.scale(), used / 2) << "step " << step;
      EXPECT_TRUE(std::isinf(norm));
      EXPECT_EQ(guard.last_reason(), "non-finite gradient norm (inf)");
    } else {
      applied = g;
    }
  }
  ASSERT_FALSE(applied.empty());
  EXPECT_EQ(step, expected_skips + 1);
  EXPECT_EQ(guard.total(), expected_skips);
  EXPECT_EQ(guard.consecutive(), 0);  // the finite step ended the streak
  EXPECT_FALSE(guard.exhausted());
  EXPECT_EQ(scaler.scale(), 65536.0f / std::ldexp(1.0f, expected_skips));
  EXPECT_EQ(scaler.growth_tracker(), 1);
  for (size_t i = 0; i < applied.size(); ++i) {
    const double err = (applied[i] - fp32[i]).abs().max().item<double>() / fp32[i].abs().max().item<double>();
    EXPECT_LT(err, 1e-3) << "tensor " << i;  // fp16 has an 11-bit significand
  }
  // One skip fewer allowed: the same sequence ends the run at the last overflow.
  NumericsGuard strict(expected_skips);
  for (int k = 1; k <= expected_skips; ++k) strict.record(k, true, 1.0, INFINITY);
  EXPECT_TRUE(strict.exhausted());
}

TEST(LossScaler, StateRoundTripsAndBadStateIsRefused) {
  LossScaleOptions o;
  o.growth_interval = 5;
  LossScaler a(true, o);
  a.update(true);
  a.update(false);
  a.update(false);
  LossScaler b(true, o);
  b.load_state(a.state(), "ckpt/manifest.json");
  EXPECT_EQ(b.scale(), 32768.0f);
  EXPECT_EQ(b.growth_tracker(), 2);
  auto refused = [&](const nlohmann::json& j) {
    try {
      b.load_state(j, "ckpt/manifest.json");
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Input);
      EXPECT_NE(std::string(e.what()).find("ckpt/manifest.json"), std::string::npos) << e.what();
      return true;
    }
    return false;
  };
  EXPECT_TRUE(refused({{"scale", -1.0}, {"growth_tracker", 0}}));
  EXPECT_TRUE(refused({{"scale", 1024.0}, {"growth_tracker", 5}}));
  EXPECT_TRUE(refused({{"scale", "big"}, {"growth_tracker", 0}}));
  EXPECT_TRUE(refused(nlohmann::json::array()));
  EXPECT_EQ(b.scale(), 32768.0f);  // unchanged by the refused states
}

TEST(NumericsGuard, CountsSkipsAndStopsAfterTheLimitInARow) {
  NumericsGuard g(3);
  g.record(1, false, 2.5, 1.0);
  g.record(2, true, 2.5, INFINITY);
  g.record(3, true, NAN, NAN);
  EXPECT_EQ(g.consecutive(), 2);
  EXPECT_FALSE(g.exhausted());
  g.record(4, false, 2.4, 0.9);  // a good step ends the streak, the total stays
  EXPECT_EQ(g.consecutive(), 0);
  EXPECT_EQ(g.total(), 2);
  for (int64_t s = 5; s <= 7; ++s) g.record(s, true, 2.4, NAN);
  EXPECT_TRUE(g.exhausted());
  EXPECT_EQ(g.total(), 5);
  const std::string m = g.stop_message("/ck/step-4");
  EXPECT_EQ(m, "train.max_skipped_steps 3 reached: 3 optimizer steps in a row skipped (steps 5-7; last: "
               "non-finite gradient norm (nan)); the weights and optimizer state are those after step 4; last "
               "checkpoint /ck/step-4; lower train.lr, check the data, or use fsdp.mixed_precision bf16");
  NumericsGuard unlimited(0);
  for (int64_t s = 1; s <= 100; ++s) unlimited.record(s, true, NAN, 1.0);
  EXPECT_FALSE(unlimited.exhausted());
}

TEST(NumericsGuard, ReasonsNameWhatWasNotFinite) {
  EXPECT_EQ(non_finite_reason(1.0, 2.0), "");
  EXPECT_EQ(non_finite_reason(NAN, 2.0), "non-finite loss (nan)");
  EXPECT_EQ(non_finite_reason(1.0, -INFINITY), "non-finite gradient norm (-inf)");
  EXPECT_EQ(non_finite_reason(INFINITY, NAN), "non-finite loss (inf) and non-finite gradient norm (nan)");
  NumericsGuard g(2);
  g.record(9, true, 1.0, 1.0);  // agreed skip though this rank saw finite values
  EXPECT_EQ(g.last_reason(), "a non-finite value on another rank");
}

TEST(NumericsGuard, StateRoundTripsAcrossARestart) {
  NumericsGuard a(3);
  a.record(1, true, NAN, 1.0);
  a.record(2, false, 1.0, 1.0);
  a.record(3, true, 1.0, INFINITY);
  a.record(4, true, 1.0, INFINITY);
  NumericsGuard b(3);
  b.load_state(a.state(), "m.json");
  EXPECT_EQ(b.total(), 3);
  EXPECT_EQ(b.consecutive(), 2);
  b.record(5, true, 1.0, INFINITY);  // the streak continues across the restart
  EXPECT_TRUE(b.exhausted());
  EXPECT_NE(b.stop_message("").find("steps 3-5"), std::string::npos) << b.stop_message("");
  EXPECT_THROW(b.load_state({{"skipped_steps", 1}, {"consecutive_skipped", 2}, {"first_skipped_step", 1}}, "m.json"),
               Error);
  EXPECT_THROW(b.load_state({{"skipped_steps", 1}}, "m.json"), Error);
}

// The probe agrees with an actual attempt (whatever this LibTorch supports); fp32 and bf16 always run.
TEST(DtypeSupport, ProbeAgreesWithLibTorch) {
  bool half_runs = true;
  try {
    torch::Tensor a = torch::ones({2, 2}, torch::kHalf);
    torch::nn::functional::linear(a, a);
  } catch (const std::exception&) {
    half_runs = false;
  }
  const std::string why = device::unsupported_matmul(torch::kHalf, torch::kCPU);
  EXPECT_EQ(why.empty(), half_runs) << why;
  if (!half_runs) {
    EXPECT_NE(why.find("Half"), std::string::npos) << why;
    EXPECT_EQ(why.find('\n'), std::string::npos);
  }
  EXPECT_EQ(device::unsupported_matmul(torch::kFloat, torch::kCPU), "");
  EXPECT_EQ(device::unsupported_matmul(torch::kBFloat16, torch::kCPU), "");
}

}  // namespace test_numerics
