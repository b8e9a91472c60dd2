// AdamW on flat shards vs torch::optim::AdamW, LR schedules, global-norm clipping vs
// torch::nn::utils::clip_grad_norm_.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <sstream>
#include <string>
#include <type_traits>

#include "runtime/comm/communicator.h"
#include "runtime/optim/adamw.h"
#include "runtime/optim/clip.h"
#include "runtime/optim/schedule.h"
#include "util/dtype_names.h"
#include "util/error.h"

namespace test_optim {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

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

// One shard of `n` N(0, 1) values with weight decay over `decay`, and a copy of it (equal values,
// its own tensor), for two optimizers compared on the same parameters.
std::pair<std::vector<ParamShard>, std::vector<ParamShard>> twin_shards(int64_t n, std::vector<Range> decay) {
  std::vector<ParamShard> a(1);
  a[0].param = torch::randn({n});
  a[0].decay = std::move(decay);
  std::vector<ParamShard> b = a;
  b[0].param = a[0].param.clone();
  return {a, b};
}

// `steps` steps at `lr` of fa on a and of fb on b, with the same N(0, 1) gradients.
void step_both(AdamW& fa, std::vector<ParamShard>& a, AdamW& fb, std::vector<ParamShard>& b, int steps, double lr) {
  for (int i = 0; i < steps; ++i) {
    a[0].grad = torch::randn(a[0].param.sizes());
    b[0].grad = a[0].grad.clone();
    fa.step(a, lr);
    fb.step(b, lr);
  }
}
}  // namespace

TEST(AdamW, MatchesTorchAdamWWithDecayAndNoDecayGroups) {
  torch::manual_seed(0);
  // Torch side: a "weight" (decayed) and a "norm" (not decayed) parameter.
  torch::Tensor w = torch::randn({7, 5}).requires_grad_();
  torch::Tensor g = torch::randn({9}).requires_grad_();
  AdamWOptions opt;
  const double lr0 = 1e-2;  // the reference's initial lr; every step sets its own
  opt.weight_decay = 0.1;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{w}, std::make_unique<torch::optim::AdamWOptions>(
                                                         torch::optim::AdamWOptions(lr0)
                                                             .betas({opt.beta1, opt.beta2})
                                                             .eps(opt.eps)
                                                             .weight_decay(opt.weight_decay)));
  groups.emplace_back(std::vector<torch::Tensor>{g}, std::make_unique<torch::optim::AdamWOptions>(
                                                         torch::optim::AdamWOptions(lr0)
                                                             .betas({opt.beta1, opt.beta2})
                                                             .eps(opt.eps)
                                                             .weight_decay(0.0)));
  torch::optim::AdamW reference(groups, torch::optim::AdamWOptions(lr0));

  // Tessera side: one flat shard holding both, decay on the first 35 elements only (a range, no
  // per-element mask); plus a second shard holding a copy of w alone, decayed everywhere.
  std::vector<ParamShard> shards(2);
  shards[0].param = torch::cat({w.detach().flatten(), g.detach().flatten()}).clone();
  shards[0].decay = {{0, 35}};
  shards[1].param = w.detach().flatten().clone();
  shards[1].decay = {{0, 35}};
  AdamW adamw(opt);

  const double lrs[] = {1e-2, 5e-3, 2e-2, 1e-3, 1e-2, 3e-3};
  for (double lr : lrs) {
    const torch::Tensor gw = torch::randn({7, 5}) * 3, gg = torch::randn({9});
    w.mutable_grad() = gw.clone();
    g.mutable_grad() = gg.clone();
    for (auto& group : reference.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    reference.step();

    shards[0].grad = torch::cat({gw.flatten(), gg.flatten()});
    shards[1].grad = gw.flatten().clone();
    adamw.step(shards, lr);
  }
  EXPECT_EQ(adamw.step_count(), 6);
  const torch::Tensor expected = torch::cat({w.detach().flatten(), g.detach().flatten()});
  EXPECT_LT(max_rel_err(shards[0].param, expected), 1e-6);
  EXPECT_LT(max_rel_err(shards[1].param, w.detach().flatten()), 1e-6);
  // The optimizer owns its moments; they are torch's.
  auto state = adamw.state(shards);
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].kind, "exp_avg");
  EXPECT_EQ(state[1].kind, "exp_avg_sq");
  auto& st = static_cast<torch::optim::AdamWParamState&>(reference_state(reference.state(), w));
  EXPECT_LT(max_rel_err(state[1].per_unit[1], st.exp_avg_sq().flatten()), 1e-6);
  EXPECT_LT(max_rel_err(state[0].per_unit[1], st.exp_avg().flatten()), 1e-5);
  EXPECT_EQ(adamw.state_bytes_per_element(), 8);

  // Decay applies inside the ranges only: a zero gradient leaves the undecayed element untouched.
  std::vector<ParamShard> one(1);
  one[0].param = torch::ones({44});
  one[0].grad = torch::zeros({44});
  one[0].decay = {{0, 10}, {30, 5}};
  AdamW fresh(opt);
  fresh.step(one, 0.5);
  for (int64_t i : {0, 9, 30, 34}) EXPECT_NEAR(one[0].param[i].item<double>(), 1 - 0.5 * 0.1, 1e-7) << i;
  for (int64_t i : {10, 29, 35, 43}) EXPECT_EQ(one[0].param[i].item<double>(), 1.0) << i;
}

TEST(AdamW, ShardedUpdateEqualsUnsharded) {
  // The update is elementwise, so splitting a buffer into shards gives bit-identical results,
  // decay ranges split with it.
  torch::manual_seed(1);
  std::vector<ParamShard> full(1), split(2);
  full[0].param = torch::randn({20});
  full[0].decay = {{2, 9}, {15, 3}};
  split[0].param = full[0].param.slice(0, 0, 13).clone();
  split[0].decay = {{2, 9}};
  split[1].param = full[0].param.slice(0, 13).clone();
  split[1].decay = {{2, 3}};
  AdamWOptions o;
  o.weight_decay = 0.3;
  AdamW a(o), b(o);
  for (int i = 0; i < 4; ++i) {
    full[0].grad = torch::randn({20});
    split[0].grad = full[0].grad.slice(0, 0, 13).clone();
    split[1].grad = full[0].grad.slice(0, 13).clone();
    a.step(full, 1e-3);
    b.step(split, 1e-3);
  }
  EXPECT_TRUE(torch::equal(torch::cat({split[0].param, split[1].param}), full[0].param));
}

TEST(AdamW, FusedCpuLoopEqualsBlockedTensorOps) {
  // The one-pass CPU loop and the tensor-op path (used on GPUs) compute the same formula.
  torch::manual_seed(3);
  const int64_t n = (int64_t(1) << 20) + 1000;
  for (StateDtype dt : {StateDtype::F32, StateDtype::BF16}) {
    auto [a, b] = twin_shards(n, {{100, int64_t(1) << 20}});
    AdamWOptions oa, ob;
    oa.state_dtype = ob.state_dtype = dt;
    ob.fused_cpu = false;
    AdamW fa(oa), fb(ob);
    step_both(fa, a, fb, b, 3, 1e-2);
    // Same formula, float rounding apart (params ~ N(0, 1), three steps of lr 1e-2). With bf16
    // moments, an fp32 rounding difference between the two paths can flip a moment's bf16 rounding
    // (one step of 2^-8 relative), which moves that element's later updates by up to lr x 2^-8: the
    // bound is then 3 steps x 1e-2 x 2^-8, and such flips must stay rare (< 1% of the elements).
    const at::Tensor diff = (a[0].param - b[0].param).abs();
    if (dt == StateDtype::F32) {
      EXPECT_LT(diff.max().item<double>(), 1e-5);
    } else {
      EXPECT_LT(diff.max().item<double>(), 3 * 1e-2 / 256);
      EXPECT_LT(diff.gt(1e-5).sum().item<double>(), 0.01 * n);
    }
    EXPECT_EQ(fa.state(a)[0].per_unit[0].scalar_type(), state_scalar_type(dt));
  }
}

TEST(AdamW, FoundInfSkipsTheStepInsideTheOptimizer) {
  // The trainer enqueues the update before it reads the loss and norm back: a found_inf of 1 must
  // leave masters, moments and the step count untouched, and one of 0 must be the plain step's bits.
  torch::manual_seed(4);
  for (StateDtype dt : {StateDtype::F32, StateDtype::BF16, StateDtype::Int8}) {
    auto [a, b] = twin_shards(5000, {{10, 3000}});
    AdamWOptions o;
    o.state_dtype = dt;
    o.block = 256;
    AdamW fa(o), fb(o);
    step_both(fa, a, fb, b, 2, 1e-2);  // moments that are not zero
    const at::Tensor param = a[0].param.clone();
    std::vector<at::Tensor> moments;
    const std::vector<NamedShards> before = fa.state(a);
    for (const at::Tensor& t : before[0].per_unit) moments.push_back(t.clone());
    a[0].grad = torch::full_like(a[0].param, std::numeric_limits<float>::infinity());
    ASSERT_TRUE(fa.skips_itself(a, at::kCPU));
    fa.step(a, 1e-2, 1.0f, at::ones({}, at::kFloat));
    EXPECT_TRUE(torch::equal(a[0].param, param));
    const std::vector<NamedShards> after = fa.state(a);
    for (size_t k = 0; k < moments.size(); ++k) EXPECT_TRUE(torch::equal(after[0].per_unit[k], moments[k]));
    EXPECT_EQ(fa.step_count(), 2);
    a[0].grad = torch::randn(a[0].param.sizes());
    b[0].grad = a[0].grad.clone();
    fa.step(a, 1e-2, 0.5f, at::zeros({}, at::kFloat));
    fb.step(b, 1e-2, 0.5f);
    EXPECT_TRUE(torch::equal(a[0].param, b[0].param));
    EXPECT_EQ(fa.step_count(), 3);
  }
  // The tensor-op path cannot skip by itself: the caller must decide first.
  auto [a, b] = twin_shards(100, {});
  AdamWOptions o;
  o.fused_cpu = false;
  AdamW f(o);
  a[0].grad = torch::randn({100});
  EXPECT_FALSE(f.skips_itself(a, at::kCPU));
  EXPECT_THROW(f.step(a, 1e-2, 1.0f, at::zeros({}, at::kFloat)), std::exception);
  // Nor does any CPU path take a device's clipping coefficient (a GPU's fused kernels do:
  // DeviceKernels.AdamWEqualsTheCpuLoopBitForBit); the CPU loop takes it as a float.
  AdamW loop{AdamWOptions()};
  EXPECT_FALSE(f.folds_clipping(a, at::kCPU));
  EXPECT_FALSE(loop.folds_clipping(a, at::kCPU));
  EXPECT_THROW(f.step(a, 1e-2, 1.0f, at::Tensor(), at::ones({}, at::kFloat)), std::exception);
  EXPECT_THROW(loop.step(a, 1e-2, 1.0f, at::Tensor(), at::ones({}, at::kFloat)), std::exception);
}

// train.device_step on a CPU: the CPU loop stands for a GPU's fused kernel and takes the clipping
// coefficient and the skip flag as tensors, read where they are (no host sync before the update):
// the same bits as the host's float, and a flag of 1 touches nothing.
TEST(AdamW, CpuStandingForADeviceTakesItsCoefficientAndFlagAsTensors) {
  torch::manual_seed(5);
  for (StateDtype dt : {StateDtype::F32, StateDtype::BF16, StateDtype::Int8}) {
    auto [a, b] = twin_shards(3000, {{100, 1000}});
    a[0].grad = torch::randn({3000});
    b[0].grad = a[0].grad.clone();
    AdamWOptions o;
    o.state_dtype = dt;
    o.block = 256;
    AdamW host(o);
    o.cpu_stands_for_device = true;
    AdamW device(o);
    ASSERT_TRUE(device.folds_clipping(b, at::kCPU));
    ASSERT_FALSE(host.folds_clipping(a, at::kCPU));
    host.step(a, 1e-2, 0.37f);
    device.step(b, 1e-2, 1.0f, at::zeros({}, at::kFloat), at::full({}, 0.37f, at::kFloat));
    EXPECT_TRUE(torch::equal(a[0].param, b[0].param));
    const at::Tensor param = b[0].param.clone();
    device.step(b, 1e-2, 1.0f, at::ones({}, at::kFloat), at::full({}, 0.37f, at::kFloat));
    EXPECT_TRUE(torch::equal(b[0].param, param));
    EXPECT_EQ(device.step_count(), 1);
  }
}

TEST(AdamW, FusedKernelListsCoverEveryElementOnce) {
  // The fused GPU kernel (at::_fused_adamw_) runs over the decayed ranges and ranges_outside them:
  // together they cover [0, n) once, in order, whatever sits at the ends.
  using R = std::vector<Range>;
  EXPECT_EQ(ranges_outside(10, {}), (R{{0, 10}}));
  EXPECT_EQ(ranges_outside(10, {{0, 10}}), R{});
  EXPECT_EQ(ranges_outside(10, {{0, 3}, {5, 2}}), (R{{3, 2}, {7, 3}}));
  EXPECT_EQ(ranges_outside(10, {{2, 3}, {5, 5}}), (R{{0, 2}}));
  EXPECT_EQ(ranges_outside(0, {}), R{});
}

TEST(AdamW, TensorOpPathDoesNotDependOnGrouping) {
  // The tensor-op path (GPUs) groups shard pieces into multi-tensor operations; a shard cut across
  // groups, several shards in one group, decay ranges across piece boundaries: the same bits as
  // one group holding everything, for fp32 and bf16 moments, with and without clipping's scale.
  torch::manual_seed(5);
  for (StateDtype dt : {StateDtype::F32, StateDtype::BF16}) {
    std::vector<ParamShard> a(3), b(3);
    const int64_t sizes[3] = {5000, 700, 2300};
    for (int k = 0; k < 3; ++k) {
      a[k].param = torch::randn({sizes[k]});
      b[k].param = a[k].param.clone();
      a[k].decay = b[k].decay = sizes[k] > 1900 ? std::vector<Range>{{10, 900}, {1500, 400}}  // across pieces
                                                : std::vector<Range>{{10, 300}, {400, 200}};
    }
    AdamWOptions small, whole;
    small.state_dtype = whole.state_dtype = dt;
    small.fused_cpu = whole.fused_cpu = false;
    small.group_elems = 1000;  // the 5000-element shard spans five groups; 700 + 2300 share and split
    AdamW fa(small), fb(whole);
    for (int i = 0; i < 3; ++i) {
      for (int k = 0; k < 3; ++k) {
        a[k].grad = torch::randn({sizes[k]});
        b[k].grad = a[k].grad.clone();
      }
      const float scale = i == 1 ? 0.5f : 1.0f;
      fa.step(a, 1e-2, scale);
      fb.step(b, 1e-2, scale);
    }
    for (int k = 0; k < 3; ++k) {
      EXPECT_TRUE(torch::equal(a[k].param, b[k].param)) << "shard " << k;
      EXPECT_TRUE(torch::equal(fa.state(a)[0].per_unit[k], fb.state(b)[0].per_unit[k])) << "shard " << k;
    }
  }
}

TEST(AdamW, Bf16StateTracksFp32State) {
  // bf16 moments: half the state bytes, updates within bf16 rounding of the fp32-state run.
  torch::manual_seed(4);
  auto [a, b] = twin_shards(5000, {{0, 5000}});
  AdamWOptions o32, o16;
  o16.state_dtype = StateDtype::BF16;
  AdamW f32(o32), f16(o16);
  EXPECT_EQ(f16.state_bytes_per_element(), 4);
  const torch::Tensor start = a[0].param.clone();
  step_both(f32, a, f16, b, 20, 1e-3);
  const double moved = (a[0].param - start).norm().item<double>();
  const double diff = (a[0].param - b[0].param).norm().item<double>();
  EXPECT_GT(moved, 0.1);
  EXPECT_LT(diff / moved, 1e-2) << "bf16-state update drifted from the fp32-state update";
  EXPECT_FALSE(torch::equal(a[0].param, b[0].param));  // the state really was rounded
  EXPECT_THROW(parse_state_dtype("fp16"), Error);
}

// The one table of floating dtype names (util/dtype_names.h) behind optim.state_dtype, --dtype
// of init-model / ckpt consolidate and bench collectives.
TEST(DtypeNames, OneTableOfNames) {
  using tessera::util::FloatType;
  for (const char* s : {"fp32", "float32", "float", "F32"}) EXPECT_EQ(tessera::util::float_type_named(s), FloatType::F32) << s;
  for (const char* s : {"bf16", "bfloat16", "BF16"}) EXPECT_EQ(tessera::util::float_type_named(s), FloatType::BF16) << s;
  for (const char* s : {"fp16", "float16", "half", "F16"}) EXPECT_EQ(tessera::util::float_type_named(s), FloatType::F16) << s;
  for (const char* s : {"", "f32", "int32", "BFLOAT16"}) EXPECT_FALSE(tessera::util::float_type_named(s).has_value()) << s;
  EXPECT_STREQ(tessera::util::short_name(FloatType::BF16), "bf16");
  EXPECT_EQ(parse_state_dtype("bfloat16"), at::kBFloat16);
  EXPECT_EQ(parse_state_dtype("fp32"), at::kFloat);
}

TEST(LrSchedule, WarmupCosineLinearConstant) {
  LrSchedule s{1.0, 0.1, 4, Schedule::Cosine};  // of a 14-step run
  EXPECT_DOUBLE_EQ(lr_at(0, s, 14), 0.25);
  EXPECT_DOUBLE_EQ(lr_at(1, s, 14), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(3, s, 14), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(4, s, 14), 1.0);                        // decay starts at the top
  EXPECT_NEAR(lr_at(9, s, 14), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.5)), 1e-12);  // half-way: 0.55
  EXPECT_NEAR(lr_at(9, s, 14), 0.55, 1e-12);
  EXPECT_NEAR(lr_at(14, s, 14), 0.1, 1e-12);
  EXPECT_NEAR(lr_at(100, s, 14), 0.1, 1e-12);                    // stays at min_lr
  EXPECT_GT(lr_at(6, s, 14), lr_at(7, s, 14));

  s.kind = Schedule::Linear;
  EXPECT_NEAR(lr_at(9, s, 14), 0.55, 1e-12);
  EXPECT_NEAR(lr_at(6, s, 14), 1.0 - 0.9 * 0.2, 1e-12);
  s.kind = Schedule::Constant;
  EXPECT_DOUBLE_EQ(lr_at(2, s, 14), 0.75);
  EXPECT_DOUBLE_EQ(lr_at(50, s, 14), 1.0);

  LrSchedule no_warmup{2.0, 0.0, 0, Schedule::Cosine};  // of a 10-step run
  EXPECT_DOUBLE_EQ(lr_at(0, no_warmup, 10), 2.0);
  EXPECT_NEAR(lr_at(10, no_warmup, 10), 0.0, 1e-12);

  EXPECT_THROW(validate(LrSchedule{1.0, 2.0, 0, Schedule::Cosine}), Error);
  EXPECT_THROW(validate(LrSchedule{1.0, 0.0, -1, Schedule::Cosine}), Error);
  EXPECT_NO_THROW(validate(LrSchedule{1.0, 0.1, 4, Schedule::Linear}));
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

TEST(ClipGradNorm, OnePassCpuSumMatchesDoubleReferenceForAnyThreadCount) {
  // The CPU norm is one pass without temporaries (several blocks, a tail, a bf16 and a strided
  // tensor among the shards): it equals the norm of the same numbers taken in double by tensor ops
  // to double rounding, and its block order makes it the same bits for 1 and 2 threads.
  torch::manual_seed(5);
  std::vector<at::Tensor> grads = {torch::randn({(int64_t(1) << 17) + 37}) * 3, torch::randn({1000}).to(at::kBFloat16),
                                   torch::randn({64, 48}).t(), at::Tensor(), torch::zeros({0})};
  double reference = 0;
  for (const auto& g : grads)
    if (g.defined() && g.numel() > 0) reference += g.to(at::kDouble).pow(2).sum().item<double>();
  const int saved = at::get_num_threads();
  at::set_num_threads(1);
  const double one = global_grad_norm(grads, nullptr);
  at::set_num_threads(2);
  const double two = global_grad_norm(grads, nullptr);
  at::set_num_threads(saved);
  EXPECT_NEAR(one, std::sqrt(reference), 1e-12 * std::sqrt(reference));
  EXPECT_EQ(one, two);
}

TEST(AdamW, GradScaleEqualsClippingTheGradientsFirst) {
  // The trainer folds clipping into AdamW's pass (grad_scale = clip_coefficient): bit for bit the
  // same parameters and moments as clip_grad_norm's in-place scaling followed by a plain step, and
  // the gradients are left unscaled. Both the CPU loop and the tensor-op path.
  for (bool fused : {true, false}) {
    torch::manual_seed(6);
    auto [a, b] = twin_shards(5000, {{10, 3000}});
    AdamWOptions o;
    o.fused_cpu = fused;
    AdamW fa(o), fb(o);
    for (int i = 0; i < 3; ++i) {
      const at::Tensor g = torch::randn({5000}) * 5;
      std::vector<at::Tensor> clipped = {g.clone()};
      const double norm = clip_grad_norm(clipped, 1.0, nullptr);
      const float coef = static_cast<float>(clip_coefficient(norm, 1.0));
      ASSERT_LT(coef, 1.0f);
      a[0].grad = clipped[0];
      fa.step(a, 1e-2);
      b[0].grad = g.clone();
      fb.step(b, 1e-2, coef);
      EXPECT_TRUE(torch::equal(b[0].grad, g)) << "fused " << fused;
    }
    EXPECT_TRUE(torch::equal(a[0].param, b[0].param)) << "fused " << fused;
    EXPECT_TRUE(torch::equal(fa.state(a)[0].per_unit[0], fb.state(b)[0].per_unit[0])) << "fused " << fused;
  }
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_EQ(clip_coefficient(std::nan(""), 1.0), 1.0);
  EXPECT_EQ(clip_coefficient(10.0, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(clip_coefficient(9.0, 1.0), 1.0 / (9.0 + 1e-6));
}

}  // namespace test_optim
