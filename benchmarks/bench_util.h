// Small helpers shared by the benchmarks: interleaved rounds in a shuffled order, medians, and
// option lists.
#pragma once
#include <algorithm>
#include <cstddef>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace tessera::bench {

// Fisher-Yates with std::mt19937 alone (fully specified by the standard, unlike std::shuffle's use
// of uniform_int_distribution), so every rank (and every run with the same seed) computes the same
// permutation.
inline void shuffle_order(std::vector<size_t>& order, std::mt19937& rng) {
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
}

// `s` cut at every `sep`, empty pieces kept (a trailing separator adds none).
inline std::vector<std::string> split_on(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, sep);) out.push_back(item);
  return out;
}

// The median of `v` (the upper one of an even count); -1 when empty.
inline double median_of(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace tessera::bench
