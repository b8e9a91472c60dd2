// The activation formula of model/activations.h against the allocation tracker on real LibTorch
// forward and backward passes of one decoder layer and of the head: saved tensors to the byte (1%),
// transients as upper bounds. MHA and GQA, fp32 and bf16, T from 64 to 256, Qwen2's biases and
// Qwen3's q/k norms with a head_dim apart from hidden / heads.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>

#include "model/activations.h"
#include "model/fused_ops.h"
#include "util/torch_compat.h"
#include "model/llama.h"
#include "model/stacked_linear.h"
#include "runtime/memory/tracker.h"

namespace test_memory_model {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace tessera;

namespace {

struct Measured {
  int64_t layer_saved, layer_fwd, layer_bwd, head_saved, head_fwd, head_bwd;
};

int64_t bytes(const torch::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// Layer 0's parameters re-laid one after another in one buffer, as FSDP's gathered unit holds them
// (its q/k/v and gate/up products are then one product each: model/stacked_linear.h).
void lay_out_flat(model::Llama& m) {
  torch::NoGradGuard no_grad;
  auto params = m->layer_parameters(0);
  int64_t n = 0;
  for (auto& [name, p] : params) n += p.numel();
  torch::Tensor flat = torch::empty({n}, params[0].second.options());
  int64_t at = 0;
  for (auto& [name, p] : params) {
    torch::Tensor view = flat.narrow(0, at, p.numel()).view(p.sizes());
    view.copy_(p);
    p.set_data(view);
    at += p.numel();
  }
  const auto& attn = m->layer(0)->self_attn;
  ASSERT_EQ(model::ops::rows_adjacent({attn->q_proj->weight, attn->k_proj->weight, attn->v_proj->weight}),
            !attn->q_proj->bias.defined());
}

Measured measure(const model::ModelConfig& cfg, int64_t B, int64_t T, torch::Dtype dtype, bool flat) {
  memory::install();
  model::Llama m(cfg, torch::kCPU, dtype);
  model::init_weights(m, 7);
  if (flat) lay_out_flat(m);
  // The input is an intermediate of the graph (noise + a tiny leaf), made inside the measured
  // region and released by the test: whether autograd keeps it is part of what is measured.
  const torch::Tensor noise = torch::randn({B, T, cfg.hidden_size}).to(dtype);
  const torch::Tensor leaf = torch::zeros({1, 1, cfg.hidden_size}, dtype).requires_grad_(true);
  const torch::Tensor g = torch::randn({B, T, cfg.hidden_size}).to(dtype);
  auto grads_of = [](const model::NamedTensors& params) {
    int64_t n = 0;
    for (auto& [name, p] : params)
      if (p.grad().defined()) n += bytes(p.grad());
    return n;
  };
  Measured r{};
  {
    memory::Scope scope(memory::Category::Activations);
    const int64_t before = memory::live().total();
    memory::reset_peak();
    torch::Tensor x = noise + leaf;
    torch::Tensor y = m->layer(0)->forward(x);
    x = torch::Tensor();
    const int64_t after = memory::live().total();
    r.layer_fwd = memory::peak().total() - after;
    r.layer_saved = after - before - bytes(y);
    memory::reset_peak();
    const int64_t before_b = memory::live().total();
    y.backward(g);
    // What backward holds beyond the saved tensors it frees, less the gradients it leaves behind
    // (the engine counts a unit's gradients separately); never below 0 (the step's peak is then at
    // the start of backward).
    r.layer_bwd = std::max<int64_t>(
        0, memory::peak().total() - before_b - grads_of(m->layer_parameters(0)) - bytes(leaf.grad()));
  }
  leaf.mutable_grad() = torch::Tensor();
  {
    memory::Scope scope(memory::Category::Activations);
    torch::Tensor targets = torch::randint(cfg.vocab_size, {B, T}, torch::kLong);
    const int64_t before = memory::live().total();
    memory::reset_peak();
    torch::Tensor loss;
    {
      torch::Tensor x = noise + leaf;
      loss = m->head_loss(x, targets, -100);  // what the trainer runs: the fused head and loss
    }
    const int64_t after = memory::live().total();
    r.head_fwd = memory::peak().total() - after;
    r.head_saved = after - before - bytes(loss);
    memory::reset_peak();
    const int64_t before_b = memory::live().total();
    loss.backward();
    r.head_bwd = std::max<int64_t>(
        0, memory::peak().total() - before_b - grads_of(m->root_parameters()) - bytes(leaf.grad()));
  }
  return r;
}

// Saved tensors: exact (the formula counts them tensor by tensor; 1% covers the loss scalar and
// nll's bookkeeping). Transients: the formula is an upper bound of what the tracker sees.
void check_saved(const char* what, int64_t measured, int64_t formula) {
  std::printf("  %-12s measured %12ld formula %12ld  ratio %.3f\n", what, (long)measured, (long)formula,
              measured ? double(formula) / double(measured) : 0.0);
  EXPECT_NEAR(double(formula), double(measured), 0.01 * double(measured)) << what;
}
void check_bound(const char* what, int64_t measured, int64_t formula) {
  std::printf("  %-12s measured %12ld bound   %12ld\n", what, (long)measured, (long)formula);
  EXPECT_GE(formula, measured) << what;
}

}  // namespace

TEST(ActivationFormula, MatchesTrackedForwardAndBackward) {
  struct Case {
    const char* name;
    int64_t hidden, inter, heads, kv, B, T;
    torch::Dtype dtype;
    const char* preset = "tiny";  // tiny-qwen3: q/k norms and head_dim 48; tiny-qwen2: q/k/v biases
  };
  const Case cases[] = {
      {"mha fp32", 256, 688, 8, 8, 2, 64, torch::kFloat},
      {"mha bf16", 256, 688, 8, 8, 2, 64, torch::kBFloat16},
      {"gqa bf16", 256, 688, 8, 2, 1, 128, torch::kBFloat16},
      {"gqa fp32 T256", 128, 344, 4, 2, 2, 256, torch::kFloat},
      {"qwen3 fp32", 128, 344, 4, 2, 2, 64, torch::kFloat, "tiny-qwen3"},
      {"qwen3 bf16", 128, 344, 4, 2, 2, 64, torch::kBFloat16, "tiny-qwen3"},
      {"qwen2 bf16", 128, 344, 4, 2, 2, 64, torch::kBFloat16, "tiny-qwen2"},
  };
  for (const Case& c : cases) {
    model::ModelConfig cfg = model::ModelConfig::preset(c.preset);
    cfg.hidden_size = c.hidden;
    cfg.intermediate_size = c.inter;
    cfg.num_attention_heads = c.heads;
    cfg.num_key_value_heads = c.kv;
    cfg.num_hidden_layers = 1;
    cfg.vocab_size = 1000;
    const int elem = c.dtype == torch::kFloat ? 4 : 2;
    // The parameters as a plain model holds them (one tensor each) and as FSDP's gathered unit does
    // (q/k/v and gate/up one product each, v copied out of it: the same saved tensors, and the
    // concatenated output gradients stay below the backward's bound).
    for (bool flat : {false, true}) {
      const auto f = model::activation_bytes(cfg, c.B, c.T, elem, model::run_kernels(false));
      const Measured m = measure(cfg, c.B, c.T, c.dtype, flat);
      std::printf("%s B=%ld T=%ld%s\n", c.name, (long)c.B, (long)c.T, flat ? ", flat parameters" : "");
      check_saved("layer saved", m.layer_saved, f.layer_saved);
      check_saved("head saved", m.head_saved, f.head_saved);
      check_bound("layer fwd", m.layer_fwd, f.layer_forward_transient);
      check_bound("layer bwd", m.layer_bwd, f.layer_backward_transient);
      check_bound("head fwd", m.head_fwd, f.head_forward_transient);
      check_bound("head bwd", m.head_bwd, f.head_backward_transient);
    }
  }
}

// The one-kernel RMSNorm (Kernels::fused_norm, model/fused_ops.h) keeps its input and one fp32
// rstd per row -- measured here on its CPU reference, which autograd sees as the GPU's kernel -- and
// the formula counts that for each norm in place of the composite's fp32 form and normalised form.
TEST(ActivationFormula, FusedNormKeepsItsInputAndRstd) {
  memory::install();
  const int64_t B = 2, T = 64, H = 256;
  for (torch::Dtype dt : {torch::kBFloat16, torch::kFloat}) {
    const int p = dt == torch::kFloat ? 4 : 2;
    const torch::Tensor w = torch::ones({H}, dt);
    const torch::Tensor leaf = torch::zeros({1, 1, H}, dt).requires_grad_(true);
    const torch::Tensor noise = torch::randn({B, T, H}).to(dt);
    memory::Scope scope(memory::Category::Activations);
    const int64_t before = memory::live().total();
    torch::Tensor x = noise + leaf, y = model::ops::fused_rms_norm(x, w, 1e-5);
    x = torch::Tensor();
    const int64_t saved = memory::live().total() - before - bytes(y);
    EXPECT_EQ(saved, p * B * T * H + 4 * B * T) << "input and rstd";
  }
  model::ModelConfig cfg = model::ModelConfig::preset("tiny");
  model::Kernels plain, fused;
  fused.fused_norm = true;
  const int64_t BT = 2 * 128, H2 = cfg.hidden_size;
  const auto a = model::activation_bytes(cfg, 2, 128, 2, plain), f = model::activation_bytes(cfg, 2, 128, 2, fused);
  // bf16 on 1.13 (mean keeps x^2): each of the layer's two norms drops 4 BT H (fp32 form) + 4 BT H (x^2)
  // + 2 BT H (normalised) and keeps its input instead; the head's norm likewise.
  const int64_t sq = compat::kMeanSavesInput ? 4 * BT * H2 : 0;
  EXPECT_EQ(a.layer_saved - f.layer_saved, 2 * (4 * BT * H2 + sq + 2 * BT * H2) - 2 * 2 * BT * H2);
  EXPECT_EQ(a.head_saved - f.head_saved, 4 * BT * H2 + sq + 2 * BT * H2 - 2 * BT * H2);
  EXPECT_EQ(model::run_kernels(true).fused_norm, true);
  EXPECT_EQ(model::run_kernels(false).fused_norm, false);
  EXPECT_EQ(model::run_kernels(true, false, /*fused_kernels=*/false).fused_norm, false);  // model.fused_kernels = false
  EXPECT_EQ(model::run_kernels(true, false, false).fused_swiglu, false);
}

// The one-kernel SwiGLU (Kernels::fused_swiglu) keeps gate and up's one product only: measured on its
// CPU reference; the formula's mlp term is then 3 p BT I (with the product down_proj keeps).
TEST(ActivationFormula, FusedSwigluKeepsTheGateUpProductOnly) {
  memory::install();
  const int64_t BT = 96, I = 160;
  const torch::Tensor noise = torch::randn({BT, 2 * I}).to(torch::kBFloat16);
  const torch::Tensor leaf = torch::zeros({1, 2 * I}, torch::kBFloat16).requires_grad_(true);
  memory::Scope scope(memory::Category::Activations);
  const int64_t before = memory::live().total();
  torch::Tensor gu = noise + leaf, h = model::ops::fused_swiglu(gu);
  gu = torch::Tensor();
  EXPECT_EQ(memory::live().total() - before - bytes(h), 2 * BT * 2 * I);
  model::ModelConfig cfg = model::ModelConfig::preset("tiny");
  model::Kernels plain, fused;
  fused.fused_swiglu = true;
  EXPECT_EQ(model::activation_bytes(cfg, 2, 64, 2, plain).layer_saved - model::activation_bytes(cfg, 2, 64, 2, fused).layer_saved,
            2 * 2 * 64 * cfg.intermediate_size);
  EXPECT_TRUE(model::run_kernels(true).fused_swiglu);
  EXPECT_FALSE(model::run_kernels(false).fused_swiglu);
}

// GQA on the flash kernel (Kernels::gqa_attention: LibTorch >= 2.5 on a GPU) saves K and V at
// their own heads: a layer keeps 2 p BT (nh - nkv) D bytes less than with K and V repeated, and only
// in a 16-bit compute dtype without a sliding window (flash takes neither fp32 nor the window's mask).
// The GPU can only measure it; here, what the plan counts. The planner assumes it on a GPU build of
// that LibTorch for rows that are not packed (run_kernels).
TEST(ActivationFormula, GqaOnFlashKeepsKeysAndValuesAtTheirHeads) {
  model::ModelConfig cfg = model::ModelConfig::preset("tiny");
  cfg.num_attention_heads = 8;
  cfg.num_key_value_heads = 2;
  const int64_t B = 2, T = 128, D = cfg.head_dim();
  model::Kernels repeated, gqa;
  repeated.fused_attention = gqa.fused_attention = true;
  gqa.gqa_attention = true;
  const auto saved = [&](const model::Kernels& k, int p) { return model::activation_bytes(cfg, B, T, p, k).layer_saved; };
  EXPECT_EQ(saved(repeated, 2) - saved(gqa, 2), 2 * 2 * B * T * (8 - 2) * D);
  EXPECT_EQ(saved(repeated, 4), saved(gqa, 4));  // fp32: not the flash kernel
  cfg.sliding_window = 64;
  EXPECT_EQ(saved(repeated, 2), saved(gqa, 2));  // the window's mask: not the flash kernel
  EXPECT_FALSE(model::run_kernels(true, /*packed=*/true).gqa_attention);
  // Packed rows and sliding windows on the variable-length flash kernel (LibTorch >= 2.6 on a GPU)
  // keep K and V at their heads too, the window's rows included.
  EXPECT_EQ(model::run_kernels(true, /*packed=*/true).varlen_attention, compat::kHasFlashVarlen);
  EXPECT_FALSE(model::run_kernels(false, /*packed=*/true).varlen_attention);
  model::Kernels varlen = repeated;
  varlen.varlen_attention = true;
  EXPECT_EQ(saved(repeated, 2) - saved(varlen, 2), 2 * 2 * B * T * (8 - 2) * D);  // cfg has its window here
  EXPECT_EQ(saved(repeated, 4), saved(varlen, 4));  // fp32: not the flash kernel
  EXPECT_FALSE(model::run_kernels(false).gqa_attention);
  EXPECT_EQ(model::run_kernels(true).gqa_attention, compat::kHasSdpaGqa);
}

// The tracking allocator's reuse of large blocks (tracker.h): a freed block of >= 1 MiB serves the
// next allocation of exactly its size, and live + cached bytes never exceed the higher of the
// peak since reset_peak() and the peak of the window before it.
TEST(TrackerCache, ReusesLargeBlocksWithinThePeak) {
  memory::install();
  ASSERT_TRUE(memory::installed());
  memory::reuse_large_blocks(true);
  memory::reset_peak();
  memory::reset_peak();  // two empty windows: nothing may stay cached
  const int64_t MiB = 1 << 20;
  const memory::CacheStats s0 = memory::cache_stats();
  EXPECT_EQ(s0.cached_bytes, 0);
  void* first = nullptr;
  {
    at::Tensor a = at::empty({2 * MiB}, at::kByte);
    first = a.data_ptr();
  }
  EXPECT_EQ(memory::cache_stats().cached_bytes, 2 * MiB);
  {
    at::Tensor b = at::empty({2 * MiB}, at::kByte);  // the same size: the same block
    EXPECT_EQ(b.data_ptr(), first);
    EXPECT_EQ(memory::cache_stats().hits, s0.hits + 1);
    EXPECT_EQ(memory::cache_stats().cached_bytes, 0);
  }
  {
    at::Tensor c = at::empty({3 * MiB}, at::kByte);  // a new peak: keeping the 2 MiB would exceed it
    EXPECT_EQ(memory::cache_stats().cached_bytes, 0);
  }
  EXPECT_EQ(memory::cache_stats().cached_bytes, 3 * MiB);
  {
    at::Tensor d = at::empty({MiB}, at::kByte);  // 1 + 3 cached > the 3 MiB peak: the 3 MiB block goes
    EXPECT_EQ(memory::cache_stats().cached_bytes, 0);
    at::Tensor e = at::empty({1000}, at::kByte);  // small blocks come from the heap, never cached
  }
  EXPECT_EQ(memory::cache_stats().cached_bytes, MiB);
  EXPECT_EQ(memory::cache_stats().evicted, s0.evicted + 2);
  // A new window (the next training step) keeps what the last one's peak covers ...
  memory::reset_peak();
  EXPECT_EQ(memory::cache_stats().cached_bytes, MiB);
  {
    at::Tensor g = at::empty({MiB}, at::kByte);  // ... and serves its first allocation of that size
    EXPECT_EQ(memory::cache_stats().hits, s0.hits + 2);
    EXPECT_EQ(memory::cache_stats().cached_bytes, 0);
  }
  EXPECT_EQ(memory::cache_stats().cached_bytes, MiB);
  // This window's peak was the 1 MiB alone above what was live: the next window keeps it; a window
  // that ends with nothing above what is live lets the one after it keep nothing.
  memory::reset_peak();
  EXPECT_EQ(memory::cache_stats().cached_bytes, MiB);
  memory::reset_peak();
  EXPECT_EQ(memory::cache_stats().cached_bytes, 0);
  // A block up to 1/8 larger serves an allocation, charged whole; the shard state takes exact sizes.
  const int64_t asked = 2 * MiB - 64 * 1024;
  { at::Tensor big = at::empty({2 * MiB}, at::kByte); }
  EXPECT_EQ(memory::cache_stats().cached_bytes, 2 * MiB);
  {
    const memory::CacheStats before = memory::cache_stats();
    const int64_t live = memory::live().total();
    at::Tensor a = at::empty({asked}, at::kByte);  // activations: the larger block, charged whole
    EXPECT_EQ(memory::cache_stats().hits, before.hits + 1);
    EXPECT_EQ(memory::live().total() - live, 2 * MiB);
    EXPECT_EQ(memory::cache_stats().cached_bytes, 0);
  }
  EXPECT_EQ(memory::cache_stats().cached_bytes, 2 * MiB);
  {  // with the 2 MiB block cached
    memory::Scope master(memory::Category::Master);
    const memory::CacheStats before = memory::cache_stats();
    const int64_t live = memory::live().total();
    at::Tensor m = at::empty({asked}, at::kByte);
    EXPECT_EQ(memory::cache_stats().hits, before.hits);
    EXPECT_EQ(memory::live().total() - live, asked);
  }
  memory::reset_peak();
  memory::reset_peak();
  { at::Tensor big = at::empty({2 * MiB}, at::kByte); }
  {
    const memory::CacheStats before = memory::cache_stats();
    at::Tensor b = at::empty({MiB + 1}, at::kByte);  // the 2 MiB block is more than 1/8 above
    EXPECT_EQ(memory::cache_stats().hits, before.hits);
    EXPECT_EQ(memory::cache_stats().misses, before.misses + 1);
  }
  memory::reset_peak();
  memory::reset_peak();
  memory::reuse_large_blocks(false);
  {
    at::Tensor f = at::empty({2 * MiB}, at::kByte);
  }
  EXPECT_EQ(memory::cache_stats().cached_bytes, 0);
}

}  // namespace test_memory_model
