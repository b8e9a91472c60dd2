#include "runtime/generate/sampling.h"

#include <ATen/ATen.h>

#include <cmath>
#include <sstream>
#include <string>

#include "util/error.h"

namespace tessera::generate {

namespace {
std::string shown(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
}  // namespace

void validate(const Sampling& s) {
  TESSERA_CHECK_INPUT(std::isfinite(s.temperature) && s.temperature >= 0,
                      "--temperature " + shown(s.temperature) + " must be >= 0 (0: greedy)");
  TESSERA_CHECK_INPUT(s.top_k >= 0, "--top-k " + std::to_string(s.top_k) + " must be >= 0 (0: every token)");
  TESSERA_CHECK_INPUT(s.top_p > 0 && s.top_p <= 1, "--top-p " + shown(s.top_p) + " must be in (0, 1] (1: no nucleus filter)");
}

at::Tensor probabilities(const at::Tensor& logits, const Sampling& s) {
  const at::Tensor x = logits.to(at::kDouble).reshape({-1});
  if (s.temperature == 0) {
    at::Tensor p = at::zeros_like(x);
    p[x.argmax().item<int64_t>()] = 1.0;  // argmax: the first maximum
    return p;
  }
  at::Tensor scaled = x / s.temperature;
  if (s.top_k > 0 && s.top_k < scaled.numel()) {
    const double kth = std::get<0>(scaled.topk(s.top_k)).min().item<double>();
    scaled = scaled.masked_fill(scaled < kth, -INFINITY);
  }
  at::Tensor p = at::softmax(scaled, 0);
  if (s.top_p < 1) {
    // Decreasing probability, lower id first among equals (a stable sort of the ids by -p).
    const at::Tensor order = std::get<1>(at::sort(-p, /*stable=*/true, 0, /*descending=*/false));
    const at::Tensor sorted = p.index_select(0, order);
    const at::Tensor before = sorted.cumsum(0) - sorted;  // probability of the tokens ahead of each
    at::Tensor keep_sorted = before < s.top_p;
    const at::Tensor keep = keep_sorted.index_select(0, at::argsort(order));  // back to id order
    p = p.masked_fill(keep.logical_not(), 0.0);
    p = p / p.sum();
  }
  return p;
}

Rng::Rng(uint64_t seed, uint64_t stream) : state_(seed ^ (0x9E3779B97F4A7C15ULL * (stream + 1))) {}

double Rng::uniform() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

int64_t sample(const at::Tensor& logits, const Sampling& s, Rng& rng) {
  if (s.temperature == 0) return logits.reshape({-1}).argmax().item<int64_t>();
  const at::Tensor p = probabilities(logits, s);
  const double u = rng.uniform();
  const at::Tensor cum = p.cumsum(0);
  const auto* c = cum.data_ptr<double>();
  const int64_t V = cum.numel();
  int64_t last = 0;  // a u at the very top (rounding of the cumulative sum): the last token with mass
  const auto* q = p.data_ptr<double>();
  for (int64_t i = 0; i < V; ++i) {
    if (q[i] > 0) last = i;
    if (c[i] > u && q[i] > 0) return i;
  }
  return last;
}

}  // namespace tessera::generate
