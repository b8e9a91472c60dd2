// Next-token choice of `tessera generate` (runtime/generate/sampling.h) against the definitions, on
// fixed logits whose answers are written out by hand: greedy is the first maximum; temperature
// divides the logits; top-k keeps the logits at least the k-th largest (ties kept, as Hugging
// Face's TopKLogitsWarper); top-p keeps the most likely tokens while the mass before each is below
// p (Hugging Face's TopPLogitsWarper); draws follow the distribution and are reproducible from
// (seed, stream).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "runtime/generate/sampling.h"
#include "util/error.h"

namespace test_sampling {  // the files of a gtest binary compile together (tests/CMakeLists.txt)

using namespace tessera::generate;

torch::Tensor logits(std::vector<double> v) { return torch::tensor(v, torch::kFloat64).to(torch::kFloat32); }

void expect_probs(const torch::Tensor& got, std::vector<double> want, const std::string& what) {
  ASSERT_EQ(got.numel(), (int64_t)want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i].item<double>(), want[i], 1e-6) << what << " id " << i;
}

Sampling with(double t, int64_t k = 0, double p = 1) { return Sampling{t, k, p, 0}; }

TEST(Sampling, GreedyIsTheFirstMaximum) {
  Rng rng(1, 0);
  EXPECT_EQ(sample(logits({1, 3, 2, 3, 0}), with(0), rng), 1);
  expect_probs(probabilities(logits({1, 3, 2, 3, 0}), with(0)), {0, 1, 0, 0, 0}, "greedy");
}

TEST(Sampling, TemperatureDividesTheLogits) {
  const double a = std::exp(0.5), b = std::exp(1.0), c = std::exp(0.0);  // logits {1, 2, 0} / 2
  expect_probs(probabilities(logits({1, 2, 0}), with(2)), {a / (a + b + c), b / (a + b + c), c / (a + b + c)}, "T=2");
}

TEST(Sampling, TopKKeepsTheKLargestAndTheirTies) {
  // k = 2: the 2nd largest is 3 (ids 1 and 3 tie at the top): only they remain, equally likely.
  expect_probs(probabilities(logits({1, 3, 2, 3, 0}), with(1, 2)), {0, 0.5, 0, 0.5, 0}, "k=2");
  // k = 3: the 3rd largest is 2: ids 1, 2, 3 remain, softmax over {3, 2, 3}.
  const double e3 = std::exp(3.0), e2 = std::exp(2.0), z = 2 * e3 + e2;
  expect_probs(probabilities(logits({1, 3, 2, 3, 0}), with(1, 3)), {0, e3 / z, e2 / z, e3 / z, 0}, "k=3");
  // k = 1 with a tie at the top keeps both (values >= the largest).
  expect_probs(probabilities(logits({5, 1, 5}), with(1, 1)), {0.5, 0, 0.5}, "k=1 tie");
  // k >= V: no filter.
  expect_probs(probabilities(logits({0, 0}), with(1, 9)), {0.5, 0.5}, "k=9");
}

TEST(Sampling, TopPKeepsTheSmallestMostLikelyPrefixReachingP) {
  // Probabilities {0.1, 0.5, 0.15, 0.25} (log-probabilities as logits, temperature 1).
  const auto lp = logits({std::log(0.1), std::log(0.5), std::log(0.15), std::log(0.25)});
  // p = 0.6: in order 0.5 (id 1), 0.25 (id 3): the mass before id 3 is 0.5 < 0.6, before id 2 0.75.
  expect_probs(probabilities(lp, with(1, 0, 0.6)), {0, 0.5 / 0.75, 0, 0.25 / 0.75}, "p=0.6");
  // p = 0.4: id 1 alone reaches it.
  expect_probs(probabilities(lp, with(1, 0, 0.4)), {0, 1, 0, 0}, "p=0.4");
  // p = 0.8: ids 1, 3, 2 (mass before id 2: 0.75 < 0.8; before id 0: 0.9).
  expect_probs(probabilities(lp, with(1, 0, 0.8)), {0, 0.5 / 0.9, 0.15 / 0.9, 0.25 / 0.9}, "p=0.8");
  // After top-k 2 (ids 1 and 3, renormalised to 2/3 and 1/3), p = 0.7 keeps both (before id 3: 2/3).
  expect_probs(probabilities(lp, with(1, 2, 0.7)), {0, 2.0 / 3, 0, 1.0 / 3}, "k=2, p=0.7");
  // Equal probabilities: the lower id first.
  expect_probs(probabilities(logits({0, 0, 0, 0}), with(1, 0, 0.5)), {0.5, 0.5, 0, 0}, "ties");
}

TEST(Sampling, DrawsFollowTheDistribution) {
  const auto lg = logits({0.0, 1.0, -1.0, 0.5});
  const Sampling s = with(0.7, 3, 0.95);
  const torch::Tensor p = probabilities(lg, s);
  std::vector<int> counts(4, 0);
  Rng rng(42, 0);
  const int n = 10000;
  for (int i = 0; i < n; ++i) ++counts[sample(lg, s, rng)];
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(counts[i] / double(n), p[i].item<double>(), 0.02) << "id " << i;
  EXPECT_EQ(counts[2], 0);  // outside the top 3
}

TEST(Sampling, ReproducibleFromSeedAndStream) {
  auto draws = [](uint64_t seed, uint64_t stream) {
    Rng rng(seed, stream);
    std::vector<int64_t> out;
    for (int i = 0; i < 32; ++i) out.push_back(sample(logits({0, 0.3, 0.1, 0.2, 0.4}), with(1.0), rng));
    return out;
  };
  EXPECT_EQ(draws(7, 0), draws(7, 0));
  EXPECT_NE(draws(7, 0), draws(8, 0));
  EXPECT_NE(draws(7, 0), draws(7, 1));
  Rng rng(3, 0);
  for (int i = 0; i < 1000; ++i) {
    const double u = rng.uniform();
    ASSERT_TRUE(u >= 0 && u < 1) << u;
  }
}

TEST(Sampling, OutOfRangeValuesAreInputErrors) {
  EXPECT_NO_THROW(validate(with(0, 0, 1)));
  EXPECT_THROW(validate(with(-0.1)), tessera::Error);
  EXPECT_THROW(validate(with(1, -1)), tessera::Error);
  EXPECT_THROW(validate(with(1, 0, 0)), tessera::Error);
  EXPECT_THROW(validate(with(1, 0, 1.01)), tessera::Error);
  EXPECT_THROW(validate(with(NAN)), tessera::Error);
}

}  // namespace test_sampling
