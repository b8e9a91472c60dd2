// The activation formula of model/activations.h against the allocation tracker on real LibTorch
// forward and backward passes of one decoder layer and of the head.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>

#include "model/activations.h"
#include "model/llama.h"
#include "runtime/memory/tracker.h"

using namespace tessera;

namespace {

struct Measured {
  int64_t layer_saved, layer_fwd, layer_bwd, head_saved, head_fwd, head_bwd;
};

int64_t bytes(const torch::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

Measured measure(const model::LlamaConfig& cfg, int64_t B, int64_t T, torch::Dtype dtype) {
  memory::install();
  model::Llama m(cfg, torch::kCPU, dtype);
  model::init_weights(m, 7);
  torch::Tensor x = torch::randn({B, T, cfg.hidden_size}).to(dtype).requires_grad_(true);
  torch::Tensor g = torch::randn({B, T, cfg.hidden_size}).to(dtype);
  Measured r{};
  {
    memory::Scope scope(memory::Category::Activations);
    const int64_t before = memory::live().total();
    memory::reset_peak();
    torch::Tensor y = m->layer(0)->forward(x);
    const int64_t after = memory::live().total();
    r.layer_fwd = memory::peak().total() - after;
    r.layer_saved = after - before - bytes(y) + bytes(x);
    memory::reset_peak();
    const int64_t before_b = memory::live().total();
    y.backward(g);
    int64_t param_grads = 0;
    for (auto& [n, p] : m->layer_parameters(0)) param_grads += bytes(p.grad());
    r.layer_bwd = memory::peak().total() - before_b - param_grads;
  }
  {
    memory::Scope scope(memory::Category::Activations);
    torch::Tensor targets = torch::randint(cfg.vocab_size, {B, T}, torch::kLong);
    const int64_t before = memory::live().total();
    memory::reset_peak();
    torch::Tensor loss;
    {
      torch::Tensor logits = m->head(x);
      loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
                                                  targets.reshape({-1}));
    }
    const int64_t after = memory::live().total();
    r.head_fwd = memory::peak().total() - after;
    r.head_saved = after - before - bytes(loss) + bytes(x);
    memory::reset_peak();
    const int64_t before_b = memory::live().total();
    loss.backward();
    int64_t param_grads = 0;
    for (auto& [n, p] : m->root_parameters())
      if (p.grad().defined()) param_grads += bytes(p.grad());
    r.head_bwd = memory::peak().total() - before_b - param_grads - bytes(x.grad());
  }
  return r;
}

void check(const char* what, int64_t measured, int64_t formula, double tol) {
  std::printf("  %-12s measured %12ld formula %12ld  ratio %.3f\n", what, (long)measured, (long)formula,
              measured ? double(formula) / double(measured) : 0.0);
  EXPECT_NEAR(double(formula), double(measured), tol * double(measured)) << what;
}

}  // namespace

TEST(ActivationFormula, MatchesTrackedForwardAndBackward) {
  struct Case {
    const char* name;
    int64_t hidden, inter, heads, kv, B, T;
    torch::Dtype dtype;
  };
  const Case cases[] = {
      {"mha fp32", 256, 688, 8, 8, 2, 64, torch::kFloat},
      {"mha bf16", 256, 688, 8, 8, 2, 64, torch::kBFloat16},
      {"gqa bf16", 256, 688, 8, 2, 1, 128, torch::kBFloat16},
      {"gqa fp32 T256", 128, 344, 4, 2, 2, 256, torch::kFloat},
  };
  for (const Case& c : cases) {
    model::LlamaConfig cfg = model::LlamaConfig::preset("tiny");
    cfg.hidden_size = c.hidden;
    cfg.intermediate_size = c.inter;
    cfg.num_attention_heads = c.heads;
    cfg.num_key_value_heads = c.kv;
    cfg.num_hidden_layers = 1;
    cfg.vocab_size = 1000;
    const int elem = c.dtype == torch::kFloat ? 4 : 2;
    const auto f = model::llama_activation_bytes(cfg, c.B, c.T, elem, model::build_has_fused_attention());
    const Measured m = measure(cfg, c.B, c.T, c.dtype);
    std::printf("%s B=%ld T=%ld\n", c.name, (long)c.B, (long)c.T);
    check("layer saved", m.layer_saved, f.layer_saved, 0.01);
    check("layer fwd", m.layer_fwd, f.layer_forward_transient, 0.25);
    check("layer bwd", m.layer_bwd, f.layer_backward_transient, 0.25);
    check("head saved", m.head_saved, f.head_saved, 0.01);
    check("head fwd", m.head_fwd, f.head_forward_transient, 0.25);
    check("head bwd", m.head_bwd, f.head_backward_transient, 0.25);
  }
}
