// LoRA under FSDP against an independent single-process reference: a plain LibTorch Llama with
// the same adapters (ModelSpec::add_lora), its base weights frozen (requires_grad false), trained
// with torch::optim::AdamW and clip_grad_norm_ over the adapters only, on the same global batches.
// Runs at np 1, 2 and 4: the losses and the adapters match, the frozen base's stored bytes do not
// change, the first loss is the base model's (B = 0), and a resume from an adapter-only checkpoint
// continues bit for bit.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>

#include "launcher/model_lm.h"
#include "model/llama.h"
#include "model/lora.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/data/sampler.h"
#include "runtime/optim/schedule.h"
#include "runtime/train/trainer.h"
#include "tests/support/train_support.h"

namespace test_lora_train {

using namespace tessera;
namespace fs = std::filesystem;

constexpr uint64_t kBaseSeed = 1234;

model::ModelConfig test_config() { return test::tiny_model(3); }

lora::Options lora_options() {
  lora::Options o;
  o.rank = 4;
  o.alpha = 16;
  o.targets = {"q_proj", "v_proj", "o_proj", "down_proj"};
  return o;
}

std::shared_ptr<data::TokenDataset> dataset() {
  static const std::string text = [] {
    std::string out;
    for (int i = 0; i < 300; ++i) out += "row " + std::to_string(i * 37 % 500) + ": adapters on a frozen base\n";
    return out;
  }();
  return test::dataset_of("lora.txt", text, test::kSeqLen);
}

train::Settings settings() {
  train::Settings t = test::short_run();
  t.train.micro_batch = 2;
  t.optim.weight_decay = 0.1;
  t.optim.clip = 0.05;  // small enough to clip
  t.optim.eps = 1e-3;
  t.schedule.lr = 1e-2;
  return t;
}

// The run's weights as `tessera train` loads them: the base from the preset's seed, the adapters
// from PEFT's initialisation with the run's train.seed.
void load(train::Trainer& tr, const model::ModelConfig& cfg, const train::Settings& t) {
  launcher::InitWeightSource base(cfg, kBaseSeed);
  launcher::AdapterInitSource src(&base, static_cast<uint64_t>(t.train.seed));
  tr.load_weights(src);
}

struct Reference {
  std::vector<double> losses;
  std::map<std::string, torch::Tensor> adapters;
};

Reference reference_run(const model::ModelConfig& cfg, const lora::Options& lo, const train::Settings& t, int world) {
  auto m = cfg.spec().build(cfg, torch::kCPU);
  model::init_weights(*m, kBaseSeed);
  cfg.spec().add_lora(*m, lo);
  std::vector<torch::Tensor> adapters;
  for (auto& [name, p] : m->named_hf_parameters()) {
    torch::NoGradGuard no_grad;
    if (lora::is_adapter(name)) {
      p.copy_(lora::init_adapter(name, p.sizes().vec(), static_cast<uint64_t>(t.train.seed)));
      adapters.push_back(p);
    } else {
      p.set_requires_grad(false);
    }
  }
  torch::optim::AdamW opt(adapters, torch::optim::AdamWOptions(t.schedule.lr).betas({t.optim.beta1, t.optim.beta2})
                                        .eps(t.optim.eps).weight_decay(t.optim.weight_decay));
  auto ds = dataset();
  data::DistributedSampler sampler(ds->num_sequences(), 1, 0, static_cast<int>(t.train.micro_batch),
                                   static_cast<int>(t.train.grad_accum * world), t.train.seed);
  Reference ref;
  for (int64_t step = 0; step < t.train.steps; ++step) {
    opt.zero_grad();
    std::vector<data::Batch> batches;
    int64_t targets = 0;
    for (int64_t a = 0; a < t.train.grad_accum * world; ++a) {
      batches.push_back(ds->batch(sampler.micro_batch(step, static_cast<int>(a))));
      targets += batches.back().targets;
    }
    double loss_sum = 0;
    namespace F = torch::nn::functional;
    for (const auto& b : batches) {
      auto logits = m->forward(b.inputs, b.packed ? model::TokenLayout{b.position_ids, b.document_ids} : model::TokenLayout{});
      auto loss = F::cross_entropy(logits.reshape({-1, logits.size(-1)}), b.labels.reshape({-1}),
                                   F::CrossEntropyFuncOptions().ignore_index(data::Batch::kIgnore).reduction(torch::kSum));
      (loss / static_cast<double>(targets)).backward();
      loss_sum += loss.item<double>();
    }
    torch::nn::utils::clip_grad_norm_(adapters, t.optim.clip);
    for (auto& g : opt.param_groups())
      static_cast<torch::optim::AdamWOptions&>(g.options()).lr(optim::lr_at(step, t.schedule, t.train.steps));
    opt.step();
    ref.losses.push_back(loss_sum / static_cast<double>(targets));
  }
  for (auto& [name, p] : m->named_hf_parameters())
    if (lora::is_adapter(name)) ref.adapters[name] = p.detach().clone();
  return ref;
}

// Every trainable parameter of the engine (the adapters), gathered.
std::map<std::string, torch::Tensor> gathered_adapters(fsdp::Engine& eng) {
  std::map<std::string, torch::Tensor> out;
  for (size_t u = 0; u < eng.shards().size(); ++u)
    for (size_t k = 0; k < eng.shards()[u].plan.params.size(); ++k)
      out[eng.shards()[u].plan.params[k].name] = eng.gather_param(static_cast<int>(u), static_cast<int>(k));
  return out;
}

std::vector<torch::Tensor> frozen_bytes(fsdp::Engine& eng) {
  std::vector<torch::Tensor> out;
  for (const auto& fz : eng.frozen_shards()) out.push_back(fz.stored.defined() ? fz.stored.clone() : torch::Tensor());
  return out;
}

comm::ProcessGroups groups_for(fsdp::Strategy s) {
  comm::ProcessGroups g = test::world_groups();
  const int W = g.world->size(), r = g.world->rank();
  if (s == fsdp::Strategy::HybridShard && W >= 4) {
    g.intra = g.world->split(r / (W / 2), r, "intra");
    g.inter = g.world->split(r % (W / 2), r, "inter");
  }
  return g;
}

class LoraEquivalence : public ::testing::TestWithParam<std::string> {};

TEST_P(LoraEquivalence, MatchesSingleProcessReference) {
  const auto cfg = test_config();
  const auto lo = lora_options();
  const auto t = settings();
  const int W = test::world_groups().world->size();
  static const Reference ref = reference_run(cfg, lo, t, W);
  for (const bool ac : {false, true}) {
    fsdp::Options fo;
    fo.strategy = fsdp::parse_strategy(GetParam());
    fo.activation_checkpointing = ac;
    train::Trainer tr(launcher::make_causal_lm(cfg, lo), groups_for(fo.strategy), fo, t, dataset(), {});
    load(tr, cfg, t);
    const auto base_before = frozen_bytes(tr.engine());
    std::vector<double> losses;
    for (int s = 0; s < t.train.steps; ++s) losses.push_back(tr.train_step().loss);
    const std::string what = GetParam() + (ac ? " +AC" : "") + " W=" + std::to_string(W);
    for (size_t i = 0; i < losses.size(); ++i)
      EXPECT_NEAR(losses[i], ref.losses[i], 1e-5 * std::abs(ref.losses[i])) << what << " step " << i;
    const auto got = gathered_adapters(tr.engine());
    ASSERT_EQ(got.size(), ref.adapters.size()) << what << ": the trainable parameters are the adapters";
    for (const auto& [name, want] : ref.adapters) {
      ASSERT_TRUE(got.count(name)) << what << ": " << name;
      const double err = (got.at(name) - want).norm().item<double>() / want.norm().item<double>();
      EXPECT_LE(err, 1e-5) << what << ": " << name;
    }
    EXPECT_GT(got.at("model.layers.0.self_attn.q_proj.lora_B.weight").abs().max().item<double>(), 1e-4) << what;
    const auto base_after = frozen_bytes(tr.engine());
    for (size_t u = 0; u < base_after.size(); ++u) {
      ASSERT_TRUE(base_after[u].defined()) << what << ": unit " << u << " has a frozen base";
      EXPECT_TRUE(base_after[u].equal(base_before[u])) << what << ": the base of unit " << u << " changed";
    }
    // The frozen base is the model's: one of its tensors, gathered and decoded, is its initial value.
    const auto w = tr.engine().gather_frozen(1, 0);
    EXPECT_TRUE(w.equal(model::init_tensor({tr.engine().frozen_shards()[1].plan.params[0].name, w.sizes().vec()}, kBaseSeed)));
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, LoraEquivalence, ::testing::Values("full_shard", "no_shard", "hybrid_shard"));

// B = 0 at the start: the first step's loss is the base model's (full fine-tuning's first loss).
TEST(LoraTrain, FirstLossIsTheBaseModels) {
  const auto cfg = test_config();
  const auto t = settings();
  train::Trainer full(launcher::make_causal_lm(cfg), test::world_groups(), {}, t, dataset(), {});
  test::init_weights(full, cfg, kBaseSeed);
  train::Trainer adapted(launcher::make_causal_lm(cfg, lora_options()), test::world_groups(), {}, t, dataset(), {});
  load(adapted, cfg, t);
  EXPECT_EQ(adapted.train_step().loss, full.train_step().loss);
}

// Adapter-only checkpoints: what is saved is the adapters and their moments (never the base), and
// a resume continues bit for bit.
TEST(LoraTrain, AdapterOnlyCheckpointResumesBitExact) {
  const auto cfg = test_config();
  const auto lo = lora_options();
  test::SharedTempDir dir("tessera-lora-ckpt");
  auto t = settings();
  t.checkpoint.dir = dir.str();
  std::vector<double> straight, resumed;
  {
    train::Trainer tr(launcher::make_causal_lm(cfg, lo), test::world_groups(), {}, t, dataset(), {});
    load(tr, cfg, t);
    for (int s = 0; s < t.train.steps; ++s) {
      straight.push_back(tr.train_step().loss);
      if (s == 1) tr.save_checkpoint();
    }
  }
  const std::string ckpt = checkpoint::latest(dir.str());
  const checkpoint::Reader r(ckpt);
  int64_t stored = 0, adapter_elems = 0;
  for (const auto& te : r.tensors()) {
    EXPECT_TRUE(lora::is_adapter(te.name)) << te.name << " (" << te.kind << ") is not an adapter";
    if (te.kind == checkpoint::kParamKind) adapter_elems += te.numel;
  }
  for (const auto& f : r.files()) stored += static_cast<int64_t>(f.bytes);
  EXPECT_GT(adapter_elems, 0);
  // The goal: < 2 x (adapter bytes + their optimizer state: fp32 value and two fp32 moments).
  EXPECT_LT(stored, 2 * adapter_elems * 4 * 3);
  {
    train::Trainer tr(launcher::make_causal_lm(cfg, lo), test::world_groups(), {}, t, dataset(), {});
    load(tr, cfg, t);  // the base (and initial adapters), then the checkpoint's adapters over them
    EXPECT_EQ(tr.resume(ckpt), 2);
    for (int s = 2; s < t.train.steps; ++s) resumed.push_back(tr.train_step().loss);
  }
  for (size_t i = 0; i < resumed.size(); ++i) EXPECT_EQ(resumed[i], straight[i + 2]) << "step " << i + 2;
}

}  // namespace test_lora_train
