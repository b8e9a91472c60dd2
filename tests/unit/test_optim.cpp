// AdamW on flat shards vs torch::optim::AdamW, LR schedules, global-norm clipping vs
// torch::nn::utils::clip_grad_norm_.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <sstream>
#include <string>
#include <type_traits>

#include "runtime/comm/communicator.h"
#include "runtime/error.h"
#include "runtime/optim/adamw.h"
#include "runtime/optim/clip.h"
#include "runtime/optim/schedule.h"

using namespace tessera;
using namespace tessera::optim;

namespace {
// LibTorch's per-parameter optimizer state: keyed by the TensorImpl's address printed as text in
// 1.x, by the address itself in 2.x.
template <class StateMap>
torch::optim::OptimizerParamState& reference_state(StateMap& state, const torch::Tensor& p) {
  if constexpr (std::is_same_v<typename StateMap::key_type, std::string>) {
    std::ostringstream key;
    key << p.unsafeGetTensorImpl();
    return *state.at(key.str());
  } else {
    return *state.at(p.unsafeGetTensorImpl());
  }
}

double max_rel_err(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).abs() / (b.abs() + 1e-12)).max().item<double>();
}
}  // namespace

TEST(AdamW, MatchesTorchAdamWWithDecayAndNoDecayGroups) {
  torch::manual_seed(0);
  // Torch side: a "weight" (decayed) and a "norm" (not decayed) parameter.
  torch::Tensor w = torch::randn({7, 5}).requires_grad_();
  torch::Tensor g = torch::randn({9}).requires_grad_();
  AdamWOptions opt;
  opt.lr = 1e-2;
  opt.weight_decay = 0.1;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{w}, std::make_unique<torch::optim::AdamWOptions>(
                                                         torch::optim::AdamWOptions(opt.lr)
                                                             .betas({opt.beta1, opt.beta2})
                                                             .eps(opt.eps)
                                                             .weight_decay(opt.weight_decay)));
  groups.emplace_back(std::vector<torch::Tensor>{g}, std::make_unique<torch::optim::AdamWOptions>(
                                                         torch::optim::AdamWOptions(opt.lr)
                                                             .betas({opt.beta1, opt.beta2})
                                                             .eps(opt.eps)
                                                             .weight_decay(0.0)));
  torch::optim::AdamW reference(groups, torch::optim::AdamWOptions(opt.lr));

  // Tessera side: one flat shard holding both, with a decay mask; plus a second shard holding a
  // copy of w alone with mask undefined (decay everything), to cover both paths.
  ShardState flat, wonly;
  flat.param = torch::cat({w.detach().flatten(), g.detach().flatten()}).clone();
  flat.decay_mask = torch::cat({torch::ones({35}), torch::zeros({9})});
  wonly.param = w.detach().flatten().clone();
  AdamW adamw(opt);
  std::vector<ShardState*> shards = {&flat, &wonly};

  const double lrs[] = {1e-2, 5e-3, 2e-2, 1e-3, 1e-2, 3e-3};
  for (double lr : lrs) {
    const torch::Tensor gw = torch::randn({7, 5}) * 3, gg = torch::randn({9});
    w.mutable_grad() = gw.clone();
    g.mutable_grad() = gg.clone();
    for (auto& group : reference.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    reference.step();

    flat.grad = torch::cat({gw.flatten(), gg.flatten()});
    wonly.grad = gw.flatten().clone();
    adamw.step(shards, lr);
  }
  EXPECT_EQ(adamw.step_count(), 6);
  const torch::Tensor expected = torch::cat({w.detach().flatten(), g.detach().flatten()});
  EXPECT_LT(max_rel_err(flat.param, expected), 1e-6);
  EXPECT_LT(max_rel_err(wonly.param, w.detach().flatten()), 1e-6);
  // The parameters actually moved, and decay made a difference for w.
  EXPECT_GT((flat.param.slice(0, 0, 35) - torch::zeros({35})).abs().sum().item<double>(), 0);
  auto& st = static_cast<torch::optim::AdamWParamState&>(reference_state(reference.state(), w));
  EXPECT_LT(max_rel_err(wonly.exp_avg_sq, st.exp_avg_sq().flatten()), 1e-6);
  EXPECT_LT(max_rel_err(wonly.exp_avg, st.exp_avg().flatten()), 1e-5);

  // Without decay on the masked part, the result must differ from decaying it.
  ShardState all_decay;
  all_decay.param = torch::cat({torch::zeros({35}), torch::ones({9})});
  all_decay.grad = torch::zeros({44});
  ShardState masked = all_decay;
  masked.param = all_decay.param.clone();
  masked.decay_mask = torch::cat({torch::ones({35}), torch::zeros({9})});
  AdamW one(opt);
  std::vector<ShardState*> a = {&all_decay}, b = {&masked};
  one.step(a, 0.5);
  one.set_step_count(0);
  one.step(b, 0.5);
  EXPECT_NEAR(all_decay.param[40].item<double>(), 1 - 0.5 * 0.1, 1e-7);
  EXPECT_EQ(masked.param[40].item<double>(), 1.0);
}

TEST(AdamW, ShardedUpdateEqualsUnsharded) {
  // The update is elementwise, so splitting a buffer into shards gives bit-identical results.
  torch::manual_seed(1);
  ShardState full;
  full.param = torch::randn({20});
  ShardState s0, s1;
  s0.param = full.param.slice(0, 0, 13).clone();
  s1.param = full.param.slice(0, 13).clone();
  AdamW a({}), b({});
  std::vector<ShardState*> fa = {&full}, fb = {&s0, &s1};
  for (int i = 0; i < 4; ++i) {
    full.grad = torch::randn({20});
    s0.grad = full.grad.slice(0, 0, 13).clone();
    s1.grad = full.grad.slice(0, 13).clone();
    a.step(fa, 1e-3);
    b.step(fb, 1e-3);
  }
  EXPECT_TRUE(torch::equal(torch::cat({s0.param, s1.param}), full.param));
}

TEST(LrSchedule, WarmupCosineLinearConstant) {
  LrSchedule s{1.0, 0.1, 4, 14, "cosine"};
  EXPECT_DOUBLE_EQ(lr_at(0, s), 0.25);
  EXPECT_DOUBLE_EQ(lr_at(1, s), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(3, s), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(4, s), 1.0);                        // decay starts at the top
  EXPECT_NEAR(lr_at(9, s), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.5)), 1e-12);  // half-way: 0.55
  EXPECT_NEAR(lr_at(9, s), 0.55, 1e-12);
  EXPECT_NEAR(lr_at(14, s), 0.1, 1e-12);
  EXPECT_NEAR(lr_at(100, s), 0.1, 1e-12);                    // stays at min_lr
  EXPECT_GT(lr_at(6, s), lr_at(7, s));

  s.kind = "linear";
  EXPECT_NEAR(lr_at(9, s), 0.55, 1e-12);
  EXPECT_NEAR(lr_at(6, s), 1.0 - 0.9 * 0.2, 1e-12);
  s.kind = "constant";
  EXPECT_DOUBLE_EQ(lr_at(2, s), 0.75);
  EXPECT_DOUBLE_EQ(lr_at(50, s), 1.0);

  LrSchedule no_warmup{2.0, 0.0, 0, 10, "cosine"};
  EXPECT_DOUBLE_EQ(lr_at(0, no_warmup), 2.0);
  EXPECT_NEAR(lr_at(10, no_warmup), 0.0, 1e-12);

  EXPECT_THROW(validate(LrSchedule{1.0, 0.0, 0, 10, "step"}), Error);
  EXPECT_THROW(lr_at(5, LrSchedule{1.0, 0.0, 0, 10, "step"}), Error);
  EXPECT_THROW(validate(LrSchedule{1.0, 2.0, 0, 10, "cosine"}), Error);
  EXPECT_THROW(validate(LrSchedule{1.0, 0.0, -1, 10, "cosine"}), Error);
  EXPECT_NO_THROW(validate(LrSchedule{1.0, 0.1, 4, 14, "linear"}));
}

TEST(ClipGradNorm, MatchesTorchClipGradNorm) {
  torch::manual_seed(2);
  auto self = comm::make_self_communicator();
  for (double max_norm : {0.5, 1e6}) {  // clipping and not clipping
    std::vector<torch::Tensor> params = {torch::randn({30}).requires_grad_(), torch::randn({4, 4}).requires_grad_()};
    std::vector<at::Tensor> grads;
    for (auto& p : params) {
      p.mutable_grad() = torch::randn(p.sizes()) * 2;
      grads.push_back(p.grad().clone());
    }
    const double expected_norm = torch::nn::utils::clip_grad_norm_(params, max_norm);
    std::vector<at::Tensor> grads2 = {grads[0].clone(), grads[1].clone()};
    const double norm = clip_grad_norm(grads, max_norm, nullptr);
    const double norm_self = clip_grad_norm(grads2, max_norm, self.get());
    EXPECT_NEAR(norm, expected_norm, 1e-6 * expected_norm);
    EXPECT_EQ(norm, norm_self);
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_LT(max_rel_err(grads[i], params[i].grad()), 1e-6);
      EXPECT_TRUE(torch::equal(grads[i], grads2[i]));
    }
    if (max_norm < 1) {
      // After clipping the global norm is max_norm (up to the 1e-6 guard).
      EXPECT_NEAR(global_grad_norm(grads, nullptr), max_norm, 1e-5);
    }
  }
}

TEST(ClipGradNorm, NormOfShardsIsTheNormOfTheWhole) {
  // The sum-of-squares decomposition behind sharding: splitting a gradient into pieces (with
  // zero padding) does not change the global norm.
  const at::Tensor g = torch::arange(1, 11, torch::kFloat);  // sum of squares 385
  std::vector<at::Tensor> pieces = {g.slice(0, 0, 3), g.slice(0, 3, 10), torch::zeros({2}), at::Tensor()};
  EXPECT_DOUBLE_EQ(global_grad_norm(pieces, nullptr), std::sqrt(385.0));
  EXPECT_DOUBLE_EQ(global_grad_norm({}, nullptr), 0.0);
  std::vector<at::Tensor> none;
  EXPECT_EQ(clip_grad_norm(none, 1.0, nullptr), 0.0);
  EXPECT_THROW(clip_grad_norm(none, 0.0, nullptr), Error);
}
