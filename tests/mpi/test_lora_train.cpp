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
#include "runtime/quant/nf4_storage.h"
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

// NF4 as the QLoRA paper defines it, written here apart from runtime/quant: the flattened weight in
// blocks of 64 (the last one padded with zeros), each scaled by its absmax onto the 16 NormalFloat
// values, each value replaced by the nearest code, times the block's absmax again.
torch::Tensor nf4_round_trip(const torch::Tensor& w) {
  static const std::vector<float> code = {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
                                          -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
                                          0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f,
                                          0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,
                                          0.7229568362236023f, 1.0f};
  const int64_t n = w.numel(), padded = (n + 63) / 64 * 64;
  torch::Tensor x = torch::zeros({padded}, torch::kFloat32);
  x.narrow(0, 0, n).copy_(w.reshape(-1));
  const torch::Tensor blocks = x.view({-1, 64});
  const torch::Tensor absmax = blocks.abs().amax(1, true);
  const torch::Tensor scaled = blocks / torch::where(absmax > 0, absmax, torch::ones_like(absmax));
  const torch::Tensor table = torch::tensor(code);
  const torch::Tensor nearest = (scaled.unsqueeze(-1) - table).abs().argmin(-1);
  return (table.index({nearest}) * absmax).reshape(-1).narrow(0, 0, n).view(w.sizes());
}

// QLoRA's base (lora.base_dtype nf4): which weights are quantized (ModelSpec::lora_targets' Linears
// of the decoder layers) and which keep the compute dtype.
bool quantized(const model::ModelConfig& cfg, const std::string& name) {
  return lora::quantized_weight(name, cfg.spec().lora_targets(cfg));
}

Reference reference_run(const model::ModelConfig& cfg, const lora::Options& lo, const train::Settings& t, int world) {
  auto m = cfg.spec().build(cfg, torch::kCPU);
  model::init_weights(*m, kBaseSeed);
  if (lo.quantized()) {  // QLoRA trains on the base's NF4 values
    torch::NoGradGuard no_grad;
    for (auto& [name, p] : m->named_hf_parameters())
      if (quantized(cfg, name)) p.copy_(nf4_round_trip(p));
  }
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

// QLoRA: the decoder's seven projections are stored as NF4 (each weight in its own blocks, at every
// world size), everything else of the base in the compute dtype, bit for bit; and the run's losses
// and adapters equal the reference's trained on the NF4 round trip of the base.
TEST(QLoraTrain, ProjectionsNf4RestExactAndMatchesReference) {
  const auto cfg = test_config();
  auto lo = lora_options();
  lo.base_dtype = "nf4";
  const auto t = settings();
  const int W = test::world_groups().world->size();
  const Reference ref = reference_run(cfg, lo, t, W);
  fsdp::Options fo;
  fo.quantized_storage = quant::nf4_storage(false);
  train::Trainer tr(launcher::make_causal_lm(cfg, lo), test::world_groups(), fo, t, dataset(), {});
  load(tr, cfg, t);
  int nf4 = 0, exact = 0;
  const auto& groups = tr.engine().frozen_shards();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t k = 0; k < groups[g].plan.params.size(); ++k) {
      const auto& slot = groups[g].plan.params[k];
      const torch::Tensor got = tr.engine().gather_frozen(static_cast<int>(g), static_cast<int>(k));
      const torch::Tensor init = model::init_tensor({slot.name, slot.shape}, kBaseSeed);
      const bool q = quantized(cfg, slot.name);
      EXPECT_EQ(groups[g].storage->name(), q ? "nf4" : "fp32") << slot.name;
      const torch::Tensor want = q ? nf4_round_trip(init) : init;
      EXPECT_LE((got - want).abs().max().item<double>(), 1e-6 * init.abs().max().item<double>()) << slot.name;
      (q ? nf4 : exact) += 1;
    }
  }
  EXPECT_EQ(nf4, 7 * cfg.num_hidden_layers) << "every projection weight of every layer, targeted or not";
  EXPECT_GT(exact, 2 * cfg.num_hidden_layers) << "norms, embeddings and the head";
  for (int s = 0; s < t.train.steps; ++s) {
    const double loss = tr.train_step().loss;
    EXPECT_NEAR(loss, ref.losses[s], 1e-5 * std::abs(ref.losses[s])) << "step " << s << " W=" << W;
  }
  for (const auto& [name, got] : gathered_adapters(tr.engine())) {
    const auto& want = ref.adapters.at(name);
    EXPECT_LE((got - want).norm().item<double>() / want.norm().item<double>(), 1e-5) << name;
  }
}

// lora.dropout applies in training only: validation (and eval, generation) run the model in
// evaluation mode, as PEFT under model.eval(), so two evaluations agree and sequence_losses too.
TEST(LoraTrain, EvaluationHasNoDropout) {
  const auto cfg = test_config();
  auto lo = lora_options();
  lo.dropout = 0.5;
  const auto t = settings();
  fsdp::Options fo;
  fo.preserve_rng = true;
  train::Trainer tr(launcher::make_causal_lm(cfg, lo), test::world_groups(), fo, t, dataset(), {});
  load(tr, cfg, t);
  for (int s = 0; s < 2; ++s) tr.train_step();  // B != 0: the adapters' input matters now
  tr.set_validation(dataset());
  const double first = tr.evaluate().loss;
  EXPECT_EQ(tr.evaluate().loss, first);
  const torch::Tensor row = dataset()->batch({0}).inputs;
  EXPECT_EQ(tr.sequence_losses(row), tr.sequence_losses(row));
  EXPECT_EQ(tr.evaluate().loss, first) << "training mode is back only for training";
}

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
