// ops::linear_cross_entropy (the head and its loss fused, model/linear_cross_entropy.h) against the
// unfused reference: cross_entropy(x W^T) with LibTorch's own ops and autograd. Loss and both
// gradients, several chunks, ignored rows, bf16, a scaled backward; the logits never held whole;
// Llama's head_loss (tied and untied) against head() + cross_entropy.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "model/activations.h"
#include "model/linear_cross_entropy.h"
#include "model/llama.h"
#include "runtime/memory/tracker.h"
#include "runtime/profile/op_count.h"
#include "runtime/profile/step_profile.h"

namespace tessera {
namespace {

namespace F = torch::nn::functional;
constexpr int64_t kIgnore = -100;

double rel_err(const torch::Tensor& got, const torch::Tensor& want) {
  return (got.to(torch::kDouble) - want.to(torch::kDouble)).norm().item<double>() /
         std::max(1e-30, want.to(torch::kDouble).norm().item<double>());
}

torch::Tensor reference_loss(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& labels) {
  return F::cross_entropy(torch::mm(x, w.t()).to(torch::kFloat), labels,
                          F::CrossEntropyFuncOptions().ignore_index(kIgnore).reduction(torch::kSum));
}

struct Case {
  int64_t N, H, V, chunk;
  double ignored;  // fraction of rows labelled kIgnore
  torch::Dtype dtype;
  double tol;
};

void check(const Case& c) {
  torch::manual_seed(7);
  const torch::Tensor x0 = torch::randn({c.N, c.H}).to(c.dtype), w0 = (0.5 * torch::randn({c.V, c.H})).to(c.dtype);
  torch::Tensor labels = torch::randint(0, c.V, {c.N}, torch::kLong);
  labels.masked_fill_(torch::rand({c.N}) < c.ignored, kIgnore);
  const double scale = 0.37;  // backward must multiply by the incoming gradient

  torch::Tensor xr = x0.clone().requires_grad_(true), wr = w0.clone().requires_grad_(true);
  const torch::Tensor want = reference_loss(xr, wr, labels);
  (want * scale).backward();

  torch::Tensor xf = x0.clone().requires_grad_(true), wf = w0.clone().requires_grad_(true);
  const torch::Tensor got = model::ops::linear_cross_entropy(xf, wf, labels, kIgnore, c.chunk);
  EXPECT_EQ(got.dim(), 0);
  EXPECT_EQ(got.scalar_type(), torch::kFloat);
  (got * scale).backward();

  const std::string what = "N " + std::to_string(c.N) + " V " + std::to_string(c.V) + " chunk " +
                           std::to_string(c.chunk) + " " + std::string(c10::toString(c.dtype));
  EXPECT_NEAR(got.item<double>(), want.item<double>(), c.tol * std::abs(want.item<double>()) + 1e-6) << what;
  ASSERT_TRUE(xf.grad().defined() && wf.grad().defined()) << what;
  EXPECT_EQ(xf.grad().scalar_type(), c.dtype);
  EXPECT_EQ(wf.grad().scalar_type(), c.dtype);
  EXPECT_LE(rel_err(xf.grad(), xr.grad()), c.tol) << what << ": dL/dx";
  EXPECT_LE(rel_err(wf.grad(), wr.grad()), c.tol) << what << ": dL/dW";
  // Ignored rows get exactly zero gradient.
  const torch::Tensor ignored = labels == kIgnore;
  if (ignored.any().item<bool>()) {
    EXPECT_EQ(xf.grad().index({ignored}).abs().max().item<double>(), 0.0) << what;
  }
}

TEST(LinearCrossEntropy, MatchesUnfusedFp32) {
  check({37, 16, 50, 0, 0.0, torch::kFloat, 2e-6});  // one chunk
  check({100, 8, 29, 7, 0.3, torch::kFloat, 2e-6});  // 15 chunks, the last one short, ignored rows
  check({64, 12, 40, 64, 0.0, torch::kFloat, 2e-6});  // chunk == N
}

TEST(LinearCrossEntropy, MatchesUnfusedBf16) {
  // bf16 logits and gradients, fp32 softmax: the two differ by bf16 rounding of the gradient's
  // accumulation (per chunk here, over all rows in one GEMM there).
  check({96, 32, 64, 32, 0.2, torch::kBFloat16, 2e-2});
}

TEST(LinearCrossEntropy, ChunksAreCacheSizedOnTheCpuAndLargeOnADevice) {
  // 64 MiB of fp32 logits a chunk on the CPU, 512 MiB on a device (8,192 rows of a 32,000-word
  // vocabulary: 16 chunks against 2), at least 256 rows; the memory formula takes the same rule.
  using model::ops::linear_cross_entropy_chunk_rows;
  EXPECT_EQ(linear_cross_entropy_chunk_rows(32000), (int64_t{64} << 20) / (4 * 32000));
  EXPECT_EQ(linear_cross_entropy_chunk_rows(32000, true), (int64_t{512} << 20) / (4 * 32000));
  EXPECT_EQ((8192 + linear_cross_entropy_chunk_rows(32000, true) - 1) / linear_cross_entropy_chunk_rows(32000, true), 2);
  EXPECT_EQ(linear_cross_entropy_chunk_rows(1 << 20), 256);
  model::ModelConfig cfg = model::ModelConfig::preset("tiny");
  cfg.vocab_size = 32000;
  model::Kernels cpu, gpu;
  gpu.device_head = true;
  const int64_t B = 4, T = 2048;
  const int64_t grown = model::activation_bytes(cfg, B, T, 2, gpu).head_forward_transient -
                        model::activation_bytes(cfg, B, T, 2, cpu).head_forward_transient;
  const int64_t c_cpu = linear_cross_entropy_chunk_rows(32000), c_gpu = linear_cross_entropy_chunk_rows(32000, true);
  // The chunk's fp32 logits, its 16-bit product and the rows' 32 bytes of bookkeeping, per extra row.
  EXPECT_EQ(grown, (c_gpu - c_cpu) * (4 * 32000 + 32 + 2 * 32000 + 4 * cfg.hidden_size + 2 * cfg.hidden_size));
}

TEST(LinearCrossEntropy, AllRowsIgnored) {
  torch::Tensor x = torch::randn({5, 4}).requires_grad_(true), w = torch::randn({9, 4}).requires_grad_(true);
  const torch::Tensor labels = torch::full({5}, kIgnore, torch::kLong);
  const torch::Tensor loss = model::ops::linear_cross_entropy(x, w, labels, kIgnore);
  EXPECT_EQ(loss.item<double>(), 0.0);
  loss.backward();
  EXPECT_EQ(x.grad().abs().max().item<double>(), 0.0);
  EXPECT_EQ(w.grad().abs().max().item<double>(), 0.0);
}

TEST(LinearCrossEntropy, NoGradientsWanted) {
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({20, 6}), w = torch::randn({11, 6});
  const torch::Tensor labels = torch::randint(0, 11, {20}, torch::kLong);
  torch::NoGradGuard no_grad;
  EXPECT_NEAR(model::ops::linear_cross_entropy(x, w, labels, kIgnore, 3).item<double>(),
              reference_loss(x, w, labels).item<double>(), 1e-4);
}

TEST(LinearCrossEntropy, SecondBackwardRefused) {
  torch::Tensor x = torch::randn({4, 3}).requires_grad_(true), w = torch::randn({5, 3}).requires_grad_(true);
  const torch::Tensor loss = model::ops::linear_cross_entropy(x, w, torch::randint(0, 5, {4}, torch::kLong), kIgnore);
  loss.backward({}, /*retain_graph=*/true);
  EXPECT_THROW(loss.backward(), c10::Error);
}

TEST(LinearCrossEntropy, NeverHoldsTheLogits) {
  memory::install();
  ASSERT_TRUE(memory::installed());
  const int64_t N = 1024, H = 32, V = 8192, chunk = 128;
  torch::Tensor x = torch::randn({N, H}).requires_grad_(true), w = torch::randn({V, H}).requires_grad_(true);
  const torch::Tensor labels = torch::randint(0, V, {N}, torch::kLong);
  auto peak_over = [&](auto&& fn) {
    memory::reset_peak();
    const int64_t before = memory::live().total();
    fn();
    return memory::peak().total() - before;
  };
  const int64_t logits = N * V * 4;  // 32 MiB
  const int64_t fused = peak_over([&] { model::ops::linear_cross_entropy(x, w, labels, kIgnore, chunk).backward(); });
  const int64_t unfused = peak_over([&] { reference_loss(x, w, labels).backward(); });
  // Fused: one chunk's logits (128 x 8192 x 4 = 4 MiB) and W's gradient (1 MiB), x's (128 KiB).
  EXPECT_LT(fused, logits / 4) << "fused peak " << fused << " bytes";
  EXPECT_GT(unfused, 2 * logits) << "unfused peak " << unfused << " bytes";
}

// Llama::head_loss (final norm + fused op, with lm_head or the tied embedding) against head() and
// cross_entropy, gradients of every parameter included.
TEST(LinearCrossEntropy, LlamaHeadLossMatchesHeadThenCrossEntropy) {
  for (bool tied : {false, true}) {
    model::ModelConfig c = model::ModelConfig::preset("tiny");  // GQA: 2 KV heads for 4 query heads
    c.tie_word_embeddings = tied;
    model::Llama a(c), b(c);
    model::init_weights(a, 11);
    model::init_weights(b, 11);
    const torch::Tensor tokens = torch::randint(0, c.vocab_size, {3, 9}, torch::kLong);
    torch::Tensor labels = torch::randint(0, c.vocab_size, {3, 9}, torch::kLong);
    labels.index_put_({0, torch::indexing::Slice(0, 4)}, kIgnore);  // a prompt
    auto hidden = [&](model::Llama& m) {
      torch::Tensor h = m->embed(tokens);
      for (int64_t i = 0; i < m->num_layers(); ++i) h = m->layer_forward(i, h, {});
      return h;
    };
    const torch::Tensor fused = a->head_loss(hidden(a), labels, kIgnore);
    const torch::Tensor logits = b->head(hidden(b));
    const torch::Tensor want =
        F::cross_entropy(logits.reshape({-1, c.vocab_size}), labels.reshape({-1}),
                         F::CrossEntropyFuncOptions().ignore_index(kIgnore).reduction(torch::kSum));
    EXPECT_NEAR(fused.item<double>(), want.item<double>(), 1e-5 * want.item<double>()) << "tied " << tied;
    fused.backward();
    want.backward();
    const auto pa = a->named_hf_parameters(), pb = b->named_hf_parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i)
      EXPECT_LE(rel_err(pa[i].second.grad(), pb[i].second.grad()), 1e-5) << pa[i].first << " tied " << tied;
  }
}


// What a GPU runs (LceRows::Weighted: ignored rows kept with a weight of 0, so no nonzero() reads
// the labels back to the host) equals what the CPU runs (LceRows::Compact: ignored rows dropped):
// same loss and gradients to rounding, zero gradient on ignored rows, and no host synchronisation
// inside the forward (counted by profile::ops, as bench step does) -- where Compact has one.
TEST(LinearCrossEntropy, WeightedRowsEqualCompactedRowsWithoutHostSync) {
  using model::ops::LceRows;
  for (torch::Dtype dt : {torch::kFloat, torch::kBFloat16}) {
    torch::manual_seed(11);
    const torch::Tensor x0 = torch::randn({90, 12}).to(dt), w0 = (0.5 * torch::randn({33, 12})).to(dt);
    torch::Tensor labels = torch::randint(0, 33, {90}, torch::kLong);
    labels.masked_fill_(torch::rand({90}) < 0.4, kIgnore);
    struct Run {
      torch::Tensor loss, gx, gw;
      int64_t syncs;
    };
    auto run = [&](LceRows rows) {
      torch::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
      profile::ops::start();
      torch::Tensor loss;
      {
        profile::Scope forward(profile::Part::Forward);
        loss = model::ops::linear_cross_entropy(x, w, labels, kIgnore, 16, rows);
      }
      profile::ops::stop();
      (loss * 0.5).backward();
      return Run{loss.detach(), x.grad(), w.grad(), profile::ops::snapshot().syncs_forward_backward};
    };
    const Run compact = run(LceRows::Compact), weighted = run(LceRows::Weighted);
    const double tol = dt == torch::kFloat ? 1e-6 : 1e-2;
    const std::string what = c10::toString(dt);
    EXPECT_NEAR(weighted.loss.item<double>(), compact.loss.item<double>(), tol * std::abs(compact.loss.item<double>()))
        << what;
    EXPECT_LE(rel_err(weighted.gx, compact.gx), tol) << what;
    EXPECT_LE(rel_err(weighted.gw, compact.gw), tol) << what;
    EXPECT_EQ(weighted.gx.index({labels == kIgnore}).abs().max().item<double>(), 0.0) << what;
    EXPECT_EQ(weighted.syncs, 0) << what << ": the weighted path reads nothing back";
    EXPECT_GE(compact.syncs, 1) << what << ": the compacting path's nonzero() is counted";
  }
}

// grad_scale (fp16's loss scale, applied in forward before rounding) is divided out exactly: with a
// power of two, the loss and both gradients are the same bits as without it.
TEST(LinearCrossEntropy, GradScaleIsDividedOutExactly) {
  torch::manual_seed(12);
  const torch::Tensor x0 = torch::randn({40, 8}), w0 = torch::randn({21, 8});
  torch::Tensor labels = torch::randint(0, 21, {40}, torch::kLong);
  labels.masked_fill_(torch::rand({40}) < 0.2, kIgnore);
  auto run = [&](double grad_scale) {
    torch::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    const torch::Tensor loss =
        model::ops::linear_cross_entropy(x, w, labels, kIgnore, 8, model::ops::LceRows::Auto, grad_scale);
    (loss * (0.25 * grad_scale)).backward();  // as the trainer backpropagates a scaled loss
    return std::make_tuple(loss.detach(), x.grad() / grad_scale, w.grad() / grad_scale);  // unscaled
  };
  const auto [l1, gx1, gw1] = run(1.0);
  const auto [l2, gx2, gw2] = run(65536.0);
  EXPECT_TRUE(torch::equal(l1, l2));
  EXPECT_TRUE(torch::equal(gx1, gx2));
  EXPECT_TRUE(torch::equal(gw1, gw2));
}

// fp16: small gradients survive because the loss scale applies before they are rounded to fp16.
// Needs an fp16 matmul on the CPU (LibTorch 2.x; 1.13 has none: skipped there, run by
// scripts/compat.sh's 2.6 build).
TEST(LinearCrossEntropy, Fp16KeepsSmallGradientsUnderTheLossScale) {
  try {
    torch::mm(torch::ones({2, 2}, torch::kHalf), torch::ones({2, 2}, torch::kHalf));
  } catch (const c10::Error&) {
    GTEST_SKIP() << "this LibTorch has no fp16 matmul on the CPU";
  }
  torch::manual_seed(13);
  // Peaked logits: most softmax probabilities are ~1e-7, below fp16's smallest normal (6e-5).
  const torch::Tensor x0 = 4 * torch::randn({64, 16}), w0 = torch::randn({50, 16});
  const torch::Tensor labels = torch::randint(0, 50, {64}, torch::kLong);
  // What the trainer backpropagates: the summed loss times the loss scaler's initial 65536 over the
  // step's N target tokens (its grad_scale hint is the same product). The scale alone would overflow
  // fp16 (a softmax gradient of -1 times 65536 > 65504), as a real step of one token would.
  const double S = 65536.0 / 64;
  torch::Tensor xr = x0.clone().requires_grad_(true);
  (reference_loss(xr, w0, labels) * S).backward();
  const torch::Tensor want = xr.grad() / S;
  auto fp16_grad = [&](double grad_scale) {
    torch::Tensor x = x0.to(torch::kHalf).requires_grad_(true);
    const torch::Tensor loss = model::ops::linear_cross_entropy(x, w0.to(torch::kHalf), labels, kIgnore, 16,
                                                                model::ops::LceRows::Auto, grad_scale);
    (loss * S).backward();
    return x.grad().to(torch::kFloat) / S;
  };
  const double scaled = rel_err(fp16_grad(S), want), unscaled = rel_err(fp16_grad(1.0), want);
  EXPECT_LT(scaled, 5e-3) << "fp16 with the scale applied before rounding";
  EXPECT_LT(scaled, unscaled) << "rounding before the scale loses more (" << unscaled << ")";
}

}  // namespace
}  // namespace tessera
