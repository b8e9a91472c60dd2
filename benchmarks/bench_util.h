// Small helpers shared by the benchmarks: interleaved rounds in a shuffled order, and medians.
#pragma once
#include <algorithm>
#include <cstddef>
#include <random>
#include <vector>

namespace tessera::bench {

// Fisher-Yates with std::mt19937 alone (fully specified by the standard, unlike std::shuffle's use
// of uniform_int_distribution), so every rank (and every run with the same seed) computes the same
// permutation.
inline void shuffle_order(std::vector<size_t>& order, std::mt19937& rng) {
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
}

// The median of `v` (the upper one of an even count); -1 when empty.
inline double median_of(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace tessera::bench
