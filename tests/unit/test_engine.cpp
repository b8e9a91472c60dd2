// The FSDP Engine in one process (self communicators, no MPI): a three-unit toy model (a root
// matrix and two decoder "layers") run through the engine gives the loss and the gradients of the
// same model computed by plain LibTorch autograd, with and without activation checkpointing; the
// shards hold the parameters at their ShardPlan offsets and weight decay covers exactly the
// parameters the decay rule names.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/fsdp/fsdp.h"
#include "tests/support/forwarding_comm.h"

namespace test_engine {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

namespace {

using namespace tessera;

struct Values {
  torch::Tensor w0, w1, b1, w2;
};

Values random_values() {
  torch::manual_seed(7);
  return {torch::randn({5, 6}), torch::randn({6, 6}) * 0.5, torch::randn({6}), torch::randn({6, 4}) * 0.5};
}

torch::Tensor layer(int64_t i, const torch::Tensor& h, const torch::Tensor& w1, const torch::Tensor& b1,
                    const torch::Tensor& w2) {
  return i == 0 ? torch::tanh(h.matmul(w1) + b1) : torch::tanh(h.matmul(w2));
}

// The toy model through the engine: parameters on the meta device, as the trainer builds models;
// weight decay on every weight, no bias.
struct ToyEngine {
  torch::Tensor w0 = meta({5, 6}), w1 = meta({6, 6}), b1 = meta({6}), w2 = meta({6, 4});
  std::unique_ptr<fsdp::Engine> engine;
  ToyEngine(const fsdp::Options& opts, comm::CommPtr world) {
    std::vector<fsdp::UnitDef> units = {{"root", {{"root.w", w0}}},
                                        {"layer0", {{"layer0.w", w1}, {"layer0.b", b1}}},
                                        {"layer1", {{"layer1.w", w2}}}};
    comm::ProcessGroups groups{std::move(world), comm::make_self_communicator("intra"), comm::make_self_communicator("inter")};
    auto run = [w1 = w1, b1 = b1, w2 = w2](int64_t i, const torch::Tensor& in) { return layer(i, in, w1, b1, w2); };
    engine = std::make_unique<fsdp::Engine>(units, run, groups, opts,
                                            [](const std::string& name) { return name.find(".b") == std::string::npos; });
  }
  static torch::Tensor meta(std::vector<int64_t> shape) {
    return torch::empty(shape, torch::TensorOptions().device(torch::kMeta)).requires_grad_();
  }
};

void check_against_autograd(bool checkpointing) {
  SCOPED_TRACE(checkpointing ? "activation checkpointing" : "no checkpointing");
  const Values v = random_values();
  const torch::Tensor x = torch::randn({3, 5});

  // Reference: the same model with ordinary leaf tensors.
  Values ref{v.w0.clone().requires_grad_(), v.w1.clone().requires_grad_(), v.b1.clone().requires_grad_(),
             v.w2.clone().requires_grad_()};
  torch::Tensor h = x.matmul(ref.w0);
  for (int64_t i = 0; i < 2; ++i) h = layer(i, h, ref.w1, ref.b1, ref.w2);
  const torch::Tensor ref_loss = h.pow(2).sum();
  ref_loss.backward();

  fsdp::Options opts;
  opts.activation_checkpointing = checkpointing;
  ToyEngine toy(opts, comm::make_self_communicator("world"));
  fsdp::Engine& engine = *toy.engine;
  const torch::Tensor& w0 = toy.w0;
  ASSERT_EQ(engine.num_layers(), 2);
  const std::vector<std::vector<torch::Tensor>> values = {{v.w0}, {v.w1, v.b1}, {v.w2}};
  ASSERT_EQ(engine.shards().size(), values.size());
  for (size_t u = 0; u < values.size(); ++u) {
    const fsdp::UnitShard& s = engine.shards()[u];
    ASSERT_EQ(s.plan.world, 1);
    for (size_t p = 0; p < values[u].size(); ++p)
      s.master.narrow(0, s.plan.params[p].offset, s.plan.params[p].numel).copy_(values[u][p].flatten());
  }
  // Decay: every weight, no bias (layer0.b sits after layer0.w's 36 elements, aligned to 16).
  EXPECT_EQ(engine.shards()[1].decay, (std::vector<std::pair<int64_t, int64_t>>{{0, 36}}));
  EXPECT_EQ(engine.shards()[1].plan.params[1].offset, 48);

  engine.begin_forward(true);
  torch::Tensor e = x.matmul(w0);
  for (int64_t i = 0; i < 2; ++i) e = engine.run_layer(i, e);
  const torch::Tensor loss = e.pow(2).sum();
  loss.backward();
  engine.finish_backward();
  EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 1e-5);

  const std::vector<std::vector<torch::Tensor>> grads = {{ref.w0.grad()}, {ref.w1.grad(), ref.b1.grad()}, {ref.w2.grad()}};
  for (size_t u = 0; u < grads.size(); ++u) {
    const fsdp::UnitShard& s = engine.shards()[u];
    ASSERT_TRUE(s.grad.defined()) << s.name;
    for (size_t p = 0; p < grads[u].size(); ++p) {
      const torch::Tensor got = s.grad.narrow(0, s.plan.params[p].offset, s.plan.params[p].numel);
      EXPECT_TRUE(torch::allclose(got, grads[u][p].flatten(), 1e-5, 1e-6)) << s.plan.params[p].name;
    }
  }
  engine.after_step();
  // A parameter gathered back is the value loaded into its shard.
  EXPECT_TRUE(torch::equal(engine.gather_param(1, 1).flatten(), v.b1));
}

TEST(Engine, OneProcessMatchesPlainAutograd) {
  check_against_autograd(false);
  check_against_autograd(true);
}

// The engine's all-gathers, told apart: in place (the input is this rank's chunk of the output) or
// from a buffer of their own.
class GatherWatch : public test::ForwardingComm {
 public:
  using ForwardingComm::ForwardingComm;
  int in_place = 0, from_buffer = 0;
  comm::WorkPtr all_gather_into(at::Tensor out, at::Tensor in) override {
    const char* own = static_cast<const char*>(out.data_ptr()) + rank() * in.numel() * out.element_size();
    ++(in.data_ptr() == own ? in_place : from_buffer);
    return inner_->all_gather_into(out, in);
  }
};

// Gathers of one forward and backward (full_shard: the backward gathers again) of the toy model
// with the engine's parameters in `dtype`.
std::pair<int, int> gathers(at::ScalarType dtype, fsdp::Offload offload) {  // in place, from a buffer
  auto watch = std::make_shared<GatherWatch>(comm::make_self_communicator("world"));
  fsdp::Options opts;
  opts.param_dtype = dtype;
  opts.offload = offload;
  ToyEngine toy(opts, watch);
  fsdp::Engine& engine = *toy.engine;
  for (const fsdp::UnitShard& s : engine.shards()) s.master.normal_();
  engine.begin_forward(true);
  torch::Tensor e = torch::randn({3, 5}).to(dtype).matmul(toy.w0);
  for (int64_t i = 0; i < 2; ++i) e = engine.run_layer(i, e);
  e.to(torch::kFloat).pow(2).sum().backward();
  engine.finish_backward();
  return {watch->in_place, watch->from_buffer};
}

TEST(Engine, GathersInPlaceFromTheShardsCast) {
  // In the compute dtype (bf16) the master's cast -- under params offload the shard's copy from the
  // host -- is written into this rank's slot of the gathered buffer and gathered in place: no
  // buffer of its own, and at world size 1 no copy. fp32 gathers the master itself.
  for (fsdp::Offload offload : {fsdp::Offload::None, fsdp::Offload::Params}) {
    const auto [in_place, from_buffer] = gathers(at::kBFloat16, offload);
    EXPECT_GE(in_place, 3);  // root + two layers
    EXPECT_EQ(from_buffer, 0);
  }
  const auto [in_place, from_buffer] = gathers(at::kFloat, fsdp::Offload::None);
  EXPECT_EQ(in_place, 0);
  EXPECT_GE(from_buffer, 3);
}

TEST(Engine, OneRankKeepsUnitsGatheredFromForwardToBackward) {
  // full_shard over one rank: the layers' gathered parameters are the master's cast, kept for
  // backward (root + two layers: 3 gathers); under params offload they are freed after forward and
  // gathered again for backward (5), as over several ranks.
  EXPECT_EQ(gathers(at::kBFloat16, fsdp::Offload::None).first, 3);
  EXPECT_EQ(gathers(at::kBFloat16, fsdp::Offload::Params).first, 5);
  using fsdp::Offload, fsdp::Strategy;
  EXPECT_FALSE(fsdp::regathers_for_backward(Strategy::FullShard, 1, Offload::None, false));
  EXPECT_TRUE(fsdp::regathers_for_backward(Strategy::FullShard, 2, Offload::None, false));
  EXPECT_TRUE(fsdp::regathers_for_backward(Strategy::HybridShard, 1, Offload::Optimizer, false));
  EXPECT_TRUE(fsdp::regathers_for_backward(Strategy::FullShard, 1, Offload::None, /*frozen_groups=*/true));
  EXPECT_FALSE(fsdp::regathers_for_backward(Strategy::ShardGradOp, 4, Offload::None, false));
}

}  // namespace

}  // namespace test_engine
